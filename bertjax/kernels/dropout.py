"""Attention dropout as a pure function of (seed, batch, head, query, key): no mask is stored.

Every implementation of `kernels.attention` (the Pallas forward and both backward kernels in
the Triton and TPU variants, in compiled and interpret mode, the `impl="xla"` path and
`reference_attention`) draws its dropout mask from the functions below, each for the tiles it
touches, from the absolute indices `(b, h, q, k)` of the unpadded problem. The bits are
therefore identical everywhere and independent of block sizes and padding, which is what
lets the tests compare a kernel with the reference exactly.

The stream is a counter-based hash in 32-bit integer arithmetic (wrapping multiply, xor,
logical shift right, add; every op lowers on Triton, Mosaic TPU, XLA and interpret mode),
built from the MurmurHash3 finalizer `fmix32` (full avalanche: each input bit flips each
output bit with probability about 1/2):

* per (b, h): `key = fmix32(fmix32(fmix32(seed ^ SALT) + b * G1) + h * G2)`, computed in XLA
  outside the kernels, `(batch, heads)` int32;
* per query row: `row = fmix32(key + q * G3)`; per key column: `col = fmix32(k * G4 + SALT2)`;
* per entry: `bits = fmix32(row ^ col)`; the entry is kept when `bits >>> 1 >= threshold`,
  `threshold = round(rate * 2**31)`, and kept entries are scaled by `1 / (1 - rate)`
  (inverted dropout, as `flax.linen.Dropout` and `torch.nn.Dropout`).

All values are int32 bit patterns (uint32 arithmetic is the same bits). The seed is an int32
or uint32 scalar; derive one per call (per layer, per step) from a JAX PRNG key with
`jax.random.bits(key, (), jnp.uint32)` (see `seed_from_key`). The mask depends only on the
seed and the absolute indices: the same seed gives the same mask, and under `shard_map` each
shard sees its local batch indices, so fold the shard index into the key before drawing the
seed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def _i32(c: int) -> np.int32:
  """A uint32 constant as the int32 with the same bits (int32 multiply wraps like uint32)."""
  return np.int32(c - (1 << 32) if c >= 1 << 31 else c)


_FMIX_1, _FMIX_2 = _i32(0x85EBCA6B), _i32(0xC2B2AE35)  # MurmurHash3 fmix32
_SEED_SALT, _COL_SALT = _i32(0x2545F491), _i32(0x68E31DA4)
_MUL_B, _MUL_H = _i32(0x9E3779B9), _i32(0x632BE5AB)  # odd: bijective on 32 bits
_MUL_Q, _MUL_K = _i32(0x85157AF5), _i32(0xCC9E2D51)


def _srl(x, n: int):
  return lax.shift_right_logical(x, np.int32(n))


def fmix32(x):
  """MurmurHash3's 32-bit finalizer on int32 bit patterns (a bijection with full avalanche)."""
  x = x ^ _srl(x, 16)
  x = x * _FMIX_1
  x = x ^ _srl(x, 13)
  x = x * _FMIX_2
  return x ^ _srl(x, 16)


def threshold(rate: float) -> int:
  """Entries whose 31 random bits are below this are dropped: `round(rate * 2**31)`."""
  return min(round(rate * (1 << 31)), (1 << 31) - 1)


def check_rate(rate) -> float:
  """The rate as a Python float; a clear error unless it is a static number in [0, 1)."""
  try:
    if isinstance(rate, (bool, str, bytes)):
      raise TypeError
    value = float(rate)
  except Exception:  # noqa: BLE001 (tracers, strings, arrays: all the same answer)
    raise ValueError(
      f"dropout_rate={rate!r} must be a static Python float in [0, 1) (not a traced value)"
    ) from None
  if not 0.0 <= value < 1.0:
    raise ValueError(f"dropout_rate={rate!r} must be in [0, 1)")
  return value


def seed_from_key(key) -> jax.Array:
  """A uint32 dropout seed from a JAX PRNG key: `jax.random.bits(key, (), jnp.uint32)`."""
  return jax.random.bits(key, (), jnp.uint32)


