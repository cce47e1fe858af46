"""The pure-jnp reference attention and statistics: the leaf every kernel is tested against.

Every other implementation in `bertjax.kernels` (the XLA path with its custom backward,
the Pallas kernels, the statistics pass) is checked against `reference_attention` and
`reference_statistics` here. The names of the head-ablation modes (`ABLATIONS`) and of the
statistics (`STAT_NAMES`) are defined here once. This module imports nothing else of the
package but the mask description and the dropout stream, so the kernels can use it without
an import cycle.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

from . import dropout as drop
from .disentangled import add_bias, bias_scores, default_scale
from .masks import Mask, mask_of
from .position_bias import PositionBias

# How a head mask xi enters attention: "scale" (Michel et al.) or "uniform" (Kovaleva et al.).
ABLATIONS = ("scale", "uniform")
Ablation = Literal["scale", "uniform"]
# The per-head statistics of `reference_statistics` and `kernels.attention_with_stats`.
STAT_NAMES = ("entropy", "first", "special", "self", "prev", "next")


def _compute_dtype(dtype):
  return jnp.promote_types(dtype, jnp.float32)


def _attention_distributions(
  q,
  k,
  v,
  *,
  mask: Mask,
  head_mask,
  ablation,
  scale,
  dropout_rate=0.0,
  dropout_seed=None,
  bias: PositionBias | None = None,
):
  """Softmax A, the attention used (dropped), the mixing distribution, real rows."""
  batch, seq_q, heads, head_dim = q.shape
  seq_k = k.shape[1]
  dtype = _compute_dtype(q.dtype)
  scale = default_scale(bias, head_dim, scale)
  allowed, row_real = mask.allowed(batch, seq_q, seq_k)
  allowed = allowed[:, None]  # (B, 1, Tq, Tk)
  k = repeat_kv(k, heads)
  logits = jnp.einsum("bqhd,bkhd->bhqk", q.astype(dtype), k.astype(dtype)) * scale
  logits = add_bias(logits, bias_scores(bias, q, k, dtype))
  logits = jnp.where(allowed, logits, -jnp.inf)
  row_max = jnp.max(logits, axis=-1, keepdims=True)
  row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
  unnorm = jnp.where(allowed, jnp.exp(logits - jax.lax.stop_gradient(row_max)), 0.0)
  denom = unnorm.sum(axis=-1, keepdims=True)
  probs = unnorm / jnp.where(denom > 0, denom, 1.0)  # (B, H, Tq, Tk)
  count = allowed.sum(axis=-1, keepdims=True).astype(dtype)
  uniform = allowed.astype(dtype) / jnp.maximum(count, 1.0)
  xi = jnp.ones((batch, heads), dtype) if head_mask is None else head_mask.astype(dtype)
  xi = xi[:, :, None, None]  # (B, H, 1, 1)
  if ablation == "scale":
    mixed = xi * probs
    mixing = probs  # the distribution that mixes the values, before scaling
  else:
    mixed = xi * probs + (1.0 - xi) * uniform
    mixing = mixed
  if dropout_rate > 0:
    # Dropout acts on the attention that mixes the values, after the uniform mix.
    mixed = mixed * drop.multiplier(dropout_seed, batch, heads, seq_q, seq_k, dropout_rate, dtype)
  real = row_real[:, None, :, None]  # (B, 1, Tq, 1)
  return probs * real, mixed * real, mixing * real, row_real


def repeat_kv(x, heads: int):
  """Grouped key/value heads `(B, T, G, D)` repeated to `heads` query heads: query head h
  reads group `h // (heads // G)` (transformers' `repeat_kv`)."""
  groups = x.shape[2]
  return x if groups == heads else jnp.repeat(x, heads // groups, axis=2)


def reference_attention(
  q,
  k,
  v,
  *,
  mask: Mask | None = None,
  kv_lengths=None,
  segment_ids=None,
  key_mask=None,
  head_mask=None,
  ablation: Ablation = "scale",
  scale=None,
  return_probs=False,
  dropout_rate=0.0,
  dropout_seed=None,
  bias: PositionBias | None = None,
):
  """Pure-jnp attention: the reference every other implementation is tested against.

  Args:
    q: `(batch, seq_q, heads, head_dim)`.
    k: `(batch, seq_k, kv_heads, head_dim)`; kv_heads divides heads (grouped heads).
    v: `(batch, seq_k, kv_heads, head_dim)`.
    mask: a `Mask` (kv_lengths, segment_ids, key_mask, window), or None to give its parts
      as the keywords below.
    kv_lengths: int `(batch,)` or None.
    segment_ids: int `(batch, seq)` or None (requires seq_q == seq_k).
    key_mask: bool `(batch, seq_k)` (True = real key) or None.
    head_mask: float `(batch, heads)` or None (already broadcast).
    ablation: "scale" or "uniform".
    scale: logit scale; None means `1 / sqrt(head_dim)`.
    return_probs: also return the attention actually used, `(batch, heads, seq_q, seq_k)`
      (after dropout, when it is on).
    dropout_rate: attention dropout rate in [0, 1) (static); see `attention`.
    dropout_seed: int32/uint32 scalar (or a PRNG key) when dropout_rate > 0.
    bias: a `PositionBias` or `DisentangledBias` added to the scaled logits, or None (a
      DisentangledBias also sets the default `scale`).

  Returns:
    out `(batch, seq_q, heads, head_dim)` in q's dtype, or `(out, probs)`.
  """
  dropout_rate, dropout_seed = validate_dropout(dropout_rate, dropout_seed)
  _, mixed, _, _ = _attention_distributions(
    q,
    k,
    v,
    mask=mask_of(mask, kv_lengths, segment_ids, key_mask),
    head_mask=head_mask,
    ablation=ablation,
    scale=scale,
    dropout_rate=dropout_rate,
    dropout_seed=dropout_seed,
    bias=bias,
  )
  v = repeat_kv(v, q.shape[2])
  out = jnp.einsum("bhqk,bkhd->bqhd", mixed, v.astype(mixed.dtype)).astype(q.dtype)
  return (out, mixed) if return_probs else out


def reference_statistics(
  q,
  k,
  v,
  *,
  mask: Mask | None = None,
  kv_lengths=None,
  segment_ids=None,
  key_mask=None,
  head_mask=None,
  ablation: Ablation = "scale",
  special_mask=None,
  scale=None,
  bias: PositionBias | None = None,
):
  """Statistics of the full attention maps, averaged over real query rows: `(batch, heads)`.

  Arguments as `reference_attention`, plus `special_mask` bool `(batch, seq_k)`; the result
  is a dict named by `STAT_NAMES`.
  """
  _, _, p, row_real = _attention_distributions(
    q,
    k,
    v,
    mask=mask_of(mask, kv_lengths, segment_ids, key_mask),
    head_mask=head_mask,
    ablation=ablation,
    scale=scale,
    bias=bias,
  )
  p = jax.lax.stop_gradient(p).astype(jnp.float32)  # (B, H, Tq, Tk)
  seq_q, seq_k = p.shape[-2:]
  offset = jnp.arange(seq_k)[None, :] - jnp.arange(seq_q)[:, None]  # (Tq, Tk)
  special = (
    jnp.zeros((p.shape[0], seq_k))
    if special_mask is None
    else jnp.asarray(special_mask, jnp.float32)
  )
  per_row = {
    "entropy": -jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0).sum(-1),
    "first": p[..., 0],
    "special": (p * special[:, None, None, :]).sum(-1),
    "self": jnp.where(offset == 0, p, 0.0).sum(-1),
    "prev": jnp.where(offset == -1, p, 0.0).sum(-1),
    "next": jnp.where(offset == 1, p, 0.0).sum(-1),
  }
  real = row_real[:, None, :].astype(jnp.float32)  # (B, 1, Tq)
  denom = jnp.maximum(real.sum(-1), 1.0)
  return {name: (x * real).sum(-1) / denom for name, x in per_row.items()}


def validate_dropout(rate, seed):
  """(rate as a float, seed as an int32 scalar or None); errors name the bad value."""
  rate = drop.check_rate(rate)
  if rate == 0.0:
    return 0.0, None  # the no-dropout path, whatever the seed
  if seed is None:
    raise ValueError(
      f"dropout_rate={rate} needs a dropout_seed, e.g. jax.random.bits(key, (), jnp.uint32)"
    )
  return rate, drop.seed_to_int32(seed)
