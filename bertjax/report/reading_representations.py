"""The readings of the representation sections: anisotropy (6), the part-of-speech probe (7),
outlier dimensions (11) and the sparse autoencoder (12).

Pure functions of each section's part of `report.json`, as every reading (`reading`): the
paper's finding, what this model measured, and the verdict under the rule the sentence states,
with its 95% interval (`intervals`).
"""

from __future__ import annotations

import numpy as np

from bertjax.report.intervals import RESAMPLES, at_ends, interval, levels, verdict


def upper_bound(x: float, digits: int = 2) -> str:
  """`x` printed as a bound that holds: rounded up, never down ("within 0.02" for 0.014,
  where rounding to the nearest would print a 0.01 the value exceeds)."""
  scale = 10**digits
  return f"{np.ceil(round(x * scale, 9)) / scale:.{digits}f}"


def _high_level(v):
  """Anisotropy's first rule on values by layer (..., L + 1): >= 0.1 in every block (2), in
  some (1), in none (0)."""
  high = (np.asarray(v)[..., 1:] >= 0.1).sum(-1)
  return levels(high == np.asarray(v).shape[-1] - 1, high > 0)


def anisotropy_sentences(an: dict, model: str) -> list[str]:
  """Section 6: Ethayarajh's anisotropy."""
  a = np.asarray(an["anisotropy"], float)
  blocks = a[1:]
  high = int((blocks >= 0.1).sum())
  ci = an.get("ci")
  over = f"the {ci['sentences']} sentences (each resample's all-pairs mean cosine)" if ci else ""
  high_ci = (
    at_ends(
      *ci["anisotropy"],
      _high_level,
      over=over,
      shown=[(f"layer {i}", i, "{:.2f}") for i in range(1, len(a))],
    )
    if ci
    else None
  )
  rise_ci = (
    at_ends(
      [ci["rise"][0]],
      [ci["rise"][1]],
      lambda v: levels(v[..., 0] > 0),
      over=over,
      shown=[("last minus layer 1", 0, "{:+.2f}")],
    )
    if ci
    else None
  )
  centred = float(np.max(np.abs(np.asarray(an["anisotropy_centered"], float)[1:])))
  first = (
    "Ethayarajh (2019) found contextual representations anisotropic: two random words have a "
    "mean cosine well above 0, and more so in upper layers. In "
    f"{model} the mean cosine of random token pairs is at least 0.1 in {high} of "
    f"{len(blocks)} layers (layer 1 {blocks[0]:.2f}, peak {blocks.max():.2f} at layer "
    f"{int(np.argmax(blocks)) + 1}, last {blocks[-1]:.2f}; embeddings {a[0]:.2f}). Rule: "
    "agrees if in every layer, partly if in some; so "
    f"{verdict(model, high == len(blocks), high > 0, high_ci)}."
  )
  rises = blocks[-1] > blocks[0]
  second = (
    f"Upper layers {'are' if rises else 'are not'} more anisotropic than layer 1 here "
    f"({blocks[-1]:.2f} vs {blocks[0]:.2f}; rule: agrees if the last layer exceeds the first, "
    f"so {verdict(model, rises, evidence=rise_ci)})"
    + (
      f"; the last layer falls well below the peak at layer {int(np.argmax(blocks)) + 1} "
      "(training the last layer further for another objective, such as sentence-embedding "
      "similarity, is one known cause; these numbers alone cannot tell)"
      if int(np.argmax(blocks)) < len(blocks) - 1 and blocks.max() > blocks[-1] + 0.05
      else ""
    )
    + f". After mean-centring every layer is within {upper_bound(centred)} of 0: the common "
    "direction (the mean vector) accounts for the anisotropy."
  )
  return [first, second]


def _probe_stats(rows, correct, control):
  """The POS rules' statistics from per-sentence counts ((..., S), (..., S, L + 1) twice): the
  best layer, and the selectivity (accuracy minus control accuracy) there."""
  total = np.asarray(rows, float).sum(-1)[..., None]
  acc, ctrl = np.asarray(correct, float).sum(-2) / total, np.asarray(control, float).sum(-2) / total
  best = np.argmax(acc, -1)
  sel = np.take_along_axis(acc - ctrl, best[..., None], -1)[..., 0]
  return np.stack([best, sel], -1)


