"""Structural probes (Hewitt & Manning 2019), all layers at once.

A distance probe learns ``B (rank, dim)`` so that ``||B (h_i - h_j)||^2`` matches the
parse-tree path distance between words i and j; a depth probe learns ``B`` so that
``||B h_i||^2`` matches the depth of word i. Losses are the paper's L1 losses,
normalised by sentence length (squared for distances) and averaged over
sentences. Training reuses ``probing.fit_layerwise``: one jitted program, vmapped
over layers, early stopping on held-out loss.

Sentences are padded to the longest one in a batch; ``mask`` marks real words.
Evaluation (NumPy, per layer): UUAS of the minimum spanning tree of predicted
distances, distance Spearman (DSpr.), root accuracy and depth Spearman (NSpr.),
the Spearman metrics averaged within each sentence length 5-50 then over lengths.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.analysis.representations import probing
from bertjax.stats import spearman, spearman_rows
from bertjax.utils import flat_kwargs

PUNCT_UPOS = frozenset({"PUNCT"})


# ----------------------------------------------------------------------------
# Trees (NumPy)


def _check_heads(heads) -> np.ndarray:
  heads = np.asarray(heads, np.int64)
  n = len(heads)
  if heads.ndim != 1 or n == 0:
    raise ValueError(f"heads must be a non-empty 1-d array, got shape {heads.shape}")
  if heads.min() < 0 or heads.max() > n:
    raise ValueError(f"heads {heads.tolist()} must be in [0, {n}] (1-based, 0 = root)")
  if (heads == np.arange(1, n + 1)).any():
    raise ValueError(f"heads {heads.tolist()} has a word that heads itself")
  return heads


def tree_depths(heads) -> np.ndarray:
  """Depth of every word (root = 0) from 1-based heads ``(n,)``; raises on cycles."""
  heads = _check_heads(heads)
  n = len(heads)
  depth = np.full(n, -1, np.int64)
  for start in range(n):
    path, w = [], start
    while depth[w] < 0:
      if len(path) > n:
        raise ValueError(f"heads {heads.tolist()} contain a cycle through word {start + 1}")
      path.append(w)
      if heads[w] == 0:
        depth[w] = 0
        path.pop()
        break
      w = heads[w] - 1
    base = depth[w]
    for k, node in enumerate(reversed(path), start=1):
      depth[node] = base + k
  return depth


def tree_distances(heads) -> np.ndarray:
  """Path lengths between all word pairs of a dependency tree: int ``(n, n)``.

  Args:
    heads: 1-based head of each word, 0 for the root, ``(n,)``.
  """
  heads = _check_heads(heads)
  n = len(heads)
  depth = tree_depths(heads)
  # ancestors[i, j] = True iff j is on the path from i to the root (inclusive)
  anc = np.eye(n, dtype=bool)
  for i in range(n):
    w = i
    while heads[w] != 0:
      w = heads[w] - 1
      anc[i, w] = True
  # depth of the lowest common ancestor: deepest shared ancestor
  shared = anc[:, None, :] & anc[None, :, :]  # (n, n, n)
  lca_depth = np.max(np.where(shared, depth[None, None, :], -1), axis=-1)
  return depth[:, None] + depth[None, :] - 2 * lca_depth


# ----------------------------------------------------------------------------
# Padded batches


@dataclasses.dataclass
class StructuralBatch:
  """Sentences padded to the longest one.

  Attributes:
    features: ``(layers, sentences, max_len, dim)`` float32, zeros past each length.
    distances: gold tree distances ``(sentences, max_len, max_len)``.
    depths: gold depths ``(sentences, max_len)``.
    mask: real words ``(sentences, max_len)`` bool.
    lengths: ``(sentences,)``.
    heads: the 1-based head arrays, one per sentence.
  """

  features: jax.Array
  distances: np.ndarray
  depths: np.ndarray
  mask: np.ndarray
  lengths: np.ndarray
  heads: list[np.ndarray]

  def targets(self) -> dict[str, jax.Array]:
    """The gold distances, depths and word mask as the probes' float32 (mask: bool) targets."""
    return {
      "dist": jnp.asarray(self.distances, jnp.float32),
      "depth": jnp.asarray(self.depths, jnp.float32),
      "mask": jnp.asarray(self.mask),
    }


