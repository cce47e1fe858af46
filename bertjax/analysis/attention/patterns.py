"""Attention pattern types and their change under fine-tuning (Kovaleva et al. 2019).

* `pattern_types`: the five pattern classes, from three features of each map (see
  `pattern_features`, `classify_patterns`), streamed over batches.
* `attention_change`: per-head cosine between the maps of two checkpoints and per-layer
  linear CKA of their hidden states (Kovaleva et al. Fig. 3).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from bertjax import stats
from bertjax.analysis.batching import as_batch
from bertjax.analysis.sharded import maps_runner
from bertjax.model.config import BertConfig

Params = dict[str, Any]


PATTERN_TYPES = ("vertical", "diagonal", "vertical+diagonal", "block", "heterogeneous")


@dataclasses.dataclass(frozen=True)
class PatternThresholds:
  """Decision list of `classify_patterns`, applied in this order.

  1. vertical+diagonal: `vertical >= mixed_each` and `diagonal >= mixed_each`
     and `vertical + diagonal >= mixed_sum`.
  2. vertical: `vertical >= vertical_min`.
  3. diagonal: `diagonal >= diagonal_min`.
  4. block: the sequence has two segments and `block >= block_min`.
  5. heterogeneous: anything else.
  """

  vertical_min: float = 0.6
  diagonal_min: float = 0.6
  mixed_each: float = 0.25
  mixed_sum: float = 0.7
  block_min: float = 0.8


def pattern_features(attn, special_mask, attention_mask, token_type_ids):
  """The three features of `classify_patterns`, for maps of a batch.

  Each is a per-query-row quantity averaged over the real query rows:
  * "vertical": mass on special-token keys ([CLS], [SEP]) -- vertical stripes.
  * "diagonal": mass on non-special keys at offset -1, 0 or +1 -- the diagonal band.
  * "block": of the mass on non-special keys, the share on keys of the query's own
    segment (token type) -- intra-sentence blocks of sentence pairs; NaN where a
    sequence has only one segment among its non-special tokens.

  Args:
    attn: (..., B, N, T, T) maps (e.g. (layers, B, heads, T, T)).
    special_mask, attention_mask, token_type_ids: (B, T).

  Returns:
    dict name -> (..., B, N) float64.
  """
  a = np.asarray(attn, np.float64)
  special = np.asarray(special_mask, bool)
  real = np.asarray(attention_mask, bool)
  seg = np.asarray(token_type_ids)
  seq = a.shape[-1]
  offset = np.abs(np.arange(seq)[:, None] - np.arange(seq)[None, :])  # (T, T)
  plain = real & ~special  # (B, T)
  key = lambda m: m[:, None, None, :] if m.ndim == 2 else m[:, None]  # -> (B, 1, [T,] T)
  vertical = (a * key(special & real)).sum(-1)
  near = (offset <= 1)[None] & plain[:, None, :]  # (B, T, T)
  diagonal = (a * key(near)).sum(-1)
  same = (seg[:, :, None] == seg[:, None, :]) & plain[:, None, :]  # (B, T, T)
  plain_mass = (a * key(plain)).sum(-1)
  block = (a * key(same)).sum(-1) / np.maximum(plain_mass, 1e-12)
  rows = real[:, None, :].astype(np.float64)  # (B, 1, T)
  count = np.maximum(rows.sum(-1), 1)
  avg = lambda x: (x * rows).sum(-1) / count
  seg_plain = np.where(plain, seg, -1)
  two = np.array([len(set(s[s >= 0].tolist())) > 1 for s in seg_plain])  # (B,)
  block = np.where(two[:, None], avg(block), np.nan)
  return {"vertical": avg(vertical), "diagonal": avg(diagonal), "block": block}


def classify_patterns(features, thresholds: PatternThresholds = PatternThresholds()) -> np.ndarray:
  """Pattern type codes (index into `PATTERN_TYPES`) from `pattern_features`, same shape."""
  v, d, b = (np.asarray(features[k]) for k in ("vertical", "diagonal", "block"))
  t = thresholds
  mixed = (v >= t.mixed_each) & (d >= t.mixed_each) & (v + d >= t.mixed_sum)
  block = np.nan_to_num(b, nan=-1.0) >= t.block_min
  return np.select(
    [mixed, v >= t.vertical_min, d >= t.diagonal_min, block], [2, 0, 1, 3], default=4
  ).astype(np.int32)


@dataclasses.dataclass(frozen=True)
class PatternCounts:
  """Per-head counts of each pattern type over the sequences of a data set."""

  counts: np.ndarray  # (layers, heads, 5)
  per_sequence: np.ndarray | None = None  # (sequences, 5): each sequence's maps of each type

  @property
  def per_layer(self) -> np.ndarray:
    """(layers, 5) ratio of each type among the layer's maps."""
    c = self.counts.sum(1)
    return c / np.maximum(c.sum(-1, keepdims=True), 1)

  @property
  def overall(self) -> np.ndarray:
    """(5,) ratio of each type among all maps."""
    c = self.counts.sum((0, 1))
    return c / max(c.sum(), 1)

  @property
  def dominant(self) -> np.ndarray:
    """(layers, heads) most frequent type code of each head."""
    return self.counts.argmax(-1)

  def summary(self) -> dict:
    """Kovaleva et al.'s figures of the counts: the type names, counts, ratios per layer and
    overall, each head's dominant type, the share of the four repeated types (every type but
    heterogeneous) and the commonest of them."""
    overall = self.overall
    return {
      "types": list(PATTERN_TYPES),
      "counts": self.counts,
      "per_layer": self.per_layer,
      "overall": overall,
      "dominant": self.dominant,
      "repeated_share": float(overall[:4].sum()),
      "commonest_repeated": PATTERN_TYPES[int(np.argmax(overall[:4]))],
      **({} if self.per_sequence is None else {"per_sequence": self.per_sequence}),
    }


