"""What attention heads look at: Clark et al. 2019, Kovaleva et al. 2019, Brunner et al. 2020.

Every data-set statistic is streamed over batches with running sums; no full set
of attention maps is ever held (one batch's maps at most). Batches are mappings
(or `bertjax.Batch`) with `input_ids` and optionally `attention_mask`,
`token_type_ids`, `word_ids`; padding is right padding.

* `clark_statistics`: mass on [CLS], [SEP], punctuation, self, previous and next
  token, and entropy, per layer and head, as Clark et al.'s released notebook
  computes them (per document first, then over documents; "." and "," as
  punctuation, `clark_punctuation_ids`; smoothed entropy), or token-weighted over
  the whole data set. Unsmoothed, it runs the kernel statistics path
  (`bertjax.attention_statistics`; fused on GPU, no maps held) twice per batch.
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
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from bertjax.analysis import sharded
from bertjax.analysis.batching import as_batch, model_token_types
from bertjax.model.config import BertConfig
from bertjax.model.forward import attention_statistics, forward

Params = dict[str, Any]
CLARK_NAMES = ("cls", "sep", "punct", "self", "prev", "next", "entropy")
CLARK_PUNCTUATION = (".", ",")  # General_Analysis.ipynb: token == "." or token == ","
CLARK_ENTROPY_SMOOTHING = 1e-4  # General_Analysis.ipynb: 0.9999 * attns + 0.0001 / n_tokens
WEIGHTINGS = ("document", "token")
PATTERN_TYPES = ("vertical", "diagonal", "vertical+diagonal", "block", "heterogeneous")


_model_types = model_token_types  # None for a family without token types (DistilBERT)


def _model_run(params: Params, config: BertConfig, mesh):
  """`run(batch, extra=None) -> (maps, extra)` on the host: the model's attention maps
  (L, B, N, T, T) and, when asked, `extra="hidden_states"` (L + 1, B, T, H) or the value
  site `extra="v"` (L, B, T, G, D) of a batch, on one device (`mesh=None`) or with its rows
  split over every device of `mesh`."""
  if mesh is not None:
    return sharded.AttentionRunner(params, config, mesh).outputs

  def run(b, extra=None):
    out = forward(params, config, b["input_ids"], b["attention_mask"],
                  _model_types(config, b["token_type_ids"]), output_attentions=True,
                  output_hidden_states=extra == "hidden_states",
                  capture=("v",) if extra == "v" else ())
    second = {None: None, "hidden_states": out.hidden_states,
              "v": None if out.cache is None else out.cache.get("v")}[extra]
    return np.asarray(out.attentions), None if second is None else np.asarray(second)

  return run


# Token sets -----------------------------------------------------------------


def _is_punct(text: str) -> bool:
  return bool(text) and all(unicodedata.category(c).startswith("P") or c in "$+<=>^`|~"
                            for c in text)


def _word_start_markers(tokenizer) -> tuple[str, ...]:
  """Prefixes marking a word-initial token: "Ġ" (byte-level BPE), "▁" (SentencePiece)."""
  return ("Ġ", "▁") if getattr(tokenizer, "byte_level", False) else ("▁",)


def punctuation_ids(tokenizer) -> np.ndarray:
  """Sorted ids of the vocabulary entries made only of punctuation.

  A broader set than Clark et al.'s ("." and ",", `clark_punctuation_ids`): every
  vocabulary entry of Unicode punctuation or ASCII symbols (~185 in BERT's
  uncased vocabulary), after a WordPiece "##" or a word-start marker (byte-level
  BPE's "Ġ", SentencePiece's "▁") is set aside, so RoBERTa's "Ġ," counts as ",".
  """
  vocab = tokenizer.tokenizer.get_vocab()
  special = set(tokenizer.special_ids)
  markers = _word_start_markers(tokenizer)

  def bare(tok: str) -> str:
    tok = tok.removeprefix("##")
    for m in markers:
      tok = tok.removeprefix(m)
    return tok

  ids = [i for tok, i in vocab.items()
         if i not in special and not (tok.startswith("[") and tok.endswith("]"))
         and _is_punct(bare(tok))]
  return np.asarray(sorted(ids), np.int32)


def clark_punctuation_ids(tokenizer) -> np.ndarray:
  """Ids of the tokens Clark et al. count as punctuation: "." and "," (`CLARK_PUNCTUATION`).

  Their notebook (clarkkev/attention-analysis, `General_Analysis.ipynb`) tests
  `token == "." or token == ","`; entries missing from the vocabulary are skipped.
  For byte-level BPE (RoBERTa) and SentencePiece vocabularies the word-initial
  forms count too ("Ġ." and "▁.": what a "." after a space, or a pre-split word "."
  with its added leading space, becomes); WordPiece's "##." does not (the notebook's
  test excludes it).
  """
  vocab = tokenizer.tokenizer.get_vocab()
  forms = [m + t for t in CLARK_PUNCTUATION for m in ("",) + _word_start_markers(tokenizer)]
  return np.asarray(sorted({vocab[t] for t in forms if t in vocab}), np.int32)


# Clark et al. 2019 ------------------------------------------------------------


def _maps_statistics(maps, ids, mask, sep_id: int, punct_ids, smoothing: float):
  """Per-sequence means over real query rows, (depth, B, heads) each, from full maps.

  `maps` (depth, B, heads, T, T); on real keys the entropy is that of
  `(1 - smoothing) * a + smoothing / n` (n: the sequence's real tokens).
  """
  real = np.asarray(mask, bool)  # (B, T)
  n = real.sum(-1).astype(np.float64)  # (B,)
  rows = real / np.maximum(n, 1)[:, None]  # (B, T): mean over real query rows
  keys = {"sep": real & (ids == sep_id), "punct": real & np.isin(ids, punct_ids)}
  out = {name: [] for name in CLARK_NAMES}
  uniform = (smoothing / np.maximum(n, 1))[:, None, None, None] * real[:, None, None, :]
  for a in maps:  # one layer at a time: (B, heads, T, T)
    a = np.asarray(a, np.float64) * real[:, None, None, :]
    per_row = {
      "cls": a[..., 0],
      "sep": (a * keys["sep"][:, None, None, :]).sum(-1),
      "punct": (a * keys["punct"][:, None, None, :]).sum(-1),
      "self": np.diagonal(a, 0, -2, -1),
      "prev": np.pad(np.diagonal(a, -1, -2, -1), ((0, 0), (0, 0), (1, 0))),
      "next": np.pad(np.diagonal(a, 1, -2, -1), ((0, 0), (0, 0), (0, 1))),
    }
    p = (1 - smoothing) * a + uniform  # (B, heads, T, T); zero on padded keys
    per_row["entropy"] = -(p * np.log(np.where(p > 0, p, 1.0))).sum(-1)
    for name, v in per_row.items():  # v: (B, heads, T) with T query rows
      out[name].append(np.einsum("bnt,bt->bn", v, rows))
  return {name: np.stack(v) for name, v in out.items()}


def clark_statistics(params: Params, config: BertConfig, batches: Iterable, *, sep_id: int,
                     punct_ids: Sequence[int] = (), weighting: str = "document",
                     entropy_smoothing: float = CLARK_ENTROPY_SMOOTHING,
                     mesh=None) -> dict[str, np.ndarray]:
  """Clark et al.'s per-head attention statistics over a data set.

  Follows "Computing Average Attention to Particular Tokens/Positions" and
  "Computing Attention Head Entropies" in Clark et al.'s released notebook
  (github.com/clarkkev/attention-analysis, `General_Analysis.ipynb`): for every
  document (sequence), each statistic of a query row is averaged over *all* its
  real query rows ([CLS] and [SEP] rows included); then, with
  `weighting="document"` (the notebook's), over documents, each counting once.
  `weighting="token"` averages over every real query token of the data set
  instead (long sequences count more). The statistics: "cls", mass on position 0
  (the notebook: on tokens equal to "[CLS]"; the same where [CLS] comes only
  first); "sep", on [SEP] tokens; "punct", on `punct_ids` (the notebook: "." and
  ",", `clark_punctuation_ids`); "self"; "prev" (key = query - 1, the notebook's
  "left"; 0 for the first query); "next" (key = query + 1, "right"; 0 for the
  last); "entropy", of each row in nats, after the notebook's smoothing `(1 -
  entropy_smoothing) * a + entropy_smoothing / n` (n: the document's tokens).

  Where bertjax differs: the notebook reads float16 maps of BERT-base on 1,000
  Wikipedia segment pairs of up to 128 tokens; here, the maps are the model's
  float32 ones on whatever `batches` hold. With `entropy_smoothing > 0` the
  statistics come from the attention maps (`bertjax.forward(...,
  output_attentions=True)`, one batch at a time); with 0 from the kernel
  statistics path (`bertjax.attention_statistics`, no maps), whose entropy is
  unsmoothed (it differs from the smoothed one by at most `eps log(n) + h(eps)`
  nats, h the binary entropy: < 0.002 for eps = 1e-4, n <= 512).

  Args:
    params, config: the model.
    batches: iterable of batches.
    sep_id: the [SEP] id.
    punct_ids: ids counted as punctuation: `clark_punctuation_ids(tokenizer)` for
      Clark's, `punctuation_ids(tokenizer)` for every punctuation entry; empty
      reports zeros (and skips the kernel path's second pass).
    weighting: "document" (mean of per-sequence means, Clark's) or "token" (mean
      over all real query tokens).
    entropy_smoothing: Clark's 1e-4 by default; 0 for the plain entropy (and the
      kernel path).
    mesh: a `jax.sharding.Mesh` (`bertjax.mesh.make_mesh`): each batch's rows split
      over all its devices (padded with empty rows, which weigh 0), parameters replicated
      (fsdp-sharded with an "fsdp" axis > 1); the maps path still reduces the maps on the
      host, after gathering them. None: one device.

  Returns:
    name -> float64 (layers, heads) for the names in `CLARK_NAMES`.
  """
  if weighting not in WEIGHTINGS:
    raise ValueError(f"weighting={weighting!r} must be one of {WEIGHTINGS}")
  if not 0 <= entropy_smoothing < 1:
    raise ValueError(f"entropy_smoothing={entropy_smoothing} must be in [0, 1)")
  punct_ids = np.asarray(punct_ids, np.int32)
  sums = {name: np.zeros((config.depth, config.num_attention_heads)) for name in CLARK_NAMES}
  count = 0.0
  runner = None if mesh is None else sharded.AttentionRunner(params, config, mesh)
  for batch in batches:
    b = as_batch(batch) if runner is None else runner.batch(as_batch(batch))
    lengths = np.asarray(b["attention_mask"]).sum(-1).astype(np.float64)  # (B,)
    # Per-sequence weights: 1 per non-empty document, or its number of real tokens.
    weight = (lengths > 0).astype(np.float64) if weighting == "document" else lengths
    stats = _batch_clark_statistics(params, config, b, runner, sep_id, punct_ids,
                                    entropy_smoothing)
    for name in CLARK_NAMES:  # (layers, B, heads) per-sequence means, weighted over B
      per_seq = np.nan_to_num(np.asarray(stats[name], np.float64))  # empty rows: 0 x weight 0
      sums[name] += np.einsum("dbn,b->dn", per_seq, weight)
    count += weight.sum()
  if count == 0:
    raise ValueError("batches is empty (no real tokens)")
  return {name: s / count for name, s in sums.items()}


def _batch_clark_statistics(params, config, b, runner, sep_id: int, punct_ids,
                            entropy_smoothing: float) -> dict[str, Any]:
  """Per-sequence means of one batch, (depth, B, heads) each: from the maps with smoothing,
  else from the kernel statistics path (a second pass for punctuation)."""
  types = _model_types(config, b["token_type_ids"])
  ids, mask = np.asarray(b["input_ids"]), np.asarray(b["attention_mask"])
  if entropy_smoothing > 0:
    maps = (forward(params, config, b["input_ids"], b["attention_mask"], types,
                    output_attentions=True).attentions if runner is None
            else runner.maps(b))  # (L, B, N, T, T)
    return _maps_statistics(np.asarray(maps), ids, mask, sep_id, punct_ids, entropy_smoothing)
  if runner is not None:
    stats_of = runner.statistics
  else:
    stats_of = lambda b, special: attention_statistics(
        params, config, b["input_ids"], b["attention_mask"], types,
        special_mask=jnp.asarray(special))
  out = stats_of(b, ids == sep_id)
  stats = {ours: out[theirs] for ours, theirs in (
      ("cls", "first"), ("sep", "special"), ("self", "self"), ("prev", "prev"),
      ("next", "next"), ("entropy", "entropy"))}
  stats["punct"] = np.zeros_like(stats["cls"])
  if punct_ids.size:
    stats["punct"] = stats_of(b, np.isin(ids, punct_ids))["special"]
  return stats


def uniform_entropy(lengths, weighting: str = "document") -> float:
  """Entropy (nats) of uniform attention, averaged as `clark_statistics` averages.

  Clark et al.'s reference line: the mean over documents of `log(n)`, n the
  document's tokens ("document"); or over tokens, `sum n log n / sum n`
  ("token").

  Args:
    lengths: (documents,) real tokens per sequence (all > 0).
    weighting: "document" or "token".
  """
  if weighting not in WEIGHTINGS:
    raise ValueError(f"weighting={weighting!r} must be one of {WEIGHTINGS}")
  n = np.asarray(lengths, np.float64).ravel()
  if n.size == 0 or (n <= 0).any():
    raise ValueError(f"lengths must be positive token counts, got {n.tolist()[:8]}")
  return float(np.log(n).mean() if weighting == "document" else (n * np.log(n)).sum() / n.sum())


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
                         keep_special: bool = True, mesh=None):
  """Yields `(maps (layers, heads, W, W), groups)` per sequence; batches need `word_ids`.

  With `mesh` (`bertjax.mesh.make_mesh`) each batch's rows are split over all its
  devices for the forward pass (padding rows dropped after it); the word maps are formed on
  the host as on one device.
  """
  run = _model_run(params, config, mesh)
  for batch in batches:
    b = as_batch(batch)
    if "word_ids" not in b:
      raise ValueError("word_level_attention needs batches with 'word_ids' (Tokenizer.encode_words)")
    maps, _ = run(b)
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
                  thresholds: PatternThresholds = PatternThresholds(),
                  mesh=None) -> PatternCounts:
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
  run = _model_run(params, config, mesh)
  for batch in batches:
    b = as_batch(batch)
    maps, _ = run(b)  # (L, B, N, T, T)
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


def attention_change(params_a: Params, config: BertConfig, params_b: Params, batches: Iterable, *,
                     config_b: BertConfig | None = None, max_tokens: int = 4096,
                     mesh=None) -> AttentionChange:
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
    warnings.warn("attention_change(params_a, params_b, config, batches) is deprecated; use "
                  "attention_change(params_a, config, params_b, batches)", DeprecationWarning,
                  stacklevel=2)
    config, params_b = params_b, config
  config_b = config_b or config
  if (config_b.depth, config_b.num_attention_heads) != (config.depth, config.num_attention_heads):
    raise ValueError(f"depth x heads differ: {config.depth}x{config.num_attention_heads} vs "
                     f"{config_b.depth}x{config_b.num_attention_heads}")
  cos_sum = np.zeros((config.depth, config.num_attention_heads))
  sequences = 0
  reps_a, reps_b, kept = [], [], 0
  run_a, run_b = _model_run(params_a, config, mesh), _model_run(params_b, config_b, mesh)
  for batch in batches:
    b = as_batch(batch)
    (ma, ha), (mb, hb) = run_a(b, "hidden_states"), run_b(b, "hidden_states")
    ma, mb = ma.astype(np.float64), mb.astype(np.float64)  # (L, B, N, T, T)
    dot = (ma * mb).sum((-1, -2))
    norm = np.sqrt((ma * ma).sum((-1, -2)) * (mb * mb).sum((-1, -2)))
    cos_sum += (dot / np.maximum(norm, 1e-30)).sum(1)
    sequences += ma.shape[1]
    if kept < max_tokens:
      real = np.asarray(b["attention_mask"], bool)
      ha, hb = ha[:, real][:, :max_tokens - kept], hb[:, real][:, :max_tokens - kept]
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


def head_value_outputs(params: Params, config: BertConfig, block: int, v) -> np.ndarray:
  """Each head's value-output map of one sequence: `T_h = v_h W_O^h`, (N, n, H).

  `v` (n, G, D) is the block's `v` site on the real tokens (the value projection of what
  the attention reads: the block input, or its norm on pre-LN blocks; grouped value heads
  serve their query heads); the head's contribution to the attention output (before the
  output bias) is `A_h @ T_h`. Computed in float64.
  """
  layers = params["encoder"]["layers"]
  if isinstance(layers, list):
    raise ValueError("head_value_outputs needs stacked (unpruned) layers")  # noqa: TRY004
  i = config.layer_param_index[block]
  wo = np.asarray(layers["attention"]["output"]["kernel"][i], np.float64)  # (N, D, H)
  v = np.asarray(v, np.float64)
  v = np.repeat(v, wo.shape[0] // v.shape[1], axis=1)  # (n, N, D)
  return np.einsum("tnd,ndh->nth", v, wo)  # (N, n, H)


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
                                   cls_id: int, sep_id: int,
                                   mesh=None) -> dict[str, dict[str, np.ndarray]]:
  """Raw vs effective attention, side by side (Brunner et al. 2020, Sec. 4).

  Per head, over all real tokens of the data set (streamed sums):
  * "cls", "sep": mean mass a query row puts on [CLS] / [SEP] keys.
  * "position_corr": Pearson correlation between the attention a token receives
    (its column's mean over the sequence's queries) and its position.
  * "raw_corr" (effective only): Pearson correlation between the raw and the
    effective attention weights.

  Args:
    params, config, batches: the model (stacked layers) and data.
    cls_id, sep_id: the [CLS] and [SEP] ids.
    mesh: a device mesh (see `pattern_types`): the forward passes split their rows over its
      devices; the per-sequence SVDs (float64, on the host: most of the time on small
      models) do not. None: one device.

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
  run = _model_run(params, config, mesh)
  for batch in batches:
    b = as_batch(batch)
    maps, values = run(b, "v")
    ids, mask = np.asarray(b["input_ids"]), np.asarray(b["attention_mask"], bool)
    for i in range(ids.shape[0]):
      n = int(mask[i].sum())
      is_cls, is_sep = ids[i, :n] == cls_id, ids[i, :n] == sep_id
      position = np.arange(n, dtype=np.float64)
      for d in range(config.depth):
        raw = maps[d, i, :, :n, :n].astype(np.float64)  # (N, n, n)
        eff = effective_attention(raw, head_value_outputs(params, config, d, values[d, i, :n]))
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
