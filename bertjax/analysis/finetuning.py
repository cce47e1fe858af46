"""What fine-tuning does to attention, Kovaleva et al. 2019's three measurements ("Revealing the
Dark Secrets of BERT") on a pre-trained model and its fine-tuned copy:

* the attention pattern types of both (`attention.patterns.pattern_types`: vertical,
  diagonal, both, block, heterogeneous);
* how far fine-tuning moved each head's maps and each layer's hidden states
  (`attention.patterns.attention_change`: cosine of the maps, CKA of the states);
* the fine-tuned model's held-out accuracy with each head, each layer or each whole block
  disabled (`disabling_sweeps`), and how many of them improve it.

`fine_tuning_effects` runs all three on held-out batches of a classification task;
`effects_record` writes them as a result file keeps them, with each held-out sentence's
correctness under every mask as a string of 0s and 1s (`bits`), which `disabling_correct` reads
back and `disabling_gains` turns into the improvement counts on resamples of the sentences.
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
) -> tuple[dict[str, ablation.AblationResult], dict[str, Any]]:
  """Held-out accuracy with each head, each layer, or each whole block disabled, and each
  sentence's correctness (`ablation.classification_correct`) under every mask.

  Heads and layers are disabled in "uniform" mode (Kovaleva et al.'s method: the map becomes
  uniform over the real tokens); whole layers also in "scale" mode (the heads' outputs
  zeroed, as Michel et al.); "layer_skip" replaces a block by the identity. Single heads in
  "scale" mode are left out: they would double the longest sweep.

  Args:
    params, config: the fine-tuned classifier.
    batches: held-out batches with `labels`.
    strategy: `ablation.ablation_sweep`'s (e.g. "vmap": one program per mode).

  Returns:
    `(results, correct)`: "uniform" and "scale" -> `ablation.AblationResult` (the means of
    the correctness; what a mode does not evaluate is NaN), and the correctness as uint8 0/1:
    "baseline" (sentences,), and "uniform" and "scale" -> family ("heads", "layers",
    "layer_skip") -> (masks, sentences), heads layer-major as `ablation.sweep_masks`'.
  """
  depth, n = config.depth, config.num_attention_heads
  results, correct = {}, {}
  for kind, include in (("uniform", ("heads", "layers", "layer_skip")), ("scale", ("layers",))):
    base, rows = ablation.sweep_per_row(
      params,
      config,
      batches,
      ablation.classification_correct,
      head_ablation=kind,
      include=include,
      chunk_size=1,
      strategy=strategy,
    )
    means = {k: v.mean(1) for k, v in rows.items()}
    results[kind] = ablation.AblationResult(
      head_ablation=kind,
      baseline=float(base.mean()),
      heads=means.get("heads", np.full(depth * n, np.nan)).reshape(depth, n),
      layers=means.get("layers", np.full(depth, np.nan)),
      keep_one=np.full((depth, n), np.nan),
      layer_skip=means.get("layer_skip", np.full(depth, np.nan)),
    )
    correct["baseline"] = (base > 0.5).astype(np.uint8)
    correct[kind] = {k: (v > 0.5).astype(np.uint8) for k, v in rows.items()}
  return results, correct


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
    intact accuracy's binomial standard error), `correct` (`disabling_sweeps`' per-sentence
    correctness) and `seconds` (each measurement's wall time).
  """
  seconds = {}
  t0 = time.perf_counter()
  types = lambda p: patterns.pattern_types(p, config, analysis, special_ids=special_ids)
  before, after = types(pre_params).summary(), types(params).summary()
  seconds["patterns"], t0 = time.perf_counter() - t0, time.perf_counter()
  change = patterns.attention_change(pre_params, config, params, analysis)
  seconds["attention_change"], t0 = time.perf_counter() - t0, time.perf_counter()
  sweeps, correct = disabling_sweeps(params, config, held, strategy=strategy)
  acc = {m: r.improvements() for m, r in sweeps.items()}
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
    "correct": correct,
    "seconds": seconds,
  }


