"""The Findings rules of `experiments/outlier_dimensions.py` (Outlier dimensions, massive
activations and what they cost: a census by layer): the claims, the measured quantities and
their thresholds, and `findings(results, settings)`, the rows from a results JSON."""

from __future__ import annotations

from collections.abc import Sequence

import common
import numpy as np

from bertjax import claims, stats
from bertjax.claims import Claim, Test

MARGIN = "the outliers' cost minus the worst random draw's (points)"
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


def masked_lm(m: dict | None, dims: bool) -> str:
  """The masked-LM loss sentence of the ablation row (`m`: the results' "mlm")."""
  if m is None:
    return "The paper's MLM loss is not measured: the checkpoint ships no MLM head."
  loss, head = m["loss"], m["head"]
  randoms = [v for k, v in loss.items() if k.startswith("random")]
  source = common.head_source(head)
  return (
    f"Masked-LM loss on {m['predictions']:,} held-out WikiText-2 test predictions ({source}): "
    f"intact {loss['intact']:.2f} nats"
    + (f", outliers disabled {loss['outliers']:.2f}" if dims else "")
    + (f", random draws {min(randoms):.2f}-{max(randoms):.2f}" if randoms else "")
    + "."
  )


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
    f"{probe}. {masked_lm(r.get('mlm'), bool(dims))}"
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


# How sure each row is ------------------------------------------------------------------------


def uncertainty(r: dict, s: dict) -> list[claims.Judgement]:
  """Held-out words (the probe's right or wrong, paired across conditions); token types (the
  frequency correlations); the census and the int8 errors are exact counts."""
  exact = claims.note("exact: counted over every token read, nothing sampled")
  if not r["dims"]:
    return [exact, claims.note("n/a: no outlier dimensions"), exact, exact]
  names = list(r["probe"]["correct"])
  right = np.stack([np.asarray(r["probe"]["correct"][k], float)[-1] for k in names], 1)

  def drops(x):  # (R, words, conditions) -> (R, conditions - 1): each disabled set's cost
    acc = x.mean(1)
    return acc[:, :1] - acc[:, 1:]

  def verdict(x):  # one resample (words, conditions)
    cost = x[:, 0].mean() - x[:, 1:].mean(0)
    return ABLATION.verdict({MARGIN: ablation_margin(cost[0], cost[1:].tolist())})

  lo, hi = stats.bootstrap_ci(right, drops, n_resamples=claims.RESAMPLES, vectorized=True)
  ablation = claims.span_of(right, verdict)
  first = claims.note(
    f"95% CI over the {len(right):,} held-out words: drop with the outliers "
    f"disabled [{100 * lo[0]:.1f}, {100 * hi[0]:.1f}] points; worst random "
    f"draw up to {100 * hi[1:].max():.1f}",
    ablation,
  )
  f = r["frequency"]
  per_type, log_count = np.asarray(f["per_type"], float), np.asarray(f["log_count"], float)
  mean_rho = lambda p, c: float(np.mean([stats.spearman(p[:, j], c) for j in range(p.shape[1])]))
  lo_r, hi_r = stats.bootstrap_ci(
    (per_type, log_count), mean_rho, n_resamples=claims.RESAMPLES // 4
  )
  sinks = r["sink_share"]
  second = claims.note(
    f"95% CI over the {len(log_count):,} token types ({claims.RESAMPLES // 4} resamples): mean "
    f"Spearman [{lo_r:.2f}, {hi_r:.2f}]; the attention masses are exact",
    tuple(
      FREQUENCY.verdict({RHO: v, SINK_FALL: sinks["intact"] - sinks["disabled"]})
      for v in (lo_r, hi_r)
    ),
  )
  return [
    first,
    second,
    exact,
    claims.note(
      f"exact: every token's error; the Spearman is over {len(r['int8']['max_abs'])} layers"
    ),
  ]
