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
from findings import Rule, Test

NAME = "outlier_dimensions"
PROBE_LAYERS = ("middle", "last")


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
  args = p.parse_args(argv)
  for name in ("sentences", "random_draws", "batch_size"):
    if getattr(args, name) < 1:
      raise common.UsageError(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
  if args.smoke:
    args.sentences, args.random_draws = min(args.sentences, 60), min(args.random_draws, 2)
  return args


MARGIN = "the outliers' cost minus the worst random draw's (points)"
RHO = "the mean Spearman with log frequency"
SINK_FALL = "the fall in special-token attention without them"
MASSIVE_SHARE = "the share of layers with massive activations"
INT8_RHO = "the Spearman of int8 error and largest magnitude over layers"
ABLATION = Rule(
  "Kovaleva et al. 2021",
  "A few LayerNorm output dimensions are outliers in most layers; disabling them (their "
  "LayerNorm scale and bias zero) degrades the model far more than disabling as many random "
  "dimensions.",
  yes=(Test(MARGIN, ">=", 5),),
  partly=(Test(MARGIN, ">", 0),),
  missing="no",
  missing_when="there are no outlier dimensions",
)
FREQUENCY = Rule(
  "Puccetti et al. 2022",
  "Outlier dimensions are driven by token frequency (frequent tokens activate them most) and "
  "they drive the attention heads' focus on special tokens.",
  yes=(Test(RHO, ">=", 0.3), Test(SINK_FALL, ">", 0)),
  missing="n/a",
  missing_when="there are no outlier dimensions",
)
MASSIVE = Rule(
  "Sun et al. 2024",
  "A few activations are massive (> 100 and > 1000x the median magnitude), at fixed "
  "dimensions, in most layers.",
  yes=(Test(MASSIVE_SHARE, ">=", 0.5),),
  partly=(Test(MASSIVE_SHARE, ">", 0),),
)
INT8 = Rule(
  "Bondarenko et al. 2021",
  "Outlier activations are what makes transformer activations hard to quantise: the int8 "
  "error is largest where activations are largest.",
  yes=(Test(INT8_RHO, ">=", 0.5),),
  partly=(Test(INT8_RHO, ">=", 0.2),),
)


def ablation_margin(drop: float, random_drops: Sequence[float]) -> float:
  """Points of accuracy the outliers cost beyond the worst of the random draws."""
  return 100 * (drop - max(random_drops, default=0.0))


def findings(r: dict, s: dict) -> list[dict]:
  """The four rows, from the results and settings as written to JSON (`findings.py --refresh`)."""
  r = common.from_json(r)
  dims, per_layer = r["dims"], r["outliers_per_layer"]
  acc, last = r["probe"]["accuracy"], -1
  randoms = [k for k in acc if k.startswith("random")]
  drop = acc["intact"][last] - acc["outliers"][last] if dims else 0.0
  random_drops = [acc["intact"][last] - acc[k][last] for k in randoms]
  model, layers = s["model"], len(per_layer)
  dim_text = ", ".join(f"{d} (|z| up to {z:.1f})" for d, z in zip(dims, r["max_abs_z"])) or "none"
  probe = (
    f"UPOS probe on layer {r['probe']['layers'][last]} (fitted on the intact model, "
    f"{r['probe']['test_words']:,} held-out words): intact {100 * acc['intact'][last]:.1f}%"
    + (f", outliers disabled {100 * acc['outliers'][last]:.1f}%" if dims else "")
    + (
      f", {len(randoms)} draws of as many random dimensions "
      f"{100 * min(acc[k][last] for k in randoms):.1f}-"
      f"{100 * max(acc[k][last] for k in randoms):.1f}%"
      if dims
      else ""
    )
  )
  freq, sinks, massive, q = r["frequency"], r["sink_share"], r["massive"], r["int8"]
  mean_rho = float(np.mean(freq["rho"])) if dims else float("nan")
  census = (
    f"{model}, {s['tokens']:,} EWT tokens: outlier dimensions per layer 1-{layers}: "
    f"{', '.join(map(str, per_layer))}; the model's (in >= 25% of layers): {dim_text}. "
    f"{probe}. The paper's MLM loss is not measured: the checkpoint ships no MLM head."
  )
  frequency = (
    f"Spearman over {freq['types']:,} token types between the activation in each outlier "
    f"dimension and log WikiText-2 frequency: "
    + ", ".join(f"{d}: {v:.2f}" for d, v in zip(dims, freq["rho"]))
    + f" (mean {mean_rho:.2f}); attention on [CLS]+[SEP] (mean over heads and layers) "
    f"{sinks['intact']:.3f} intact, {sinks['disabled']:.3f} with them disabled. "
    if dims
    else "no outlier dimensions to correlate. "
  ) + "Differs from the paper: WikiText-2 counts stand in for the pre-training corpus."
  massive_text = (
    f"massive entries per layer 1-{layers}: {', '.join(map(str, massive['count']))}; largest "
    f"magnitude / median by layer: "
    + ", ".join(f"{a / m:.0f}x" for a, m in zip(massive["max_abs"], massive["median_abs"]))
    + f"; dimensions holding them: {massive['dims'] or 'none'}. Differs from the paper: "
    "measured on LLMs (LLaMA2, Mixtral), here an encoder."
  )
  int8 = (
    "dynamic int8 (per-token activations, per-channel weights) block-output error by layer: "
    + ", ".join(f"{100 * e:.1f}%" for e in q["relative_error"])
    + "; largest magnitude: "
    + ", ".join(f"{m:.0f}" for m in q["max_abs"])
    + f"; Spearman over layers {q['spearman']:.2f}. Differs from the paper: per-tensor "
    "static int8 there; the error here accumulates over the layers below."
  )
  sink_fall = sinks["intact"] - sinks["disabled"] if dims else None
  return [
    ABLATION.row(census, {MARGIN: ablation_margin(drop, random_drops) if dims else None}),
    FREQUENCY.row(frequency, {RHO: mean_rho if dims else None, SINK_FALL: sink_fall}),
    MASSIVE.row(massive_text, {MASSIVE_SHARE: float(np.mean(np.asarray(massive["count"]) > 0))}),
    INT8.row(int8, {INT8_RHO: q["spearman"]}),
  ]


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
  common.write_results(
    NAME,
    args.out,
    r,
    findings=findings,
    settings=settings,
    smoke=args.smoke,
    seconds=time.perf_counter() - t_start,
    figures=figures,
    model=args.model,
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
