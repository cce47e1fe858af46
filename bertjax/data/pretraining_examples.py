"""Pretraining examples (NSP, SOP, full sentences) built from a corpus, and their config.

Examples are built once from a `TokenizedCorpus` and a seed, following Google's
``create_pretraining_data.py``: a document is cut into chunks of whole sentences
up to a target length (the full length, or with probability ``short_seq_prob`` a
random shorter one); each chunk is split at a random sentence boundary into
segments A and B. An example stores only the token ranges of its segments, not
the tokens. Objectives:

* ``"nsp"`` (BERT): with probability 1/2, B is replaced by text from a random
  sentence of another document (label 1 = random, 0 = is next, as Hugging Face's
  ``next_sentence_label``); the sentences not used go back into the document.
* ``"sop"`` (ALBERT): with probability 1/2, A and B swap places (label 1 =
  swapped).
* ``"none"`` (RoBERTa's FULL-SENTENCES): one segment of whole sentences packed up
  to the target length, crossing document boundaries with an extra ``[SEP]``
  between documents.

A chunk of a single sentence is split inside that sentence (at a random word
boundary), so that both labels stay equally likely (Google's script forces
"random" there); corpora of one-sentence documents are better read with
``format="lines"`` or as larger documents.
Pairs are truncated to ``max_seq_len - 3`` tokens by removing tokens, one at a
time, from the front or back (coin flip) of the longer segment.

`PretrainingConfig` holds these settings and the masking ones that
`bertjax.data.pretraining` applies when it draws batches; that module re-exports every
public name here.
"""

from __future__ import annotations

import dataclasses
import math
import zlib

import numpy as np

from bertjax.data.corpus import TokenizedCorpus

OBJECTIVES = ("nsp", "sop", "none")
MASKINGS = ("token", "whole_word", "span")
LABEL_KEYS = {"nsp": "next_sentence_labels", "sop": "sop_labels"}

# Stream tags for np.random.SeedSequence, so that each use gets independent numbers.
BUILD_STREAM, SHUFFLE_STREAM, MASK_STREAM, WORD_ORDER_STREAM = 0, 1, 2, 3


def seeded_rng(*keys: int) -> np.random.Generator:
  """A generator seeded by the keys (seed, stream, then e.g. step and row): the same keys give
  the same numbers on every host, and different streams independent ones."""
  return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(k) for k in keys])))


@dataclasses.dataclass(frozen=True)
class PretrainingConfig:
  """How examples are built and masked.

  Attributes:
    max_seq_len: tokens per sequence, ``[CLS]`` and ``[SEP]`` included.
    objective: ``"nsp"``, ``"sop"`` or ``"none"`` (see the module docstring).
    short_seq_prob: probability that an example targets a random shorter length.
    masking: ``"token"``, ``"whole_word"`` or ``"span"``.
    mask_prob: fraction of the maskable tokens of each sequence that is selected.
    mask_token_prob: fraction of the selected tokens replaced by ``[MASK]``.
    random_token_prob: fraction replaced by a random token; the rest stay unchanged.
    max_predictions_per_seq: P, the width of ``mlm_positions``; None means
      ``ceil(mask_prob * max_seq_len)``, which the per-sequence count never exceeds.
    span_p: the geometric parameter of span lengths (in words).
    max_span_len: the longest span, in words.
  """

  max_seq_len: int = 128
  objective: str = "nsp"
  short_seq_prob: float = 0.1
  masking: str = "token"
  mask_prob: float = 0.15
  mask_token_prob: float = 0.8
  random_token_prob: float = 0.1
  max_predictions_per_seq: int | None = None
  span_p: float = 0.2
  max_span_len: int = 10

  def __post_init__(self):
    if self.objective not in OBJECTIVES:
      raise ValueError(f"{self.objective=} must be one of {OBJECTIVES}")
    if self.masking not in MASKINGS:
      raise ValueError(f"{self.masking=} must be one of {MASKINGS}")
    min_len = 3 if self.objective == "none" else 5
    if self.max_seq_len < min_len:
      raise ValueError(f"{self.max_seq_len=} must be >= {min_len} for {self.objective=}")
    if not 0 < self.mask_prob < 1:
      raise ValueError(f"{self.mask_prob=} must be in (0, 1)")
    if not 0 <= self.short_seq_prob <= 1:
      raise ValueError(f"{self.short_seq_prob=} must be in [0, 1]")
    if not (
      self.mask_token_prob >= 0
      and self.random_token_prob >= 0
      and self.mask_token_prob + self.random_token_prob <= 1
    ):
      raise ValueError(
        f"{self.mask_token_prob=} and {self.random_token_prob=} must be >= 0 and sum to <= 1"
      )
    if self.max_predictions_per_seq is not None and self.max_predictions_per_seq < 1:
      raise ValueError(f"{self.max_predictions_per_seq=} must be >= 1")
    if not 0 < self.span_p <= 1:
      raise ValueError(f"{self.span_p=} must be in (0, 1]")
    if self.max_span_len < 1:
      raise ValueError(f"{self.max_span_len=} must be >= 1")

  @property
  def num_predictions(self) -> int:
    """P, the number of prediction slots per sequence."""
    if self.max_predictions_per_seq is not None:
      return self.max_predictions_per_seq
    return math.ceil(self.mask_prob * self.max_seq_len)

  def span_length_probs(self) -> np.ndarray:
    """(max_span_len,) probabilities of span lengths 1..max_span_len (truncated geometric)."""
    p = self.span_p * (1 - self.span_p) ** np.arange(self.max_span_len)
    return p / p.sum()


