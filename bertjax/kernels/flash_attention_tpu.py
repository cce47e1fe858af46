"""TPU (Mosaic) variant of the fused attention forward and backward.

Same semantics as `kernels.flash_attention` (right padding by `kv_lengths`, packed segments,
"scale" / "uniform" head ablation with exact gradients, zero padded query rows), laid out
for Mosaic: heads move next to batch, `(batch, heads, seq, head_dim)`, so every tile's last
two dims are `(rows, head_dim)`; per-row vectors are `(..., seq, 1)` arrays. The key loop is
the last grid axis ("arbitrary") with accumulators in VMEM scratch. The lengths are scalar
prefetched: blocks past a sequence's length are skipped with `pl.when`, and their index maps
are clamped to the last real block so that no new block is fetched for them.

Attention dropout follows `kernels.flash_attention` exactly (the same `kernels.dropout` bits
from the absolute `(b, h, q, k)` indices, recomputed per tile in the forward, dK/dV and dQ
kernels): the per-(b, h) stream keys are a second `(batch, heads)` int32 SMEM input, row
hashes are `(bq, 1)` and column hashes `(1, bk)` int32 vectors.

Status: tested in interpret mode on CPU against the float64 reference; the Mosaic lowering
is checked by exporting for TPU; a compiled run on a TPU is still to be done. Statistics
(`attention_with_stats`) have no TPU variant yet.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from . import dropout as drop
from .masks import Mask
from .reference import Ablation
from .tiling import MASK_VALUE, BlockSizes, KernelConfig, dot, prepare


def _iota(shape, dim, start):
  return start + lax.broadcasted_iota(jnp.int32, shape, dim)


def _mask(cfg, block_q, block_k, q_start, k_start, length, segq_ref, segk_ref):
  """(bq, bk) allowed keys: index < length and, when packed, the query's segment."""
  mask = _iota((block_q, block_k), 1, k_start) < length
  if cfg.has_segments:
    mask = mask & (segq_ref[...] == segk_ref[...])  # (bq, 1) == (1, bk)
  return mask


def _keep(cfg, keys_ref, b, h, q_start, k_start, block_q, block_k):
  """(bq, bk) bool kept entries of the tile at (q_start, k_start) of stream (b, h)."""
  rows = drop.row_hash(keys_ref[b, h], _iota((block_q, 1), 0, q_start))
  cols = drop.col_hash(_iota((1, block_k), 1, k_start))
  return drop.keep(rows, cols, cfg.drop_threshold)


def _params(cfg: KernelConfig, semantics):
  if cfg.interpret:
    return {"interpret": True}
  return {"compiler_params": pltpu.CompilerParams(dimension_semantics=semantics)}


# ----------------------------------------------------------------------------------------
# Forward: grid (batch, heads, q-blocks, k-blocks).