def pad_sentences(features: Sequence[Any], heads: Sequence[Any]) -> StructuralBatch:
  """Pads per-sentence features and builds gold distances and depths.

  Args:
    features: per sentence, ``(layers, n_i, dim)`` word features.
    heads: per sentence, 1-based heads ``(n_i,)``.

  Returns:
    A ``StructuralBatch``.
  """
  if len(features) != len(heads) or not features:
    raise ValueError(f"need equally many features and heads, got {len(features)} and {len(heads)}")
  feats = [np.asarray(f, np.float32) for f in features]
  heads = [_check_heads(h) for h in heads]
  layers, _, dim = feats[0].shape
  for i, (f, h) in enumerate(zip(feats, heads)):
    if f.ndim != 3 or f.shape[0] != layers or f.shape[2] != dim or f.shape[1] != len(h):
      raise ValueError(f"features[{i}] shape {f.shape} must be ({layers}, {len(h)}, {dim})")
  lengths = np.asarray([len(h) for h in heads])
  s, t = len(heads), int(lengths.max())
  out = np.zeros((layers, s, t, dim), np.float32)
  dist = np.zeros((s, t, t), np.float32)
  depth = np.zeros((s, t), np.float32)
  mask = np.zeros((s, t), bool)
  for i, (f, h) in enumerate(zip(feats, heads)):
    n = len(h)
    out[:, i, :n] = f
    dist[i, :n, :n] = tree_distances(h)
    depth[i, :n] = tree_depths(h)
    mask[i, :n] = True
  return StructuralBatch(jnp.asarray(out), dist, depth, mask, lengths, heads)


# ----------------------------------------------------------------------------
# Probes


def _pairwise_sq(proj: jax.Array) -> jax.Array:
  """Squared distances between projected words: ``(s, t, r)`` -> ``(s, t, t)``."""
  sq = jnp.sum(proj * proj, -1)
  return jnp.maximum(sq[:, :, None] + sq[:, None, :] - 2 * proj @ jnp.swapaxes(proj, 1, 2), 0.0)


@dataclasses.dataclass(frozen=True)
class _StructuralModel:
  """One layer's distance or depth probe for ``probing.fit_layerwise``."""

  kind: str
  rank: int

  def init(self, key, x, t):
    dim = x.shape[-1]
    bound = 1.0 / math.sqrt(dim)
    return {"B": jax.random.uniform(key, (self.rank, dim), minval=-bound, maxval=bound)}

  def predict(self, params, x):
    proj = x @ params["B"].T  # (s, t, rank)
    if self.kind == "distance":
      return _pairwise_sq(proj)  # (s, t, t)
    return jnp.sum(proj * proj, -1)  # (s, t)

  def loss(self, params, x, t):
    pred, m = self.predict(params, x), t["mask"].astype(jnp.float32)
    n = jnp.maximum(m.sum(-1), 1.0)  # (s,)
    if self.kind == "distance":
      pair = m[:, :, None] * m[:, None, :]
      per_sent = jnp.sum(jnp.abs(pred - t["dist"]) * pair, (1, 2)) / n**2
    else:
      per_sent = jnp.sum(jnp.abs(pred - t["depth"]) * m, 1) / n
    return jnp.mean(per_sent)

  def score(self, params, x, t):
    return -self.loss(params, x, t)


@flat_kwargs("fit")
@dataclasses.dataclass(frozen=True)
class StructuralConfig:
  """Structural-probe settings.

  ``probing.FitConfig``'s fields may also be given flat:
  ``StructuralConfig(rank=32, max_steps=200)``.

  Attributes:
    rank: rows of ``B`` (the probe's target dimension).
    fit: how the probe is fitted (``batch_size`` counts sentences; None: full batch).
  """

  rank: int = 64
  fit: probing.FitConfig = probing.FitConfig(  # noqa: RUF009 (frozen)
    learning_rate=1e-3, max_steps=2000, eval_every=100
  )

  def __post_init__(self):
    if self.rank < 1:
      raise ValueError(f"{self.rank=} must be positive")


