"""Every statistic the analyses share, once: mean pooling, ranks, Pearson (from arrays or from
running sums) and Spearman, linear CKA, the exact McNemar and Wilcoxon signed-rank tests, and
the bootstrap confidence interval every verdict's uncertainty comes from.

One definition each, so that every report, experiment and metric computes them alike:
`mean_pool` works on NumPy and JAX arrays (and under `jit`); the correlations are NumPy
in float64 and give NaN where they are undefined (a constant side has no order);
`bootstrap_ci` is the seeded percentile bootstrap (as `scipy.stats.bootstrap(...,
method="percentile")`, which draws the same resamples from the same seed).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

_HI = jax.lax.Precision.HIGHEST


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


def pearson_from_sums(sx, sy, sxx, syy, sxy, n):
  """Pearson correlation from running sums over n pairs (sum x, sum y, sum x^2, sum y^2,
  sum xy), elementwise over arrays of sums: what a streamed statistic keeps instead of the
  pairs. 0 where either side is constant (its variance underflows)."""
  cov = sxy / n - sx * sy / n**2
  var = (sxx / n - (sx / n) ** 2) * (syy / n - (sy / n) ** 2)
  return cov / np.sqrt(np.maximum(var, 1e-300))


def mcnemar_p(base_correct, other_correct) -> float:
  """Two-sided exact McNemar p-value of paired per-example correctness (bool arrays (n,)):
  the binomial test of the discordant pairs at 1/2, as `scipy.stats.binomtest(lost,
  lost + gained, 0.5).pvalue`, in exact integer arithmetic.

  Raises:
    ValueError: the arrays differ in shape.
  """
  a, b = np.asarray(base_correct, bool), np.asarray(other_correct, bool)
  if a.shape != b.shape:
    raise ValueError(f"base_correct shape {a.shape} != other_correct shape {b.shape}")
  lost, gained = int((a & ~b).sum()), int((~a & b).sum())
  n, k = lost + gained, min(lost, gained)
  if n == 0:
    return 1.0
  return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)


def mcnemar_min_detectable_drop(n: int, alpha: float) -> float:
  """The smallest accuracy drop an exact two-sided McNemar test on `n` examples can call
  significant at `alpha` (every discordant pair against the ablated model: p = 2 / 2^b)."""
  b = 1
  while 2 * 0.5**b >= alpha:
    b += 1
  return b / n


def curve_area(fractions, values) -> float:
  """The trapezoid area under a curve `values` over `fractions`, divided by their range: the
  curve's mean height (Michel et al.'s pruning curves compared by one number)."""
  x, y = np.asarray(fractions, np.float64), np.asarray(values, np.float64)
  return float(np.sum((y[1:] + y[:-1]) / 2 * np.diff(x)) / (x[-1] - x[0]))


def wilcoxon_p(base, other) -> float:
  """Two-sided Wilcoxon signed-rank p-value of paired values (n,) (`scipy.stats.wilcoxon` of
  their differences; needs scipy); 1.0 when every difference is below 1e-12."""
  from scipy.stats import wilcoxon

  d = np.asarray(other, np.float64) - np.asarray(base, np.float64)
  if not np.any(np.abs(d) > 1e-12):
    return 1.0
  return float(wilcoxon(d).pvalue)


def expected_layer(scores) -> float | np.ndarray:
  """Tenney et al.'s expected layer of a task, from per-layer probe scores.

  Tenney et al. use the score differences Δ_l = s_l - s_{l-1} of cumulative (scalar-mixed)
  probes, which cannot get worse with depth, and report E[l] = Σ_l l Δ_l / Σ_l Δ_l. We fit
  one probe per layer, make the scores cumulative the same way: s*_l = max_{k<=l}
  s_k (the best layer so far), Δ_l = s*_l - s*_{l-1} >= 0 for l = 1..L.

  Args:
    scores: (layers,) scores, layer 0 first (the embeddings); or (..., layers), layers last
      (a bootstrap's resamples), for one E[l] each.

  Returns:
    E[l] in [1, L] (a float, or an array of the leading shape); nan when no layer improves on
    layer 0.
  """
  s = np.asarray(scores, np.float64)
  if s.ndim < 1 or s.shape[-1] < 2:
    raise ValueError(f"scores must hold >= 2 layers on their last axis, got shape {s.shape}")
  delta = np.diff(np.maximum.accumulate(s, axis=-1), axis=-1)  # (..., L) for layers 1..L
  total = delta.sum(-1)
  weighted = np.sum(np.arange(1, s.shape[-1]) * delta, -1)
  with np.errstate(divide="ignore", invalid="ignore"):
    e = np.where(total > 0, weighted / np.where(total > 0, total, 1.0), np.nan)
  return float(e) if s.ndim == 1 else e


def power_law_fit(sizes, values) -> dict[str, float]:
  """The least-squares line through (log size, log value), as `scipy.stats.linregress` fits it:
  `values ~ coefficient * sizes ** exponent`, with the fit's R^2 in log space (1.0 for two
  points).

  Raises:
    ValueError: fewer than two points, or a size or value that is not positive.
  """
  n, v = np.asarray(sizes, np.float64), np.asarray(values, np.float64)
  if n.shape != v.shape or n.ndim != 1 or n.size < 2:
    raise ValueError(f"sizes {n.shape} and values {v.shape} must be two equal vectors of >= 2")
  if (n <= 0).any() or (v <= 0).any():
    raise ValueError("sizes and values must be positive for a fit in log space")
  x, y = np.log(n), np.log(v)
  b, a = np.polyfit(x, y, 1)
  resid = y - (a + b * x)
  r2 = 1 - float(resid @ resid) / float(((y - y.mean()) ** 2).sum()) if len(x) > 2 else 1.0
  return {"exponent": float(b), "coefficient": float(np.exp(a)), "r2": r2}


def trailing_mean(values: Sequence[float], window: int) -> np.ndarray:
  """Mean of the last `window` values at each step (fewer at the start): causal smoothing."""
  if window < 1:
    raise ValueError(f"{window=} must be >= 1")
  x = np.asarray(values, np.float64)
  c = np.concatenate([[0.0], np.cumsum(x)])
  i = np.arange(1, x.shape[0] + 1)
  lo = np.maximum(i - window, 0)
  return (c[i] - c[lo]) / (i - lo)


_GATHERED = 1 << 25  # values a vectorized bootstrap gathers at once (256 MiB of float64)


def bootstrap_ci(
  data,
  statistic,
  *,
  n_resamples: int = 2000,
  confidence: float = 0.95,
  seed: int = 0,
  vectorized: bool = False,
):
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
      gets the arrays with a leading resample axis, `(R, n, ...)`, and returns `(R, ...)`:
      R is `n_resamples`, or fewer at a time where the resamples would hold over 2^25 values
      (the same resamples, evaluated in chunks).
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
    raise ValueError(
      f"data must be one or more arrays with the same (>= 1) items on their "
      f"first axis; got shapes {[a.shape for a in arrays]}"
    )
  if not (isinstance(n_resamples, int) and n_resamples >= 1):
    raise ValueError(f"{n_resamples=} must be an int >= 1")
  if not 0 < confidence < 1:
    raise ValueError(f"{confidence=} must be in (0, 1)")
  n = sizes.pop()
  idx = np.random.default_rng(seed).integers(0, n, (n_resamples, n))
  if vectorized:  # in chunks of resamples that gather at most _GATHERED values at once
    step = max(1, _GATHERED // max(1, n * sum(a[0].size for a in arrays)))
    values = np.concatenate(
      [
        np.asarray(statistic(*(a[idx[i : i + step]] for a in arrays)), np.float64)
        for i in range(0, n_resamples, step)
      ]
    )
  else:
    values = np.asarray([statistic(*(a[i] for a in arrays)) for i in idx], np.float64)
  alpha = (1 - confidence) / 2
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices: NaN, as documented
    low, high = np.nanquantile(values, [alpha, 1 - alpha], axis=0)
  return (float(low), float(high)) if low.ndim == 0 else (low, high)


def _layer_reps(reps) -> jax.Array:
  reps = jnp.asarray(reps, jnp.float32)
  if reps.ndim != 3:
    raise ValueError(f"reps must be (layers, n_tokens, dim), got shape {reps.shape}")
  return reps


# Linear CKA (Kornblith et al. 2019) -------------------------------------------------------


def _center_cols(x: jax.Array) -> jax.Array:
  return x - x.mean(axis=-2, keepdims=True)


def _hsic(x: jax.Array, y: jax.Array) -> jax.Array:
  """``||x^T y||_F^2`` for centred ``(n, dx)``, ``(n, dy)``; the cheaper of two forms."""
  n, dx, dy = x.shape[0], x.shape[1], y.shape[1]
  if n < dx * dy / (dx + dy):  # Gram form: O(n^2 (dx + dy)) vs feature form O(n dx dy)
    kx = jnp.matmul(x, x.T, precision=_HI)
    ky = jnp.matmul(y, y.T, precision=_HI)
    return jnp.sum(kx * ky)
  c = jnp.matmul(x.T, y, precision=_HI)  # (dx, dy)
  return jnp.sum(c * c)


@jax.jit
def _cka(x, y):
  x, y = _center_cols(x), _center_cols(y)
  return _hsic(x, y) / jnp.sqrt(_hsic(x, x) * _hsic(y, y))


def linear_cka(x, y) -> float:
  """Linear CKA between ``x (n, dx)`` and ``y (n, dy)`` (same n examples, any widths).

  ``CKA = ||Yc^T Xc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F)`` with column-centred
  ``Xc, Yc``; invariant to orthogonal transforms and isotropic scaling.
  """
  x, y = jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)
  if x.ndim != 2 or y.ndim != 2 or x.shape[0] != y.shape[0]:
    raise ValueError(f"x shape {x.shape} and y shape {y.shape} must be (n, dx) and (n, dy)")
  if x.shape[0] < 2:
    raise ValueError(f"need >= 2 examples, got {x.shape[0]}")
  return float(_cka(x, y))


@jax.jit
def _cka_matrix(a, b):
  a, b = _center_cols(a), _center_cols(b)
  self_a = jax.vmap(lambda x: jnp.sqrt(_hsic(x, x)))(a)  # (la,)
  self_b = jax.vmap(lambda y: jnp.sqrt(_hsic(y, y)))(b)  # (lb,)
  # lax.map over a's layers keeps one row of cross products in memory at a time
  cross = jax.lax.map(lambda x: jax.vmap(lambda y: _hsic(x, y))(b), a)  # (la, lb)
  return cross / (self_a[:, None] * self_b[None, :])


def cka_matrix(reps_a, reps_b=None) -> np.ndarray:
  """Linear CKA between every pair of layers.

  Args:
    reps_a: ``(layers_a, n, dim_a)``.
    reps_b: ``(layers_b, n, dim_b)`` of another model on the same n tokens, or
      None for ``reps_a`` against itself.

  Returns:
    ``(layers_a, layers_b)``.
  """
  a = _layer_reps(reps_a)
  b = a if reps_b is None else _layer_reps(reps_b)
  if a.shape[1] != b.shape[1]:
    raise ValueError(f"reps_a shape {a.shape} and reps_b shape {b.shape} must share n_tokens")
  return np.asarray(_cka_matrix(a, b))


def cka_same_layers(reps_a, reps_b) -> np.ndarray:
  """Linear CKA between layer l of one model and layer l of another: ``(layers,)``."""
  a, b = _layer_reps(reps_a), _layer_reps(reps_b)
  if a.shape[:2] != b.shape[:2]:
    raise ValueError(
      f"reps_a shape {a.shape} and reps_b shape {b.shape} must share (layers, n_tokens)"
    )
  return np.asarray(_cka_same_layers(a, b))


_cka_same_layers = jax.jit(jax.vmap(_cka))
