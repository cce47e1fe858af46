"""Packed sequences: a padded batch's sequences laid end to end in fewer rows.

A batch padded to its longest sentence spends most of its compute on padding when lengths
vary (UD EWT dev: 12.5 real tokens of a padded 64 on average). ModernBERT's
implementation removes the padding and runs attention on the concatenated sequences with a
block-diagonal mask. `Packing` does the same with fixed shapes, so the program compiles
once per (rows, length): each sequence is placed whole in one row of `length` tokens
(first-fit decreasing, longest first), and the row's tokens carry

* `segment_ids` (rows, length): 1, 2, ... for the row's sequences in order, 0 for padding;
  the attention kernels take them (`kernels.Mask(segment_ids=...)`), so a query sees only
  its own sequence's keys;
* `positions` (rows, length): each token's position in its own sequence, for position
  embeddings and rotary angles; relative-position biases and sliding windows read the
  column distance, which equals the distance in the sequence because a sequence is
  contiguous;
* `starts`, `ends` (rows, length): the columns its sequence spans, for the head mask's
  "uniform" ablation (the mean value over the sequence's keys).

`pack` moves a (batch, seq, ...) array into the rows, `unpack` moves it back (zeros at
padding), `unpack_pairs` does the same for (batch, heads, seq, seq) maps. `forward(...,
packed=True)` packs, runs every block on the rows and unpacks every output, captured site
and attention map; `pack_site` packs a patch value or weight for a site.

The layout is computed on the host from a concrete attention mask (NumPy); the arrays it
holds are a pytree that passes through `jit`.
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np


@flax.struct.dataclass
class Packing:
  """Where each sequence of a right-padded (batch, seq) batch lies in packed rows.

  Attributes:
    row: int32 (batch,): the row holding sequence b.
    offset: int32 (batch,): the column of its first token.
    lengths: int32 (batch,): its real tokens.
    segment_ids: int32 (rows, length): 1.. per sequence of the row, 0 at padding.
    positions: int32 (rows, length): the position of each token in its sequence (0 at
      padding).
    starts: int32 (rows, length): the first column of each token's sequence.
    ends: int32 (rows, length): one past its last column (starts = ends at padding).
    source: int32 (rows, length): the flat index b * seq + t of each packed token in the
      padded batch, -1 at padding.
    seq: the padded batch's length (static).
  """

  row: Any
  offset: Any
  lengths: Any
  segment_ids: Any
  positions: Any
  starts: Any
  ends: Any
  source: Any
  seq: int = flax.struct.field(pytree_node=False, default=0)

  @property
  def shape(self) -> tuple[int, int]:
    """(rows, length) of the packed layout."""
    return tuple(self.segment_ids.shape)

  @property
  def key_mask(self):
    """bool (rows, length): the real tokens of the rows (each row's padding is at its end)."""
    return self.segment_ids > 0

  @property
  def fill(self) -> float:
    """The share of the packed layout that is real tokens."""
    return float(np.sum(np.asarray(self.lengths)) / np.prod(self.shape))

  @classmethod
  def of(cls, attention_mask, length: int | None = None, rows: int | None = None) -> Packing:
    """The packing of a right-padded batch.

    Args:
      attention_mask: (batch, seq) of 0/1 (or bool), each row ones then zeros; concrete
        (a NumPy or JAX array, not a traced value inside `jit`).
      length: the packed rows' length (default: seq, so that every sequence fits and the
        attention tiles see the shapes the padded batch had); at least the longest
        sequence.
      rows: the number of rows (default: as many as first-fit decreasing needs); a fixed
        number keeps one compiled program across batches. At least that many.

    Returns:
      A `Packing`.

    Raises:
      ValueError: naming the first row that is not right padding, a `length` below the
        longest sequence, or `rows` below what the sequences need.
      TypeError: a traced mask.
    """
    if isinstance(attention_mask, jax.core.Tracer):
      raise TypeError(
        "packing needs a concrete attention_mask (its lengths decide the "
        "layout); inside jit, build `Packing.of(mask)` outside and pass it as "
        "`packed=`"
      )
    mask = np.asarray(attention_mask)
    if mask.ndim != 2:
      raise ValueError(f"attention_mask.shape={mask.shape} must be (batch, seq)")
    batch, seq = mask.shape
    real = mask.astype(bool)
    lengths = real.sum(1).astype(np.int32)
    right = np.arange(seq)[None, :] < lengths[:, None]
    bad = np.flatnonzero((real != right).any(1))
    if bad.size:
      raise ValueError(
        f"attention_mask row {int(bad[0])} is not right padding "
        f"({mask[bad[0]].astype(int).tolist()}); packing needs each row's "
        "real tokens first"
      )
    length = seq if length is None else int(length)
    if length < max(int(lengths.max(initial=0)), 1):
      raise ValueError(
        f"length={length} must be at least the longest sequence "
        f"({int(lengths.max(initial=0))} tokens)"
      )
    row, offset, used = np.zeros(batch, np.int32), np.zeros(batch, np.int32), []
    for b in sorted(range(batch), key=lambda b: (-lengths[b], b)):  # first-fit decreasing
      r = next((i for i, u in enumerate(used) if u + lengths[b] <= length), len(used))
      if r == len(used):
        used.append(0)
      row[b], offset[b] = r, used[r]
      used[r] += int(lengths[b])
    num_rows = max(len(used), 1)
    if rows is not None:
      if rows < num_rows:
        raise ValueError(
          f"rows={rows} is too few: these {batch} sequences need {num_rows} rows of {length} tokens"
        )
      num_rows = int(rows)
    segment_ids = np.zeros((num_rows, length), np.int32)
    positions = np.zeros((num_rows, length), np.int32)
    col = np.broadcast_to(np.arange(length, dtype=np.int32), (num_rows, length))
    starts, ends = col.copy(), col.copy()
    source = np.full((num_rows, length), -1, np.int32)
    counts = np.zeros(num_rows, np.int32)
    for b in sorted(range(batch), key=lambda b: (row[b], offset[b])):
      r, o, n = row[b], offset[b], lengths[b]
      if n == 0:
        continue
      counts[r] += 1
      span = slice(o, o + n)
      segment_ids[r, span] = counts[r]
      positions[r, span] = np.arange(n)
      starts[r, span], ends[r, span] = o, o + n
      source[r, span] = b * seq + np.arange(n)
    return cls(
      row=jnp.asarray(row),
      offset=jnp.asarray(offset),
      lengths=jnp.asarray(lengths),
      segment_ids=jnp.asarray(segment_ids),
      positions=jnp.asarray(positions),
      starts=jnp.asarray(starts),
      ends=jnp.asarray(ends),
      source=jnp.asarray(source),
      seq=seq,
    )


def pack(x, packing: Packing):
  """(batch, seq, ...) -> (rows, length, ...): each sequence's tokens in its row, zeros at
  the rows' padding."""
  x = jnp.asarray(x)
  flat = x.reshape((-1,) + x.shape[2:])
  src = packing.source
  out = jnp.take(flat, jnp.maximum(src, 0), axis=0)  # (rows, length, ...)
  keep = (src >= 0).reshape(src.shape + (1,) * (x.ndim - 2))
  return jnp.where(keep, out, jnp.zeros((), x.dtype))


def _columns(packing: Packing):
  """(batch, seq) column of each padded token in its row (clipped), and whether it is real."""
  t = jnp.arange(packing.seq)
  cols = packing.offset[:, None] + t[None, :]
  real = t[None, :] < packing.lengths[:, None]
  return jnp.minimum(cols, packing.shape[1] - 1), real


def unpack(y, packing: Packing):
  """(rows, length, ...) -> (batch, seq, ...): the inverse of `pack`, zeros at padding."""
  y = jnp.asarray(y)
  cols, real = _columns(packing)
  out = y[packing.row[:, None], cols]  # (batch, seq, ...)
  return jnp.where(real.reshape(real.shape + (1,) * (y.ndim - 2)), out, jnp.zeros((), y.dtype))


def unpack_pairs(m, packing: Packing):
  """(rows, heads, length, length) -> (batch, heads, seq, seq): each sequence's block of a
  map, zeros at padded queries and keys."""
  m = jnp.asarray(m)
  cols, real = _columns(packing)
  rows = m[packing.row]  # (batch, heads, length, length)
  out = jnp.take_along_axis(rows, cols[:, None, :, None], axis=2)
  out = jnp.take_along_axis(out, cols[:, None, None, :], axis=3)
  both = real[:, None, :, None] & real[:, None, None, :]
  return jnp.where(both, out, jnp.zeros((), m.dtype))


def pack_pairs(x, packing: Packing):
  """(batch, heads, seq, seq) -> (rows, heads, length, length): each sequence's block on
  its row's diagonal, zeros between sequences and at padding."""
  x = jnp.asarray(x)
  src = packing.source
  b, t = jnp.maximum(src, 0) // packing.seq, jnp.maximum(src, 0) % packing.seq  # (R, P)
  out = x[b[:, :, None], :, t[:, :, None], t[:, None, :]]  # (R, P, P, heads)
  out = jnp.moveaxis(out, -1, 1)
  seg = packing.segment_ids
  same = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] > 0)
  return jnp.where(same[:, None], out, jnp.zeros((), x.dtype))


