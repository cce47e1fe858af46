"""The Findings rules of `experiments/dark_secrets.py` (Revealing the Dark Secrets of BERT
(Kovaleva et al. 2019) on a fine-tuned all-MiniLM-L6-v2): the claims, the measured quantities
and their thresholds, and `findings(results, settings)`, the rows from a results JSON."""

from __future__ import annotations

import numpy as np

from bertjax import claims
from bertjax.claims import Claim, Test

PAPER = "Kovaleva et al. 2019"


LAST_FRACTION = 1 / 3  # "the last layers": the top third of the stack (layers 4-5 of 6)


FEWEST, MOST = "the lower of the two models' repeated-type shares", "the higher"
VERTICAL = "the models whose commonest repeated type is vertical"
HEADS, LAYERS = "the heads that improve when disabled", "the layers"
OVER_SE = "the best gain minus one standard error"
LAST_LOWEST = "the least-similar layer lies in the last third (1 or 0)"
LAST_GAP = "the last third's mean cosine minus the rest's"
PATTERNS = Claim(
  PAPER,
  "Attention maps fall into a few repeated types (vertical, diagonal, both, block); "
  "vertical is the commonest.",
  yes=(Test(FEWEST, ">=", 0.5), Test(VERTICAL, ">=", 2)),
  partly=(Test(MOST, ">=", 0.25),),
  partly_if="all",
)
DISABLING = Claim(
  PAPER,
  "Disabling some single heads or whole layers improves the fine-tuned model.",
  yes=(Test(HEADS, ">", 0), Test(LAYERS, ">", 0), Test(OVER_SE, ">", 0)),
  partly=(Test(HEADS, ">", 0), Test(LAYERS, ">", 0)),
)
CHANGE = Claim(
  PAPER,
  "Fine-tuning changes the attention of the last layers most.",
  yes=(Test(LAST_LOWEST, ">=", 1), Test(LAST_GAP, "<", 0)),
)


def pattern_quantities(before: dict, after: dict) -> dict[str, float]:
  """What `PATTERNS` reads from the two models' `PatternCounts.summary`."""
  shares = [p["repeated_share"] for p in (before, after)]
  vertical = sum(p["commonest_repeated"] == "vertical" for p in (before, after))
  return {FEWEST: min(shares), MOST: max(shares), VERTICAL: vertical}


def disabling_quantities(acc: dict, standard_error: float) -> dict[str, float]:
  """What `DISABLING` reads from one mode's `AblationResult.improvements`."""
  best = max(acc["best_head_delta"], acc["best_layer_delta"])
  return {
    HEADS: acc["heads_improving"],
    LAYERS: acc["layers_improving"],
    OVER_SE: best - standard_error,
  }


def change_quantities(layer_cosine) -> dict[str, float]:
  """What `CHANGE` reads from the mean cosine of each layer's maps before and after."""
  cos = np.asarray(layer_cosine, np.float64)
  k = max(1, round(len(cos) * LAST_FRACTION))
  return {
    LAST_LOWEST: float(int(np.argmin(cos)) >= len(cos) - k),
    LAST_GAP: float(cos[-k:].mean() - cos[:-k].mean()),
  }


def findings(r: dict, s: dict) -> list[dict]:
  """The Findings rows (pattern types, disabling heads and layers, what fine-tuning changes)
  from the results and settings as written to JSON."""
  before, after = r["patterns"]["before"], r["patterns"]["after"]
  change = r["attention_change"]
  layer_cos = np.asarray(change["layer_cosine"], np.float64)
  depth, heads = len(layer_cos), len(change["cosine"][0])
  k_last = max(1, round(depth * LAST_FRACTION))
  u, sc, se = (
    r["ablation"]["uniform"],
    r["ablation"]["scale"],
    r["ablation"]["accuracy_standard_error"],
  )
  pct = lambda x: f"{100 * x:.0f}%"
  return [
    PATTERNS.row(
      f"{s['model']} on BLiMP sentences: repeated types "
      f"{pct(before['repeated_share'])} of maps before fine-tuning, "
      f"{pct(after['repeated_share'])} after (vertical "
      f"{pct(before['overall'][0])} -> {pct(after['overall'][0])}; heterogeneous "
      f"{pct(before['overall'][4])} -> {pct(after['overall'][4])}); commonest repeated type "
      f"{before['commonest_repeated']} / {after['commonest_repeated']}; no block type with "
      "single sentences.",
      pattern_quantities(before, after),
    ),
    DISABLING.row(
      f"uniform mode: {u['heads_improving']}/{depth * heads} heads and {u['layers_improving']}/"
      f"{depth} layers beat the baseline accuracy {100 * u['baseline']:.1f}% (best "
      f"{100 * u['best_head_delta']:+.1f} / {100 * u['best_layer_delta']:+.1f} points; 1 SE = "
      f"{100 * se:.1f}, {r['task']['eval_sentences']} sentences); {sc['layers_improving']} "
      f"layers in scale mode, {u['layer_skips_improving']} skipped blocks.",
      disabling_quantities(u, se),
    ),
    CHANGE.row(
      "mean cosine of attention maps before/after by layer "
      + ", ".join(f"{c:.2f}" for c in layer_cos)
      + f" (last {k_last} layers {layer_cos[-k_last:].mean():.2f} vs "
      f"{layer_cos[:-k_last].mean():.2f}); hidden-state CKA, embeddings then layers, "
      + ", ".join(f"{c:.2f}" for c in change["cka"])
      + ".",
      change_quantities(layer_cos),
    ),
  ]


# How sure each row is ------------------------------------------------------------------------


def uncertainty(r: dict, s: dict) -> list[claims.Judgement]:
  """One judgement per row: 95% intervals over the analysed sentences for the pattern types
  (each sentence's maps of each type, before and after, resampled together) and for what
  fine-tuning changes (each sentence's cosine by layer); the disabling row's per-example
  correctness is not kept."""
  p, change = r["patterns"], r["attention_change"]
  over = lambda n: f"the {n} analysed sentences"
  patterns = claims.rerun_needed("per-sentence pattern types")
  if p["before"].get("per_sequence") is not None:
    types = np.stack([np.asarray(p[k]["per_sequence"], float) for k in ("before", "after")], 1)

    def shares(x):  # (R, n, 2, 5): each model's repeated share and commonest repeated type
      c = x.sum(1)
      share = c / c.sum(-1, keepdims=True)
      repeated = share[..., :4].sum(-1)
      vertical = (share[..., :4].argmax(-1) == 0).sum(-1)
      return {FEWEST: repeated.min(-1), MOST: repeated.max(-1), VERTICAL: vertical}

    shown = {FEWEST: "{:.2f}", MOST: "{:.2f}"}
    patterns = PATTERNS.judge(types, shares, over=over(len(types)), shown=shown)
  moved = claims.rerun_needed("per-sentence attention maps' cosines")
  if change.get("per_sentence_layer_cosine") is not None:
    cos = np.asarray(change["per_sentence_layer_cosine"], float)
    k = max(1, round(cos.shape[1] * LAST_FRACTION))

    def last(x):  # (R, n, L): where the least similar layer is, the last third's gap
      c = x.mean(1)
      return {
        LAST_LOWEST: (c.argmin(-1) >= c.shape[-1] - k).astype(float),
        LAST_GAP: c[:, -k:].mean(-1) - c[:, :-k].mean(-1),
      }

    moved = CHANGE.judge(cos, last, over=over(len(cos)), shown={LAST_GAP: "{:+.3f}"})
  return [patterns, claims.rerun_needed("per-sentence correctness under each mask"), moved]
