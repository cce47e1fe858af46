"""Geometry of contextual representations, per layer.

Ethayarajh (2019), "How Contextual are Contextualized Word Representations?":
anisotropy (mean cosine between random token pairs), self-similarity of a word
type across its contexts and intra-sentence similarity, each also adjusted by
the anisotropy baseline (raw - baseline) and computed again after mean-centring
each layer; the maximum explainable variance (MEV) of a word's occurrences under
the three definitions found in the paper and its released code (`mev`,
`max_explainable_variance`), and how steadily any of these changes with depth
(`depth_trend`). Kornblith et al. (2019): linear CKA between feature
matrices, between all layer pairs of one model, and between the same layers of
two models.

Representations are stacked as ``reps (layers, n_tokens, dim)``; tokens are
grouped by int (or hashable) ``word_ids`` and ``sentence_ids`` of shape
``(n_tokens,)``. Every function returns NumPy arrays of shape ``(layers,)``
unless stated.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import stats

_HI = jax.lax.Precision.HIGHEST
_EPS = 1e-12


def _check_reps(reps) -> jax.Array:
  reps = jnp.asarray(reps, jnp.float32)
  if reps.ndim != 3:
    raise ValueError(f"reps must be (layers, n_tokens, dim), got shape {reps.shape}")
  return reps


def _group_ids(ids, n: int, name: str) -> tuple[np.ndarray, int]:
  """Dense ``0..k-1`` ids for arbitrary labels ``(n,)``."""
  ids = np.asarray(ids)
  if ids.shape != (n,):
    raise ValueError(f"{name} shape {ids.shape} must be ({n},) to match reps")
  _, dense = np.unique(ids, return_inverse=True)
  dense = dense.reshape(-1)
  return dense, int(dense.max()) + 1 if n else 0


def center(reps) -> jax.Array:
  """Subtracts each layer's mean token vector: ``(layers, n, dim)``."""
  reps = _check_reps(reps)
  return reps - reps.mean(axis=1, keepdims=True)


def _unit(x: jax.Array) -> jax.Array:
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), _EPS)


