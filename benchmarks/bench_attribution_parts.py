"""Where attribution patching's time goes, against one forward pass, on the CPU.

Run (full, CPU):  JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_attribution_parts.py
                  (or ./run.sh bench bench_attribution_parts; about 4 minutes; writes
                  benchmarks/results/attribution_parts_cpu.{json,md})
Check (tiny):     JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_attribution_parts.py \\
                  --smoke --out /tmp/b

`patching.attribution_patching` for every (layer, head) of `head_out` (Nanda 2023) needs
the clean run (the values patched in), the corrupted run kept for the gradient, and that
run's backward pass. The issue's target is the whole at most 3x one forward pass; this
script splits it, on random weights in the shapes of BERT-base and all-MiniLM-L6-v2 (no
download), batch 8 x 128, the metric `bench_tl.py` uses (the MLM logit difference at one
[MASK] per sequence):

* programs: `bertjax.forward` (the unit), the whole `attribution_patching` call, the clean
  run alone (capturing `head_out`, the last block at the [MASK] rows only, as attribution
  patching runs it), attribution patching's two programs (both forward runs; the backward).
* one block (a middle one, unrolled as attribution patching runs it, patched at
  `head_out` with weight 0): its forward, the forward keeping what the backward needs
  (`jax.vjp` w.r.t. the patch weight and the block input), that backward (activation
  gradients only: no weight gradients are asked for), and the floor under all three: the
  block's six dense products alone (queries, keys, values, attention output, FFN in and out).
* the attention core of one block (scores, softmax, probabilities x values): forward, and
  the backward of the same, as XLA differentiates it.

Every timing is warmed up (compile apart); the rounds interleave all of them, and each
ratio is the median over rounds of (time / the same round's forward), because this
machine's speed moves 15-30% minute to minute.
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import sys

import common
import jax
import jax.numpy as jnp

import bertjax
from bertjax import timing
from bertjax.analysis.interventions import metrics, patching
from bertjax.model.forward import run_layers

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
SHAPES = {
  "bert-base": dict(hidden_size=768, num_hidden_layers=12, intermediate_size=3072),
  "minilm": dict(hidden_size=384, num_hidden_layers=6, intermediate_size=1536),
}
SMOKE = dict(hidden_size=32, num_hidden_layers=2, intermediate_size=64)


def _parse(argv):
  p = argparse.ArgumentParser(
    description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument(
    "--shapes",
    nargs="+",
    choices=tuple(SHAPES),
    default=list(SHAPES),
    help="model shapes to measure (default: both)",
  )
  p.add_argument("--rounds", type=int, default=9, help="interleaved timing rounds (default 9)")
  p.add_argument("--batch", type=int, default=8, help="sequences per batch (default 8)")
  p.add_argument("--seq", type=int, default=128, help="tokens per sequence (default 128)")
  p.add_argument(
    "--smoke", action="store_true", help="a tiny model, 2 rounds: checks that the script runs"
  )
  p.add_argument(
    "--out", type=pathlib.Path, default=RESULTS, help=f"results folder (default {RESULTS})"
  )
  args = p.parse_args(argv)
  if args.rounds < 1:
    p.error(f"--rounds {args.rounds}: expected at least 1")
  return args


def _tasks(shape: str, args) -> dict:
  """name -> a function running one timed call (its result blocked on)."""
  sizes = SMOKE if args.smoke else SHAPES[shape]
  config = bertjax.BertConfig(
    vocab_size=30522, num_attention_heads=4 if args.smoke else 12, **sizes
  )
  params = bertjax.init(config, 0, heads=("mlm",))
  inputs = common.make_inputs(args.batch, args.seq)
  clean = {"input_ids": jnp.asarray(inputs["clean"]), "attention_mask": jnp.asarray(inputs["mask"])}
  corrupted = dict(clean, input_ids=jnp.asarray(inputs["corrupted"]))
  targets = {k: inputs[k] for k in ("position", "answer", "distractor")}
  metric = metrics.LogitDiff("mlm")
  tasks = {}

  def block(f):
    return lambda: jax.block_until_ready(f())

  # Programs.
  tasks["forward"] = block(
    lambda: (
      bertjax.forward(params, config, clean["input_ids"], clean["attention_mask"]).last_hidden_state
    )
  )
  tasks["attribution_patching"] = lambda: patching.attribution_patching(
    params, config, clean, corrupted, metric, targets=targets
  )
  src, dst, tg = patching.checked_pair(config, clean, corrupted, targets, "denoise")
  weights = jnp.asarray(patching.sweep_weights(config, "head_out", args.seq, "heads", None))

  @jax.jit
  def clean_run(params, src):
    batch = {**src, **tg}
    _, run = patching.sweep_forward(
      params,
      config,
      src,
      capture=("head_out",),
      final_rows=metrics.metric_rows(metric, config, batch),
    )
    return run.cache["head_out"], patching.metric_of(params, config, metric, run.last, batch, None)

  tasks["clean_run"] = block(lambda: clean_run(params, src))
  first = functools.partial(
    patching._attribution_forward,
    params,
    config,
    src,
    dst,
    tg,
    weights,
    None,
    site="head_out",
    metric=metric,
  )
  tasks["attribution_program_1_forward_runs"] = block(first)
  _, dst_m, backward = first()
  tasks["attribution_program_2_backward"] = block(
    lambda: patching._attribution_backward(backward, weights, dst_m)
  )

  # One block.
  b, t, n, h = args.batch, args.seq, config.num_attention_heads, config.hidden_size
  keys = jax.random.split(jax.random.key(1), 4)
  x = jax.random.normal(keys[0], (b, t, h))
  mask = jnp.ones((b, t), jnp.int32)
  value = jax.random.normal(keys[1], (config.depth, b, t, n, config.head_dim))
  cot = jax.random.normal(keys[2], (b, t, h))
  middle = config.depth // 2
  w0 = jnp.zeros((config.depth, 1, 1, n, 1))

  def one_block(w, x):
    return run_layers(
      params,
      config,
      x,
      mask,
      start=middle,
      stop=middle + 1,
      patch={"head_out": (value, w)},
      unroll=True,
    ).last

  fwd = jax.jit(one_block)
  keep = jax.jit(lambda w, x: jax.vjp(one_block, w, x))
  back = jax.jit(lambda f: f(cot))
  _, vjp_fn = keep(w0, x)
  tasks["block_forward"] = block(lambda: fwd(w0, x))
  tasks["block_forward_keeping_residuals"] = block(lambda: keep(w0, x))
  tasks["block_backward"] = block(lambda: back(vjp_fn))

  tasks["block_dense_products"] = block(_dense_floor(config, b * t))

  # The attention core of one block.
  q, k, v = (
    jax.random.normal(kk, (b, n, t, config.head_dim)) for kk in jax.random.split(keys[3], 3)
  )
  scale = config.head_dim**-0.5

  def core(q, k, v):
    probs = jax.nn.softmax(jnp.einsum("bnqd,bnkd->bnqk", q, k) * scale, axis=-1)
    return jnp.einsum("bnqk,bnkd->bnqd", probs, v)

  core_fwd = jax.jit(core)
  core_keep = jax.jit(lambda q, k, v: jax.vjp(core, q, k, v))
  core_back = jax.jit(lambda f: f(jnp.ones_like(q)))
  _, core_vjp = core_keep(q, k, v)
  tasks["attention_core_forward"] = block(lambda: core_fwd(q, k, v))
  tasks["attention_core_backward"] = block(lambda: core_back(core_vjp))
  return tasks


def _dense_floor(config, rows: int):
  """The six dense products of one block, alone, on random operands of their shapes."""
  h, f = config.hidden_size, config.intermediate_size
  keys = jax.random.split(jax.random.key(2), 8)
  x = jax.random.normal(keys[0], (rows, h))
  inner = jax.random.normal(keys[1], (rows, f))
  ws = [jax.random.normal(keys[i + 2], (h, h)) for i in range(4)]
  w_in, w_out = jax.random.normal(keys[6], (h, f)), jax.random.normal(keys[7], (f, h))
  run = jax.jit(lambda x, inner, ws, w_in, w_out: [x @ w for w in ws] + [x @ w_in, inner @ w_out])
  return lambda: run(x, inner, ws, w_in, w_out)


def measure(shape: str, args) -> dict:
  return common.against_forward(
    _tasks(shape, args), 2 if args.smoke else args.rounds, f"[{shape}] "
  )


ROWS = [
  ("attribution_patching", "attribution patching, all heads (the whole call)"),
  ("clean_run", "  the clean run alone"),
  (
    "attribution_program_1_forward_runs",
    "  program 1: clean run + corrupted run keeping residuals",
  ),
  ("attribution_program_2_backward", "  program 2: the backward pass"),
  ("block_forward", "one block: forward"),
  ("block_forward_keeping_residuals", "one block: forward keeping residuals"),
  ("block_backward", "one block: backward (activation gradients)"),
  ("block_dense_products", "one block: its six dense products alone"),
  ("attention_core_forward", "attention core: forward"),
  ("attention_core_backward", "attention core: backward"),
]


def markdown(report: dict) -> str:
  m = report["machine"]
  lines = [
    (
      f"# Attribution patching's parts ({m['cpu']}, {m['cpus']} cores, "
      f"ISA: {', '.join(m['isa_flags'])}; jax {report['jax']})"
    ),
    "",
    (
      f"Batch {report['batch']} x {report['seq']}, float32, random weights; medians of "
      f"{report['rounds']} interleaved rounds; ratio = median over rounds of time / that "
      "round's forward pass."
    ),
    "",
  ]
  shapes = list(report["shapes"])
  lines.append("| part | " + " | ".join(f"{s} ms | {s} / forward" for s in shapes) + " |")
  lines.append("|---|" + "---:|---:|" * len(shapes))
  rows = [("forward", "one forward pass (the unit)")] + ROWS
  for key, label in rows:
    cells = []
    for s in shapes:
      r = report["shapes"][s][key]
      cells += [f"{r['median_ms']:.1f}", f"{r['over_forward']:.3f}"]
    lines.append(f"| {label} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def main(argv=None) -> int:
  args = _parse(argv)
  report = {
    "machine": timing.machine(),
    "jax": jax.__version__,
    "backend": jax.default_backend(),
    "batch": args.batch,
    "seq": args.seq,
    "rounds": 2 if args.smoke else args.rounds,
    "smoke": args.smoke,
    "shapes": {},
  }
  for shape in args.shapes[:1] if args.smoke else args.shapes:
    report["shapes"]["smoke" if args.smoke else shape] = measure(shape, args)
  args.out.mkdir(parents=True, exist_ok=True)
  stem = "attribution_parts_cpu" + ("_smoke" if args.smoke else "")
  (args.out / f"{stem}.json").write_text(json.dumps(report, indent=1))
  (args.out / f"{stem}.md").write_text(markdown(report))
  print(markdown(report))
  return 0


if __name__ == "__main__":
  sys.exit(main())
