"""What every benchmark shares besides timing: the options every script takes, Markdown
tables, where results go, and the inputs and per-round ratios of the attribution benchmarks.
Timing and the machine a figure comes from are `bertjax.timing`'s (`interleaved`,
`compile_ahead`, `machine`, `describe`), as for the library's own timings.

Benchmarks import it as `common` (each script's folder is on its path when run as a script).
It imports neither JAX nor bertjax until asked, so that bench_tl's TransformerLens peer, in an
environment without them, can import it too.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
CLS, SEP, MASK = 101, 102, 103  # BERT's ids, as make_inputs places them


def at_least(minimum: int):
  """An argparse type: an integer of at least `minimum` (else a usage error naming it)."""

  def parse(text: str) -> int:
    try:
      value = int(text)
    except ValueError:
      raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < minimum:
      raise argparse.ArgumentTypeError(f"{value} must be >= {minimum}")
    return value

  return parse


def parser(
  doc: str, *, out: pathlib.Path | str = RESULTS, **rounds: int
) -> argparse.ArgumentParser:
  """The options every benchmark takes: `--smoke` (tiny shapes, one round, no files) and
  `--out DIR`; with `rounds=N` and `warmup=N`, those options too (their defaults)."""
  p = argparse.ArgumentParser(
    description=doc.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
  )
  p.add_argument("--smoke", action="store_true", help="tiny shapes, one round, no files")
  p.add_argument("--out", default=str(out), metavar="DIR", help="where results go")
  if "rounds" in rounds:
    p.add_argument("--rounds", type=at_least(1), default=rounds["rounds"], help="timed rounds")
  if "warmup" in rounds:
    p.add_argument(
      "--warmup", type=at_least(0), default=rounds["warmup"], help="untimed calls first"
    )
  return p


def interleaved(
  calls: dict[str, Callable[[], Any]], args: argparse.Namespace, **kwargs: Any
) -> dict:
  """`bertjax.timing.interleaved` with the options of `parser`: `args.rounds` rounds after
  `args.warmup` untimed calls of each (the first call, timed apart, counted among them)."""
  from bertjax import timing

  return timing.interleaved(calls, args.rounds, warmup=max(args.warmup - 1, 0), **kwargs)


def entry(t: dict[str, Any], **extra: Any) -> dict[str, Any]:
  """One timed call's entry in a result file, from `bertjax.timing`'s record: its compile time
  (when compiled apart), first call, median, minimum and every round's seconds; `extra`
  entries added."""
  keys = ("compile_s", "first_call_s", "median_s", "min_s", "times_s")
  return {k: t[k] for k in keys if k in t} | extra


def against_torch(row: dict, times: dict, outputs: dict, label: str, **info: dict) -> dict:
  """`row` (one model at one shape, `row["tokens"]` of them) completed from `bertjax.timing.
  interleaved`'s `times` and first `outputs` of "bertjax", "torch_sdpa" and any others: the
  largest difference of bertjax's and PyTorch's outputs, each call's `entry` (with `info[name]`
  and tokens/s), bertjax's speed-up against each other, and a progress line after `label`."""
  ours, theirs = np.asarray(outputs["bertjax"]), outputs["torch_sdpa"].numpy()
  row["max_abs_diff_bertjax_vs_torch"] = float(np.abs(ours - theirs).max())
  for n, t in times.items():
    row[n] = entry(t, **info.get(n, {}), tokens_per_s=row["tokens"] / t["median_s"])
  for n in times:
    if n != "bertjax":
      row[f"bertjax_speedup_vs_{n}"] = row[n]["median_s"] / row["bertjax"]["median_s"]
  done = ", ".join(f"{n} {row[n]['median_s'] * 1e3:.0f} ms" for n in times)
  print(f"{label}: {done}", file=sys.stderr, flush=True)
  return row


