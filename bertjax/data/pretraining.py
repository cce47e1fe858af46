"""Dynamically masked MLM batches of pretraining examples (`PretrainingIterator`).

The examples (NSP, SOP, full sentences) and `PretrainingConfig` are built in
`bertjax.data.pretraining_examples`.

Masking is dynamic: `PretrainingIterator` masks each batch when it is drawn, with
a generator seeded by (seed, step, row), so batch k is a pure function of (seed,
k) and a host's shard is exactly its slice of the global batch. Of the maskable
tokens (not special, not padding) of a sequence, ``mask_prob`` are selected (an
exact count per sequence, stochastically rounded so that the expected rate is
exact): single tokens (``"token"``), whole words (``"whole_word"``: every subword
of a chosen word), or SpanBERT spans (``"span"``: spans of whole words with
lengths from a geometric distribution, p = 0.2, truncated at 10 words and
renormalised, mean 3.8; spans drawn next to each other are merged, as SpanBERT does,
so a span's boundary tokens are never masked). Selected tokens become ``[MASK]``
(80%), a random non-special token (10%) or stay unchanged (10%); per token for
``"token"`` and ``"whole_word"``, per (merged) span for ``"span"`` (as SpanBERT).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from bertjax.data.corpus import SPECIAL_TOKENS, TokenizedCorpus
from bertjax.data.pretraining_examples import (
  LABEL_KEYS,
  MASK_STREAM,
  SHUFFLE_STREAM,
  WORD_ORDER_STREAM,
  PretrainingConfig,
  PretrainingExamples,
  build_examples,
  seeded_rng,
)

# ---------------------------------------------------------------------------
# Masking
# ---------------------------------------------------------------------------


def _words(cand: np.ndarray, word_ids: np.ndarray):
  """Splits candidate positions into words: (starts, sizes, contiguous-with-next)."""
  new = np.ones(cand.shape[0], bool)
  new[1:] = (word_ids[cand[1:]] != word_ids[cand[:-1]]) | (cand[1:] != cand[:-1] + 1)
  starts = np.flatnonzero(new)
  sizes = np.diff(np.append(starts, cand.shape[0]))
  ends = cand[starts + sizes - 1]
  joined = np.zeros(starts.shape[0], bool)
  joined[:-1] = cand[starts[1:]] == ends[:-1] + 1
  return starts, sizes, joined


def select_mask_positions(
  word_ids: np.ndarray, maskable: np.ndarray, config: PretrainingConfig, rng: np.random.Generator
) -> list[np.ndarray]:
  """Chooses the positions of one sequence to predict.

  Args:
    word_ids: (T,) word id per position; subwords of a word share one.
    maskable: (T,) bool, False at special tokens and padding.
    config: masking, mask_prob, span_p, max_span_len, num_predictions.
    rng: the generator to draw from.

  Returns:
    Groups of positions (sorted int arrays): single tokens, or words in the order
    chosen, or spans in position order. Their total size is ``floor(mask_prob * n +
    u)``, u ~ U(0, 1), capped at P, where n is the number of maskable positions (a
    word or span that would overshoot is skipped or, for spans, shortened; spans also
    stop at an already chosen word and at special tokens: they never overlap or cross
    them). Spans drawn next to each other are merged into one, as SpanBERT's
    ``merge_intervals`` does, so every span is a maximal run of masked positions and
    the tokens just outside it (its boundaries) are never masked; a merged span may
    be longer than ``max_span_len`` words.
  """
  cand = np.flatnonzero(maskable)  # (n,)
  budget = min(math.floor(config.mask_prob * cand.shape[0] + rng.random()), config.num_predictions)
  if budget == 0:
    return []
  if config.masking == "token":
    return [np.sort(rng.choice(cand, budget, replace=False))]
  starts, sizes, joined = _words(cand, word_ids)
  groups, covered = [], 0
  if config.masking == "whole_word":
    for w in rng.permutation(starts.shape[0]):
      if covered + sizes[w] <= budget:
        groups.append(cand[starts[w] : starts[w] + sizes[w]])
        covered += sizes[w]
        if covered == budget:
          break
    return groups
  cdf = np.cumsum(config.span_length_probs())
  taken = np.zeros(starts.shape[0], bool)
  for _ in range(20 * budget + 20):
    if covered == budget:
      break
    length = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")) + 1
    w = first = int(rng.integers(starts.shape[0]))
    size = 0
    while w - first < length and w < starts.shape[0] and not taken[w]:
      if covered + size + sizes[w] > budget:
        break
      size += sizes[w]
      w += 1
      if not joined[w - 1]:  # the next word is across a [SEP] or padding
        break
    if size:
      taken[first:w] = True
      groups.append(cand[starts[first] : starts[first] + size])
      covered += size
  return merge_touching(groups)


def merge_touching(groups: list[np.ndarray]) -> list[np.ndarray]:
  """Disjoint runs of positions with runs that touch (one ends where the next begins)
  joined, in position order (SpanBERT's ``merge_intervals``)."""
  merged: list[np.ndarray] = []
  for g in sorted(groups, key=lambda g: int(g[0])):
    if merged and merged[-1][-1] + 1 == g[0]:
      merged[-1] = np.concatenate([merged[-1], g])
    else:
      merged.append(g)
  return merged


def mask_sequence(
  input_ids: np.ndarray,
  word_ids: np.ndarray,
  maskable: np.ndarray,
  config: PretrainingConfig,
  rng: np.random.Generator,
  *,
  mask_id: int,
  random_ids: np.ndarray,
  groups_out: list | None = None,
) -> tuple[np.ndarray, np.ndarray]:
  """Masks one sequence.

  Args:
    input_ids: (T,) original token ids.
    word_ids: (T,) word ids (see `select_mask_positions`).
    maskable: (T,) bool.
    config: the masking configuration.
    rng: the generator to draw from.
    mask_id: the ``[MASK]`` id.
    random_ids: (V',) the ids random replacements are drawn from.
    groups_out: a list that, when given, receives the chosen groups (tokens, words or
      spans; see `select_mask_positions`).

  Returns:
    ``(masked_ids (T,), positions (p,))`` with p <= P, positions sorted.
  """
  groups = select_mask_positions(word_ids, maskable, config, rng)
  if groups_out is not None:
    groups_out.extend(groups)
  masked = input_ids.copy()
  if not groups:
    return masked, np.zeros(0, np.int64)
  positions = np.concatenate(groups)  # (p,)
  if config.masking == "span":  # one replacement decision per span, as SpanBERT
    u = np.repeat(rng.random(len(groups)), [len(g) for g in groups])
  else:
    u = rng.random(positions.shape[0])
  to_mask = u < config.mask_token_prob
  to_random = ~to_mask & (u < config.mask_token_prob + config.random_token_prob)
  masked[positions[to_mask]] = mask_id
  masked[positions[to_random]] = random_ids[
    rng.integers(random_ids.shape[0], size=int(to_random.sum()))
  ]
  # The budget is capped at P, so nothing is cut here; kept as a guard.
  return masked, np.sort(positions)[: config.num_predictions]


def span_boundaries(
  groups: list[np.ndarray], positions: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
  """Each position's span boundaries: the positions just before and after its span.

  Spans that touch are one span here (`merge_touching`, as SpanBERT), so a boundary is
  never a masked position: for spans [15] and [16], both positions get (14, 17).

  Args:
    groups: the masked groups (contiguous spans) of one sequence.
    positions: (p,) the sorted masked positions (their union).

  Returns:
    ``(left (p,), right (p,))`` int32.
  """
  groups = merge_touching(groups)
  starts = np.concatenate([np.full(len(g), g[0]) for g in groups])
  ends = np.concatenate([np.full(len(g), g[-1]) for g in groups])
  order = np.argsort(np.concatenate(groups), kind="stable")
  left, right = starts[order] - 1, ends[order] + 1
  assert np.array_equal(np.concatenate(groups)[order], positions)
  return left.astype(np.int32), right.astype(np.int32)


def shuffle_trigrams(
  input_ids: np.ndarray,
  eligible: np.ndarray,
  prob: float,
  rng: np.random.Generator,
  max_trigrams: int,
) -> tuple[np.ndarray, np.ndarray]:
  """StructBERT's word-order noise on one sequence: shuffles random trigrams in place.

  Trigrams are three consecutive eligible tokens (not special, not padding, not
  masked), non-overlapping; their number is ``floor(prob * n / 3 + u)``, u ~ U(0, 1),
  capped at ``max_trigrams``, n the number of eligible tokens. Each is rearranged by
  a uniformly drawn permutation other than the identity (a trigram of three equal
  tokens is left as it is but still predicted).

  Args:
    input_ids: (T,) token ids (after MLM masking).
    eligible: (T,) bool.
    prob: the fraction of eligible tokens in shuffled trigrams.
    rng: the generator.
    max_trigrams: the cap.

  Returns:
    ``(shuffled_ids (T,), positions (3k,))``: the positions of the shuffled trigrams
    (sorted); the original ids there are ``input_ids[positions]``.
  """
  out = input_ids.copy()
  ok = eligible[:-2] & eligible[1:-1] & eligible[2:]  # (T - 2,) trigram starts
  n = int(eligible.sum())
  k = min(math.floor(prob * n / 3 + rng.random()), max_trigrams)
  chosen: list[int] = []
  taken = np.zeros(input_ids.shape[0], bool)
  for s in rng.permutation(np.flatnonzero(ok)):
    if len(chosen) == k:
      break
    if not taken[s : s + 3].any():
      taken[s : s + 3] = True
      chosen.append(int(s))
  perms = np.array([[0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]])
  for s in chosen:
    out[s : s + 3] = input_ids[s + perms[rng.integers(5)]]
  pos = np.sort(np.concatenate([np.arange(s, s + 3) for s in chosen])) if chosen else []
  return out, np.asarray(pos, np.int64)


# ---------------------------------------------------------------------------
# The iterator
# ---------------------------------------------------------------------------


class PretrainingIterator:
  """Deterministic, checkpointable iterator over dynamically masked batches.

  Batch k (global step k) is a pure function of (seed, k): epoch ``e = k //
  steps_per_epoch`` visits the examples in the order of a permutation seeded by
  (seed, e) (the last incomplete batch of an epoch is dropped), and row r of the
  global batch is masked with a generator seeded by (seed, k, r). With
  ``num_shards`` hosts, host ``shard_index`` yields rows ``[shard_index * b,
  (shard_index + 1) * b)`` of every global batch, ``b = batch_size // num_shards``.

  Each batch is a dict of numpy arrays: ``input_ids`` int32 (b, T),
  ``attention_mask`` int32 (b, T), ``token_type_ids`` int32 (b, T),
  ``mlm_positions`` int32 (b, P), ``mlm_ids`` int32 (b, P) (original ids),
  ``mlm_weights`` float32 (b, P) and, for NSP / SOP, ``next_sentence_labels`` /
  ``sop_labels`` int32 (b,). With ``masking="span"``, ``span_left`` and ``span_right``
  int32 (b, P) give each prediction's span boundaries (the positions just outside its
  span, for SpanBERT's span boundary objective; 0 at padding slots).
  """

  def __init__(
    self,
    corpus: TokenizedCorpus,
    config: PretrainingConfig,
    *,
    batch_size: int,
    seed: int = 0,
    shard_index: int = 0,
    num_shards: int = 1,
    examples: PretrainingExamples | None = None,
  ):
    """Builds the examples (unless given) and starts at step 0.

    Args:
      corpus: the tokenized corpus.
      config: example building and masking configuration.
      batch_size: the global batch size (all shards together).
      seed: a non-negative integer seeding example building, shuffling and masking.
      shard_index: this host's shard, in ``[0, num_shards)``.
      num_shards: the number of hosts; must divide ``batch_size``.
      examples: prebuilt examples (from `build_examples` with the same config).
    """
    if not isinstance(seed, (int, np.integer)) or seed < 0:
      raise ValueError(f"{seed=} must be a non-negative integer")
    if num_shards < 1 or not 0 <= shard_index < num_shards:
      raise ValueError(f"{shard_index=} must be in [0, {num_shards=})")
    if batch_size < 1 or batch_size % num_shards:
      raise ValueError(f"{batch_size=} must be a positive multiple of {num_shards=}")
    self.corpus, self.config, self.seed = corpus, config, int(seed)
    self.batch_size, self.shard_index, self.num_shards = batch_size, shard_index, num_shards
    self.examples = examples if examples is not None else build_examples(corpus, config, seed)
    if self.examples.objective != config.objective:
      raise ValueError(f"{self.examples.objective=} does not match {config.objective=}")
    if len(self.examples) < batch_size:
      raise ValueError(f"{batch_size=} exceeds the {len(self.examples)} examples of the corpus")
    special = corpus.special_ids
    self._cls, self._sep, self._pad = special["[CLS]"], special["[SEP]"], special["[PAD]"]
    self._mask = special["[MASK]"]
    self._special = np.asarray([special[t] for t in SPECIAL_TOKENS], np.int32)
    self._random_ids = np.setdiff1d(np.arange(corpus.vocab_size), self._special).astype(np.int32)
    self._step = 0
    self._perm_cache: tuple[int, np.ndarray] | None = None

  @property
  def steps_per_epoch(self) -> int:
    """Whole batches per pass over the examples (the last partial batch is dropped)."""
    return len(self.examples) // self.batch_size

  @property
  def step(self) -> int:
    """The global step of the next batch."""
    return self._step

  @property
  def epoch(self) -> int:
    """The epoch of the next batch (each epoch reshuffles the examples)."""
    return self._step // self.steps_per_epoch

  def _permutation(self, epoch: int) -> np.ndarray:
    if self._perm_cache is None or self._perm_cache[0] != epoch:
      self._perm_cache = (
        epoch,
        seeded_rng(self.seed, SHUFFLE_STREAM, epoch).permutation(len(self.examples)),
      )
    return self._perm_cache[1]

  def example_indices(self, step: int) -> tuple[np.ndarray, np.ndarray]:
    """This shard's example indices at a step and their rows in the global batch."""
    if step < 0:
      raise ValueError(f"{step=} must be >= 0")
    epoch, i = divmod(step, self.steps_per_epoch)
    b = self.batch_size // self.num_shards
    rows = np.arange(self.shard_index * b, (self.shard_index + 1) * b)
    return self._permutation(epoch)[i * self.batch_size + rows], rows

  def unmasked_batch(self, step: int) -> dict[str, np.ndarray]:
    """The batch at a step before masking, with ``word_ids`` (b, T) (-1 at special tokens)."""
    indices, rows = self.example_indices(step)
    ex, t = self.examples, self.config.max_seq_len
    b = indices.shape[0]
    input_ids = np.full((b, t), self._pad, np.int32)
    word_ids = np.full((b, t), -1, np.int32)
    type_ids = np.zeros((b, t), np.int32)
    attention = np.zeros((b, t), np.int32)
    for r, (a0, a1, b0, b1) in enumerate(ex.segments[indices]):
      la, lb = a1 - a0, b1 - b0
      n = la + 2 + (lb + 1 if lb else 0)
      input_ids[r, 0] = self._cls
      input_ids[r, 1 : 1 + la] = ex.ids[a0:a1]
      word_ids[r, 1 : 1 + la] = ex.word_ids[a0:a1]
      input_ids[r, 1 + la] = self._sep
      if lb:
        input_ids[r, 2 + la : 2 + la + lb] = ex.ids[b0:b1]
        word_ids[r, 2 + la : 2 + la + lb] = ex.word_ids[b0:b1]
        input_ids[r, n - 1] = self._sep
        type_ids[r, 2 + la : n] = 1
      attention[r, :n] = 1
    out = {
      "input_ids": input_ids,
      "attention_mask": attention,
      "token_type_ids": type_ids,
      "word_ids": word_ids,
      "example_index": indices.astype(np.int64),
      "global_row": rows,
    }
    if ex.objective in LABEL_KEYS:
      out[LABEL_KEYS[ex.objective]] = ex.labels[indices]
    return out

  def batch(self, step: int) -> dict[str, np.ndarray]:
    """The masked batch at a global step (a pure function of seed and step)."""
    raw = self.unmasked_batch(step)
    ids, word_ids = raw["input_ids"], raw["word_ids"]
    b, p = ids.shape[0], self.config.num_predictions
    maskable = (raw["attention_mask"] == 1) & ~np.isin(ids, self._special)
    masked = np.empty_like(ids)
    positions = np.zeros((b, p), np.int32)
    weights = np.zeros((b, p), np.float32)
    spans = self.config.masking == "span"
    left, right = np.zeros((b, p), np.int32), np.zeros((b, p), np.int32)
    for r in range(b):
      rng = seeded_rng(self.seed, MASK_STREAM, step, raw["global_row"][r])
      groups: list = []
      masked[r], pos = mask_sequence(
        ids[r],
        word_ids[r],
        maskable[r],
        self.config,
        rng,
        mask_id=self._mask,
        random_ids=self._random_ids,
        groups_out=groups,
      )
      if spans and groups:
        left[r, : pos.shape[0]], right[r, : pos.shape[0]] = span_boundaries(groups, pos)
      positions[r, : pos.shape[0]] = pos
      weights[r, : pos.shape[0]] = 1.0
    out = {
      "input_ids": masked,
      "attention_mask": raw["attention_mask"],
      "token_type_ids": raw["token_type_ids"],
      "mlm_positions": positions,
      "mlm_ids": np.where(weights > 0, np.take_along_axis(ids, positions, 1), 0).astype(np.int32),
      "mlm_weights": weights,
    }
    if spans:
      out["span_left"], out["span_right"] = left, right
    if self.examples.objective in LABEL_KEYS:
      key = LABEL_KEYS[self.examples.objective]
      out[key] = raw[key]
    return out

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    out = self.batch(self._step)
    self._step += 1
    return out

  def state(self) -> dict:
    """The position as a small JSON-serialisable dict."""
    return {
      "version": 1,
      "seed": self.seed,
      "step": self._step,
      "batch_size": self.batch_size,
      "num_examples": len(self.examples),
      "fingerprint": self.examples.fingerprint(),
      "config": dataclasses.asdict(self.config),
    }

  def set_state(self, state: dict) -> None:
    """Continues from a `state`; the next batch is the one that followed it."""
    mine = self.state()
    for key in ("version", "seed", "batch_size", "num_examples", "fingerprint", "config"):
      if state.get(key) != mine[key]:
        raise ValueError(
          f"state {key}={state.get(key)!r} does not match this iterator's {mine[key]!r}"
        )
    if not isinstance(state["step"], int) or state["step"] < 0:
      raise ValueError(f"state step={state['step']!r} must be a non-negative integer")
    self._step = state["step"]

  @classmethod
  def restore(
    cls, corpus: TokenizedCorpus, state: dict, *, shard_index: int = 0, num_shards: int = 1
  ) -> PretrainingIterator:
    """A new iterator positioned at a saved `state` (config, seed and batch size from it)."""
    config = PretrainingConfig(**state["config"])
    it = cls(
      corpus,
      config,
      batch_size=state["batch_size"],
      seed=state["seed"],
      shard_index=shard_index,
      num_shards=num_shards,
    )
    it.set_state(state)
    return it


class WordOrderIterator(PretrainingIterator):
  """A `PretrainingIterator` that also shuffles trigrams (StructBERT's word objective).

  After masking, row r of batch k shuffles trigrams of unmasked tokens with a generator
  seeded by (seed, k, r) (`shuffle_trigrams`), and adds ``word_order_positions`` int32
  (b, Q), ``word_order_ids`` int32 (b, Q) (the original ids there) and
  ``word_order_weights`` float32 (b, Q), ``Q = 3 * ceil(word_order_prob * max_seq_len / 3)``.
  """

  def __init__(
    self,
    corpus: TokenizedCorpus,
    config: PretrainingConfig,
    *,
    word_order_prob: float = 0.05,
    **kwargs,
  ):
    """As `PretrainingIterator`, plus ``word_order_prob`` (fraction of tokens shuffled)."""
    if not 0 < word_order_prob < 1:
      raise ValueError(f"{word_order_prob=} must be in (0, 1)")
    super().__init__(corpus, config, **kwargs)
    self.word_order_prob = float(word_order_prob)

  @property
  def num_word_order_slots(self) -> int:
    """Q, the width of the word-order fields (a multiple of 3)."""
    return 3 * math.ceil(self.word_order_prob * self.config.max_seq_len / 3)

  def batch(self, step: int) -> dict[str, np.ndarray]:
    """The masked, trigram-shuffled batch at a global step."""
    out = super().batch(step)
    ids, q = out["input_ids"].copy(), self.num_word_order_slots
    b = ids.shape[0]
    _, rows = self.example_indices(step)
    masked = np.zeros(ids.shape, bool)
    np.put_along_axis(masked, out["mlm_positions"], out["mlm_weights"] > 0, 1)
    masked[:, 0] = False  # padding slots point at 0, which is never masked
    eligible = (out["attention_mask"] == 1) & ~np.isin(ids, self._special) & ~masked
    positions = np.zeros((b, q), np.int32)
    originals = np.zeros((b, q), np.int32)
    weights = np.zeros((b, q), np.float32)
    for r in range(b):
      rng = seeded_rng(self.seed, WORD_ORDER_STREAM, step, rows[r])
      shuffled, pos = shuffle_trigrams(ids[r], eligible[r], self.word_order_prob, rng, q // 3)
      positions[r, : pos.shape[0]] = pos
      originals[r, : pos.shape[0]] = ids[r, pos]
      weights[r, : pos.shape[0]] = 1.0
      ids[r] = shuffled
    out.update(
      input_ids=ids,
      word_order_positions=positions,
      word_order_ids=originals,
      word_order_weights=weights,
    )
    return out

  def state(self) -> dict:
    """As `PretrainingIterator.state`, with ``word_order_prob``."""
    return {**super().state(), "word_order_prob": self.word_order_prob}

  def set_state(self, state: dict) -> None:
    """As `PretrainingIterator.set_state`; the word-order probability must match too."""
    if state.get("word_order_prob") != self.word_order_prob:
      raise ValueError(
        f"state word_order_prob={state.get('word_order_prob')!r} does not match "
        f"this iterator's {self.word_order_prob!r}"
      )
    super().set_state(state)
