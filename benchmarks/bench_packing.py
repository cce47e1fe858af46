"""Packed against padded batches of real sentences on the CPU: `forward(packed=True)`.

Run: ./run.sh bench bench_packing            (writes benchmarks/results/bench_packing.{json,md})
     ./run.sh bench bench_packing --smoke    (a tiny model, one round; checks the script runs)

UD English EWT dev sentences (from `--data-dir`, else the project's own 385 sentences), in
corpus order, batches of 64, tokenised by all-MiniLM-L6-v2's tokenizer, padded to each
batch's longest sentence (a multiple of 8). Two models: the real all-MiniLM-L6-v2 (BERT,
6 x 384) and ModernBERT-base's shape (22 x 768, random weights, a 128-token window in two
of every three layers). Side by side in one run, per model:

* padded: `jax.jit` of `bertjax.forward` on the padded batches;
* packed: the same with `packed=`: the layout (`bertjax.Packing.of`, on the host, timed in
  the call) then the jitted forward on the packed rows (rows of the padded length, as
  first-fit decreasing fills them). The number of rows is fixed per run (the most any batch
  needs) so that one program serves every batch.

Each timed round runs every batch once; the first call of each (compile) is reported apart
and counts among the `--warmup` untimed calls, then `--rounds` interleaved rounds with a
rotating order (`bertjax.timing.interleaved`).
The outputs of the two are compared at real tokens. Results name the CPU and its ISA.
"""

from __future__ import annotations

import pathlib
import sys

import common
import jax
import numpy as np

import bertjax
from bertjax import timing

REPO = common.REPO
MODELS = ("all-MiniLM-L6-v2", "modernbert-base")
SMOKE = dict(
  vocab_size=30522,
  hidden_size=64,
  num_hidden_layers=3,
  num_attention_heads=4,
  intermediate_size=96,
  pad_token_id=0,
  layer_types=("full_attention", "sliding_attention", "sliding_attention"),
  sliding_window=16,
)


def sentences(data_dir: pathlib.Path | None, count: int) -> tuple[list[str], str]:
  """`count` sentences of UD EWT dev in corpus order (from `data_dir`), or with None the
  project's own set."""
  if data_dir is not None:
    path = next(iter(sorted(data_dir.rglob("en_ewt-ud-dev.conllu"))), None)
    if path is None:
      sys.exit(f"error: no en_ewt-ud-dev.conllu under --data-dir {data_dir}")
    from bertjax.data import conllu

    sents = conllu.read_conllu(path, max_sentences=count)
    return [" ".join(s.forms) for s in sents], "UD English EWT dev"
  print("no data directory: timing the project's own 385 sentences", file=sys.stderr)
  from bertjax.report import sentences as own

  return [s.text for s in own.load_sentences()][:count], "bertjax/resources/sentences.tsv"