# ---------------------------------------------------------------------------
# Example building
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PretrainingExamples:
  """Examples as token ranges into a token stream.

  Attributes:
    segments: int64 (N, 4) ``[a_start, a_end, b_start, b_end)`` into ``ids``, in the
      order the segments appear in the sequence (B empty without a pair objective).
    labels: int32 (N,) NSP / SOP label; -1 without a pair objective.
    documents: int64 (N, 2) document index of segments A and B.
    ids: int32 the token stream: the corpus' ids (with a ``[SEP]`` between documents
      for ``objective="none"``).
    word_ids: int32 word ids aligned with ``ids`` (-1 at inserted separators).
    objective: the objective the examples were built for.
  """

  segments: np.ndarray
  labels: np.ndarray
  documents: np.ndarray
  ids: np.ndarray
  word_ids: np.ndarray
  objective: str

  def __len__(self) -> int:
    return int(self.segments.shape[0])

  def fingerprint(self) -> int:
    """A checksum of the example ranges, to check that a restored state fits."""
    return zlib.crc32(self.segments.tobytes()) ^ zlib.crc32(self.labels.tobytes())


def _target_length(rng: np.random.Generator, max_tokens: int, short_seq_prob: float) -> int:
  if max_tokens > 2 and rng.random() < short_seq_prob:
    return int(rng.integers(2, max_tokens + 1))
  return max_tokens


def _truncate_pair(a0, a1, b0, b1, max_tokens, rng):
  """Google's truncate_seq_pair on ranges: trims the longer segment, front or back."""
  while (a1 - a0) + (b1 - b0) > max_tokens:
    front = rng.random() < 0.5
    if a1 - a0 > b1 - b0:
      a0, a1 = (a0 + 1, a1) if front else (a0, a1 - 1)
    else:
      b0, b1 = (b0 + 1, b1) if front else (b0, b1 - 1)
  return a0, a1, b0, b1


def _inner_split(word_ids: np.ndarray, lo: int, hi: int, rng: np.random.Generator) -> int:
  """A random word start in (lo, hi), or a random token there if the text is one word."""
  starts = lo + 1 + np.flatnonzero(word_ids[lo + 1 : hi] != word_ids[lo : hi - 1])
  return int(rng.choice(starts)) if starts.shape[0] else int(rng.integers(lo + 1, hi))


