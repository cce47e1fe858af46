"""What the Pallas attention kernels share: tile sizes, static configuration, padding, helpers.

Used by both variants (`kernels.flash_attention`, Triton layout; `kernels.flash_attention_tpu`,
Mosaic layout) and by the statistics pass (`kernels.flash_attention_stats`):

* `BlockSizes` (public, static tile sizes) and `KernelConfig` (everything else static);
* `prepare`: fills defaults and pads the sequence to a multiple of every block;
  `pad_head_dim`: pads head_dim to a power of two for Triton tiles;
* `dot`, `MASK_VALUE`: the in-kernel matmul and masked-logit value;
* the Triton layout on a `(batch, heads, q-blocks)` grid (`pallas_call`, `common_specs`,
  `block_slice`, `allowed_tile`), shared by the Triton forward/backward and the statistics
  pass.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from . import dropout as drop
from .masks import Mask

# Large finite negative logit for masked keys: -inf would give NaN in `exp(-inf - -inf)`.
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Static tile sizes of the attention kernels.

  Attributes:
    block_q: query rows per program in the forward and statistics kernels.
    block_k: keys per loop step in the forward and statistics kernels.
    block_q_bwd: query rows per step in the backward kernels.
    block_k_bwd: keys per step in the backward kernels.
    num_warps: Triton warps per program (GPU only; None picks by head_dim).
    num_stages: Triton software pipelining stages (GPU only).
  """

  block_q: int = 64
  block_k: int = 64
  block_q_bwd: int = 64
  block_k_bwd: int = 64
  num_warps: int | None = None
  num_stages: int = 2

  def __post_init__(self):
    for name in ("block_q", "block_k", "block_q_bwd", "block_k_bwd"):
      value = getattr(self, name)
      if value < 16 or value & (value - 1):
        raise ValueError(f"BlockSizes.{name}={value} must be a power of two >= 16")

  @classmethod
  def get_default(cls, backend: str | None = None) -> BlockSizes:
    """Default block sizes for `backend` ("gpu", "tpu", "cpu"; None: the default backend)."""
    backend = backend or jax.default_backend()
    if backend in ("gpu", "cuda", "rocm"):
      return cls(block_q=64, block_k=64, block_q_bwd=64, block_k_bwd=64, num_stages=2)
    if backend == "tpu":
      return cls(block_q=128, block_k=128, block_q_bwd=128, block_k_bwd=128)
    # CPU interpret mode: small tiles keep the emulated loops short for short sequences.
    return cls(block_q=32, block_k=32, block_q_bwd=32, block_k_bwd=32)

  def clipped(self, seq_len: int) -> BlockSizes:
    """Shrinks blocks to the next power of two >= seq_len (at least 16)."""
    cap = max(16, pl.next_power_of_2(seq_len))
    return dataclasses.replace(
      self,
      block_q=min(self.block_q, cap),
      block_k=min(self.block_k, cap),
      block_q_bwd=min(self.block_q_bwd, cap),
      block_k_bwd=min(self.block_k_bwd, cap),
    )


@dataclasses.dataclass(frozen=True)
class KernelConfig:
  """Static configuration shared by the forward, backward and statistics kernels."""

  scale: float
  ablation: str
  block_sizes: BlockSizes
  has_segments: bool
  interpret: bool
  backward: str  # "pallas" | "reference"
  dropout_rate: float = 0.0
  half_window: int | None = None  # a sliding window: keys with |q - k| <= half_window
  bias_kind: str | None = None  # inside the tile: "buckets" | "alibi" | "disentangled"
  num_buckets: int = 32
  max_distance: int = 128
  # "disentangled" (DeBERTa): the terms present ("c2p", "p2c"), the offset that turns
  # `q - k` into an index of the relative-row table, and the padded width of the per-row
  # position scores (see `disentangled_tile`).
  terms: tuple[str, ...] = ()
  lut_offset: int = 0
  rel_width: int = 0
  groups: int = 1  # query heads per key/value head (grouped heads)

  @property
  def uniform(self) -> bool:
    """Whether a head mask mixes the attention with the uniform one (`ablation` "uniform")."""
    return self.ablation == "uniform"

  @property
  def dropout(self) -> bool:
    """Whether the kernels drop attention weights (`dropout_rate` > 0)."""
    return self.dropout_rate > 0

  @property
  def drop_threshold(self) -> int:
    """`drop.threshold(dropout_rate)`: entries whose random bits fall below it are dropped."""
    return drop.threshold(self.dropout_rate)

  @property
  def keep_scale(self) -> float:
    """The kept weights' scale, `1 / (1 - dropout_rate)`."""
    return 1.0 / (1.0 - self.dropout_rate)


