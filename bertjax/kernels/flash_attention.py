"""Fused (flash) attention in Pallas, Triton layout: padding, packing, head ablation, dropout.

Layout follows `jax.nn.dot_product_attention`: q, k, v are `(batch, seq, heads, head_dim)`.
The grid runs over `(batch, heads, q-blocks)`; each program keeps its query block on chip
and loops over key blocks (Triton style). Per sequence only `cdiv(kv_length, block_k)` key
blocks are visited: blocks past a sequence's length are skipped, not masked, in the
forward and in both backward kernels. Query rows at or past `kv_length` are padding and
produce zeros (so their gradients are zero too).

Head ablation with `xi` of shape `(batch, heads)` is applied in the epilogue:

* `"scale"` (Michel et al. 2019): `out = xi * (A @ V)`.
* `"uniform"` (Kovaleva et al. 2019): `out = xi * (A @ V) + (1 - xi) * mean(V over allowed
  keys)`, i.e. the attention is `xi * A + (1 - xi) * U`; the sum of V over the allowed keys
  is accumulated alongside the softmax.

Both are exact and differentiable with respect to q, k, v and xi (`jax.custom_vjp` with a
Pallas backward: one small kernel for `delta = dO . O` and `d xi`, one kernel for dk/dv
looping over query blocks, one for dq looping over key blocks).

Attention dropout (`dropout_rate > 0`) is inverted dropout on the attention that mixes the
values (after the uniform mix in "uniform" mode): each kernel recomputes the keep bits of its
tile from the absolute `(b, h, q, k)` indices with `kernels.dropout` (integer hashing; no mask
is stored), so the forward, dK/dV and dQ kernels and the reference see one mask. With `M` the
mask scaled by `1 / (1 - rate)`: the forward accumulates `(M * P~) V` (and the masked sum of V
for "uniform") against the undropped normaliser; the backward uses `dV = (M * P_mix)^T dO` and
`dS = P * (M * dP - delta)` with `delta = dO . O_attn` of the dropped output. The `1 / (1 -
rate)` factor of the accumulated sums is applied once in each epilogue.

`kernels.flash_attention_stats.attention_statistics_pallas` runs a second pass over the keys
that reuses the forward's log-sum-exp and reduces each query row's attention distribution
to scalars (entropy, mass on [CLS], on special tokens, on self, previous and next token)
without writing a T x T map.

Modern attention, inside the same kernels (`KernelConfig`):

* a sliding window (`Mask.window` w: keys with `|q - k| <= w // 2`): each query block visits
  only the key blocks that meet its band (`tiling.key_blocks`), and each key block only the
  query blocks that see it (`tiling.query_blocks`), so a window layer costs T x window;
* a position bias (`PositionBias`: MPNet/T5 buckets, ALiBi) formed per tile from a small
  per-head table (`tiling.bias_tile`); its gradient is reduced per tile to the table
  (`tiling.bias_grad_tile`), in the dQ kernel, so no T x T bias exists in either pass;
* grouped key/value heads: query head h reads key/value head `h // groups` through the
  BlockSpecs, and the dK/dV kernel runs per key/value head, looping over its query heads,
  so K and V are never repeated;
* DeBERTa's disentangled terms (`DisentangledBias`), as FlashDeBERTa: the per-row position
  scores `scale q Kr^T` and `scale k Qr^T` are formed outside (`disentangled_inputs`, T x
  rows read per head); each tile gathers its c2p and p2c entries at the relative row of
  each (query, key), read from a `(2 T,)` table (`tiling.disentangled_tile`), and the dQ and
  dK/dV kernels scatter-add `dS` into the scores' gradients (`tiling.disentangled_grad`:
  atomic adds on Triton), from which autodiff reaches q, k and the tables.

The kernels target the Triton lowering on GPU (compiled calls always pass Triton compiler
params, since JAX's default Pallas GPU backend is Mosaic GPU) and run anywhere in interpret
mode. Inputs are padded to a multiple of the blocks along the sequence and to a power of two
(>= 16) along head_dim (`kernels.tiling`, which holds what the variants share). The TPU
(Mosaic) variant is `bertjax/kernels/flash_attention_tpu.py`, which `kernels.attention` picks on TPU;
`kernels.attention` refuses to compile this Triton variant on TPU with a clear error.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from . import dropout as drop
from .disentangled import DisentangledBias, default_scale, log_bucket
from .masks import Mask
from .position_bias import PositionBias
from .reference import Ablation, reference_attention
from .tiling import (
  MASK_VALUE,
  BlockSizes,
  KernelConfig,
  allowed_tile,
  bias_args,
  bias_grad_tile,
  bias_specs,
  bias_tile,
  block_slice,
  common_specs,
  disentangled_grad,
  dot,
  key_blocks,
  pad_head_dim,
  pallas_call,
  prepare,
  query_blocks,
  relative_rows,
  table_row,
  take_bias,
)


def _keep(cfg: KernelConfig, rows, cols):
  """(bq, bk) bool kept entries of a tile from its row (bq,) and column (bk,) hashes."""
  return drop.keep(rows[:, None], cols[None, :], cfg.drop_threshold)


# ----------------------------------------------------------------------------------------
# Forward.


def _fwd_kernel(*refs, cfg: KernelConfig, with_residuals: bool):
  """One (batch, head, q-block) program: online softmax over the sequence's key blocks."""
  refs = list(refs)
  q_ref, k_ref, v_ref, len_ref, xi_ref = refs[:5]
  refs = refs[5:]
  segq_ref = segk_ref = None
  if cfg.has_segments:
    segq_ref, segk_ref = refs[:2]
    refs = refs[2:]
  key_ref = refs.pop(0) if cfg.dropout else None
  table = take_bias(cfg, refs)  # this head's bias table (or DeBERTa's refs)
  o_ref = refs.pop(0)
  block_q, head_dim = q_ref.shape
  block_k = cfg.block_sizes.block_k
  length = len_ref[()]
  xi = xi_ref[()]
  q_start = pl.program_id(2) * block_q
  q_idx = q_start + jnp.arange(block_q)
  q = q_ref[...]
  seg_q = segq_ref[...] if cfg.has_segments else None
  rows = drop.row_hash(key_ref[()], q_idx) if cfg.dropout else None

  def body(j, carry):
    acc, m_prev, l_prev = carry[:3]
    k_slice = block_slice(j * block_k, block_k)
    k_idx = j * block_k + jnp.arange(block_k)
    seg_k = segk_ref[k_slice] if cfg.has_segments else None
    allowed = allowed_tile(q_idx, k_idx, length, seg_q, seg_k, cfg.half_window)
    s = dot(q, k_ref[k_slice, :], trans_b=True) * cfg.scale  # (bq, bk)
    if cfg.bias_kind:
      s = s + bias_tile(cfg, table, q_idx, k_idx)
    s = jnp.where(allowed, s, MASK_VALUE)
    m_next = jnp.maximum(m_prev, s.max(axis=-1))
    correction = jnp.exp(m_prev - m_next)
    p = jnp.where(allowed, jnp.exp(s - m_next[:, None]), 0.0)
    v = v_ref[k_slice, :]
    kept = _keep(cfg, rows, drop.col_hash(k_idx)) if cfg.dropout else None
    p_v = p if kept is None else jnp.where(kept, p, 0.0)  # the normaliser keeps every p
    acc = acc * correction[:, None] + dot(p_v, v)
    l_next = l_prev * correction + p.sum(axis=-1)
    if not cfg.uniform:
      return acc, m_next, l_next
    # Uniform ablation: the sum of V and the count over the allowed keys, per query row.
    vsum, count = carry[3:]
    allowed_f = allowed.astype(jnp.float32)
    vsum = vsum + dot(allowed_f if kept is None else jnp.where(kept, allowed_f, 0.0), v)
    count = count + allowed_f.sum(axis=-1)
    return acc, m_next, l_next, vsum, count

  zeros_row = jnp.zeros((block_q,), jnp.float32)
  zeros_tile = jnp.zeros((block_q, head_dim), jnp.float32)
  init = (zeros_tile, zeros_row + MASK_VALUE, zeros_row)
  if cfg.uniform:
    init += (zeros_tile, zeros_row)
  # Query blocks wholly past the length, key blocks past it or outside the window: skipped.
  lo, hi = key_blocks(cfg, q_start, block_q, block_k, length)
  acc, m, l, *uniform_sums = lax.fori_loop(lo, hi, body, init)

  row_real = (q_idx < length)[:, None]
  if cfg.dropout:
    acc = acc * cfg.keep_scale
  o_attn = jnp.where(row_real & (l[:, None] > 0), acc / jnp.where(l > 0, l, 1.0)[:, None], 0.0)
  out = xi * o_attn
  if cfg.uniform:
    vsum, count = uniform_sums
    if cfg.dropout:
      vsum = vsum * cfg.keep_scale
    v_mean = jnp.where(row_real, vsum / jnp.maximum(count, 1.0)[:, None], 0.0)
    out = out + (1.0 - xi) * v_mean
  o_ref[...] = out.astype(o_ref.dtype)
  if with_residuals:
    lse_ref, oa_ref = refs[:2]
    lse_ref[...] = jnp.where(l > 0, m + jnp.log(jnp.where(l > 0, l, 1.0)), 0.0)
    oa_ref[...] = o_attn.astype(oa_ref.dtype)
    if cfg.uniform:
      vmean_ref, count_ref = refs[2:4]
      vmean_ref[...] = v_mean
      count_ref[...] = count