@dataclasses.dataclass
class StructuralProbe:
  """A fitted distance or depth probe for every layer.

  Attributes:
    kind: ``"distance"`` or ``"depth"``.
    B: ``(layers, rank, dim)``.
    fit_info: the ``probing.LayerwiseFit`` (best_score = minus held-out loss).
  """

  kind: str
  B: jax.Array
  fit_info: probing.LayerwiseFit | None = None

  def predict(self, features) -> np.ndarray:
    """``(layers, s, t, dim)`` -> distances ``(layers, s, t, t)`` or depths ``(layers, s, t)``."""
    features = jnp.asarray(features, jnp.float32)
    if (
      features.ndim != 4
      or features.shape[0] != self.B.shape[0]
      or features.shape[-1] != self.B.shape[-1]
    ):
      raise ValueError(
        f"features shape {features.shape} must be ({self.B.shape[0]}, "
        f"sentences, max_len, {self.B.shape[-1]})"
      )
    return np.asarray(_predict(self.kind, self.B, features))


@functools.partial(jax.jit, static_argnames=("kind",))
def _predict(kind, B, features):
  model = _StructuralModel(kind, B.shape[1])
  return jax.vmap(lambda b, x: model.predict({"B": b}, x))(B, features)


def fit_structural_probe(
  kind: str,
  train: StructuralBatch,
  val: StructuralBatch | None = None,
  config: StructuralConfig = StructuralConfig(),
) -> StructuralProbe:
  """Trains a distance or depth probe for every layer at once.

  Args:
    kind: ``"distance"`` or ``"depth"``.
    train: padded training sentences.
    val: padded held-out sentences for early stopping (best held-out loss per
      layer is kept), or None to keep the last parameters.
    config: rank and optimisation settings.

  Returns:
    A ``StructuralProbe`` with ``B`` of shape ``(layers, rank, dim)``.
  """
  if kind not in ("distance", "depth"):
    raise ValueError(f"{kind=} must be 'distance' or 'depth'")
  model = _StructuralModel(kind, config.rank)
  if val is not None and val.features.shape[::3] != train.features.shape[::3]:
    raise ValueError(
      f"val features shape {val.features.shape} does not match train "
      f"{train.features.shape} in layers and dim"
    )
  fit = probing.fit_layerwise(
    model,
    train.features,
    train.targets(),
    None if val is None else val.features,
    None if val is None else val.targets(),
    config.fit,
  )
  return StructuralProbe(kind, fit.params["B"], fit)


# ----------------------------------------------------------------------------
# Evaluation (NumPy, one layer's predictions at a time)


def minimum_spanning_tree(dist: np.ndarray) -> list[tuple[int, int]]:
  """Prim's algorithm on a dense symmetric ``(n, n)`` matrix; edges as sorted pairs."""
  dist = np.asarray(dist, np.float64)
  n = dist.shape[0]
  if n <= 1:
    return []
  in_tree = np.zeros(n, bool)
  in_tree[0] = True
  best, parent = dist[0].copy(), np.zeros(n, np.int64)
  edges = []
  for _ in range(n - 1):
    cand = np.where(in_tree, np.inf, best)
    j = int(np.argmin(cand))
    edges.append((min(j, int(parent[j])), max(j, int(parent[j]))))
    in_tree[j] = True
    closer = dist[j] < best
    best = np.where(closer, dist[j], best)
    parent = np.where(closer, j, parent)
  return edges


def _keep(length: int, punct: np.ndarray | None) -> np.ndarray:
  if punct is None:
    return np.arange(length)
  punct = np.asarray(punct, bool)[:length]
  return np.flatnonzero(~punct)


def uuas(pred_distances, heads: Sequence[Any], punct: Sequence[Any] | None = None) -> float:
  """Undirected unlabelled attachment score of the predicted-distance MST.

  As in Hewitt & Manning: the gold edges are the MST of the gold tree distances
  over the same words (the tree itself when nothing is excluded); the score is
  correct edges / gold edges summed over the corpus.

  Args:
    pred_distances: ``(sentences, max_len, max_len)`` (padding ignored).
    heads: per sentence, 1-based heads.
    punct: optional per-sentence bool masks; True words are left out of both trees.

  Returns:
    UUAS in [0, 1] (nan when there are no gold edges).
  """
  pred_distances = np.asarray(pred_distances)
  counts = [
    _uuas_counts(pred_distances[i], h, None if punct is None else punct[i])
    for i, h in enumerate(heads)
  ]
  correct, total = (sum(c) for c in zip(*counts)) if counts else (0, 0)
  return correct / total if total else float("nan")