def pack_site(array, axes: str, packing: Packing, depth: bool = True):
  """A patch value or weight for a site whose axes after depth are `axes` ("batch seq ...",
  or "batch heads seq seq"), in the packed layout.

  An array that broadcasts over both batch and sequence stays as it is (it means the same
  in every row); any other is broadcast to (batch, seq) and packed. Maps (two seq axes) are
  always packed, so that a value or weight is zero between the sequences of a row (a
  broadcast probability would otherwise reach another sequence's keys).
  """
  names = axes.split()
  rank = len(names) + depth
  x = jnp.asarray(array)
  x = x.reshape((1,) * (rank - x.ndim) + x.shape)
  lead = 1 if depth else 0
  batch_axis = lead
  seq_axes = [lead + i for i, a in enumerate(names) if a == "seq"]
  pairs = len(seq_axes) == 2
  if not pairs and x.shape[batch_axis] == 1 and all(x.shape[a] == 1 for a in seq_axes):
    return x
  shape = list(x.shape)
  batch = int(packing.row.shape[0])
  shape[batch_axis] = batch
  for a in seq_axes:
    shape[a] = packing.seq
  x = jnp.broadcast_to(x, shape)
  one = lambda v: pack_pairs(v, packing) if pairs else pack(v, packing)
  return jax.vmap(one)(x) if depth else one(x)


def unpack_site(array, axes: str, packing: Packing, depth: bool = True):
  """A captured site (stacked over depth when `depth`) back in the padded layout."""
  one = lambda v: unpack_pairs(v, packing) if axes.split().count("seq") == 2 else unpack(v, packing)
  return jax.vmap(one)(array) if depth else one(array)
