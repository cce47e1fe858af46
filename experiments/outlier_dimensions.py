"""Outlier dimensions, massive activations and what they cost: a census by layer.

Run:
  ./run.sh experiment outlier_dimensions
  .venv/bin/python experiments/outlier_dimensions.py [--smoke] [--model DIR_OR_HUB_ID]

The method, the data and what differs from the paper: docs/experiments.md, section
`outlier_dimensions` (the site's Experiments page).
"""

from __future__ import annotations

import pathlib
import sys
import time
from collections.abc import Sequence

import common
import numpy as np

NAME = "outlier_dimensions"
PROBE_LAYERS = ("middle", "last")
MLM_TEST_WINDOWS = 256  # held-out WikiText-2 test windows the masked-LM loss is taken on


def parse_args(argv: Sequence[str] | None = None):
  p = common.parser(__doc__)
  p.add_argument(
    "--sentences",
    type=int,
    default=1000,
    help="EWT dev sentences read (default: 1000; --smoke: 60)",
  )
  p.add_argument(
    "--random-draws",
    type=int,
    default=5,
    help="draws of as many random dimensions, the ablation's control (default: 5)",
  )
  p.add_argument("--batch-size", type=int, default=32, help="sentences per batch (default: 32)")
  p.add_argument(
    "--mlm-windows",
    type=int,
    default=3000,
    help="128-token WikiText-2 validation windows an MLM head is fitted on when the "
    "checkpoint has none, an eighth of them held out to stop on (default: 3000, every one of "
    f"the 2,876; --smoke: 16); the loss is taken on {MLM_TEST_WINDOWS} test windows",
  )
  p.add_argument(
    "--mlm-steps",
    type=int,
    default=600,
    help="optimiser steps of that fit, 512 predictions each (default: 600; --smoke: 20)",
  )
  args = p.parse_args(argv)
  for name in ("sentences", "random_draws", "batch_size", "mlm_windows", "mlm_steps"):
    if getattr(args, name) < 1:
      raise common.UsageError(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
  if args.smoke:
    args.sentences, args.random_draws = min(args.sentences, 60), min(args.random_draws, 2)
    args.mlm_windows, args.mlm_steps = min(args.mlm_windows, 16), min(args.mlm_steps, 20)
  return args


def masked_lm(args, params, config, tok, data: pathlib.Path, dims_sets, timings) -> dict:
  """The masked-LM loss on held-out WikiText-2 test windows, intact and with each set of
  dimensions disabled, read by the checkpoint's MLM head or one fitted to the frozen body
  (`common.with_mlm_head`)."""
  from bertjax.analysis.representations import outliers

  params, head = common.with_mlm_head(
    args, params, config, tok, data, timings, windows=args.mlm_windows, steps=args.mlm_steps
  )
  count = 4 if args.smoke else MLM_TEST_WINDOWS
  test = common.wikitext_windows(tok, config, data, "test", count, args.batch_size)
  with common.timed(timings, "MLM loss"):
    r = outliers.mlm_loss_without_dimensions(
      params, config, common.masked_windows(tok, config, test, args.seed + 1), dims_sets
    )
  common.log(
    f"masked-LM loss (head {head['source']}): "
    + ", ".join(f"{k} {v:.3f}" for k, v in r["loss"].items())
  )
  return {**r, "head": head}


@common.one_blas_thread
def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  t_start = time.perf_counter()
  timings: dict[str, float] = {}
  from bertjax.analysis.attention import statistics
  from bertjax.analysis.representations import outliers
  from bertjax.data import conllu
  from bertjax.tasks import text_batches

  data = common.data_dir(args.data_dir, "ud_english_ewt", "wikitext2_tokens")
  path = common.ud_file(data, "dev")
  with common.timed(timings, "load model"):
    config, params, tok, model_name = common.load_model(args)
  sentences = conllu.read_conllu(path, max_sentences=args.sentences)
  sentences = [
    sentences[i]
    for i in text_batches.fitting(tok, [s.forms for s in sentences], min(config.max_length, 128))
  ]
  batches = [
    tok.encode_words([s.forms for s in sentences[i : i + args.batch_size]])
    for i in range(0, len(sentences), args.batch_size)
  ]
  common.log(f"{model_name}: {len(sentences)} sentences of {path.name}")
  r: dict = {}
  with common.timed(timings, "census"):
    census = outliers.outlier_dimensions(params, config, batches)
  dims = list(census.dims)
  r.update(
    z=census.z,
    outliers_per_layer=census.is_outlier.sum(1),
    dims=dims,
    max_abs_z=[float(np.abs(census.z[:, d]).max()) for d in dims],
  )
  common.log(f"outlier dimensions {dims}; per layer {r['outliers_per_layer'].tolist()}")
  with common.timed(timings, "massive activations"):
    m = outliers.massive_activations(params, config, batches)
  r["massive"] = {
    "count": m.count,
    "max_abs": m.max_abs,
    "median_abs": m.median_abs,
    "dims": sorted({w[0] for layer in m.where for w in layer}),
    "where": m.where,
  }
  with common.timed(timings, "int8 error"):
    r["int8"] = outliers.int8_error_by_layer(params, config, batches)
  rng = np.random.default_rng(args.seed)
  others = np.setdiff1d(np.arange(config.hidden_size), dims)
  dims_sets = (
    {"outliers": dims}
    | {
      f"random_{i}": rng.choice(others, len(dims), replace=False) for i in range(args.random_draws)
    }
    if dims
    else {}
  )
  with common.timed(timings, "probe ablation"):
    r["probe"] = outliers.probe_without_dimensions(
      params, config, tok, sentences, dims_sets, args.seed
    )
  r["probe"]["test_words"] = int(r["probe"]["correct"]["intact"].shape[-1])
  r["random_dims"] = {k: v for k, v in dims_sets.items() if k != "outliers"}
  r["mlm"] = masked_lm(args, params, config, tok, data, dims_sets, timings)
  sinks = lambda p: statistics.special_mass_by_layer(p, config, batches, tok.sep_id)
  with common.timed(timings, "frequency and sinks"):
    texts = [data / "wikitext2_tokens" / f for f in ("valid.txt", "test.txt")]
    counts = outliers.token_frequencies(tok, texts)
    if dims:
      acts, ids = outliers.dimension_activations(params, config, batches, dims, tok.special_ids)
      r["frequency"] = outliers.frequency_correlation(acts, ids, counts, census, dims)
      off = outliers.disable_dimensions(params, config, dims)
      r["sink_share"] = {
        "intact": float(sinks(params).mean()),
        "disabled": float(sinks(off).mean()),
      }
    else:
      r["frequency"] = {"rho": [], "types": 0}
      r["sink_share"] = {
        "intact": float(sinks(params).mean()),
        "disabled": float("nan"),
      }
  r["timings"] = timings
  settings = {
    "model": model_name,
    "data": f"{path.relative_to(data)} ({len(sentences)} "
    "sentences); wikitext2_tokens/valid.txt + test.txt (token counts)",
    "sentences": len(sentences),
    "tokens": census.tokens,
    "seed": args.seed,
    "random_draws": args.random_draws,
    "sigmas": 3.0,
    "min_fraction": 0.25,
    "indexing": "layers 1..L are the block outputs; dimensions count from 0",
  }
  from bertjax.plots import outliers as plots

  stem = common.results_stem(NAME, args.model)
  path = pathlib.Path(args.out) / f"{stem}_census.png"
  figures = [plots.outlier_census(r, path, title=f"Outlier dimensions: {model_name}").name]
  common.finish(NAME, args, r, settings, started=t_start, figures=figures)
  return 0


if __name__ == "__main__":
  sys.exit(main())
