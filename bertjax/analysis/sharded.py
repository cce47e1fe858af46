"""The mesh path of the analyses: ablation sweeps, head importance, patching and attention.

`ablation.evaluate_masks`, `ablation_sweep`, `head_importance`, `iterative_pruning` and the
attention analyses (`clark_statistics`, `pattern_types`, `attention_change`,
`word_level_attention`, `effective_attention_statistics`) come here when given a ``mesh``
(`bertjax.mesh.make_mesh`); the patching sweeps (`bertjax.analysis.interventions.patching`) keep
their programs and place their pair and patch set with `place_rows` and
`place_interventions`; feature extraction and cloze scoring shard their own row-parallel
programs with the helpers of `bertjax.mesh`. This module imports no analysis (only
`bertjax.analysis.batching`), so the analyses import it at the top.

How an ablation sweep is split: each batch's rows go over ("data", "fsdp"), padded to a
multiple of that size by repeating the last row; the masks that share a first modified
block (prefix reuse, as on one device) go over "interventions" as an ``(I, M/I)`` array,
padded by repeating the last mask. The program is the single-device one, vmapped over the
``I`` axis and jitted; XLA partitions it from the inputs' shardings. The metric is taken
row by row (`jax.vmap` over batches of one row), so padded rows get weight exactly 0 and
any metric that sums over rows, as every metric here must (totals are summed over
batches), gives the single-device value; the per-row sums are reduced once per program,
an all-reduce of ``2 M`` floats over the row axes.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from bertjax import mesh as mesh_lib
from bertjax.analysis.batching import (
  BASELINE_KEY,
  as_batch,
  embed_batch,
  first_modified_layer,
  model_token_types,
)
from bertjax.model.config import BertConfig
from bertjax.model.forward import attention_statistics, forward, run_layers
from bertjax.model.heads import pool
from bertjax.model.input_checks import check_inputs

Params = dict[str, Any]


def _host_batch(batch) -> dict[str, np.ndarray]:
  return {k: np.asarray(v) for k, v in as_batch(batch).items()}


def place_rows(tree: Any, mesh: Mesh, axes: tuple[str, ...]):
  """Host arrays with the same leading (row) size, padded and placed over `axes`.

  Rows are padded to a multiple of the axes' size by repeating the last row (real-looking
  inputs, so no NaN can come in) and split over `axes`.

  Returns:
    `(placed, weight, padded)`: the global arrays, the (rows,) float32 weight (1 real, 0
    padding) placed alike, and whether any row was added.
  """
  n = jax.tree.leaves(tree)[0].shape[0]
  rows = mesh_lib.round_up(n, mesh_lib.size_of(mesh, axes))
  weight = (np.arange(rows) < n).astype(np.float32)
  placed, weight = mesh_lib.shard_rows((mesh_lib.pad_rows(tree, rows), weight), mesh, axes)
  return placed, weight, rows > n


def place_interventions(tree: Any, mesh: Mesh):
  """An intervention set (host arrays, leading size M) split over "interventions".

  Each array becomes ``(I, ceil(M / I), ...)`` (I the axis size), padded by repeating the
  last intervention, whose results the caller drops (`flat_interventions`).

  Returns:
    `(placed, sharding)`: the global arrays and the `NamedSharding` a program keeps them in
    (`jax.lax.with_sharding_constraint`).
  """
  n_int = mesh_lib.axis_size(mesh, mesh_lib.INTERVENTIONS)
  m = jax.tree.leaves(tree)[0].shape[0]
  rows = mesh_lib.round_up(m, n_int)
  tree = jax.tree.map(
    lambda x: x.reshape(n_int, rows // n_int, *x.shape[1:]), mesh_lib.pad_rows(tree, rows)
  )
  axes = (mesh_lib.INTERVENTIONS,) if n_int > 1 else ()
  spec = P(mesh_lib.INTERVENTIONS) if mesh_lib.INTERVENTIONS in mesh.axis_names else P()
  return mesh_lib.shard_rows(tree, mesh, axes), NamedSharding(mesh, spec)


def flat_interventions(x, m: int, axis: int = 0) -> np.ndarray:
  """Results over an ``(I, M / I)`` intervention set, at `axis` and `axis + 1`, as the M real
  ones on the host: ``(..., M, ...)``."""
  x = np.asarray(mesh_lib.to_host(x))
  return x.reshape(*x.shape[:axis], -1, *x.shape[axis + 2 :]).take(np.arange(m), axis=axis)


def _place_batch(batch: dict[str, np.ndarray], mesh: Mesh, axes: tuple[str, ...]):
  """Rows padded to the axes' size and placed; returns (batch, weight (B,) 1 real / 0 pad)."""
  placed, weight, _ = place_rows(batch, mesh, axes)
  return placed, weight


