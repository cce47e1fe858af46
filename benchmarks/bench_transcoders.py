"""One transcoder training step against one forward pass of the model, on the CPU.

Run: ./run.sh bench bench_transcoders           (writes benchmarks/results/bench_transcoders.*)
     ./run.sh bench bench_transcoders --smoke   (tiny shapes, one round; checks the script runs)

Issue 62's target: a training step at most 2x a forward pass of the model. Side by side in one
run, for all-MiniLM-L6-v2's shape (6 x 384, FFN 1,536) and all-mpnet-base-v2's (12 x 768, FFN
3,072), random weights, float32, on the 8 x 128 tokens of a batch:

* forward: `jax.jit` of `bertjax.forward`, the output read;
* each transcoder's `make_step` on those 1,024 tokens' FFN inputs and outputs at every layer
  (`--expansion` x d latents per layer): the encoder, the top-k or JumpReLU, the decoder,
  the loss, gradients, the decoder's projection, Adam and the renormalisation as one
  program. Per-layer (PLT) top-k (k = 32, AuxK 256, no dead latent: the term in closed
  form), PLT JumpReLU, and cross-layer (CLT) top-k, whose layer l writes to L - l layers.

Each call is compiled first (reported apart), warmed up, then timed in interleaved rounds
with a rotating order. The FLOPs of each call's matrix products are counted beside it
(`flops`: 2 per multiply-add; the forward's attention included). Results name the CPU and
its ISA.
"""

from __future__ import annotations

import sys

import common
import jax
import jax.numpy as jnp
import numpy as np

import bertjax
from bertjax import timing
from bertjax.analysis.circuits import transcoders as tcs

SHAPES = {
  "all-MiniLM-L6-v2": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12),
  "all-mpnet-base-v2": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12),
}
KINDS = {
  "PLT top-k": dict(cross_layer=False, activation="topk"),
  "PLT JumpReLU": dict(cross_layer=False, activation="jumprelu"),
  "CLT top-k": dict(cross_layer=True, activation="topk"),
}


def forward_flops(config, tokens: int, seq: int) -> float:
  """Matrix-product FLOPs of one forward pass (projections, FFN, attention's two products)."""
  d, f = config.hidden_size, config.intermediate_size
  per_layer = 2 * tokens * (4 * d * d + 2 * d * f) + 2 * 2 * tokens * seq * d
  return float(config.depth * per_layer)


def step_flops(cfg: tcs.TranscoderConfig, tokens: int) -> float:
  """Matrix-product FLOPs of one step: the encoder forward and its weight gradient (no input
  gradient), the decoder's (gathered top-k rows, or dense JumpReLU latents), forward and
  both gradients."""
  d, m = cfg.d_model, cfg.latents
  writes = sum(cfg.reach(layer) for layer in range(cfg.layers)) * d  # output width summed
  encoder = 2 * 2 * tokens * d * m * cfg.layers
  per_latent = cfg.k if cfg.activation == "topk" else m
  decoder = 3 * 2 * tokens * per_latent * writes
  return float(encoder + decoder)


def time_model(shape: dict, args, batch: int, seq: int) -> dict:
  """One model shape's forward pass and transcoder steps, timed side by side."""
  config = bertjax.BertConfig(vocab_size=30527, intermediate_size=4 * shape["hidden_size"], **shape)
  params = bertjax.init(config, 0)
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(5, config.vocab_size, (batch, seq)), jnp.int32)
  mask = jnp.ones_like(ids)
  forward = jax.jit(lambda p, i, m: bertjax.forward(p, config, i, m).last_hidden_state)
  x, y = tcs.activations(params, config, [{"input_ids": ids, "attention_mask": mask}])
  calls = {"forward": lambda: jax.block_until_ready(forward(params, ids, mask))}
  flops = {"forward": forward_flops(config, batch * seq, seq)}
  d = config.hidden_size
  for kind, options in KINDS.items():
    cfg = tcs.TranscoderConfig(
      d_model=d, layers=config.depth, latents=args.expansion * d, k=min(32, d), **options
    )
    calls[kind] = stepper(cfg, x, y)
    flops[kind] = step_flops(cfg, len(x))
  times = common.interleaved(calls, args)
  fwd = times["forward"]["median_s"]
  rows = {
    n: common.entry(t, flops=flops[n], over_forward=t["median_s"] / fwd) for n, t in times.items()
  }
  return {"tokens": len(x), "latents": args.expansion * d, **rows}


def stepper(cfg: tcs.TranscoderConfig, x, y):
  """A call running one training step of a fresh transcoder on (x, y)."""
  state = tcs.start(tcs.init(0, cfg, x, y), cfg)
  step, scale = tcs.make_step(cfg), jnp.asarray(tcs.target_scale(y))

  def call():
    # The state is donated: each call steps from a copy, so every round does the same work.
    new, metrics = step(jax.tree.map(jnp.copy, state), x, y, scale)
    jax.block_until_ready(new.params)
    return metrics

  return call


def main(argv=None) -> dict:
  p = common.parser(__doc__, rounds=5, warmup=2)
  p.add_argument("--expansion", type=int, default=8, help="latents per model dimension")
  args = p.parse_args(argv)
  batch, seq, shapes = 8, 128, SHAPES
  if args.smoke:
    args.rounds, args.warmup = 1, 0
    batch, seq = 2, 16
    shapes = {"tiny": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4)}
  result = {
    "machine": timing.machine(),
    "batch": batch,
    "seq": seq,
    "expansion": args.expansion,
    "rounds": args.rounds,
    "warmup": args.warmup,
    "smoke": args.smoke,
    "models": {},
  }
  for name, shape in shapes.items():
    result["models"][name] = row = time_model(shape, args, batch, seq)
    done = ", ".join(f"{n} {row[n]['median_s'] * 1e3:.0f} ms" for n in ("forward", *KINDS))
    print(f"{name}: {done}", flush=True, file=sys.stderr)
  common.write(result, markdown(result), args.out, "bench_transcoders", files=not args.smoke)
  return result


def markdown(r: dict) -> str:
  intro = (
    f"One transcoder training step against one forward pass on the CPU, float32, "
    f"{r['batch']} x {r['seq']} tokens, {r['expansion']} x d latents per layer (top-k: k = 32, "
    f"AuxK 256). Medians of {r['rounds']} interleaved rounds after {r['warmup']} warm-up "
    f"rounds; compile apart. {common.measured_on(r['machine'])}"
  )
  lines = [intro, ""]
  rows = []
  for name, m in r["models"].items():
    for n in ("forward", *KINDS):
      e = m[n]
      rows.append(
        (
          name,
          n,
          f"{e['median_s'] * 1e3:.0f} ms",
          f"{e['over_forward']:.2f}x",
          f"{e['flops'] / 1e9:.1f}",
          f"{e['flops'] / e['median_s'] / 1e9:.0f}",
          f"{e['first_call_s']:.1f} s",
        )
      )
  header = ("model shape", "call", "median", "vs forward", "GFLOP", "GFLOP/s", "first call")
  lines += common.table(header, rows)
  lines += ["", "Target: a step at most 2x the forward pass."]
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  main()
