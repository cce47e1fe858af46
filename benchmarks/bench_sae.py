"""One top-k SAE training step against one forward pass, BERT-base shape, on the CPU.

Run: ./run.sh bench bench_sae            (writes benchmarks/results/bench_sae.{json,md})
     ./run.sh bench bench_sae --smoke    (tiny shapes, one round; checks the script runs)

The issue's target: one SAE training step on the 8 x 128 tokens of a batch, at one site, at
most 1.5x one forward pass of the model on that batch. Side by side in one run:

* forward: `jax.jit` of `bertjax.forward` (BERT-base: 12 x 768, random weights, float32) on
  8 x 128 random token ids, the output read;
* sae step: `bertjax.analysis.representations.sae.make_step` on those 1,024 tokens' 768-wide activations
  (16x latents = 12,288, k = 32, AuxK 256): forward, loss, gradients, the decoder's
  projection, Adam and the renormalisation, compiled as one program; once with no dead
  latent (the usual state: the AuxK term in closed form) and once with every latent dead
  before the step (the AuxK top-256 over every latent; those the batch fires revive, as
  the released code counts them).

Each call is compiled first (reported apart), warmed up, then timed in interleaved rounds
with a rotating order. Results name the CPU and its ISA.
"""

from __future__ import annotations

import common
import jax
import jax.numpy as jnp
import numpy as np

import bertjax
from bertjax import timing
from bertjax.analysis.representations import sae


def main(argv=None) -> dict:
  p = common.parser(__doc__, rounds=7, warmup=2)
  p.add_argument("--expansion", type=int, default=16, help="latents per model dimension")
  args = p.parse_args(argv)
  batch, seq = 8, 128
  config = bertjax.BertConfig.preset("bert-base")
  if args.smoke:
    args.rounds, args.warmup = 1, 0
    batch, seq = 2, 16
    config = bertjax.BertConfig.preset("tiny")
  params = bertjax.init(config, 0)
  ids = jnp.asarray(
    np.random.default_rng(0).integers(5, config.vocab_size, (batch, seq)), jnp.int32
  )
  mask = jnp.ones_like(ids)
  forward = jax.jit(lambda p, i, m: bertjax.forward(p, config, i, m).last_hidden_state)
  acts = sae.activations(
    params, config, [{"input_ids": ids, "attention_mask": mask}], "out", config.depth // 2
  )
  d = config.hidden_size
  cfg = sae.SAEConfig(d_model=d, latents=args.expansion * d, k=32, auxk=256)
  sae_params = sae.init(0, cfg, acts)
  scale = jnp.float32(sae.mse_scale(acts))
  step = sae.make_step(cfg)
  x = jnp.asarray(acts)
  states = {
    "sae_step": sae.start(sae_params, cfg),
    "sae_step_all_dead": sae.start(sae_params, cfg)._replace(
      tokens_since=jnp.full(cfg.latents, cfg.dead_tokens + 1, jnp.int32)
    ),
  }

  def run_step(name):
    def call():
      # The state is donated: each call steps from a copy, so every round does the same work.
      state = jax.tree.map(jnp.copy, states[name])
      new, metrics = step(state, x, scale)
      jax.block_until_ready(new.params)
      return metrics

    return call

  calls = {
    "forward": lambda: jax.block_until_ready(forward(params, ids, mask)),
    "sae_step": run_step("sae_step"),
    "sae_step_all_dead": run_step("sae_step_all_dead"),
  }
  first = {}
  times = common.interleaved(calls, args, outputs=first)
  rows = {n: common.entry(t) for n, t in times.items()}
  for n in ("sae_step", "sae_step_all_dead"):
    rows[n]["dead_share"] = float(first[n]["dead"])
  fwd = rows["forward"]["median_s"]
  result = {
    "machine": timing.machine(),
    "model": "bert-base (random)" if not args.smoke else "tiny",
    "batch": batch,
    "seq": seq,
    "d_model": d,
    "latents": cfg.latents,
    "k": cfg.k,
    "auxk": cfg.auxk,
    "site": f"out, block {config.depth // 2}",
    "rows": rows,
    "ratio_step_vs_forward": rows["sae_step"]["median_s"] / fwd,
    "ratio_all_dead_vs_forward": rows["sae_step_all_dead"]["median_s"] / fwd,
    "rounds": args.rounds,
    "warmup": args.warmup,
    "smoke": args.smoke,
  }
  common.write(result, markdown(result), args.out, "bench_sae", files=not args.smoke)
  return result


def markdown(r: dict) -> str:
  m = r["machine"]
  intro = (
    f"One top-k SAE training step against one forward pass on the CPU, float32: "
    f"{m['cpu']}, {m['cpus_usable']} usable CPUs; ISA: {', '.join(m['isa_flags'])}; "
    f"jax {m['jax']}. Model {r['model']}, {r['batch']} x {r['seq']} tokens; SAE at "
    f"{r['site']}: d = {r['d_model']}, {r['latents']} latents, k = {r['k']}, AuxK "
    f"{r['auxk']}. Medians of {r['rounds']} interleaved rounds after {r['warmup']} "
    "warm-up rounds; compile apart."
  )
  rows = r["rows"]
  lines = [intro, "", "| call | median | vs forward | compile |", "|---|---|---|---|"]
  for n, label in (
    ("forward", "forward pass"),
    ("sae_step", "SAE step (no dead latent)"),
    ("sae_step_all_dead", "SAE step (every latent dead before it: AuxK top-k)"),
  ):
    ratio = rows[n]["median_s"] / rows["forward"]["median_s"]
    lines.append(
      f"| {label} | {rows[n]['median_s'] * 1e3:.0f} ms | {ratio:.2f}x | "
      f"{rows[n]['first_call_s']:.1f} s |"
    )
  lines += ["", "Target: a step at most 1.5x the forward pass."]
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  main()