def _fwd_kernel(lens_ref, xi_ref, q_ref, k_ref, v_ref, *refs, cfg, with_residuals):
  refs = list(refs)
  segq_ref = segk_ref = None
  if cfg.has_segments:
    segq_ref, segk_ref = refs[:2]
    refs = refs[2:]
  keys_ref = refs.pop(0) if cfg.dropout else None
  n_out = (3 + 2 * cfg.uniform) if with_residuals else 1
  outs, scratch = refs[:n_out], refs[n_out:]
  m_sc, l_sc, acc_sc = scratch[:3]
  b, h, i, j = (pl.program_id(a) for a in range(4))
  block_q, block_k = q_ref.shape[0], k_ref.shape[0]
  length = lens_ref[b]
  q_start, k_start = i * block_q, j * block_k

  @pl.when(j == 0)
  def _init():
    m_sc[...] = jnp.full(m_sc.shape, MASK_VALUE, jnp.float32)
    l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
    acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)
    if cfg.uniform:
      scratch[3][...] = jnp.zeros(scratch[3].shape, jnp.float32)
      scratch[4][...] = jnp.zeros(scratch[4].shape, jnp.float32)

  @pl.when((k_start < length) & (q_start < length))
  def _step():
    allowed = _mask(cfg, block_q, block_k, q_start, k_start, length, segq_ref, segk_ref)
    s = dot(q_ref[...], k_ref[...], trans_b=True) * cfg.scale  # (bq, bk)
    s = jnp.where(allowed, s, MASK_VALUE)
    m_prev = m_sc[...]  # (bq, 1)
    m_next = jnp.maximum(m_prev, s.max(axis=-1, keepdims=True))
    correction = jnp.exp(m_prev - m_next)
    p = jnp.where(allowed, jnp.exp(s - m_next), 0.0)
    v = v_ref[...]
    kept = None
    if cfg.dropout:
      kept = _keep(cfg, keys_ref, b, h, q_start, k_start, block_q, block_k)
    p_v = p if kept is None else jnp.where(kept, p, 0.0)  # the normaliser keeps every p
    acc_sc[...] = acc_sc[...] * correction + dot(p_v, v)
    l_sc[...] = l_sc[...] * correction + p.sum(axis=-1, keepdims=True)
    m_sc[...] = m_next
    if cfg.uniform:
      allowed_f = allowed.astype(jnp.float32)
      scratch[3][...] += dot(allowed_f if kept is None else jnp.where(kept, allowed_f, 0.0), v)
      scratch[4][...] += allowed_f.sum(axis=-1, keepdims=True)

  @pl.when(j == pl.num_programs(3) - 1)
  def _finish():
    xi = xi_ref[b, h]
    l = l_sc[...]
    row_real = _iota((block_q, 1), 0, q_start) < length
    safe_l = jnp.where(l > 0, l, 1.0)
    acc = acc_sc[...] * cfg.keep_scale if cfg.dropout else acc_sc[...]
    o_attn = jnp.where(row_real & (l > 0), acc / safe_l, 0.0)
    out = xi * o_attn
    if cfg.uniform:
      count = scratch[4][...]
      vsum = scratch[3][...] * cfg.keep_scale if cfg.dropout else scratch[3][...]
      v_mean = jnp.where(row_real, vsum / jnp.maximum(count, 1.0), 0.0)
      out = out + (1.0 - xi) * v_mean
    outs[0][...] = out.astype(outs[0].dtype)
    if with_residuals:
      outs[1][...] = jnp.where(l > 0, m_sc[...] + jnp.log(safe_l), 0.0)
      outs[2][...] = o_attn.astype(outs[2].dtype)
      if cfg.uniform:
        outs[3][...] = v_mean
        outs[4][...] = count


def _last_block(length, block):
  return jnp.maximum(pl.cdiv(length, block) - 1, 0)


