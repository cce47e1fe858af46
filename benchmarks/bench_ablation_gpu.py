"""144 single-head ablations of a 12-layer, 768-wide BERT on a GPU, with the fused kernel.

Run (GPU):    .venv/bin/python benchmarks/bench_ablation_gpu.py --ids wikitext_ids.npz --out benchmarks/results
Prepare ids:  .venv/bin/python benchmarks/bench_ablation_gpu.py --prepare wikitext_ids.npz
Check (CPU):  JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_ablation_gpu.py --smoke --out /tmp/b

The GPU counterpart of `bench_ablation.py` (issue #4): BERT-base shape (12 layers x
12 heads, hidden 768, FFN 3072, vocab 30522), random weights (no BERT-base checkpoint
is available offline; the cost does not depend on the weights), bfloat16 compute,
`attention_impl="pallas"` (the fused kernel, head mask in its epilogue, padded key
blocks skipped). Data: `--sequences` (2048) sequences of WikiText-2 `test.txt`,
consecutive sentences of a paragraph packed up to 128 WordPiece tokens
(bert-base-uncased vocabulary, the one all-MiniLM-L6-v2 ships), sorted by length
and batched (`--batch-size`), each batch padded to a multiple of 32. `--prepare`
tokenizes once on a machine with the tokenizer and writes the ids (the GPU machine
reads them with `--ids`).

Timed, side by side in one process, compile apart (a warm-up pass over every
batch shape first):

* `forward`: one jitted forward pass plus the metric over all batches (the unit).
* `sweep`: `ablation_sweep(strategy="prefix")`, baseline + 144 single heads, the
  masks of layer l vmapped `chunk` at a time over blocks l.. (prefix reuse: 78
  forward-equivalents of block work plus the baseline's 1, against 145 for a loop).
* `loop`: the naive loop, one jitted full forward per mask (145 passes).
* `importance`: per-example |dL/dxi| for all 144 heads (`head_importance`) on the
  same metric's loss (1 - cosine to the unablated embedding would have zero
  gradient at xi = 1, so the loss is the token-reconstruction loss).

Metric: mean cosine of the mean-pooled final embedding to the unablated one.
Writes `ablation_gpu_<device>.json` and `.md`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import platform
import re

import common
import jax
import numpy as np

import bertjax
from bertjax import timing
from bertjax.analysis import batching
from bertjax.analysis.interventions import ablation
from bertjax.data import fetch


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default="benchmarks/results", help="output directory")
  parser.add_argument("--ids", default=None, help="token ids written by --prepare (.npz)")
  parser.add_argument(
    "--prepare",
    default=None,
    metavar="NPZ",
    help="tokenize --text with MiniLM's vocabulary, write NPZ and exit",
  )
  parser.add_argument(
    "--text",
    default=None,
    help="WikiText-2 file to pack (default: wikitext2_tokens/test.txt, found by "
    "`bertjax data`'s lookup)",
  )
  parser.add_argument("--sequences", type=int, default=2048, help="sequences (default 2048)")
  parser.add_argument("--max-len", type=int, default=128, help="tokens per sequence at most")
  parser.add_argument("--batch-size", type=int, default=256, help="sequences per batch")
  parser.add_argument("--chunk-sizes", default="12", help="comma list of vmap chunk sizes")
  parser.add_argument("--impl", default="pallas", help="attention_impl of the model")
  parser.add_argument("--dtype", default="bfloat16", help="compute dtype")
  parser.add_argument(
    "--scan-unroll",
    type=int,
    default=1,
    help="config.scan_unroll (12: layers unrolled, faster on GPUs)",
  )
  parser.add_argument("--repeats", type=int, default=3, help="timed repeats of the forward unit")
  parser.add_argument("--skip-loop", action="store_true", help="do not time the naive loop")
  parser.add_argument(
    "--smoke", action="store_true", help="tiny random model and random ids; CPU, interpret mode"
  )
  return parser.parse_args(argv)


def pack_wikitext(path, tok, n, max_len):
  """`n` id sequences: consecutive sentences of a paragraph packed up to `max_len` tokens."""
  seqs = []
  body = max_len - 2  # [CLS] ... [SEP]
  for line in pathlib.Path(path).read_text(encoding="utf-8").splitlines():
    line = line.strip()
    if not line or line.startswith("="):
      continue
    current = []
    for sentence in re.split(r"(?<= \.) ", line):
      ids = tok.encode([sentence]).input_ids[0]
      ids = [int(i) for i in ids[1:-1]][:body]  # drop [CLS]/[SEP]; cut an overlong sentence
      if current and len(current) + len(ids) > body:
        seqs.append(current)
        current = []
      current = current + ids
    if current:
      seqs.append(current)
    if len(seqs) >= n:
      break
  if len(seqs) < n:
    raise ValueError(f"{path} gives only {len(seqs)} sequences, --sequences={n}")
  cls, sep = tok.cls_id, tok.sep_id
  return [[cls, *s, sep] for s in seqs[:n]]


def make_batches(seqs, batch_size, multiple=32):
  """Length-sorted, right-padded batches of dicts with input_ids and attention_mask."""
  order = np.argsort([len(s) for s in seqs], kind="stable")
  batches = []
  for i in range(0, len(order), batch_size):
    chunk = [seqs[j] for j in order[i : i + batch_size]]
    width = -(-max(len(s) for s in chunk) // multiple) * multiple
    ids = np.zeros((len(chunk), width), np.int32)
    mask = np.zeros((len(chunk), width), np.int32)
    for r, s in enumerate(chunk):
      ids[r, : len(s)], mask[r, : len(s)] = s, 1
    batches.append(batching.as_batch({"input_ids": ids, "attention_mask": mask}))
  return batches


def prepare(args) -> None:
  """`--prepare`: packs WikiText-2 with MiniLM's vocabulary and writes the ids."""
  tok = bertjax.Tokenizer.from_pretrained(bertjax.minilm_path())
  text = args.text or fetch.find("wikitext2_tokens") / "test.txt"
  seqs = pack_wikitext(text, tok, args.sequences, args.max_len)
  lengths = np.array([len(s) for s in seqs])
  flat = np.concatenate([np.asarray(s, np.int32) for s in seqs])
  np.savez_compressed(args.prepare, ids=flat, lengths=lengths)
  print(
    f"wrote {args.prepare}: {len(seqs)} sequences, {lengths.sum()} tokens, "
    f"lengths {lengths.min()}..{lengths.max()} (mean {lengths.mean():.1f})"
  )


