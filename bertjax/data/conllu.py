"""CoNLL-U reader for Universal Dependencies treebanks.

A sentence keeps its *syntactic words* (the integer-id lines) as parallel tuples,
the multi-word surface tokens (``1-2`` lines, e.g. "don't" -> "do" + "n't") as
spans over those words, and only a count of the empty nodes (``8.1`` lines), which
belong to the enhanced graph and never to the basic tree.

Counting follows the UD ``stats.xml`` files: ``words`` are the syntactic words,
``tokens`` the surface tokens (a multi-word token counts once, the words it
covers do not count as tokens), ``fused`` the number of multi-word tokens.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

FIELDS = ("forms", "lemmas", "upos", "xpos", "deprels")


@dataclasses.dataclass(frozen=True)
class MultiwordToken:
  """A surface token covering syntactic words ``start..end`` (1-based, inclusive)."""

  start: int
  end: int
  form: str
  misc: str = "_"


@dataclasses.dataclass(frozen=True)
class Sentence:
  """One UD sentence; word-level fields are parallel tuples of length ``num_words``.

  Attributes:
    sent_id: the ``# sent_id`` comment, or None.
    text: the ``# text`` comment, or None.
    forms, lemmas, upos, xpos, feats, deprels, misc: per-word CoNLL-U columns.
    heads: per-word head id, 1-based, 0 for the root.
    multiword: the multi-word tokens of the sentence.
    num_empty: how many empty nodes (``n.m`` lines) were skipped.
    metadata: every ``# key = value`` comment.
  """

  sent_id: str | None
  text: str | None
  forms: tuple[str, ...]
  lemmas: tuple[str, ...]
  upos: tuple[str, ...]
  xpos: tuple[str, ...]
  feats: tuple[str, ...]
  heads: tuple[int, ...]
  deprels: tuple[str, ...]
  misc: tuple[str, ...]
  multiword: tuple[MultiwordToken, ...] = ()
  num_empty: int = 0
  metadata: tuple[tuple[str, str], ...] = ()

  @property
  def num_words(self) -> int:
    """Syntactic words (multi-word tokens split, empty nodes left out)."""
    return len(self.forms)

  @property
  def num_tokens(self) -> int:
    """Surface tokens: multi-word tokens count once, the words they cover not at all."""
    covered = sum(m.end - m.start + 1 for m in self.multiword)
    return self.num_words - covered + len(self.multiword)

  @property
  def num_fused(self) -> int:
    """Multi-word tokens (e.g. "don't" for "do" + "n't")."""
    return len(self.multiword)

  def heads_array(self) -> np.ndarray:
    """Heads as an int array ``(num_words,)``, 1-based, 0 for the root."""
    return np.asarray(self.heads, dtype=np.int32)

  def surface_tokens(self) -> list[tuple[str, int, int]]:
    """Surface tokens in order as ``(form, first_word, last_word)``, 0-based inclusive."""
    starts = {m.start: m for m in self.multiword}
    out, i = [], 1
    while i <= self.num_words:
      if i in starts:
        m = starts[i]
        out.append((m.form, m.start - 1, m.end - 1))
        i = m.end + 1
      else:
        out.append((self.forms[i - 1], i - 1, i - 1))
        i += 1
    return out


def _parse_block(lines: Sequence[tuple[int, str]], source: str) -> Sentence:
  """Builds one Sentence from its (line number, text) lines."""
  meta: list[tuple[str, str]] = []
  cols: dict[str, list] = {
    k: [] for k in ("forms", "lemmas", "upos", "xpos", "feats", "heads", "deprels", "misc")
  }
  multiword: list[MultiwordToken] = []
  num_empty = 0
  for lineno, line in lines:
    if line.startswith("#"):
      body = line[1:].strip()
      if "=" in body:
        key, value = body.split("=", 1)
        meta.append((key.strip(), value.strip()))
      continue
    parts = line.split("\t")
    if len(parts) != 10:
      raise ValueError(
        f"{source}:{lineno}: expected 10 tab-separated columns, got {len(parts)} in {line!r}"
      )
    wid = parts[0]
    if "-" in wid:
      start, end = (int(x) for x in wid.split("-"))
      if end < start:
        raise ValueError(f"{source}:{lineno}: multi-word token range {wid=} is reversed")
      multiword.append(MultiwordToken(start, end, parts[1], parts[9]))
      continue
    if "." in wid:
      num_empty += 1
      continue
    if int(wid) != len(cols["forms"]) + 1:
      raise ValueError(
        f"{source}:{lineno}: word id {wid=} out of sequence (expected {len(cols['forms']) + 1})"
      )
    try:
      head = int(parts[6])
    except ValueError:
      raise ValueError(
        f"{source}:{lineno}: head {parts[6]!r} of word {wid} is not an integer"
      ) from None
    cols["forms"].append(parts[1])
    cols["lemmas"].append(parts[2])
    cols["upos"].append(parts[3])
    cols["xpos"].append(parts[4])
    cols["feats"].append(parts[5])
    cols["heads"].append(head)
    cols["deprels"].append(parts[7])
    cols["misc"].append(parts[9])
  n = len(cols["forms"])
  bad = [h for h in cols["heads"] if not 0 <= h <= n]
  if bad:
    raise ValueError(
      f"{source}: sentence ending at line {lines[-1][0]} has heads {bad} outside [0, {n}]"
    )
  for m in multiword:
    if m.end > n:
      raise ValueError(f"{source}: multi-word token {m.start}-{m.end} exceeds {n} words")
  md = dict(meta)
  return Sentence(
    sent_id=md.get("sent_id"),
    text=md.get("text"),
    **{k: tuple(v) for k, v in cols.items()},
    multiword=tuple(multiword),
    num_empty=num_empty,
    metadata=tuple(meta),
  )


def iter_conllu(lines: Iterable[str], source: str = "<string>") -> Iterator[Sentence]:
  """Yields sentences from CoNLL-U lines (blank lines separate sentences).

  Args:
    lines: the lines of a CoNLL-U document, with or without trailing newlines.
    source: a name for error messages.

  Yields:
    One ``Sentence`` per block that has at least one word line.
  """
  block: list[tuple[int, str]] = []
  for lineno, raw in enumerate(lines, start=1):
    line = raw.rstrip("\r\n")
    if line.strip():
      block.append((lineno, line))
      continue
    if any(not text.startswith("#") for _, text in block):
      yield _parse_block(block, source)
    block = []
  if any(not text.startswith("#") for _, text in block):
    yield _parse_block(block, source)


def parse_conllu(text: str) -> list[Sentence]:
  """Parses a CoNLL-U document held in a string."""
  return list(iter_conllu(text.splitlines()))


def read_conllu(path: str | os.PathLike, max_sentences: int | None = None) -> list[Sentence]:
  """Reads a CoNLL-U file.

  Args:
    path: the ``.conllu`` file.
    max_sentences: stop after this many sentences (None reads all).

  Returns:
    The sentences in file order.
  """
  if max_sentences is not None and max_sentences < 0:
    raise ValueError(f"{max_sentences=} must be >= 0 or None")
  out: list[Sentence] = []
  with open(path, encoding="utf-8") as f:
    for sent in iter_conllu(f, source=os.fspath(path)):
      if max_sentences is not None and len(out) >= max_sentences:
        break
      out.append(sent)
  return out


def corpus_stats(sentences: Sequence[Sentence]) -> dict[str, int]:
  """Counts as in UD ``stats.xml``: sentences, tokens, words, fused, plus empty nodes."""
  return {
    "sentences": len(sentences),
    "tokens": sum(s.num_tokens for s in sentences),
    "words": sum(s.num_words for s in sentences),
    "fused": sum(s.num_fused for s in sentences),
    "empty": sum(s.num_empty for s in sentences),
  }


def base_deprel(rel: str) -> str:
  """The universal relation without its language subtype: ``"nmod:poss"`` -> ``"nmod"``."""
  return rel.split(":", 1)[0]


@dataclasses.dataclass(frozen=True)
class LabelVocab:
  """A label <-> id mapping, ids ordered by decreasing frequency then label."""

  labels: tuple[str, ...]
  counts: tuple[int, ...]

  @property
  def index(self) -> dict[str, int]:
    """Label -> id."""
    return {lab: i for i, lab in enumerate(self.labels)}

  def __len__(self) -> int:
    return len(self.labels)

  def encode(self, labels: Iterable[str], unknown: int | None = None) -> np.ndarray:
    """Maps labels to int ids; an unseen label raises unless ``unknown`` is given."""
    index = self.index
    out = []
    for lab in labels:
      if lab in index:
        out.append(index[lab])
      elif unknown is not None:
        out.append(unknown)
      else:
        raise KeyError(f"label {lab!r} not in vocabulary of {len(self)} labels")
    return np.asarray(out, dtype=np.int32)

  def decode(self, ids: Iterable[int]) -> list[str]:
    """Maps ids back to their labels."""
    return [self.labels[int(i)] for i in ids]


def _field_values(sent: Sentence, field: str, strip_subtypes: bool) -> Sequence[str]:
  if field not in FIELDS:
    raise ValueError(f"{field=} must be one of {FIELDS}")
  values = getattr(sent, field)
  if field == "deprels" and strip_subtypes:
    values = [base_deprel(v) for v in values]
  return values


def build_vocab(
  sentences: Iterable[Sentence],
  field: str = "upos",
  strip_subtypes: bool = False,
  min_count: int = 1,
) -> LabelVocab:
  """Builds a label vocabulary over one word-level field.

  Args:
    sentences: the sentences to count.
    field: one of ``"forms", "lemmas", "upos", "xpos", "deprels"``.
    strip_subtypes: for ``deprels``, map ``"nmod:poss"`` to ``"nmod"``.
    min_count: drop labels seen fewer times.

  Returns:
    A ``LabelVocab``.
  """
  if min_count < 1:
    raise ValueError(f"{min_count=} must be >= 1")
  counter: collections.Counter[str] = collections.Counter()
  for sent in sentences:
    counter.update(_field_values(sent, field, strip_subtypes))
  items = sorted(
    ((lab, c) for lab, c in counter.items() if c >= min_count), key=lambda kv: (-kv[1], kv[0])
  )
  return LabelVocab(tuple(k for k, _ in items), tuple(c for _, c in items))


def encode_field(
  sentences: Sequence[Sentence],
  vocab: LabelVocab,
  field: str = "upos",
  strip_subtypes: bool = False,
  unknown: int | None = None,
) -> np.ndarray:
  """All words' labels of one field, concatenated in corpus order: int ``(total_words,)``."""
  flat = [v for s in sentences for v in _field_values(s, field, strip_subtypes)]
  return vocab.encode(flat, unknown=unknown)


def word_offsets(sentences: Sequence[Sentence]) -> np.ndarray:
  """Index of each sentence's first word in the flat word array: ``(num_sentences + 1,)``."""
  return np.concatenate([[0], np.cumsum([s.num_words for s in sentences])]).astype(np.int64)
