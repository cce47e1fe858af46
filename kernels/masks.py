"""`Mask`: which keys each query may attend to, the one mask description of every kernel.

A mask is up to three parts, any of them None, whose conditions all hold for an allowed key:

* `kv_lengths` int `(batch,)`: right padding; keys (and query rows) at or past the length are
  padding;
* `segment_ids` int `(batch, seq)`: packed sequences; a query sees the keys of its segment
  (needs equal query and key lengths);
* `key_mask` bool `(batch, seq_k)`: True = real key, any pattern.

Query rows that are padding (index >= kv_length, or key_mask False when queries and keys
have equal lengths) give zeros in every implementation. The plain-XLA implementations take
every part as it is; the fused kernels know only lengths and segments, and `Mask.as_lengths`
turns a key mask into lengths by ASSUMING it is right padding (its count is the length).

This module imports nothing of the package, so every kernel file can use it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp


class Mask(NamedTuple):
  """Padding and packing of one attention call (a pytree: passes through `jit` and `scan`).

  Attributes:
    kv_lengths: int `(batch,)`: keys at index >= kv_lengths[b] are right padding; or None.
    segment_ids: int `(batch, seq)`: queries see keys of their own segment; or None.
    key_mask: bool `(batch, seq_k)`, True = real key; or None.
  """

  kv_lengths: Any = None
  segment_ids: Any = None
  key_mask: Any = None

  def validate(self, batch: int, seq_q: int, seq_k: int) -> None:
    """Raises a ValueError naming the part whose shape does not fit `(batch, seq_q, seq_k)`."""
    kv_lengths, segment_ids, key_mask = self
    if kv_lengths is not None and jnp.shape(kv_lengths) != (batch,):
      raise ValueError(f"kv_lengths.shape={jnp.shape(kv_lengths)} must be ({batch},)")
    if segment_ids is not None and (jnp.shape(segment_ids) != (batch, seq_q) or seq_k != seq_q):
      raise ValueError(
        f"segment_ids.shape={jnp.shape(segment_ids)} must be ({batch}, {seq_q}) "
        f"with equal q and k lengths, got seq_k={seq_k}"
      )
    if key_mask is not None and jnp.shape(key_mask) != (batch, seq_k):
      raise ValueError(f"key_mask.shape={jnp.shape(key_mask)} must be ({batch}, {seq_k})")

  def allowed(self, batch: int, seq_q: int, seq_k: int, per_query: bool = True):
    """(batch, q, k) bool of allowed keys and (batch, q) bool of real query rows.

    With `per_query=False` and no segment ids the mask depends on the key alone and is
    returned as (batch, 1, k), to be broadcast over queries.
    """
    kv_lengths, segment_ids, key_mask = self
    k_idx = jnp.arange(seq_k)
    q_idx = jnp.arange(seq_q)
    rows = seq_q if per_query or segment_ids is not None else 1
    allowed = jnp.ones((batch, rows, seq_k), bool)
    row_real = jnp.ones((batch, seq_q), bool)
    if kv_lengths is not None:
      lengths = jnp.asarray(kv_lengths)
      allowed = allowed & (k_idx[None, None, :] < lengths[:, None, None])
      row_real = row_real & (q_idx[None, :] < lengths[:, None])
    if key_mask is not None:
      key_mask = jnp.asarray(key_mask, bool)
      allowed = allowed & key_mask[:, None, :]
      if seq_q == seq_k:
        row_real = row_real & key_mask
    if segment_ids is not None:
      seg = jnp.asarray(segment_ids)
      allowed = allowed & (seg[:, :, None] == seg[:, None, :])
    return allowed, row_real

  def as_lengths(self) -> Mask:
    """The same mask with the key mask folded into `kv_lengths` (the fused kernels' form).

    Assumes the key mask is right padding (documented in `kernels.attention`; it cannot be
    checked under `jit`): its count is the length.
    """
    kv_lengths, segment_ids, key_mask = self
    if key_mask is None:
      return self
    mask_lengths = jnp.asarray(key_mask, bool).sum(-1).astype(jnp.int32)
    kv_lengths = mask_lengths if kv_lengths is None else jnp.minimum(kv_lengths, mask_lengths)
    return Mask(kv_lengths, segment_ids)


def mask_of(mask: Mask | None, kv_lengths=None, segment_ids=None, key_mask=None) -> Mask:
  """A public function's `mask=` or its `kv_lengths=`, `segment_ids=`, `key_mask=` keywords."""
  parts = Mask(kv_lengths, segment_ids, key_mask)
  if mask is None:
    return parts
  if not isinstance(mask, Mask):
    raise TypeError(f"mask={type(mask).__name__} must be a kernels.Mask")
  given = [name for name, part in zip(Mask._fields, parts) if part is not None]
  if given:
    raise ValueError(
      f"give the mask either as mask= or as keywords, not both (got mask and {given})"
    )
  return mask