def model_and_sequences(args):
  """`(config, seqs)`: BERT-base's shape and the `--ids` sequences, or with `--smoke` a tiny
  model and random ids (and one repeat of batches of 8)."""
  if args.smoke:
    config = bertjax.BertConfig.preset(
      "tiny",
      vocab_size=30522,
      max_position_embeddings=128,
      attention_impl=args.impl,
      scan_unroll=args.scan_unroll,
    )
    rng = np.random.default_rng(0)
    seqs = [list(rng.integers(5, 30522, rng.integers(8, 60))) for _ in range(24)]
    args.batch_size, args.repeats = 8, 1
    return config, seqs
  config = bertjax.BertConfig.preset(
    "bert-base", dtype=args.dtype, attention_impl=args.impl, scan_unroll=args.scan_unroll
  )
  data = np.load(args.ids)
  bounds = np.cumsum(np.r_[0, data["lengths"]])
  seqs = [data["ids"][a:b].tolist() for a, b in itertools.pairwise(bounds)][: args.sequences]
  return config, seqs


def time_forward(params, config, metric, warm, batches, repeats: int) -> dict:
  """The unit: one jitted forward pass plus the metric over all batches."""

  @jax.jit
  def forward_metric(p, b):
    x = bertjax.embed(p, config, b["input_ids"], b["token_type_ids"])
    last = bertjax.run_layers(p, config, x, b["attention_mask"])[0]
    return metric(p, config, {**b, batching.BASELINE_KEY: last}, last, None)

  _, fwd_warm = timing.timed(lambda: [forward_metric(params, b) for b in warm])
  all_batches = {"forward": lambda: [forward_metric(params, b) for b in batches]}
  t = timing.interleaved(all_batches, repeats, warmup=0)
  return {
    "wall_s": t["forward"]["median_s"],
    "all_s": t["forward"]["times_s"],
    "compile_s": fwd_warm,
  }


