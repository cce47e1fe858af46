"""Small statistics every analysis shares: mean pooling, ranks, Pearson and Spearman, and the
bootstrap confidence interval every verdict's uncertainty comes from.

One definition each, so that every report, experiment and metric computes them alike:
`mean_pool` works on NumPy and JAX arrays (and under `jit`); the correlations are NumPy
in float64 and give NaN where they are undefined (a constant side has no order);
`bootstrap_ci` is the seeded percentile bootstrap (as `scipy.stats.bootstrap(...,
method="percentile")`, which draws the same resamples from the same seed).
"""

from __future__ import annotations

import warnings

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


def bootstrap_ci(data, statistic, *, n_resamples: int = 2000, confidence: float = 0.95,
                 seed: int = 0, vectorized: bool = False):
  """Percentile bootstrap confidence interval of `statistic` over the items of `data`.

  Resamples the items (the first axis) with replacement `n_resamples` times, evaluates the
  statistic on each resample and returns the `(1 - confidence) / 2` and `(1 + confidence) / 2`
  quantiles (linear interpolation) of those values. The resamples are
  `np.random.default_rng(seed).integers(0, n, (n_resamples, n))`, the indices
  `scipy.stats.bootstrap` draws from the same generator, so with `method="percentile"` the
  two agree exactly. Resamples on which the statistic is undefined (NaN, e.g. a correlation
  of a constant resample) are left out of the quantiles; all NaN gives NaN.

  Args:
    data: an array whose first axis holds the items (sentences, heads, runs, ...), or a tuple
      of such arrays with the same number of items, resampled together (paired: item i of
      every array goes with item i of the others).
    statistic: `statistic(*arrays)` -> a number or an array of numbers. With `vectorized`, it
      gets the arrays with a leading resample axis, `(n_resamples, n, ...)`, and returns
      `(n_resamples, ...)`.
    n_resamples: how many resamples (>= 1).
    confidence: the interval's coverage, in (0, 1).
    seed: the resamples' seed: the same seed, data and statistic give the same interval.
    vectorized: see `statistic`.

  Returns:
    `(low, high)`: floats, or arrays shaped as the statistic's value.

  Raises:
    ValueError: no items, arrays with different numbers of items, or a bad `n_resamples` or
      `confidence`.
  """
  arrays = tuple(np.asarray(a) for a in (data if isinstance(data, tuple) else (data,)))
  sizes = {a.shape[0] if a.ndim else None for a in arrays}
  if len(sizes) != 1 or None in sizes or 0 in sizes:
    raise ValueError(f"data must be one or more arrays with the same (>= 1) items on their "
                     f"first axis; got shapes {[a.shape for a in arrays]}")
  if not (isinstance(n_resamples, int) and n_resamples >= 1):
    raise ValueError(f"{n_resamples=} must be an int >= 1")
  if not 0 < confidence < 1:
    raise ValueError(f"{confidence=} must be in (0, 1)")
  n = sizes.pop()
  idx = np.random.default_rng(seed).integers(0, n, (n_resamples, n))
  if vectorized:
    values = np.asarray(statistic(*(a[idx] for a in arrays)), np.float64)
  else:
    values = np.asarray([statistic(*(a[i] for a in arrays)) for i in idx], np.float64)
  alpha = (1 - confidence) / 2
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices: NaN, as documented
    low, high = np.nanquantile(values, [alpha, 1 - alpha], axis=0)
  return (float(low), float(high)) if low.ndim == 0 else (low, high)
