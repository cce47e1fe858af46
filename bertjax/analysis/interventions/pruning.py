"""Michel et al. 2019's head-pruning study: per-head significance, pruning curves, speed-ups.

`ablation` gives the masks and their metrics; this module runs the study built on them:

* `head_ablation_tests`: each head, each layer's heads, and all heads of a layer but one
  removed (Michel's Tables 1 and 2), each single head tested against the intact model on
  the same examples (exact McNemar for correctness, Wilcoxon signed-rank for the loss);
* `pruning_curves`: held-out loss and accuracy against the fraction of heads masked, by
  iterative importance pruning, by static importance orders and by random orders;
* `head_study`: the three stages on one task (importance, `head_ablation_tests`,
  `pruning_curves`), as `experiments/sixteen_heads.py` runs them;
* `pruned_speedups`: the measured speed-up of physically pruned models (`prune_heads`)
  over the intact one, timed side by side, with the check that each pruned model's
  outputs equal the head-masked model's.

The statistics the claims read (`one_head_enough`, `max_fraction_within_tolerance`,
`curve_areas`, `median_speedups`) take any leading axes, so an interval over the test
examples (`per_example_correct`) or the timing rounds (`round_times`) computes them on every
resample at once.

A **row function** `row_fn(params, config, batch, last_hidden_state, pooled) -> (B, 2)` gives
each example's loss and correctness (1.0 or 0.0), as `bertjax.tasks.negation_probe.task_rows`
does; it is what `ablation.evaluate_masks_per_row` evaluates under every mask.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from bertjax import stats, timing
from bertjax.analysis.interventions import ablation
from bertjax.model.config import BertConfig
from bertjax.model.forward import count_params, forward
from bertjax.model.prune import heads_of_mask, prune_heads

Params = dict[str, Any]


def _losses_and_correct(params, config, batches, row_fn, masks, chunk_size, strategy):
  """Per-example loss and correctness under each mask: two (M, examples) arrays."""
  _, rows = ablation.evaluate_masks_per_row(
    params, config, batches, row_fn, masks, chunk_size=chunk_size, strategy=strategy
  )
  if rows.ndim != 3 or rows.shape[-1] != 2:
    raise ValueError(
      f"row_fn must return (batch, 2) rows of loss and correctness, got {rows.shape[1:]}"
    )
  return rows[..., 0], rows[..., 1] > 0.5


def head_ablation_tests(
  params: Params,
  config: BertConfig,
  batches: Sequence,
  row_fn: Callable,
  *,
  alpha: float = 0.01,
  chunk_size: int | None = None,
  strategy: str = "prefix",
) -> dict[str, Any]:
  """Held-out loss and accuracy with each head, each layer's heads and all heads of a layer
  but one removed, and a paired test of every single head against the intact model.

  A head's removal is a significant accuracy drop when the exact McNemar test on the
  examples' correctness gives p < `alpha` and the accuracy fell (Michel et al.'s Table 1),
  a significant loss rise when the Wilcoxon signed-rank test on the examples' losses gives
  p < `alpha` and the mean loss rose.

  Args:
    params, config: the model (with whatever head `row_fn` reads).
    batches: the held-out batches (as `ablation.evaluate_masks`).
    row_fn: per-example (loss, correctness), see the module docstring.
    alpha: the tests' level, in (0, 1).
    chunk_size, strategy: as `ablation.evaluate_masks`.

  Returns:
    `baseline_loss`, `baseline_accuracy`; (layers, heads) `head_loss`, `head_accuracy`,
    `keep_one_loss`, `keep_one_accuracy` (all heads of layer l but h removed),
    `head_accuracy_p_mcnemar`, `head_loss_p_wilcoxon`; (layers,) `layer_heads_loss`,
    `layer_heads_accuracy`; the counts `significant_accuracy_drops`,
    `significant_loss_rises`, `heads_removable_alone` (heads without a significant drop),
    `heads_improving_accuracy`; `max_single_head_accuracy_drop` and `num_test`; and
    `per_example`, each test example's correctness (0/1): `correct_baseline` (n,) and
    `correct_keep_one` (layers, heads, n).
  """
  if not 0 < alpha < 1:
    raise ValueError(f"alpha={alpha} must be in (0, 1)")
  shape = (config.depth, config.num_attention_heads)
  n = shape[0] * shape[1]
  sweep = ablation.sweep_masks(config, ("heads", "layers", "keep_one"))
  masks = np.concatenate(
    [np.ones((1, *shape), np.float32), sweep["heads"][0], sweep["layers"][0], sweep["keep_one"][0]]
  )
  loss, correct = _losses_and_correct(params, config, batches, row_fn, masks, chunk_size, strategy)
  mean_loss, mean_acc = loss.mean(1), correct.mean(1)
  base_loss, base_acc = float(mean_loss[0]), float(mean_acc[0])
  heads, layers, keep_one = (
    slice(1, n + 1),
    slice(n + 1, n + 1 + shape[0]),
    slice(n + 1 + shape[0], None),
  )
  p_acc = np.array([stats.mcnemar_p(correct[0], c) for c in correct[heads]])
  p_loss = np.array([stats.wilcoxon_p(loss[0], x) for x in loss[heads]])
  drops = (p_acc < alpha) & (mean_acc[heads] < base_acc)
  rises = (p_loss < alpha) & (mean_loss[heads] > base_loss)
  return {
    "baseline_loss": base_loss,
    "baseline_accuracy": base_acc,
    "head_loss": mean_loss[heads].reshape(shape),
    "head_accuracy": mean_acc[heads].reshape(shape),
    "layer_heads_loss": mean_loss[layers],
    "layer_heads_accuracy": mean_acc[layers],
    "keep_one_loss": mean_loss[keep_one].reshape(shape),
    "keep_one_accuracy": mean_acc[keep_one].reshape(shape),
    "head_accuracy_p_mcnemar": p_acc.reshape(shape),
    "head_loss_p_wilcoxon": p_loss.reshape(shape),
    "significant_accuracy_drops": int(drops.sum()),
    "significant_loss_rises": int(rises.sum()),
    "heads_removable_alone": int(n - drops.sum()),
    "heads_improving_accuracy": int((mean_acc[heads] > base_acc).sum()),
    "max_single_head_accuracy_drop": float(base_acc - mean_acc[heads].min()),
    "num_test": int(correct.shape[1]),
    "per_example": {  # 0/1 per test example: what an interval over the examples resamples
      "correct_baseline": correct[0].astype(np.int8),
      "correct_keep_one": correct[keep_one].reshape(*shape, -1).astype(np.int8),
    },
  }


def pruning_curves(
  params: Params,
  config: BertConfig,
  train: Sequence,
  test: Sequence,
  loss_fn: Callable,
  row_fn: Callable,
  importance_raw,
  importance_normalized,
  *,
  step: float = 0.1,
  max_fraction: float = 0.9,
  random_orders: int = 8,
  seed: int = 0,
  tolerance: float = 0.02,
  chunk_size: int | None = None,
  strategy: str = "prefix",
) -> dict[str, Any]:
  """Held-out accuracy and loss against the fraction of heads masked, four ways.

  Michel et al.'s iterative pruning (`ablation.iterative_pruning`, importance re-estimated
  on `train` after each step), the static orders of the normalised and raw importance, and
  `random_orders` random orders; every curve is scored on `test` at the iterative run's head
  counts, in one `ablation.evaluate_masks_per_row` pass.

  Args:
    params, config: the model.
    train, test: batches for importance and for scoring.
    loss_fn: the differentiable `(total, count)` loss importance is the gradient of.
    row_fn: per-example (loss, correctness), see the module docstring.
    importance_raw, importance_normalized: (layers, heads) static importance scores.
    step, max_fraction: as `ablation.iterative_pruning`.
    random_orders: how many random orders (seeded by `seed`).
    tolerance: the accuracy drop that still counts as none.
    chunk_size, strategy: as `ablation.evaluate_masks`.

  Returns:
    `fractions`, `heads_masked`, `train_loss_iterative` (the run's training loss),
    `accuracy` and `loss` (each `{"iterative", "static_normalized", "static_raw": (steps,),
    "random": (orders, steps)}`), `masks_iterative`, `tolerance`,
    `max_fraction_within_tolerance` (the largest fraction with the iterative accuracy within
    `tolerance` of the intact model at every step so far), and the mean accuracy over the
    curve, `mean_accuracy_over_curve` (per named curve) and `mean_accuracy_over_curve_random`;
    `per_example["correct"]`, each test example's correctness (0/1) along every curve, shaped
    as `accuracy` with the examples last.
  """
  if random_orders < 1:
    raise ValueError(f"random_orders={random_orders} must be at least 1")
  shape = (config.depth, config.num_attention_heads)
  for name, imp in (
    ("importance_raw", importance_raw),
    ("importance_normalized", importance_normalized),
  ):
    if np.shape(imp) != shape:
      raise ValueError(f"{name} shape {np.shape(imp)} must be (layers, heads)={shape}")
  run = ablation.iterative_pruning(
    params, config, train, loss_fn, step=step, max_fraction=max_fraction, chunk_size=chunk_size
  )
  counts = np.rint(run.fractions * shape[0] * shape[1]).astype(int)
  rng = np.random.default_rng(seed)
  curves = {
    "iterative": run.masks,
    "static_normalized": ablation.order_masks(
      np.argsort(np.ravel(importance_normalized), kind="stable"), counts, shape
    ),
    "static_raw": ablation.order_masks(
      np.argsort(np.ravel(importance_raw), kind="stable"), counts, shape
    ),
  }
  randoms = [
    ablation.order_masks(rng.permutation(shape[0] * shape[1]), counts, shape)
    for _ in range(random_orders)
  ]
  loss, correct = _losses_and_correct(
    params, config, test, row_fn, np.concatenate([*curves.values(), *randoms]), chunk_size, strategy
  )
  k = len(counts)

  def split(values):
    named = {name: values[i * k : (i + 1) * k] for i, name in enumerate(curves)}
    named["random"] = values[len(curves) * k :].reshape(random_orders, k, *values.shape[1:])
    return named

  acc, losses = split(correct.mean(1)), split(loss.mean(1))
  keep = float(max_fraction_within_tolerance(run.fractions, acc["iterative"], tolerance))
  return {
    "fractions": run.fractions,
    "heads_masked": counts,
    "train_loss_iterative": run.metrics,
    "accuracy": acc,
    "loss": losses,
    "masks_iterative": run.masks,
    "tolerance": tolerance,
    "max_fraction_within_tolerance": keep,
    "mean_accuracy_over_curve": {
      name: stats.curve_area(run.fractions, v) for name, v in acc.items() if name != "random"
    },
    "mean_accuracy_over_curve_random": [stats.curve_area(run.fractions, v) for v in acc["random"]],
    "per_example": {  # 0/1 per test example along each curve: (steps, n), random (orders, steps, n)
      "correct": {k: v.astype(np.int8) for k, v in split(correct).items()},
    },
  }


def importance_agreement(importance_raw, importance_normalized, tests: Mapping) -> dict:
  """Head importance, raw and normalised, and how far the two and the single-head ablations
  rank the heads alike (Michel et al. use importance as a cheap stand-in for ablating heads).

  Args:
    importance_raw, importance_normalized: (layers, heads) scores (`ablation.head_importance`,
      `ablation.layer_normalized`).
    tests: `head_ablation_tests` on the same model.

  Returns:
    `normalized`, `raw`, and the Spearman correlations of the normalised scores with the raw
    ones, `spearman_normalized_vs_raw`, and with each head's held-out loss change when removed
    alone, `spearman_vs_single_ablation_loss`.
  """
  loss_change = tests["head_loss"] - tests["baseline_loss"]
  return {
    "normalized": importance_normalized,
    "raw": importance_raw,
    "spearman_normalized_vs_raw": stats.spearman(importance_normalized, importance_raw),
    "spearman_vs_single_ablation_loss": stats.spearman(importance_normalized, loss_change),
  }


def head_study(
  params: Params,
  config: BertConfig,
  train: Sequence,
  test: Sequence,
  loss_fn: Callable,
  row_fn: Callable,
  *,
  alpha: float = 0.01,
  step: float = 0.1,
  max_fraction: float = 0.9,
  random_orders: int = 8,
  seed: int = 0,
  chunk_size: int | None = None,
  stage: Callable[[str], contextlib.AbstractContextManager] | None = None,
  log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
  """Michel et al.'s study of a model's heads on one task, in three stages: head importance on
  `train` (`ablation.head_importance`, raw and normalised per layer), the single-head tests on
  `test` (`head_ablation_tests`) and the pruning curves (`pruning_curves`).

  Args:
    params, config, train, test, loss_fn, row_fn: as `pruning_curves`.
    alpha: as `head_ablation_tests`.
    step, max_fraction, random_orders, seed, chunk_size: as `pruning_curves`.
    stage: `stage(name)` gives a context manager around each stage, "importance", "ablation"
      and "pruning" (as `bertjax.study.timed` to time them); None: none.
    log: where a line on the ablation's and the pruning's outcome goes; None: nowhere.

  Returns:
    `importance` (`importance_agreement`), `ablation` (`head_ablation_tests`) and `pruning`
    (`pruning_curves`).
  """
  stage = stage or (lambda name: contextlib.nullcontext())
  log = log or (lambda line: None)
  with stage("importance"):
    raw = ablation.head_importance(params, config, train, loss_fn, normalize_layers=False)
    normalized = ablation.layer_normalized(raw)  # Michel's per-layer L2 normalisation
  with stage("ablation"):
    tests = head_ablation_tests(params, config, test, row_fn, alpha=alpha, chunk_size=chunk_size)
    log(f"single heads: {tests['significant_accuracy_drops']} significant accuracy drops")
  with stage("pruning"):
    curves = pruning_curves(
      params,
      config,
      train,
      test,
      loss_fn,
      row_fn,
      raw,
      normalized,
      step=step,
      max_fraction=max_fraction,
      random_orders=random_orders,
      seed=seed,
      chunk_size=chunk_size,
    )
    log(f"pruning: iterative accuracy {np.round(curves['accuracy']['iterative'], 3).tolist()}")
  importance = importance_agreement(raw, normalized, tests)
  return {"importance": importance, "ablation": tests, "pruning": curves}


# Statistics of the results --------------------------------------------------------------------
# On the arrays the studies above return, over any leading axes: a Findings interval computes
# them on every bootstrap resample at once (`bertjax.claims.Claim.judge`).


def one_head_enough(baseline_accuracy, keep_one_accuracy, tolerance: float) -> np.ndarray:
  """Michel et al.'s Table 2 per layer: whether keeping only the layer's best head stays within
  `tolerance` of the intact model's accuracy.

  Args:
    baseline_accuracy: (...) the intact model's accuracy.
    keep_one_accuracy: (..., layers, heads) the accuracy with all heads of layer l but h
      removed (`head_ablation_tests`' `keep_one_accuracy`).
    tolerance: the accuracy drop that still counts as none.

  Returns:
    (..., layers) booleans.
  """
  best = np.max(keep_one_accuracy, -1)
  return best >= np.asarray(baseline_accuracy)[..., None] - tolerance


def max_fraction_within_tolerance(fractions, accuracy, tolerance: float) -> np.ndarray:
  """How far pruning goes before its first noticeable drop: the largest fraction of heads
  masked with the accuracy within `tolerance` of the intact model's at every step so far.

  Args:
    fractions: (steps,) the fractions masked, 0 (the intact model) first.
    accuracy: (..., steps) the accuracy along each curve.
    tolerance: the accuracy drop that still counts as none.

  Returns:
    (...) fractions, one per curve.
  """
  accuracy = np.asarray(accuracy)
  ok = accuracy >= accuracy[..., :1] - tolerance
  first_out = np.where(ok.all(-1), ok.shape[-1], np.argmin(ok, -1))
  return np.asarray(fractions)[first_out - 1]


def curve_areas(fractions, values) -> np.ndarray:
  """`stats.curve_area` of every curve along the last axis of `values` (..., steps): each
  curve's mean height over `fractions`, (...)."""
  x, y = np.asarray(fractions, np.float64), np.asarray(values, np.float64)
  return ((y[..., 1:] + y[..., :-1]) / 2 * np.diff(x)).sum(-1) / (x[-1] - x[0])


def per_example_correct(tests: Mapping, curves: Mapping) -> dict[str, np.ndarray] | None:
  """Each test example's correctness (0.0 or 1.0) under every mask, the examples first, as an
  interval over the examples resamples them.

  Args:
    tests: a `head_ablation_tests` result (as read back from JSON, too).
    curves: a `pruning_curves` result.

  Returns:
    `baseline` (n,) and `keep_one` (n, layers, heads) from `tests`; `iterative` (n, steps)
    and `random` (n, orders, steps) from `curves`; None where either keeps no `per_example`
    (results written before they did).
  """
  ex, c = tests.get("per_example"), curves.get("per_example")
  if ex is None or c is None:
    return None
  return {
    "baseline": np.asarray(ex["correct_baseline"], np.float64),
    "keep_one": np.moveaxis(np.asarray(ex["correct_keep_one"], np.float64), -1, 0),
    "iterative": np.asarray(c["correct"]["iterative"], np.float64).T,
    "random": np.moveaxis(np.asarray(c["correct"]["random"], np.float64), -1, 0),
  }


# Speed ------------------------------------------------------------------------------------


def pruned_vs_masked(params: Params, config: BertConfig, head_mask, ids, attention_mask):
  """Physically prunes the zeros of `head_mask`.

  Returns:
    `(pruned config, pruned params, max |pruned - masked|)`: the largest difference of the
    last hidden states at real tokens between the pruned model and the head-masked one.
  """
  pconfig, pparams = prune_heads(config, params, heads_of_mask(head_mask))
  masked = forward(params, config, ids, attention_mask, head_mask=head_mask).last_hidden_state
  pruned = forward(pparams, pconfig, ids, attention_mask).last_hidden_state
  real = np.asarray(attention_mask, bool)
  return pconfig, pparams, float(np.abs(np.asarray(pruned) - np.asarray(masked))[real].max())


def time_forwards(
  models: Mapping[str, tuple], ids, attention_mask, repeats: int
) -> dict[str, dict]:
  """Forward-pass times of `name -> (config, params, head_mask or None)`, side by side
  (`timing.interleaved`: compile apart in `first_call_s`, one warm-up, `repeats` rounds in a
  rotating order).

  Returns:
    `{name: {"first_call_s", "times_s": [one per round], "median_s", "min_s"}}`.
  """

  def call(config, params, head_mask):
    return lambda: (
      forward(params, config, ids, attention_mask, head_mask=head_mask).last_hidden_state
    )

  return timing.interleaved({k: call(*m) for k, m in models.items()}, repeats)


def pruned_speedups(
  params: Params,
  config: BertConfig,
  ids,
  attention_mask,
  order,
  *,
  targets: Sequence[float] = (0.2, 0.4, 0.6),
  masked_fraction: float = 0.4,
  repeats: int = 15,
) -> dict[str, Any]:
  """The inference speed-up of physically pruned models over the intact one.

  For each target fraction, the first heads of the flat `order` (least important first, as
  `ablation.pruning_order` gives) are removed by `prune_heads`; a head-masked model at
  `masked_fraction` (every head still computed, some scaled by 0) is timed beside them.

  Args:
    params, config: the model.
    ids, attention_mask: the (B, T) batch every model runs on.
    order: a permutation of the layers x heads flat head indices.
    targets: fractions of heads to remove, each in (0, 1); the models are named
      `pruned_{target:.1f}`, so targets must differ at one decimal.
    masked_fraction: the head-masked model's fraction.
    repeats: timed rounds (`time_forwards`).

  Returns:
    `fractions` and `heads_removed` (what each target rounds to), `targets`, `times`
    (`time_forwards`), `speedup` (median time ratios) and `speedup_fastest` (fastest-round
    ratios) per target, `speedup_masked` and `speedup_masked_fastest`,
    `max_abs_diff_pruned_vs_masked` per target, `parameters` per model, `repeats`,
    `backend` and `real_tokens`.
  """
  shape = (config.depth, config.num_attention_heads)
  total = shape[0] * shape[1]
  order = np.asarray(order)
  if sorted(order.tolist()) != list(range(total)):
    raise ValueError(f"order must be a permutation of the {total} flat head indices")
  for f in (*targets, masked_fraction):
    if not 0 < f < 1:
      raise ValueError(f"every fraction must be in (0, 1), got {f}")
  if len({_pruned(t) for t in targets}) < len(targets):
    raise ValueError(
      f"targets={tuple(targets)} must differ at one decimal (models are named by it)"
    )
  models = {"unpruned": (config, params, None)}
  fractions, removed, diffs = [], [], []
  for target in targets:
    k = round(target * total)
    mask = ablation.order_masks(order, [k], shape)[0]
    pconfig, pparams, diff = pruned_vs_masked(params, config, mask, ids, attention_mask)
    models[_pruned(target)] = (pconfig, pparams, None)
    fractions.append(k / total)
    removed.append(k)
    diffs.append(diff)
  masked = f"masked_{masked_fraction:.1f}"
  models[masked] = (
    config,
    params,
    ablation.order_masks(order, [round(masked_fraction * total)], shape)[0],
  )
  times = time_forwards(models, ids, attention_mask, repeats)
  median = {name: v["median_s"] for name, v in times.items()}
  fastest = {name: v["min_s"] for name, v in times.items()}  # the least disturbed round
  pruned = [_pruned(t) for t in targets]
  return {
    "fractions": fractions,
    "heads_removed": removed,
    "targets": tuple(targets),
    "repeats": repeats,
    "backend": jax.default_backend(),
    "times": times,
    "speedup": [median["unpruned"] / median[p] for p in pruned],
    "speedup_fastest": [fastest["unpruned"] / fastest[p] for p in pruned],
    "speedup_masked": median["unpruned"] / median[masked],
    "speedup_masked_fastest": fastest["unpruned"] / fastest[masked],
    "max_abs_diff_pruned_vs_masked": diffs,
    "parameters": {name: int(count_params(p)) for name, (_, p, _) in models.items()},
    "real_tokens": int(np.asarray(attention_mask).sum()),
  }


def _pruned(target: float) -> str:
  """The name of the model with fraction `target` of its heads removed, in `pruned_speedups`."""
  return f"pruned_{target:.1f}"


def round_times(speedups: Mapping[str, Any]) -> np.ndarray:
  """The seconds of every timed round of a `pruned_speedups` result, (rounds, 1 + targets): the
  unpruned model first, then each pruned one. The models ran side by side, round by round, so
  a round is one paired sample: an interval over them resamples whole rounds."""
  names = ["unpruned", *(_pruned(t) for t in speedups["targets"])]
  return np.asarray([speedups["times"][k]["times_s"] for k in names], np.float64).T


def median_speedups(times) -> np.ndarray:
  """Each pruned model's speed-up over the unpruned one, the ratio of their median times, from
  `round_times` (..., rounds, 1 + targets): (..., targets)."""
  median = np.median(times, -2)
  return median[..., :1] / median[..., 1:]
