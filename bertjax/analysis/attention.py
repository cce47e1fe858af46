"""What attention heads look at: Clark et al. 2019, Kovaleva et al. 2019, Brunner et al. 2020.

Every data-set statistic is streamed over batches with running sums; no full set
of attention maps is ever held (one batch's maps at most). Batches are mappings
(or `bertjax.Batch`) with `input_ids` and optionally `attention_mask`,
`token_type_ids`, `word_ids`; padding is right padding.

* `clark_statistics`: mass on [CLS], [SEP], punctuation, self, previous and next
  token, and entropy, per layer and head, averaged over every real query token of
  the data set. It runs the kernel statistics path (`bertjax.attention_statistics`;
  fused on GPU) twice per batch ([SEP] then punctuation as the "special" keys).
* `word_attention`: Clark et al.'s word-level maps (sum over a word's subword
  keys, mean over its subword queries).
* `pattern_types`: Kovaleva et al.'s five pattern classes, from three features of
  each map (see `pattern_features`, `classify_patterns`).
* `attention_change`: per-head cosine between the maps of two checkpoints and
  per-layer linear CKA of their hidden states (Kovaleva et al. Fig. 3).
* `effective_attention`: Brunner et al.'s attention with its component in the
  left null space of the head's value-output map removed.
"""

from __future__ import annotations

import dataclasses
import unicodedata
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.analysis.ablation import as_batch
from bertjax.config import BertConfig
from bertjax.functional import attention_statistics, forward

Params = dict[str, Any]
CLARK_NAMES = ("cls", "sep", "punct", "self", "prev", "next", "entropy")
PATTERN_TYPES = ("vertical", "diagonal", "vertical+diagonal", "block", "heterogeneous")


# Token sets -----------------------------------------------------------------


def _is_punct(text: str) -> bool:
  return bool(text) and all(unicodedata.category(c).startswith("P") or c in "$+<=>^`|~"
                            for c in text)


def punctuation_ids(tokenizer) -> np.ndarray:
  """Sorted ids of the vocabulary entries made only of punctuation (a "##" prefix ignored)."""
  vocab = tokenizer.tokenizer.get_vocab()
  special = set(tokenizer.special_ids)
  ids = [i for tok, i in vocab.items()
         if i not in special and not (tok.startswith("[") and tok.endswith("]"))
         and _is_punct(tok.removeprefix("##"))]
  return np.asarray(sorted(ids), np.int32)


# Clark et al. 2019 ------------------------------------------------------------


def _token_weighted(stat, lengths):
  """Sum over sequences of a per-sequence mean (layers, B, heads) times its token count."""
  return np.einsum("dbn,b->dn", np.asarray(stat, np.float64), lengths)


def clark_statistics(params: Params, config: BertConfig, batches: Iterable, *, sep_id: int,
                     punct_ids: Sequence[int] = ()) -> dict[str, np.ndarray]:
  """Clark et al.'s per-head attention statistics over a data set.

  Each statistic is a query row's attention mass (entropy: its entropy in nats),
  averaged over every real query token of every sequence (token-weighted, as
  Clark et al.): "cls" on position 0 (the [CLS] token), "sep" on [SEP] tokens,
  "punct" on punctuation tokens, "self", "prev" (key = query - 1; 0 for the first
  query), "next" (key = query + 1; 0 for the last).

  Args:
    params, config: the model.
    batches: iterable of batches.
    sep_id: the [SEP] id.
    punct_ids: ids counted as punctuation (`punctuation_ids(tokenizer)`); empty
      skips the second pass and reports zeros.

  Returns:
    name -> float64 (layers, heads) for the names in `CLARK_NAMES`.
  """
  punct_ids = np.asarray(punct_ids, np.int32)
  sums = {name: np.zeros((config.depth, config.num_attention_heads)) for name in CLARK_NAMES}
  tokens = 0.0
  for batch in batches:
    b = as_batch(batch)
    ids, mask = np.asarray(b["input_ids"]), np.asarray(b["attention_mask"])
    lengths = mask.sum(-1).astype(np.float64)  # (B,)
    stats = attention_statistics(params, config, b["input_ids"], b["attention_mask"],
                                 b["token_type_ids"], special_mask=jnp.asarray(ids == sep_id))
    for ours, theirs in (("cls", "first"), ("sep", "special"), ("self", "self"), ("prev", "prev"),
                         ("next", "next"), ("entropy", "entropy")):
      sums[ours] += _token_weighted(stats[theirs], lengths)
    if punct_ids.size:
      stats = attention_statistics(params, config, b["input_ids"], b["attention_mask"],
                                   b["token_type_ids"],
                                   special_mask=jnp.asarray(np.isin(ids, punct_ids)))
      sums["punct"] += _token_weighted(stats["special"], lengths)
    tokens += lengths.sum()
  if tokens == 0:
    raise ValueError("batches is empty (no real tokens)")
  return {name: s / tokens for name, s in sums.items()}


