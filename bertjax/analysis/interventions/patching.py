"""Activation patching: exact sweeps, attribution patching and path patching over named sites.

A *pair* is two batches of the same shape, `clean` and `corrupted` (mappings or
dataclasses such as `bertjax.Batch` with `input_ids` and optionally
`attention_mask`, `token_type_ids`), with the same attention mask: every function here
refuses a pair whose masks differ (`check_same_padding`, naming the first differing row and
positions), since a site patched from a padded source position is no token's activation.
Patching runs one of them (the *destination*)
with a site of chosen layers, heads and positions replaced by its value in the
other run (the *source*): `direction="denoise"` (the default) runs the corrupted
input with clean activations, `"noise"` the clean input with corrupted ones
(Heimersheim & Nanda 2024, "How to use and interpret activation patching"). Every
patch is the site mechanism's `patch={site: (source_value, weight)}` (as
`bertjax.forward` and `run_layers` take it) with a 0/1 weight (`patch_weight`);
nothing here re-implements the encoder block.

A **metric** `metric(params, config, out, batch) -> scalar` is a pure JAX function
of the patched run's `BertOutput` (`last_hidden_state`, `pooler_output`) and of
`batch`: the destination run's arrays (`input_ids`, `attention_mask`,
`token_type_ids`) plus the pair's `targets` (e.g. `position`, `answer`,
`distractor`, each (batch,)). It is a static argument of `jax.jit`: pass the same
object each time to reuse compilations. Ready ones: `LogitDiff` (a task head's
logit difference, the usual patching metric), `AnswerLogProb` and `ProbeLogitDiff`
(a linear probe on the final states). These are means over the batch's rows and say so
with a class attribute `row_mean = True`, which lets a mesh pad the rows (below). They,
`PatchingResult`, `normalize` and `agreement` live in
`bertjax.analysis.interventions.metrics`.

Results are normalised as is conventional, `(patched - corrupted) / (clean -
corrupted)`, in either direction: 1 is the clean run's metric, 0 the corrupted
run's (`PatchingResult.normalized`).

* `head_patching`: every (layer, head) of a site with a head axis (`head_out` by
  default; `q`, `k`, `v`, `probs` too), optionally at chosen positions only.
* `position_patching`: every (layer, position) of a site (`out`, the residual
  stream after each block, by default; `mid`, `attn_out`, `ffn_out`, ...).

Each sweep is ONE compiled program with prefix reuse: the destination run's block
inputs are stored once, and a patch acting at block `l` runs blocks `l ..` from
block `l`'s stored input (an `out` patch needs no block `l` at all: the site's own
mix of the stored outputs is block `l+1`'s input), `chunk_size` patches at a time
(`jax.lax.map(..., batch_size=)`, as the ablation sweep does). For BERT-base's 144
heads that is 78 forward passes' worth of blocks plus the two unpatched runs,
against 146 forward passes for a loop.

* `attribution_patching`: Nanda's gradient approximation ("Attribution patching",
  2023; Syed et al. 2023): `metric(patched) - metric(dst) ~= (source - own) .
  d metric / d site` at the destination run, for every patch of a sweep at once.
  It is exact calculus on the site mechanism: the derivative of the metric with
  respect to a patch weight at 0 is that dot product. One source forward, one
  destination forward and one backward pass; the destination's blocks run unrolled
  (`run_layers(unroll=True)`: no stacked residual buffers, and no gradient for the first
  block's input), and the backward is a second program, so the residuals are arrays the
  allocator reuses. `agreement` reports how well it matches the exact sweep (Pearson and
  Spearman correlation).
* Every run whose output a metric scores runs the model's last block only at the rows
  the metric reads (`metrics.metric_rows`: the `position` of a token head, the
  first token of a sequence head or a "first" probe), through `run_layers(final_rows=)`:
  the same values for a fraction of that block's work. A metric without a `rows` method
  gets every row.
* `mesh=` (every sweep; `bertjax.mesh.make_mesh`): the pair's rows are split over
  the mesh's "data" (and "fsdp") axis and the patch set (the heads or positions of each
  layer, the sender heads of path patching) over "interventions", as `ablation_sweep`
  splits its masks; attribution patching, one backward pass with no patch set, splits its
  rows over every axis. The program is the single-device one, jitted on the placed inputs;
  its values equal the single-device ones to float rounding. A batch the row axes do not
  divide is padded by repeating its last row, and then the metric is taken row by row and
  averaged over the real rows: that needs a metric with `row_mean = True`; any other metric
  needs a batch the row axes divide (an error says so).
* `path_patching`: Wang et al. 2023 (IOI) path patching from every sender head to
  chosen receiver heads' query, key or value inputs, in two patched runs per
  sender: (1) the destination run with every head's output frozen to the
  destination's own except the sender's, which takes the source's (MLPs and
  LayerNorms recompute), recording the receivers' `q`/`k`/`v` sites; (2) the
  destination run with only those receiver sites patched to the recorded values.
  `q`, `k`, `v` are linear in their block's input, so patching them is patching the
  receiver head's input; no hook on the residual stream is needed.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import mesh as mesh_lib
from bertjax.analysis import sharded
from bertjax.analysis.batching import as_batch, check_same_padding, default_chunk_size
from bertjax.analysis.interventions.metrics import (
  Metric,
  PatchingResult,
  at_least_f32,
  check_targets,
  metric_rows,
)
from bertjax.model.config import BertConfig
from bertjax.model.forward import BertOutput, embed, forward, run_layers
from bertjax.model.heads import pool
from bertjax.model.input_checks import check_inputs
from bertjax.model.sites import BLOCK_SITES, SITES, mix

Params = dict[str, Any]
DIRECTIONS = ("denoise", "noise")
HEAD_SITES = ("q", "k", "v", "head_out", "probs")
RECEIVER_SITES = ("q", "k", "v")
INPUT_KEYS = ("input_ids", "attention_mask", "token_type_ids")


# Patch weights --------------------------------------------------------------


def _axes(site: str) -> list[str]:
  return SITES[site][0].split()


def _head_axis(site: str) -> str | None:
  """The site's head axis: "heads", "kv_heads" (k and v: grouped key/value heads), or None."""
  return next((a for a in _axes(site) if a in ("heads", "kv_heads")), None)


