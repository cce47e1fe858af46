"""`Mask`: which keys each query may attend to, the one mask description of every kernel.

A mask is up to four parts, any of them None, whose conditions all hold for an allowed key:

* `kv_lengths` int `(batch,)`: right padding; keys (and query rows) at or past the length are
  padding;
* `segment_ids` int `(batch, seq)`: packed sequences; a query sees the keys of its segment
  (needs equal query and key lengths);
* `key_mask` bool `(batch, seq_k)`: True = real key, any pattern;
* `window` (a static Python int w): a sliding window, keys within `w // 2` positions either
  side of the query (`|q - k| <= w // 2`, transformers' bidirectional sliding-window rule with
  ModernBERT's `local_attention = w`).

Query rows that are padding (index >= kv_length, or key_mask False when queries and keys
have equal lengths) give zeros in every implementation. The plain-XLA implementations take
every part as it is; the fused kernels know only lengths, segments and the window, and
`Mask.as_lengths` turns a key mask into lengths by ASSUMING it is right padding (its count is
the length).

`Mask` is a pytree whose array parts are leaves and whose window is static (part of the tree
structure), so it passes through `jit` and `scan` with the window known at trace time.

This module imports nothing of the package, so every kernel file can use it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Mask:
  """Padding, packing and the local window of one attention call.

  Attributes:
    kv_lengths: int `(batch,)`: keys at index >= kv_lengths[b] are right padding; or None.
    segment_ids: int `(batch, seq)`: queries see keys of their own segment; or None.
    key_mask: bool `(batch, seq_k)`, True = real key; or None.
    window: a Python int w >= 2: keys with `|q - k| <= w // 2` only; None is global attention.
  """

  kv_lengths: Any = None
  segment_ids: Any = None
  key_mask: Any = None
  window: int | None = None

  def __post_init__(self):
    w = self.window
    if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 2):
      raise ValueError(
        f"window={w!r} must be None or a Python int >= 2 (the keys within "
        "window // 2 positions either side of the query)"
      )

  @property
  def half_window(self) -> int | None:
    """`window // 2`: the farthest key a query sees on each side, or None (global)."""
    return None if self.window is None else self.window // 2

  def replace(self, **changes) -> Mask:
    """A copy with `changes` applied (`dataclasses.replace`)."""
    return dataclasses.replace(self, **changes)

  def validate(self, batch: int, seq_q: int, seq_k: int) -> None:
    """Raises a ValueError naming the part whose shape does not fit `(batch, seq_q, seq_k)`."""
    if self.kv_lengths is not None and jnp.shape(self.kv_lengths) != (batch,):
      raise ValueError(f"kv_lengths.shape={jnp.shape(self.kv_lengths)} must be ({batch},)")
    if self.segment_ids is not None and (
      jnp.shape(self.segment_ids) != (batch, seq_q) or seq_k != seq_q
    ):
      raise ValueError(
        f"segment_ids.shape={jnp.shape(self.segment_ids)} must be ({batch}, {seq_q}) "
        f"with equal q and k lengths, got seq_k={seq_k}"
      )
    if self.key_mask is not None and jnp.shape(self.key_mask) != (batch, seq_k):
      raise ValueError(f"key_mask.shape={jnp.shape(self.key_mask)} must be ({batch}, {seq_k})")
    if self.window is not None and seq_k != seq_q:
      raise ValueError(f"window={self.window} needs equal q and k lengths, got {seq_q=}, {seq_k=}")

  @property
  def per_key(self) -> bool:
    """Whether the mask depends on the key alone (no segments, no window)."""
    return self.segment_ids is None and self.window is None

  def allowed(self, batch: int, seq_q: int, seq_k: int, per_query: bool = True):
    """(batch, q, k) bool of allowed keys and (batch, q) bool of real query rows.

    With `per_query=False` and a mask that depends on the key alone (`per_key`) it is
    returned as (batch, 1, k), to be broadcast over queries.
    """
    k_idx = jnp.arange(seq_k)
    q_idx = jnp.arange(seq_q)
    rows = seq_q if per_query or not self.per_key else 1
    allowed = jnp.ones((batch, rows, seq_k), bool)
    row_real = jnp.ones((batch, seq_q), bool)
    if self.kv_lengths is not None:
      lengths = jnp.asarray(self.kv_lengths)
      allowed = allowed & (k_idx[None, None, :] < lengths[:, None, None])
      row_real = row_real & (q_idx[None, :] < lengths[:, None])
    if self.key_mask is not None:
      key_mask = jnp.asarray(self.key_mask, bool)
      allowed = allowed & key_mask[:, None, :]
      if seq_q == seq_k:
        row_real = row_real & key_mask
    if self.segment_ids is not None:
      seg = jnp.asarray(self.segment_ids)
      allowed = allowed & (seg[:, :, None] == seg[:, None, :])
    if self.window is not None:
      band = jnp.abs(q_idx[:, None] - k_idx[None, :]) <= self.half_window
      allowed = allowed & band[None]
    return allowed, row_real

  def as_lengths(self) -> Mask:
    """The same mask with the key mask folded into `kv_lengths` (the fused kernels' form).

    Assumes the key mask is right padding (documented in `kernels.attention`; it cannot be
    checked under `jit`): its count is the length.
    """
    if self.key_mask is None:
      return self
    mask_lengths = jnp.asarray(self.key_mask, bool).sum(-1).astype(jnp.int32)
    kv_lengths = (
      mask_lengths if self.kv_lengths is None else jnp.minimum(self.kv_lengths, mask_lengths)
    )
    return Mask(kv_lengths, self.segment_ids, None, self.window)


jax.tree_util.register_dataclass(
  Mask, data_fields=["kv_lengths", "segment_ids", "key_mask"], meta_fields=["window"]
)


def mask_of(mask: Mask | None, kv_lengths=None, segment_ids=None, key_mask=None) -> Mask:
  """A public function's `mask=` or its `kv_lengths=`, `segment_ids=`, `key_mask=` keywords."""
  parts = Mask(kv_lengths, segment_ids, key_mask)
  if mask is None:
    return parts
  if not isinstance(mask, Mask):
    raise TypeError(f"mask={type(mask).__name__} must be a kernels.Mask")
  given = [
    name
    for name, part in zip(
      ("kv_lengths", "segment_ids", "key_mask"), (kv_lengths, segment_ids, key_mask)
    )
    if part is not None
  ]
  if given:
    raise ValueError(
      f"give the mask either as mask= or as keywords, not both (got mask and {given})"
    )
  return mask