def word_attention(attn, word_ids, attention_mask=None, *, keep_special: bool = True):
  """Clark et al.'s word-level attention of one sequence.

  Attention *to* a word is the sum over its subword keys; attention *from* a
  word is the mean over its subword queries, so rows still sum to 1.

  Args:
    attn: (..., T, T) maps of one sequence (e.g. (layers, heads, T, T)).
    word_ids: (T,) word index per position, -1 for special tokens and padding.
    attention_mask: (T,) 1 for real tokens; None means all real.
    keep_special: keep each real special token ([CLS], [SEP]) as a word of its own
      (Clark et al. do); otherwise drop them (rows then sum to less than 1).

  Returns:
    `(maps (..., W, W), groups)`: `groups[w]` is the word index of unit w, or -1
    for a special token, in order of position.
  """
  word_ids = np.asarray(word_ids)
  seq = word_ids.shape[0]
  real = np.ones(seq, bool) if attention_mask is None else np.asarray(attention_mask, bool)
  units, labels = [], []
  seen = {}
  for t in range(seq):
    w = int(word_ids[t])
    if not real[t]:
      continue
    if w < 0:
      if keep_special:
        units.append([t])
        labels.append(-1)
    elif w in seen:
      units[seen[w]].append(t)
    else:
      seen[w] = len(units)
      units.append([t])
      labels.append(w)
  member = np.zeros((seq, len(units)))
  for u, positions in enumerate(units):
    member[positions, u] = 1.0
  mean_q = (member / np.maximum(member.sum(0), 1)).T  # (W, T)
  maps = mean_q @ np.asarray(attn, np.float64) @ member  # two matmuls, broadcast over `...`
  return maps, np.asarray(labels, np.int32)


def word_level_attention(params: Params, config: BertConfig, batches: Iterable, *,
                         keep_special: bool = True):
  """Yields `(maps (layers, heads, W, W), groups)` per sequence; batches need `word_ids`."""
  for batch in batches:
    b = as_batch(batch)
    if "word_ids" not in b:
      raise ValueError("word_level_attention needs batches with 'word_ids' (Tokenizer.encode_words)")
    maps = np.asarray(forward(params, config, b["input_ids"], b["attention_mask"],
                              b["token_type_ids"], output_attentions=True).attentions)
    for i in range(maps.shape[1]):
      yield word_attention(maps[:, i], np.asarray(b["word_ids"][i]),
                           np.asarray(b["attention_mask"][i]), keep_special=keep_special)


# Kovaleva et al. 2019: pattern types ------------------------------------------


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
  return np.select([mixed, v >= t.vertical_min, d >= t.diagonal_min, block],
                   [2, 0, 1, 3], default=4).astype(np.int32)


@dataclasses.dataclass(frozen=True)
class PatternCounts:
  """Per-head counts of each pattern type over the sequences of a data set."""

  counts: np.ndarray  # (layers, heads, 5)

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


