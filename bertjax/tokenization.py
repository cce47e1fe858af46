"""A thin wrapper over the `tokenizers` library with word <-> subword alignment.

BERT: WordPiece from `tokenizer.json` or `vocab.txt`. ALBERT: SentencePiece
(`spiece.model`) or its `tokenizer.json`. Batches come back as NumPy arrays,
with `word_ids` (batch, seq): the index of the word each subword belongs to,
-1 for special tokens and padding.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class Batch:
  """A tokenised, padded batch."""

  input_ids: np.ndarray  # (B, T) int32
  attention_mask: np.ndarray  # (B, T) int32
  token_type_ids: np.ndarray  # (B, T) int32
  word_ids: np.ndarray  # (B, T) int32; -1 for special tokens and padding

  def word_spans(self, b: int) -> list[tuple[int, int]]:
    """For sequence `b`, the [start, end) subword positions of each word, in word order."""
    ids = self.word_ids[b]
    n_words = int(ids.max()) + 1 if (ids >= 0).any() else 0
    spans = []
    for w in range(n_words):
      where = np.flatnonzero(ids == w)
      spans.append((int(where[0]), int(where[-1]) + 1) if where.size else (-1, -1))
    return spans

  def first_subword(self) -> np.ndarray:
    """(B, W) position of each word's first subword, -1 where the word is absent (padding)."""
    batch, _ = self.word_ids.shape
    n_words = int(self.word_ids.max()) + 1 if (self.word_ids >= 0).any() else 0
    out = np.full((batch, n_words), -1, np.int32)
    for b in range(batch):
      for t, w in enumerate(self.word_ids[b]):
        if w >= 0 and out[b, w] < 0:
          out[b, w] = t
    return out


class Tokenizer:
  """Tokenises text or pre-split words into padded NumPy batches."""

  def __init__(self, tokenizer, model_max_length: int = 512):
    self.tokenizer = tokenizer
    self.model_max_length = model_max_length
    vocab = tokenizer.get_vocab()

    def find(*names):
      for n in names:
        if n in vocab:
          return vocab[n]
      return None

    self.pad_id = find("[PAD]", "<pad>")
    self.cls_id = find("[CLS]")
    self.sep_id = find("[SEP]")
    self.mask_id = find("[MASK]")
    self.unk_id = find("[UNK]", "<unk>")
    if self.pad_id is None:
      raise ValueError("tokenizer has no padding token ([PAD] or <pad>)")
    self.special_ids = frozenset(i for i in (self.pad_id, self.cls_id, self.sep_id, self.mask_id)
                                 if i is not None)

  @property
  def vocab_size(self) -> int:
    return self.tokenizer.get_vocab_size()

  @classmethod
  def from_pretrained(cls, path: str | pathlib.Path) -> Tokenizer:
    """Loads `tokenizer.json`, else `vocab.txt` (WordPiece), else `spiece.model` (SentencePiece)."""
    import tokenizers

    path = pathlib.Path(path)
    settings = {}
    if (path / "tokenizer_config.json").exists():
      settings = json.loads((path / "tokenizer_config.json").read_text())
    max_len = settings.get("model_max_length", 512)
    max_len = max_len if isinstance(max_len, int) and max_len < 100_000 else 512
    if (path / "tokenizer.json").exists():
      tok = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    elif (path / "vocab.txt").exists():
      from tokenizers.implementations import BertWordPieceTokenizer

      tok = BertWordPieceTokenizer(str(path / "vocab.txt"),
                                   lowercase=settings.get("do_lower_case", True))._tokenizer
    elif (path / "spiece.model").exists():
      tok = _sentencepiece_tokenizer(path)
    else:
      raise FileNotFoundError(f"no tokenizer.json, vocab.txt or spiece.model in {path}")
    tok.no_padding()
    tok.no_truncation()
    return cls(tok, max_len)

  def encode(self, texts: Sequence[str], pairs: Sequence[str] | None = None, *,
             max_length: int | None = None, pad_to: int | None = None) -> Batch:
    """Tokenises sentences (or sentence pairs) with [CLS]/[SEP], padded to the longest (or `pad_to`)."""
    if isinstance(texts, str):
      raise TypeError("encode takes a list of strings; wrap a single sentence in a list")
    inputs = list(texts) if pairs is None else list(zip(texts, pairs))
    return self._batch(self.tokenizer.encode_batch(inputs), max_length, pad_to)

  def encode_words(self, sentences: Sequence[Sequence[str]], *, max_length: int | None = None,
                   pad_to: int | None = None) -> Batch:
    """Tokenises pre-split words (e.g. UD tokens); `word_ids` index those words."""
    encodings = self.tokenizer.encode_batch([list(s) for s in sentences], is_pretokenized=True)
    return self._batch(encodings, max_length, pad_to)

  def _batch(self, encodings, max_length: int | None, pad_to: int | None) -> Batch:
    max_length = max_length or self.model_max_length
    longest = max((len(e.ids) for e in encodings), default=0)
    if longest > max_length:
      raise ValueError(f"a sequence has {longest} tokens; max_length={max_length} "
                       "(truncate the text or raise max_length)")
    width = pad_to or longest
    if width < longest:
      raise ValueError(f"{pad_to=} is shorter than the longest sequence ({longest} tokens)")
    batch = len(encodings)
    ids = np.full((batch, width), self.pad_id, np.int32)
    mask = np.zeros((batch, width), np.int32)
    types = np.zeros((batch, width), np.int32)
    words = np.full((batch, width), -1, np.int32)
    for b, e in enumerate(encodings):
      n = len(e.ids)
      ids[b, :n] = e.ids
      mask[b, :n] = 1
      types[b, :n] = e.type_ids
      words[b, :n] = [-1 if w is None else w for w in e.word_ids]
      # Special tokens carry no word (some tokenizers give them the word id of a neighbour).
      special = np.asarray(e.special_tokens_mask, bool)
      words[b, :n][special] = -1
    return Batch(ids, mask, types, words)

  def decode(self, ids: Sequence[int]) -> str:
    return self.tokenizer.decode(list(map(int, ids)))

  def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
    return [self.tokenizer.id_to_token(int(i)) for i in ids]

  def convert_tokens_to_ids(self, tokens: Sequence[str]) -> list[int]:
    out = []
    for t in tokens:
      i = self.tokenizer.token_to_id(t)
      if i is None:
        raise ValueError(f"token {t!r} is not in the vocabulary")
      out.append(i)
    return out


def _sentencepiece_tokenizer(directory: pathlib.Path):
  """ALBERT's SentencePiece model as a `tokenizers.Tokenizer`.

  The conversion (normaliser, Metaspace pre-tokeniser, [CLS] A [SEP] B [SEP]
  template) is the one transformers applies, so ids match `AlbertTokenizer`.
  """
  try:
    import transformers
  except ImportError as e:
    raise ImportError("reading spiece.model needs transformers (pip install 'bertjax[hf]')") from e
  return transformers.AlbertTokenizer.from_pretrained(str(directory)).backend_tokenizer
