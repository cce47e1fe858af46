"""Head and layer ablation, head importance, iterative pruning and attention overrides.

Everything here is a function of `(params, config, batches, metric_fn)`:

* A **batch** is a mapping (or a dataclass such as `bertjax.Batch`) with
  `input_ids` (B, T) and optionally `attention_mask`, `token_type_ids` and any
  extra arrays a metric needs (`labels` ...). Padding must be right padding.
* A **metric function** `metric_fn(params, config, batch, last_hidden_state,
  pooled) -> (total, count)` is pure JAX; totals and counts are summed over
  batches and the reported value is `sum(total) / sum(count)`. It is a static
  argument of `jax.jit`, so pass the same function object each time (a
  module-level function, not a fresh lambda) to reuse compilations. The batch it
  receives also holds `BASELINE_KEY`: the unablated last hidden state, so a
  metric can compare an ablated model with the intact one
  (`mean_embedding_cosine`).

Ablation sweeps (Michel et al. 2019; Kovaleva et al. 2019) vectorise over masks
with `jax.vmap`, chunked by `jax.lax.map(..., batch_size=chunk_size)` so memory
stays bounded, and reuse the unablated computation below the ablated layer:
every mask whose first modified block is `l` starts from the stored input of
block `l` of the intact forward pass. Head importance is `jax.grad` of the loss
with respect to the head mask; overrides (Raganato et al. 2020) replace chosen
heads' attention with fixed positional patterns.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import stats
from bertjax.analysis import sharded
from bertjax.analysis.batching import (
  BASELINE_KEY,
  as_batch,
  default_chunk_size,
  embed_batch,
  first_modified_layer,
)
from bertjax.kernels import ABLATIONS  # the head_ablation values, defined once in kernels
from bertjax.model.config import BertConfig
from bertjax.model.forward import BertOutput, run_layers
from bertjax.model.heads import head_logits, pool
from bertjax.model.layers import compute_dtype

Params = dict[str, Any]
MetricFn = Callable[..., tuple[jax.Array, jax.Array]]
STRATEGIES = ("prefix", "vmap", "loop")


# Masks ----------------------------------------------------------------------


def _check_masks(config: BertConfig, head_masks, layer_masks):
  head_masks = np.asarray(head_masks, np.float32)
  shape = (config.depth, config.num_attention_heads)
  if head_masks.ndim != 3 or head_masks.shape[1:] != shape:
    raise ValueError(
      f"head_masks shape {head_masks.shape} must be (masks, layers, heads)="
      f"(M, {shape[0]}, {shape[1]})"
    )
  if layer_masks is None:
    layer_masks = np.ones(head_masks.shape[:2], np.float32)
  layer_masks = np.asarray(layer_masks, np.float32)
  if layer_masks.shape != head_masks.shape[:2]:
    raise ValueError(
      f"layer_masks shape {layer_masks.shape} must be (masks, layers)={head_masks.shape[:2]}"
    )
  return head_masks, layer_masks


# Metrics --------------------------------------------------------------------


def _classifier_logits(params, config, last_hidden_state, pooled):
  out = BertOutput(last_hidden_state=last_hidden_state, pooler_output=pooled)
  return head_logits(params, config, out, "classifier")


def classification_batch_loss(params, config, batch, last_hidden_state, pooled):
  """Metric function: the `classifier` head's cross-entropy on `batch["labels"]` (B,), summed.

  Returns `(sum, count)`. Not `training.losses.classification_loss` (a mean of given logits).
  """
  logits = _classifier_logits(params, config, last_hidden_state, pooled)
  logits = logits.astype(jnp.float32 if config.dtype != "float64" else jnp.float64)
  logp = jax.nn.log_softmax(logits)
  nll = -jnp.take_along_axis(logp, batch["labels"][:, None].astype(jnp.int32), -1)[:, 0]
  return nll.sum(), jnp.asarray(nll.shape[0], nll.dtype)


def classification_accuracy(params, config, batch, last_hidden_state, pooled):
  """Accuracy of the `classifier` head on `batch["labels"]` (B,): (correct, count)."""
  pred = _classifier_logits(params, config, last_hidden_state, pooled).argmax(-1)
  correct = (pred == batch["labels"]).astype(jnp.float32)
  return correct.sum(), jnp.asarray(correct.shape[0], jnp.float32)


def classification_correct(params, config, batch, last_hidden_state, pooled):
  """Row function: 1.0 where the `classifier` head's prediction is `batch["labels"]` (B,), else
  0.0; the rows `classification_accuracy` sums (`evaluate_masks_per_row`, `sweep_per_row`)."""
  pred = _classifier_logits(params, config, last_hidden_state, pooled).argmax(-1)
  return (pred == batch["labels"]).astype(jnp.float32)


def mlm_batch_loss(params, config, batch, last_hidden_state, pooled):
  """Metric function: masked-LM cross-entropy on `batch["labels"]` (B, T), summed.

  -100 marks a position not predicted. Returns `(sum, count)`. Not `training.losses.mlm_loss`
  (a mean over gathered positions).
  """
  from bertjax.model.heads import mlm_logits

  labels = batch["labels"].astype(jnp.int32)
  logits = mlm_logits(params, config, last_hidden_state)
  logp = jax.nn.log_softmax(logits.astype(jnp.promote_types(logits.dtype, jnp.float32)))
  keep = labels >= 0
  nll = -jnp.take_along_axis(logp, jnp.where(keep, labels, 0)[..., None], -1)[..., 0]
  return jnp.where(keep, nll, 0).sum(), keep.sum().astype(nll.dtype)


def token_reconstruction_loss(params, config, batch, last_hidden_state, pooled):
  """Cross-entropy of each real input token from its own final state: (sum, count).

  Logits are the final hidden state times the word-embedding matrix (the tied
  decoder without the MLM transform), so it needs no task head: a
  self-supervised, differentiable loss for checkpoints without an MLM head
  (sentence encoders). Needs `embedding_size == hidden_size`.
  """
  word = params["embeddings"]["word_embeddings"]["embedding"]
  if word.shape[-1] != last_hidden_state.shape[-1]:
    raise ValueError(
      f"word embeddings width {word.shape[-1]} != hidden width "
      f"{last_hidden_state.shape[-1]} (a factorised embedding: ALBERT, ELECTRA "
      "with embedding_size != hidden_size); use mlm_batch_loss"
    )
  dtype = jnp.promote_types(last_hidden_state.dtype, jnp.float32)
  logits = jnp.einsum("bth,vh->btv", last_hidden_state, word.astype(last_hidden_state.dtype))
  logp = jax.nn.log_softmax(logits.astype(dtype))
  nll = -jnp.take_along_axis(logp, batch["input_ids"][..., None].astype(jnp.int32), -1)[..., 0]
  keep = batch["attention_mask"] > 0
  return jnp.where(keep, nll, 0).sum(), keep.sum().astype(dtype)


def mean_embedding_cosine(params, config, batch, last_hidden_state, pooled):
  """Cosine of the mean-pooled sentence embedding to the unablated one: (sum, count).

  Needs no task head (a sentence-transformers style metric); 1 means unchanged.
  """
  mask = batch["attention_mask"]
  a = stats.mean_pool(last_hidden_state.astype(jnp.float32), mask)
  b = stats.mean_pool(batch[BASELINE_KEY].astype(jnp.float32), mask)
  cos = (a * b).sum(-1) / (jnp.linalg.norm(a, axis=-1) * jnp.linalg.norm(b, axis=-1) + 1e-12)
  return cos.sum(), jnp.asarray(cos.shape[0], jnp.float32)


# Evaluating many masks -------------------------------------------------------


def _metric(params, config, batch, last, metric_fn):
  total, count = metric_fn(params, config, batch, last, pool(params, config, last))
  return jnp.asarray(total), jnp.asarray(count)


@functools.partial(jax.jit, static_argnames=("config", "metric_fn"))
def _baseline(params, config, batch, *, metric_fn):
  """Intact forward: block inputs (depth + 1, B, T, H), last state, metric."""
  x = embed_batch(params, config, batch)
  layers = run_layers(params, config, x, batch["attention_mask"], output_hidden_states=True)
  last, hidden = layers.last, layers.hidden_states
  inputs = jnp.concatenate([x[None], hidden])  # inputs[l] = input of block l
  batch = {**batch, BASELINE_KEY: last}
  return inputs, last, _metric(params, config, batch, last, metric_fn)


@functools.partial(
  jax.jit, static_argnames=("config", "metric_fn", "start", "head_ablation", "chunk_size")
)
def _suffix_metrics(
  params,
  config,
  batch,
  hidden_in,
  head_masks,
  layer_masks,
  *,
  start,
  head_ablation,
  metric_fn,
  chunk_size,
):
  """Blocks `start ..` from `hidden_in` for each of M masks, chunked vmap: (M,), (M,)."""

  def one(masks):
    hm, lm = masks
    last = run_layers(
      params,
      config,
      hidden_in,
      batch["attention_mask"],
      start=start,
      head_mask=hm,
      head_ablation=head_ablation,
      layer_mask=lm,
    ).last
    return _metric(params, config, batch, last, metric_fn)

  return jax.lax.map(one, (head_masks, layer_masks), batch_size=chunk_size)


@functools.partial(jax.jit, static_argnames=("config", "metric_fn", "head_ablation"))
def _full_metric(params, config, batch, head_mask, layer_mask, *, head_ablation, metric_fn):
  """One full forward pass with one mask (the naive loop's step)."""
  x = embed_batch(params, config, batch)
  last = run_layers(
    params,
    config,
    x,
    batch["attention_mask"],
    head_mask=head_mask,
    head_ablation=head_ablation,
    layer_mask=layer_mask,
  ).last
  return _metric(params, config, batch, last, metric_fn)


def _evaluate_batch(params, config, batch, metric_fn, mask_sets, chunk_size, strategy):
  """Per mask set, (totals (M,), counts (M,)) on one batch, plus the baseline's."""
  inputs, last, base = _baseline(params, config, batch, metric_fn=metric_fn)
  batch = {**batch, BASELINE_KEY: last}
  results = [None] * len(mask_sets)
  # Mask sets of one ablation kind run together, so each (kind, start) is one vmapped program.
  for kind in dict.fromkeys(kind for kind, _, _ in mask_sets):
    which = [i for i, (other, _, _) in enumerate(mask_sets) if other == kind]
    head_masks = np.concatenate([mask_sets[i][1] for i in which])
    layer_masks = np.concatenate([mask_sets[i][2] for i in which])
    m = len(head_masks)
    # (M,) for a metric's (total, count); (M, rows, ...) for `evaluate_masks_per_row`'s rows.
    totals, counts = np.zeros((m, *np.shape(base[0]))), np.zeros(m)
    if strategy == "loop":
      for i in range(m):
        t, c = _full_metric(
          params,
          config,
          batch,
          jnp.asarray(head_masks[i]),
          jnp.asarray(layer_masks[i]),
          head_ablation=kind,
          metric_fn=metric_fn,
        )
        totals[i], counts[i] = np.asarray(t, np.float64), float(c)
    else:
      starts = (
        first_modified_layer(head_masks, layer_masks) if strategy == "prefix" else np.zeros(m, int)
      )
      for start in np.unique(starts):
        idx = np.flatnonzero(starts == start)
        t, c = _suffix_metrics(
          params,
          config,
          batch,
          inputs[start],
          jnp.asarray(head_masks[idx]),
          jnp.asarray(layer_masks[idx]),
          start=int(start),
          head_ablation=kind,
          metric_fn=metric_fn,
          chunk_size=chunk_size,
        )
        totals[idx], counts[idx] = np.asarray(t, np.float64), np.asarray(c, np.float64)
    offsets = np.cumsum([0] + [len(mask_sets[i][1]) for i in which])
    for k, i in enumerate(which):
      results[i] = (totals[offsets[k] : offsets[k + 1]], counts[offsets[k] : offsets[k + 1]])
  return (np.asarray(base[0], np.float64), float(base[1])), results


def _checked_run(strategy, chunk_size, mask_sets) -> int:
  """The chunk size, after checking a run's strategy, chunk size and ablation kinds."""
  if strategy not in STRATEGIES:
    raise ValueError(f"{strategy=!r} must be one of {STRATEGIES}")
  chunk_size = default_chunk_size() if chunk_size is None else chunk_size
  if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
    raise ValueError(f"{chunk_size=!r} must be a positive int or None")
  for head_ablation, _, _ in mask_sets:
    if head_ablation not in ABLATIONS:
      raise ValueError(f"{head_ablation=!r} must be one of {ABLATIONS}")
  return chunk_size


def _evaluate(params, config, batches, metric_fn, mask_sets, chunk_size, strategy, mesh=None):
  chunk_size = _checked_run(strategy, chunk_size, mask_sets)
  if mesh is not None:
    return sharded.evaluate(
      params, config, batches, metric_fn, mask_sets, chunk_size, strategy, mesh
    )
  base = np.zeros(2)
  sums = [np.zeros((2, len(hm))) for _, hm, _ in mask_sets]
  n_batches = 0
  for batch in batches:
    (bt, bc), results = _evaluate_batch(
      params, config, as_batch(batch), metric_fn, mask_sets, chunk_size, strategy
    )
    base += (bt, bc)
    for acc, (t, c) in zip(sums, results):
      acc += np.stack([t, c])
    n_batches += 1
  if n_batches == 0:
    raise ValueError("batches is empty")
  return base[0] / base[1], [acc[0] / acc[1] for acc in sums]


def evaluate_masks(
  params: Params,
  config: BertConfig,
  batches: Iterable,
  metric_fn: MetricFn,
  head_masks,
  layer_masks=None,
  *,
  head_ablation: str = "scale",
  chunk_size: int | None = None,
  strategy: str = "prefix",
  mesh=None,
) -> tuple[float, np.ndarray]:
  """The metric under each of M arbitrary masks, summed over batches.

  Args:
    params: model parameters.
    config: the architecture.
    batches: an iterable of batches (iterated once).
    metric_fn: `(params, config, batch, last_hidden_state, pooled) -> (total, count)`.
    head_masks: float (M, layers, heads).
    layer_masks: float (M, layers) or None (all ones).
    head_ablation: how a head mask acts (`ABLATIONS`): "scale" (Michel) or "uniform"
      (Kovaleva), as in `bertjax.forward`.
    chunk_size: masks evaluated at once (vmap width); bounds memory. None means
      `default_chunk_size()`: on CPU small chunks are fastest (all-MiniLM-L6-v2, batch
      32 x 48: chunk 1 took 17 s, 4 took 22 s, 12 took 33 s); accelerators favour wide ones.
    strategy: "prefix" (share the intact blocks below each mask's first modified
      block, vmap the rest), "vmap" (vmap whole forward passes), "loop" (one
      jitted forward pass per mask; the naive reference, one device only).
    mesh: a `jax.sharding.Mesh` (`bertjax.mesh.make_mesh`): batch rows split over
      its "data" (and "fsdp") axis, masks over "interventions", parameters replicated
      (fsdp-sharded with an "fsdp" axis > 1); the values equal the single-device ones to
      float rounding (`bertjax.analysis.sharded`). The metric must sum over rows, as it
      sums over batches. None: one device.

  Returns:
    `(baseline, values)`: the intact model's metric and (M,) values.
  """
  head_masks, layer_masks = _check_masks(config, head_masks, layer_masks)
  base, (values,) = _evaluate(
    params,
    config,
    batches,
    metric_fn,
    [(head_ablation, head_masks, layer_masks)],
    chunk_size,
    strategy,
    mesh,
  )
  return float(base), values


@dataclasses.dataclass(frozen=True)
class _Rows:
  """A per-row function as the sweeps' metric: its rows stand in the place of the total."""

  fn: Callable

  def __call__(self, params, config, batch, last_hidden_state, pooled):
    return self.fn(params, config, batch, last_hidden_state, pooled), jnp.zeros(())


def evaluate_masks_per_row(
  params: Params,
  config: BertConfig,
  batches: Iterable,
  row_fn,
  head_masks,
  layer_masks=None,
  *,
  head_ablation: str = "scale",
  chunk_size: int | None = None,
  strategy: str = "prefix",
) -> tuple[np.ndarray, np.ndarray]:
  """A per-row quantity under each of M masks: `evaluate_masks` that keeps every row.

  The same programs as `evaluate_masks` (prefix reuse, chunks, strategies; one device), for
  a function that returns a value per row instead of a sum: what a confidence interval over
  the rows (sentences) needs, and every mean `evaluate_masks` gives besides.

  Args:
    params, config, batches, head_masks, layer_masks, head_ablation, chunk_size, strategy: as
      `evaluate_masks`.
    row_fn: `(params, config, batch, last_hidden_state, pooled) -> (rows, ...)` values.

  Returns:
    `(baseline, values)`: the intact model's rows `(rows, ...)` and each mask's
    `(M, rows, ...)`, the rows of every batch in order, float64.
  """
  head_masks, layer_masks = _check_masks(config, head_masks, layer_masks)
  sets = [(head_ablation, head_masks, layer_masks)]
  chunk_size = _checked_run(strategy, chunk_size, sets)
  bases, values = [], []
  for batch in batches:
    (base, _), ((rows, _),) = _evaluate_batch(
      params, config, as_batch(batch), _Rows(row_fn), sets, chunk_size, strategy
    )
    bases.append(base)
    values.append(rows)
  if not bases:
    raise ValueError("batches is empty")
  return np.concatenate(bases, 0), np.concatenate(values, 1)


@dataclasses.dataclass(frozen=True)
class AblationResult:
  """Metric values of one head-ablation kind; `heads[l, h]` = head h of layer l ablated."""

  head_ablation: str  # "scale" or "uniform" (`ABLATIONS`)
  baseline: float
  heads: np.ndarray  # (layers, heads): one head ablated
  layers: np.ndarray  # (layers,): every head of the layer ablated
  keep_one: np.ndarray  # (layers, heads): all heads of layer l but h ablated (Michel Table 2)
  layer_skip: np.ndarray  # (layers,): the whole block skipped (identity); same in every kind
  # (layers, heads, layers, heads): heads (l1, h1) and (l2, h2) ablated together, symmetric;
  # NaN where the pair was not evaluated (and on the diagonal); None without "pairs".
  pairs: np.ndarray | None = None

  def interactions(self) -> np.ndarray:
    """(layers, heads, layers, heads): each pair's value minus what adding the two single-head
    effects predicts, `pairs - (heads_1 - baseline) - (heads_2 - baseline) - baseline`; 0 for
    heads that do not interact, NaN where no pair was evaluated."""
    if self.pairs is None:
      raise ValueError(
        "this sweep has no pairs; run ablation_sweep(..., include=('heads', 'pairs'))"
      )
    single = self.heads - self.baseline
    return self.pairs - single[:, :, None, None] - single[None, None] - self.baseline

  def improvements(self, *, higher_is_better: bool = True) -> dict[str, Any]:
    """What disabling does relative to the intact baseline (positive delta = better), as
    Kovaleva et al. count the heads and layers whose removal helps.

    Families not evaluated (all NaN) are left out.

    Returns:
      For heads (layers, heads), layers (layers,) and skipped blocks (layers,): the deltas
      ("delta_heads", ...), how many improve on the baseline strictly ("heads_improving", ...)
      and the largest delta ("best_head_delta", ...); and the "baseline".
    """
    sign = 1.0 if higher_is_better else -1.0
    eps = 1e-9  # a tie is not an improvement
    out: dict[str, Any] = {"baseline": self.baseline}
    for family, values in (
      ("head", self.heads),
      ("layer", self.layers),
      ("layer_skip", self.layer_skip),
    ):
      values = np.asarray(values, np.float64)
      if np.isnan(values).all():
        continue
      delta = sign * (values - self.baseline)
      out[f"delta_{family}s"] = delta
      out[f"{family}s_improving"] = int((delta > eps).sum())
      out[f"best_{family}_delta"] = float(np.max(delta))
    return out


SWEEP_FAMILIES = ("heads", "layers", "keep_one", "layer_skip", "pairs")
PAIR_SETS = ("all", "within", "across")


def head_pairs(config: BertConfig, pairs="all") -> np.ndarray:
  """The head pairs of a pair sweep as int (P, 2, 2): `[[l1, h1], [l2, h2]]`, (l1, h1) first.

  Args:
    config: the architecture.
    pairs: "all" (every two distinct heads: C(layers x heads, 2), 10,296 for BERT-base),
      "within" (both in one layer), "across" (in different layers), or a sequence of
      `((l1, h1), (l2, h2))` pairs of distinct heads.
  """
  depth, n = config.depth, config.num_attention_heads
  if isinstance(pairs, str):
    if pairs not in PAIR_SETS:
      raise ValueError(
        f"pairs={pairs!r} must be one of {PAIR_SETS} or a sequence of "
        "((layer, head), (layer, head)) pairs"
      )
    i, j = np.triu_indices(depth * n, k=1)
    same = i // n == j // n
    keep = {"all": np.ones_like(same), "within": same, "across": ~same}[pairs]
    i, j = i[keep], j[keep]
    return np.stack([np.stack([i // n, i % n], -1), np.stack([j // n, j % n], -1)], 1)
  if not len(pairs):
    raise ValueError("pairs is empty; give at least one ((l1, h1), (l2, h2)) pair")
  out = np.asarray(pairs, np.int64)
  if out.ndim != 3 or out.shape[1:] != (2, 2):
    raise ValueError(
      f"pairs shape {out.shape} must be (P, 2, 2): ((layer, head), (layer, head)) each"
    )
  for k, ((l1, h1), (l2, h2)) in enumerate(out.tolist()):
    if not all(0 <= l < depth and 0 <= h < n for l, h in ((l1, h1), (l2, h2))):
      raise ValueError(
        f"pairs[{k}]={((l1, h1), (l2, h2))} lies outside (layers, heads)=({depth}, {n})"
      )
    if (l1, h1) == (l2, h2):
      raise ValueError(f"pairs[{k}]={((l1, h1), (l2, h2))} names one head twice")
  # (l1, h1) first, so prefix reuse starts at the pair's first modified layer.
  flip = out[:, 0, 0] * n + out[:, 0, 1] > out[:, 1, 0] * n + out[:, 1, 1]
  out[flip] = out[flip][:, ::-1]
  return out.astype(np.int64)


def pair_masks(config: BertConfig, pairs="all") -> tuple[np.ndarray, np.ndarray]:
  """Head masks ablating two heads at once: (head_masks (P, L, N), the pairs (P, 2, 2)).

  `evaluate_masks` (or `ablation_sweep(..., include=("pairs",))`) runs them with prefix
  reuse: a pair's blocks below its first modified layer `min(l1, l2)` run once per batch.
  See `head_pairs` for `pairs`.
  """
  index = head_pairs(config, pairs)
  masks = np.ones((len(index), config.depth, config.num_attention_heads), np.float32)
  rows = np.arange(len(index))
  masks[rows, index[:, 0, 0], index[:, 0, 1]] = 0
  masks[rows, index[:, 1, 0], index[:, 1, 1]] = 0
  return masks, index


def sweep_masks(
  config: BertConfig,
  include: Sequence[str] = ("heads", "layers", "keep_one", "layer_skip"),
  *,
  pairs="all",
):
  """The masks of `ablation_sweep`: dict name -> (head_masks (M, L, N), layer_masks (M, L));
  "pairs" from `pair_masks(config, pairs)`."""
  depth, n = config.depth, config.num_attention_heads
  unknown = set(include) - set(SWEEP_FAMILIES)
  if unknown:
    raise ValueError(
      f"include={sorted(unknown)} has unknown entries; expected some of {SWEEP_FAMILIES}"
    )
  ones_l = lambda m: np.ones((m, depth), np.float32)
  out = {}
  eye = np.eye(depth * n, dtype=np.float32).reshape(depth * n, depth, n)
  if "heads" in include:
    out["heads"] = (1 - eye, ones_l(depth * n))
  if "keep_one" in include:
    keep = np.ones((depth * n, depth, n), np.float32)
    for l in range(depth):
      keep[l * n : (l + 1) * n, l] = np.eye(n)
    out["keep_one"] = (keep, ones_l(depth * n))
  if "layers" in include:
    lay = np.ones((depth, depth, n), np.float32)
    lay[np.arange(depth), np.arange(depth)] = 0
    out["layers"] = (lay, ones_l(depth))
  if "layer_skip" in include:
    out["layer_skip"] = (
      np.ones((depth, depth, n), np.float32),
      1 - np.eye(depth, dtype=np.float32),
    )
  if "pairs" in include:
    masks, _ = pair_masks(config, pairs)
    out["pairs"] = (masks, ones_l(len(masks)))
  return out


def ablation_sweep(
  params: Params,
  config: BertConfig,
  batches: Iterable,
  metric_fn: MetricFn,
  *,
  head_ablations: Sequence[str] = ABLATIONS,
  include: Sequence[str] = ("heads", "layers", "keep_one", "layer_skip"),
  chunk_size: int | None = None,
  strategy: str = "prefix",
  pairs="all",
  mesh=None,
  modes: Sequence[str] | None = None,
) -> dict[str, AblationResult]:
  """Every single head, every whole layer, and "keep only one head" ablated, in each kind.

  One pass over `batches` evaluates every mask of every head-ablation kind; with
  `strategy="prefix"` blocks `0 .. l-1` run once per batch (the intact forward)
  and only blocks `l ..` run, vmapped, for the masks of layer `l`.

  Args:
    params, config, batches, metric_fn: as `evaluate_masks`.
    head_ablations: a subset of `ABLATIONS` ("scale", "uniform"); see `evaluate_masks`.
    include: which families of masks to evaluate ("layer_skip" is evaluated once,
      in the first kind, since skipping a block does not depend on it; "pairs",
      not in the default, ablates two heads at once: see `pairs`).
    chunk_size: masks per vmap chunk (None: `default_chunk_size()`).
    strategy: "prefix", "vmap" or "loop" (see `evaluate_masks`).
    pairs: with "pairs" included, which pairs (`head_pairs`): "all", "within" a layer,
      "across" layers, or a sequence of ((l1, h1), (l2, h2)).
    mesh: a device mesh (see `evaluate_masks`), or None for one device.
    modes: deprecated name of `head_ablations`.

  Returns:
    head ablation kind -> `AblationResult`; families not included are filled with NaN.
  """
  if modes is not None:
    warnings.warn(
      "ablation_sweep(modes=) is deprecated; use head_ablations=", DeprecationWarning, stacklevel=2
    )
    head_ablations = modes
  if not head_ablations or set(head_ablations) - set(ABLATIONS):
    raise ValueError(
      f"head_ablations={tuple(head_ablations)} must be a non-empty subset of {ABLATIONS}"
    )
  masks = sweep_masks(config, include, pairs=pairs)
  names, sets = [], []
  for i, kind in enumerate(head_ablations):
    for name, (hm, lm) in masks.items():
      if name == "layer_skip" and i > 0:
        continue
      names.append((kind, name))
      sets.append((kind, hm, lm))
  base, values = _evaluate(params, config, batches, metric_fn, sets, chunk_size, strategy, mesh)
  got = dict(zip(names, values))
  depth, n = config.depth, config.num_attention_heads
  nan = lambda *s: np.full(s, np.nan)
  skip = got.get((head_ablations[0], "layer_skip"), nan(depth))

  def pair_matrix(kind):
    if "pairs" not in include:
      return None
    index = head_pairs(config, pairs)
    out = nan(depth, n, depth, n)
    (l1, h1), (l2, h2) = index[:, 0].T, index[:, 1].T
    out[l1, h1, l2, h2] = out[l2, h2, l1, h1] = got[(kind, "pairs")]
    return out

  return {
    kind: AblationResult(
      head_ablation=kind,
      baseline=float(base),
      heads=got.get((kind, "heads"), nan(depth * n)).reshape(depth, n),
      layers=got.get((kind, "layers"), nan(depth)),
      keep_one=got.get((kind, "keep_one"), nan(depth * n)).reshape(depth, n),
      layer_skip=skip,
      pairs=pair_matrix(kind),
    )
    for kind in head_ablations
  }


def sweep_per_row(
  params: Params,
  config: BertConfig,
  batches: Iterable,
  row_fn,
  *,
  head_ablation: str = "scale",
  include: Sequence[str] = ("heads", "layers", "layer_skip"),
  chunk_size: int | None = None,
  strategy: str = "prefix",
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
  """`ablation_sweep` in one head-ablation kind that keeps every row (sentence): the masks of
  `sweep_masks(config, include)` in one `evaluate_masks_per_row` pass, so the same programs.

  Args:
    params, config, batches, head_ablation, chunk_size, strategy: as `evaluate_masks`.
    row_fn: `(params, config, batch, last_hidden_state, pooled) -> (rows, ...)` values, as
      `evaluate_masks_per_row`'s (`classification_correct`).
    include: the families of `sweep_masks` ("pairs" of every head included).

  Returns:
    `(baseline, values)`: the intact model's rows `(rows, ...)`, and family -> its masks'
    rows `(M, rows, ...)` in `sweep_masks`' order (heads: layer-major, `heads[l * N + h]`).
    Their means over the rows are `ablation_sweep`'s values.
  """
  sets = sweep_masks(config, include)
  base, rows = evaluate_masks_per_row(
    params,
    config,
    batches,
    row_fn,
    np.concatenate([hm for hm, _ in sets.values()]),
    np.concatenate([lm for _, lm in sets.values()]),
    head_ablation=head_ablation,
    chunk_size=chunk_size,
    strategy=strategy,
  )
  ends = np.cumsum([0] + [len(hm) for hm, _ in sets.values()])
  return base, {k: rows[a:b] for k, a, b in zip(sets, ends[:-1], ends[1:])}


# Head importance (Michel et al. 2019) ----------------------------------------


@functools.partial(jax.jit, static_argnames=("config", "loss_fn", "head_ablation", "per_example"))
def _importance_batch(params, config, batch, xi, *, loss_fn, head_ablation, per_example):
  batch_size = batch["input_ids"].shape[0]

  def loss(mask):
    x = embed_batch(params, config, batch)
    last = run_layers(
      params, config, x, batch["attention_mask"], head_mask=mask, head_ablation=head_ablation
    ).last
    total, count = _metric(params, config, {**batch, BASELINE_KEY: last}, last, loss_fn)
    return (total if per_example else total / count), count

  mask = jnp.broadcast_to(xi, (batch_size, *xi.shape)) if per_example else xi
  grad, count = jax.grad(loss, has_aux=True)(mask)
  grad = jnp.abs(grad)
  return (grad.sum(0) if per_example else grad), count


def head_importance(
  params: Params,
  config: BertConfig,
  batches: Iterable,
  loss_fn: MetricFn,
  *,
  head_mask=None,
  head_ablation: str = "scale",
  per_example: bool = True,
  normalize_layers: bool = True,
  exponent: float = 2.0,
  mesh=None,
) -> np.ndarray:
  """Michel et al.'s head importance `I_h = E_x |dL(x)/dxi_h|` at the mask `head_mask`.

  With `per_example=True` (the paper's definition) the mask is broadcast to one
  copy per example, so one backward pass gives every example's gradient;
  `I = sum_x |d total_x / dxi| / sum count`, which for one loss term per
  example (classification) is exactly the mean over examples of
  |dL_x/dxi|. With `per_example=False` (their released code) it is the mean
  over batches of |d(batch-mean loss)/dxi|.

  Args:
    params, config, batches: as `evaluate_masks` (batches iterated once).
    loss_fn: a differentiable metric `(params, config, batch, last, pooled) -> (total, count)`.
    head_mask: float (layers, heads) at which to differentiate; None means all ones.
    head_ablation: "scale" or "uniform" (`ABLATIONS`: how xi enters the model).
    per_example: see above.
    normalize_layers: divide each layer's scores by their `exponent`-norm (Michel).
    exponent: the norm's exponent.
    mesh: a device mesh: batch rows split over all its axes (there is one mask), or None.

  Returns:
    float64 (layers, heads).
  """
  if head_ablation not in ABLATIONS:
    raise ValueError(f"{head_ablation=!r} must be one of {ABLATIONS}")
  shape = (config.depth, config.num_attention_heads)
  xi = jnp.ones(shape, compute_dtype(config)) if head_mask is None else jnp.asarray(head_mask)
  if xi.shape != shape:
    raise ValueError(f"head_mask shape {xi.shape} must be (layers, heads)={shape}")
  xi = xi.astype(compute_dtype(config))
  total, denom = np.zeros(shape), 0.0
  if mesh is not None:
    total, denom = sharded.importance_sums(
      params,
      config,
      batches,
      loss_fn,
      xi,
      head_ablation=head_ablation,
      per_example=per_example,
      mesh=mesh,
    )
  else:
    for batch in batches:
      g, count = _importance_batch(
        params,
        config,
        as_batch(batch),
        xi,
        loss_fn=loss_fn,
        head_ablation=head_ablation,
        per_example=per_example,
      )
      total += np.asarray(g, np.float64)
      denom += float(count) if per_example else 1.0
  if denom == 0:
    raise ValueError("batches is empty (or every count is zero)")
  importance = total / denom
  return layer_normalized(importance, exponent) if normalize_layers else importance


def layer_normalized(importance, exponent: float = 2.0) -> np.ndarray:
  """Michel et al.'s normalisation: each layer's head scores over their `exponent`-norm.

  Args:
    importance: (layers, heads) non-negative scores, as `head_importance` gives.
    exponent: the norm's exponent (Michel: 2).
  """
  importance = np.asarray(importance, np.float64)
  norm = (importance**exponent).sum(-1, keepdims=True) ** (1 / exponent)
  return importance / (norm + 1e-20)


@dataclasses.dataclass(frozen=True)
class PruningResult:
  """An iterative pruning run: the metric against the fraction of heads masked."""

  fractions: np.ndarray  # (steps + 1,), 0 first
  metrics: np.ndarray  # (steps + 1,)
  masks: np.ndarray  # (steps + 1, layers, heads)


def iterative_pruning(
  params: Params,
  config: BertConfig,
  batches: Sequence,
  loss_fn: MetricFn,
  metric_fn: MetricFn | None = None,
  *,
  step: float = 0.1,
  max_fraction: float = 0.9,
  head_ablation: str = "scale",
  per_example: bool = True,
  chunk_size: int | None = None,
  mesh=None,
) -> PruningResult:
  """Michel et al.'s pruning: mask the least important `step` of all heads, re-estimate, repeat.

  Importance is re-estimated at the current mask after each step (already
  masked heads are excluded); the metric is recorded before the first step and
  after each one, until `max_fraction` of the heads are masked.

  Args:
    params, config: the model.
    batches: a sequence of batches (iterated once per step, twice per step with
      a separate `metric_fn`).
    loss_fn: differentiable loss for importance.
    metric_fn: what to record (None means `loss_fn`).
    step: fraction of all heads masked per step, in (0, 1].
    max_fraction: stop once this fraction is masked.
    head_ablation: "scale" or "uniform" (`ABLATIONS`).
    per_example: see `head_importance`.
    chunk_size: passed to `evaluate_masks`.
    mesh: a device mesh for both (see `evaluate_masks`, `head_importance`), or None.

  Returns:
    A `PruningResult`.
  """
  if not 0 < step <= 1:
    raise ValueError(f"{step=} must be in (0, 1]")
  if not 0 < max_fraction <= 1:
    raise ValueError(f"{max_fraction=} must be in (0, 1]")
  batches = list(batches)
  metric_fn = metric_fn or loss_fn
  shape = (config.depth, config.num_attention_heads)
  total = shape[0] * shape[1]
  per_step = max(1, round(step * total))
  limit = int(max_fraction * total + 1e-9)  # floor
  mask = np.ones(shape, np.float32)
  fractions, metrics, masks = [], [], []
  while True:
    _, (value,) = evaluate_masks(
      params,
      config,
      batches,
      metric_fn,
      mask[None],
      head_ablation=head_ablation,
      chunk_size=chunk_size,
      mesh=mesh,
    )
    pruned = int((mask == 0).sum())
    fractions.append(pruned / total)
    metrics.append(float(value))
    masks.append(mask.copy())
    if pruned >= limit:
      break
    importance = head_importance(
      params,
      config,
      batches,
      loss_fn,
      head_mask=mask,
      head_ablation=head_ablation,
      per_example=per_example,
      normalize_layers=True,
      mesh=mesh,
    )
    importance = np.where(mask == 0, np.inf, importance).ravel()
    order = np.argsort(importance, kind="stable")[: min(per_step, limit - pruned)]
    mask.ravel()[order] = 0.0
  return PruningResult(np.asarray(fractions), np.asarray(metrics), np.stack(masks))


def pruning_order(pruning_masks, importance) -> np.ndarray:
  """The flat head order of an iterative pruning run (`PruningResult.masks`): by the step
  that pruned each head, ties by `importance` (least important first).

  Heads never pruned come last (least important first), so every prefix of the order
  extends the run's masks.
  """
  masks = np.asarray(pruning_masks).reshape(len(pruning_masks), -1)
  step = np.where((masks == 0).any(0), (masks == 0).argmax(0), len(masks))
  return np.lexsort((np.asarray(importance).ravel(), step))


def order_masks(order, counts, shape) -> np.ndarray:
  """Masks (len(counts), L, N) with the first `counts[i]` heads of the flat `order` at zero
  (with `pruning_order`, a pruning run's masks at any head counts)."""
  order = np.asarray(order)
  masks = np.ones((len(counts), *shape), np.float32)
  for i, k in enumerate(counts):
    masks[i].ravel()[order[: int(k)]] = 0.0
  return masks


def __getattr__(name: str):
  # `mlm_loss` was this module's name for `mlm_batch_loss` (and is the README's older example);
  # `bertjax.training.losses.mlm_loss` is a different function (gathered positions, a mean).
  if name == "mlm_loss":
    warnings.warn(
      "bertjax.analysis.interventions.ablation.mlm_loss is deprecated; use mlm_batch_loss",
      DeprecationWarning,
      stacklevel=2,
    )
    return mlm_batch_loss
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