def _row_totals(params, config, batch, last, metric_fn):
  """Per-row (total, count), (B,) each: `metric_fn` on batches of one row, vmapped."""
  pooled = pool(params, config, last)

  def one(row, h, p):
    b1 = jax.tree.map(lambda x: x[None], row)
    t, c = metric_fn(params, config, b1, h[None], None if p is None else p[None])
    return jnp.asarray(t), jnp.asarray(c)

  return jax.vmap(one)(batch, last, pooled)


def _weighted(weight, t, c):
  keep = weight > 0
  return jnp.where(keep, t, 0), jnp.where(keep, c, 0)


@functools.partial(jax.jit, static_argnames=("config", "metric_fn"))
def _baseline(params, config, batch, weight, *, metric_fn):
  """Intact forward: block inputs (depth + 1, B, T, H), last state, summed metric."""
  x = embed_batch(params, config, batch)
  layers = run_layers(params, config, x, batch["attention_mask"], output_hidden_states=True)
  last = layers.last
  inputs = jnp.concatenate([x[None], layers.hidden_states])  # inputs[l] = input of block l
  t, c = _weighted(
    weight, *_row_totals(params, config, {**batch, BASELINE_KEY: last}, last, metric_fn)
  )
  return inputs, last, (t.sum(), c.sum())


@functools.partial(
  jax.jit,
  static_argnames=("config", "metric_fn", "start", "head_ablation", "chunk_size", "masks_sharding"),
)
def _suffix(
  params,
  config,
  batch,
  weight,
  inputs,
  head_masks,
  layer_masks,
  *,
  start,
  head_ablation,
  metric_fn,
  chunk_size,
  masks_sharding,
):
  """Blocks `start ..` for masks (I, m, ...) split over "interventions": totals, counts (I, m)."""
  head_masks = jax.lax.with_sharding_constraint(head_masks, masks_sharding)
  layer_masks = jax.lax.with_sharding_constraint(layer_masks, masks_sharding)
  hidden_in = inputs[start]

  def group(hm, lm):
    def one(masks):
      h, l = masks
      last = run_layers(
        params,
        config,
        hidden_in,
        batch["attention_mask"],
        start=start,
        head_mask=h,
        head_ablation=head_ablation,
        layer_mask=l,
      ).last
      return _weighted(weight, *_row_totals(params, config, batch, last, metric_fn))  # (B,)

    return jax.lax.map(one, (hm, lm), batch_size=chunk_size)  # (m, B) each

  t, c = jax.vmap(group)(head_masks, layer_masks)  # (I, m, B): one reduction over rows
  return t.sum(-1), c.sum(-1)


