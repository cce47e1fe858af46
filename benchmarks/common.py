"""What every benchmark shares: the machine a figure comes from, the side-by-side timer, the
options every script takes, Markdown tables, and where results go.

Benchmarks import it as `common` (each script's folder is on its path when run as a script).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import re
import sys
from collections.abc import Iterable, Sequence
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


def machine(*, torch: bool = False, **extra: Any) -> dict[str, Any]:
  """What a figure comes from: the CPU (`bertjax.utils.cpu_info`: model, ISA flags, cores),
  Python, the platform, JAX and its backend and device, the accelerator if any, the thread and
  XLA settings of the environment, and PyTorch's version and threads when it is loaded (or
  `torch`: load it); `extra` entries are added."""
  import jax

  if torch:
    import torch as _  # noqa: F401  (its version and threads are recorded)

  from bertjax.utils import cpu_info

  info = {
    **cpu_info(),
    "python": platform.python_version(),
    "platform": platform.platform(),
    "jax": jax.__version__,
    "backend": jax.default_backend(),
    "device": str(jax.devices()[0].device_kind),
    "xla_flags": os.environ.get("XLA_FLAGS", ""),
    "env": {
      k: os.environ[k]
      for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "XLA_FLAGS")
      if k in os.environ
    },
  }
  if jax.default_backend() != "cpu":
    info["accelerator"] = jax.devices()[0].device_kind
  loaded = sys.modules.get("torch")
  if loaded is not None:
    info.update(
      torch=loaded.__version__,
      torch_threads=loaded.get_num_threads(),
      torch_interop_threads=loaded.get_num_interop_threads(),
    )
  return {**info, **extra}


def timed(fn) -> tuple[Any, float]:
  """`(fn(), seconds)`: one call, timed until its JAX arrays are ready."""
  import time

  import jax

  start = time.perf_counter()
  out = jax.block_until_ready(fn())
  return out, time.perf_counter() - start


def interleaved(calls: dict, warmup: int, rounds: int) -> dict[str, list[float]]:
  """Seconds of each zero-argument call over `rounds` rounds in a rotating order, after at
  least one untimed call each (`warmup` of them when more); `bertjax.utils.interleaved_times`
  times them."""
  from bertjax.utils import interleaved_times

  times = interleaved_times(calls, rounds, warmup=max(warmup - 1, 0))
  return {name: t["times_s"] for name, t in times.items()}


def _count(minimum: int):
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
    p.add_argument("--rounds", type=_count(1), default=rounds["rounds"], help="timed rounds")
  if "warmup" in rounds:
    p.add_argument("--warmup", type=_count(0), default=rounds["warmup"], help="untimed calls first")
  return p


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