def slug(name: str) -> str:
  """A device's name as part of a file name: lower case, each run of other characters than
  letters and digits one `_` ("NVIDIA H100 80GB HBM3" -> "nvidia_h100_80gb_hbm3")."""
  return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
  """A Markdown table's lines: the header, its rule, and a line per row."""
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def write(result: dict, md: str, out: pathlib.Path | str, stem: str, *, files: bool = True) -> None:
  """Writes `out/stem.json` and `out/stem.md` (unless not `files`, as a smoke run), then the
  Markdown to stderr and the JSON to stdout."""
  if files:
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / f"{stem}.md").write_text(md)
  print(md, file=sys.stderr)
  print(json.dumps(result))


def measured_on(m: dict[str, Any]) -> str:
  """The line a result page names its machine with ("Measured on: 2-core AMD EPYC (AVX2,
  AVX-512), jax 0.10.2"), from `bertjax.timing.machine`'s record."""
  from bertjax import timing

  return f"Measured on: {timing.describe(m)}."


def bert_base_dir(transformers, torch, root: pathlib.Path, smoke: bool = False) -> pathlib.Path:
  """A BERT-base `BertModel` (a 2-layer 64-wide one with `smoke`) with every parameter random,
  LayerNorms included, saved by transformers under `root`: both implementations load it."""
  sizes = (
    dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    if smoke
    else {}
  )
  config = transformers.BertConfig(**sizes)
  torch.manual_seed(0)
  model = transformers.BertModel(config)
  with torch.no_grad():
    for name, p in model.named_parameters():
      p.normal_(1.0 if name.endswith("LayerNorm.weight") else 0.0, 0.05)
  model.save_pretrained(root / "bert-base-random")
  return root / "bert-base-random"


def make_inputs(batch: int, seq: int, vocab: int = 30522, seed: int = 0) -> dict:
  """The attribution benchmarks' batch: clean and corrupted ids (no padding; [CLS] first,
  [SEP] last, one [MASK] per sequence; the corrupted twin resamples 16 other tokens), the
  [MASK] positions, answer and distractor ids."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(1000, vocab, (batch, seq)).astype(np.int32)
  ids[:, 0], ids[:, -1] = CLS, SEP
  position = rng.integers(1, seq - 1, batch).astype(np.int32)
  ids[np.arange(batch), position] = MASK
  corrupted = ids.copy()
  for b in range(batch):
    free = np.setdiff1d(np.arange(1, seq - 1), [position[b]])
    pick = rng.choice(free, min(16, free.size), replace=False)
    corrupted[b, pick] = rng.integers(1000, vocab, pick.size)
  answer, distractor = rng.choice(np.arange(1000, vocab), (2, batch), replace=True)
  return {
    "clean": ids,
    "corrupted": corrupted,
    "mask": np.ones_like(ids),
    "position": position,
    "answer": answer.astype(np.int32),
    "distractor": distractor.astype(np.int32),
  }


def against_forward(
  tasks: dict[str, Callable[[], Any]], rounds: int, label: str = ""
) -> dict[str, dict[str, Any]]:
  """Each task timed in `rounds` interleaved rounds (`bertjax.timing.interleaved`: first call
  and one warm-up apart), a progress line per round on stderr (after `label`); per task its
  median milliseconds, every round's, and `over_forward`: the median over rounds of its time
  over the same round's "forward" task (a slow spell of the machine falls on both)."""
  from bertjax import timing

  def line(r: int, seconds: dict[str, float]) -> None:
    done = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in seconds.items())
    print(f"{label}round {r + 1}/{rounds}: {done}", file=sys.stderr, flush=True)

  times = timing.interleaved(tasks, rounds, on_round=line)
  return {
    name: {
      "median_ms": 1e3 * t["median_s"],
      "over_forward": statistics.median(timing.ratios(t, times["forward"])),
      "times_ms": [1e3 * x for x in t["times_s"]],
    }
    for name, t in times.items()
  }