def forward_call(
  cfg: KernelConfig, q, k, v, lengths, seg, xi, with_residuals: bool, seed=None, table=None
):
  """Runs the forward kernel on padded inputs (the statistics pass reuses it for the lse).

  `table`: the position bias table (heads, entries) when `cfg.bias_kind`, or for
  "disentangled" `(lut, c2p scores or None, p2c scores or None)` (`disentangled_inputs`).
  Returns `[out]`, or with residuals `[out, lse, o_attn]` and in uniform mode `[v_mean, count]`.
  """
  batch, seq_pad, heads, head_dim = q.shape
  block_q = cfg.block_sizes.block_q
  grid = (batch, heads, seq_pad // block_q)
  in_specs = common_specs(cfg, seq_pad, head_dim, block_q)
  args = [q, k, v, lengths, xi] + ([seg, seg] if cfg.has_segments else [])
  if cfg.dropout:
    in_specs.append(pl.BlockSpec((None, None), lambda b, h, i: (b, h)))
    args.append(drop.stream_keys(seed, batch, heads))
  in_specs += bias_specs(cfg, seq_pad)
  args += bias_args(cfg, table)
  row_spec = pl.BlockSpec((None, None, block_q), lambda b, h, i: (b, h, i))
  tile_spec = pl.BlockSpec((None, block_q, None, head_dim), lambda b, h, i: (b, i, h, 0))
  out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype)]
  out_specs = [tile_spec]
  if with_residuals:
    rows = jax.ShapeDtypeStruct((batch, heads, seq_pad), jnp.float32)
    out_shape += [rows, jax.ShapeDtypeStruct(q.shape, q.dtype)]  # lse, o_attn
    out_specs += [row_spec, tile_spec]
    if cfg.uniform:
      out_shape += [jax.ShapeDtypeStruct(q.shape, jnp.float32), rows]  # v_mean, count
      out_specs += [tile_spec, row_spec]
  kernel = functools.partial(_fwd_kernel, cfg=cfg, with_residuals=with_residuals)
  return pallas_call(
    kernel,
    cfg,
    head_dim,
    grid=grid,
    in_specs=in_specs,
    out_specs=out_specs,
    out_shape=out_shape,
    name="bertjax_attention_fwd",
  )(*args)