def pattern_types(params: Params, config: BertConfig, batches: Iterable, *,
                  special_ids: Sequence[int],
                  thresholds: PatternThresholds = PatternThresholds()) -> PatternCounts:
  """Classifies every head's map of every sequence (Kovaleva et al.'s five types).

  Args:
    params, config, batches: the model and data (one batch of maps at a time).
    special_ids: ids of the "vertical" tokens, e.g. `[tok.cls_id, tok.sep_id]`.
    thresholds: the classifier's decision list.

  Returns:
    A `PatternCounts`.
  """
  special_ids = np.asarray(list(special_ids), np.int32)
  counts = np.zeros((config.depth, config.num_attention_heads, len(PATTERN_TYPES)), np.int64)
  for batch in batches:
    b = as_batch(batch)
    maps = forward(params, config, b["input_ids"], b["attention_mask"], b["token_type_ids"],
                   output_attentions=True).attentions  # (L, B, N, T, T)
    special = np.isin(np.asarray(b["input_ids"]), special_ids)
    codes = classify_patterns(pattern_features(maps, special, b["attention_mask"],
                                               b["token_type_ids"]), thresholds)  # (L, B, N)
    counts += (codes[..., None] == np.arange(len(PATTERN_TYPES))).sum(1)
  return PatternCounts(counts)


# Kovaleva et al. Fig. 3: change under fine-tuning -------------------------------


@dataclasses.dataclass(frozen=True)
class AttentionChange:
  """How much two checkpoints differ on the same inputs."""

  cosine: np.ndarray  # (layers, heads): mean over sequences of the maps' cosine
  cka: np.ndarray  # (layers + 1,): linear CKA of hidden states, embeddings first


def _linear_cka(a, b):
  """Linear CKA per layer of (layers, n, d) arrays (fallback for geometry.cka_same_layers)."""
  a = a - a.mean(1, keepdims=True)
  b = b - b.mean(1, keepdims=True)
  cross = np.einsum("lnd,lne->lde", a, b)
  aa, bb = np.einsum("lnd,lne->lde", a, a), np.einsum("lnd,lne->lde", b, b)
  num = (cross ** 2).sum((1, 2))
  return num / np.sqrt((aa ** 2).sum((1, 2)) * (bb ** 2).sum((1, 2)))


def attention_change(params_a: Params, params_b: Params, config: BertConfig, batches: Iterable, *,
                     config_b: BertConfig | None = None, max_tokens: int = 4096) -> AttentionChange:
  """Per-head cosine similarity of attention maps and per-layer CKA between two checkpoints.

  Args:
    params_a, params_b: e.g. pre-trained and fine-tuned weights.
    config: the architecture of `params_a` (and of `params_b` unless `config_b`).
    batches: the shared inputs.
    config_b: the architecture of `params_b` if it differs (same depth and heads).
    max_tokens: real tokens kept for CKA (the first ones); the cosine uses all.

  Returns:
    An `AttentionChange`. The cosine compares each sequence's flattened real-token
    maps (padded entries are zero in both), averaged over sequences.
  """
  config_b = config_b or config
  if (config_b.depth, config_b.num_attention_heads) != (config.depth, config.num_attention_heads):
    raise ValueError(f"depth x heads differ: {config.depth}x{config.num_attention_heads} vs "
                     f"{config_b.depth}x{config_b.num_attention_heads}")
  cos_sum = np.zeros((config.depth, config.num_attention_heads))
  sequences = 0
  reps_a, reps_b, kept = [], [], 0
  for batch in batches:
    b = as_batch(batch)
    args = (b["input_ids"], b["attention_mask"], b["token_type_ids"])
    out_a = forward(params_a, config, *args, output_attentions=True, output_hidden_states=True)
    out_b = forward(params_b, config_b, *args, output_attentions=True, output_hidden_states=True)
    ma, mb = (np.asarray(o.attentions, np.float64) for o in (out_a, out_b))  # (L, B, N, T, T)
    dot = (ma * mb).sum((-1, -2))
    norm = np.sqrt((ma * ma).sum((-1, -2)) * (mb * mb).sum((-1, -2)))
    cos_sum += (dot / np.maximum(norm, 1e-30)).sum(1)
    sequences += ma.shape[1]
    if kept < max_tokens:
      real = np.asarray(b["attention_mask"], bool)
      ha = np.asarray(out_a.hidden_states)[:, real][:, :max_tokens - kept]
      hb = np.asarray(out_b.hidden_states)[:, real][:, :max_tokens - kept]
      reps_a.append(ha)
      reps_b.append(hb)
      kept += ha.shape[1]
  if sequences == 0:
    raise ValueError("batches is empty")
  ra, rb = np.concatenate(reps_a, 1), np.concatenate(reps_b, 1)
  try:
    from bertjax.analysis.geometry import cka_same_layers
    cka = np.asarray(cka_same_layers(ra, rb), np.float64)
  except ImportError:  # geometry.py is optional
    cka = _linear_cka(ra.astype(np.float64), rb.astype(np.float64))
  return AttentionChange(cos_sum / sequences, cka)


