"""Attention statistics without attention maps: a second Pallas pass over the keys.

The pass reuses the forward's log-sum-exp, so each probability is `exp(s - lse)` exactly,
and reduces every query row's attention distribution (the softmax A in "scale" mode, the
mixture `xi A + (1 - xi) U` in "uniform" mode) to scalars: entropy and the mass on [CLS]
(key 0), on special keys, on the query itself, the previous and the next token. Like the
forward it visits only `cdiv(kv_length, block_k)` key blocks and writes `(batch, heads, seq)`
rows, never a T x T map. It is built on the Triton variant (`kernels.flash_attention`'s
forward and the Triton layout of `kernels.tiling`); there is no TPU statistics pass yet.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from .disentangled import DisentangledBias, default_scale
from .flash_attention import bias_table, forward_call, kernel_config
from .masks import Mask
from .position_bias import PositionBias
from .reference import STAT_NAMES, Ablation
from .tiling import (
  BlockSizes,
  KernelConfig,
  allowed_tile,
  bias_args,
  bias_specs,
  bias_tile,
  block_slice,
  common_specs,
  dot,
  key_blocks,
  pad_head_dim,
  pallas_call,
  prepare,
  take_bias,
)


def _stats_kernel(*refs, cfg: KernelConfig, has_special: bool):
  """Per query row: entropy and attention mass on [CLS], special, self, prev, next keys."""
  refs = list(refs)
  q_ref, k_ref, lse_ref, len_ref, xi_ref = refs[:5]
  refs = refs[5:]
  segq_ref = segk_ref = special_ref = count_ref = None
  if cfg.has_segments:
    segq_ref, segk_ref = refs[:2]
    refs = refs[2:]
  if has_special:
    special_ref = refs.pop(0)
  if cfg.uniform:
    count_ref = refs.pop(0)
  table = take_bias(cfg, refs)
  out_refs = refs
  block_q = q_ref.shape[0]
  block_k = cfg.block_sizes.block_k
  length = len_ref[()]
  xi = xi_ref[()]
  q_start = pl.program_id(2) * block_q
  q_idx = q_start + jnp.arange(block_q)
  q = q_ref[...]
  lse = lse_ref[...]
  seg_q = segq_ref[...] if cfg.has_segments else None
  if cfg.uniform:
    count = count_ref[...]
    unif = jnp.where(count > 0, (1.0 - xi) / jnp.maximum(count, 1.0), 0.0)

  def body(j, sums):
    k_slice = block_slice(j * block_k, block_k)
    k_idx = j * block_k + jnp.arange(block_k)
    seg_k = segk_ref[k_slice] if cfg.has_segments else None
    allowed = allowed_tile(q_idx, k_idx, length, seg_q, seg_k, cfg.half_window)
    s = dot(q, k_ref[k_slice, :], trans_b=True) * cfg.scale
    if cfg.bias_kind:
      s = s + bias_tile(cfg, table, q_idx, k_idx)
    log_p = s - lse[:, None]
    p = jnp.where(allowed, jnp.exp(log_p), 0.0)
    if cfg.uniform:
      p = jnp.where(allowed, xi * p + unif[:, None], 0.0)
      plogp = jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0)
    else:
      plogp = jnp.where(allowed, p * log_p, 0.0)
    offset = k_idx[None, :] - q_idx[:, None]  # (bq, bk)
    special = special_ref[k_slice][None, :] if has_special else 0.0
    new = (
      -plogp.sum(axis=-1),
      jnp.where(k_idx[None, :] == 0, p, 0.0).sum(axis=-1),
      (p * special).sum(axis=-1),
      jnp.where(offset == 0, p, 0.0).sum(axis=-1),
      jnp.where(offset == -1, p, 0.0).sum(axis=-1),
      jnp.where(offset == 1, p, 0.0).sum(axis=-1),
    )
    return tuple(a + b for a, b in zip(sums, new))

  zeros = jnp.zeros((block_q,), jnp.float32)
  lo, hi = key_blocks(cfg, q_start, block_q, block_k, length)
  sums = lax.fori_loop(lo, hi, body, (zeros,) * len(STAT_NAMES))
  row_real = q_idx < length
  for ref, value in zip(out_refs, sums):
    ref[...] = jnp.where(row_real, value, 0.0)


def attention_statistics_pallas(
  q,
  k,
  v,
  *,
  mask: Mask | None = None,
  head_mask=None,
  ablation: Ablation = "scale",
  special_mask=None,
  scale: float | None = None,
  block_sizes: BlockSizes | None = None,
  interpret: bool = False,
  bias: PositionBias | DisentangledBias | None = None,
):
  """Attention output and per-(batch, head) statistics without a T x T map.

  Takes what `flash_attention` takes (windows, position biases, DeBERTa's terms and grouped
  heads too).

  Args: as `flash_attention`, plus
    `special_mask` bool `(batch, seq)` (None: no special keys).

  Returns:
    `(out, stats)`: out as `flash_attention`; stats a dict of float32 `(batch, heads)` arrays
    named by `STAT_NAMES`, averaged over the real query rows.
  """
  batch, seq, heads, head_dim = q.shape
  mask = Mask() if mask is None else mask
  scale = default_scale(bias, head_dim, scale)
  q_in, k_in = q, k
  block_sizes = block_sizes or BlockSizes.get_default()
  special = None if special_mask is None else jnp.asarray(special_mask, jnp.float32)
  q, k, v = (pad_head_dim(x) for x in (q, k, v))
  padded_head_dim = q.shape[-1]
  bs, seq_pad, lengths, xi, (qp, kp, vp, seg, special) = prepare(
    q, k, v, mask, head_mask, block_sizes, special
  )
  xi = xi.astype(jnp.float32)
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
    backward="pallas",
  )
  table = bias_table(bias, q_in, k_in, seq_pad)
  out, lse, _, *uniform_res = forward_call(
    cfg, qp, kp, vp, lengths, seg, xi, with_residuals=True, table=table
  )
  out, lse, qp, kp = map(lax.stop_gradient, (out, lse, qp, kp))

  in_specs = common_specs(cfg, seq_pad, padded_head_dim, bs.block_q)
  row_spec = pl.BlockSpec((None, None, bs.block_q), lambda b, h, i: (b, h, i))
  # (q, k, lse, lengths, xi, [seg_q, seg_k], [special], [count])
  in_specs = [in_specs[0], in_specs[1], row_spec] + in_specs[3:]
  args = [qp, kp, lse, lengths, xi] + ([seg, seg] if cfg.has_segments else [])
  if special is not None:
    args.append(special)
    in_specs.append(pl.BlockSpec((None, seq_pad), lambda b, h, i: (b, 0)))
  if cfg.uniform:
    args.append(uniform_res[1])
    in_specs.append(row_spec)
  args += bias_args(cfg, jax.tree.map(lax.stop_gradient, table))
  in_specs += bias_specs(cfg, seq_pad)
  rows = jax.ShapeDtypeStruct((batch, heads, seq_pad), jnp.float32)
  per_row = pallas_call(
    functools.partial(_stats_kernel, cfg=cfg, has_special=special is not None),
    cfg,
    padded_head_dim,
    grid=(batch, heads, seq_pad // bs.block_q),
    in_specs=in_specs,
    out_specs=[row_spec] * len(STAT_NAMES),
    out_shape=[rows] * len(STAT_NAMES),
    name="bertjax_attention_stats",
  )(*args)
  denom = jnp.maximum(lengths, 1).astype(jnp.float32)[:, None]
  stats = {name: x.sum(axis=-1) / denom for name, x in zip(STAT_NAMES, per_row)}
  return out[:, :seq, :, :head_dim], stats
