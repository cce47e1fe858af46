"""Small statistics every analysis shares: mean pooling, ranks, Pearson and Spearman.

One definition each, so that every report, experiment and metric computes them alike:
`mean_pool` works on NumPy and JAX arrays (and under `jit`); the correlations are NumPy
in float64 and give NaN where they are undefined (a constant side has no order).
"""

from __future__ import annotations

import numpy as np


def mean_pool(hidden, mask):
  """The mean over real tokens of `hidden (..., batch, seq, H)`: `(..., batch, H)`.

  Args:
    hidden: token states, a NumPy or JAX array; leading axes (layers) are kept.
    mask: `(batch, seq)`, nonzero on real tokens (any dtype).

  Returns:
    The pooled states, in `hidden`'s dtype and array type; an all-padding row gives zeros.
  """
  m = mask.astype(hidden.dtype)[..., None]
  return (hidden * m).sum(-2) / m.sum(-2).clip(min=1)


def rankdata(a) -> np.ndarray:
  """Ranks along the last axis starting at 1, ties given their average rank (float64).

  The same as `scipy.stats.rankdata(a, axis=-1)`, vectorised over leading axes.
  """
  a = np.asarray(a, np.float64)
  n = a.shape[-1]
  order = np.argsort(a, axis=-1, kind="stable")
  s = np.take_along_axis(a, order, -1)
  idx = np.broadcast_to(np.arange(n), a.shape)
  starts = np.ones(a.shape, bool)
  starts[..., 1:] = s[..., 1:] != s[..., :-1]
  ends = np.ones(a.shape, bool)
  ends[..., :-1] = starts[..., 1:]
  first = np.maximum.accumulate(np.where(starts, idx, 0), axis=-1)
  last = np.flip(np.minimum.accumulate(np.flip(np.where(ends, idx, n), -1), axis=-1), -1)
  ranks = np.empty(a.shape, np.float64)
  np.put_along_axis(ranks, order, (first + last) / 2.0 + 1, -1)
  return ranks


def pearson_rows(x, y) -> np.ndarray:
  """Row-wise Pearson correlation of `x, y (..., n)` in float64; NaN for a constant row."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  x = x - x.mean(-1, keepdims=True)
  y = y - y.mean(-1, keepdims=True)
  denom = np.sqrt((x * x).sum(-1) * (y * y).sum(-1))
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(denom > 0, (x * y).sum(-1) / denom, np.nan)


def pearson(x, y) -> float:
  """Pearson correlation of two arrays (flattened); NaN when either is constant."""
  return float(pearson_rows(np.ravel(x), np.ravel(y)))


def spearman_rows(x, y) -> np.ndarray:
  """Row-wise Spearman correlation of `x, y (..., n)`; NaN for a constant row."""
  return pearson_rows(rankdata(x), rankdata(y))


def spearman(x, y) -> float:
  """Spearman rank correlation of two arrays (flattened; ties averaged, as in scipy).

  NaN when either side is constant (no rank order).
  """
  return float(spearman_rows(np.ravel(x), np.ravel(y)))
