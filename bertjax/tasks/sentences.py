"""The project's own labelled sentences (`bertjax/resources/sentences.tsv`): `Sentence`, its
loader `load_sentences`, `builtin_text` (the report's description of them) and
`labelled_sentences` (them as a padded classification data set)."""

from __future__ import annotations

import csv
import dataclasses
import importlib.resources
import os
import pathlib
from collections.abc import Sequence

SENTENCE_COLUMNS = ("sentence", "negated", "question", "phenomenon")

ABOUT = (
  "A few hundred English sentences written for this project: "
  "declaratives, questions (including negated ones), negation, long-distance "
  "subject-verb agreement across prepositional phrases and relative clauses, "
  "punctuation-heavy sentences, relative clauses, coordination, passives, "
  "conditionals, comparatives, indirect questions and imperatives."
)


@dataclasses.dataclass(frozen=True)
class Sentence:
  """One labelled sentence of the project's own set."""

  text: str
  negated: int
  question: int
  phenomenon: str


def sentences_path() -> pathlib.Path:
  """The project's own labelled sentences (`bertjax/resources/sentences.tsv`)."""
  return pathlib.Path(str(importlib.resources.files("bertjax") / "resources" / "sentences.tsv"))


def load_sentences(path: str | os.PathLike | None = None) -> list[Sentence]:
  """Reads a sentences TSV with the columns of `SENTENCE_COLUMNS`.

  Raises:
    ValueError: naming the line, for a missing column, a label outside {0, 1}
      or an empty sentence.
  """
  path = pathlib.Path(path) if path is not None else sentences_path()
  with open(path, newline="", encoding="utf-8") as f:
    reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
    missing = set(SENTENCE_COLUMNS) - set(reader.fieldnames or ())
    if missing:
      raise ValueError(f"{path} lacks the columns {sorted(missing)}; header is {reader.fieldnames}")
    out = []
    for line, row in enumerate(reader, start=2):
      text = (row["sentence"] or "").strip()
      if not text:
        raise ValueError(f"{path}:{line}: empty sentence")
      flags = {}
      for name in ("negated", "question"):
        if row[name] not in ("0", "1"):
          raise ValueError(f"{path}:{line}: {name}={row[name]!r} must be 0 or 1")
        flags[name] = int(row[name])
      out.append(Sentence(text, flags["negated"], flags["question"], row["phenomenon"].strip()))
  if not out:
    raise ValueError(f"{path} has no sentences")
  return out


def builtin_text(sentences: Sequence[Sentence]) -> dict:
  """The report's text section for the project's own sentences.

  Args:
    sentences: the sentences the report reads (a spread of the file's).

  Returns:
    The section's fields: `source`, `num_sentences`, `phenomena` (phenomenon ->
    [sentences, negated, questions]), `description` and `about`.
  """
  phenomena: dict[str, list[int]] = {}
  for s in sentences:
    row = phenomena.setdefault(s.phenomenon, [0, 0, 0])
    row[0] += 1
    row[1] += s.negated
    row[2] += s.question
  return {
    "source": "builtin",
    "num_sentences": len(sentences),
    "phenomena": phenomena,
    "description": f"{len(sentences)} of the project's own sentences "
    "(bertjax/resources/sentences.tsv)",
    "about": ABOUT,
  }


def labelled_sentences(tokenizer, field: str, *, max_len: int, limit: int | None = None) -> dict:
  """The project's sentences as a classification data set: padded "input_ids",
  "attention_mask", "token_type_ids" and "labels", the sentence's `field` ("negated" or
  "question", 0/1). `limit` takes that many sentences spread evenly over the file (which is
  grouped by kind, so both labels stay in)."""
  import numpy as np

  from bertjax.training import finetune as ft

  if field not in ("negated", "question"):
    raise ValueError(f"field={field!r} not understood: expected 'negated' or 'question'")
  sentences = load_sentences()
  if limit is not None:
    sentences = [sentences[i] for i in np.linspace(0, len(sentences) - 1, limit).astype(int)]
  labels = np.asarray([getattr(s, field) for s in sentences], np.int32)
  return ft.encode_classification(
    tokenizer, [s.text for s in sentences], None, labels, max_len=max_len
  )