def prepare(q, k, v, mask: Mask, head_mask, block_sizes: BlockSizes, *extra_rows):
  """Pads the sequence to a multiple of every block and fills defaults.

  `mask` is in lengths form (no key mask; see `Mask.as_lengths`). Returns `(block sizes
  clipped to the sequence, padded length, lengths (batch,) int32, xi (batch, heads), [q, k, v,
  segment ids, *extra_rows] padded)`.
  """
  if mask.key_mask is not None:
    raise ValueError("the fused kernels take kv_lengths, not key_mask: use Mask.as_lengths()")
  batch, seq, heads, _ = q.shape
  bs = block_sizes.clipped(seq)
  multiple = max(bs.block_q, bs.block_k, bs.block_q_bwd, bs.block_k_bwd)
  seq_pad = pl.cdiv(seq, multiple) * multiple
  lengths = (
    jnp.full((batch,), seq, jnp.int32)
    if mask.kv_lengths is None
    else jnp.clip(jnp.asarray(mask.kv_lengths, jnp.int32), 0, seq)
  )
  xi = jnp.ones((batch, heads), jnp.float32) if head_mask is None else head_mask

  def pad_seq(x):
    if x is None or seq_pad == seq:
      return x
    widths = [(0, 0)] * x.ndim
    widths[1] = (0, seq_pad - seq)
    return jnp.pad(x, widths)

  seg = None if mask.segment_ids is None else jnp.asarray(mask.segment_ids, jnp.int32)
  padded = [pad_seq(x) for x in (q, k, v, seg, *extra_rows)]
  return bs, seq_pad, lengths, xi, padded


def pad_head_dim(x):
  """Zero-pads head_dim to a power of two >= 16 (Triton tiles); zeros change no logit."""
  head_dim = x.shape[-1]
  padded = max(16, pl.next_power_of_2(head_dim))
  if padded == head_dim:
    return x
  return jnp.pad(x, [(0, 0)] * 3 + [(0, padded - head_dim)])


def dot(a, b, *, trans_a=False, trans_b=False):
  """2-D matmul with float32 accumulation; float32 inputs use full (IEEE) precision."""
  if a.dtype != b.dtype:
    a = a.astype(b.dtype)
  dims = (((0,) if trans_a else (1,), (1,) if trans_b else (0,)), ((), ()))
  precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
  return lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


# ----------------------------------------------------------------------------------------
# Triton layout: (batch, seq, heads, head_dim) arrays on a (batch, heads, q-blocks) grid.


def block_slice(start, size):
  """`pl.ds` of `size` rows from `start`, a multiple of `size`."""
  return pl.ds(pl.multiple_of(start, size), size)


def allowed_tile(q_idx, k_idx, length, seg_q, seg_k, half_window=None):
  """(bq, bk) bool: key is real (index < length), when packed in the query's segment, and
  within the window (`|q - k| <= half_window`) when there is one."""
  mask = (k_idx < length)[None, :]
  if seg_q is not None:
    mask = mask & (seg_q[:, None] == seg_k[None, :])
  if half_window is not None:
    mask = mask & (jnp.abs(k_idx[None, :] - q_idx[:, None]) <= half_window)
  return jnp.broadcast_to(mask, (q_idx.shape[0], k_idx.shape[0]))


