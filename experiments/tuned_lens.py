"""The tuned lens against the logit lens: Belrose et al. 2023 on a masked-LM encoder.

Run:
  ./run.sh experiment tuned_lens
  .venv/bin/python -m experiments.tuned_lens [--smoke] [--model DIR_OR_HUB_ID]
      [--steps N] [--windows N] [--out DIR | --update-results]

The method, the data and what differs from the paper: docs/experiments.md, section
`tuned_lens` (the site's Experiments page).
"""

from __future__ import annotations

import pathlib
import sys
import time
from collections.abc import Sequence

import numpy as np

from bertjax import claims, study
from bertjax.claims import Claim, Test
from experiments import common

NAME = "tuned_lens"
LENGTH = 64  # tokens per window the lens trains and is scored on


def parse_args(argv: Sequence[str] | None = None):
  p = common.parser(__doc__)
  p.add_argument(
    "--steps",
    type=int,
    default=250,
    help="the lens's optimiser steps (default: 250, the released code's; --smoke: 10)",
  )
  p.add_argument(
    "--lr-scale",
    type=float,
    default=0.25,
    help="the released optimiser's lr_scale (default: 0.25; the released 1.0 is for steps of "
    "2^18 tokens, and at 256 tokens a step it left the MiniLM lens worse than the logit lens "
    "at its last two layers)",
  )
  p.add_argument(
    "--windows",
    type=int,
    default=1000,
    help=f"{LENGTH}-token WikiText-2 validation windows it trains on, 4 a step; a quarter as "
    "many test windows score it (default: 1000; --smoke: 16)",
  )
  p.add_argument(
    "--mlm-windows",
    type=int,
    default=3000,
    help="128-token windows an MLM head is fitted on when the checkpoint has none "
    "(default: 3000, as outlier_dimensions, which reads the same cached head; --smoke: 16)",
  )
  p.add_argument(
    "--mlm-steps",
    type=int,
    default=600,
    help="optimiser steps of that fit (default: 600; --smoke: 20)",
  )
  args = p.parse_args(argv)
  for name in ("steps", "windows", "mlm_windows", "mlm_steps"):
    if getattr(args, name) < 1:
      raise study.UsageError(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
  if not args.lr_scale > 0:
    raise study.UsageError(f"--lr-scale={args.lr_scale} must be > 0")
  if args.smoke:
    args.steps, args.windows = min(args.steps, 10), min(args.windows, 16)
    args.mlm_windows, args.mlm_steps = min(args.mlm_windows, 16), min(args.mlm_steps, 20)
  return args


def figure(out, r: dict, model_name: str, stem: str) -> list[str]:
  """Held-out KL to the final layer's distribution by layer, tuned and logit lens."""
  from bertjax.plots import charts

  path = pathlib.Path(out) / f"{stem}_kl.png"
  charts.layer_curves(
    {"tuned lens": r["tuned"], "logit lens": r["logit"]},
    path,
    ylabel="KL(final || lens), nats",
    title=f"Tuned and logit lens: {model_name}",
  )
  return [path.name]


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  t_start = time.perf_counter()
  timings: dict[str, float] = {}
  from bertjax.analysis.attribution import tuned_lens

  data = study.data_dir(args.data_dir, "wikitext2_tokens")
  with study.timed(timings, "load model"):
    config, params, tok, model_name = study.load_model(args)
  params, head = study.with_mlm_head(
    args, params, config, tok, data, timings, windows=args.mlm_windows, steps=args.mlm_steps
  )
  windows = lambda split, n: study.wikitext_windows(tok, config, data, split, n, 4, LENGTH)
  train, held = windows("valid", args.windows), windows("test", max(1, args.windows // 4))
  with study.timed(timings, "train"):
    lens, losses = tuned_lens.train(
      params, config, train, steps=args.steps, lr_scale=args.lr_scale, progress=sys.stderr.isatty()
    )
  with study.timed(timings, "evaluate"):
    ev = tuned_lens.evaluate(params, config, lens, held)
  study.log(
    "KL by layer, tuned: "
    + ", ".join(f"{v:.2f}" for v in ev["tuned"])
    + "; logit: "
    + ", ".join(f"{v:.2f}" for v in ev["logit"])
  )
  r = {
    **ev,
    "head": head,
    "train_loss": losses,
    "train_tokens": int(sum(b["attention_mask"].sum() for b in train)),
    "timings": timings,
  }
  settings = {
    "model": model_name,
    "depth": config.depth,
    "steps": args.steps,
    "lr_scale": args.lr_scale,
    "windows": args.windows,
    "window_tokens": LENGTH,
    "batch_windows": 4,
    "mlm_windows": args.mlm_windows,
    "mlm_steps": args.mlm_steps,
    "seed": args.seed,
    "data": f"wikitext2_tokens/valid.txt (the lens's training windows), test.txt "
    f"(held out); {LENGTH}-token windows",
    "indexing": "layer 0 is the embedding output, layer l the output of block l",
  }
  figures = figure(args.out, r, model_name, study.results_stem(NAME, args.model))
  study.finish(NAME, args, r, settings, findings=findings, started=t_start, figures=figures)
  return 0


# The claims ---------------------------------------------------------------------------------------
# `findings(results, settings)`: the Findings rows, made from the numbers as the JSON holds
# them; `uncertainty(results, settings)`: each claim's interval and verdict.

CLOSER = "the share of layers where the tuned lens's KL is below the logit lens's"
GAP = "the logit lens's KL minus the tuned lens's where it is least (nats)"
LENS = Claim(
  "Belrose et al. 2023",
  "A tuned lens (an affine translator per layer, trained to match the final layer's "
  "distribution) reads every layer's prediction closer to the final layer's than the logit "
  "lens does (lower KL).",
  yes=(Test(CLOSER, ">=", 1),),
  partly=(Test(CLOSER, ">=", 0.5),),
  short="A tuned lens reads every layer's prediction closer to the final layer's than the logit lens.",
)


def closer(tuned: Sequence[float], logit: Sequence[float]) -> float:
  """The share of layers where the tuned lens's KL is below the logit lens's."""
  return float(np.mean(np.asarray(tuned) < np.asarray(logit)))


def findings(r: dict, s: dict) -> list[dict]:
  """The row, from the results and settings as written to JSON (`python -m
  experiments.findings --refresh` recomputes it)."""
  r = study.from_json(r)
  source = study.head_source(r["head"])
  layers = len(r["tuned"])
  by_layer = lambda v: ", ".join(f"{x:.2f}" for x in v)
  measured = (
    f"{s['model']}, read by {source}; the lens trained {s['steps']} steps (lr_scale "
    f"{s.get('lr_scale', 1.0):g}) on {r['train_tokens']:,} WikiText-2 validation tokens; "
    "KL(final || lens) in nats on "
    f"{r['tokens']:,} held-out test tokens, layers 0-{layers - 1} (0 the embeddings): tuned "
    f"{by_layer(r['tuned'])}; logit {by_layer(r['logit'])}. Differs from the paper: decoders "
    "with next-token heads, lenses trained on 2^18 tokens a step at lr_scale 1; here a "
    "masked-LM head read at every token of unmasked text, and at most 256 tokens a step."
  )
  return [LENS.row(measured, {CLOSER: closer(r["tuned"], r["logit"])})]


# How sure each row is ------------------------------------------------------------------------


def uncertainty(r: dict, s: dict) -> list[claims.Judgement]:
  """Held-out KL by layer per batch of windows, over resampled batches (each weighted by its
  tokens): the share of layers where the tuned lens is closer, and the smallest logit - tuned
  gap over the layers."""
  per = r["per_batch"]
  n = np.asarray(per["tokens"], float)
  items = (n, np.asarray(per["tuned"], float), np.asarray(per["logit"], float))

  def kl(n, tuned, logit):  # (R, batches, layers): token-weighted KL per layer, each lens
    w = n[..., None] / n.sum(1)[:, None, None]
    t, g = (tuned * w).sum(1), (logit * w).sum(1)
    return {CLOSER: (t < g).mean(-1), GAP: (g - t).min(-1)}

  shown = {CLOSER: "{:.2f}", GAP: "{:.2f}"}
  over = f"the {len(n)} held-out batches"
  return [
    LENS.judge(items, kl, point={CLOSER: closer(r["tuned"], r["logit"])}, over=over, shown=shown)
  ]


if __name__ == "__main__":
  sys.exit(main())
