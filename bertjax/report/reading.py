"""The report's generated reading: for each section, what the paper found, what this model
measured, and whether the two agree under a stated rule.

Every function here is pure: it takes the section's part of `report.json` (the same
numbers the page's tables and figures show) and the analysed model's name, and returns one
or two sentences. `readings` collects them for every section; `build_report` stores them in
`report.json` under `readings` and the page prints them under each section's heading.
Layers are numbered as everywhere in the report: blocks 1..L, the embedding output 0.

Verdicts are one of "agrees", "partly agrees" and "disagrees" (with the model's name before
them), or a sentence saying why the section cannot test the claim. Each rule is written out in
the sentence that applies it, so a reader can check it against the tables. Each verdict also
states how sure it is: each rule is a `bertjax.claims.Claim`, judged on the 95% bootstrap
interval of its statistics over the items report.json keeps (sentences, inputs, passages;
heads for correlations across heads), with the rule applied to every resample; where the
verdicts at the interval's two ends differ, the verdict is "inconclusive" ("the verdict on
<model> is inconclusive"). The Findings of `experiments/` take their rules and verdicts from
the same module.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from bertjax import stats
from bertjax.claims import Claim, Test
from bertjax.report.reading_representations import (
  NO_ITEMS,
  RESAMPLES,
  anisotropy_sentences,
  judged,
  outlier_sentences,
  pos_sentences,
  sae_sentences,
)

# Accuracy within this of a reference counts as "no noticeable drop" (Michel et al.'s reading,
# and the experiments' `sixteen_heads` tolerance).
TOLERANCE = 0.02


def _thirds(n: int) -> tuple[slice, slice, slice]:
  """The first, middle and last third of `n` blocks (index slices; each at least one block)."""
  a = max(1, round(n / 3))
  b = max(a + 1, round(2 * n / 3)) if n >= 3 else a
  return slice(0, a), slice(a, b), slice(b, n)


def _block_range(s: slice) -> str:
  """A slice of 0-based block indices as the page numbers them (`layers 3-4`, `layer 2`)."""
  lo, hi = s.start + 1, s.stop
  return f"layer {lo}" if lo == hi else f"layers {lo}-{hi}"


TOTAL, LEAD = "middle-layer total", "[SEP]'s lead"
SINK = Claim(
  "Clark et al. 2019",
  "Most attention in the middle layers goes to [CLS], [SEP] and punctuation, [SEP] above all.",
  yes=(Test(TOTAL, ">", 0.5), Test(LEAD, ">", 0)),
  partly=(Test(TOTAL, ">", 0.5),),
  partly_if="all",
  unit="sentences",
)


def _sink_stats(cls, sep, punct, middle: slice) -> dict:
  """Clark's sink rule's statistics from by-layer masses (..., L): the middle layers' total
  mass on [CLS], [SEP] and punctuation, and [SEP]'s lead over the larger of the others."""
  m = [np.asarray(x, float)[..., middle].mean(-1) for x in (cls, sep, punct)]
  return {TOTAL: m[0] + m[1] + m[2], LEAD: m[1] - np.maximum(m[0], m[2])}


HALVES, PEAK = "first half minus second", "the highest-entropy layer's index"


def _entropy_claim(third: int) -> Claim:
  """Clark's broad-attention-early claim; `third` blocks make the first third."""
  return Claim(
    "Clark et al. 2019",
    "Early layers attend broadly (high entropy); later heads focus.",
    yes=(Test(PEAK, "<", third), Test(HALVES, ">", 0)),
    unit="sentences",
  )