def seed_to_int32(seed) -> jax.Array:
  """The int32 bit pattern of an integer scalar seed (int32, uint32, Python int) or PRNG key.

  Args:
    seed: an integer scalar (array or Python int; uint32 and int32 with the same bits give
      the same mask), or a typed JAX PRNG key (`jax.random.key`), which is turned into a seed
      with `seed_from_key`.

  Returns:
    An int32 scalar array.
  """
  if isinstance(seed, jax.Array) and jax.dtypes.issubdtype(seed.dtype, jax.dtypes.prng_key):
    if seed.shape != ():
      raise ValueError(f"dropout_seed as a PRNG key must be a single key, got {seed.shape=}")
    seed = seed_from_key(seed)
  if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
    return jnp.asarray(np.uint32(int(seed) % (1 << 32)).view(np.int32))
  if isinstance(seed, bool) or not hasattr(seed, "dtype"):
    raise ValueError(
      f"dropout_seed={seed!r} must be an int32/uint32 scalar, e.g. "
      "jax.random.bits(key, (), jnp.uint32)"
    )
  if jnp.shape(seed) != () or not jnp.issubdtype(seed.dtype, jnp.integer):
    raise ValueError(
      f"dropout_seed must be an integer scalar, got shape={jnp.shape(seed)} dtype={seed.dtype}"
    )
  seed = jnp.asarray(seed)
  if seed.dtype == jnp.int32:
    return seed
  return lax.bitcast_convert_type(seed.astype(jnp.uint32), jnp.int32)


def stream_keys(seed, batch: int, heads: int) -> jax.Array:
  """int32 `(batch, heads)`: one stream key per (b, h) from an int32 scalar seed."""
  s = fmix32(seed ^ _SEED_SALT)
  b = jnp.arange(batch, dtype=jnp.int32)[:, None]
  h = jnp.arange(heads, dtype=jnp.int32)[None, :]
  return fmix32(fmix32(s + b * _MUL_B) + h * _MUL_H)


def row_hash(key, q_idx):
  """Per query row: `fmix32(key + q * G3)`; key and q_idx broadcast (int32)."""
  return fmix32(key + q_idx * _MUL_Q)


def col_hash(k_idx):
  """Per key column: `fmix32(k * G4 + SALT2)` (int32)."""
  return fmix32(k_idx * _MUL_K + _COL_SALT)


def keep(row, col, thresh: int):
  """bool: entries kept; row `(..., bq, 1)` and col `(..., 1, bk)` hashes broadcast."""
  return _srl(fmix32(row ^ col), 1) >= thresh


def keep_mask(seed, batch: int, heads: int, seq_q: int, seq_k: int, rate: float):
  """bool `(batch, heads, seq_q, seq_k)`: the kept entries, as every kernel draws them.

  Args:
    seed: int32 scalar (see `seed_to_int32`).
    batch: batch size.
    heads: number of heads.
    seq_q: query length.
    seq_k: key length.
    rate: dropout rate in [0, 1).

  Returns:
    The keep mask; each entry is kept with probability `1 - rate`.
  """
  keys = stream_keys(seed, batch, heads)[:, :, None, None]  # (B, H, 1, 1)
  rows = row_hash(keys, jnp.arange(seq_q, dtype=jnp.int32)[:, None])  # (B, H, Tq, 1)
  cols = col_hash(jnp.arange(seq_k, dtype=jnp.int32))[None, None, None, :]  # (1, 1, 1, Tk)
  return keep(rows, cols, threshold(rate))


def multiplier(seed, batch: int, heads: int, seq_q: int, seq_k: int, rate: float, dtype):
  """`(batch, heads, seq_q, seq_k)`: `1 / (1 - rate)` where kept, 0 where dropped."""
  kept = keep_mask(seed, batch, heads, seq_q, seq_k, rate)
  return jnp.where(kept, jnp.asarray(1.0 / (1.0 - rate), dtype), jnp.asarray(0.0, dtype))