# ----------------------------------------------------------------------------------------
# Backward.


def _bwd_pre_kernel(*refs, cfg: KernelConfig):
  """delta_i = dO_i . O_attn_i and the per-row contribution to d xi."""
  if cfg.uniform:
    do_ref, oa_ref, vmean_ref, len_ref, delta_ref, dxi_ref = refs
  else:
    do_ref, oa_ref, len_ref, delta_ref, dxi_ref = refs
  block_q = do_ref.shape[0]
  q_idx = pl.program_id(2) * block_q + jnp.arange(block_q)
  row_real = q_idx < len_ref[()]
  do = do_ref[...].astype(jnp.float32)
  oa = oa_ref[...].astype(jnp.float32)
  delta = jnp.where(row_real, (do * oa).sum(axis=-1), 0.0)
  delta_ref[...] = delta
  if cfg.uniform:
    dxi = jnp.where(row_real, (do * (oa - vmean_ref[...])).sum(axis=-1), 0.0)
  else:
    dxi = delta
  dxi_ref[...] = dxi


def _dkv_kernel(*refs, cfg: KernelConfig):
  """One (batch, key/value head, k-block) program: dK, dV summed over the head's query heads
  (one, or `cfg.groups` with grouped heads), each looping over the query blocks that see
  this key block."""
  refs = list(refs)
  q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, len_ref, xi_ref = refs[:8]
  refs = refs[8:]
  segq_ref = segk_ref = coef_ref = key_ref = table_ref = None
  if cfg.has_segments:
    segq_ref, segk_ref = refs[:2]
    refs = refs[2:]
  if cfg.uniform:
    coef_ref = refs.pop(0)
  if cfg.dropout:
    key_ref = refs.pop(0)
  disentangled = cfg.bias_kind == "disentangled"
  if disentangled:  # one query head per key head: the refs serve the one loop below
    table_ref = take_bias(cfg, refs)
    if "p2c" in cfg.terms:
      refs.pop(0)  # the zeros the p2c scores' gradient starts from (aliased to it)
  elif cfg.bias_kind:
    table_ref = refs.pop(0)
  dk_ref, dv_ref, *dp2c_ref = refs  # dp2c: DeBERTa's p2c scores' gradient, this key block
  block_k, head_dim = k_ref.shape
  block_q = cfg.block_sizes.block_q_bwd
  length = len_ref[()]
  k_start = pl.program_id(2) * block_k
  k_idx = k_start + jnp.arange(block_k)
  k = k_ref[...]
  v = v_ref[...]
  seg_k = segk_ref[...] if cfg.has_segments else None
  cols = drop.col_hash(k_idx) if cfg.dropout else None
  lo, hi = query_blocks(cfg, k_start, block_k, block_q, length)
  zeros = jnp.zeros((block_k, head_dim), jnp.float32)
  dk_total, dv_total = zeros, zeros

  for r in range(cfg.groups):  # the query heads of this key/value head
    xi = xi_ref[r]
    key = key_ref[r] if cfg.dropout else None
    table = table_ref if disentangled else table_row(cfg, table_ref, r) if cfg.bias_kind else None

    def body(i, carry, r=r, xi=xi, key=key, table=table):
      dk, dv = carry
      q_slice = block_slice(i * block_q, block_q)
      q_idx = i * block_q + jnp.arange(block_q)
      seg_q = segq_ref[q_slice] if cfg.has_segments else None
      allowed = (
        allowed_tile(q_idx, k_idx, length, seg_q, seg_k, cfg.half_window)
        & (q_idx < length)[:, None]
      )
      q = q_ref[q_slice, r, :]
      do = do_ref[q_slice, r, :]
      s = dot(q, k, trans_b=True) * cfg.scale  # (bq, bk)
      if cfg.bias_kind:
        s = s + bias_tile(cfg, table, q_idx, k_idx)
      p = jnp.where(allowed, jnp.exp(s - lse_ref[r, q_slice][:, None]), 0.0)
      # The attention that mixes V: xi * A (+ (1 - xi) / n_i on allowed keys in uniform mode).
      p_mix = xi * p
      if cfg.uniform:
        p_mix = p_mix + jnp.where(allowed, coef_ref[r, q_slice][:, None], 0.0)
      dp = dot(do, v, trans_b=True)  # (bq, bk)
      if cfg.dropout:
        kept = _keep(cfg, drop.row_hash(key, q_idx), cols)
        p_mix = jnp.where(kept, p_mix, 0.0)  # times keep_scale, applied to dv at the end
        dp = jnp.where(kept, dp * cfg.keep_scale, 0.0)
      dv = dv + dot(p_mix, do, trans_a=True)
      ds = p * (dp - delta_ref[r, q_slice][:, None])
      if dp2c_ref:  # dL/dS = xi * ds, summed into key k's row of P at r(q, k)
        rel = relative_rows(cfg, table[0], q_idx, k_idx)
        disentangled_grad(dp2c_ref[0], (k_idx - k_start)[None, :], rel, xi * ds)
      dk = dk + dot(ds, q, trans_a=True)
      return dk, dv

    dk, dv = lax.fori_loop(lo, hi, body, (zeros, zeros))
    dk_total = dk_total + dk * (xi * cfg.scale)
    dv_total = dv_total + dv
  if cfg.dropout:
    dv_total = dv_total * cfg.keep_scale
  dk_ref[...] = dk_total.astype(dk_ref.dtype)
  dv_ref[...] = dv_total.astype(dv_ref.dtype)


