"""Texts as length-sorted, padded batches, and an even spread of indices.

What the report, the tasks and the experiments feed the analyses: `batches` sorts the texts
by length and pads each batch to a multiple of 8 tokens, so a run compiles a few shapes
however many sentence lengths it reads; `fitting` picks the sentences a model reads whole.
"""

from __future__ import annotations

import numpy as np

import bertjax


def spread(n: int, k: int | None) -> np.ndarray:
  """`k` indices spread evenly over `range(n)` (all of them when k is None or >= n)."""
  if k is None or k >= n:
    return np.arange(n)
  return np.unique(np.linspace(0, n - 1, k).round().astype(int))


def _round_up(x: int, m: int) -> int:
  return -(-x // m) * m


def batches(
  tok: bertjax.Tokenizer,
  texts=None,
  words=None,
  pairs=None,
  *,
  batch_size: int,
  max_length: int,
  extra: dict[str, np.ndarray] | None = None,
  truncation: bool = False,
):
  """Length-sorted padded batches: a list of `(indices, batch dict)`.

  Give `texts` (with optional `pairs`) or `words` (pre-split). Padded lengths
  are multiples of 8, so few shapes compile. `extra` arrays (n, ...) are sliced
  into each batch (e.g. labels). `truncation` cuts longer inputs to `max_length`
  (as transformers' `truncation=True`) instead of refusing them.
  """
  items = texts if texts is not None else words

  def encode(idx, pad_to=None) -> bertjax.Batch:
    if texts is None:
      return tok.encode_words(
        [words[i] for i in idx], max_length=max_length, pad_to=pad_to, truncation=truncation
      )
    second = None if pairs is None else [pairs[i] for i in idx]
    return tok.encode(
      [texts[i] for i in idx], second, max_length=max_length, pad_to=pad_to, truncation=truncation
    )

  lengths = encode(range(len(items))).attention_mask.sum(-1)
  order = np.argsort(lengths, kind="stable")
  out = []
  for start in range(0, len(order), batch_size):
    idx = np.sort(order[start : start + batch_size])
    width = min(_round_up(int(lengths[idx].max()), 8), max_length)
    b = encode(idx, pad_to=width)
    batch = {
      "input_ids": b.input_ids,
      "attention_mask": b.attention_mask,
      "token_type_ids": b.token_type_ids,
      "word_ids": b.word_ids,
    }
    for name, values in (extra or {}).items():
      batch[name] = np.asarray(values)[idx]
    out.append((idx, batch))
  return out


def window_batches(
  tok: bertjax.Tokenizer,
  texts,
  *,
  max_length: int,
  batch_size: int,
  limit: int | None = None,
) -> list[dict]:
  """Long texts (paragraphs) cut into windows of at most `max_length` tokens, special tokens
  included (`Tokenizer.encode_windows`, no overlap), the first `limit` windows (all when None)
  in batches of `batch_size`, each padded to its longest window."""
  windows = tok.encode_windows(list(texts), max_length=max_length).batch
  n = len(windows.input_ids) if limit is None else min(limit, len(windows.input_ids))
  out = []
  for start in range(0, n, batch_size):
    part = slice(start, min(start + batch_size, n))
    width = int(windows.attention_mask[part].sum(-1).max())
    out.append(
      {
        k: np.asarray(getattr(windows, k)[part, :width])
        for k in ("input_ids", "attention_mask", "token_type_ids")
      }
    )
  return out


def plain(batch: dict) -> dict:
  """The model inputs (and labels) of a batch, without `word_ids`."""
  return {k: v for k, v in batch.items() if k != "word_ids"}


def fitting(tok: bertjax.Tokenizer, words, max_tokens: int) -> np.ndarray:
  """The indices of the sentences (each a list of words, as UD's) that the model reads whole:
  at most `max_tokens` tokens, [CLS] and [SEP] included. Longer ones are left out, not cut."""
  if not len(words):
    return np.zeros(0, int)
  lengths = tok.encode_words(words, truncation=False, max_length=10**6).attention_mask.sum(-1)
  return np.flatnonzero(lengths <= max_tokens)


def first_fitting(tok: bertjax.Tokenizer, words, count: int, length: int):
  """The first `count` sentences (word lists) that the model reads whole in `length` tokens
  (`fitting`), padded to `length`: one batch of a fixed shape, e.g. for timing a forward.

  Returns:
    The tokenizer's batch (`input_ids`, `attention_mask`, ...), each (count, length).

  Raises:
    ValueError: fewer than `count` sentences fit, naming both numbers.
  """
  fit = fitting(tok, words, length)
  if len(fit) < count:
    raise ValueError(f"only {len(fit)} sentences fit in {length} tokens; {count} are needed")
  return tok.encode_words([words[i] for i in fit[:count]], pad_to=length)


def fitting_batches(tok: bertjax.Tokenizer, words, *, batch_size: int, max_tokens: int):
  """`batches` of the sentences (word lists) that the model reads whole (`fitting`): a list of
  `(indices into words, batch dict)`; longer sentences are left out, not cut."""
  keep = fitting(tok, words, max_tokens)
  kept = [words[i] for i in keep]
  return [
    (keep[idx], b)
    for idx, b in batches(tok, words=kept, batch_size=batch_size, max_length=max_tokens)
  ]