def evaluate(
  params: Params,
  config: BertConfig,
  batches: Iterable,
  metric_fn,
  mask_sets,
  chunk_size: int,
  strategy: str,
  mesh: Mesh,
):
  """`ablation._evaluate` on a mesh: (baseline, [values (M,) per mask set])."""
  if strategy not in ("prefix", "vmap"):
    raise ValueError(
      f"{strategy=!r} runs on one device only (the naive reference); with a "
      "mesh use 'prefix' or 'vmap'"
    )
  params = mesh_lib.shard_params(params, mesh)
  axes = mesh_lib.row_axes(mesh)
  base = np.zeros(2)
  sums = [np.zeros((2, len(hm))) for _, hm, _ in mask_sets]
  n_batches = 0
  for batch in batches:
    b, weight = _place_batch(_host_batch(batch), mesh, axes)
    inputs, last, (bt, bc) = _baseline(params, config, b, weight, metric_fn=metric_fn)
    base += mesh_lib.to_host((bt, bc))
    b = {**b, BASELINE_KEY: last}
    for kind in dict.fromkeys(kind for kind, _, _ in mask_sets):
      which = [i for i, (other, _, _) in enumerate(mask_sets) if other == kind]
      head_masks = np.concatenate([mask_sets[i][1] for i in which])
      layer_masks = np.concatenate([mask_sets[i][2] for i in which])
      m = len(head_masks)
      totals = np.zeros((2, m))
      starts = (
        first_modified_layer(head_masks, layer_masks) if strategy == "prefix" else np.zeros(m, int)
      )
      for start in np.unique(starts):
        idx = np.flatnonzero(starts == start)
        (hm, lm), masks_sharding = place_interventions((head_masks[idx], layer_masks[idx]), mesh)
        t, c = _suffix(
          params,
          config,
          b,
          weight,
          inputs,
          hm,
          lm,
          start=int(start),
          head_ablation=kind,
          metric_fn=metric_fn,
          chunk_size=chunk_size,
          masks_sharding=masks_sharding,
        )
        totals[0, idx] = flat_interventions(t, len(idx))
        totals[1, idx] = flat_interventions(c, len(idx))
      offsets = np.cumsum([0] + [len(mask_sets[i][1]) for i in which])
      for k, i in enumerate(which):
        sums[i] += totals[:, offsets[k] : offsets[k + 1]]
    n_batches += 1
  if n_batches == 0:
    raise ValueError("batches is empty")
  return base[0] / base[1], [acc[0] / acc[1] for acc in sums]


@functools.partial(jax.jit, static_argnames=("config", "loss_fn", "head_ablation", "per_example"))
def _importance_batch(params, config, batch, weight, xi, *, loss_fn, head_ablation, per_example):
  batch_size = batch["input_ids"].shape[0]

  def loss(mask):
    x = embed_batch(params, config, batch)
    last = run_layers(
      params, config, x, batch["attention_mask"], head_mask=mask, head_ablation=head_ablation
    ).last
    t, c = _weighted(
      weight, *_row_totals(params, config, {**batch, BASELINE_KEY: last}, last, loss_fn)
    )
    total, count = t.sum(), c.sum()
    return (total if per_example else total / count), count

  mask = jnp.broadcast_to(xi, (batch_size, *xi.shape)) if per_example else xi
  grad, count = jax.grad(loss, has_aux=True)(mask)
  grad = jnp.abs(grad)
  return (grad.sum(0) if per_example else grad), count


def importance_sums(
  params: Params,
  config: BertConfig,
  batches: Iterable,
  loss_fn,
  xi,
  *,
  head_ablation: str,
  per_example: bool,
  mesh: Mesh,
):
  """`head_importance`'s sums on a mesh, rows over every axis: (sum |grad| (L, N), denominator)."""
  params = mesh_lib.shard_params(params, mesh)
  axes = mesh_lib.row_axes(mesh, interventions=True)
  xi = mesh_lib.shard_rows(np.asarray(xi), mesh, ())  # replicated
  total, denom = np.zeros(xi.shape), 0.0
  for batch in batches:
    b, weight = _place_batch(_host_batch(batch), mesh, axes)
    g, count = mesh_lib.to_host(
      _importance_batch(
        params,
        config,
        b,
        weight,
        xi,
        loss_fn=loss_fn,
        head_ablation=head_ablation,
        per_example=per_example,
      )
    )
    total += np.asarray(g, np.float64)
    denom += float(count) if per_example else 1.0
  return total, denom


# Attention statistics -----------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("config", "extra"))
def _outputs(params, config, ids, mask, types, *, extra):
  out = forward(
    params,
    config,
    ids,
    mask,
    types,
    output_attentions=True,
    output_hidden_states=extra == "hidden_states",
    capture=("v",) if extra == "v" else (),
  )
  return out.attentions, {
    None: None,
    "hidden_states": out.hidden_states,
    "v": None if out.cache is None else out.cache.get("v"),
  }[extra]