def head_count(config: BertConfig, site: str) -> int:
  """How many heads a site has: the query heads, or the key/value heads for k and v."""
  return config.kv_heads if _head_axis(site) == "kv_heads" else config.num_attention_heads


def _index_mask(size: int, chosen, what: str) -> np.ndarray:
  mask = np.zeros(size, bool)
  if chosen is None:
    mask[:] = True
    return mask
  chosen = np.atleast_1d(np.asarray(chosen))
  if chosen.size == 0:
    raise ValueError(f"{what}=[] selects nothing; give at least one index, or None for all")
  if chosen.ndim != 1 or not np.issubdtype(chosen.dtype, np.integer):
    raise ValueError(f"{what}={chosen.tolist()} must be a sequence of ints")
  bad = chosen[(chosen < 0) | (chosen >= size)]
  if bad.size:
    raise ValueError(f"{what} {bad.tolist()} are outside [0, {size})")
  mask[chosen] = True
  return mask


def patch_weight(
  config: BertConfig, site: str, seq_len: int, *, layers=None, heads=None, positions=None
) -> np.ndarray:
  """The 0/1 patch weight that selects layers, heads and positions of a site.

  Args:
    config: the architecture.
    site: a name from `bertjax.SITES`.
    seq_len: the padded sequence length.
    layers: ints (None: every layer); must be None for "embeddings".
    heads: ints, the heads of every chosen layer, or (layer, head) pairs (then
      `layers` must be None); None: every head. Only for sites with a head axis.
    positions: ints, the (query) positions to patch; None: every position.

  Returns:
    float32, broadcastable to the site's stacked shape (`bertjax.site_shape`): depth
    first (except "embeddings"), then 1 on every axis but seq (when `positions` is
    given) and heads (when `heads` is given).
  """
  if site not in SITES:
    raise ValueError(f"site {site!r} is unknown; expected one of {tuple(SITES)}")
  axes = _axes(site)
  head_axis = _head_axis(site)
  if heads is not None and head_axis is None:
    raise ValueError(
      f"heads={heads} given for site {site!r}, which has no head axis "
      f"(sites with heads: {HEAD_SITES})"
    )
  depth, n = config.depth, head_count(config, site)
  if site == "embeddings" and layers is not None:
    raise ValueError(f"layers={layers} given for the 'embeddings' site, which has no depth axis")
  pairs = heads is not None and len(heads) > 0 and all(isinstance(h, (tuple, list)) for h in heads)
  if pairs:
    if layers is not None:
      raise ValueError(
        f"heads given as (layer, head) pairs {heads}; then layers={layers} must be None"
      )
    grid = np.zeros((depth, n), bool)
    for pair in heads:
      if len(pair) != 2 or not (0 <= pair[0] < depth and 0 <= pair[1] < n):
        raise ValueError(f"(layer, head)={tuple(pair)} is outside ({depth}, {n})")
      grid[pair[0], pair[1]] = True
  else:
    grid = _index_mask(depth, layers, "layers")[:, None] & _index_mask(n, heads, "heads")[None, :]
  pos = _index_mask(seq_len, positions, "positions")
  # Depth, then the site's axes, each 1 except the first seq axis (the query position)
  # when positions are chosen and the head axis when heads are.
  shape = [depth] + [1] * len(axes)
  layer_heads = grid if heads is not None else grid[:, :1]  # (depth, N | 1)
  if heads is not None:
    shape[1 + axes.index(head_axis)] = n
  lh_shape = list(shape)
  pos_shape = [1] * len(shape)
  if positions is not None:
    pos_shape[1 + axes.index("seq")] = shape[1 + axes.index("seq")] = seq_len
    full = layer_heads.reshape(lh_shape) & pos.reshape(pos_shape)
  else:
    full = layer_heads.reshape(lh_shape)
  full = np.broadcast_to(full, shape).astype(np.float32)
  return full[0] if site == "embeddings" else full