def key_blocks(cfg: KernelConfig, q_start, block_q: int, block_k: int, length):
  """`(lo, hi)`: the key blocks a query block visits. Blocks past the sequence's length, and
  with a window the blocks outside the band, are skipped, not masked: a window layer costs
  `T x (w + blocks)`, not `T x T`. A query block wholly past the length visits none."""
  hi = pl.cdiv(length, block_k)
  lo = 0
  if cfg.half_window is not None:
    lo = jnp.maximum(q_start - cfg.half_window, 0) // block_k
    hi = jnp.minimum(hi, (q_start + block_q - 1 + cfg.half_window) // block_k + 1)
  hi = jnp.where(q_start < length, hi, lo)
  return lo, jnp.maximum(hi, lo)


def query_blocks(cfg: KernelConfig, k_start, block_k: int, block_q: int, length):
  """`(lo, hi)`: the query blocks a key block is seen from (the backward's dK/dV loop)."""
  hi = pl.cdiv(length, block_q)
  lo = 0
  if cfg.half_window is not None:
    lo = jnp.maximum(k_start - cfg.half_window, 0) // block_q
    hi = jnp.minimum(hi, (k_start + block_k - 1 + cfg.half_window) // block_q + 1)
  hi = jnp.where(k_start < length, hi, lo)
  return lo, jnp.maximum(hi, lo)


def bias_specs(cfg: KernelConfig, seq_pad: int) -> list:
  """The BlockSpecs of the bias inputs on a (batch, heads, blocks) grid: a table kind's
  (heads, entries) table; for "disentangled" the relative-row table and the (batch, heads,
  seq_pad, rel_width) position scores of each term present, whole per (batch, head)."""
  if cfg.bias_kind is None:
    return []
  if cfg.bias_kind != "disentangled":
    width = 1 if cfg.bias_kind == "alibi" else cfg.num_buckets
    return [pl.BlockSpec((None, width), lambda b, h, i: (h, 0))]
  rows = pl.BlockSpec((None, None, seq_pad, cfg.rel_width), lambda b, h, i: (b, h, 0, 0))
  return [pl.BlockSpec((2 * seq_pad,), lambda b, h, i: (0,))] + [rows] * len(cfg.terms)


def bias_args(cfg: KernelConfig, table) -> list:
  """The bias inputs `bias_specs` describes, from the kernels' table (see `take_bias`)."""
  if cfg.bias_kind is None:
    return []
  if cfg.bias_kind != "disentangled":
    return [table]
  lut, c2p, p2c = table
  return [lut] + [x for x in (c2p, p2c) if x is not None]


def take_bias(cfg: KernelConfig, refs: list):
  """Pops the bias inputs off a kernel's `refs`: ALiBi's slope as a value, a buckets table as
  its ref (`bias_tile` gathers from it), or for "disentangled" the refs `(lut, c2p or None,
  p2c or None)`; None without a bias."""
  if cfg.bias_kind is None:
    return None
  if cfg.bias_kind == "alibi":
    return refs.pop(0)[...]
  if cfg.bias_kind == "buckets":
    return refs.pop(0)
  lut = refs.pop(0)
  return (lut, *(refs.pop(0) if t in cfg.terms else None for t in ("c2p", "p2c")))


def relative_rows(cfg: KernelConfig, lut_ref, q_idx, k_idx):
  """(bq, bk) int32: the row of the relative tables that query q_idx[i] and key k_idx[j]
  read, `lut[q - k + lut_offset]` (a gather from a ref: pointer loads on Triton)."""
  return lut_ref[q_idx[:, None] - k_idx[None, :] + cfg.lut_offset]


def disentangled_tile(cfg: KernelConfig, refs, q_idx, k_idx):
  """DeBERTa's position terms of a (bq, bk) tile, gathered from the per-row position scores
  (as FlashDeBERTa): c2p `C[q, r(q, k)]` with `C = scale q Kr^T` and p2c `P[k, r(q, k)]` with
  `P = scale k Qr^T`, both `(seq_pad, rel_width)` per (batch, head). No T x T bias exists."""
  lut_ref, c2p_ref, p2c_ref = refs
  r = relative_rows(cfg, lut_ref, q_idx, k_idx)
  out = jnp.zeros(r.shape, jnp.float32)
  if c2p_ref is not None:
    out = out + c2p_ref[jnp.broadcast_to(q_idx[:, None], r.shape), r]
  if p2c_ref is not None:
    out = out + p2c_ref[jnp.broadcast_to(k_idx[None, :], r.shape), r]
  return out


def disentangled_grad(out_ref, rows, r, ds) -> None:
  """Adds a tile's `ds = dL/dS` to the position scores' gradient `out_ref` at (rows, r):
  a scatter-add (`jax.ref.addupdate`, atomic adds on Triton) that sums the keys (or
  queries) sharing a relative row, as clipping and log buckets make them."""
  jax.ref.addupdate(out_ref, (jnp.broadcast_to(rows, r.shape), r), ds)


def table_row(cfg: KernelConfig, table_ref, r: int):
  """Query head `r`'s bias from a `(heads, entries)` table ref, in `take_bias`'s form: ALiBi's
  slope as a value, a buckets table as `(ref, r)`."""
  return table_ref[r, :] if cfg.bias_kind == "alibi" else (table_ref, r)


def bias_tile(cfg: KernelConfig, bias_ref, q_idx, k_idx):
  """The position bias of a (bq, bk) tile from this head's small table, or None.

  "buckets": T5/MPNet buckets of `k - q`, gathered from the table's ref (`bias_ref`, or
  `(ref, row)` of a table of several heads): pointer loads on Triton, where indexing a loaded
  table lowers to `slice` or `gather` on a value, which Pallas' Triton lowering lacks (seen on
  an H200, jax 0.11.2); "alibi": `-slope * |k - q|`; "disentangled": `disentangled_tile`,
  `bias_ref` the refs of `take_bias`. No T x T bias exists.
  """
  if cfg.bias_kind is None:
    return None
  if cfg.bias_kind == "disentangled":
    return disentangled_tile(cfg, bias_ref, q_idx, k_idx)
  rel = k_idx[None, :] - q_idx[:, None]
  if cfg.bias_kind == "alibi":
    return -bias_ref[0] * jnp.abs(rel).astype(jnp.float32)
  from .position_bias import relative_position_bucket

  bucket = relative_position_bucket(rel, cfg.num_buckets, cfg.max_distance)
  if isinstance(bias_ref, tuple):
    ref, row = bias_ref
    return ref[jnp.full(bucket.shape, row, jnp.int32), bucket].astype(jnp.float32)
  return bias_ref[bucket].astype(jnp.float32)


def bias_grad_tile(cfg: KernelConfig, ds, q_idx, k_idx):
  """The gradient a tile's `ds = dL/dS` gives the bias table: (num_buckets,) per bucket, or
  (1,) for ALiBi's slope."""
  rel = k_idx[None, :] - q_idx[:, None]
  if cfg.bias_kind == "alibi":
    return (-(ds * jnp.abs(rel).astype(jnp.float32)).sum())[None]
  from .position_bias import relative_position_bucket

  bucket = relative_position_bucket(rel, cfg.num_buckets, cfg.max_distance)
  # Each bucket's sum placed by a select: stacking scalars would lower to `concatenate`, not
  # checked compiled (the run that found the forward's `slice` stopped there); selects and
  # sums are what ALiBi's gradient, which compiled, uses.
  lanes = jnp.arange(cfg.num_buckets)
  out = jnp.zeros((cfg.num_buckets,), jnp.float32)
  for n in range(cfg.num_buckets):
    out = out + jnp.where(lanes == n, jnp.where(bucket == n, ds, 0.0).sum(), 0.0)
  return out


def pallas_call(kernel, cfg: KernelConfig, head_dim: int, **kwargs):
  """pl.pallas_call with Triton compiler params when compiled (JAX's GPU default is Mosaic)."""
  compiler_params = None
  if not cfg.interpret:
    from jax.experimental.pallas import triton as plgpu  # GPU-only module, imported lazily

    num_warps = cfg.block_sizes.num_warps or (4 if head_dim <= 64 else 8)
    compiler_params = plgpu.CompilerParams(
      num_warps=num_warps, num_stages=cfg.block_sizes.num_stages
    )
  return pl.pallas_call(kernel, interpret=cfg.interpret, compiler_params=compiler_params, **kwargs)


def common_specs(cfg: KernelConfig, seq_pad: int, head_dim: int, block_q: int):
  """BlockSpecs of (q, k, v, lengths, xi[, seg_q, seg_k]) on a (batch, heads, q-blocks) grid.

  Query head h reads key/value head `h // cfg.groups` (grouped heads, never repeated).
  """
  g = cfg.groups
  q_spec = pl.BlockSpec((None, block_q, None, head_dim), lambda b, h, i: (b, i, h, 0))
  kv_spec = pl.BlockSpec((None, seq_pad, None, head_dim), lambda b, h, i: (b, 0, h // g, 0))
  specs = [
    q_spec,
    kv_spec,
    kv_spec,
    pl.BlockSpec((None,), lambda b, h, i: (b,)),
    pl.BlockSpec((None, None), lambda b, h, i: (b, h)),
  ]
  if cfg.has_segments:
    specs += [
      pl.BlockSpec((None, block_q), lambda b, h, i: (b, i)),
      pl.BlockSpec((None, seq_pad), lambda b, h, i: (b, 0)),
    ]
  return specs