def time_sweeps(params, config, metric, warm, batches, methods, fwd: float, report: dict) -> dict:
  """Times each `(name, strategy, chunk)` sweep of `methods` into `report[name]`; returns
  name -> `ablation.AblationResult`."""
  sweep = lambda data, chunk, strategy="prefix": ablation.ablation_sweep(
    params,
    config,
    data,
    metric,
    head_ablations=("scale",),
    include=("heads",),
    chunk_size=chunk,
    strategy=strategy,
  )["scale"]
  results = {}
  for name, strategy, chunk in methods:  # one after the other: each sweep is timed once
    _, warm_s = timing.timed(lambda chunk=chunk, strategy=strategy: sweep(warm, chunk, strategy))
    result, wall = timing.timed(
      lambda chunk=chunk, strategy=strategy: sweep(batches, chunk, strategy)
    )
    results[name] = result
    report[name] = {"wall_s": wall, "vs_forward": wall / fwd, "warm_pass_s": warm_s}
    print(
      f"{name}: {wall:.2f} s = {wall / fwd:.1f} forward passes (warm-up pass incl. "
      f"compile {warm_s:.1f} s)",
      flush=True,
    )
  return results


def time_importance(params, config, warm, batches, repeats: int) -> dict:
  """Head importance (`head_importance`, token reconstruction loss) against one forward pass
  with the same loss."""
  importance = lambda data: ablation.head_importance(
    params, config, data, ablation.token_reconstruction_loss
  )
  fwd_recon = jax.jit(
    lambda p, b: ablation.token_reconstruction_loss(
      p,
      config,
      b,
      bertjax.run_layers(
        p,
        config,
        bertjax.embed(p, config, b["input_ids"], b["token_type_ids"]),
        b["attention_mask"],
      )[0],
      None,
    )
  )
  _, imp_warm = timing.timed(lambda: importance(warm))
  timing.timed(lambda: [fwd_recon(params, b) for b in warm])
  t = timing.interleaved(
    {
      "importance": lambda: importance(batches),
      "forward": lambda: [fwd_recon(params, b) for b in batches],
    },
    repeats,
    warmup=0,
  )
  imp, rec = t["importance"]["median_s"], t["forward"]["median_s"]
  return {
    "criterion": "token_reconstruction",
    "importance_s": imp,
    "forward_with_loss_s": rec,
    "ratio": imp / rec,
    "warm_pass_s": imp_warm,
  }


def write_report(report: dict, out, scan_unroll: int, smoke: bool) -> None:
  """Writes `ablation_gpu_<device>[_unrollN][_smoke].json` and `.md` and prints the table."""
  out = pathlib.Path(out)
  out.mkdir(parents=True, exist_ok=True)
  stem = "ablation_gpu_" + common.slug(report["device"])
  stem += f"_unroll{scan_unroll}" if scan_unroll > 1 else ""
  stem += "_smoke" if smoke else ""
  (out / f"{stem}.json").write_text(json.dumps(report, indent=1))
  (out / f"{stem}.md").write_text(markdown(report))
  print((out / f"{stem}.md").read_text())


