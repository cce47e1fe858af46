"""Passages of consecutive sentences: what effective attention and long-range analyses read.

Three kinds: `wikitext_paragraphs` (WikiText's paragraphs, headings left out), `joined` texts of about a target length (whole sentences, tokenised later, as the
report's section 8 reads them), and `fixed_length` id arrays of exactly `length` tokens
([CLS], consecutive sentences' word pieces cut to fit, [SEP]), as
`experiments/effective_attention.py` sweeps the sequence length.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def joined(sentences: Sequence[str], tok, target: int, count: int) -> list[str]:
  """Consecutive sentences joined by spaces into up to `count` passages of at least `target`
  tokens ([CLS] and [SEP] counted) each; a last, shorter passage holds what is left when the
  sentences run out first."""
  if target < 3 or count < 1:
    raise ValueError(f"target={target} must be >= 3 and count={count} >= 1")
  lengths = tok.encode(list(sentences)).attention_mask.sum(-1) - 2
  out, current, size = [], [], 2
  for text, n in zip(sentences, lengths):
    current.append(text)
    size += int(n)
    if size >= target:
      out.append(" ".join(current))
      current, size = [], 2
      if len(out) == count:
        break
  if current and len(out) < count:
    out.append(" ".join(current))
  return out


def sentence_pieces(tok, words: Sequence[Sequence[str]], batch: int = 256) -> list[np.ndarray]:
  """Each sentence's word-piece ids (given its words), without [CLS] and [SEP]."""
  out = []
  for start in range(0, len(words), batch):
    enc = tok.encode_words([list(w) for w in words[start : start + batch]])
    for ids, mask in zip(enc.input_ids, enc.attention_mask):
      out.append(np.asarray(ids[1 : int(mask.sum()) - 1], np.int32))
  return out


def fixed_length(
  pieces: Sequence[np.ndarray], length: int, count: int, cls_id: int, sep_id: int, seed: int = 0
) -> np.ndarray:
  """`count` passages of exactly `length` tokens: [CLS], consecutive sentences, [SEP].

  Each starts at a random sentence (seeded) and takes the sentences that follow (wrapping
  around at the end) until `length - 2` word pieces are filled; the last one is cut.

  Args:
    pieces: each sentence's word-piece ids (`sentence_pieces`).
    length: tokens per passage, [CLS] and [SEP] included (>= 3).
    count: passages.
    cls_id, sep_id: the special tokens' ids.
    seed: where the passages start.

  Returns:
    (count, length) int32 ids.
  """
  if length < 3:
    raise ValueError(f"{length=} must be >= 3 ([CLS], a token, [SEP])")
  total = sum(len(s) for s in pieces)
  if total < length:
    raise ValueError(f"the sentences hold {total} tokens, fewer than {length=}")
  rng = np.random.default_rng(seed)
  out = np.empty((count, length), np.int32)
  for c in range(count):
    i, body, filled = int(rng.integers(len(pieces))), [], 0
    while filled < length - 2:
      body.append(pieces[i % len(pieces)])
      filled += len(body[-1])
      i += 1
    out[c] = np.concatenate([[cls_id], np.concatenate(body)[: length - 2], [sep_id]])
  return out


def wikitext_paragraphs(path, count: int | None = None, min_words: int = 13) -> list[str]:
  """The paragraphs (lines) of a WikiText file with at least `min_words` words, headings
  (" = Title = ") left out, in file order; the first `count` of them when given."""
  with open(path, encoding="utf-8") as f:
    lines = [ln.strip() for ln in f]
  kept = [ln for ln in lines if len(ln.split()) >= min_words and not ln.startswith("=")]
  return kept[:count] if count else kept