def batches(tok, texts: list[str], size: int) -> list[tuple[np.ndarray, np.ndarray]]:
  out = []
  for i in range(0, len(texts), size):
    b = tok.encode(texts[i : i + size])
    seq = -(-b.input_ids.shape[1] // 8) * 8
    pad = seq - b.input_ids.shape[1]
    out.append(
      (
        np.pad(b.input_ids, ((0, 0), (0, pad))).astype(np.int32),
        np.pad(b.attention_mask, ((0, 0), (0, pad))).astype(np.int32),
      )
    )
  return out


def model(name: str, smoke: bool):
  """(config, params): the real MiniLM, ModernBERT-base's shape; tiny ones with `smoke`."""
  if name == "all-MiniLM-L6-v2":
    if not smoke:
      return bertjax.from_hf(bertjax.minilm_path())
    config = bertjax.BertConfig.preset("tiny", vocab_size=30522)
    return config, bertjax.init(config, 0)
  sizes = SMOKE if smoke else {}
  config = bertjax.BertConfig.preset("modernbert-base", **sizes)
  return config, bertjax.init(config, 0)


def bench_model(name: str, data: list, args) -> dict:
  config, params = model(name, args.smoke)
  forward = jax.jit(
    lambda p, ids, m, packed=None: (
      bertjax.forward(
        p, config, ids, m, packed=packed if packed is not None else False
      ).last_hidden_state
    )
  )
  rows = max(bertjax.Packing.of(m).shape[0] for _, m in data)

  def padded():
    return [jax.block_until_ready(forward(params, ids, m)) for ids, m in data]

  def packed():
    return [
      jax.block_until_ready(forward(params, ids, m, bertjax.Packing.of(m, rows=rows)))
      for ids, m in data
    ]

  outs = {}
  times = common.interleaved({"padded": padded, "packed": packed}, args, outputs=outs)
  diff = max(
    float(np.abs(np.asarray(a) - np.asarray(b))[m.astype(bool)].max())
    for a, b, (_, m) in zip(outs["padded"], outs["packed"], data)
  )
  real = sum(int(m.sum()) for _, m in data)
  padded_tokens = sum(m.size for _, m in data)
  row = {
    "model": name,
    "family": config.model_type,
    "layers": config.depth,
    "hidden": config.hidden_size,
    "batches": len(data),
    "sentences": sum(len(m) for _, m in data),
    "real_tokens": real,
    "padded_tokens": padded_tokens,
    "packed_tokens": rows * sum(m.shape[1] for _, m in data),
    "packed_rows": rows,
    "max_abs_diff_real_tokens": diff,
  }
  for n, t in times.items():
    row[n] = common.entry(t, real_tokens_per_s=real / t["median_s"])
  row["packed_speedup"] = row["padded"]["median_s"] / row["packed"]["median_s"]
  print(
    f"{name}: padded {row['padded']['median_s']:.2f} s, packed "
    f"{row['packed']['median_s']:.2f} s ({row['packed_speedup']:.2f}x)",
    file=sys.stderr,
    flush=True,
  )
  return row


def markdown(r: dict) -> str:
  m = r["machine"]
  intro = (
    f"Packed against padded forward passes on the CPU, float32: {m['cpu']}, "
    f"{m['cpus_usable']} usable CPUs; ISA: {', '.join(m['isa_flags'])}; jax {m['jax']}. "
    f"{r['sentences']} sentences of {r['data']} in batches of {r['batch']}, padded to "
    f"each batch's longest (a multiple of 8). Medians of {r['rounds']} interleaved "
    f"rounds over every batch, after {r['warmup']} warm-up rounds; first calls "
    "(compile) apart."
  )
  header = (
    "| model | real / padded / packed tokens | padded | packed | packed speed-up | "
    "max diff at real tokens |"
  )
  lines = [intro, "", header, "|---|---|---|---|---|---|"]
  for row in r["rows"]:
    lines.append(
      f"| {row['model']} ({row['layers']} x {row['hidden']}) | {row['real_tokens']} / "
      f"{row['padded_tokens']} / {row['packed_tokens']} | "
      f"{row['padded']['median_s']:.2f} s | {row['packed']['median_s']:.2f} s "
      f"(layout included) | {row['packed_speedup']:.2f}x | "
      f"{row['max_abs_diff_real_tokens']:.1e} |"
    )
  lines += ["", "Speed-up: the padded median over the packed one (> 1: packing is faster)."]
  return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
  p = common.parser(__doc__, rounds=5, warmup=1)
  p.add_argument("--sentences", type=int, default=512, help="how many sentences")
  p.add_argument("--batch", type=int, default=64, help="sentences per batch")
  p.add_argument(
    "--data-dir",
    default=None,
    metavar="DIR",
    help="where ud_english_ewt is (default: ../shared/data beside the checkout "
    "when it exists, else the project's own sentences, said on stderr)",
  )
  args = p.parse_args(argv)
  if args.smoke:
    args.rounds, args.warmup, args.sentences, args.batch = 1, 0, 32, 16
  tok = bertjax.Tokenizer.from_pretrained(bertjax.minilm_path())
  shared = REPO.parent / "shared" / "data"
  data_dir = pathlib.Path(args.data_dir) if args.data_dir else shared if shared.is_dir() else None
  texts, source = sentences(data_dir, args.sentences)
  data = batches(tok, texts, args.batch)
  rows = [bench_model(name, data, args) for name in MODELS]
  result = {
    "machine": timing.machine(),
    "data": source,
    "sentences": len(texts),
    "batch": args.batch,
    "rows": rows,
    "rounds": args.rounds,
    "warmup": args.warmup,
    "smoke": args.smoke,
  }
  common.write(result, markdown(result), args.out, "bench_packing", files=not args.smoke)
  return result


if __name__ == "__main__":
  main()
