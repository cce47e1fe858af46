"""`DisentangledBias`: DeBERTa's position terms, which depend on the content of q and k.

DeBERTa (He et al. 2021, "DeBERTa: Decoding-enhanced BERT with Disentangled Attention")
scores query i against key j as the sum of three terms, each scaled by `1 / sqrt(f d)`
(`f` = 1 + the number of position terms used):

* content-to-content `q_i . k_j` (the ordinary logit; the kernels' `scale` is `1 / sqrt(f d)`);
* content-to-position `q_i . Kr[r(i, j)]` ("c2p");
* position-to-content `k_j . Qr[r(i, j)]` ("p2c"),

where `Kr`, `Qr` `(2 s, heads, head_dim)` are the layer's projections of the shared relative
embeddings and `r(i, j) = clip(bucket(i - j) + s, 0, 2 s - 1)` the relative index (`s` the
span: `position_buckets`, or `max_relative_positions` without buckets). `bucket` is the
identity, or DeBERTa-v2's log buckets (`log_bucket`): exact within `position_buckets // 2`,
log-spaced beyond, odd in its argument, so the p2c term's `-r(j, i)` of the released code is
the same index. Both index functions are transformers' (`make_log_bucket_position`,
`build_relative_position`), checked against it in the tests.

The XLA path forms each term with one `(T, 2 s)` product per head (over the table rows the
sequence reads) and a gather (`terms`): never a `(B, H, T, T, D)` tensor. The bias is added
to the scaled logits like a `PositionBias`, but per batch row (it depends on the inputs),
and autodiff of `terms` gives the gradients of q, k and the position projections. The fused
Triton-layout kernels gather the same per-row products inside each tile instead
(`flash_attention.disentangled_inputs`).

This module imports only `position_bias`, so every kernel file can use it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .position_bias import PositionBias

TERMS = ("c2p", "p2c")


def log_bucket(relative: np.ndarray, buckets: int, max_position: int) -> np.ndarray:
  """DeBERTa-v2's log bucket of relative positions `i - j` (int array), as transformers'
  `make_log_bucket_position`, in float32 as there: distances below `buckets // 2` are kept,
  larger ones map to `mid + ceil(log(|x| / mid) / log((max_position - 1) / mid) * (mid - 1))`
  with the sign of x."""
  relative = np.asarray(relative, np.int64)
  mid = buckets // 2
  sign = np.sign(relative)
  abs_pos = np.where((relative < mid) & (relative > -mid), mid - 1, np.abs(relative))
  denom = np.log(np.float32((max_position - 1) / mid))
  ratio = np.log(abs_pos.astype(np.float32) / np.float32(mid)) / denom
  log_pos = np.ceil(ratio * np.float32(mid - 1)) + np.float32(mid)
  return np.where(abs_pos <= mid, relative, log_pos * sign).astype(np.int64)


def relative_index(
  seq_q: int, seq_k: int, span: int, buckets: int = -1, max_position: int = -1
) -> np.ndarray:
  """`(seq_q, seq_k)` int32 rows of the relative tables: `clip(bucket(i - j) + span, 0,
  2 span - 1)` (no bucketing unless both `buckets` and `max_position` are positive)."""
  rel = np.arange(seq_q)[:, None] - np.arange(seq_k)[None, :]
  if buckets > 0 and max_position > 0:
    rel = log_bucket(rel, buckets, max_position)
  return np.clip(rel + span, 0, 2 * span - 1).astype(np.int32)


@dataclasses.dataclass(frozen=True)
class DisentangledBias:
  """DeBERTa's content-to-position and position-to-content terms of one layer.

  Attributes:
    pos_key: `(2 span, heads, head_dim)` position keys `Kr` (c2p), or None (no c2p term).
    pos_query: `(2 span, heads, head_dim)` position queries `Qr` (p2c), or None.
    span: the relative tables' half size (static).
    buckets: `position_buckets` (static; <= 0: no log buckets).
    max_position: `max_relative_positions` (static).
    scale: `1 / sqrt(f head_dim)`, the scale of every term (static); the content logit
      takes it too (`attention(..., scale=None)` uses it).
  """

  pos_key: Any = None
  pos_query: Any = None
  span: int = 256
  buckets: int = -1
  max_position: int = 512
  scale: float = 1.0

  kind = "disentangled"

  @property
  def heads(self) -> int:
    """The heads of the position tables (their second axis)."""
    table = self.pos_key if self.pos_key is not None else self.pos_query
    return jnp.shape(table)[1]

  def validate(self, heads: int, head_dim: int | None = None) -> None:
    """Raises a ValueError unless each table is `(2 span, heads, head_dim)`."""
    if self.pos_key is None and self.pos_query is None:
      raise ValueError("a DisentangledBias needs pos_key (c2p), pos_query (p2c) or both")
    for name in ("pos_key", "pos_query"):
      table = getattr(self, name)
      if table is None:
        continue
      shape = jnp.shape(table)
      want = (2 * self.span, heads, head_dim if head_dim is not None else shape[-1])
      if shape != want:
        raise ValueError(
          f"DisentangledBias {name} of shape {shape} must be (2 * span, heads, head_dim) = {want}"
        )

  def index(self, seq_q: int, seq_k: int) -> np.ndarray:
    """The relative index `r(i, j)` `(seq_q, seq_k)` (static)."""
    return relative_index(seq_q, seq_k, self.span, self.buckets, self.max_position)

  def terms(self, q, k, dtype=jnp.float32) -> dict[str, jax.Array]:
    """The scaled position terms present, each `(batch, heads, seq_q, seq_k)`: "c2p"
    `q_i . Kr[r(i, j)]` and "p2c" `k_j . Qr[r(i, j)]`, times `scale`. q `(B, Tq, H, D)`,
    k `(B, Tk, H, D)`."""
    seq_q, seq_k = q.shape[1], k.shape[1]
    idx = self.index(seq_q, seq_k)
    # Only the table rows some (i, j) reads enter the products: rows span - T + 1 .. span +
    # T - 1 for a short sequence (DeBERTa-v3 at T = 128 reads 255 of its 512 rows).
    lo, hi = int(idx.min()), int(idx.max()) + 1
    idx = jnp.asarray(idx - lo)
    out = {}
    if self.pos_key is not None:
      full = jnp.einsum("bqhd,rhd->bhqr", q.astype(dtype), jnp.asarray(self.pos_key, dtype)[lo:hi])
      out["c2p"] = _gather_rows(full, idx) * jnp.asarray(self.scale, dtype)
    if self.pos_query is not None:
      # p2c at (i, j) reads key j's row of k . Qr^T at r(i, j): gather over keys, transpose.
      full = jnp.einsum(
        "bkhd,rhd->bhkr", k.astype(dtype), jnp.asarray(self.pos_query, dtype)[lo:hi]
      )
      out["p2c"] = jnp.swapaxes(_gather_rows(full, idx.T), -1, -2) * jnp.asarray(self.scale, dtype)
    return out

  def scores(self, q, k, dtype=jnp.float32) -> jax.Array:
    """The sum of the position terms, `(batch, heads, seq_q, seq_k)`."""
    return sum(self.terms(q, k, dtype).values())


def _gather_rows(full, idx):
  """`full[..., i, idx[i, j]]`: (B, H, Tq, 2s) and (Tq, Tk) -> (B, H, Tq, Tk)."""
  return jnp.take_along_axis(full, jnp.broadcast_to(idx, full.shape[:2] + idx.shape), axis=-1)


jax.tree_util.register_dataclass(
  DisentangledBias,
  data_fields=["pos_key", "pos_query"],
  meta_fields=["span", "buckets", "max_position", "scale"],
)


def bias_scores(bias, q, k, dtype) -> jax.Array | None:
  """What a bias adds to the scaled logits: `(heads, Tq, Tk)` for a `PositionBias` (the same
  for every batch row), `(batch, heads, Tq, Tk)` for a `DisentangledBias`, None for None."""
  if bias is None:
    return None
  if isinstance(bias, DisentangledBias):
    return bias.scores(q, k, dtype)
  return bias.values(jnp.arange(q.shape[1]), jnp.arange(k.shape[1]), dtype)


def add_bias(logits, values):
  """`logits (B, H, Tq, Tk) + values`, broadcasting a batch-free `(H, Tq, Tk)` bias."""
  if values is None:
    return logits
  values = values.astype(logits.dtype)
  return logits + (values[None] if values.ndim == 3 else values)


def default_scale(bias, head_dim: int, scale=None) -> float:
  """The logit scale: `scale` if given, a DisentangledBias' own, else `1 / sqrt(head_dim)`."""
  if scale is not None:
    return float(scale)
  if isinstance(bias, DisentangledBias):
    return float(bias.scale)
  return 1.0 / math.sqrt(head_dim)


BIASES = (PositionBias, DisentangledBias)