def _uuas_counts(pred: np.ndarray, heads, punct) -> tuple[int, int]:
  """One sentence's (correct, gold) MST edges of `uuas`; (0, 0) with fewer than 2 words kept."""
  h = np.asarray(heads)
  keep = _keep(len(h), punct)
  if len(keep) < 2:
    return 0, 0
  gold_edges = set(minimum_spanning_tree(tree_distances(h)[np.ix_(keep, keep)]))
  return len(gold_edges & set(minimum_spanning_tree(pred[np.ix_(keep, keep)]))), len(gold_edges)


def _length_average(per_length: dict[int, list[float]], min_len: int, max_len: int) -> float:
  means = [np.nanmean(v) for n, v in sorted(per_length.items()) if min_len <= n <= max_len]
  means = [m for m in means if not np.isnan(m)]
  return float(np.mean(means)) if means else float("nan")


def distance_spearman(
  pred_distances, heads: Sequence[Any], min_len: int = 5, max_len: int = 50
) -> float:
  """DSpr.: Spearman of each word's predicted vs gold distances to all words.

  Averaged over all words of all sentences of each length, then over lengths in
  ``[min_len, max_len]`` (sentence-mean then length-mean gives the same number,
  since every sentence of a length has that many words).
  """
  pred_distances = np.asarray(pred_distances)
  per_length: dict[int, list[float]] = collections.defaultdict(list)
  for i, h in enumerate(heads):
    n = len(h)
    if not min_len <= n <= max_len:
      continue
    gold, pred = tree_distances(h), pred_distances[i, :n, :n]
    per_length[n].extend(spearman_rows(pred, gold).tolist())
  return _length_average(per_length, min_len, max_len)


def depth_spearman(pred_depths, heads: Sequence[Any], min_len: int = 5, max_len: int = 50) -> float:
  """NSpr.: Spearman of predicted vs gold depth per sentence, averaged per length then over lengths."""
  pred_depths = np.asarray(pred_depths)
  per_length: dict[int, list[float]] = collections.defaultdict(list)
  for i, h in enumerate(heads):
    n = len(h)
    if min_len <= n <= max_len:
      per_length[n].append(spearman(pred_depths[i, :n], tree_depths(h)))
  return _length_average(per_length, min_len, max_len)


def root_accuracy(pred_depths, heads: Sequence[Any], punct: Sequence[Any] | None = None) -> float:
  """Share of sentences whose shallowest predicted word is the root (punctuation optionally skipped)."""
  pred_depths = np.asarray(pred_depths)
  hits = [
    _root_hit(pred_depths[i], h, None if punct is None else punct[i]) for i, h in enumerate(heads)
  ]
  hits = [x for x in hits if not np.isnan(x)]
  return sum(hits) / len(hits) if hits else float("nan")


def _root_hit(pred: np.ndarray, heads, punct) -> float:
  """1.0 where a sentence's shallowest predicted (kept) word is its root, else 0.0; nan when
  no word is kept."""
  h = np.asarray(heads)
  keep = _keep(len(h), punct)
  if len(keep) == 0:
    return float("nan")
  return float(h[keep[np.argmin(pred[keep])]] == 0)


def punctuation_masks(
  sentences: Sequence[Any],
  tags: frozenset[str] = PUNCT_UPOS,
) -> list[np.ndarray]:
  """Per-sentence bool masks of punctuation words from ``sentence.upos``."""
  return [np.asarray([u in tags for u in s.upos], bool) for s in sentences]


