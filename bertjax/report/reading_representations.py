"""The readings of the representation sections: anisotropy (6), the part-of-speech probe (7),
outlier dimensions (11) and the sparse autoencoder (12).

Pure functions of each section's part of `report.json`, as every reading (`reading`): the
paper's finding, what this model measured, and the verdict under the rule the sentence states,
with its 95% interval: each rule a `bertjax.claims.Claim`, `judged` here where report.json
keeps its items.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from bertjax.claims import Claim, Judgement, Test

RESAMPLES = 1000  # where report.json's settings do not say
NO_ITEMS = "report.json keeps no per-item values for this rule"


def judged(
  claim: Claim,
  items,
  statistics: Callable,
  *,
  point: Mapping[str, float],
  shown: Mapping[str, str] | None = None,
  resamples: int = RESAMPLES,
) -> Judgement:
  """`claim.judge` on a section's per-item arrays (an array, or a tuple of them); where the
  section kept none (anything else: None, False), the verdict on `point` with no interval."""
  if not isinstance(items, (np.ndarray, tuple)):
    return claim.unsampled(point, NO_ITEMS)
  return claim.judge(items, statistics, point=point, shown=shown, resamples=resamples)


def upper_bound(x: float, digits: int = 2) -> str:
  """`x` printed as a bound that holds: rounded up, never down ("within 0.02" for 0.014,
  where rounding to the nearest would print a 0.01 the value exceeds)."""
  scale = 10**digits
  return f"{np.ceil(round(x * scale, 9)) / scale:.{digits}f}"


HIGH, RISE = "share of layers at least 0.1", "last minus layer 1"
ANISOTROPIC = Claim(
  "Ethayarajh 2019",
  "Contextual representations are anisotropic: random words' mean cosine is well above 0.",
  yes=(Test(HIGH, ">=", 1),),
  partly=(Test(HIGH, ">", 0),),
  unit="sentences",
)
RISES = Claim(
  "Ethayarajh 2019",
  "Upper layers are more anisotropic than lower ones.",
  yes=(Test(RISE, ">", 0),),
  partly_if="never",
  unit="sentences",
)


def _by_layer(values) -> dict:
  """Anisotropy by layer (L + 1, the embeddings first) as statistics: each block's, and the
  share of blocks at least 0.1."""
  v = np.asarray(values, float)
  return {**{f"layer {i}": v[i] for i in range(1, len(v))}, HIGH: float((v[1:] >= 0.1).mean())}


def anisotropy_sentences(an: dict, model: str) -> list[str]:
  """Section 6: Ethayarajh's anisotropy."""
  a = np.asarray(an["anisotropy"], float)
  blocks = a[1:]
  high = int((blocks >= 0.1).sum())
  ci = an.get("ci")
  over = f"the {ci['sentences']} sentences (each resample's all-pairs mean cosine)" if ci else ""
  rise = {RISE: float(blocks[-1] - blocks[0])}
  high_ci, rise_ci = ANISOTROPIC.unsampled(_by_layer(a), NO_ITEMS), RISES.unsampled(rise, NO_ITEMS)
  if ci:
    high_ci = ANISOTROPIC.at_ends(
      _by_layer(a),
      *(_by_layer(end) for end in ci["anisotropy"]),
      over=over,
      shown={f"layer {i}": "{:.2f}" for i in range(1, len(a))},
    )
    rise_ci = RISES.at_ends(
      rise, {RISE: ci["rise"][0]}, {RISE: ci["rise"][1]}, over=over, shown={RISE: "{:+.2f}"}
    )
  centred = float(np.max(np.abs(np.asarray(an["anisotropy_centered"], float)[1:])))
  first = (
    "Ethayarajh (2019) found contextual representations anisotropic: two random words have a "
    "mean cosine well above 0, and more so in upper layers. In "
    f"{model} the mean cosine of random token pairs is at least 0.1 in {high} of "
    f"{len(blocks)} layers (layer 1 {blocks[0]:.2f}, peak {blocks.max():.2f} at layer "
    f"{int(np.argmax(blocks)) + 1}, last {blocks[-1]:.2f}; embeddings {a[0]:.2f}). Rule: "
    "agrees if in every layer, partly if in some; so "
    f"{high_ci.sentence(model)}."
  )
  rises = blocks[-1] > blocks[0]
  second = (
    f"Upper layers {'are' if rises else 'are not'} more anisotropic than layer 1 here "
    f"({blocks[-1]:.2f} vs {blocks[0]:.2f}; rule: agrees if the last layer exceeds the first, "
    f"so {rise_ci.sentence(model)})"
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


BEST, SELECTIVE = "best layer", "selectivity at the best layer"


def _lower_half(half: int) -> Claim:
  """Tenney et al.'s claim on a model whose lower half is blocks 1..`half`."""
  return Claim(
    "Tenney et al. 2019; Liu et al. 2019",
    "Part of speech is best read from the lower-middle layers.",
    yes=(Test(BEST, ">=", 1), Test(BEST, "<=", half)),
    partly_if="never",
    unit="held-out sentences",
  )


SELECTIVITY = Claim(
  "Hewitt & Liang 2019",
  "A good probe is selective: much better on the task than on a control task.",
  yes=(Test(SELECTIVE, ">=", 0.2),),
  partly=(Test(SELECTIVE, ">=", 0.05),),
  unit="held-out sentences",
)


def _probe_stats(rows, correct, control) -> dict:
  """The POS rules' statistics from per-sentence counts ((..., S), (..., S, L + 1) twice): the
  best layer, and the selectivity (accuracy minus control accuracy) there."""
  total = np.asarray(rows, float).sum(-1)[..., None]
  acc, ctrl = np.asarray(correct, float).sum(-2) / total, np.asarray(control, float).sum(-2) / total
  best = np.argmax(acc, -1)
  sel = np.take_along_axis(acc - ctrl, best[..., None], -1)[..., 0]
  return {BEST: best, SELECTIVE: sel}


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
  point = {BEST: best, SELECTIVE: float(sel[best])}
  layer_ci = judged(
    _lower_half(half), items, _probe_stats, point=point, shown={BEST: "{:.0f}"}, resamples=resamples
  )
  sel_ci = judged(
    SELECTIVITY, items, _probe_stats, point=point, shown={SELECTIVE: "{:.3f}"}, resamples=resamples
  )
  first = (
    "Tenney et al. (2019) and Liu et al. (2019) found part of speech best read from the "
    f"lower-middle layers. {model}'s UPOS probe is best at layer {best} of {blocks} "
    f"({acc[best]:.3f}; embeddings {acc[0]:.3f}, last {acc[-1]:.3f}). Rule: agrees if the "
    f"best layer is a block in the lower half (1-{half}); so "
    f"{layer_ci.sentence(model)}."
  )
  second = (
    "Hewitt & Liang (2019) ask that a probe be selective (much better on the task than on a "
    f"control task of random word-type tags): selectivity at the best layer is "
    f"{sel[best]:.3f} (rule: agrees if at least 0.2, partly if at least 0.05; so "
    f"{sel_ci.sentence(model)})."
  )
  return [first, second]


FOUND, RELATIVE, WITH_ANY, DEAD = (
  "outlier dimensions found",
  "relative fall",
  "share of layers with any",
  "dead share",
)


def _few(few: int) -> Claim:
  """Kovaleva et al.'s claim, `few` dimensions (5% of the width) counting as a few."""
  return Claim(
    "Kovaleva et al. 2021",
    "A few LayerNorm output dimensions are outliers in most layers.",
    yes=(Test(FOUND, ">=", 1), Test(FOUND, "<=", few)),
    partly=(Test(FOUND, ">", few),),
    partly_if="all",
    unit="sentences",
  )


SPECIAL = Claim(
  "Puccetti et al. 2022",
  "Outlier dimensions drive the heads' attention on special tokens.",
  yes=(Test(RELATIVE, ">=", 0.2),),
  partly=(Test(RELATIVE, ">", 0),),
  unit="sentences",
)
MASSIVE = Claim(
  "Sun et al. 2024",
  "Massive activations, 100-1000x the median magnitude, appear in most layers.",
  yes=(Test(WITH_ANY, ">=", 0.5),),
  partly=(Test(WITH_ANY, ">", 0),),
  unit="sentences",
)
DEAD_LATENTS = Claim(
  "Gao et al. 2024",
  "Top-k sparse autoencoders with AuxK and tied initialisation leave few latents dead.",
  yes=(Test(DEAD, "<=", 0.1),),
  partly=(Test(DEAD, "<=", 0.5),),
  unit="held-out sentences",
)


def outlier_sentences(o: dict, model: str, resamples: int = RESAMPLES) -> list[str]:
  """Section 11: outlier dimensions, the attention they draw, massive activations."""
  dims, hidden = list(o["dims"]), int(o["hidden_size"])
  per_layer = ", ".join(str(int(v)) for v in o["outliers_per_layer"])
  few = max(1, round(0.05 * hidden))  # "a few": at most 5% of the dimensions
  ci, found = o.get("count_ci"), {FOUND: len(dims)}
  count_ci = (
    _few(few).at_ends(
      found,
      {FOUND: ci[0]},
      {FOUND: ci[1]},
      over=f"the text's sentences ({o['tokens']} tokens)",
      shown={FOUND: "{:.0f}"},
    )
    if ci
    else _few(few).unsampled(found, NO_ITEMS)
  )
  first = (
    "Kovaleva et al. (2021) found a few dimensions of BERT's LayerNorm outputs (308 and 381 in "
    "BERT-base) far from the others in most layers. In "
    f"{model}, {len(dims)} of {hidden} dimensions lie >= 3 standard deviations from the "
    "layer's mean in at least 25% of the layers"
    + (f" ({', '.join(map(str, dims))})" if dims else "")
    + f"; by layer, {per_layer}. Rule: agrees if 1 to {few} (5% of the width), partly if more; "
    f"so {count_ci.sentence(model)}."
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
    fall = lambda a, b: {RELATIVE: (a.mean(-1) - b.mean(-1)) / a.mean(-1)}
    fall_ci = SPECIAL.judge(items, fall, resamples=resamples)
    rel = fall_ci.values[RELATIVE]
    second = (
      "Puccetti et al. (2022) found that outlier dimensions drive the attention heads' focus on "
      "special tokens. With their LayerNorm scale and bias set to zero, the mean attention on "
      f"the special tokens goes from {items[0].mean():.3f} to {items[1].mean():.3f} (a "
      f"relative fall of {rel:.2f}). Rule: agrees if it falls by at least a fifth, partly if "
      f"it falls; so {fall_ci.sentence(model)}."
    )
  m = o["massive"]
  count = np.asarray(m["count"])
  ratio = np.asarray(m["max_abs"], float) / np.asarray(m["median_abs"], float)
  layers = int((count > 0).sum())
  by = m.get("by_sentence")
  share = lambda c: {WITH_ANY: (c.sum(-2) > 0).mean(-1)}  # (R, S, L): layers with any
  massive_ci = judged(
    MASSIVE,
    by and np.asarray(by, float),
    share,
    point={WITH_ANY: layers / len(count)},
    resamples=resamples,
  )
  third = (
    "Sun et al. (2024) found massive activations in LLMs: a few entries above 100 and 1000 "
    f"times the median magnitude, in most layers. {model} has them in {layers} of "
    f"{len(count)} layers (largest over median: {ratio.max():.0f}x, at layer "
    f"{int(ratio.argmax()) + 1}). Rule: agrees if in at least half the layers, partly if in "
    f"some; so {massive_ci.sentence(model)}."
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
  # A resample of sentences reads fewer distinct tokens, which can only add dead latents, so
  # the bootstrap sits above the point: the interval runs from the point to its upper end.
  ci = DEAD_LATENTS.at_ends(
    {DEAD: dead},
    {DEAD: dead},
    {DEAD: hi},
    over=f"the {d['held_sentences']} held-out sentences, from "
    "the count to the bootstrap's upper end (resampling only adds dead latents)",
    shown={DEAD: "{:.3f}"},
  )
  return [
    (
      "Gao et al. (2024) found that top-k sparse autoencoders with their AuxK loss and tied "
      "initialisation leave few latents dead (7% of 16M on GPT-4). On "
      f"{model}'s layer {d['layer']}, {dead:.1%} of {d['latents']:,} latents fire on no held-out "
      f"token after {d['steps']} steps on {d['train_tokens']:,} tokens (FVU {d['fvu']:.3f}). "
      "Rule: agrees if at most 10% are dead, partly if at most half; so "
      f"{ci.sentence(model)}. A few thousand tokens are far less than "
      "the papers' billions: `experiments/sae_scaling.py` trains on more."
    )
  ]