def effects_record(m: dict[str, Any]) -> dict[str, Any]:
  """`fine_tuning_effects`' result `m` as a result file records it: "patterns" (the pattern
  types before and after without their per-head counts, each head's dominant type before
  and after, and how many heads changed it; each sentence's maps per type, `per_sequence`),
  "ablation" (the sweeps' accuracies with the intact accuracy's standard error, and
  `per_example`: each held-out sentence's correctness as `bits`, "correct_baseline" and
  "correct_MODE_FAMILY" such as "correct_uniform_heads" (layers, heads)) and
  "attention_change" (cosine and CKA per head, the cosine's layer means, and each sentence's
  layer means, `per_sentence_layer_cosine`: what the Findings' intervals resample)."""
  before, after, change = m["before"], m["after"], m["change"]
  per_example = {}
  if "correct" in m:
    c, shape = m["correct"], np.shape(m["acc"]["uniform"]["delta_heads"])
    per_example["correct_baseline"] = bits(c["baseline"])
    for mode in ("uniform", "scale"):
      for family, rows in c[mode].items():
        rows = rows.reshape(*shape, -1) if family == "heads" else rows
        per_example[f"correct_{mode}_{family}"] = bits(rows)
  drop = ("counts", "dominant")
  return {
    "patterns": {
      "before": {k: v for k, v in before.items() if k not in drop},
      "after": {k: v for k, v in after.items() if k not in drop},
      "dominant_before": before["dominant"],
      "dominant_after": after["dominant"],
      "dominant_changed_heads": int((before["dominant"] != after["dominant"]).sum()),
    },
    "ablation": {
      "metric": "held-out accuracy",
      **m["acc"],
      "accuracy_standard_error": m["se"],
      **({"per_example": per_example} if per_example else {}),
    },
    "attention_change": {
      "cosine": change.cosine,
      "layer_cosine": layer_means(change.cosine),
      "cka": change.cka,
      "per_sentence_layer_cosine": change.per_sequence,
    },
  }


# Per-sentence correctness, as a result file keeps it ------------------------------------------


def bits(correct) -> str | list:
  """A (..., sentences) array of 0/1 as one string of "0"s and "1"s per sentence row: a string
  for a 1-d array, nested lists of them otherwise (a result file's compact form)."""
  a = np.asarray(correct)
  if a.ndim == 1:
    return "".join("1" if x else "0" for x in a)
  return [bits(row) for row in a]


def from_bits(text) -> np.ndarray:
  """`bits` read back: the (..., sentences) uint8 array of 0s and 1s."""
  if isinstance(text, str):
    return np.frombuffer(text.encode(), np.uint8) - ord("0")
  return np.stack([from_bits(t) for t in text])


def disabling_correct(record: dict) -> dict[str, np.ndarray] | None:
  """Each held-out sentence's correctness in uniform mode from a result file's "ablation"
  record (`effects_record`), the sentences first: "baseline" (n,), "heads" (n, layers,
  heads), "layers" (n, layers), and "pair" (n,), each sentence's minimal pair where the
  record keeps it (else each sentence its own); None where it keeps no `per_example`."""
  ex = record.get("per_example")
  if ex is None:
    return None
  base = from_bits(ex["correct_baseline"])
  return {
    "baseline": base,
    "heads": np.moveaxis(from_bits(ex["correct_uniform_heads"]), -1, 0),
    "layers": np.moveaxis(from_bits(ex["correct_uniform_layers"]), -1, 0),
    "pair": np.asarray(ex.get("pair", np.arange(len(base))), np.int64),
  }


def by_group(x, group) -> np.ndarray:
  """(groups, size, ...): the rows of `x` (n, ...) gathered by `group` (n,), every group the
  same size (each minimal pair's two sentences), so a bootstrap resamples whole groups."""
  x, group = np.asarray(x), np.asarray(group)
  sizes = sorted(set(np.unique(group, return_counts=True)[1].tolist()))
  if len(group) != len(x) or len(sizes) != 1:
    raise ValueError(
      f"{len(group)} group ids for {len(x)} rows, group sizes {sizes}: need one id per row "
      "and groups of one size"
    )
  return x[np.argsort(group, kind="stable")].reshape(-1, sizes[0], *x.shape[1:])


def disabling_gains(baseline, heads, layers, *, n: int) -> dict[str, np.ndarray]:
  """`AblationResult.improvements`' counts from accuracies on R resamples of the sentences.

  Args:
    baseline: (R,) the intact accuracy.
    heads: (R, layers, heads) the accuracy with each head disabled.
    layers: (R, layers) with each layer disabled.
    n: the sentences, for the intact accuracy's binomial standard error.

  Returns:
    (R,) arrays named as `improvements` names them: "heads_improving" and "layers_improving"
    (deltas above 1e-9, as it counts them), "best_head_delta" and "best_layer_delta"; and
    "standard_error", `sqrt(baseline (1 - baseline) / n)`.
  """
  base = np.asarray(baseline, np.float64)
  dh = np.asarray(heads, np.float64).reshape(len(base), -1) - base[:, None]
  dl = np.asarray(layers, np.float64).reshape(len(base), -1) - base[:, None]
  return {
    "heads_improving": (dh > 1e-9).sum(-1),
    "layers_improving": (dl > 1e-9).sum(-1),
    "best_head_delta": dh.max(-1),
    "best_layer_delta": dl.max(-1),
    "standard_error": np.sqrt(base * (1 - base) / n),
  }
