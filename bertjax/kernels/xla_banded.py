"""Sliding-window attention in plain XLA ops, computed on the band alone (`impl="xla"`).

A window layer (`Mask.window = w`: keys with `|q - k| <= w // 2`) needs `T x (w + 1)` scores,
not `T x T`. Here the sequence is cut into query blocks of `b >= w // 2` rows; block `i` sees
the key blocks `i - r .. i + r` (`r = ceil((w // 2) / b)`), gathered by static slices of the
padded keys, so every product and elementwise pass is `(batch, heads, T, (2r + 1) b)`: the
cost grows with T x window. Everything else is as `kernels.reference_attention`: padding,
segments and key masks, head masks in both ablation modes ("uniform" is uniform over the
allowed keys of the band), grouped key/value heads (never repeated), a `PositionBias`, and
dropout drawn from `kernels.dropout` at the absolute `(b, h, q, k)` indices, so the mask is
the one every implementation draws. Gradients are JAX autodiff of these ops.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from . import dropout as drop
from .masks import Mask
from .position_bias import PositionBias

_MASKED = -1e30


def block_rows(window: int) -> int:
  """Query rows per block for a window: `max(16, window // 2)`, so a block sees 3 key blocks."""
  return max(16, window // 2)


def band_width(window: int) -> int:
  """Keys a query block is scored against: `(2 r + 1) b`."""
  b = block_rows(window)
  r = -(-(window // 2) // b)
  return (2 * r + 1) * b


def _windows(x, nb: int, r: int):
  """`(B, (nb + 2r) b, ...)` padded keys -> `(B, nb, (2r + 1) b, ...)`: block i's neighbours."""
  b = x.shape[1] // (nb + 2 * r)
  blocks = x.reshape(x.shape[0], nb + 2 * r, b, *x.shape[2:])
  return jnp.concatenate([blocks[:, j : j + nb] for j in range(2 * r + 1)], axis=2)


def _pad_seq(x, lo: int, hi: int, value=0):
  widths = [(0, 0)] * x.ndim
  widths[1] = (lo, hi)
  return jnp.pad(x, widths, constant_values=value)


def _band(mask: Mask, batch: int, seq: int, b: int, r: int, nb: int):
  """The band's indices and mask: query rows (nb, b) and the keys each block sees (nb, W),
  both absolute; allowed (B, nb, b, W) and real query rows (B, nb, b)."""
  half, tail, width = mask.half_window, nb * b - seq, (2 * r + 1) * b
  q_idx = jnp.arange(nb * b).reshape(nb, b)
  k_idx = (jnp.arange(nb)[:, None] - r) * b + jnp.arange(width)[None, :]
  allowed = (jnp.abs(q_idx[:, :, None] - k_idx[:, None, :]) <= half) & (
    (k_idx >= 0) & (k_idx < seq)
  )[:, None, :]
  allowed = jnp.broadcast_to(allowed[None], (batch, nb, b, width))
  row_real = jnp.broadcast_to((q_idx < seq)[None], (batch, nb, b))
  if mask.kv_lengths is not None:
    lengths = jnp.asarray(mask.kv_lengths)[:, None, None]
    allowed = allowed & (k_idx[None, :, None, :] < lengths[..., None])
    row_real = row_real & (q_idx[None] < lengths)
  if mask.key_mask is not None:
    km = jnp.asarray(mask.key_mask, bool)
    allowed = allowed & _windows(_pad_seq(km, r * b, tail + r * b, False), nb, r)[:, :, None, :]
    row_real = row_real & _pad_seq(km, 0, tail, False).reshape(batch, nb, b)
  if mask.segment_ids is not None:
    seg = jnp.asarray(mask.segment_ids)
    seg_q = _pad_seq(seg, 0, tail, -1).reshape(batch, nb, b)
    seg_k = _windows(_pad_seq(seg, r * b, tail + r * b, -2), nb, r)
    allowed = allowed & (seg_q[..., None] == seg_k[:, :, None, :])
  return q_idx, k_idx, allowed, row_real