def pattern_types(
  params: Params,
  config: BertConfig,
  batches: Iterable,
  *,
  special_ids: Sequence[int],
  thresholds: PatternThresholds = PatternThresholds(),
  mesh=None,
) -> PatternCounts:
  """Classifies every head's map of every sequence (Kovaleva et al.'s five types).

  Args:
    params, config, batches: the model and data (one batch of maps at a time).
    special_ids: ids of the "vertical" tokens, e.g. `[tok.cls_id, tok.sep_id]`.
    thresholds: the classifier's decision list.
    mesh: a `jax.sharding.Mesh` (`bertjax.mesh.make_mesh`): each batch's rows split
      over all its devices for the forward pass (padded with empty rows, dropped after it),
      parameters replicated (fsdp-sharded with an "fsdp" axis > 1); the maps are gathered
      and classified on the host as on one device. None: one device.

  Returns:
    A `PatternCounts`.
  """
  special_ids = np.asarray(list(special_ids), np.int32)
  counts = np.zeros((config.depth, config.num_attention_heads, len(PATTERN_TYPES)), np.int64)
  per_sequence = []
  run = maps_runner(params, config, mesh)
  for batch in batches:
    b = as_batch(batch)
    maps, _ = run(b)  # (L, B, N, T, T)
    special = np.isin(np.asarray(b["input_ids"]), special_ids)
    codes = classify_patterns(
      pattern_features(maps, special, b["attention_mask"], b["token_type_ids"]), thresholds
    )  # (L, B, N)
    onehot = codes[..., None] == np.arange(len(PATTERN_TYPES))  # (L, B, N, 5)
    counts += onehot.sum(1)
    per_sequence.append(onehot.sum((0, 2)))
  return PatternCounts(counts, np.concatenate(per_sequence) if per_sequence else None)


@dataclasses.dataclass(frozen=True)
class AttentionChange:
  """How much two checkpoints differ on the same inputs."""

  cosine: np.ndarray  # (layers, heads): mean over sequences of the maps' cosine
  cka: np.ndarray  # (layers + 1,): linear CKA of hidden states, embeddings first
  per_sequence: np.ndarray | None = None  # (sequences, layers): each one's cosine, head mean


def attention_change(
  params_a: Params,
  config: BertConfig,
  params_b: Params,
  batches: Iterable,
  *,
  config_b: BertConfig | None = None,
  max_tokens: int = 4096,
  mesh=None,
) -> AttentionChange:
  """Per-head cosine similarity of attention maps and per-layer CKA between two checkpoints.

  A computation, so `(params, config, ...)` first, as in `forward`; the second model follows.
  The older order `attention_change(params_a, params_b, config, batches)` still works, with a
  DeprecationWarning.

  Args:
    params_a: e.g. pre-trained weights.
    config: the architecture of `params_a` (and of `params_b` unless `config_b`).
    params_b: e.g. fine-tuned weights.
    batches: the shared inputs.
    config_b: the architecture of `params_b` if it differs (same depth and heads).
    max_tokens: real tokens kept for CKA (the first ones); the cosine uses all.
    mesh: a device mesh (see `pattern_types`): both models' forward passes split their rows
      over all its devices; the comparison runs on the host. None: one device.

  Returns:
    An `AttentionChange`. The cosine compares each sequence's flattened real-token
    maps (padded entries are zero in both), averaged over sequences.
  """
  if isinstance(params_b, BertConfig) and not isinstance(config, BertConfig):
    warnings.warn(
      "attention_change(params_a, params_b, config, batches) is deprecated; use "
      "attention_change(params_a, config, params_b, batches)",
      DeprecationWarning,
      stacklevel=2,
    )
    config, params_b = params_b, config
  config_b = config_b or config
  if (config_b.depth, config_b.num_attention_heads) != (config.depth, config.num_attention_heads):
    raise ValueError(
      f"depth x heads differ: {config.depth}x{config.num_attention_heads} vs "
      f"{config_b.depth}x{config_b.num_attention_heads}"
    )
  cos_sum = np.zeros((config.depth, config.num_attention_heads))
  sequences, per_sequence = 0, []
  reps_a, reps_b, kept = [], [], 0
  run_a, run_b = maps_runner(params_a, config, mesh), maps_runner(params_b, config_b, mesh)
  for batch in batches:
    b = as_batch(batch)
    (ma, ha), (mb, hb) = run_a(b, "hidden_states"), run_b(b, "hidden_states")
    ma, mb = ma.astype(np.float64), mb.astype(np.float64)  # (L, B, N, T, T)
    dot = (ma * mb).sum((-1, -2))
    norm = np.sqrt((ma * ma).sum((-1, -2)) * (mb * mb).sum((-1, -2)))
    cos = dot / np.maximum(norm, 1e-30)  # (L, B, N)
    cos_sum += cos.sum(1)
    per_sequence.append(cos.mean(-1).T)
    sequences += ma.shape[1]
    if kept < max_tokens:
      real = np.asarray(b["attention_mask"], bool)
      ha, hb = ha[:, real][:, : max_tokens - kept], hb[:, real][:, : max_tokens - kept]
      reps_a.append(ha)
      reps_b.append(hb)
      kept += ha.shape[1]
  if sequences == 0:
    raise ValueError("batches is empty")
  ra, rb = np.concatenate(reps_a, 1), np.concatenate(reps_b, 1)
  cka = np.asarray(stats.cka_same_layers(ra, rb), np.float64)
  return AttentionChange(cos_sum / sequences, cka, np.concatenate(per_sequence))