# Brunner et al. 2020: effective attention ----------------------------------------


def head_value_outputs(params: Params, config: BertConfig, block: int, hidden) -> np.ndarray:
  """Each head's value-output map of one sequence: `T_h = (E W_V^h + b_V^h) W_O^h`, (N, n, H).

  `hidden` (n, H) is the block's input E on the real tokens; the head's
  contribution to the attention output (before the output bias) is `A_h @ T_h`.
  Computed in float64.
  """
  layers = params["encoder"]["layers"]
  if isinstance(layers, list):
    raise ValueError("head_value_outputs needs stacked (unpruned) layers")  # noqa: TRY004
  i = config.layer_param_index[block]
  a = jax.tree.map(lambda x: np.asarray(x[i], np.float64), layers["attention"])
  e = np.asarray(hidden, np.float64)
  v = np.einsum("th,hnd->ntd", e, a["value"]["kernel"]) + a["value"]["bias"][:, None]  # (N, n, D)
  return np.einsum("ntd,ndh->nth", v, a["output"]["kernel"])  # (N, n, H)


def left_null_space(t, rtol: float = 1e-10) -> np.ndarray:
  """Orthonormal bases of {u : u @ T = 0} for (..., n, H) maps: (..., n, n - rank) via SVD.

  The rank is common to the stacked maps only if their ranks agree; pass one map
  (n, H) when they may differ.
  """
  u, s, _ = np.linalg.svd(np.asarray(t, np.float64), full_matrices=True)
  rank = int((s > rtol * s[..., :1]).sum(-1).max())
  return u[..., rank:]


def effective_attention(attn, t, rtol: float = 1e-10) -> np.ndarray:
  """Brunner et al.'s effective attention: each row's component in the left null space removed.

  Only `A @ T` reaches the output, so any part of a row of A in `{u : u T = 0}`
  is invisible; `A_eff = A - A P_null = A P_col`, with `P_col` the projector onto
  the column space of T (by SVD, singular values above `rtol * max`).

  Args:
    attn: (N, n, n) one sequence's maps on its real tokens.
    t: (N, n, H) from `head_value_outputs`.
    rtol: relative singular-value cut-off for the rank.

  Returns:
    (N, n, n) float64 with `A_eff @ T == A @ T` and rows orthogonal to the null space.
  """
  attn = np.asarray(attn, np.float64)
  t = np.asarray(t, np.float64)
  if attn.shape[:-1] != t.shape[:-1] or attn.shape[-1] != attn.shape[-2]:
    raise ValueError(f"attn shape {attn.shape} must be (N, n, n) matching t shape {t.shape}")
  u, s, _ = np.linalg.svd(t, full_matrices=False)  # u (N, n, k)
  keep = s > rtol * s[..., :1]  # (N, k)
  u = u * keep[:, None, :]
  # (A U) U^T: two matmuls; the three-operand einsum is ~100x slower unoptimised.
  return (attn @ u) @ np.swapaxes(u, -1, -2)


