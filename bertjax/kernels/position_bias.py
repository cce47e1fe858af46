"""`PositionBias`: a per-head score bias that depends only on (query position, key position).

Two kinds, each held as a small table and expanded only where scores are formed:

* `"buckets"`: T5's and MPNet's bidirectional relative-position buckets. The distance
  `k - q` is mapped to one of `num_buckets` buckets (exact for short distances, log-spaced up
  to `max_distance`, one bucket per sign), and the bias is `table[bucket, head]`; `table` is
  `(buckets, heads)` and is trained (MPNet's `relative_attention_bias`). The bucket function is
  transformers' `relative_position_bucket` (`MPNetEncoder`, `T5Attention` with
  `bidirectional=True`), computed in float32 as there.
* `"alibi"`: ALiBi (Press et al. 2022), bidirectional: `-slope[head] * |k - q|`; `table` is
  the `(heads,)` slopes.

The bias is added to the scaled logits `q.k / sqrt(d)` before the softmax. `values` gives it
for any query and key index arrays, so the XLA path expands it once per call and a fused
kernel can form one tile at a time; gradients reach `table`.

This module imports nothing of the package, so every kernel file can use it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

KINDS = ("buckets", "alibi")


def relative_position_bucket(relative_position, num_buckets: int = 32, max_distance: int = 128):
  """T5's bidirectional bucket of `relative_position = k - q` (int array), as transformers'.

  Keys at or before the query (k <= q) take buckets `[0, num_buckets // 2)`, keys after it
  the upper half; within a half, distances below `num_buckets // 4` are exact and larger
  ones log-spaced up to `max_distance`, beyond which they share the half's last bucket.
  """
  n = -jnp.asarray(relative_position, jnp.int32)
  half = num_buckets // 2
  ret = jnp.where(n < 0, half, 0)
  n = jnp.abs(n)
  max_exact = half // 2
  is_small = n < max_exact
  # float32 as transformers (torch.log on float32); n >= max_exact >= 1 where it is used.
  ratio = jnp.maximum(n, 1).astype(jnp.float32) / max_exact
  scale = (half - max_exact) / math.log(max_distance / max_exact)
  large = max_exact + (jnp.log(ratio) * jnp.float32(scale)).astype(jnp.int32)
  large = jnp.minimum(large, half - 1)
  return ret + jnp.where(is_small, n, large)


def alibi_slopes(heads: int) -> jax.Array:
  """ALiBi's head slopes: the geometric sequence `2^(-8 i / n)` of Press et al. (n a power of
  two; otherwise the closest power's slopes plus every other slope of the next one)."""

  def powers(n):
    start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
    return [start * start**i for i in range(n)]

  if math.log2(heads).is_integer():
    slopes = powers(heads)
  else:
    closest = 2 ** math.floor(math.log2(heads))
    slopes = powers(closest) + powers(2 * closest)[0::2][: heads - closest]
  return jnp.asarray(slopes, jnp.float32)


@dataclasses.dataclass(frozen=True)
class PositionBias:
  """A per-head bias of the attention scores that depends on positions only.

  Attributes:
    table: "buckets": float `(num_table_rows, heads)` (rows >= num_buckets); "alibi": float
      `(heads,)` slopes. A pytree leaf (differentiable).
    kind: "buckets" or "alibi" (static).
    num_buckets: buckets of the bucket function (static; MPNet always uses 32).
    max_distance: distances beyond it share the last bucket (static).
  """

  table: Any
  kind: str = "buckets"
  num_buckets: int = 32
  max_distance: int = 128

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"PositionBias kind={self.kind!r} must be one of {KINDS}")

  @property
  def heads(self) -> int:
    """The query heads the table holds: its last axis for buckets, its length for ALiBi slopes."""
    return jnp.shape(self.table)[-1] if self.kind == "buckets" else jnp.shape(self.table)[0]

  def validate(self, heads: int) -> None:
    """Raises a ValueError unless the table fits `heads` query heads."""
    shape = jnp.shape(self.table)
    if self.kind == "buckets":
      if len(shape) != 2 or shape[1] != heads or shape[0] < self.num_buckets:
        raise ValueError(
          f"a 'buckets' PositionBias table of shape {shape} must be "
          f"(>= num_buckets={self.num_buckets}, heads={heads})"
        )
    elif shape != (heads,):
      raise ValueError(f"an 'alibi' PositionBias table of shape {shape} must be ({heads},)")

  def values(self, q_idx, k_idx, dtype=jnp.float32) -> jax.Array:
    """The bias `(heads, len(q_idx), len(k_idx))` for query and key positions (int vectors)."""
    return self.at(jnp.asarray(k_idx)[None, :] - jnp.asarray(q_idx)[:, None], dtype)

  def at(self, relative_position, dtype=jnp.float32) -> jax.Array:
    """The bias `(heads, *shape)` at relative positions `k - q` (an int array of any shape)."""
    rel = jnp.asarray(relative_position)
    if self.kind == "alibi":
      slopes = jnp.asarray(self.table, dtype).reshape((-1,) + (1,) * rel.ndim)
      return -slopes * jnp.abs(rel).astype(dtype)[None]
    buckets = relative_position_bucket(rel, self.num_buckets, self.max_distance)
    return jnp.moveaxis(jnp.asarray(self.table, dtype)[buckets], -1, 0)


jax.tree_util.register_dataclass(
  PositionBias, data_fields=["table"], meta_fields=["kind", "num_buckets", "max_distance"]
)