def main(argv=None):
  args = parse_args(argv)
  if args.prepare:
    prepare(args)
    return None

  config, seqs = model_and_sequences(args)
  params = bertjax.init(config, 0)
  batches = make_batches(seqs, args.batch_size)
  shapes = sorted({tuple(b["input_ids"].shape) for b in batches})
  warm = [next(b for b in batches if tuple(b["input_ids"].shape) == s) for s in shapes]
  metric = ablation.mean_embedding_cosine
  real = sum(int(b["attention_mask"].sum()) for b in batches)
  padded = sum(int(np.prod(b["input_ids"].shape)) for b in batches)
  report = {
    "device": jax.devices()[0].device_kind,
    "backend": jax.default_backend(),
    "jax": jax.__version__,
    "platform": platform.platform(),
    "model": "tiny (random, smoke)" if args.smoke else "bert-base shape, random weights",
    "dtype": config.dtype,
    "attention_impl": config.attention_impl,
    "scan_unroll": config.scan_unroll,
    "layers": config.depth,
    "heads": config.num_attention_heads,
    "sequences": len(seqs),
    "batches": len(batches),
    "shapes": [list(s) for s in shapes],
    "real_tokens": real,
    "padded_tokens": padded,
    "metric": "mean-pooled embedding cosine to the unablated model",
  }

  report["forward"] = time_forward(params, config, metric, warm, batches, args.repeats)
  fwd = report["forward"]["wall_s"]
  print(f"forward: {fwd:.3f} s over {len(seqs)} sequences", flush=True)

  methods = [(f"prefix_chunk{c}", "prefix", int(c)) for c in args.chunk_sizes.split(",")]
  methods += [] if args.skip_loop else [("loop", "loop", 1)]
  results = time_sweeps(params, config, metric, warm, batches, methods, fwd, report)
  first = results[methods[0][0]]
  report["head_ablation"] = first.heads.tolist()
  report["baseline"] = first.baseline
  if "loop" in results:
    report["max_abs_diff_vs_loop"] = float(
      max(np.abs(r.heads - results["loop"].heads).max() for r in results.values())
    )

  report["importance"] = imp = time_importance(params, config, warm, batches, args.repeats)
  print(
    f"importance: {imp['importance_s']:.3f} s vs forward with the same loss "
    f"{imp['forward_with_loss_s']:.3f} s = {imp['ratio']:.2f}x",
    flush=True,
  )
  write_report(report, args.out, config.scan_unroll, args.smoke)
  return report


def markdown(r):
  lines = [
    f"# Single-head ablation sweep on {r['device']}: {r['model']}",
    "",
    (
      f"{r['layers']} layers x {r['heads']} heads, {r['dtype']}, attention "
      f"`{r['attention_impl']}`, scan_unroll {r.get('scan_unroll', 1)}, jax {r['jax']}; {r['sequences']} WikiText-2 sequences in "
      f"{r['batches']} batches {r['shapes']}; {r['real_tokens']} real / "
      f"{r['padded_tokens']} padded tokens."
    ),
    "",
    "| method | passes | wall (s) | in forward passes | warm-up pass incl. compile (s) |",
    "|---|---|---|---|---|",
    (
      f"| one forward pass + metric | 1 | {r['forward']['wall_s']:.3f} | 1 | "
      f"{r['forward']['compile_s']:.1f} |"
    ),
  ]
  n = r["layers"] * r["heads"] + 1
  for key in [k for k in r if k.startswith("prefix_chunk")] + ["loop"]:
    if key in r:
      label = (
        "naive loop (one jitted forward per mask)"
        if key == "loop"
        else f"sweep, prefix reuse, vmap chunk {key.removeprefix('prefix_chunk')}"
      )
      x = r[key]
      lines.append(
        f"| {label} | {n} | {x['wall_s']:.2f} | {x['vs_forward']:.1f} | {x['warm_pass_s']:.1f} |"
      )
  if "max_abs_diff_vs_loop" in r:
    lines += ["", f"max |sweep - loop| = {r['max_abs_diff_vs_loop']:.2e}."]
  imp = r["importance"]
  lines += [
    "",
    (
      f"Head importance (per-example |dL/dxi|, token reconstruction loss): "
      f"{imp['importance_s']:.3f} s vs one forward with the same loss "
      f"{imp['forward_with_loss_s']:.3f} s = **{imp['ratio']:.2f}x**."
    ),
  ]
  return "\n".join(lines + [""])


if __name__ == "__main__":
  main()