@functools.partial(jax.jit, static_argnames=("config",))
def _stats(params, config, ids, mask, types, special):
  # Under jit the arrays are tracers: `attention_statistics` checks shapes only (the values
  # were checked on the host by `AttentionRunner.batch`).
  return attention_statistics(params, config, ids, mask, types, special_mask=special)


class AttentionRunner:
  """The attention analyses' model calls on a mesh, rows over every axis.

  Padding rows have an all-zero attention mask: zero real tokens, so weight 0 in both of
  Clark's weightings; `outputs` drops them.
  """

  def __init__(self, params: Params, config: BertConfig, mesh: Mesh):
    self.config, self.mesh = config, mesh
    self.params = mesh_lib.shard_params(params, mesh)
    self.axes = mesh_lib.row_axes(mesh, interventions=True)

  def batch(self, b: dict[str, Any]) -> dict[str, np.ndarray]:
    """The batch on the host, with zero-mask rows up to a multiple of the devices."""
    b = {k: np.asarray(v) for k, v in b.items()}
    n = b["input_ids"].shape[0]
    rows = mesh_lib.round_up(n, mesh_lib.size_of(self.mesh, self.axes))
    if rows > n:
      b = mesh_lib.pad_rows(b, rows)
      b["attention_mask"][n:] = 0
    types = model_token_types(self.config, b["token_type_ids"])
    check_inputs(self.config, b["input_ids"], b["attention_mask"], types)
    return b

  def _args(self, b):
    types = model_token_types(self.config, b["token_type_ids"])
    return mesh_lib.shard_rows((b["input_ids"], b["attention_mask"], types), self.mesh, self.axes)

  def maps(self, b) -> np.ndarray:
    """(L, B, N, T, T) attention maps of a padded batch (`batch`) on the host."""
    return mesh_lib.to_host(_outputs(self.params, self.config, *self._args(b), extra=None)[0])

  def outputs(self, b, extra: str | None = None):
    """`(maps (L, B, N, T, T), extra or None)` of a batch's B rows on the host, as `forward`
    gives them on one device (padded on the mesh, then dropped); `extra` "hidden_states"
    (L + 1, B, T, H) or "v" (the value site, (L, B, T, G, D))."""
    n = np.shape(b["input_ids"])[0]
    maps, second = mesh_lib.to_host(
      _outputs(self.params, self.config, *self._args(self.batch(b)), extra=extra)
    )
    return maps[:, :n], None if second is None else second[:, :n]

  def statistics(self, b, special_mask) -> dict[str, np.ndarray]:
    """`attention_statistics` of the batch, on the host: name -> (L, B, N)."""
    special = mesh_lib.shard_rows(np.asarray(special_mask), self.mesh, self.axes)
    return mesh_lib.to_host(_stats(self.params, self.config, *self._args(b), special))


def maps_runner(params: Params, config: BertConfig, mesh):
  """`run(batch, extra=None) -> (maps, extra)` on the host: the model's attention maps
  (L, B, N, T, T) and, when asked, `extra="hidden_states"` (L + 1, B, T, H) or the value
  site `extra="v"` (L, B, T, G, D) of a batch, on one device (`mesh=None`) or with its rows
  split over every device of `mesh`."""
  if mesh is not None:
    return AttentionRunner(params, config, mesh).outputs

  def run(b, extra=None):
    out = forward(
      params,
      config,
      b["input_ids"],
      b["attention_mask"],
      model_token_types(config, b["token_type_ids"]),
      output_attentions=True,
      output_hidden_states=extra == "hidden_states",
      capture=("v",) if extra == "v" else (),
    )
    second = {
      None: None,
      "hidden_states": out.hidden_states,
      "v": None if out.cache is None else out.cache.get("v"),
    }[extra]
    return np.asarray(out.attentions), None if second is None else np.asarray(second)

  return run