def _dq_kernel(*refs, cfg: KernelConfig):
  """One (batch, head, q-block) program: loops over the real key blocks for dQ."""
  refs = list(refs)
  q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, len_ref, xi_ref = refs[:8]
  refs = refs[8:]
  segq_ref = segk_ref = None
  if cfg.has_segments:
    segq_ref, segk_ref = refs[:2]
    refs = refs[2:]
  key_ref = refs.pop(0) if cfg.dropout else None
  table = take_bias(cfg, refs)
  disentangled = cfg.bias_kind == "disentangled"
  tabled = cfg.bias_kind is not None and not disentangled  # a (heads, entries) table
  if disentangled and "c2p" in cfg.terms:
    refs.pop(0)  # the zeros the c2p scores' gradient starts from (aliased to it)
  dq_ref = refs.pop(0)
  dtable_ref = refs.pop(0) if tabled else None
  dc2p_ref = refs.pop(0) if disentangled and "c2p" in cfg.terms else None
  block_q, head_dim = q_ref.shape
  block_k = cfg.block_sizes.block_k_bwd
  length = len_ref[()]
  xi = xi_ref[()]
  q_start = pl.program_id(2) * block_q
  q_idx = q_start + jnp.arange(block_q)
  q = q_ref[...]
  do = do_ref[...]
  lse = lse_ref[...]
  delta = delta_ref[...]
  seg_q = segq_ref[...] if cfg.has_segments else None
  row_real = (q_idx < length)[:, None]
  rows = drop.row_hash(key_ref[()], q_idx) if cfg.dropout else None

  def body(j, carry):
    dq, dtable = carry
    k_slice = block_slice(j * block_k, block_k)
    k_idx = j * block_k + jnp.arange(block_k)
    seg_k = segk_ref[k_slice] if cfg.has_segments else None
    allowed = allowed_tile(q_idx, k_idx, length, seg_q, seg_k, cfg.half_window) & row_real
    k = k_ref[k_slice, :]
    s = dot(q, k, trans_b=True) * cfg.scale
    if cfg.bias_kind:
      s = s + bias_tile(cfg, table, q_idx, k_idx)
    p = jnp.where(allowed, jnp.exp(s - lse[:, None]), 0.0)
    dp = dot(do, v_ref[k_slice, :], trans_b=True)
    if cfg.dropout:
      dp = jnp.where(_keep(cfg, rows, drop.col_hash(k_idx)), dp * cfg.keep_scale, 0.0)
    ds = p * (dp - delta[:, None])
    if tabled:  # dL/dS = xi * ds: the bias table's share, reduced per tile
      dtable = dtable + bias_grad_tile(cfg, xi * ds, q_idx, k_idx)
    if dc2p_ref is not None:  # ... and query q's row of C at r(q, k)
      rel = relative_rows(cfg, table[0], q_idx, k_idx)
      disentangled_grad(dc2p_ref, (q_idx - q_start)[:, None], rel, xi * ds)
    return dq + dot(ds, k), dtable

  lo, hi = key_blocks(cfg, q_start, block_q, block_k, length)
  width = 0 if not tabled else 1 if cfg.bias_kind == "alibi" else cfg.num_buckets
  init = (jnp.zeros((block_q, head_dim), jnp.float32), jnp.zeros((max(width, 1),), jnp.float32))
  dq, dtable = lax.fori_loop(lo, hi, body, init)
  dq_ref[...] = (dq * (xi * cfg.scale)).astype(dq_ref.dtype)
  if tabled:
    dtable_ref[...] = dtable


