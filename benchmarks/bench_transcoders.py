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

The floor, by parts: every step of a transcoder with these latents does, whatever the code
around them, (1) the encoder's products and their weight gradients (per layer, tokens x d
times d x m and its transpose: dense, the latents' pre-activations decide what is kept),
(2) for top-k, the selection of k latents per token and layer (`jax.lax.top_k`), and (3) the
Adam update over every parameter (with the decoder's projection and renormalisation), which
reads and writes each parameter and both moments once. Each part is one compiled program,
timed in the same rounds as the step; their sum is the step's floor on this machine, before
any decoder, loss or gradient of the latents.
"""

from __future__ import annotations

import functools
import json
import pathlib
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
  run_forward = lambda: jax.block_until_ready(forward(params, ids, mask))
  d = config.hidden_size
  rows = {}
  # A kind at a time, each beside the forward in its own rounds: the states of every kind
  # at once (a CLT's with its Adam moments is 5 GB at all-mpnet-base-v2's shape) overflow 24 GiB.
  for kind, options in KINDS.items():
    cfg = tcs.TranscoderConfig(
      d_model=d, layers=config.depth, latents=args.expansion * d, k=min(32, d), **options
    )
    calls = {"forward": run_forward, kind: stepper(cfg, x, y)}
    flops = {"forward": forward_flops(config, batch * seq, seq), kind: step_flops(cfg, len(x))}
    for part, (call, part_flops) in parts(cfg, x, y).items():
      calls[f"{kind}: {part}"], flops[f"{kind}: {part}"] = call, part_flops
    times = common.interleaved(calls, args)
    del calls
    fwd = times["forward"]["median_s"]
    for n, t in times.items():
      rows[n if n != "forward" else f"{kind}: forward"] = common.entry(
        t, flops=flops[n], over_forward=t["median_s"] / fwd
      )
  rows["forward"] = rows[f"{next(iter(KINDS))}: forward"]
  return {"tokens": len(x), "latents": args.expansion * d, **rows}


def stepper(cfg: tcs.TranscoderConfig, x, y):
  """A call running one training step of a transcoder on (x, y), from the state the last
  call left (the state is donated). Every call does the same work: no latent goes dead within
  the bench's few thousand tokens (`dead_tokens` is 10 million), so AuxK stays off."""
  state = [tcs.start(tcs.init(0, cfg, x, y), cfg)]
  step, scale = tcs.make_step(cfg), jnp.asarray(tcs.target_scale(y))

  def call():
    state[0], metrics = step(state[0], x, y, scale)
    jax.block_until_ready(state[0].params)
    if float(metrics["dead"]) != 0:
      raise RuntimeError("a latent went dead during the bench: the step's work changed")
    return metrics

  return call


PARTS = ("encoder products", "top-k", "Adam update")


def parts(cfg: tcs.TranscoderConfig, x, y) -> dict:
  """The step's floor by parts (the module's docstring): part name -> (a call, its FLOPs)."""
  params = tcs.init(0, cfg, x, y)
  n, d, m = x.shape[0], cfg.d_model, cfg.latents
  grads = jax.tree.map(lambda a: 1e-3 * a, params)
  state = [params, tcs.start(params, cfg).opt_state]  # donated by each update
  params = {k: jnp.copy(params[k]) for k in ("b_in", "W_enc", "b_enc")}  # the encoder's

  @jax.jit
  def encoder(p, x):
    # Each layer's pre-activations and a weight gradient of the same shape (a dense
    # cotangent: the pre-activations themselves stand in for it).
    out = []
    for layer in range(cfg.layers):
      pre = tcs.layer_pre(p, layer, x[:, layer])
      out.append((pre, (x[:, layer] - p["b_in"][layer]).T @ pre))
    return out

  pres = [pre for pre, _ in encoder(params, x)]
  top_k = jax.jit(lambda pres: [jax.lax.top_k(pre, cfg.k) for pre in pres])
  update = jax.jit(functools.partial(tcs.apply_gradients, cfg), donate_argnums=(0, 1))

  def adam():
    state[:] = update(*state, grads)
    return jax.block_until_ready(state)

  calls = {
    "encoder products": (
      lambda: jax.block_until_ready(encoder(params, x)),
      float(2 * 2 * n * d * m * cfg.layers),
    ),
    "top-k": (lambda: jax.block_until_ready(top_k(pres)), 0.0),
    "Adam update": (adam, 0.0),
  }
  if cfg.activation != "topk":
    del calls["top-k"]
  return calls


def main(argv=None) -> dict:
  p = common.parser(__doc__, rounds=5, warmup=2)
  p.add_argument("--expansion", type=int, default=8, help="latents per model dimension")
  p.add_argument(
    "--page-from",
    metavar="JSON",
    type=pathlib.Path,
    help="measure nothing: write OUT/bench_transcoders.md again from this result file",
  )
  args = p.parse_args(argv)
  if args.page_from is not None:
    if not args.page_from.is_file():
      p.error(f"--page-from {args.page_from}: no such result file")
    result = json.loads(args.page_from.read_text())
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_transcoders.md").write_text(markdown(result))
    return result
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
  floors = []
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
    for kind in KINDS:
      here = [(part, m[f"{kind}: {part}"]) for part in PARTS if f"{kind}: {part}" in m]
      floor = sum(e["median_s"] for _, e in here)
      shares = ", ".join(f"{part} {e['over_forward']:.2f}x" for part, e in here)
      fwd = m[f"{kind}: forward"]
      floors.append(
        f"- {name}, {kind}: floor {floor * 1e3:.0f} ms = "
        f"**{floor / fwd['median_s']:.2f}x** the forward of its rounds ({shares}); the step is "
        f"{m[kind]['median_s'] / floor:.2f}x its floor. All its matrix products are "
        f"{m[kind]['flops'] / fwd['flops']:.2f}x the forward's FLOPs."
      )
  header = ("model shape", "call", "median", "vs forward", "GFLOP", "GFLOP/s", "first call")
  lines += common.table(header, rows)
  lines += [
    "",
    (
      "The floor by parts, each part one compiled program timed in the same rounds (the "
      "encoder's products and their weight gradients, the top-k selection, the Adam update):"
    ),
    "",
    *floors,
    "",
    "Target: a step at most 2x the forward pass.",
  ]
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  main()