# Inputs ---------------------------------------------------------------------


def checked_pair(config, clean, corrupted, targets, direction, params=None, metric=None):
  """(source, destination, targets) dicts of arrays, checked (with `metric`, the targets
  against what it reads: `check_targets`)."""
  if direction not in DIRECTIONS:
    raise ValueError(f"{direction=!r} must be one of {DIRECTIONS}")
  clean, corrupted = as_batch(clean), as_batch(corrupted)
  if clean["input_ids"].shape != corrupted["input_ids"].shape:
    raise ValueError(
      f"clean input_ids shape {tuple(clean['input_ids'].shape)} must equal "
      f"corrupted shape {tuple(corrupted['input_ids'].shape)}"
    )
  batch = clean["input_ids"].shape[0]
  targets = {k: jnp.asarray(v) for k, v in dict(targets or {}).items()}
  for k, v in targets.items():
    if k in INPUT_KEYS:
      raise ValueError(f"targets[{k!r}] would shadow the run's own {k}; rename it")
    if v.ndim == 0 or v.shape[0] != batch:
      raise ValueError(f"targets[{k!r}] shape {tuple(v.shape)} must lead with batch={batch}")
  clean = {k: clean[k] for k in INPUT_KEYS}
  corrupted = {k: corrupted[k] for k in INPUT_KEYS}
  check_same_padding(clean["attention_mask"], corrupted["attention_mask"])
  if not config.type_vocab_size:  # a family without token types ignores a pair's segments
    for b in (clean, corrupted):
      b["token_type_ids"] = jnp.zeros_like(b["token_type_ids"])
  for b in (clean, corrupted):
    check_inputs(config, b["input_ids"], b["attention_mask"], b["token_type_ids"])
  if metric is not None:
    for b in (clean, corrupted):
      check_targets(params, config, metric, {**b, **targets})
  src, dst = (clean, corrupted) if direction == "denoise" else (corrupted, clean)
  return src, dst, targets


def _check_site(site: str, allowed: Sequence[str], what: str) -> None:
  if site not in allowed:
    raise ValueError(f"site {site!r} is not one {what} can sweep; expected one of {tuple(allowed)}")


def _chunk(chunk_size):
  chunk_size = default_chunk_size() if chunk_size is None else chunk_size
  if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
    raise ValueError(f"{chunk_size=!r} must be a positive int or None")
  return chunk_size


def clean_and_corrupted(src_m, dst_m, direction):
  """The (clean, corrupted) metric values of a patching run's source and destination: the
  source is clean when denoising, corrupted when noising."""
  clean, corrupted = (src_m, dst_m) if direction == "denoise" else (dst_m, src_m)
  return float(clean), float(corrupted)


def _output(params, config, last) -> BertOutput:
  return BertOutput(last_hidden_state=last, pooler_output=pool(params, config, last))


def metric_of(params, config, metric, last, batch, row_weight):
  """The metric of a run; with `row_weight` (B,) (rows padded on a mesh), the weighted mean
  of its values on batches of one row, vmapped (`row_mean` metrics only)."""
  if row_weight is None:
    return _scalar(metric(params, config, _output(params, config, last), batch), metric)
  values = row_values(params, config, metric, last, batch)
  keep = row_weight > 0
  return jnp.where(keep, values, 0).sum() / keep.sum().astype(values.dtype)


def row_values(params, config, metric, last, batch) -> jax.Array:
  """The metric of each row of a run alone, `(B,)` (at least float32): the metric on batches
  of one row, vmapped. For a `row_mean` metric their mean is the metric of the whole batch.

  Raises:
    ValueError: for a metric that is not a mean over rows.
  """
  if not getattr(metric, "row_mean", False):
    raise ValueError(
      f"metric {metric!r} is not a mean over the batch's rows (row_mean = True, as "
      "LogitDiff, AnswerLogProb and ProbeLogitDiff are), so it has no value per row"
    )

  def one(h, row):
    return _scalar(
      metric(
        params, config, _output(params, config, h[None]), jax.tree.map(lambda x: x[None], row)
      ),
      metric,
    )

  return at_least_f32(jax.vmap(one)(last, batch))