def _bwd_call(cfg: KernelConfig, residuals, dout):
  """The backward: delta and d xi per row, then dK/dV, then dQ (and the bias table's)."""
  q, k, v, lengths, seg, xi, seed, table, lse, o_attn, v_mean, count = residuals
  batch, seq_pad, heads, head_dim = q.shape
  bs = cfg.block_sizes
  keys = drop.stream_keys(seed, batch, heads) if cfg.dropout else None
  row_q = pl.BlockSpec((None, None, bs.block_q_bwd), lambda b, h, i: (b, h, i))
  tile_q = pl.BlockSpec((None, bs.block_q_bwd, None, head_dim), lambda b, h, i: (b, i, h, 0))
  len_spec = pl.BlockSpec((None,), lambda b, h, i: (b,))
  rows = jax.ShapeDtypeStruct((batch, heads, seq_pad), jnp.float32)

  # 1) delta and d xi per row.
  pre_args = [dout, o_attn] + ([v_mean] if cfg.uniform else []) + [lengths]
  pre_specs = [tile_q, tile_q] + ([tile_q] if cfg.uniform else []) + [len_spec]
  delta, dxi_rows = pallas_call(
    functools.partial(_bwd_pre_kernel, cfg=cfg),
    cfg,
    head_dim,
    grid=(batch, heads, seq_pad // bs.block_q_bwd),
    in_specs=pre_specs,
    out_specs=[row_q, row_q],
    out_shape=[rows, rows],
    name="bertjax_attention_bwd_pre",
  )(*pre_args)
  dxi = dxi_rows.sum(axis=-1)

  dk, dv, dp2c = _bwd_dkv(cfg, q, k, v, dout, lse, delta, lengths, seg, xi, keys, table, count)
  dq, dtable = _bwd_dq(cfg, q, k, v, dout, lse, delta, lengths, seg, xi, keys, table)
  if cfg.bias_kind == "disentangled":  # the relative-row table's is None (integers)
    dtable = (None, dtable, dp2c)
  return dq, dk, dv, dxi.astype(xi.dtype), dtable


def _bwd_dkv(cfg: KernelConfig, q, k, v, dout, lse, delta, lengths, seg, xi, keys, table, count):
  """dK, dV: grid over key/value heads and key blocks; each program loops over the query
  heads of its group (g of them) and the query blocks that see its keys."""
  batch, seq_pad, _heads, head_dim = q.shape
  kv_heads, g = k.shape[2], cfg.groups
  bs = cfg.block_sizes
  seg_args = [seg, seg] if cfg.has_segments else []
  group = lambda a: a.reshape(batch, kv_heads, g, *a.shape[2:])  # (B, H, ...) by group
  full_q = pl.BlockSpec((None, seq_pad, g, head_dim), lambda b, h, j: (b, 0, h, 0))
  tile_k = pl.BlockSpec((None, bs.block_k_bwd, None, head_dim), lambda b, h, j: (b, j, h, 0))
  group_rows = pl.BlockSpec((None, None, g, seq_pad), lambda b, h, j: (b, h, 0, 0))
  group_xi = pl.BlockSpec((None, None, g), lambda b, h, j: (b, h, 0))
  len_k = pl.BlockSpec((None,), lambda b, h, j: (b,))
  dkv_specs = [full_q, tile_k, tile_k, full_q, group_rows, group_rows, len_k, group_xi]
  dkv_args = [q, k, v, dout, group(lse), group(delta), lengths, group(xi)] + seg_args
  if cfg.has_segments:
    dkv_specs += [
      pl.BlockSpec((None, seq_pad), lambda b, h, j: (b, 0)),
      pl.BlockSpec((None, bs.block_k_bwd), lambda b, h, j: (b, j)),
    ]
  if cfg.uniform:
    # (1 - xi) / n_i: the uniform part's weight on each allowed key of real query row i.
    coef = jnp.where(count > 0, (1.0 - xi)[:, :, None] / jnp.maximum(count, 1.0), 0.0)
    dkv_args.append(group(coef))
    dkv_specs.append(group_rows)
  if cfg.dropout:
    dkv_args.append(group(keys))
    dkv_specs.append(group_xi)
  out_specs = [tile_k, tile_k]
  out_shape = [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)]
  aliases = {}
  if cfg.bias_kind == "disentangled":  # g == 1: the (b, h, i) specs fit this grid
    dkv_args += bias_args(cfg, table)
    dkv_specs += bias_specs(cfg, seq_pad)
    if "p2c" in cfg.terms:  # atomic adds into zeros passed in: no store races an add
      rows = pl.BlockSpec((None, None, bs.block_k_bwd, cfg.rel_width), lambda b, h, j: (b, h, j, 0))
      aliases = {len(dkv_args): 2}
      dkv_args.append(jnp.zeros(table[2].shape, jnp.float32))
      dkv_specs.append(rows)
      out_specs.append(rows)
      out_shape.append(jax.ShapeDtypeStruct(table[2].shape, jnp.float32))
  elif cfg.bias_kind:
    dkv_args.append(table.reshape(kv_heads, g, -1))
    dkv_specs.append(pl.BlockSpec((None, g, table.shape[-1]), lambda b, h, j: (h, 0, 0)))
  dk, dv, *dp2c = pallas_call(
    functools.partial(_dkv_kernel, cfg=cfg),
    cfg,
    head_dim,
    grid=(batch, kv_heads, seq_pad // bs.block_k_bwd),
    in_specs=dkv_specs,
    out_specs=out_specs,
    out_shape=out_shape,
    input_output_aliases=aliases,
    name="bertjax_attention_bwd_dkv",
  )(*dkv_args)
  return dk, dv, (dp2c[0] if dp2c else None)


def _bwd_dq(cfg: KernelConfig, q, k, v, dout, lse, delta, lengths, seg, xi, keys, table):
  """dQ and the bias table's gradient (DeBERTa: the c2p scores'): grid over query blocks,
  loop over key blocks."""
  batch, seq_pad, heads, head_dim = q.shape
  g, bs = cfg.groups, cfg.block_sizes
  seg_args = [seg, seg] if cfg.has_segments else []
  row_q = pl.BlockSpec((None, None, bs.block_q_bwd), lambda b, h, i: (b, h, i))
  tile_q = pl.BlockSpec((None, bs.block_q_bwd, None, head_dim), lambda b, h, i: (b, i, h, 0))
  len_spec = pl.BlockSpec((None,), lambda b, h, i: (b,))
  xi_spec = pl.BlockSpec((None, None), lambda b, h, i: (b, h))
  full_kv = pl.BlockSpec((None, seq_pad, None, head_dim), lambda b, h, i: (b, 0, h // g, 0))
  dq_specs = [tile_q, full_kv, full_kv, tile_q, row_q, row_q, len_spec, xi_spec]
  if cfg.has_segments:
    dq_specs += [
      pl.BlockSpec((None, bs.block_q_bwd), lambda b, h, i: (b, i)),
      pl.BlockSpec((None, seq_pad), lambda b, h, i: (b, 0)),
    ]
  extra_args = [keys] if cfg.dropout else []
  if cfg.dropout:
    dq_specs.append(xi_spec)
  out_specs = [tile_q]
  out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype)]
  extra_args += bias_args(cfg, table)
  dq_specs += bias_specs(cfg, seq_pad)
  aliases = {}
  if cfg.bias_kind == "disentangled" and "c2p" in cfg.terms:  # zeros passed in, as dK/dV's
    rows = pl.BlockSpec((None, None, bs.block_q_bwd, cfg.rel_width), lambda b, h, i: (b, h, i, 0))
    aliases = {8 + len(seg_args) + len(extra_args): 1}
    extra_args.append(jnp.zeros(table[1].shape, jnp.float32))
    dq_specs.append(rows)
    out_specs.append(rows)
    out_shape.append(jax.ShapeDtypeStruct(table[1].shape, jnp.float32))
  elif cfg.bias_kind and cfg.bias_kind != "disentangled":
    width = table.shape[-1]
    blocks = seq_pad // bs.block_q_bwd
    out_specs.append(pl.BlockSpec((None, None, None, width), lambda b, h, i: (b, h, i, 0)))
    out_shape.append(jax.ShapeDtypeStruct((batch, heads, blocks, width), jnp.float32))
  dq, *dtable = pallas_call(
    functools.partial(_dq_kernel, cfg=cfg),
    cfg,
    head_dim,
    grid=(batch, heads, seq_pad // bs.block_q_bwd),
    in_specs=dq_specs,
    out_specs=out_specs,
    out_shape=out_shape,
    input_output_aliases=aliases,
    name="bertjax_attention_bwd_dq",
  )(q, k, v, dout, lse, delta, lengths, xi, *seg_args, *extra_args)
  if cfg.bias_kind == "disentangled":
    return dq, (dtable[0] if dtable else None)  # (batch, heads, seq_pad, rel_width)
  return dq, (dtable[0].sum((0, 2)) if cfg.bias_kind else None)  # (heads, entries)


# ----------------------------------------------------------------------------------------
# custom_vjp wrapper on padded inputs.


def _position_bias(cfg: KernelConfig, table):
  """The kernels' (heads, entries) table as the reference's `PositionBias`."""
  if not cfg.bias_kind:
    return None
  if cfg.bias_kind == "alibi":
    return PositionBias(table[:, 0], "alibi")
  return PositionBias(table.T, "buckets", cfg.num_buckets, cfg.max_distance)


def _reference_padded(cfg: KernelConfig, q, k, v, lengths, seg, xi, seed, table):
  return reference_attention(
    q,
    k,
    v,
    mask=Mask(lengths, seg, None, None if cfg.half_window is None else 2 * cfg.half_window),
    head_mask=xi,
    ablation=cfg.ablation,
    scale=cfg.scale,
    dropout_rate=cfg.dropout_rate,
    dropout_seed=seed,
    bias=_position_bias(cfg, table),
  )


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(cfg: KernelConfig, q, k, v, lengths, seg, xi, seed, table):
  (out,) = forward_call(
    cfg, q, k, v, lengths, seg, xi, with_residuals=False, seed=seed, table=table
  )
  return out


def _flash_fwd(cfg: KernelConfig, q, k, v, lengths, seg, xi, seed, table):
  out, lse, o_attn, *uniform_res = forward_call(
    cfg, q, k, v, lengths, seg, xi, with_residuals=True, seed=seed, table=table
  )
  v_mean, count = uniform_res if cfg.uniform else (None, None)
  return out, (q, k, v, lengths, seg, xi, seed, table, lse, o_attn, v_mean, count)


def _flash_bwd(cfg: KernelConfig, residuals, dout):
  q, k, v, lengths, seg, xi, seed, table = residuals[:8]
  if cfg.backward == "reference":
    _, vjp = jax.vjp(
      lambda q_, k_, v_, xi_, t_: _reference_padded(cfg, q_, k_, v_, lengths, seg, xi_, seed, t_),
      q,
      k,
      v,
      xi,
      table,
    )
    dq, dk, dv, dxi, dtable = vjp(dout)
  else:
    dq, dk, dv, dxi, dtable = _bwd_call(cfg, residuals, dout)
  return dq, dk, dv, None, None, dxi, None, dtable


_flash.defvjp(_flash_fwd, _flash_bwd)


def flash_attention(
  q,
  k,
  v,
  *,
  mask: Mask | None = None,
  head_mask=None,
  ablation: Ablation = "scale",
  scale: float | None = None,
  block_sizes: BlockSizes | None = None,
  interpret: bool = False,
  backward: str = "pallas",
  dropout_rate: float = 0.0,
  dropout_seed=None,
  bias: PositionBias | DisentangledBias | None = None,
):
  """Fused attention on `(batch, seq, heads, head_dim)` inputs (validated by the caller).

  Args:
    q: queries `(batch, seq, heads, head_dim)`.
    k: keys `(batch, seq, kv_heads, head_dim)`, kv_heads dividing heads.
    v: values, shaped like k.
    mask: a `Mask` in lengths form: `kv_lengths` (right padding; None means full length),
      `segment_ids` (packed sequences) and `window`, no `key_mask` (`Mask.as_lengths`
      folds one in); None means no padding.
    head_mask: float `(batch, heads)` xi, or None (all ones).
    ablation: "scale" or "uniform" (see the module docstring).
    scale: logit scale; None means `1 / sqrt(head_dim)` (a DisentangledBias' own scale).
    block_sizes: tile sizes; None means `BlockSizes.get_default()`.
    interpret: run the kernels in Pallas interpret mode.
    backward: "pallas" (default) or "reference" (`jax.vjp` of the pure-jnp reference; not
      with a DisentangledBias).
    dropout_rate: static attention dropout rate in [0, 1) (see the module docstring).
    dropout_seed: int32/uint32 scalar seed (`kernels.dropout.seed_to_int32`), needed when
      dropout_rate > 0.
    bias: a `PositionBias` formed inside each tile, a `DisentangledBias` (DeBERTa's c2p
      and p2c terms, gathered inside each tile from `disentangled_inputs`' per-row scores;
      one key head per query head, no window), or None.

  Returns:
    `(batch, seq, heads, head_dim)` in the dtype of q; rows at or past kv_length are zero.
  """
  seq, head_dim = q.shape[1], q.shape[3]
  mask = Mask() if mask is None else mask
  scale = default_scale(bias, head_dim, scale)
  if isinstance(bias, DisentangledBias) and backward != "pallas":
    raise ValueError(f"{backward=} with a DisentangledBias is not supported; use 'pallas'")
  block_sizes = block_sizes or BlockSizes.get_default()
  q_in, k_in = q, k
  q, k, v = (pad_head_dim(x) for x in (q, k, v))
  bs, seq_pad, lengths, xi, (qp, kp, vp, seg) = prepare(q, k, v, mask, head_mask, block_sizes)
  cfg = kernel_config(
    q,
    k,
    mask,
    bias,
    seq_pad=seq_pad,
    scale=scale,
    ablation=ablation,
    block_sizes=bs,
    interpret=interpret,
    backward=backward,
    dropout_rate=drop.check_rate(dropout_rate),
  )
  seed = drop.seed_to_int32(dropout_seed) if cfg.dropout else None
  table = bias_table(bias, q_in, k_in, seq_pad)
  out = _flash(cfg, qp, kp, vp, lengths, seg, xi.astype(jnp.float32), seed, table)
  return out[:, :seq, :, :head_dim]


def kernel_config(
  q, k, mask: Mask, bias: PositionBias | DisentangledBias | None, seq_pad: int = 0, **fields
) -> KernelConfig:
  """The static configuration of a call: its fields plus the window, the bias kind (and a
  DisentangledBias' layout on `seq_pad` rows) and the groups."""
  extra = {}
  if isinstance(bias, DisentangledBias):
    _, _, width = disentangled_layout(bias, seq_pad)
    terms = tuple(t for t, x in (("c2p", bias.pos_key), ("p2c", bias.pos_query)) if x is not None)
    extra = dict(terms=terms, lut_offset=seq_pad - 1, rel_width=width)
  elif bias is not None:
    extra = dict(num_buckets=bias.num_buckets, max_distance=bias.max_distance)
  return KernelConfig(
    has_segments=mask.segment_ids is not None,
    half_window=mask.half_window,
    bias_kind=None if bias is None else bias.kind,
    groups=q.shape[2] // k.shape[2],
    **extra,
    **fields,
  )


def disentangled_layout(bias: DisentangledBias, seq_pad: int) -> tuple[np.ndarray, int, int]:
  """`(lut, lo, width)`: `lut[q - k + seq_pad - 1]` is the relative row `r(q, k) - lo` that a
  query and key among `seq_pad` positions read (`(2 seq_pad,)` int32, the last entry
  unused), `lo` the first table row any pair reads, and `width` the rows read, padded to a
  power of two >= 16 (Triton tiles)."""
  rel = np.arange(-(seq_pad - 1), seq_pad)  # q - k
  if bias.buckets > 0 and bias.max_position > 0:
    rel = log_bucket(rel, bias.buckets, bias.max_position)
  rows = np.clip(rel + bias.span, 0, 2 * bias.span - 1)
  lo = int(rows.min())
  lut = np.zeros(2 * seq_pad, np.int32)
  lut[: 2 * seq_pad - 1] = rows - lo
  return lut, lo, max(16, pl.next_power_of_2(int(rows.max()) - lo + 1))


def disentangled_inputs(bias: DisentangledBias, q, k, seq_pad: int):
  """`(lut, c2p, p2c)` as the kernels read DeBERTa's terms: the relative-row table of
  `disentangled_layout` and, per term present (else None), the per-row position scores
  `(batch, heads, seq_pad, width)` float32: c2p `scale q Kr[lo:]^T`, p2c `scale k Qr[lo:]^T`
  (FlashDeBERTa's layout; zero rows past the sequence, zero columns past the rows read).
  Autodiff carries the kernels' gradients of the scores to q, k and the tables."""
  lut, lo, width = disentangled_layout(bias, seq_pad)
  used = int(lut.max()) + 1

  def scores(x, table):
    if table is None:
      return None
    table = jnp.asarray(table, jnp.float32)[lo : lo + used]
    s = jnp.einsum("bthd,rhd->bhtr", x.astype(jnp.float32), table, precision=lax.Precision.HIGHEST)
    s = s * jnp.float32(bias.scale)
    return jnp.pad(s, ((0, 0), (0, 0), (0, seq_pad - x.shape[1]), (0, width - used)))

  return jnp.asarray(lut), scores(q, bias.pos_key), scores(k, bias.pos_query)


def bias_table(bias, q=None, k=None, seq_pad: int = 0):
  """The bias as the kernels read it: (heads, entries) float32 (the first `num_buckets` rows
  of a bucket table, transposed; ALiBi's slopes as one column), a DisentangledBias'
  `disentangled_inputs` of q and k (unpadded), or None."""
  if bias is None:
    return None
  if isinstance(bias, DisentangledBias):
    return disentangled_inputs(bias, q, k, seq_pad)
  table = jnp.asarray(bias.table, jnp.float32)
  return table[:, None] if bias.kind == "alibi" else table[: bias.num_buckets].T