def pos_sentences(pos: dict, model: str, resamples: int = RESAMPLES) -> list[str]:
  """Section 7: the UPOS probe."""
  if not pos.get("available"):
    return [
      (
        f"The POS probe did not run ({pos.get('reason', 'no UD data')}), so this report "
        "cannot compare the layer of part-of-speech information with Tenney et al.'s."
      )
    ]
  acc = np.asarray(pos["accuracy"], float)
  sel = np.asarray(pos["selectivity"], float)
  best = int(pos["best_layer"])
  blocks = len(acc) - 1
  half = max(1, (blocks + 1) // 2)
  low = 1 <= best <= half
  by = pos.get("test_by_sentence")
  items = (
    by
    and "control_correct" in by
    and (
      np.asarray(by["rows"], float),
      np.asarray(by["correct"], float).T,
      np.asarray(by["control_correct"], float).T,
    )
  )
  over = f"the {len(by['rows'])} held-out sentences" if items else ""
  in_lower_half = lambda v: levels((v[..., 0] >= 1) & (v[..., 0] <= half))
  layer_ci = (
    interval(
      items,
      _probe_stats,
      in_lower_half,
      over=over,
      shown=[("best layer", 0, "{:.0f}")],
      resamples=resamples,
    )
    if items
    else None
  )
  sel_ci = (
    interval(
      items,
      _probe_stats,
      lambda v: levels(v[..., 1] >= 0.2, v[..., 1] >= 0.05),
      over=over,
      shown=[("selectivity at the best layer", 1, "{:.3f}")],
      resamples=resamples,
    )
    if items
    else None
  )
  first = (
    "Tenney et al. (2019) and Liu et al. (2019) found part of speech best read from the "
    f"lower-middle layers. {model}'s UPOS probe is best at layer {best} of {blocks} "
    f"({acc[best]:.3f}; embeddings {acc[0]:.3f}, last {acc[-1]:.3f}). Rule: agrees if the "
    f"best layer is a block in the lower half (1-{half}); so "
    f"{verdict(model, low, evidence=layer_ci)}."
  )
  second = (
    "Hewitt & Liang (2019) ask that a probe be selective (much better on the task than on a "
    f"control task of random word-type tags): selectivity at the best layer is "
    f"{sel[best]:.3f} (rule: agrees if at least 0.2, partly if at least 0.05; so "
    f"{verdict(model, sel[best] >= 0.2, sel[best] >= 0.05, sel_ci)})."
  )
  return [first, second]


def outlier_sentences(o: dict, model: str, resamples: int = RESAMPLES) -> list[str]:
  """Section 11: outlier dimensions, the attention they draw, massive activations."""
  dims, hidden = list(o["dims"]), int(o["hidden_size"])
  per_layer = ", ".join(str(int(v)) for v in o["outliers_per_layer"])
  few = max(1, round(0.05 * hidden))  # "a few": at most 5% of the dimensions
  count_level = lambda v: levels((v[..., 0] >= 1) & (v[..., 0] <= few), v[..., 0] > few)
  ci = o.get("count_ci")
  count_ci = (
    at_ends(
      [ci[0]],
      [ci[1]],
      count_level,
      over=f"the text's sentences ({o['tokens']} tokens)",
      shown=[("outlier dimensions found", 0, "{:.0f}")],
    )
    if ci
    else None
  )
  first = (
    "Kovaleva et al. (2021) found a few dimensions of BERT's LayerNorm outputs (308 and 381 in "
    "BERT-base) far from the others in most layers. In "
    f"{model}, {len(dims)} of {hidden} dimensions lie >= 3 standard deviations from the "
    "layer's mean in at least 25% of the layers"
    + (f" ({', '.join(map(str, dims))})" if dims else "")
    + f"; by layer, {per_layer}. Rule: agrees if 1 to {few} (5% of the width), partly if more; "
    f"so {verdict(model, 1 <= len(dims) <= few, len(dims) > few, count_ci)}."
  )
  mass = o["special_mass"]
  if not dims:
    second = (
      "With no outlier dimension there is nothing to disable, so this report cannot "
      "test Puccetti et al.'s (2022) link between them and the attention on special "
      "tokens."
    )
  else:
    items = (np.asarray(mass["intact"], float), np.asarray(mass["disabled"], float))
    fall = lambda a, b: ((a.mean(-1) - b.mean(-1)) / a.mean(-1))[:, None]
    rel = float(fall(items[0][None], items[1][None])[0, 0])
    fall_ci = interval(
      items,
      fall,
      lambda v: levels(v[..., 0] >= 0.2, v[..., 0] > 0),
      over=f"the {len(items[0])} sentences",
      shown=[("relative fall", 0, "{:.2f}")],
      resamples=resamples,
    )
    second = (
      "Puccetti et al. (2022) found that outlier dimensions drive the attention heads' focus on "
      "special tokens. With their LayerNorm scale and bias set to zero, the mean attention on "
      f"the special tokens goes from {items[0].mean():.3f} to {items[1].mean():.3f} (a "
      f"relative fall of {rel:.2f}). Rule: agrees if it falls by at least a fifth, partly if "
      f"it falls; so {verdict(model, rel >= 0.2, rel > 0, fall_ci)}."
    )
  m = o["massive"]
  count = np.asarray(m["count"])
  ratio = np.asarray(m["max_abs"], float) / np.asarray(m["median_abs"], float)
  layers = int((count > 0).sum())
  by = m.get("by_sentence")
  share = lambda c: (c.sum(-2) > 0).mean(-1)[:, None]  # (R, S, L) -> (R, 1) layers with any
  massive_ci = (
    interval(
      np.asarray(by, float),
      share,
      lambda v: levels(v[..., 0] >= 0.5, v[..., 0] > 0),
      over=f"the {len(by)} sentences",
      resamples=resamples,
      shown=[("share of layers with any", 0, "{:.2f}")],
    )
    if by
    else None
  )
  third = (
    "Sun et al. (2024) found massive activations in LLMs: a few entries above 100 and 1000 "
    f"times the median magnitude, in most layers. {model} has them in {layers} of "
    f"{len(count)} layers (largest over median: {ratio.max():.0f}x, at layer "
    f"{int(ratio.argmax()) + 1}). Rule: agrees if in at least half the layers, partly if in "
    f"some; so {verdict(model, layers >= len(count) / 2, layers > 0, massive_ci)}."
  )
  return [first, second, third]


def sae_sentences(d: dict, model: str) -> list[str]:
  """Section 12: the sparse autoencoder's dead latents and reconstruction."""
  if not d.get("available"):
    return [
      (
        f"The sparse-autoencoder section did not run ({d.get('reason', '')}), so this report "
        "cannot compare its dead latents with Gao et al.'s."
      )
    ]
  dead = float(d["dead"])
  hi = max(float(d["dead_ci"][1]), dead)
  rule = lambda v: levels(v[..., 0] <= 0.1, v[..., 0] <= 0.5)
  # A resample of sentences reads fewer distinct tokens, which can only add dead latents, so
  # the bootstrap sits above the point: the interval runs from the point to its upper end.
  ci = at_ends(
    [dead],
    [hi],
    rule,
    over=f"the {d['held_sentences']} held-out sentences, from "
    "the count to the bootstrap's upper end (resampling only adds dead latents)",
    shown=[("dead share", 0, "{:.3f}")],
  )
  return [
    (
      "Gao et al. (2024) found that top-k sparse autoencoders with their AuxK loss and tied "
      "initialisation leave few latents dead (7% of 16M on GPT-4). On "
      f"{model}'s layer {d['layer']}, {dead:.1%} of {d['latents']:,} latents fire on no held-out "
      f"token after {d['steps']} steps on {d['train_tokens']:,} tokens (FVU {d['fvu']:.3f}). "
      "Rule: agrees if at most 10% are dead, partly if at most half; so "
      f"{verdict(model, dead <= 0.1, dead <= 0.5, ci)}. A few thousand tokens are far less than "
      "the papers' billions: `experiments/sae_scaling.py` trains on more."
    )
  ]