def _scalar(value, metric):
  """A metric's value, checked (at trace time) to be one number."""
  if jnp.ndim(value) != 0:
    raise ValueError(
      f"metric {metric!r} returned shape {jnp.shape(value)}; a metric returns "
      "one scalar (a mean over the batch's rows, as LogitDiff does)"
    )
  return value


def _place(params, config, src, dst, targets, metric, mesh, *, patch_set: bool):
  """The model and the pair on `mesh`, rows over its row axes (every axis without a patch
  set): `(params, src, dst, targets, row_weight)`, row_weight None unless rows were padded."""
  axes = mesh_lib.row_axes(mesh, interventions=not patch_set)
  host = jax.tree.map(np.asarray, (src, dst, targets))
  (src, dst, targets), weight, padded = sharded.place_rows(host, mesh, axes)
  if padded and not getattr(metric, "row_mean", False):
    rows, size = host[0]["input_ids"].shape[0], mesh_lib.size_of(mesh, axes)
    raise ValueError(
      f"batch={rows} rows do not split evenly over the {size} devices of mesh "
      f"axes {axes}, and metric={metric!r} is not marked as a mean over rows "
      "(row_mean = True, as LogitDiff, AnswerLogProb and ProbeLogitDiff are), so "
      f"padding rows would change it: give a multiple of {size} rows or such a "
      "metric"
    )
  return (mesh_lib.shard_params(params, mesh), src, dst, targets, weight if padded else None)


def _map_set(one, patches, chunk_size):
  """`one` over a patch set (I, m, ...) (I > 1: split over "interventions"): (I, m)."""
  if jax.tree.leaves(patches)[0].shape[0] == 1:  # one device: exactly the unsplit program
    return jax.lax.map(one, jax.tree.map(lambda x: x[0], patches), batch_size=chunk_size)[None]
  return jax.vmap(lambda p: jax.lax.map(one, p, batch_size=chunk_size))(patches)


def _patch_set(patches, mesh):
  """A patch set (M, ...) as (I, M / I, ...) placed on `mesh` (I = 1 without one), and the
  sharding the program keeps it in (None without a mesh)."""
  if mesh is None:
    return jax.tree.map(lambda x: jnp.asarray(x)[None], patches), None
  return sharded.place_interventions(jax.tree.map(np.asarray, patches), mesh)


def sweep_forward(params, config, batch, **kwargs):
  """A forward pass inside the sweeps' programs (inputs checked once, outside): the
  embeddings, `run_layers` (kwargs: capture, patch of block sites, output_hidden_states,
  final_rows)."""
  x = embed(params, config, batch["input_ids"], batch["token_type_ids"])
  return x, run_layers(params, config, x, batch["attention_mask"], **kwargs)


# One patched forward --------------------------------------------------------


def patched_forward(
  params: Params,
  config: BertConfig,
  clean,
  corrupted,
  *,
  site: str,
  layers=None,
  heads=None,
  positions=None,
  direction: str = "denoise",
  weight=None,
  **forward_kwargs,
) -> BertOutput:
  """The destination run with `site` at the chosen layers, heads and positions from the source.

  Args:
    params, config: the model.
    clean, corrupted: the pair (same shape and attention mask: `check_same_padding`).
    site: any name from `bertjax.SITES`.
    layers, heads, positions: what to patch (see `patch_weight`).
    direction: "denoise" runs `corrupted` with clean values; "noise" the reverse.
    weight: an explicit weight instead of layers/heads/positions (any array that
      broadcasts to the site's stacked shape; fractions interpolate).
    **forward_kwargs: passed to `bertjax.forward` (capture, output_attentions, ...).

  Returns:
    The destination run's `BertOutput`.
  """
  src, dst, _ = checked_pair(config, clean, corrupted, None, direction)
  seq = dst["input_ids"].shape[1]
  if weight is None:
    weight = patch_weight(config, site, seq, layers=layers, heads=heads, positions=positions)
  value = forward(
    params, config, src["input_ids"], src["attention_mask"], src["token_type_ids"], capture=(site,)
  ).cache[site]
  return forward(
    params,
    config,
    dst["input_ids"],
    dst["attention_mask"],
    dst["token_type_ids"],
    patch={site: (value, weight)},
    **forward_kwargs,
  )


# Exact sweeps ---------------------------------------------------------------


def sweep_weights(config, site, seq_len, over: str, positions) -> np.ndarray:
  """(P, 1, *site axes) block-local 0/1 weights, one per patch of a sweep."""
  if over == "heads":
    ws = [
      patch_weight(config, site, seq_len, layers=[0], heads=[h], positions=positions)
      for h in range(head_count(config, site))
    ]
  else:
    ws = [patch_weight(config, site, seq_len, layers=[0], positions=[t]) for t in range(seq_len)]
  return np.stack([w[:1] for w in ws])