def per_sentence(
  probe: StructuralProbe,
  batch: StructuralBatch,
  punct: Sequence[Any] | None = None,
  min_len: int = 5,
  max_len: int = 50,
) -> dict[str, np.ndarray]:
  """`evaluate`'s metrics kept per sentence and layer, sentences first, so a bootstrap can
  resample sentences (a sentence's words and edges are not independent); `from_per_sentence`
  gives `evaluate`'s numbers back.

  Returns:
    `length` (n,) words per sentence, and per sentence and layer (n, layers):
    `spearman_sum` and `spearman_count` (the sum and number of its defined Spearman values:
    each word's row for a distance probe, the sentence's one for a depth probe; 0 outside
    `[min_len, max_len]`); for a distance probe `uuas_correct` and `uuas_edges` (its MST's
    correct and gold edges), for a depth probe `root_hit` (1 or 0; nan with no word kept).
  """
  pred = np.asarray(probe.predict(batch.features))  # (layers, n, max_len[, max_len])
  marks = [None if punct is None else punct[i] for i in range(len(batch.heads))]
  lengths = np.asarray([len(h) for h in batch.heads])
  inside = (min_len <= lengths) & (lengths <= max_len)
  total = np.zeros((len(lengths), len(pred)))
  count = np.zeros_like(total)
  out: dict[str, np.ndarray] = {"length": lengths}
  if probe.kind == "distance":
    edges = np.asarray(
      [[_uuas_counts(p[i], h, marks[i]) for p in pred] for i, h in enumerate(batch.heads)]
    )
    out.update(uuas_correct=edges[..., 0], uuas_edges=edges[..., 1])
    for i, h in enumerate(batch.heads):
      n = len(h)
      if inside[i]:
        rows = np.asarray([spearman_rows(p[i, :n, :n], tree_distances(h)) for p in pred])
        total[i], count[i] = np.nansum(rows, -1), np.sum(~np.isnan(rows), -1)
  else:
    out["root_hit"] = np.asarray(
      [[_root_hit(p[i], h, marks[i]) for p in pred] for i, h in enumerate(batch.heads)]
    )
    for i, h in enumerate(batch.heads):
      n = len(h)
      if inside[i]:
        rho = np.asarray([spearman(p[i, :n], tree_depths(h)) for p in pred])
        total[i], count[i] = np.nan_to_num(rho), ~np.isnan(rho)
  return {**out, "spearman_sum": total, "spearman_count": count}


def from_per_sentence(values: dict[str, Any], min_len: int = 5, max_len: int = 50) -> dict:
  """`evaluate`'s per-layer metrics from `per_sentence`'s arrays, which may carry leading axes
  (a bootstrap's resamples: `(..., n, layers)`, lengths `(..., n)`); each `(..., layers)`.
  The Spearman metrics average per sentence length, then over the lengths present."""
  v = {k: np.asarray(x, np.float64) for k, x in values.items()}
  lengths = np.arange(min_len, max_len + 1)
  onehot = (v["length"][..., None] == lengths).astype(np.float64)  # (..., n, lengths)
  by_length = lambda x: np.einsum("...nl,...nk->...kl", x, onehot)
  total, count = by_length(v["spearman_sum"]), by_length(v["spearman_count"])
  with np.errstate(divide="ignore", invalid="ignore"):
    per_length = np.where(count > 0, total / np.where(count > 0, count, 1), np.nan)
    present = ~np.isnan(per_length)
    spearman_ = np.where(
      present.any(-2), np.nansum(per_length, -2) / np.maximum(present.sum(-2), 1), np.nan
    )
    if "uuas_correct" in v:
      edges = v["uuas_edges"].sum(-2)
      uuas_ = np.where(edges > 0, v["uuas_correct"].sum(-2) / np.where(edges > 0, edges, 1), np.nan)
      return {"uuas": uuas_, "spearman": spearman_}
    hit = v["root_hit"]
    kept = (~np.isnan(hit)).sum(-2)
    root = np.where(kept > 0, np.nansum(hit, -2) / np.maximum(kept, 1), np.nan)
  return {"root_accuracy": root, "spearman": spearman_}


def evaluate(
  probe: StructuralProbe,
  batch: StructuralBatch,
  punct: Sequence[Any] | None = None,
  min_len: int = 5,
  max_len: int = 50,
) -> dict[str, np.ndarray]:
  """Per-layer metrics of a fitted probe on a padded batch.

  Args:
    probe: a distance or depth probe.
    batch: padded evaluation sentences.
    punct: per-sentence punctuation masks to exclude from UUAS / root accuracy
      (as in the paper), or None to keep every word.
    min_len, max_len: sentence lengths averaged in the Spearman metrics.

  Returns:
    For a distance probe ``{"uuas", "spearman"}``, for a depth probe
    ``{"root_accuracy", "spearman"}``; each ``(layers,)``.
  """
  pred = probe.predict(batch.features)
  if probe.kind == "distance":
    return {
      "uuas": np.asarray([uuas(p, batch.heads, punct) for p in pred]),
      "spearman": np.asarray([distance_spearman(p, batch.heads, min_len, max_len) for p in pred]),
    }
  return {
    "root_accuracy": np.asarray([root_accuracy(p, batch.heads, punct) for p in pred]),
    "spearman": np.asarray([depth_spearman(p, batch.heads, min_len, max_len) for p in pred]),
  }