def banded_attention(
  q,
  k,
  v,
  *,
  mask: Mask,
  head_mask=None,
  ablation="scale",
  scale=None,
  dropout_rate=0.0,
  dropout_seed=None,
  bias: PositionBias | None = None,
):
  """Attention of a window layer on its band: `(batch, seq, heads, head_dim)`.

  Args:
    q: `(batch, seq, heads, head_dim)`.
    k, v: `(batch, seq, kv_heads, head_dim)`, kv_heads dividing heads.
    mask: a `Mask` with a `window` (and any of lengths, segments, key mask).
    head_mask: float `(batch, heads)` (already broadcast) or None.
    ablation: "scale" or "uniform".
    scale: logit scale; None means `1 / sqrt(head_dim)`.
    dropout_rate: static attention dropout rate in [0, 1).
    dropout_seed: int32 scalar seed when dropout_rate > 0.
    bias: a `PositionBias` or None.

  Returns:
    `(batch, seq, heads, head_dim)` in q's dtype, equal to `reference_attention`.
  """
  if mask.window is None:
    raise ValueError("banded_attention needs a Mask with a window")
  batch, seq, heads, head_dim = q.shape
  groups = k.shape[2]
  dtype = jnp.promote_types(q.dtype, jnp.float32)
  scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
  half = mask.half_window
  b = block_rows(mask.window)
  r = -(-half // b)
  nb = -(-seq // b)
  tail = nb * b - seq
  width = (2 * r + 1) * b

  q_idx, k_idx, allowed, row_real = _band(mask, batch, seq, b, r, nb)
  # Heads first, queries grouped by their key/value head: (B, G, R, nb, b, D).
  qh = _pad_seq(q.astype(dtype), 0, tail).reshape(batch, nb, b, groups, heads // groups, head_dim)
  qh = qh.transpose(0, 3, 4, 1, 2, 5)
  kw, vw = (
    _windows(_pad_seq(x.astype(dtype), r * b, tail + r * b), nb, r).transpose(0, 3, 1, 2, 4)
    for x in (k, v)
  )  # (B, G, nb, W, D)
  s = jnp.einsum("bgrnqd,bgnkd->bgrnqk", qh * scale, kw)
  if bias is not None:
    rel = k_idx[:, None, :] - q_idx[:, :, None]  # (nb, b, W)
    s = s + bias.at(rel, dtype).reshape(groups, heads // groups, nb, b, width)[None]
  s = jnp.where(allowed[:, None, None], s, _MASKED)
  p = jnp.exp(s - jax.lax.stop_gradient(s.max(-1, keepdims=True)))
  p = jnp.where(allowed[:, None, None], p, 0.0)
  denom = p.sum(-1, keepdims=True)
  p = p / jnp.where(denom > 0, denom, 1.0)
  real = (row_real & allowed.any(-1))[:, None, None, :, :, None].astype(dtype)  # (B,1,1,nb,b,1)

  if dropout_rate > 0:
    keys = drop.stream_keys(drop.seed_to_int32(dropout_seed), batch, heads)  # (B, H)
    keys = keys.reshape(batch, groups, heads // groups)[..., None, None, None]
    rows = drop.row_hash(keys, q_idx.astype(jnp.int32)[..., None])  # (B, G, R, nb, b, 1)
    cols = drop.col_hash(k_idx.astype(jnp.int32))[:, None, :]  # (nb, 1, W)
    kept = drop.keep(rows, cols, drop.threshold(dropout_rate))
    mult = jnp.where(kept, 1.0 / (1.0 - dropout_rate), 0.0).astype(dtype)
  else:
    mult = None
  o = jnp.einsum("bgrnqk,bgnkd->bgrnqd", p if mult is None else p * mult, vw)
  xi = jnp.ones((batch, heads), dtype) if head_mask is None else head_mask.astype(dtype)
  xi = xi.reshape(batch, groups, heads // groups, 1, 1, 1)
  if ablation == "uniform":
    a = allowed.astype(dtype)
    u_w = (a / jnp.maximum(a.sum(-1, keepdims=True), 1.0))[:, None, None]  # (B,1,1,nb,b,W)
    u_w = u_w if mult is None else u_w * mult
    u = jnp.einsum("bgrnqk,bgnkd->bgrnqd", jnp.broadcast_to(u_w, p.shape), vw)
    o = xi * o + (1.0 - xi) * u
  else:
    o = xi * o
  o = (o * real).reshape(batch, heads, nb * b, head_dim)[:, :, :seq]
  return jnp.swapaxes(o, 1, 2).astype(q.dtype)