@functools.partial(
  jax.jit, static_argnames=("config", "site", "metric", "chunk_size", "set_sharding")
)
def _sweep(
  params, config, src, dst, targets, weights, row_weight, *, site, metric, chunk_size, set_sharding
):
  """One program: source and destination runs, then every patch of every layer: (L, I, m).

  `weights` (I, m, 1, *site axes): the block-local weights of the patch set, split over
  "interventions" on a mesh (`set_sharding`); I = 1 on one device.
  """
  if set_sharding is not None:
    weights = jax.lax.with_sharding_constraint(weights, set_sharding)
  dst_batch = {**dst, **targets}
  # The last block runs only at the rows the metric reads (`metric_rows`), in every run.
  read = metric_rows(metric, config, dst_batch)
  src_read = metric_rows(metric, config, {**src, **targets})
  _, src_run = sweep_forward(params, config, src, capture=(site,), final_rows=src_read)
  value = src_run.cache[site]  # (L, ...)
  mask = dst["attention_mask"]
  x, dst_run = sweep_forward(params, config, dst, output_hidden_states=True, final_rows=read)
  inputs = jnp.concatenate([x[None], dst_run.hidden_states])  # inputs[l] = input of block l
  src_m = metric_of(params, config, metric, src_run.last, {**src, **targets}, row_weight)
  dst_m = metric_of(params, config, metric, dst_run.last, dst_batch, row_weight)
  depth = config.depth
  rows = []
  for l in range(depth):

    def one(w, l=l):  # w: (1, ...) the block-local weight of one patch
      if site == "out":  # block l's output is stored: the site's own mix, no block to run
        h = mix(inputs[l + 1], value[l], w[0])
      else:  # block l from its stored input, patched (leading 1: the one block run)
        h = run_layers(
          params,
          config,
          inputs[l],
          mask,
          start=l,
          stop=l + 1,
          patch={site: (value[l : l + 1], w)},
          final_rows=read,
        ).last
      last = (
        h
        if l == depth - 1
        else run_layers(params, config, h, mask, start=l + 1, final_rows=read).last
      )
      return metric_of(params, config, metric, last, dst_batch, row_weight)

    rows.append(_map_set(one, weights, chunk_size))
  return jnp.stack(rows), src_m, dst_m


def _run_sweep(
  params,
  config,
  clean,
  corrupted,
  metric,
  targets,
  site,
  over,
  positions,
  direction,
  chunk_size,
  mesh,
):
  src, dst, targets = checked_pair(config, clean, corrupted, targets, direction, params, metric)
  seq = dst["input_ids"].shape[1]
  block_weights = sweep_weights(config, site, seq, over, positions)
  weights, set_sharding = _patch_set(block_weights, mesh)
  row_weight = None
  if mesh is not None:
    params, src, dst, targets, row_weight = _place(
      params, config, src, dst, targets, metric, mesh, patch_set=True
    )
  values, src_m, dst_m = _sweep(
    params,
    config,
    src,
    dst,
    targets,
    weights,
    row_weight,
    site=site,
    metric=metric,
    chunk_size=_chunk(chunk_size),
    set_sharding=set_sharding,
  )
  values = sharded.flat_interventions(values, len(block_weights), axis=1)
  clean_m, corrupted_m = clean_and_corrupted(
    mesh_lib.to_host(src_m), mesh_lib.to_host(dst_m), direction
  )
  return PatchingResult(
    site,
    ("layer", "head" if over == "heads" else "position"),
    np.asarray(values, np.float64),
    clean_m,
    corrupted_m,
    direction,
  )


def head_patching(
  params: Params,
  config: BertConfig,
  clean,
  corrupted,
  metric: Metric,
  *,
  targets: Mapping | None = None,
  site: str = "head_out",
  positions=None,
  direction: str = "denoise",
  chunk_size: int | None = None,
  mesh=None,
) -> PatchingResult:
  """Patches every (layer, head) of a site alone: one compiled program.

  Args:
    params, config: the model (stacked layers; not a pruned one).
    clean, corrupted: the pair, batches of the same shape and the same attention mask
      (a pair whose masks differ is refused: `check_same_padding`).
    metric: `metric(params, config, out, batch) -> scalar` (module docstring).
    targets: extra (batch, ...) arrays the metric reads (`position`, `answer`, ...).
    site: "head_out" (each head's context before the output projection), "q",
      "k", "v" or "probs" (the latter computes T x T maps).
    positions: patch only these (query) positions; None: every position.
    direction: "denoise" (corrupted run, clean values) or "noise".
    chunk_size: patched runs of the blocks after the patched one evaluated at
      once (vmap width); None: `batching.default_chunk_size()`.
    mesh: a `jax.sharding.Mesh` (`bertjax.mesh.make_mesh`): the pair's rows split
      over "data" (and "fsdp"), each layer's heads over "interventions", parameters
      replicated (fsdp-sharded with "fsdp" > 1); see the module docstring for batches the
      row axes do not divide. None: one device.

  Returns:
    A `PatchingResult` with values (layers, heads).
  """
  _check_site(site, HEAD_SITES, "head_patching")
  if config.is_pruned:
    raise ValueError("head_patching needs stacked layers; this config is pruned")
  return _run_sweep(
    params,
    config,
    clean,
    corrupted,
    metric,
    targets,
    site,
    "heads",
    positions,
    direction,
    chunk_size,
    mesh,
  )


