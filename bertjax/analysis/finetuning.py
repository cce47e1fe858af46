"""What fine-tuning does to attention, Kovaleva et al. 2019's three measurements ("Revealing the
Dark Secrets of BERT") on a pre-trained model and its fine-tuned copy:

* the attention pattern types of both (`attention.patterns.pattern_types`: vertical,
  diagonal, both, block, heterogeneous);
* how far fine-tuning moved each head's maps and each layer's hidden states
  (`attention.patterns.attention_change`: cosine of the maps, CKA of the states);
* the fine-tuned model's held-out accuracy with each head, each layer or each whole block
  disabled (`disabling_sweeps`), and how many of them improve it.

`fine_tuning_effects` runs all three on held-out batches of a classification task.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from bertjax.analysis.attention import patterns
from bertjax.analysis.interventions import ablation


def disabling_sweeps(
  params, config, batches: Sequence[dict], *, strategy: str = "prefix"
) -> dict[str, ablation.AblationResult]:
  """Held-out accuracy (`ablation.classification_accuracy`) with each head, each layer, or
  each whole block disabled.

  Heads and layers are disabled in "uniform" mode (Kovaleva et al.'s method: the map becomes
  uniform over the real tokens); whole layers also in "scale" mode (the heads' outputs
  zeroed, as Michel et al.); "layer_skip" replaces a block by the identity. Single heads in
  "scale" mode are left out: they would double the longest sweep.

  Args:
    params, config: the fine-tuned classifier.
    batches: held-out batches with `labels`.
    strategy: `ablation.ablation_sweep`'s (e.g. "vmap": one program per mode).

  Returns:
    "uniform" and "scale" -> `ablation.AblationResult`; what a mode does not evaluate is NaN.
  """

  def sweep(kind, include):
    return ablation.ablation_sweep(
      params,
      config,
      batches,
      ablation.classification_accuracy,
      head_ablations=(kind,),
      include=include,
      chunk_size=1,
      strategy=strategy,
    )[kind]

  return {
    "uniform": sweep("uniform", ("heads", "layers", "layer_skip")),
    "scale": sweep("scale", ("layers",)),
  }


def layer_means(per_head) -> np.ndarray:
  """(layers,) mean over heads of a (layers, heads) array."""
  return np.asarray(per_head, np.float64).mean(-1)


def fine_tuning_effects(
  pre_params,
  params,
  config,
  held: Sequence[dict],
  analysis: Sequence[dict],
  *,
  special_ids: Sequence[int],
  strategy: str = "prefix",
) -> dict[str, Any]:
  """Kovaleva et al.'s three measurements of what fine-tuning changed.

  Args:
    pre_params, params: the model before and after fine-tuning (one `config`, a classifier).
    held: held-out batches with `labels`, for the disabling sweeps.
    analysis: batches for the pattern types and the change (e.g. the first of `held`).
    special_ids: [CLS] and [SEP]'s ids (the vertical type's targets).
    strategy: the sweeps' `ablation.ablation_sweep` strategy.

  Returns:
    `before`, `after` (`PatternCounts.summary` of each model), `change`
    (`patterns.attention_change`), `acc` (mode -> `AblationResult.improvements`), `se` (the
    intact accuracy's binomial standard error) and `seconds` (each measurement's wall time).
  """
  seconds = {}
  t0 = time.perf_counter()
  types = lambda p: patterns.pattern_types(p, config, analysis, special_ids=special_ids)
  before, after = types(pre_params).summary(), types(params).summary()
  seconds["patterns"], t0 = time.perf_counter() - t0, time.perf_counter()
  change = patterns.attention_change(pre_params, config, params, analysis)
  seconds["attention_change"], t0 = time.perf_counter() - t0, time.perf_counter()
  acc = {
    m: r.improvements()
    for m, r in disabling_sweeps(params, config, held, strategy=strategy).items()
  }
  seconds["ablation"] = time.perf_counter() - t0
  n = sum(len(b["labels"]) for b in held)
  base = acc["uniform"]["baseline"]
  se = float(np.sqrt(base * (1 - base) / n))
  return {
    "before": before,
    "after": after,
    "change": change,
    "acc": acc,
    "se": se,
    "seconds": seconds,
  }


def effects_record(m: dict[str, Any]) -> dict[str, Any]:
  """`fine_tuning_effects`' result `m` as a result file records it: "patterns" (the pattern
  types before and after without their per-head counts, each head's dominant type before
  and after, and how many heads changed it; each sentence's maps per type, `per_sequence`),
  "ablation" (the sweeps' accuracies with the intact accuracy's standard error) and
  "attention_change" (cosine and CKA per head, the cosine's layer means, and each sentence's
  layer means, `per_sentence_layer_cosine`: what the Findings' intervals resample)."""
  before, after, change = m["before"], m["after"], m["change"]
  drop = ("counts", "dominant")
  return {
    "patterns": {
      "before": {k: v for k, v in before.items() if k not in drop},
      "after": {k: v for k, v in after.items() if k not in drop},
      "dominant_before": before["dominant"],
      "dominant_after": after["dominant"],
      "dominant_changed_heads": int((before["dominant"] != after["dominant"]).sum()),
    },
    "ablation": {"metric": "held-out accuracy", **m["acc"], "accuracy_standard_error": m["se"]},
    "attention_change": {
      "cosine": change.cosine,
      "layer_cosine": layer_means(change.cosine),
      "cka": change.cka,
      "per_sentence_layer_cosine": change.per_sequence,
    },
  }
