"""Scaling and evaluating sparse autoencoders: Gao et al. 2024 on an encoder's residual stream.

Run:
  ./run.sh experiment sae_scaling
  .venv/bin/python experiments/sae_scaling.py [--smoke] [--model DIR_OR_HUB_ID]

The method, the data and what differs from the paper: docs/experiments.md, section
`sae_scaling` (the site's Experiments page).
"""

from __future__ import annotations

import pathlib
import sys
import time
from collections.abc import Sequence

import common
import numpy as np

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
      raise common.UsageError(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
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
  with common.quick_compiles(args.smoke):
    return run_experiment(args)


def run_experiment(args) -> int:
  """The experiment on parsed arguments."""
  t_start = time.perf_counter()
  timings: dict[str, float] = {}
  import jax.numpy as jnp

  from bertjax.analysis.representations import sae
  from bertjax.tasks import passages

  data = common.data_dir(args.data_dir, "wikitext2_tokens")
  with common.timed(timings, "load model"):
    config, params, tok, model_name = common.load_model(args)
  layer = config.depth // 2 if args.layer is None else args.layer
  if not 0 <= layer < config.depth:
    raise common.UsageError(f"--layer={layer} must be a block index in [0, {config.depth})")
  encode = lambda texts: [
    tok.encode(texts[i : i + 32], max_length=64, truncation=True) for i in range(0, len(texts), 32)
  ]
  train_batches = encode(passages.wikitext_paragraphs(data / "wikitext2_tokens" / "valid.txt"))
  test_batches = encode(passages.wikitext_paragraphs(data / "wikitext2_tokens" / "test.txt", 256))
  with common.timed(timings, "activations"):
    train = sae.activations(params, config, train_batches, "out", layer)
    held = sae.activations(params, config, test_batches, "out", layer)
  common.log(f"{len(train):,} training and {len(held):,} held-out tokens of block {layer}")
  expansions = (2, 4) if args.smoke else EXPANSIONS
  with common.timed(timings, "train"):
    r, (state, cfg, ev) = sae.scaling_sweep(
      train,
      held,
      expansions,
      **{k: getattr(args, k) for k in ("k", "lr", "steps", "batch_tokens", "seed")},
      log=common.log,
    )
  clean: dict[bytes, object] = {}

  def pooled(out, b):
    m = b["attention_mask"][..., None]
    return jnp.sum(out.last_hidden_state * m, 1) / m.sum(1)

  def distance(out, b):  # squared distance of the sentence embedding to the clean run's
    key = np.asarray(b["input_ids"]).tobytes()
    clean.setdefault(key, pooled(out, b))
    return jnp.mean(jnp.sum((pooled(out, b) - clean[key]) ** 2, -1))

  with common.timed(timings, "loss recovered"):
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
    "xla_optimised": not args.smoke,  # --smoke: `common.quick_compiles`
    "data": "wikitext2_tokens/valid.txt (training), test.txt (held out; 256 "
    "paragraphs), 64 tokens each",
    "indexing": "settings.layer is the block index counted from 0; the rows name it "
    "layer + 1, the README's numbering",
  }
  figures = figure(args.out, r, model_name, common.results_stem(NAME, args.model))
  common.finish(NAME, args, r, settings, started=t_start, figures=figures)
  return 0


if __name__ == "__main__":
  sys.exit(main())