def position_patching(
  params: Params,
  config: BertConfig,
  clean,
  corrupted,
  metric: Metric,
  *,
  targets: Mapping | None = None,
  site: str = "out",
  direction: str = "denoise",
  chunk_size: int | None = None,
  mesh=None,
) -> PatchingResult:
  """Patches every (layer, position) of a site alone (all heads, all features): one program.

  Args:
    params, config, clean, corrupted, metric, targets, direction, chunk_size: as
      `head_patching`.
    mesh: as `head_patching`; each layer's positions are split over "interventions".
    site: any block site; "out" (the residual stream after each block, the input
      of the next) by default, "mid" (after attention and its LayerNorm),
      "attn_out", "ffn_out", ...; for head sites every head of the position.

  Returns:
    A `PatchingResult` with values (layers, positions).
  """
  _check_site(site, BLOCK_SITES, "position_patching")
  if config.is_pruned:
    raise ValueError("position_patching needs stacked layers; this config is pruned")
  return _run_sweep(
    params,
    config,
    clean,
    corrupted,
    metric,
    targets,
    site,
    "positions",
    None,
    direction,
    chunk_size,
    mesh,
  )


# Attribution patching ----------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("config", "site", "metric"))
def _attribution_forward(params, config, src, dst, targets, weights, row_weight, *, site, metric):
  """The source run, and the destination run keeping what its backward pass needs:
  `(src_m, dst_m, backward)`, `backward` the metric's VJP w.r.t. per-layer patch weights."""
  src_batch, dst_batch = {**src, **targets}, {**dst, **targets}
  _, src_run = sweep_forward(
    params, config, src, capture=(site,), final_rows=metric_rows(metric, config, src_batch)
  )
  src_m = metric_of(params, config, metric, src_run.last, src_batch, row_weight)
  value = jax.lax.stop_gradient(src_run.cache[site])
  read = metric_rows(metric, config, dst_batch)

  def patched(w):  # blocks unrolled: no stacked residual buffers (`run_layers(unroll=)`)
    _, run = sweep_forward(
      params, config, dst, patch={site: (value, w)}, final_rows=read, unroll=True
    )
    return metric_of(params, config, metric, run.last, dst_batch, row_weight)

  # One weight per layer and patch axis (as the sweep's block weights): zero, the destination.
  zero = jnp.zeros((config.depth, *weights.shape[2:]), value.dtype)
  dst_m, backward = jax.vjp(patched, zero)
  return src_m, dst_m, backward


@jax.jit
def _attribution_backward(backward, weights, dst_m):
  """Each patch's first-order effect: its weight against the gradient, layer by layer."""
  (grad,) = backward(jnp.ones_like(dst_m))  # (source - own) . d metric / d site, per weight
  delta = jnp.einsum("l...,p...->lp", grad, weights[:, 0].astype(grad.dtype))
  return dst_m + delta