def random_pairs(n: int, num_pairs: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """``num_pairs`` uniformly random index pairs ``(i, j)`` with ``i != j`` from ``range(n)``."""
  if n < 2:
    raise ValueError(f"{n=} must be >= 2 to draw pairs")
  if num_pairs < 1:
    raise ValueError(f"{num_pairs=} must be positive")
  rng = np.random.default_rng(seed)
  i = rng.integers(0, n, num_pairs)
  j = rng.integers(0, n - 1, num_pairs)
  return i, j + (j >= i)


@jax.jit
def _pair_cosine(reps, i, j):
  u = _unit(reps)
  return jnp.mean(jnp.sum(u[:, i] * u[:, j], -1), axis=1)  # (layers,)


@jax.jit
def _all_pairs_cosine(reps):
  u = _unit(reps)  # (layers, n, dim): all tokens as one group
  return anisotropy_of_groups(
    u.sum(1)[None], jnp.sum(u * u, -1).sum(1)[None], jnp.full((1,), u.shape[1], u.dtype)
  )


def anisotropy_of_groups(sums, squares, counts, weights=None):
  """The mean cosine over all pairs of distinct tokens, from per-group sums (`unit_sums`).

  With `weights` (how many times each group is taken, as a bootstrap resample of sentences
  takes them), the tokens of group g count `weights[g]` times and a token is never paired
  with its own copies: `(|sum_g w_g s_g|^2 - sum_g w_g^2 q_g) / (N (N - 1) - sum_g (w_g^2 -
  w_g) n_g)` with `N = sum_g w_g n_g`; all weights 1 is the plain all-pairs mean
  (`anisotropy(..., num_pairs=None)`).

  Args:
    sums: (groups, layers, dim) each group's sum of unit vectors.
    squares: (groups, layers) each group's sum of their squared norms.
    counts: (groups,) each group's tokens.
    weights: (..., groups) how many times each group counts; None: once.

  Returns:
    (..., layers).
  """
  w = jnp.ones(counts.shape, sums.dtype) if weights is None else jnp.asarray(weights, sums.dtype)
  total = jnp.einsum("...g,gld->...ld", w, sums)
  n = w @ counts
  pairs = n * (n - 1) - (w * w - w) @ counts
  own = jnp.einsum("...g,gl->...l", w * w, squares)  # each token with itself and its copies
  return (jnp.sum(total * total, -1) - own) / pairs[..., None]


def unit_sums(reps, groups) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Per group (e.g. sentence) of tokens: the sum of their unit vectors, of the unit vectors'
  squared norms, and the token count, for `anisotropy_of_groups`.

  Args:
    reps: (layers, n_tokens, dim).
    groups: (n_tokens,) a label per token.

  Returns:
    `(sums (groups, layers, dim), squares (groups, layers), counts (groups,))`, float32 (the
    precision the statistics are computed in), in the order of the sorted labels.
  """
  reps = _check_reps(reps)
  ids, k = _group_ids(groups, reps.shape[1], "groups")
  u = np.asarray(_unit(reps), np.float64)  # (layers, n, dim)
  sums = np.zeros((k, u.shape[0], u.shape[2]))
  np.add.at(sums, ids, u.transpose(1, 0, 2))
  squares = np.zeros((k, u.shape[0]))
  np.add.at(squares, ids, (u * u).sum(-1).T)
  counts = np.bincount(ids, minlength=k)
  return sums.astype(np.float32), squares.astype(np.float32), counts.astype(np.float32)


def anisotropy(
  reps,
  num_pairs: int | None = 1000,
  seed: int = 0,
  centered: bool = False,
) -> np.ndarray:
  """Mean cosine similarity between random pairs of distinct tokens, per layer.

  Args:
    reps: ``(layers, n_tokens, dim)``.
    num_pairs: random pairs (the same pairs for every layer); None averages over
      all ``n (n - 1)`` ordered pairs exactly.
    seed: NumPy seed for the pairs.
    centered: mean-centre each layer first.

  Returns:
    ``(layers,)``.
  """
  reps = center(reps) if centered else _check_reps(reps)
  if num_pairs is None:
    if reps.shape[1] < 2:
      raise ValueError(f"need >= 2 tokens, got {reps.shape[1]}")
    return np.asarray(_all_pairs_cosine(reps))
  i, j = random_pairs(reps.shape[1], num_pairs, seed)
  return np.asarray(_pair_cosine(reps, jnp.asarray(i), jnp.asarray(j)))


@functools.partial(jax.jit, static_argnames=("num_groups",))
def _self_sim(reps, ids, num_groups, keep):
  u = _unit(reps)  # (layers, n, dim)
  seg = jax.vmap(lambda x: jax.ops.segment_sum(x, ids, num_groups))(u)  # (layers, k, dim)
  sq = jax.vmap(lambda x: jax.ops.segment_sum(jnp.sum(x * x, -1), ids, num_groups))(u)
  k = jnp.bincount(ids, length=num_groups).astype(jnp.float32)  # (k,)
  pair_mean = (jnp.sum(seg * seg, -1) - sq) / jnp.maximum(k * (k - 1), 1.0)  # (layers, k)
  return jnp.sum(pair_mean * keep, -1) / jnp.maximum(keep.sum(), 1.0)


def self_similarity(
  reps, word_ids: Sequence[Any], min_count: int = 2, centered: bool = False
) -> np.ndarray:
  """Mean pairwise cosine between a word type's occurrences, averaged over types.

  Args:
    reps: ``(layers, n_tokens, dim)``.
    word_ids: the type of every token ``(n_tokens,)`` (ints or strings).
    min_count: only types with at least this many occurrences (>= 2) count.
    centered: mean-centre each layer first.

  Returns:
    ``(layers,)``; nan when no type occurs ``min_count`` times.
  """
  if min_count < 2:
    raise ValueError(f"{min_count=} must be >= 2 (a pair is needed)")
  reps = center(reps) if centered else _check_reps(reps)
  ids, k = _group_ids(word_ids, reps.shape[1], "word_ids")
  counts = np.bincount(ids, minlength=k)
  keep = counts >= min_count
  if not keep.any():
    return np.full(reps.shape[0], np.nan)
  return np.asarray(_self_sim(reps, jnp.asarray(ids), k, jnp.asarray(keep, jnp.float32)))


@functools.partial(jax.jit, static_argnames=("num_groups",))
def _intra(reps, ids, num_groups):
  counts = jnp.bincount(ids, length=num_groups).astype(jnp.float32)  # (k,)
  seg = jax.vmap(lambda x: jax.ops.segment_sum(x, ids, num_groups))(reps)
  mean = seg / counts[None, :, None]  # (layers, k, dim)
  cos = jnp.sum(_unit(reps) * _unit(mean)[:, ids], -1)  # (layers, n)
  per_sent = jax.vmap(lambda c: jax.ops.segment_sum(c, ids, num_groups))(cos) / counts
  return per_sent.mean(-1)


def intra_sentence_similarity(
  reps, sentence_ids: Sequence[Any], centered: bool = False
) -> np.ndarray:
  """Mean cosine between each token and its sentence's mean vector.

  Averaged over the tokens of a sentence, then over sentences.

  Args:
    reps: ``(layers, n_tokens, dim)``.
    sentence_ids: the sentence of every token ``(n_tokens,)``.
    centered: mean-centre each layer (over all tokens) first.

  Returns:
    ``(layers,)``.
  """
  reps = center(reps) if centered else _check_reps(reps)
  ids, k = _group_ids(sentence_ids, reps.shape[1], "sentence_ids")
  return np.asarray(_intra(reps, jnp.asarray(ids), k))


def contextuality(
  reps,
  word_ids: Sequence[Any],
  sentence_ids: Sequence[Any],
  num_pairs: int | None = 1000,
  seed: int = 0,
  min_count: int = 2,
) -> dict[str, np.ndarray]:
  """All of Ethayarajh's measures, raw, anisotropy-adjusted and after centring.

  Returns:
    A dict of ``(layers,)`` arrays: ``anisotropy``, ``self_similarity``,
    ``self_similarity_adjusted`` (raw - anisotropy), ``intra_sentence``,
    ``intra_sentence_adjusted``, and each of these again with a ``_centered``
    suffix, computed on mean-centred representations.
  """
  out = {}
  for suffix, c in (("", False), ("_centered", True)):
    base = anisotropy(reps, num_pairs, seed, centered=c)
    selfsim = self_similarity(reps, word_ids, min_count, centered=c)
    intra = intra_sentence_similarity(reps, sentence_ids, centered=c)
    out["anisotropy" + suffix] = base
    out["self_similarity" + suffix] = selfsim
    out["self_similarity_adjusted" + suffix] = selfsim - base
    out["intra_sentence" + suffix] = intra
    out["intra_sentence_adjusted" + suffix] = intra - base
  return out


def sentence_resamples(
  reps,
  word_ids: Sequence[Any],
  sentence_ids: Sequence[Any],
  *,
  measured=None,
  min_count: int = 5,
  resamples: int = 1000,
  seed: int = 0,
) -> dict[str, np.ndarray]:
  """Anisotropy and self-similarity per layer on bootstrap resamples of the sentences.

  Resample i takes the sentences `np.random.default_rng(seed).integers(0, S, (resamples,
  S))[i]` (the resamples `bertjax.stats.bootstrap_ci` draws), each token as many times as its
  sentence is drawn, and a token is never paired with its own copies:
  - `anisotropy`: the mean cosine over all pairs of distinct tokens (`anisotropy_of_groups`;
    the point estimate draws random pairs instead, which this replaces by their expectation);
  - `self_similarity`: per word type seen at least `min_count` times in all the sentences (of
    the `measured` tokens, as `ethayarajh_measures`), the mean cosine over pairs of its
    distinct drawn occurrences, averaged over the types drawn at least twice. Drawn once
    each, it is `self_similarity(reps, word_ids, min_count)` exactly.

  Args:
    reps: `(layers, n_tokens, dim)`.
    word_ids: `(n_tokens,)` each token's word type.
    sentence_ids: `(n_tokens,)` each token's sentence.
    measured: optional bool `(n_tokens,)`: the tokens whose types self-similarity counts.
    min_count: occurrences a type needs in all the sentences.
    resamples: how many resamples.
    seed: the resamples' seed.

  Returns:
    `{"anisotropy": (resamples, layers), "self_similarity": (resamples, layers)}`, float64.
  """
  reps = _check_reps(reps)
  n = reps.shape[1]
  sent, num_sent = _group_ids(sentence_ids, n, "sentence_ids")
  idx = np.random.default_rng(seed).integers(0, num_sent, (resamples, num_sent))
  weights = np.zeros((resamples, num_sent), np.float32)
  np.add.at(weights, (np.arange(resamples)[:, None], idx), 1)
  sums, squares, counts = unit_sums(reps, sent)
  aniso = np.asarray(anisotropy_of_groups(sums, squares, counts, weights), np.float64)
  keep = np.ones(n, bool) if measured is None else np.asarray(measured, bool)
  ids, k = _group_ids(word_ids, n, "word_ids")
  counted = np.bincount(ids[keep], minlength=k) >= min_count
  u = np.asarray(_unit(reps), np.float32)
  per_type = []
  for t in np.flatnonzero(counted):
    tokens = np.flatnonzero((ids == t) & keep)
    ut = u[:, tokens]  # (layers, k, dim)
    gram = np.matmul(ut, ut.transpose(0, 2, 1))  # (layers, k, k)
    c = weights[:, sent[tokens]]  # (resamples, k): how many times each occurrence is drawn
    pairs = (np.matmul(c[None], gram) * c[None]).sum(-1)  # (layers, resamples)
    own = (c * c) @ np.diagonal(gram, axis1=1, axis2=2).T  # (resamples, layers)
    drawn = c.sum(1) ** 2 - (c * c).sum(1)  # ordered pairs of distinct draws
    with np.errstate(invalid="ignore", divide="ignore"):
      per_type.append(np.where(drawn[:, None] > 0, (pairs.T - own) / drawn[:, None], np.nan))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)  # a resample with no type drawn twice
    selfsim = np.nanmean(np.stack(per_type), 0) if per_type else np.full(aniso.shape, np.nan)
  return {"anisotropy": aniso, "self_similarity": np.asarray(selfsim, np.float64)}


def depth_trend(values: Sequence[float]) -> float:
  """How steadily a per-layer measure changes with depth: the Spearman rank correlation
  between layer index and value, +1 if it rises at every step and -1 if it falls at every one.

  Ethayarajh's findings are trends of this kind ("more anisotropic in upper layers"); ranks
  rather than a fitted slope make it depend only on the order of the values, so measures of
  different scales (cosines, MEV) compare, and an outlying layer counts by its rank, not by
  how far out it lies.

  Args:
    values: ``(..., layers)`` one value per layer, shallowest first (pass ``values[1:]`` to
      leave out the embedding output); leading axes (resamples) are kept.

  Returns:
    A float in ``[-1, 1]`` (an array shaped as the leading axes); nan when the values are
    constant (no rank order).
  """
  values = np.asarray(values, np.float64)
  trend = stats.spearman_rows(np.arange(values.shape[-1]), values)
  return float(trend) if values.ndim == 1 else trend


def layer_statistics(values) -> dict[str, np.ndarray]:
  """How a per-layer measure changes with depth, the statistics a claim about its trend reads:
  `first`, `last`, `lowest`, `highest`, `rise` (last minus first), `fall` (first minus last),
  `trend` (`depth_trend`), `rising` and `falling` (the share of steps from one layer to the
  next that rise, that fall).

  Args:
    values: `(..., layers)`, shallowest first; leading axes (resamples) are kept.

  Returns:
    A dict of arrays shaped as the leading axes (floats for one curve).
  """
  v = np.asarray(values, np.float64)
  steps = np.diff(v, axis=-1)
  out = {
    "first": v[..., 0],
    "last": v[..., -1],
    "lowest": v.min(-1),
    "highest": v.max(-1),
    "rise": v[..., -1] - v[..., 0],
    "fall": v[..., 0] - v[..., -1],
    "trend": depth_trend(v),
    "rising": np.mean(steps > 0, -1),
    "falling": np.mean(steps < 0, -1),
  }
  return {k: float(x) if v.ndim == 1 else np.asarray(x) for k, x in out.items()}


# ----------------------------------------------------------------------------
# Maximum explainable variance (Ethayarajh 2019, Sec. 4.4)

MEV_DEFINITIONS = ("truncated_svd", "pca", "uncentred")
# Where each definition comes from (the anisotropy experiment records this with its results).
MEV_SOURCES = {
  "truncated_svd": "sklearn TruncatedSVD(n_components=100).explained_variance_ratio_[0] "
  "(kawine/contextual analyze.py, first commit 84d2f97: the code behind "
  "the released bert/variance_explained.csv)",
  "pca": "sklearn PCA(n_components=1).explained_variance_ratio_[0] (kawine/contextual "
  "analyze.py, commit c10c992)",
  "uncentred": "sigma_1^2 / sum_i sigma_i^2 of the raw occurrence matrix (the paper's "
  "Definition 3 as written)",
}
MEV_BASELINES = {  # what `ethayarajh_measures`' two MEV baselines are, in words
  "same_count": "per measured type, the MEV (same definition) of as many tokens drawn "
  "uniformly from all words; averaged over types",
  "paper": "one MEV of `paper_samples` words, one from each of as many random sentences "
  "(kawine/contextual explore_embedding_space)",
}
MEV_LABELS = {  # each definition in a few words, for a table or a figure
  "truncated_svd": "TruncatedSVD, the paper's released code",
  "pca": "centred PCA",
  "uncentred": "uncentred sigma_1^2 / sum sigma_i^2",
}


def mev(occurrences, definition: str = "truncated_svd") -> np.ndarray:
  """Maximum explainable variance of occurrence matrices: the first component's share.

  Ethayarajh (2019) asks how much of the variance of a word's contextual
  representations its first principal component (a static embedding) explains.
  The paper's Definition 3 writes it as ``sigma_1^2 / sum_i sigma_i^2`` of the
  occurrence matrix, but the numbers it reports come from its released code
  (github.com/kawine/contextual, ``analyze.py``, ``variance_explained_by_pc``),
  which changed between commits. The three readings:

  * ``"truncated_svd"`` (default): the first released commit (84d2f97, Dec 2019),
    ``TruncatedSVD(n_components=100).fit(X).explained_variance_ratio_[0]``, the
    code behind ``bert/variance_explained.csv``: the direction ``v`` is the top
    right singular vector of the *uncentred* ``X``, but the share is
    ``var(X v) / sum_j var(X[:, j])``, with variances about the mean. For
    anisotropic occurrences ``v`` is close to their mean direction, along which
    they vary little, so the values are small (0.00-0.09 for BERT in that file).
  * ``"pca"``: the later commit (c10c992, Apr 2020), ``PCA(n_components=1)``:
    the top eigenvalue of the covariance over its trace (``X`` mean-centred).
  * ``"uncentred"``: Definition 3 as written, ``sigma_1^2 / sum_i sigma_i^2`` of
    the raw ``X`` (the second moment about 0, not the variance); dominated by the
    mean direction, so large (0.7-0.9) for anisotropic representations.

  Computed exactly in float64 with a full SVD; sklearn's ``TruncatedSVD`` uses a
  randomised SVD (``random_state=None`` in the paper's code), which agrees to
  rounding on the first component.

  Args:
    occurrences: ``(..., n, dim)``, ``n >= 2`` representations of one word.
    definition: one of `MEV_DEFINITIONS`.

  Returns:
    ``(...,)`` float64 in ``[0, 1]``; nan where the occurrences have no variance
    (``"truncated_svd"``, ``"pca"``) or are all zero (``"uncentred"``).
  """
  if definition not in MEV_DEFINITIONS:
    raise ValueError(f"definition={definition!r} must be one of {MEV_DEFINITIONS}")
  x = np.asarray(occurrences, np.float64)
  if x.ndim < 2 or x.shape[-2] < 2:
    raise ValueError(f"occurrences must be (..., n >= 2, dim), got shape {x.shape}")
  if definition == "uncentred":
    s = np.linalg.svd(x, compute_uv=False)  # (..., min(n, dim))
    top, total = s[..., 0] ** 2, np.sum(s**2, -1)
  else:
    xc = x - x.mean(-2, keepdims=True)
    total = np.sum(xc**2, (-2, -1))  # n * sum_j var(X[:, j])
    if definition == "pca":
      top = np.linalg.svd(xc, compute_uv=False)[..., 0] ** 2  # n * top covariance eigenvalue
    else:
      v = np.linalg.svd(x, full_matrices=False)[2][..., 0, :]  # (..., dim) uncentred direction
      top = np.sum(np.einsum("...nd,...d->...n", xc, v) ** 2, -1)  # n * var(X v)
  with np.errstate(divide="ignore", invalid="ignore"):
    return np.where(total > 0, top / np.where(total > 0, total, 1.0), np.nan)


def max_explainable_variance(
  reps,
  word_ids: Sequence[Any],
  min_count: int = 5,
  max_occurrences: int | None = None,
  seed: int = 0,
  definition: str = "truncated_svd",
  measured=None,
) -> dict[str, Any]:
  """Per-layer MEV averaged over word types, and its random-token (anisotropy) baseline.

  Follows Ethayarajh (2019) and ``variance_explained_by_pc`` in
  github.com/kawine/contextual: every type seen at least ``min_count`` times
  (the paper: 5), all its occurrences (unless ``max_occurrences``), the MEV of
  each type averaged over types, then ``adjusted = mev - baseline``. Where
  bertjax differs: the baseline here is, for every measured type, the MEV (same
  ``definition``) of as many tokens drawn uniformly at random from all tokens,
  averaged the same way, so baseline and measurement share their sample sizes
  (MEV of ``n`` random vectors grows as ``n`` shrinks: it is at least ``1 /
  (n - 1)`` for ``"pca"``); the paper's baseline (``explore_embedding_space``) is
  one MEV of 1,000 random words, one from each of 1,000 random sentences.

  Args:
    reps: ``(layers, n_tokens, dim)``.
    word_ids: ``(n_tokens,)`` the type of every token.
    min_count: types with fewer occurrences are skipped (>= 2).
    max_occurrences: at most this many occurrences per type (a seeded sample),
      to bound cost; None uses all, as the paper.
    seed: NumPy seed of the samples; the same seed draws the same samples for
      every ``definition``.
    definition: ``"truncated_svd"`` (the paper's released numbers), ``"pca"``
      or ``"uncentred"``; see `mev`.
    measured: optional bool ``(n_tokens,)``: only these tokens' types are
      measured (e.g. the paper leaves punctuation out); the baseline still draws
      from every token.

  Returns:
    ``{"mev", "baseline", "adjusted"}``: ``(layers,)`` float64 each (nan-aware
    means over types); ``"types"``: how many types; ``"occurrences"``: their
    total occurrences used; ``"definition"``; ``"per_type"``: ``{"mev", "baseline"}``,
    ``(types, layers)`` each (the items of an interval over the types; absent when no
    type is measured).
  """
  reps = np.asarray(reps)
  if reps.ndim != 3:
    raise ValueError(f"reps must be (layers, n_tokens, dim), got shape {reps.shape}")
  if min_count < 2:
    raise ValueError(f"{min_count=} must be >= 2")
  if max_occurrences is not None and max_occurrences < min_count:
    raise ValueError(f"{max_occurrences=} must be None or >= {min_count=}")
  if definition not in MEV_DEFINITIONS:
    raise ValueError(f"definition={definition!r} must be one of {MEV_DEFINITIONS}")
  n = reps.shape[1]
  rng = np.random.default_rng(seed)
  values, baseline, used = [], [], 0
  for members in _measured_types(word_ids, measured, n, min_count):
    if max_occurrences is not None and len(members) > max_occurrences:
      members = rng.choice(members, max_occurrences, replace=False)
    random_tokens = rng.choice(n, len(members), replace=False)
    values.append(mev(reps[:, np.sort(members)], definition))
    baseline.append(mev(reps[:, np.sort(random_tokens)], definition))
    used += len(members)
  if not values:
    nan = np.full(reps.shape[0], np.nan)
    return {
      "mev": nan,
      "baseline": nan,
      "adjusted": nan,
      "types": 0,
      "occurrences": 0,
      "definition": definition,
    }
  m, b = np.nanmean(values, 0), np.nanmean(baseline, 0)
  return {
    "mev": m,
    "baseline": b,
    "adjusted": m - b,
    "types": len(values),
    "occurrences": used,
    "definition": definition,
    "per_type": {"mev": np.asarray(values), "baseline": np.asarray(baseline)},
  }


def _measured_types(word_ids, measured, n: int, min_count: int) -> list[np.ndarray]:
  """The token indices of each measured type seen at least `min_count` times, in type order."""
  ids, k = _group_ids(word_ids, n, "word_ids")
  keep = np.ones(n, bool) if measured is None else np.asarray(measured, bool)
  if keep.shape != (n,):
    raise ValueError(f"measured shape {keep.shape} must be ({n},) to match reps")
  ids = np.where(keep, ids, k)  # unmeasured tokens: one extra group, never reported
  counts = np.bincount(ids, minlength=k + 1)[:k]
  order = np.argsort(ids, kind="stable")
  starts = np.concatenate([[0], np.cumsum(np.bincount(ids, minlength=k + 1))])
  return [order[starts[t] : starts[t + 1]] for t in np.flatnonzero(counts >= min_count)]


def random_words_mev(
  reps,
  sentence_ids: Sequence[Any],
  num_samples: int = 1000,
  seed: int = 0,
  definition: str = "truncated_svd",
) -> np.ndarray:
  """Ethayarajh's own MEV baseline: the MEV of one random word from each of random sentences.

  As ``explore_embedding_space`` in github.com/kawine/contextual (``analyze.py``):
  ``num_samples`` distinct sentences drawn uniformly, one word drawn uniformly from
  each, and one MEV (``definition``, see `mev`) of those words per layer. Sampling
  across sentences keeps shared context out of the baseline. Compare with
  `max_explainable_variance`'s baseline, which matches each type's sample size.

  Args:
    reps: ``(layers, n_tokens, dim)``.
    sentence_ids: ``(n_tokens,)`` the sentence of every token.
    num_samples: sentences (and words) drawn; at most the number of sentences.
    seed: NumPy seed of the draws (the same words for every ``definition``).
    definition: one of `MEV_DEFINITIONS`.

  Returns:
    ``(layers,)`` float64.
  """
  reps = np.asarray(reps)
  if reps.ndim != 3:
    raise ValueError(f"reps must be (layers, n_tokens, dim), got shape {reps.shape}")
  ids, k = _group_ids(sentence_ids, reps.shape[1], "sentence_ids")
  if not 2 <= num_samples <= k:
    raise ValueError(f"{num_samples=} must be in [2, {k}] (the number of sentences)")
  rng = np.random.default_rng(seed)
  order = np.argsort(ids, kind="stable")
  starts = np.concatenate([[0], np.cumsum(np.bincount(ids, minlength=k))])
  chosen = rng.choice(k, num_samples, replace=False)
  words = [order[starts[s] + rng.integers(starts[s + 1] - starts[s])] for s in chosen]
  return mev(reps[:, np.asarray(words)], definition)


def ethayarajh_measures(
  reps,
  word_ids: Sequence[Any],
  sentence_ids: Sequence[Any],
  *,
  measured=None,
  num_pairs: int | None = 20000,
  min_count: int = 5,
  max_occurrences: int | None = None,
  paper_samples: int = 1000,
  seed: int = 0,
) -> tuple[dict[str, np.ndarray], dict[str, dict]]:
  """Every measure of Ethayarajh (2019) by layer: `contextuality` and the MEV of each of
  `MEV_DEFINITIONS`, each with both baselines.

  Args:
    reps: `(layers, n_tokens, dim)` word representations.
    word_ids: `(n_tokens,)` each token's word type.
    sentence_ids: `(n_tokens,)` each token's sentence.
    measured: optional bool `(n_tokens,)`: only these tokens' types count for
      self-similarity and MEV (the paper leaves punctuation out); random pairs, sentences and
      baselines still draw from every token.
    num_pairs: random token pairs of the anisotropy baseline.
    min_count: occurrences a word type needs.
    max_occurrences: at most this many occurrences per type for MEV (None: all).
    paper_samples: sentences of the paper's random-words MEV baseline (at most the number of
      sentences are drawn).
    seed: the seed of every sample; every MEV definition sees the same samples.

  Returns:
    `(per_layer, mev)`: per_layer maps a name to a `(layers,)` float64 array: the
    `contextuality` measures, and for each definition `d`: `mev_d`, `mev_d_baseline`,
    `mev_d_adjusted` (`max_explainable_variance`'s same-count baseline) and
    `mev_d_baseline_paper`, `mev_d_adjusted_paper` (`random_words_mev`); `mev` maps each
    definition to its `max_explainable_variance` result (types and occurrences counted).
  """
  n = np.shape(reps)[1]
  keep = np.ones(n, bool) if measured is None else np.asarray(measured, bool)
  if keep.shape != (n,):
    raise ValueError(f"measured shape {keep.shape} must be ({n},) to match reps")
  ids, k = _group_ids(word_ids, n, "word_ids")
  # Unmeasured tokens get a type of their own (seen once), so no self-similarity counts them.
  self_types = np.where(keep, ids, k + np.arange(n))
  out = contextuality(reps, self_types, sentence_ids, num_pairs, seed, min_count)
  out = {k: np.asarray(v, np.float64) for k, v in out.items()}
  sentences = len(np.unique(np.asarray(sentence_ids)))
  mevs = {}
  for d in MEV_DEFINITIONS:
    mevs[d] = max_explainable_variance(reps, word_ids, min_count, max_occurrences, seed, d, keep)
    for key, suffix in (("mev", ""), ("baseline", "_baseline"), ("adjusted", "_adjusted")):
      out[f"mev_{d}{suffix}"] = np.asarray(mevs[d][key], np.float64)
    paper = random_words_mev(reps, sentence_ids, min(paper_samples, sentences), seed, d)
    out[f"mev_{d}_baseline_paper"] = paper
    out[f"mev_{d}_adjusted_paper"] = out[f"mev_{d}"] - paper
  return out, mevs