def _entropy_stats(ent, n: int) -> dict:
  """The entropy rule's statistics from by-layer entropy (..., L): the first half's mean minus
  the second's, and the layer index of the highest entropy."""
  ent = np.asarray(ent, float)
  half = max(1, n // 2)
  late = ent[..., half:].mean(-1) if n > half else np.full(ent.shape[:-1], np.nan)
  return {HALVES: ent[..., :half].mean(-1) - late, PEAK: np.argmax(ent, -1)}


def clark_sentences(c: dict, model: str, resamples: int = RESAMPLES) -> list[str]:
  """Section 1: the attention sink in the middle layers and broad attention early on."""
  bl = {k: np.asarray(v, float) for k, v in c["by_layer"].items()}
  n = len(bl["sep"])
  _, middle, _ = _thirds(n)
  if middle.start >= middle.stop:  # one or two blocks: no middle third
    middle = slice(0, n)
  sinks = {
    "[CLS]": float(bl["cls"][middle].mean()),
    "[SEP]": float(bl["sep"][middle].mean()),
    "punctuation": float(bl["punct"][middle].mean()),
  }
  total = sum(sinks.values())
  top = max(sinks, key=sinks.get)
  sep_peak = int(np.argmax(bl["sep"]))
  per = c.get("per_sentence")
  sink = judged(
    SINK,
    per and np.stack([np.asarray(per[k], float) for k in ("cls", "sep", "punct")], 1),
    lambda a: _sink_stats(*np.moveaxis(a.mean(1), 1, 0), middle),
    point=_sink_stats(bl["cls"], bl["sep"], bl["punct"], middle),
    shown={TOTAL: "{:.2f}", LEAD: "{:+.2f}"},
    resamples=resamples,
  )
  first = (
    "Clark et al. (2019) found that BERT-base's heads put most of their attention on a few "
    "tokens, [SEP] above all (over half of layers 6-10's patterns, read as a no-op when a "
    f"head's function does not apply). In {model}'s middle {_block_range(middle)}, [CLS], "
    f"[SEP] and punctuation together take {total:.2f} of the attention and the largest share "
    f"goes to {top} ({sinks[top]:.2f}); [SEP] peaks at layer {sep_peak + 1} "
    f"({bl['sep'][sep_peak]:.2f}). Rule: agrees if these tokens take over half of the middle "
    "layers' attention with [SEP] the largest, partly if over half goes to them but another "
    f"token is the sink; so {sink.sentence(model)}."
  )
  ent = bl["entropy"]
  top_ent = int(np.argmax(ent))
  half = max(1, n // 2)
  early, late = float(ent[:half].mean()), float(ent[half:].mean()) if n > half else float("nan")
  later = late if np.isfinite(late) else early
  spread = judged(
    _entropy_claim(max(1, round(n / 3))),
    per and np.asarray(per["entropy"], float),
    lambda a: _entropy_stats(a.mean(1), n),
    point=_entropy_stats(ent, n),
    shown={HALVES: "{:+.2f}"},
    resamples=resamples,
  )
  second = (
    "They also found the early layers attending broadly (high entropy) and later heads "
    f"focusing: here the highest mean entropy is at layer {top_ent + 1} ({ent[top_ent]:.2f} "
    f"nats), and the first half of the layers averages {early:.2f} against {later:.2f} for "
    "the second. Rule: agrees if the highest entropy is in the first third of the layers and "
    "the first half exceeds the second, partly if one of the two; so "
    f"{spread.sentence(model)}."
  )
  return [first, second]


REPEATED, VERTICAL = "repeated share", "vertical's lead"
PATTERNS = Claim(
  "Kovaleva et al. 2019",
  "Most attention maps are of a few repeated types, vertical the commonest.",
  yes=(Test(REPEATED, ">=", 0.5), Test(VERTICAL, ">=", 0)),
  unit="inputs",
)


def pattern_sentences(p: dict, model: str, resamples: int = RESAMPLES) -> list[str]:
  """Section 2: Kovaleva et al.'s five pattern types."""
  from bertjax.analysis.attention import patterns

  names = list(patterns.PATTERN_TYPES)
  overall = dict(zip(names, (float(v) for v in p["overall"])))
  repeated = 1 - overall["heterogeneous"]
  kinds = {k: v for k, v in overall.items() if k != "heterogeneous"}
  common = max(kinds, key=kinds.get)
  other = [names.index(k) for k in kinds if k != "vertical"]

  def shares(a):  # (R, inputs, types): repeated share, vertical's lead over the others
    m = a.mean(1)
    heterogeneous, vertical = m[:, names.index("heterogeneous")], m[:, names.index("vertical")]
    return {REPEATED: 1 - heterogeneous, VERTICAL: vertical - m[:, other].max(-1)}

  per = p.get("per_input")
  evidence = judged(
    PATTERNS,
    per is not None and np.asarray(per, float),
    shares,
    point={k: float(v[0]) for k, v in shares(np.asarray(p["overall"], float)[None, None]).items()},
    shown={REPEATED: "{:.2f}", VERTICAL: "{:+.2f}"},
    resamples=resamples,
  )
  first = (
    "Kovaleva et al. (2019) found that BERT's attention maps fall mostly into a few repeated "
    "types (vertical, diagonal, both, block), vertical being the commonest, which they read "
    f"as heads over-parametrised for the task. Of {model}'s maps, {repeated:.0%} are of a "
    f"repeated type and the commonest of these is {common} ({kinds[common]:.0%}; "
    f"heterogeneous {overall['heterogeneous']:.0%}). Rule: agrees if repeated types make up "
    "at least half of the maps and vertical leads them, partly if one of the two; so "
    + evidence.sentence(model)
    + "."
  )
  out = [first]
  if overall["block"] == 0:
    out.append(
      "No map was classified as block: the block type needs attention confined to "
      "each segment of a sentence pair, which this model's heads do not show with these "
      "thresholds."
    )
  return out


LOWEST, FINAL = "layer 0 minus the best layer", "final minus the best"
READABLE = Claim(
  "Tenney et al. 2019; Liu et al. 2019",
  "Lexical properties are readable in the lowest layers; the last layers are not the best.",
  yes=(Test(LOWEST, ">=", -TOLERANCE), Test(FINAL, "<", -TOLERANCE)),
  unit="held-out sentences",
)


def _readable_stats(acc) -> dict:
  """The task rule's statistics from accuracy by layer (..., L + 1): layer 0 and the final
  layer, each minus the best layer."""
  acc = np.asarray(acc, float)
  best = acc.max(-1)
  return {LOWEST: acc[..., 0] - best, FINAL: acc[..., -1] - best}


def task_sentences(t: dict, model: str, resamples: int = RESAMPLES) -> list[str]:
  """Section 3: where the negation cue is linearly readable, by layer."""
  acc = np.asarray(t["probe_accuracy_by_layer"], float)
  best = int(np.argmax(acc))
  final = float(acc[-1])
  not_last = final < acc[best] - TOLERANCE
  correct = t.get("probe_correct_by_layer")
  evidence = judged(
    READABLE,
    correct and np.asarray(correct, float).T,
    lambda c: _readable_stats(c.mean(1)),
    point=_readable_stats(acc),
    shown={LOWEST: "{:+.3f}", FINAL: "{:+.3f}"},
    resamples=resamples,
  )
  first = (
    "Probing studies (Tenney et al. 2019; Liu et al. 2019) find lexical properties readable "
    "in the lowest layers and the last layers the most specific to the pre-training objective, "
    "not the best place to read such a property. Negation here is marked by a word (not, "
    f"never, ...): {model}'s probe reads it at {acc[0]:.3f} on the embeddings (layer 0), "
    f"{acc[best]:.3f} at its best layer {best} and {final:.3f} on the final layer "
    f"{len(acc) - 1} (majority class {t['majority_accuracy']:.3f}). Rule (within "
    f"{TOLERANCE:.2f}): agrees if layer 0 is about as good as the best layer and the final "
    "layer is worse, partly if one of the two; so "
    f"{evidence.sentence(model)}."
  )
  out = [first]
  if not_last:
    out.append(
      "The ablation and pruning sections score a probe fitted on the final layer, which reads "
      f"negation {acc[best] - final:.3f} worse than layer {best}: removing heads can move the "
      "final state towards the lower layers' and so raise accuracy."
    )
  if final < t["majority_accuracy"] + 0.05:
    out.append(
      "The final-layer probe barely beats the majority class, so the ablation sections "
      "below measure little."
    )
  return out


WITHIN, BEST_LAYER = "share of heads within it", "the best layer's loss change"
HEADS = Claim(
  "Michel et al. 2019",
  "Most heads can be removed one at a time with no significant loss.",
  yes=(Test(WITHIN, ">=", 0.75),),
  partly=(Test(WITHIN, ">=", 0.5),),
  unit="held-out sentences",
)
LAYERS = Claim(
  "Kovaleva et al. 2019",
  "Disabling all heads of some layer can improve the model.",
  yes=(Test(BEST_LAYER, "<", 0),),
  partly_if="never",
  unit="held-out sentences",
)


def _within_share(means) -> dict:
  """The head rule's statistic from mean losses (..., 1 + heads), the baseline first: the share
  of heads whose removal moves the loss by at most max(10% of the baseline, 0.01)."""
  means = np.asarray(means, float)
  base = means[..., :1]
  limit = np.maximum(0.1 * base, 0.01)
  return {WITHIN: (np.abs(means[..., 1:] - base) <= limit).mean(-1)}


def ablation_sentences(ab: dict, model: str, resamples: int = RESAMPLES) -> list[str]:
  """Section 4: single heads and whole layers removed."""
  base = float(ab["baseline_loss"])
  delta = np.asarray(ab["head_loss"], float) - base
  limit = max(0.1 * base, 0.01)
  small = float(_within_share(np.r_[base, delta.ravel() + base])[WITHIN])
  ex = ab.get("per_example")
  heads_ci = judged(
    HEADS,
    ex
    and np.concatenate(
      [
        np.asarray(ex["loss_baseline"], float)[:, None],
        np.asarray(ex["loss_heads"], float).reshape(delta.size, -1).T,
      ],
      1,
    ),
    lambda a: _within_share(a.mean(1)),
    point={WITHIN: small},
    shown={WITHIN: "{:.2f}"},
    resamples=resamples,
  )
  worst = np.unravel_index(int(np.argmax(delta)), delta.shape)
  first = (
    "Michel et al. (2019) found that most heads can be removed one at a time with no "
    f"significant loss. Removing one of {model}'s {delta.size} heads changes the held-out "
    f"cross-entropy by at most {limit:.3f} (10% of the baseline {base:.3f}) for "
    f"{small:.0%} of them; "
    + (
      f"the most harmful is layer {worst[0] + 1} head {worst[1]} ({delta[worst]:+.3f})"
      if delta[worst] > 0
      else f"none raises the loss (the smallest gain: layer {worst[0] + 1} head {worst[1]}, "
      f"{delta[worst]:+.3f})"
    )
    + ". Rule: agrees if at least 75% of heads stay within that, partly if at least half; so "
    f"{heads_ci.sentence(model)}."
  )
  heads_off = np.asarray(ab["layer_heads_loss"], float) - base
  best_gain = lambda means: {BEST_LAYER: (means[..., 1:] - means[..., :1]).min(-1)}
  layers_ci = judged(
    LAYERS,
    ex
    and np.concatenate(
      [np.asarray(ex["loss_baseline"], float)[:, None], np.asarray(ex["loss_layers"], float).T], 1
    ),
    lambda a: best_gain(a.mean(1)),
    point={BEST_LAYER: float(heads_off.min())},
    shown={BEST_LAYER: "{:+.3f}"},
    resamples=resamples,
  )
  better = [i + 1 for i in np.flatnonzero(heads_off < 0)]
  worst_layer = int(np.argmax(heads_off))
  # A cost is a rise in loss: where masking every layer lowers it, the smallest gain is named
  # as a gain, never as a negative cost.
  cost = (
    f" and costs most at layer {worst_layer + 1} ({heads_off[worst_layer]:+.3f})"
    if heads_off[worst_layer] > 0
    else f", so it costs nothing in any layer (the smallest gain: layer {worst_layer + 1}, "
    f"{heads_off[worst_layer]:+.3f})"
  )
  second = (
    "Kovaleva et al. (2019) found that disabling all heads of some layer can even improve a "
    f"fine-tuned model. Here masking a whole layer's heads lowers the held-out loss in "
    f"{len(better)} of {len(heads_off)} layers"
    + (f" (layer{'s' if len(better) > 1 else ''} {', '.join(map(str, better))})" if better else "")
    + cost
    + ". Rule: agrees if any layer improves; so "
    + layers_ci.sentence(model)
    + "."
  )
  return [first, second]


def importance_vs_ablation(ab: dict) -> dict[str, float]:
  """Head importance against the single-head ablation loss change, like with like.

  Importance (Michel et al.) is E|dL/dxi|: unsigned, and layer-normalised in the report. It
  estimates how much the loss moves when a head is removed, not in which direction, so it is
  compared with |delta L| (`spearman_abs`, over all heads; `spearman_abs_within_layer`, the
  mean over layers of the within-layer correlation, which the layer normalisation does not
  touch). `spearman_signed` (against delta L itself) is kept to show what the unlike
  comparison gives.
  """
  importance = np.asarray(ab["importance"], float)
  delta = np.asarray(ab["head_loss"], float) - float(ab["baseline_loss"])
  return {
    "spearman_abs": stats.spearman(importance, np.abs(delta)),
    "spearman_abs_within_layer": float(np.nanmean(stats.spearman_rows(importance, np.abs(delta)))),
    "spearman_signed": stats.spearman(importance, delta),
  }


KEPT, RHO = "heads masked within the tolerance", "Spearman"
PRUNING = Claim(
  "Michel et al. 2019",
  "Pruning 20-40% of heads by importance leaves accuracy about the same.",
  yes=(Test(KEPT, ">=", 0.35),),
  partly=(Test(KEPT, ">=", 0.15),),
  unit="held-out sentences",
)
IMPORTANCE = Claim(
  "Michel et al. 2019",
  "Head importance predicts how much removing the head changes the loss.",
  yes=(Test(RHO, ">=", 0.5),),
  partly=(Test(RHO, ">", 0),),
  unit="heads",
)


def _kept(accuracy, fractions):
  """The pruning rule's statistic from accuracies (..., 1 + steps), the intact model's first:
  the largest fraction of heads masked before accuracy first falls more than `TOLERANCE`
  below the intact model's."""
  accuracy = np.asarray(accuracy, float)
  ok = accuracy[..., 1:] >= accuracy[..., :1] - TOLERANCE
  drop = np.argmin(ok, -1)  # the first step below the tolerance (0 if none is, see below)
  keep = np.where(ok.all(-1), fractions[-1], fractions[np.maximum(drop - 1, 0)])
  return keep[..., None]


def pruning_sentences(ab: dict, task: dict, model: str, resamples: int = RESAMPLES) -> list[str]:
  """Section 5: iterative pruning by importance."""
  fractions = np.asarray(ab["pruning_fraction"], float)
  acc = np.asarray(ab["pruning_accuracy"], float)
  base = float(ab["baseline_accuracy"])
  ok = acc >= base - TOLERANCE
  drop = None if ok.all() else int(np.argmin(ok))  # the first step below the tolerance
  keep = float(_kept(np.r_[base, acc], fractions)[0])
  ex = ab.get("per_example")
  kept_ci = judged(
    PRUNING,
    ex
    and np.concatenate(
      [
        np.asarray(ex["correct_baseline"], float)[:, None],
        np.asarray(ex["correct_pruning"], float).T,
      ],
      1,
    ),
    lambda c: {KEPT: _kept(c.mean(1), fractions)[..., 0]},
    point={KEPT: keep},
    shown={KEPT: "{:.0%}"},
    resamples=resamples,
  )
  first = (
    "Michel et al. (2019) pruned 20-40% of heads (40% in BERT on MNLI) by importance with no "
    f"noticeable drop. {model}'s held-out accuracy stays within {TOLERANCE:.2f} of the intact "
    f"{base:.3f} up to {keep:.0%} of heads masked"
    + ("" if drop is None else f" and falls below it at {fractions[drop]:.0%}")
    + ". Rule: agrees if at least 35%, partly if at least 15%; so "
    f"{kept_ci.sentence(model)}."
  )
  out = [first]
  peak = int(np.argmax(acc))
  layer_acc = np.asarray(task["probe_accuracy_by_layer"], float)
  lower = int(np.argmax(layer_acc[:-1]))
  if acc[peak] > base + TOLERANCE:
    cause = (
      f"; the likely cause is that the probe on the final layer ({layer_acc[-1]:.3f}) is "
      f"weaker than on layer {lower} ({layer_acc[lower]:.3f}), and masking heads brings the "
      "final state closer to the lower layers'"
      if layer_acc[lower] > layer_acc[-1] + TOLERANCE
      else ""
    )
    out.append(
      f"The curve rises, to {acc[peak]:.3f} with {fractions[peak]:.0%} of heads masked"
      + cause
      + "."
    )
  rho = importance_vs_ablation(ab)
  importance = np.asarray(ab["importance"], float).ravel()
  size = np.abs(np.asarray(ab["head_loss"], float) - float(ab["baseline_loss"])).ravel()
  rho_ci = IMPORTANCE.judge(
    (importance, size),
    lambda i, d: {RHO: stats.spearman_rows(i, d)},
    point={RHO: rho["spearman_abs"]},
    resamples=resamples,
  )
  out.append(
    "Michel et al. use importance (the unsigned E|dL/dxi|) as a cheap proxy for how much the "
    "loss changes when a head is removed; its Spearman correlation with the size of that "
    f"change, |delta L| of the single-head ablation, is {rho['spearman_abs']:.2f} over all "
    f"heads ({rho['spearman_abs_within_layer']:.2f} within a layer, averaged; against the "
    f"signed delta L, which importance does not estimate, {rho['spearman_signed']:.2f}). Rule "
    "(all heads, |delta L|): agrees if at least 0.5, partly if positive; so "
    f"{rho_ci.sentence(model)}."
  )
  return out


RATIO, FALL = "effective / raw", "effective minus raw"
EFFECTIVE = Claim(
  "Brunner et al. 2020",
  "Past the head dimension, effective attention puts much less weight on [CLS] and [SEP].",
  yes=(Test(RATIO, "<=", 0.5),),
  partly=(Test(FALL, "<", 0),),
  unit="passages",
)


def effective_sentences(eff: dict, model: str, resamples: int = RESAMPLES) -> list[str]:
  """Section 8: raw vs effective attention."""
  st = eff["stats"]
  raw = float(np.mean(st["raw"]["cls"]) + np.mean(st["raw"]["sep"]))
  effective = float(np.mean(st["effective"]["cls"]) + np.mean(st["effective"]["sep"]))
  corr = float(np.mean(st["effective"]["raw_corr"]))
  longer = eff["mean_passage_tokens"] > eff["head_dim"]
  per = eff.get("per_passage")

  def masses(t, raw_, eff_):  # (R, P) each: effective / raw, and both token-weighted
    raw_m, eff_m = (t * raw_).sum(-1) / t.sum(-1), (t * eff_).sum(-1) / t.sum(-1)
    return {RATIO: eff_m / raw_m, FALL: eff_m - raw_m}

  evidence = judged(
    EFFECTIVE,
    per and tuple(np.asarray(per[k], float) for k in ("tokens", "raw", "effective")),
    masses,
    point={RATIO: effective / raw if raw > 0 else float("nan"), FALL: effective - raw},
    shown={RATIO: "{:.2f}"},
    resamples=resamples,
  )
  first = (
    "Brunner et al. (2020) found that once sequences are longer than the head dimension, "
    "effective attention (raw attention less its part in the null space of the value "
    "outputs) puts much less weight on [CLS] and [SEP] than raw attention does. On "
    f"{model}'s passages of about {eff['mean_passage_tokens']:.0f} tokens (head dimension "
    f"{eff['head_dim']}), the mean mass on [CLS] + [SEP] is {raw:.3f} raw and {effective:.3f} "
    "effective. Rule: agrees if effective is at most half of raw, partly if lower; so "
    f"{evidence.sentence(model)}."
  )
  second = (
    f"Raw and effective maps correlate {corr:.2f} on average over heads"
    + (
      ""
      if longer
      else "; the passages are not longer than the head dimension, so "
      "there is no null space and the two should be equal"
    )
    + ": the lower, the more of what raw attention shows changes nothing downstream."
  )
  return [first, second]


AHEAD = "share of the methods ahead"
VALUES_COUNT = Claim(
  "Kobayashi et al. 2020; Ferrando et al. 2022; Mohebbi et al. 2023",
  "Methods that count value vectors, residual and LayerNorm find important tokens better than "
  "attention weights.",
  yes=(Test(AHEAD, ">=", 1),),
  partly=(Test(AHEAD, ">", 0),),
  unit="sentences",
)
PEARSON = "Pearson"
PATCHING = Claim(
  "Nanda 2023; Syed et al. 2023",
  "Attribution patching is a good first-order estimate of activation patching.",
  yes=(Test(PEARSON, ">", 0.8),),
  partly_if="never",
  unit="heads",
)
DECOMPOSITION = Claim(
  "Modarressi et al. 2023; Achtibat et al. 2024",
  "Decomposing the whole model (DecompX, AttnLRP) is more faithful than attention-level methods.",
  yes=(Test(AHEAD, ">=", 1),),
  partly=(Test(AHEAD, ">", 0),),
  unit="sentences",
)


def _ahead(mrr_margins: dict) -> dict:
  """Margins of MRR by method (name -> (R,)) and the share of them above 0."""
  share = np.mean([np.asarray(v) > 0 for v in mrr_margins.values()], 0)
  return {**mrr_margins, AHEAD: share}


def attribution_sentences(
  a: dict, model: str = "this model", resamples: int = RESAMPLES
) -> list[str]:
  """Section 9: which attribution method finds the negation cue; which heads carry it."""
  if not a.get("available", True):
    return [f"Token attribution did not run on {model}: {a.get('reason', '')}"]
  stats_, chance = a["cues"]["stats"], a["cues"]["chance"]["mrr"]
  best = max(stats_, key=lambda k: stats_[k]["mrr"])
  weights = max(stats_[k]["mrr"] for k in ("attention", "rollout") if k in stats_)
  mixing = {
    k: stats_[k]["mrr"] for k in ("norm", "globenc", "alti", "value_zeroing") if k in stats_
  }
  above = [k for k, v in mixing.items() if v > weights]
  ranks = a["cues"].get("ranks")
  point = _ahead({k: v - weights for k, v in mixing.items()})
  evidence = VALUES_COUNT.unsampled(point, NO_ITEMS)
  if ranks:
    names = [k for k in ("attention", "rollout", *mixing) if k in ranks]
    n_weights = sum(k in ranks for k in ("attention", "rollout"))

    def margins(r):  # (R, sentences, methods): each counting method's MRR over the best weight
      mrr = (1 / r).mean(1)
      over = mrr[:, n_weights:] - mrr[:, :n_weights].max(-1, keepdims=True)
      return _ahead({m: over[:, i] for i, m in enumerate(names[n_weights:])})

    evidence = VALUES_COUNT.judge(
      np.asarray([ranks[m] for m in names], float).T,
      margins,
      point=point,
      over=f"the {len(ranks[names[0]])} sentences, each method's MRR minus the best "
      "attention-weight method's",
      shown={m: "{:+.2f}" for m in names[n_weights:]},
      resamples=resamples,
    )
  first = (
    f"Kobayashi et al. (2020), Ferrando et al. (2022) and Mohebbi et al. (2023) argue that "
    "attention weights alone misplace token importance and that counting the value "
    "vectors, residual and LayerNorm does better. Here, on the negation probe, the "
    f"best method is {best} (mean reciprocal rank of the cue {stats_[best]['mrr']:.2f}; "
    f"chance {chance:.2f}); raw attention and rollout reach at most {weights:.2f}, and "
    f"{len(above)} of the {len(mixing)} methods that count values do better (rule: "
    "agrees with them if all do, partly if some), so " + evidence.sentence(model) + "."
  )
  patch = a["patching"]
  exact = np.asarray(patch["exact"], float)
  top = np.unravel_index(np.nanargmax(exact), exact.shape)
  pearson = patch["agreement"]["pearson"]
  pairs = (
    f"each of {patch['pairs']} negated sentences" if "pairs" in patch else "a negated sentence"
  )
  approx = np.asarray(patch.get("attribution", np.full(exact.shape, np.nan)), float)
  fine = np.isfinite(exact.ravel()) & np.isfinite(approx.ravel())
  sure = (
    PATCHING.judge(
      (exact.ravel()[fine], approx.ravel()[fine]),
      lambda x, y: {PEARSON: stats.pearson_rows(x, y)},
      point={PEARSON: pearson},
      resamples=resamples,
    )
    if fine.sum() > 2
    else None
  )
  straddles = sure is not None and sure.intervals[PEARSON][0] <= 0.8 < sure.intervals[PEARSON][1]
  second = (
    f"Patching one head's output from {pairs} into its affirmative twin, "
    f"layer {top[0] + 1} head {top[1]} alone restores {exact[top]:.2f} of the "
    f"probe's negation logit. Attribution patching (Nanda 2023; Syed et al. 2023 find it "
    f"a good first-order estimate) matches the exact sweep with Pearson {pearson:.2f}"
    + " (rule: above 0.8"
    + (f"; {sure.text}" if sure is not None else "")
    + ")"
    + (
      "; the interval straddles 0.8, so whether it matches as they report is inconclusive."
      if straddles
      else ", as they report."
      if pearson > 0.8
      else "; here it is a poor estimate, likely because the effect is non-linear "
      "(LayerNorm, later blocks) for the heads that matter."
    )
  )
  third = _decomposition_sentence(stats_, ranks, model, resamples)
  return [first, second] if third is None else [first, second, third]


def _decomposition_sentence(
  stats_: dict, ranks: dict | None, model: str, resamples: int
) -> str | None:
  """Section 9's third sentence: DecompX and AttnLRP against the best other method."""
  decomp = [k for k in ("decompx", "attnlrp") if k in stats_]
  if not decomp:
    return None
  others = [k for k in stats_ if k not in decomp]
  rival = max(others, key=lambda k: stats_[k]["mrr"])
  n = len(decomp)
  point = _ahead({k: stats_[k]["mrr"] - stats_[rival]["mrr"] for k in decomp})
  evidence = DECOMPOSITION.unsampled(point, NO_ITEMS)
  if ranks and all(k in ranks for k in decomp + others):

    def margins(r):  # (R, sentences, methods): each decomposition's MRR over the best other's
      mrr = (1 / r).mean(1)
      over = mrr[:, :n] - mrr[:, n:].max(-1, keepdims=True)
      return _ahead({m: over[:, i] for i, m in enumerate(decomp)})

    evidence = DECOMPOSITION.judge(
      np.asarray([ranks[m] for m in decomp + others], float).T,
      margins,
      point=point,
      over=f"the {len(ranks[decomp[0]])} sentences, each decomposition's MRR minus the best "
      "other method's",
      shown={m: "{:+.2f}" for m in decomp},
      resamples=resamples,
    )
  return (
    "Modarressi et al. (2023, DecompX) and Achtibat et al. (2024, AttnLRP) decompose the "
    "whole model, every block's FFN and norms included, down to the output, and find it "
    "more faithful than attention-level methods and gradients. Here they rank the cue at "
    + ", ".join(f"{k} {stats_[k]['mrr']:.2f}" for k in decomp)
    + f" against the best other method, {rival} ({stats_[rival]['mrr']:.2f}) (rule: "
    "agrees if both beat every other method, partly if one does), so "
    + evidence.sentence(model)
    + "."
  )


EAP, EAP_IG, SHARE = "EAP", "EAP-IG", "the circuit's share of the edges"
EDGES = Claim(
  "Syed et al. 2023; Hanna et al. 2024",
  "Edge attribution patching approximates exact edge patching, EAP-IG better than EAP.",
  yes=(Test(EAP_IG, ">", 0.8), Test(EAP_IG, ">", EAP)),
  unit="edges patched exactly",
)
CIRCUIT = Claim(
  "Conmy et al. 2023; Hanna et al. 2024",
  "Circuits of a few percent of the edges keep most of the behaviour.",
  yes=(Test(SHARE, "<=", 0.05),),
  partly=(Test(SHARE, "<=", 0.2),),
  missing="no",
  missing_when="no circuit keeps 80%",
)


def circuit_sentences(c: dict, model: str, resamples: int = RESAMPLES) -> list[str]:
  """Section 10: EAP and EAP-IG against exact edge patching, and the smallest faithful
  circuit."""
  if not c.get("available"):
    return [
      (
        f"The circuit section did not run ({c.get('reason', 'no pairs')}), so this report "
        "cannot compare edge attribution with exact patching."
      )
    ]
  a = c["agreement"]
  eap, ig = a["eap"]["pearson"], a["eap_ig"]["pearson"]
  items = tuple(
    np.asarray(v, float) for v in (c["exact_scores"], c["scores"]["eap"], c["scores"]["eap_ig"])
  )
  ok = np.isfinite(items[0]) & np.isfinite(items[1]) & np.isfinite(items[2])
  both = lambda ex, e, i: {EAP: stats.pearson_rows(e, ex), EAP_IG: stats.pearson_rows(i, ex)}
  ci = (
    EDGES.judge(
      tuple(x[ok] for x in items), both, point={EAP: eap, EAP_IG: ig}, resamples=resamples
    )
    if ok.sum() > 2
    else EDGES.unsampled({EAP: eap, EAP_IG: ig}, NO_ITEMS)
  )
  first = (
    "Syed et al. (2023) and Hanna et al. (2024) found that edge attribution patching "
    "approximates exact edge patching, and its integrated-gradients variant (EAP-IG) better "
    f"than plain EAP. On {model}'s negation pairs, over {int(ok.sum())} edges patched "
    f"exactly, EAP's scores correlate {eap:.2f} with the exact effects and EAP-IG's "
    f"{ig:.2f}. Rule: agrees if EAP-IG's Pearson is above 0.8 and above EAP's, partly if "
    f"one of the two holds; so {ci.sentence(model)}."
  )
  k, total = c["smallest"], c["edges"]
  share = None if k is None else k / total
  second = (
    "Conmy et al. (2023) and Hanna et al. (2024) found circuits of a few percent of the "
    "edges that keep most of a model's behaviour. Here "
    + (
      "no top-k circuit from EAP-IG's scores keeps 80% of the logit difference"
      if k is None
      else f"the smallest top-k circuit from EAP-IG's scores keeping 80% of the logit difference "
      f"has {k:,} of the {total:,} edges ({share:.1%})"
    )
    + ". Rule: agrees within 5% of the edges, partly within 20%; so "
    f"{CIRCUIT.unsampled({SHARE: share}, NO_ITEMS).sentence(model)}."
  )
  return [first, second]


RATE, OTHER = "positional share of the positional-pattern heads", "of the other heads"
POSITION = Claim(
  "He et al. 2021",
  "DeBERTa's position terms drive the heads that attend by position.",
  yes=(Test(RATE, ">", 0.5), Test(RATE, ">", OTHER)),
  partly=(Test(RATE, ">", OTHER),),
  partly_if="all",
  unit="heads",
)


def disentangled_sentences(d: dict, model: str) -> list[str]:
  """Section 13 (DeBERTa): how much of the heads' scores position carries, and whether the heads
  it drives are those with a positional pattern (sections 1 and 2)."""
  if not d.get("available", True):
    return [f"The score-term analysis did not run on {model}: {d.get('reason', '')}"]
  bl, thr = d["by_layer"], d["threshold"]
  pos = np.asarray(bl["positional_share"], float)
  peak, heads = int(np.nanargmax(pos)), d["positional_heads"]
  share = np.asarray(d["positional_share"], float)
  names = lambda hs: ", ".join(f"L{l}H{h}" for l, h in hs)
  first = (
    "He et al. (2021) add two relative-position terms to each head's content score, "
    "content-to-position (c2p) and position-to-content (p2c), and find that removing either "
    f"lowers accuracy. In {model}, c2p and p2c carry {np.nanmean(pos):.2f} of the heads' "
    f"within-row score variance on average (c2p {np.nanmean(bl['share_c2p']):.2f}, p2c "
    f"{np.nanmean(bl['share_p2c']):.2f}): {pos[0]:.2f} in layer 1, {pos[-1]:.2f} in layer "
    f"{len(pos)}, most in layer {peak + 1} ({pos[peak]:.2f}); removing both from one head "
    "alone changes its attention by a total variation of "
    f"{np.nanmean(bl['tv_direct_c2p+p2c']):.2f} on average. {len(heads)} of the {share.size} "
    f"heads are mostly positional (c2p + p2c over {thr})"
    + (
      f": {names(heads[:12])}" + (f" and {len(heads) - 12} more" if len(heads) > 12 else "") + "."
      if heads
      else "."
    )
  )
  sets = [o for o in d["overlap"].values() if o is not None]
  if not sets:
    return [
      first,
      (
        "Sections 1 and 2 failed, so this report cannot say whether these "
        "heads are the ones with a positional pattern."
      ),
    ]
  found = {tuple(h) for o in sets for h in o["heads"]}
  if not found:
    return [
      first,
      (
        "No head here puts over half its attention on the previous or next "
        "token or has a diagonal pattern as its most frequent type, so this report "
        "cannot test whether position drives the heads with a positional pattern."
      ),
    ]
  grid = np.zeros(share.shape, bool)
  for l, h in found:
    grid[l - 1, h] = True
  positional = share > thr
  rate, other = positional[grid].mean(), positional[~grid].mean() if (~grid).any() else 0.0
  second = (
    "If the position terms do the positional work, the heads that attend by position "
    "(previous/next-token heads, section 1; diagonal types, section 2) should be mostly "
    f"positional. Of the {len(found)} such heads here "
    f"({names(sorted(found))}), {int(positional[grid].sum())} are ({rate:.0%}), against "
    f"{other:.0%} of the other heads. Rule: agrees if over half of them are and more often "
    "than the other heads, partly if more often only; so "
    f"{POSITION.unsampled({RATE: rate, OTHER: other}, NO_ITEMS).sentence(model)}."
  )
  return [first, second]


def text_sentences(r: dict, model: str) -> list[str]:
  """The text section: what was read, and how it differs from the papers' inputs."""
  t = r["text"]
  return [
    (
      f"{model} ({r['model']['layers']} layers x {r['model']['heads']} heads) reads "
      f"{t['description']} ({t['num_tokens']} tokens). The papers read other text (Clark et "
      "al.: Wikipedia segment pairs; Kovaleva et al.: GLUE; Ethayarajh: SemEval STS), so the "
      "verdicts below compare the direction of each finding, not its exact values."
    )
  ]


def readings(r: dict) -> dict[str, list[str]]:
  """Every section's sentences, keyed by the page's section ids (`page.SECTIONS`).

  Args:
    r: the results of `build_report` (as in `report.json`).

  Returns:
    `{section id: [sentence, ...]}` for every section with numbers to read.
  """
  model = r["model"]["name"]
  n = int((r.get("settings") or {}).get("bootstrap_resamples") or RESAMPLES)
  makers = {
    "text": lambda: text_sentences(r, model),
    "clark": lambda: clark_sentences(r["clark"], model, n),
    "patterns": lambda: pattern_sentences(r["patterns"], model, n),
    "task": lambda: task_sentences(r["task"], model, n),
    "ablation": lambda: ablation_sentences(r["ablation"], model, n),
    "pruning": lambda: pruning_sentences(r["ablation"], r["task"], model, n),
    "anisotropy": lambda: anisotropy_sentences(r["anisotropy"], model),
    "pos": lambda: pos_sentences(r["pos"], model, n),
    "effective": lambda: effective_sentences(r["effective"], model, n),
  }
  if r.get("outliers"):
    makers["outliers"] = lambda: outlier_sentences(r["outliers"], model, n)
  if r.get("attribution"):
    makers["attribution"] = lambda: attribution_sentences(r["attribution"], model, n)
  if r.get("circuit"):
    makers["circuit"] = lambda: circuit_sentences(r["circuit"], model, n)
  if r.get("sae"):
    makers["sae"] = lambda: sae_sentences(r["sae"], model)
  if r.get("disentangled"):  # DeBERTa only
    makers["disentangled"] = lambda: disentangled_sentences(r["disentangled"], model)
  sources = {"pruning": ("ablation", "task")}
  out = {}
  for section, make in makers.items():
    read = [r.get(k) for k in sources.get(section, (section,))]
    broken = [x for x in read if _failed(x)]
    left_out = [x for x in read if isinstance(x, dict) and x.get("skipped")]
    if broken:
      out[section] = [
        (
          f"This section failed ({broken[0]['error']}), so this report cannot compare it "
          "with the paper."
        )
      ]
    elif left_out:
      out[section] = [
        (
          f"This section was not run ({left_out[0]['reason']}), so this report does not "
          "compare it with the paper."
        )
      ]
    else:
      out[section] = make()
  return out


def _failed(section) -> bool:
  return isinstance(section, dict) and bool(section.get("failed"))


def verdicts(sentences: Sequence[str], model: str) -> list[str]:
  """The verdicts in `sentences` ("agrees", "partly agrees", "disagrees", "inconclusive"), in
  order."""
  name = re.escape(model)
  pattern = re.compile(
    rf"(?:the verdict on {name} is (inconclusive)\b|"
    rf"{name} (partly agrees|disagrees|agrees)\b)"
  )
  return [m.group(1) or m.group(2) for s in sentences for m in pattern.finditer(s)]