def attribution_patching(
  params: Params,
  config: BertConfig,
  clean,
  corrupted,
  metric: Metric,
  *,
  targets: Mapping | None = None,
  site: str = "head_out",
  over: str = "heads",
  positions=None,
  direction: str = "denoise",
  mesh=None,
) -> PatchingResult:
  """Attribution patching: every patch of a sweep estimated from one backward pass.

  `metric(patched) ~= metric(dst) + sum (source - own) * d metric / d site`, the
  gradient taken at the destination run (Nanda 2023, "Attribution patching:
  activation patching at industrial scale"; Syed et al. 2023). Through the site
  mechanism this is `d metric / d weight` at weight 0, so it is exact calculus,
  not a re-derivation of the layer.

  Args:
    params, config, clean, corrupted, metric, targets, direction: as `head_patching`.
    site: as `head_patching` (over="heads") or `position_patching` (over="positions").
    over: "heads" ((layer, head) estimates, optionally at `positions` only) or
      "positions" ((layer, position) estimates).
    positions: with over="heads", the positions patched.
    mesh: a device mesh (see `head_patching`): there is no patch set to split (one
      backward pass serves every patch), so the pair's rows go over every axis. None: one
      device.

  Returns:
    A `PatchingResult` (method "attribution") shaped as the exact sweep's, whose
    values are the first-order estimates of the patched metric; compare with
    `agreement(exact, approx)`.
  """
  if over not in ("heads", "positions"):
    raise ValueError(f"{over=!r} must be 'heads' or 'positions'")
  if over == "positions" and positions is not None:
    raise ValueError(
      f"positions={positions!r} chooses the positions of head patches "
      "(over='heads'); over='positions' estimates every position already"
    )
  _check_site(site, HEAD_SITES if over == "heads" else BLOCK_SITES, f"attribution over {over}")
  src, dst, targets = checked_pair(config, clean, corrupted, targets, direction, params, metric)
  seq = dst["input_ids"].shape[1]
  weights = jnp.asarray(
    sweep_weights(config, site, seq, over, positions if over == "heads" else None)
  )
  row_weight = None
  if mesh is not None:
    params, src, dst, targets, row_weight = _place(
      params, config, src, dst, targets, metric, mesh, patch_set=False
    )
    weights = mesh_lib.shard_rows(np.asarray(weights), mesh, ())  # replicated
  # Two programs: XLA:CPU then keeps the destination's residuals as separate output arrays,
  # which the allocator reuses call after call, instead of one large temporary buffer it
  # maps afresh each time (measured: about 8% of the attribution's time).
  src_m, dst_m, backward = _attribution_forward(
    params, config, src, dst, targets, weights, row_weight, site=site, metric=metric
  )
  values, src_m, dst_m = mesh_lib.to_host(
    (_attribution_backward(backward, weights, dst_m), src_m, dst_m)
  )
  clean_m, corrupted_m = clean_and_corrupted(src_m, dst_m, direction)
  return PatchingResult(
    site,
    ("layer", "head" if over == "heads" else "position"),
    np.asarray(values, np.float64),
    clean_m,
    corrupted_m,
    direction,
    "attribution",
  )


# Path patching -----------------------------------------------------------------


@functools.partial(
  jax.jit,
  static_argnames=("config", "receivers", "receiver_sites", "metric", "chunk_size", "set_sharding"),
)
def _path(
  params,
  config,
  src,
  dst,
  targets,
  senders,
  row_weight,
  *,
  receivers,
  receiver_sites,
  metric,
  chunk_size,
  set_sharding,
):
  """Every sender head (I, m) of every layer below the first receiver: (first, I, m)."""
  if set_sharding is not None:
    senders = jax.lax.with_sharding_constraint(senders, set_sharding)
  depth, n = config.depth, config.num_attention_heads
  dst_batch = {**dst, **targets}
  read = metric_rows(metric, config, dst_batch)  # the last block's rows the metric reads
  _, src_run = sweep_forward(
    params,
    config,
    src,
    capture=("head_out",),
    final_rows=metric_rows(metric, config, {**src, **targets}),
  )
  mask = dst["attention_mask"]
  x, dst_run = sweep_forward(
    params, config, dst, output_hidden_states=True, capture=("head_out",), final_rows=read
  )
  inputs = jnp.concatenate([x[None], dst_run.hidden_states])
  src_m = metric_of(params, config, metric, src_run.last, {**src, **targets}, row_weight)
  dst_m = metric_of(params, config, metric, dst_run.last, dst_batch, row_weight)
  src_ho, dst_ho = src_run.cache["head_out"], dst_run.cache["head_out"]  # (L, B, T, N, D)
  first = min(layer for layer, _ in receivers)
  last = max(layer for layer, _ in receivers)
  w_recv = np.zeros((depth, 1, 1, n, 1), np.float32)
  for layer, head in receivers:
    w_recv[layer, 0, 0, head, 0] = 1.0
  rows = []
  for l in range(first):

    def one(h, l=l):
      sender = (jnp.arange(n) == h)[None, None, :, None]  # (1, 1, N, 1)
      # Every head frozen at the destination's own output except the sender (source).
      frozen = dst_ho.at[l].set(jnp.where(sender, src_ho[l], dst_ho[l]))
      step = run_layers(
        params,
        config,
        inputs[l],
        mask,
        start=l,
        stop=last + 1,
        patch={"head_out": (frozen, jnp.ones((), frozen.dtype))},
        capture=receiver_sites,
      )
      patch = {}
      for s in receiver_sites:  # the receivers' inputs as the sender's path left them
        full = jnp.zeros((depth, *step.cache[s].shape[1:]), step.cache[s].dtype)
        patch[s] = (full.at[l : last + 1].set(step.cache[s]), w_recv)
      out = run_layers(
        params, config, inputs[first], mask, start=first, patch=patch, final_rows=read
      ).last
      return metric_of(params, config, metric, out, dst_batch, row_weight)

    rows.append(_map_set(one, senders, chunk_size))
  return jnp.stack(rows), src_m, dst_m