def _pair_examples(corpus: TokenizedCorpus, config: PretrainingConfig, rng: np.random.Generator):
  """NSP / SOP examples, Google-style (see the module docstring)."""
  sent, docs = corpus.sentence_offsets, corpus.doc_offsets
  num_docs = corpus.num_documents
  if config.objective == "nsp" and num_docs < 2:
    raise ValueError(
      f"NSP needs at least 2 documents for random next segments; corpus has {num_docs}"
    )
  max_tokens = config.max_seq_len - 3
  words = corpus.word_ids
  rows, labels, doc_pairs = [], [], []
  for d in range(num_docs):
    s_lo, s_hi = int(docs[d]), int(docs[d + 1])
    target = _target_length(rng, max_tokens, config.short_seq_prob)
    start = s = s_lo
    while s < s_hi:
      if s == s_hi - 1 or sent[s + 1] - sent[start] >= target:
        n = s - start + 1
        lo, hi = int(sent[start]), int(sent[s + 1])
        if n >= 2 or hi - lo >= 2:
          a_sents = int(rng.integers(1, n)) if n >= 2 else 1
          # The A/B boundary: a sentence boundary, or a word boundary inside a lone sentence.
          split = int(sent[start + a_sents]) if n >= 2 else _inner_split(words, lo, hi, rng)
          label, d_b = 0, d
          if config.objective == "nsp" and rng.random() < 0.5:
            label = 1
            a0, a1 = lo, (split if n >= 2 else hi)
            target_b = max(1, target - (a1 - a0))
            d_b = int(rng.integers(num_docs - 1))
            d_b += d_b >= d
            r = int(rng.integers(docs[d_b], docs[d_b + 1]))
            r_end = r + 1
            while r_end < docs[d_b + 1] and sent[r_end] - sent[r] < target_b:
              r_end += 1
            b0, b1 = int(sent[r]), int(sent[r_end])
            if n >= 2:  # the sentences after A go back into the document
              s = start + a_sents - 1
          else:
            a0, a1, b0, b1 = lo, split, split, hi
            if config.objective == "sop" and rng.random() < 0.5:
              label = 1
              a0, a1, b0, b1 = b0, b1, a0, a1
          rows.append(_truncate_pair(a0, a1, b0, b1, max_tokens, rng))
          labels.append(label)
          doc_pairs.append((d, d_b))
        start = s + 1
        target = _target_length(rng, max_tokens, config.short_seq_prob)
      s += 1
  return rows, labels, doc_pairs


def _full_sentence_examples(corpus: TokenizedCorpus, config: PretrainingConfig, rng):
  """RoBERTa FULL-SENTENCES: whole sentences packed across documents, [SEP] between them."""
  sep = corpus.special_ids["[SEP]"]
  doc_tok = corpus.doc_token_offsets
  interior = doc_tok[1:-1]
  ids = np.insert(corpus.ids, interior, sep).astype(np.int32)
  word_ids = np.insert(corpus.word_ids, interior, -1).astype(np.int32)
  # Sentence starts in stream coordinates; a separator ends its document's last piece.
  cuts = corpus.sentence_offsets + np.searchsorted(interior, corpus.sentence_offsets, side="right")
  stream_doc_starts = doc_tok[:-1] + np.arange(len(doc_tok) - 1)
  max_tokens = config.max_seq_len - 2
  total = int(ids.shape[0])
  rows, start = [], 0
  while start < total:
    target = _target_length(rng, max_tokens, config.short_seq_prob)
    j = np.searchsorted(cuts, start + target, side="right") - 1
    end = int(cuts[j]) if cuts[j] > start else min(start + target, total)
    rows.append((start, end, end, end))
    start = end
  rows_arr = np.asarray(rows, np.int64).reshape(-1, 4)
  doc_a = np.searchsorted(stream_doc_starts, rows_arr[:, 0], side="right") - 1
  doc_b = np.searchsorted(stream_doc_starts, rows_arr[:, 1] - 1, side="right") - 1
  return rows_arr, np.stack([doc_a, doc_b], 1), ids, word_ids


def build_examples(
  corpus: TokenizedCorpus, config: PretrainingConfig, seed: int
) -> PretrainingExamples:
  """Builds the pretraining examples of a corpus, deterministically from a seed.

  Args:
    corpus: a tokenized corpus.
    config: the objective, ``max_seq_len`` and ``short_seq_prob`` matter here.
    seed: a non-negative integer.

  Returns:
    The examples, in corpus order.
  """
  if corpus.num_tokens == 0:
    raise ValueError("corpus has no tokens")
  rng = seeded_rng(seed, BUILD_STREAM)
  if config.objective == "none":
    rows, docs, ids, word_ids = _full_sentence_examples(corpus, config, rng)
    labels = np.full(len(rows), -1, np.int32)
  else:
    rows, labels, docs = _pair_examples(corpus, config, rng)
    rows = np.asarray(rows, np.int64).reshape(-1, 4)
    labels = np.asarray(labels, np.int32)
    docs = np.asarray(docs, np.int64).reshape(-1, 2)
    ids, word_ids = corpus.ids, corpus.word_ids
  return PretrainingExamples(rows, labels, docs, ids, word_ids, config.objective)
