"""Scaling and evaluating sparse autoencoders: Gao et al. 2024 on an encoder's residual stream.

Run:
  ./run.sh experiment sae_scaling
  .venv/bin/python -m experiments.sae_scaling [--smoke] [--model DIR_OR_HUB_ID]

The method, the data and what differs from the paper: docs/experiments.md, section
`sae_scaling` (the site's Experiments page).
"""

from __future__ import annotations

import pathlib
import sys
import time
from collections.abc import Sequence

import numpy as np

from bertjax import claims, stats, study
from bertjax.claims import Claim, Test
from experiments import common

NAME = "sae_scaling"
EXPANSIONS = (1, 2, 4, 8, 16)


def parse_args(argv: Sequence[str] | None = None):
  p = common.parser(__doc__)
  p.add_argument(
    "--layer",
    type=int,
    default=None,
    help="the block whose output is read, counted from 0 (default: depth // 2)",
  )
  p.add_argument("--k", type=int, default=32, help="latents kept per token (default: 32)")
  p.add_argument("--steps", type=int, default=300, help="training steps per size (default: 300)")
  p.add_argument("--batch-tokens", type=int, default=1024, help="tokens per step (default: 1024)")
  p.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate (default: 1e-3)")
  args = p.parse_args(argv)
  for name in ("k", "steps", "batch_tokens"):
    if getattr(args, name) < 1:
      raise study.UsageError(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
  if args.smoke:
    args.steps, args.batch_tokens = min(args.steps, 20), min(args.batch_tokens, 256)
  return args


def figure(out, r: dict, model_name: str, stem: str) -> list[str]:
  """The FVU against the latents with its power-law fit, and the dead and dense latents."""
  from bertjax.plots import sae as plots

  path = pathlib.Path(out) / f"{stem}_scaling.png"
  return [plots.scaling(r, path, title=f"Top-k SAE scaling: {model_name}").name]


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  with study.quick_compiles(args.smoke):
    return run_experiment(args)


def run_experiment(args) -> int:
  """The experiment on parsed arguments."""
  t_start = time.perf_counter()
  timings: dict[str, float] = {}
  import jax.numpy as jnp

  from bertjax.analysis.batching import as_batch
  from bertjax.analysis.representations import sae
  from bertjax.tasks import passages

  data = study.data_dir(args.data_dir, "wikitext2_tokens")
  with study.timed(timings, "load model"):
    config, params, tok, model_name = study.load_model(args)
  layer = config.depth // 2 if args.layer is None else args.layer
  if not 0 <= layer < config.depth:
    raise study.UsageError(f"--layer={layer} must be a block index in [0, {config.depth})")
  encode = lambda texts: [
    tok.encode(texts[i : i + 32], max_length=64, truncation=True) for i in range(0, len(texts), 32)
  ]
  train_batches = encode(passages.wikitext_paragraphs(data / "wikitext2_tokens" / "valid.txt"))
  test_batches = encode(passages.wikitext_paragraphs(data / "wikitext2_tokens" / "test.txt", 256))
  with study.timed(timings, "activations"):
    train = sae.activations(params, config, train_batches, "out", layer)
    held = sae.activations(params, config, test_batches, "out", layer)
  # Each held-out token's paragraph (the activations run row-major over real tokens): the
  # items of the scaling row's interval.
  real = np.concatenate([np.asarray(as_batch(b)["attention_mask"]).sum(1) for b in test_batches])
  paragraphs = np.repeat(np.arange(len(real)), real)
  study.log(f"{len(train):,} training and {len(held):,} held-out tokens of block {layer}")
  expansions = (2, 4) if args.smoke else EXPANSIONS
  with study.timed(timings, "train"):
    r, (state, cfg, ev) = sae.scaling_sweep(
      train,
      held,
      expansions,
      **{k: getattr(args, k) for k in ("k", "lr", "steps", "batch_tokens", "seed")},
      log=study.log,
      groups=paragraphs,
    )
  clean: dict[bytes, object] = {}

  def pooled(out, b):
    m = b["attention_mask"][..., None]
    return jnp.sum(out.last_hidden_state * m, 1) / m.sum(1)

  def distance(out, b):  # squared distance of the sentence embedding to the clean run's
    key = np.asarray(b["input_ids"]).tobytes()
    clean.setdefault(key, pooled(out, b))
    return jnp.mean(jnp.sum((pooled(out, b) - clean[key]) ** 2, -1))

  with study.timed(timings, "loss recovered"):
    r["loss_recovered"] = sae.loss_recovered(
      params, config, test_batches[:4], "out", layer, state.params, cfg, distance
    )
  top = np.argsort(-ev["frequency"])[:3]
  r["top_activating"] = {
    str(k): v
    for k, v in sae.top_activating(
      params, config, tok, test_batches[:4], "out", layer, state.params, cfg, top, n=6
    ).items()
  }
  r["timings"] = timings
  settings = {
    "model": model_name,
    "depth": config.depth,
    "layer": layer,
    "site": "out",
    "k": args.k,
    "steps": args.steps,
    "batch_tokens": args.batch_tokens,
    "lr": args.lr,
    "expansions": list(expansions),
    "seed": args.seed,
    "xla_optimised": not args.smoke,  # --smoke: `study.quick_compiles`
    "data": "wikitext2_tokens/valid.txt (training), test.txt (held out; 256 "
    "paragraphs), 64 tokens each",
    "indexing": "settings.layer is the block index counted from 0; the rows name it "
    "layer + 1, the README's numbering",
  }
  figures = figure(args.out, r, model_name, study.results_stem(NAME, args.model))
  study.finish(NAME, args, r, settings, findings=findings, started=t_start, figures=figures)
  return 0


# The claims ---------------------------------------------------------------------------------------
# `findings(results, settings)`: the Findings rows, made from the numbers as the JSON holds
# them; `uncertainty(results, settings)`: each claim's interval and verdict.

PAPER = "Gao et al. 2024"


DEAD_LIMIT = 0.10  # the paper's 16M-latent GPT-4 SAE: 7% dead


FALLS = "the share of doublings that lower the FVU"
R2 = "the power law's R^2"
CHANGE = "the largest's FVU minus the smallest's"
MOST_DEAD, LEAST_DEAD = "the most dead latents at a size", "the fewest dead latents at a size"
SCALING = Claim(
  PAPER,
  "Reconstruction error of top-k SAEs falls as a power law in the number of latents.",
  yes=(Test(FALLS, ">=", 1), Test(R2, ">=", 0.95)),
  partly=(Test(CHANGE, "<", 0),),
  partly_if="all",
)
DEAD = Claim(
  PAPER,
  "With TopK, the AuxK loss and the tied initialisation few latents die, even at "
  "large sizes (their 16M-latent GPT-4 SAE: 7% dead).",
  yes=(Test(MOST_DEAD, "<=", DEAD_LIMIT),),
  partly=(Test(LEAST_DEAD, "<=", DEAD_LIMIT),),
  short="With TopK, AuxK and tied initialisation few latents die, even at large sizes (GPT-4: 7%).",
)


def scaling_quantities(fvu, r2) -> dict[str, float]:
  """What `SCALING` reads from the FVU by size (smallest first; `(..., sizes)`: one per
  resample) and the fit's R^2."""
  fvu = np.asarray(fvu, float)
  return {
    FALLS: np.mean(np.diff(fvu) < 0, -1),
    R2: r2,
    CHANGE: fvu[..., -1] - fvu[..., 0],
  }


def dead_quantities(dead: Sequence[float]) -> dict[str, float]:
  """What `DEAD` reads from the dead shares by size."""
  return {MOST_DEAD: float(np.max(dead)), LEAST_DEAD: float(np.min(dead))}


def findings(r: dict, s: dict) -> list[dict]:
  """The two rows, from the results and settings as written to JSON (`python -m
  experiments.findings --refresh` recomputes them)."""
  r = study.from_json(r)
  sizes, fvu, dead = r["latents"], r["fvu"], r["dead"]
  fit = r["fit"]
  per = ", ".join(f"{n}: {v:.3f}" for n, v in zip(sizes, fvu))
  budget = f"{s['steps']} steps x {s['batch_tokens']} tokens"
  rec = r["loss_recovered"]
  scaling = (
    f"held-out FVU by latents (k = {s['k']}, {s['model']} layer {s['layer'] + 1} output, "
    f"{budget} each, {r['held_out_tokens']:,} held-out WikiText-2 tokens): {per}; fit FVU = "
    f"{fit['coefficient']:.2f} N^{fit['exponent']:.3f}, R^2 {fit['r2']:.3f}. With the largest "
    f"in place of the site the sentence embedding keeps {rec['recovered']:.2f} of what "
    "zero-ablating the site loses (squared distance to the clean embedding). Differs from "
    f"the paper: a {s['depth']}-layer sentence encoder rather than GPT-2 or GPT-4, and one "
    "fixed token budget for every size rather than each trained to convergence."
  )
  dead_text = (
    "dead latents (firing on no held-out token) by size: "
    + ", ".join(f"{n}: {100 * v:.1f}%" for n, v in zip(sizes, dead))
    + "; dense (firing on > 10% of tokens): "
    + ", ".join(f"{100 * v:.1f}%" for v in r["dense"])
    + "."
  )
  return [
    SCALING.row(scaling, scaling_quantities(fvu, fit["r2"])),
    DEAD.row(dead_text, dead_quantities(dead)),
  ]


# How sure each row is ------------------------------------------------------------------------


def uncertainty(r: dict, s: dict) -> list[claims.Judgement]:
  """The scaling row over the held-out paragraphs (each one's squared error per size and its
  squared deviation from the held-out mean, resampled together; the power law refitted to
  every resample); the dead latents are exact. One training run per size: the SAEs' own
  seeds are not resampled."""
  dead = claims.note(
    "exact: counted over every held-out token, nothing sampled; one training "
    "run per size (seed 0), seeds not repeated"
  )
  per = r.get("per_group")
  if not per:  # a run from before they were kept
    return [claims.rerun_needed("per-paragraph reconstruction errors of each size"), dead]
  error, variance = np.asarray(per["error"], float).T, np.asarray(per["variance"], float)
  log_n = np.log(np.asarray(r["latents"], float))

  def statistics(error, variance):
    fvu = error.sum(-2) / variance.sum(-1)[..., None]  # (resamples, sizes)
    r2 = stats.pearson_rows(np.broadcast_to(log_n, fvu.shape), np.log(fvu)) ** 2
    return scaling_quantities(fvu, r2)

  row = findings(r, s)[0]["value"]
  scaling = SCALING.judge(
    (error, variance),
    statistics,
    point={row["name"]: row["value"]},
    over=f"the {len(variance)} held-out paragraphs, one SAE per size",
  )
  return [scaling, dead]


if __name__ == "__main__":
  sys.exit(main())