def path_patching(
  params: Params,
  config: BertConfig,
  clean,
  corrupted,
  metric: Metric,
  *,
  receivers: Sequence[tuple[int, int]],
  receiver_sites: str | Sequence[str] = "v",
  targets: Mapping | None = None,
  direction: str = "denoise",
  chunk_size: int | None = None,
  mesh=None,
) -> PatchingResult:
  """Path patching from every head below the receivers into the receivers' q/k/v inputs.

  Wang et al. 2023 ("Interpretability in the wild", IOI): for each sender head,
  the effect on the metric that passes through the receiver heads' chosen inputs
  only. Step 1 runs the destination input with every head output frozen to its
  own value except the sender's, which takes the source's (MLPs and LayerNorms
  recompute), and records the receivers' `receiver_sites`; step 2 runs the
  destination input with only those receiver sites patched to the recorded
  values. Both are site patches (module docstring); blocks below the sender
  (step 1) and below the first receiver (step 2) are reused from the stored run.

  Args:
    params, config, clean, corrupted, metric, targets, direction, chunk_size: as
      `head_patching`.
    receivers: (layer, head) pairs.
    receiver_sites: "q", "k", "v" or several: which input of the receivers the path ends in.
    mesh: a device mesh (see `head_patching`): rows over "data" (and "fsdp"), each layer's
      sender heads over "interventions". None: one device.

  Returns:
    A `PatchingResult` (method "path", site "head_out") with values (layers,
    heads) for each sender; NaN at layers at or above the first receiver's.
  """
  sites = (receiver_sites,) if isinstance(receiver_sites, str) else tuple(receiver_sites)
  if not sites or any(s not in RECEIVER_SITES for s in sites):
    raise ValueError(f"receiver_sites={receiver_sites!r} must be some of {RECEIVER_SITES}")
  receivers = list(receivers)
  if any(np.ndim(r) != 1 or len(r) != 2 for r in receivers):
    raise ValueError(
      f"receivers={receivers!r} must be a sequence of (layer, head) pairs, "
      "e.g. [(2, 1)] for one receiver"
    )
  pairs = tuple(sorted({(int(layer), int(head)) for layer, head in receivers}))
  if not pairs:
    raise ValueError("receivers is empty; give (layer, head) pairs")
  for layer, head in pairs:
    if not (0 <= layer < config.depth and 0 <= head < config.num_attention_heads):
      raise ValueError(
        f"receiver (layer, head)={(layer, head)} is outside "
        f"({config.depth}, {config.num_attention_heads})"
      )
  if pairs[0][0] == 0:
    raise ValueError(f"receivers {list(pairs)} include layer 0, which no head precedes")
  if config.is_pruned:
    raise ValueError("path_patching needs stacked layers; this config is pruned")
  if config.kv_heads != config.num_attention_heads and set(sites) & {"k", "v"}:
    raise ValueError(
      f"path_patching into receivers' {sorted(set(sites) & {'k', 'v'})}: a "
      f"{config.model_type} model groups its key/value heads "
      f"({config.kv_heads} for {config.num_attention_heads}), so a receiver "
      "head has no key or value of its own; use receiver_sites=('q',)"
    )
  src, dst, targets = checked_pair(config, clean, corrupted, targets, direction, params, metric)
  n = config.num_attention_heads
  senders, set_sharding = _patch_set(np.arange(n, dtype=np.int32), mesh)
  row_weight = None
  if mesh is not None:
    params, src, dst, targets, row_weight = _place(
      params, config, src, dst, targets, metric, mesh, patch_set=True
    )
  rows, src_m, dst_m = _path(
    params,
    config,
    src,
    dst,
    targets,
    senders,
    row_weight,
    receivers=pairs,
    receiver_sites=tuple(sorted(set(sites))),
    metric=metric,
    chunk_size=_chunk(chunk_size),
    set_sharding=set_sharding,
  )
  values = np.full((config.depth, n), np.nan)
  values[: pairs[0][0]] = sharded.flat_interventions(rows, n, axis=1)
  clean_m, corrupted_m = clean_and_corrupted(
    mesh_lib.to_host(src_m), mesh_lib.to_host(dst_m), direction
  )
  return PatchingResult(
    "head_out",
    ("layer", "head"),
    np.asarray(values, np.float64),
    clean_m,
    corrupted_m,
    direction,
    "path",
  )