def _fwd_call(cfg: KernelConfig, q, k, v, lengths, seg, xi, with_residuals, seed=None):
  batch, heads, seq_pad, head_dim = q.shape
  bq, bk = cfg.block_sizes.block_q, cfg.block_sizes.block_k

  def q_map(b, h, i, j, lens):
    return (b, h, i, 0)

  def kv_map(b, h, i, j, lens):
    return (b, h, jnp.minimum(j, _last_block(lens[b], bk)), 0)  # no fetch past the length

  in_specs = [
    pl.BlockSpec(memory_space=pltpu.SMEM),  # xi (batch, heads)
    pl.BlockSpec((None, None, bq, head_dim), q_map),
    pl.BlockSpec((None, None, bk, head_dim), kv_map),
    pl.BlockSpec((None, None, bk, head_dim), kv_map),
  ]
  args = [xi, q, k, v]
  if cfg.has_segments:
    in_specs += [
      pl.BlockSpec((None, bq, 1), lambda b, h, i, j, lens: (b, i, 0)),
      pl.BlockSpec(
        (None, 1, bk), lambda b, h, i, j, lens: (b, 0, jnp.minimum(j, _last_block(lens[b], bk)))
      ),
    ]
    args += [seg[:, :, None], seg[:, None, :]]  # (B, T, 1), (B, 1, T)
  if cfg.dropout:
    in_specs.append(pl.BlockSpec(memory_space=pltpu.SMEM))  # stream keys (batch, heads)
    args.append(drop.stream_keys(seed, batch, heads))
  tile = pl.BlockSpec((None, None, bq, head_dim), q_map)
  row = pl.BlockSpec((None, None, bq, 1), q_map)
  rows = jax.ShapeDtypeStruct((batch, heads, seq_pad, 1), jnp.float32)
  out_shape, out_specs = [jax.ShapeDtypeStruct(q.shape, q.dtype)], [tile]
  if with_residuals:
    out_shape += [rows, jax.ShapeDtypeStruct(q.shape, q.dtype)]
    out_specs += [row, tile]
    if cfg.uniform:
      out_shape += [jax.ShapeDtypeStruct(q.shape, jnp.float32), rows]
      out_specs += [tile, row]
  scratch = [pltpu.VMEM((bq, 1), jnp.float32)] * 2 + [pltpu.VMEM((bq, head_dim), jnp.float32)]
  if cfg.uniform:
    scratch += [pltpu.VMEM((bq, head_dim), jnp.float32), pltpu.VMEM((bq, 1), jnp.float32)]
  grid_spec = pltpu.PrefetchScalarGridSpec(
    num_scalar_prefetch=1,
    grid=(batch, heads, seq_pad // bq, seq_pad // bk),
    in_specs=in_specs,
    out_specs=out_specs,
    scratch_shapes=scratch,
  )
  kernel = functools.partial(_fwd_kernel, cfg=cfg, with_residuals=with_residuals)
  return pl.pallas_call(
    kernel,
    grid_spec=grid_spec,
    out_shape=out_shape,
    name="bertjax_attention_fwd_tpu",
    **_params(cfg, ("parallel", "parallel", "parallel", "arbitrary")),
  )(lengths, *args)


# ----------------------------------------------------------------------------------------
# Backward: dK, dV on grid (batch, heads, k-blocks, q-blocks); dQ on (batch, heads, q, k).


def _probs(cfg, q, k, lse, allowed):
  s = dot(q, k, trans_b=True) * cfg.scale
  return jnp.where(allowed, jnp.exp(s - lse), 0.0)  # lse (bq, 1)


def _dkv_kernel(lens_ref, xi_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, cfg):
  refs = list(refs)
  segq_ref = segk_ref = coef_ref = keys_ref = None
  if cfg.has_segments:
    segq_ref, segk_ref = refs[:2]
    refs = refs[2:]
  if cfg.dropout:
    keys_ref = refs.pop(0)
  if cfg.uniform:
    coef_ref = refs.pop(0)
  dk_ref, dv_ref, dk_sc, dv_sc = refs
  b, h, j, i = (pl.program_id(a) for a in range(4))
  block_q, block_k = q_ref.shape[0], k_ref.shape[0]
  length = lens_ref[b]
  q_start, k_start = i * block_q, j * block_k
  xi = xi_ref[b, h]

  @pl.when(i == 0)
  def _init():
    dk_sc[...] = jnp.zeros(dk_sc.shape, jnp.float32)
    dv_sc[...] = jnp.zeros(dv_sc.shape, jnp.float32)

  @pl.when((k_start < length) & (q_start < length))
  def _step():
    allowed = _mask(cfg, block_q, block_k, q_start, k_start, length, segq_ref, segk_ref)
    allowed = allowed & (_iota((block_q, 1), 0, q_start) < length)
    q, do = q_ref[...], do_ref[...]
    p = _probs(cfg, q, k_ref[...], lse_ref[...], allowed)
    p_mix = xi * p
    if cfg.uniform:
      p_mix = p_mix + jnp.where(allowed, coef_ref[...], 0.0)
    dp = dot(do, v_ref[...], trans_b=True)
    if cfg.dropout:
      kept = _keep(cfg, keys_ref, b, h, q_start, k_start, block_q, block_k)
      p_mix = jnp.where(kept, p_mix, 0.0)  # times keep_scale, applied to dv at the end
      dp = jnp.where(kept, dp * cfg.keep_scale, 0.0)
    dv_sc[...] += dot(p_mix, do, trans_a=True)
    ds = p * (dp - delta_ref[...])
    dk_sc[...] += dot(ds, q, trans_a=True)

  @pl.when(i == pl.num_programs(3) - 1)
  def _finish():
    dk_ref[...] = (dk_sc[...] * (xi * cfg.scale)).astype(dk_ref.dtype)
    dv = dv_sc[...] * cfg.keep_scale if cfg.dropout else dv_sc[...]
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _dq_kernel(lens_ref, xi_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, cfg):
  refs = list(refs)
  segq_ref = segk_ref = None
  if cfg.has_segments:
    segq_ref, segk_ref = refs[:2]
    refs = refs[2:]
  keys_ref = refs.pop(0) if cfg.dropout else None
  dq_ref, dq_sc = refs
  b, h, i, j = (pl.program_id(a) for a in range(4))
  block_q, block_k = q_ref.shape[0], k_ref.shape[0]
  length = lens_ref[b]
  q_start, k_start = i * block_q, j * block_k

  @pl.when(j == 0)
  def _init():
    dq_sc[...] = jnp.zeros(dq_sc.shape, jnp.float32)

  @pl.when((k_start < length) & (q_start < length))
  def _step():
    allowed = _mask(cfg, block_q, block_k, q_start, k_start, length, segq_ref, segk_ref)
    allowed = allowed & (_iota((block_q, 1), 0, q_start) < length)
    k = k_ref[...]
    p = _probs(cfg, q_ref[...], k, lse_ref[...], allowed)
    dp = dot(do_ref[...], v_ref[...], trans_b=True)
    if cfg.dropout:
      kept = _keep(cfg, keys_ref, b, h, q_start, k_start, block_q, block_k)
      dp = jnp.where(kept, dp * cfg.keep_scale, 0.0)
    ds = p * (dp - delta_ref[...])
    dq_sc[...] += dot(ds, k)

  @pl.when(j == pl.num_programs(3) - 1)
  def _finish():
    dq_ref[...] = (dq_sc[...] * (xi_ref[b, h] * cfg.scale)).astype(dq_ref.dtype)


def _bwd_rowwise(cfg: KernelConfig, lengths, dout, o_attn, v_mean):
  """delta_i = dO_i . O_attn_i `(B, H, T, 1)` and d xi `(B, H)`: elementwise, left to XLA."""
  seq_pad = dout.shape[2]
  row_real = (jnp.arange(seq_pad)[None, :] < lengths[:, None])[:, None, :, None]  # (B,1,T,1)
  do32, oa32 = dout.astype(jnp.float32), o_attn.astype(jnp.float32)
  delta = jnp.where(row_real, (do32 * oa32).sum(-1, keepdims=True), 0.0)
  mixed = oa32 - v_mean if cfg.uniform else oa32
  dxi = jnp.where(row_real, do32 * mixed, 0.0).sum(axis=(2, 3))
  return delta, dxi


def _bwd_call(cfg: KernelConfig, residuals, dout):
  q, k, v, lengths, seg, xi, seed, lse, o_attn, v_mean, count = residuals
  batch, heads, seq_pad, head_dim = q.shape
  bq, bk = cfg.block_sizes.block_q_bwd, cfg.block_sizes.block_k_bwd
  delta, dxi = _bwd_rowwise(cfg, lengths, dout, o_attn, v_mean)

  def clamp(idx, lens, b, block):
    return jnp.minimum(idx, _last_block(lens[b], block))

  def grid_call(kernel, grid, q_idx, k_idx, out_specs, out_shape, scratch, name, extra):
    """Shared specs: q-side blocks follow q_idx, k-side blocks follow k_idx (both clamped)."""
    qb = lambda b, h, x, y, lens: (b, h, clamp(q_idx(x, y), lens, b, bq), 0)
    kb = lambda b, h, x, y, lens: (b, h, clamp(k_idx(x, y), lens, b, bk), 0)
    q_tile = pl.BlockSpec((None, None, bq, head_dim), qb)
    k_tile = pl.BlockSpec((None, None, bk, head_dim), kb)
    q_row = pl.BlockSpec((None, None, bq, 1), qb)
    # Outputs are never clamped: every block is written (zeros when skipped).
    q_out = pl.BlockSpec(
      (None, None, bq, head_dim), lambda b, h, x, y, lens: (b, h, q_idx(x, y), 0)
    )
    k_out = pl.BlockSpec(
      (None, None, bk, head_dim), lambda b, h, x, y, lens: (b, h, k_idx(x, y), 0)
    )
    specs = [pl.BlockSpec(memory_space=pltpu.SMEM), q_tile, k_tile, k_tile, q_tile, q_row, q_row]
    args = [xi, q, k, v, dout, lse, delta]
    if cfg.has_segments:
      seg_q = lambda b, h, x, y, lens: (b, clamp(q_idx(x, y), lens, b, bq), 0)
      seg_k = lambda b, h, x, y, lens: (b, 0, clamp(k_idx(x, y), lens, b, bk))
      specs += [pl.BlockSpec((None, bq, 1), seg_q), pl.BlockSpec((None, 1, bk), seg_k)]
      args += [seg[:, :, None], seg[:, None, :]]
    if cfg.dropout:
      specs.append(pl.BlockSpec(memory_space=pltpu.SMEM))  # stream keys (batch, heads)
      args.append(keys)
    for arr in extra:
      specs.append(q_row)
      args.append(arr)
    grid_spec = pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=1,
      grid=grid,
      in_specs=specs,
      out_specs=[spec(q_out, k_out) for spec in out_specs],
      scratch_shapes=scratch,
    )
    return pl.pallas_call(
      functools.partial(kernel, cfg=cfg),
      grid_spec=grid_spec,
      out_shape=out_shape,
      name=name,
      **_params(cfg, ("parallel", "parallel", "parallel", "arbitrary")),
    )(lengths, *args)

  keys = drop.stream_keys(seed, batch, heads) if cfg.dropout else None
  extra = []
  if cfg.uniform:
    coef = jnp.where(count > 0, (1.0 - xi)[:, :, None, None] / jnp.maximum(count, 1.0), 0.0)
    extra = [coef]
  n_q, n_k = seq_pad // bq, seq_pad // bk
  dk, dv = grid_call(
    _dkv_kernel,
    (batch, heads, n_k, n_q),
    lambda j, i: i,
    lambda j, i: j,
    [lambda qt, kt: kt] * 2,
    [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
    [pltpu.VMEM((bk, head_dim), jnp.float32)] * 2,
    "bertjax_attention_bwd_dkv_tpu",
    extra,
  )
  (dq,) = grid_call(
    _dq_kernel,
    (batch, heads, n_q, n_k),
    lambda i, j: i,
    lambda i, j: j,
    [lambda qt, kt: qt],
    [jax.ShapeDtypeStruct(q.shape, q.dtype)],
    [pltpu.VMEM((bq, head_dim), jnp.float32)],
    "bertjax_attention_bwd_dq_tpu",
    [],
  )
  return dq, dk, dv, dxi.astype(xi.dtype)


# ----------------------------------------------------------------------------------------
# custom_vjp wrapper on padded (batch, heads, seq, head_dim) inputs.


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(cfg: KernelConfig, q, k, v, lengths, seg, xi, seed):
  (out,) = _fwd_call(cfg, q, k, v, lengths, seg, xi, with_residuals=False, seed=seed)
  return out


def _flash_fwd(cfg, q, k, v, lengths, seg, xi, seed):
  out, lse, o_attn, *uniform_res = _fwd_call(cfg, q, k, v, lengths, seg, xi, True, seed=seed)
  v_mean, count = uniform_res if cfg.uniform else (None, None)
  return out, (q, k, v, lengths, seg, xi, seed, lse, o_attn, v_mean, count)


def _flash_bwd(cfg, residuals, dout):
  dq, dk, dv, dxi = _bwd_call(cfg, residuals, dout)
  return dq, dk, dv, None, None, dxi, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def flash_attention_tpu(
  q,
  k,
  v,
  *,
  mask: Mask | None = None,
  head_mask=None,
  ablation: Ablation = "scale",
  scale=None,
  block_sizes: BlockSizes | None = None,
  interpret: bool = False,
  dropout_rate: float = 0.0,
  dropout_seed=None,
):
  """Fused attention for TPU; arguments and result as `kernels.flash_attention.flash_attention`.

  The sequence is zero-padded to a multiple of the blocks (128 by default on TPU); head_dim
  is used as is (a tile's last dim equals the array's, which Mosaic accepts).
  """
  seq, head_dim = q.shape[1], q.shape[3]
  mask = Mask() if mask is None else mask
  scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
  block_sizes = block_sizes or BlockSizes.get_default("tpu")
  bs, _, lengths, xi, (qp, kp, vp, seg) = prepare(q, k, v, mask, head_mask, block_sizes)
  cfg = KernelConfig(
    scale=scale,
    ablation=ablation,
    block_sizes=bs,
    has_segments=mask.segment_ids is not None,
    interpret=interpret,
    backward="pallas",
    dropout_rate=drop.check_rate(dropout_rate),
  )
  seed = drop.seed_to_int32(dropout_seed) if cfg.dropout else None
  to_bhtd = lambda x: jnp.swapaxes(x, 1, 2)  # (B, T, H, D) -> (B, H, T, D)
  out = _flash(cfg, *map(to_bhtd, (qp, kp, vp)), lengths, seg, xi.astype(jnp.float32), seed)
  return jnp.swapaxes(out, 1, 2)[:, :seq]
