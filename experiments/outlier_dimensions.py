"""Outlier dimensions, massive activations and what they cost: a census by layer.

Run:
  ./run.sh experiment outlier_dimensions
  .venv/bin/python -m experiments.outlier_dimensions [--smoke] [--model DIR_OR_HUB_ID]

The method, the data and what differs from the paper: docs/experiments.md, section
`outlier_dimensions` (the site's Experiments page).
"""

from __future__ import annotations

import pathlib
import sys
import time
from collections.abc import Sequence

import numpy as np

from bertjax import claims, stats, study
from bertjax.analysis.attention import statistics
from bertjax.analysis.representations import outliers
from bertjax.claims import Claim, Test
from bertjax.data import conllu
from bertjax.plots import outliers as plots
from bertjax.tasks import text_batches
from experiments import common

NAME = "outlier_dimensions"
MLM_TEST_WINDOWS = 256  # held-out WikiText-2 test windows the masked-LM loss is taken on


def parse_args(argv: Sequence[str] | None = None):
  p = common.parser(__doc__)
  opt = lambda flag, default, text: p.add_argument(flag, type=int, default=default, help=text)
  opt("--sentences", 1000, "EWT dev sentences read (default: 1000; --smoke: 60)")
  opt(
    "--random-draws", 5, "draws of as many random dimensions, the ablation's control (default: 5)"
  )
  opt("--batch-size", 32, "sentences per batch (default: 32)")
  opt(
    "--mlm-windows",
    3000,
    "128-token WikiText-2 validation windows an MLM head is fitted on when the "
    "checkpoint has none, an eighth of them held out to stop on (default: 3000, every one of "
    f"the 2,876; --smoke: 16); the loss is taken on {MLM_TEST_WINDOWS} test windows",
  )
  opt(
    "--mlm-steps",
    600,
    "optimiser steps of that fit, 512 predictions each (default: 600; --smoke: 20)",
  )
  args = p.parse_args(argv)
  for name in ("sentences", "random_draws", "batch_size", "mlm_windows", "mlm_steps"):
    if getattr(args, name) < 1:
      raise study.UsageError(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
  if args.smoke:
    args.sentences, args.random_draws = min(args.sentences, 60), min(args.random_draws, 2)
    args.mlm_windows, args.mlm_steps = min(args.mlm_windows, 16), min(args.mlm_steps, 20)
  return args


def masked_lm(args, params, config, tok, data: pathlib.Path, dims_sets, timings) -> dict:
  """The masked-LM loss on held-out WikiText-2 test windows, intact and with each set of
  dimensions disabled, read by the checkpoint's MLM head or one fitted to the frozen body
  (`study.with_mlm_head`)."""
  params, head = study.with_mlm_head(
    args, params, config, tok, data, timings, windows=args.mlm_windows, steps=args.mlm_steps
  )
  count = 4 if args.smoke else MLM_TEST_WINDOWS
  test = study.wikitext_windows(tok, config, data, "test", count, args.batch_size)
  with study.timed(timings, "MLM loss"):
    masked = study.masked_windows(tok, config, test, args.seed + 1)
    r = outliers.mlm_loss_without_dimensions(params, config, masked, dims_sets)
  losses = ", ".join(f"{k} {v:.3f}" for k, v in r["loss"].items())
  study.log(f"masked-LM loss (head {head['source']}): {losses}")
  return {**r, "head": head}


@study.one_blas_thread
def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  t_start = time.perf_counter()
  timings: dict[str, float] = {}
  data = study.data_dir(args.data_dir, "ud_english_ewt", "wikitext2_tokens")
  path = study.ud_file(data, "dev")
  with study.timed(timings, "load model"):
    config, params, tok, model_name = study.load_model(args)
  ud = conllu.read_conllu(path, max_sentences=args.sentences)
  keep = text_batches.fitting(tok, [s.forms for s in ud], min(config.max_length, 128))
  sentences = [ud[i] for i in keep]  # those read whole
  batches = [
    tok.encode_words([s.forms for s in sentences[i : i + args.batch_size]])
    for i in range(0, len(sentences), args.batch_size)
  ]
  study.log(f"{model_name}: {len(sentences)} sentences of {path.name}")
  with study.timed(timings, "census"):
    census = outliers.outlier_dimensions(params, config, batches)
  r: dict = census.summary()
  dims = r["dims"]
  study.log(f"outlier dimensions {dims}; per layer {r['outliers_per_layer'].tolist()}")
  with study.timed(timings, "massive activations"):
    r["massive"] = outliers.massive_activations(params, config, batches).summary()
  with study.timed(timings, "int8 error"):
    r["int8"] = outliers.int8_error_by_layer(params, config, batches)
  dims_sets = outliers.ablation_sets(dims, config.hidden_size, args.random_draws, args.seed)
  with study.timed(timings, "probe ablation"):
    r["probe"] = outliers.probe_without_dimensions(
      params, config, tok, sentences, dims_sets, args.seed
    )
  r["random_dims"] = {k: v for k, v in dims_sets.items() if k != "outliers"}
  r["mlm"] = masked_lm(args, params, config, tok, data, dims_sets, timings)
  with study.timed(timings, "frequency and sinks"):
    texts = [data / "wikitext2_tokens" / f for f in ("valid.txt", "test.txt")]
    counts = outliers.token_frequencies(tok, texts)
    r["frequency"] = {"rho": [], "types": 0}
    if dims:
      acts, ids = outliers.dimension_activations(params, config, batches, dims, tok.special_ids)
      r["frequency"] = outliers.frequency_correlation(acts, ids, counts, census, dims)
    mass = lambda p: statistics.special_mass_by_layer(p, config, batches, tok.sep_id).mean()
    r["sink_share"] = outliers.with_and_without(params, config, dims, mass)
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
  png = pathlib.Path(args.out) / f"{study.results_stem(NAME, args.model)}_census.png"
  figures = [plots.outlier_census(r, png, title=f"Outlier dimensions: {model_name}").name]
  study.finish(NAME, args, r, settings, findings=findings, started=t_start, figures=figures)
  return 0


# The claims ---------------------------------------------------------------------------------------
# `findings(results, settings)`: the Findings rows, made from the numbers as the JSON holds
# them; `uncertainty(results, settings)`: each claim's interval and verdict.

MARGIN = "the outliers' cost minus the worst random draw's (points)"
DROP, WORST = "the drop with the outliers disabled", "the worst random draw's"
RHO = "the mean Spearman with log frequency"
SINK_FALL = "the fall in special-token attention without them"
MASSIVE_SHARE = "the share of layers with massive activations"
INT8_RHO = "the Spearman of int8 error and largest magnitude over layers"
ABLATION = Claim(
  "Kovaleva et al. 2021",
  "A few LayerNorm output dimensions are outliers in most layers; disabling them (their "
  "LayerNorm scale and bias zero) degrades the model far more than disabling as many random "
  "dimensions.",
  yes=(Test(MARGIN, ">=", 5),),
  partly=(Test(MARGIN, ">", 0),),
  missing="no",
  missing_when="there are no outlier dimensions",
  short="A few LayerNorm dimensions are outliers in most layers; disabling them hurts far more than random ones.",
)
FREQUENCY = Claim(
  "Puccetti et al. 2022",
  "Outlier dimensions are driven by token frequency (frequent tokens activate them most) and "
  "they drive the attention heads' focus on special tokens.",
  yes=(Test(RHO, ">=", 0.3), Test(SINK_FALL, ">", 0)),
  missing="n/a",
  missing_when="there are no outlier dimensions",
  short="Token frequency drives outlier dimensions, and they drive the heads' focus on special tokens.",
)
MASSIVE = Claim(
  "Sun et al. 2024",
  "A few activations are massive (> 100 and > 1000x the median magnitude), at fixed "
  "dimensions, in most layers.",
  yes=(Test(MASSIVE_SHARE, ">=", 0.5),),
  partly=(Test(MASSIVE_SHARE, ">", 0),),
)
INT8 = Claim(
  "Bondarenko et al. 2021",
  "Outlier activations are what makes transformer activations hard to quantise: the int8 "
  "error is largest where activations are largest.",
  yes=(Test(INT8_RHO, ">=", 0.5),),
  partly=(Test(INT8_RHO, ">=", 0.2),),
)


def ablation_margin(drop: float, random_drops: Sequence[float]) -> float:
  """Points of accuracy the outliers cost beyond the worst of the random draws."""
  return 100 * (drop - max(random_drops, default=0.0))


def _mlm_sentence(m: dict | None, dims: bool) -> str:
  """The masked-LM loss sentence of the ablation row (`m`: the results' "mlm")."""
  if m is None:
    return "The paper's MLM loss is not measured: the checkpoint ships no MLM head."
  loss = m["loss"]
  randoms = [v for k, v in loss.items() if k.startswith("random")]
  return (
    f"Masked-LM loss on {m['predictions']:,} held-out WikiText-2 test predictions "
    f"({study.head_source(m['head'])}): intact {loss['intact']:.2f} nats"
    + (f", outliers disabled {loss['outliers']:.2f}" if dims else "")
    + (f", random draws {min(randoms):.2f}-{max(randoms):.2f}" if randoms else "")
    + "."
  )


def findings(r: dict, s: dict) -> list[dict]:
  """The four rows, from the results and settings as written to JSON (`python -m
  experiments.findings --refresh` recomputes them)."""
  r = study.from_json(r)
  dims, per_layer, layers = r["dims"], r["outliers_per_layer"], len(r["outliers_per_layer"])
  acc = {k: v[-1] for k, v in r["probe"]["accuracy"].items()}  # at the last probed layer
  randoms = [v for k, v in acc.items() if k.startswith("random")]
  dim_text = ", ".join(f"{d} (|z| up to {z:.1f})" for d, z in zip(dims, r["max_abs_z"])) or "none"
  probe = (
    f"UPOS probe on layer {r['probe']['layers'][-1]} (fitted on the intact model, "
    f"{r['probe']['test_words']:,} held-out words): intact {100 * acc['intact']:.1f}%"
  )
  if dims:
    probe += (
      f", outliers disabled {100 * acc['outliers']:.1f}%, {len(randoms)} draws of as many "
      f"random dimensions {100 * min(randoms):.1f}-{100 * max(randoms):.1f}%"
    )
  freq, sinks, massive, q = r["frequency"], r["sink_share"], r["massive"], r["int8"]
  mean_rho = float(np.mean(freq["rho"])) if dims else None
  census = (
    f"{s['model']}, {s['tokens']:,} EWT tokens: outlier dimensions per layer 1-{layers}: "
    f"{', '.join(map(str, per_layer))}; the model's (in >= 25% of layers): {dim_text}. "
    f"{probe}. {_mlm_sentence(r.get('mlm'), bool(dims))}"
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
  largest = ", ".join(f"{m:.0f}" for m in q["max_abs"])
  int8 = (
    "dynamic int8 (per-token activations, per-channel weights) block-output error by layer: "
    + ", ".join(f"{100 * e:.1f}%" for e in q["relative_error"])
    + f"; largest magnitude: {largest}; Spearman over layers {q['spearman']:.2f}. Differs from "
    "the paper: per-tensor static int8 there; the error here accumulates over the layers below."
  )
  drops = [acc["intact"] - v for k, v in acc.items() if k != "intact"]  # outliers', then draws'
  margin = ablation_margin(drops[0], drops[1:]) if dims else None
  sink_fall = sinks["intact"] - sinks["disabled"] if dims else None
  return [
    ABLATION.row(census, {MARGIN: margin}),
    FREQUENCY.row(frequency, {RHO: mean_rho, SINK_FALL: sink_fall}),
    MASSIVE.row(massive_text, {MASSIVE_SHARE: float(np.mean(np.asarray(massive["count"]) > 0))}),
    INT8.row(int8, {INT8_RHO: q["spearman"]}),
  ]


# How sure each row is ------------------------------------------------------------------------
def uncertainty(r: dict, s: dict) -> list[claims.Judgement]:
  """Held-out words (right or wrong, paired across conditions); token types; the rest exact."""
  exact = claims.note("exact: counted over every token read, nothing sampled")
  if not r["dims"]:
    return [exact, claims.note("n/a: no outlier dimensions"), exact, exact]
  rows = findings(r, s)
  # (words, conditions): each held-out word right (1) or not at the last layer, "intact" first
  right = np.stack([np.asarray(v, float)[-1] for v in r["probe"]["correct"].values()], 1)

  def margins(x):  # (R, words, conditions) -> the row's margin, the drops it compares
    cost = outliers.ablation_costs(x)
    worst = cost[..., 1:].max(-1) if cost.shape[-1] > 1 else np.zeros(cost.shape[:-1])
    return {MARGIN: 100 * (cost[..., 0] - worst), DROP: 100 * cost[..., 0], WORST: 100 * worst}

  point = {MARGIN: rows[0]["value"]["value"]}
  shown = {MARGIN: "{:.1f}", DROP: "{:.1f}", WORST: "{:.1f}"}
  over = f"the {len(right):,} held-out words"
  first = ABLATION.judge(right, margins, point=point, over=over, shown=shown)
  f, fall = r["frequency"], r["sink_share"]["intact"] - r["sink_share"]["disabled"]
  by_type = np.asarray(f["per_type"], float), np.asarray(f["log_count"], float)
  rho = outliers.mean_frequency_correlation  # vectorised over resamples
  n = claims.RESAMPLES // 4
  lo, hi = stats.bootstrap_ci(by_type, rho, n_resamples=n, vectorized=True)
  types = f"the {len(f['log_count']):,} token types ({n} resamples; the attention masses exact)"
  point = {RHO: rows[1]["value"]["value"], SINK_FALL: fall}
  second = FREQUENCY.at_ends(point, {RHO: lo}, {RHO: hi}, over=types, shown={RHO: "{:.2f}"})
  layers = len(r["int8"]["max_abs"])
  int8 = claims.note(f"exact: every token's error; the Spearman is over {layers} layers")
  return [first, second, exact, int8]


if __name__ == "__main__":
  sys.exit(main())