def _pearson(sx, sy, sxx, syy, sxy, n):
  cov = sxy / n - sx * sy / n ** 2
  var = (sxx / n - (sx / n) ** 2) * (syy / n - (sy / n) ** 2)
  return cov / np.sqrt(np.maximum(var, 1e-300))


def effective_attention_statistics(params: Params, config: BertConfig, batches: Iterable, *,
                                   cls_id: int, sep_id: int) -> dict[str, dict[str, np.ndarray]]:
  """Raw vs effective attention, side by side (Brunner et al. 2020, Sec. 4).

  Per head, over all real tokens of the data set (streamed sums):
  * "cls", "sep": mean mass a query row puts on [CLS] / [SEP] keys.
  * "position_corr": Pearson correlation between the attention a token receives
    (its column's mean over the sequence's queries) and its position.
  * "raw_corr" (effective only): Pearson correlation between the raw and the
    effective attention weights.

  Returns:
    {"raw": {name: (layers, heads)}, "effective": {...}}.
  """
  shape = (config.depth, config.num_attention_heads)
  acc = {kind: {k: np.zeros(shape) for k in ("cls", "sep")} for kind in ("raw", "effective")}
  pos = {kind: [np.zeros(shape) for _ in range(5)] for kind in ("raw", "effective")}
  pair = [np.zeros(shape) for _ in range(5)]
  rows = 0
  cols = 0
  weights = 0
  for batch in batches:
    b = as_batch(batch)
    out = forward(params, config, b["input_ids"], b["attention_mask"], b["token_type_ids"],
                  output_attentions=True, output_hidden_states=True)
    maps, hidden = np.asarray(out.attentions), np.asarray(out.hidden_states)
    ids, mask = np.asarray(b["input_ids"]), np.asarray(b["attention_mask"], bool)
    for i in range(ids.shape[0]):
      n = int(mask[i].sum())
      is_cls, is_sep = ids[i, :n] == cls_id, ids[i, :n] == sep_id
      position = np.arange(n, dtype=np.float64)
      for d in range(config.depth):
        raw = maps[d, i, :, :n, :n].astype(np.float64)  # (N, n, n)
        eff = effective_attention(raw, head_value_outputs(params, config, d, hidden[d, i, :n]))
        for kind, a in (("raw", raw), ("effective", eff)):
          acc[kind]["cls"][d] += a[..., is_cls].sum((-1, -2))
          acc[kind]["sep"][d] += a[..., is_sep].sum((-1, -2))
          received = a.mean(1)  # (N, n)
          s = pos[kind]
          s[0][d] += position.sum()
          s[1][d] += received.sum(-1)
          s[2][d] += (position ** 2).sum()
          s[3][d] += (received ** 2).sum(-1)
          s[4][d] += (received * position).sum(-1)
        pair[0][d] += raw.sum((-1, -2))
        pair[1][d] += eff.sum((-1, -2))
        pair[2][d] += (raw ** 2).sum((-1, -2))
        pair[3][d] += (eff ** 2).sum((-1, -2))
        pair[4][d] += (raw * eff).sum((-1, -2))
      rows += n
      cols += n
      weights += n * n
  if rows == 0:
    raise ValueError("batches is empty")
  result = {}
  for kind in ("raw", "effective"):
    result[kind] = {k: v / rows for k, v in acc[kind].items()}
    result[kind]["position_corr"] = _pearson(*pos[kind], cols)
  result["effective"]["raw_corr"] = _pearson(*pair, weights)
  return result
