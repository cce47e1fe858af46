"""Plain-text corpora for pretraining: files -> documents -> sentences -> WordPiece ids.

The pipeline has three stages, each a plain function so that any of them can be
replaced:

1. `read_documents` reads one or many text files into documents, each a list of
   sentences. Formats:
   * ``"plain"``: blank lines separate documents; the lines of a document are
     joined and split into sentences by `split_sentences`.
   * ``"lines"``: blank lines separate documents; every non-blank line is one
     sentence (the format of Google's ``create_pretraining_data.py``).
   * ``"wikitext"``: WikiText's ``" = Title = "`` headings start documents; section
     headings (``" = = Section = = "``) and blank lines are dropped; each paragraph
     line is split into sentences. WikiText's escapes are undone (``"@-@"`` ->
     ``"-"``, ``"@.@"`` -> ``"."``, ``"@,@"`` -> ``","``) and its ``"<unk>"`` becomes
     the tokenizer's ``"[UNK]"``, which tokenizes to the unknown id.
2. A WordPiece tokenizer from the `tokenizers` library: `load_tokenizer` (a
   ``vocab.txt`` or ``tokenizer.json``) or `train_wordpiece` (trained on the corpus
   with BERT normalisation and pre-tokenisation), saved by `save_tokenizer`.
3. `tokenize_documents` encodes every sentence once, in batches, into a
   `TokenizedCorpus` of flat numpy arrays: token ids, a corpus-wide word id per
   token (for whole-word masking) and sentence / document offsets.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import pathlib
import re
from collections.abc import Iterable, Sequence

import numpy as np

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# Each special role (named by BERT's token) and the tokens other families use for it, in the
# order they are looked for: RoBERTa/MPNet's <s> ... <mask>, EuroBERT's Llama-3 tokens.
ROLE_TOKENS = {
  "[PAD]": ("[PAD]", "<pad>", "<|pad|>"),
  "[UNK]": ("[UNK]", "<unk>", "<|unk|>"),
  "[CLS]": ("[CLS]", "<s>", "<|begin_of_text|>"),
  "[SEP]": ("[SEP]", "</s>", "<|end_of_text|>"),
  "[MASK]": ("[MASK]", "<mask>", "<|mask|>"),
}


def special_token_ids(tokenizer) -> dict[str, int]:
  """`{"[PAD]": id, ...}`: each special role's id, BERT's token or another family's.

  Raises:
    ValueError: a role none of whose tokens the vocabulary has (all of them named).
  """
  ids, missing = {}, []
  for role, candidates in ROLE_TOKENS.items():
    found = next((i for t in candidates if (i := tokenizer.token_to_id(t)) is not None), None)
    if found is None:
      missing.append(" / ".join(candidates))
    else:
      ids[role] = int(found)
  if missing:
    raise ValueError(f"tokenizer lacks a token for each of the special roles {missing}")
  return ids


FORMATS = ("plain", "lines", "wikitext")

PathLike = str | os.PathLike

# ---------------------------------------------------------------------------
# Sentence splitting
# ---------------------------------------------------------------------------

# Lower-cased abbreviations (without the final period) that do not end a sentence.
# fmt: off
_ABBREVIATIONS = frozenset([
  "mr", "mrs", "ms", "dr", "prof", "st", "jr", "sr", "vs", "etc", "e.g", "i.e", "cf", "al",
  "fig", "figs", "no", "nos", "vol", "vols", "inc", "ltd", "co", "corp", "gen", "col", "lt",
  "sgt", "capt", "cmdr", "adm", "gov", "sen", "rep", "rev", "mt", "ft", "approx", "dept", "est",
  "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
])
# fmt: on
_TERMINALS = (".", "!", "?")
_CLOSERS = frozenset([")", "]", "}", "”", "’", "»"])
_QUOTES = frozenset(['"', "'"])
_OPENERS = frozenset(['"', "'", "(", "[", "“", "‘", "«", "¿", "¡"])
_INITIALS = re.compile(r"(?:[A-Za-z]\.)+")


def _is_terminal(token: str) -> bool:
  """Whether a whitespace token ends with sentence-final punctuation (not an abbreviation)."""
  core = token.rstrip("\"')]}”’»")
  if not core.endswith(_TERMINALS):
    return False
  if core.endswith(".") and not core.endswith(".."):
    stem = core[:-1]
    if stem.lower() in _ABBREVIATIONS or _INITIALS.fullmatch(core):
      return False
  return True


def _is_closer(token: str, current: list[str]) -> bool:
  """Whether a token closes a quote or bracket of the current sentence."""
  if all(c in _CLOSERS for c in token):
    return True
  if token in _QUOTES:  # an ambiguous straight quote closes only an open one
    return sum(t == token for t in current) % 2 == 1
  return False


def _starts_sentence(token: str) -> bool:
  first = token[0]
  return first.isupper() or first.isdigit() or first in _OPENERS


def split_sentences(text: str) -> list[str]:
  """Splits text into sentences with a small rule-based splitter.

  The text is split on whitespace. A sentence ends after a token ending in
  ``.``, ``!`` or ``?`` (possibly followed by closing quotes or brackets, either
  attached or as separate tokens, as in WikiText) when the next token starts with
  an upper-case letter, a digit or an opening quote/bracket. A period does not end
  a sentence after a known abbreviation (``Mr.``, ``e.g.``, ``No.`` ...) or after
  initials (``H.``, ``U.S.``). Whitespace inside a sentence is normalised to
  single spaces.

  Args:
    text: a paragraph of text.

  Returns:
    The sentences, non-empty, in order.
  """
  sentences, current, pending = [], [], False
  for token in text.split():
    if pending:
      if _is_closer(token, current):
        current.append(token)
        continue
      if _starts_sentence(token):
        sentences.append(" ".join(current))
        current = []
      pending = False
    current.append(token)
    pending = _is_terminal(token)
  if current:
    sentences.append(" ".join(current))
  return sentences


# ---------------------------------------------------------------------------
# Reading documents
# ---------------------------------------------------------------------------

_WIKI_TITLE = re.compile(r"^ ?= ([^=].*) = ?$")
_WIKI_SECTION = re.compile(r"^ ?(?:= ){2,}.*(?: =){2,} ?$")
_WIKI_ESCAPES = ((" @-@ ", "-"), (" @.@ ", "."), (" @,@ ", ","), ("<unk>", "[UNK]"))


def _wikitext_clean(line: str) -> str:
  for old, new in _WIKI_ESCAPES:
    line = line.replace(old, new)
  return line


def _read_one(text: str, fmt: str) -> list[list[str]]:
  """Parses the text of one file into documents (lists of sentences)."""
  documents: list[list[str]] = []
  if fmt == "wikitext":
    current: list[str] = []
    for line in text.splitlines():
      if _WIKI_TITLE.match(line):
        if current:
          documents.append(current)
        current = []
      elif line.strip() and not _WIKI_SECTION.match(line):
        current.extend(split_sentences(_wikitext_clean(line)))
    if current:
      documents.append(current)
    return documents
  for block in re.split(r"\n\s*\n", text):
    lines = [line.strip() for line in block.splitlines() if line.strip()]
    if fmt == "lines":
      sentences = [" ".join(line.split()) for line in lines]
    else:
      sentences = split_sentences(" ".join(lines))
    if sentences:
      documents.append(sentences)
  return documents


def read_documents(
  paths: PathLike | Sequence[PathLike], *, format: str = "plain", max_lines: int | None = None
) -> list[list[str]]:
  """Reads text files into documents, each a list of sentences.

  Documents never span files.

  Args:
    paths: one path or a sequence of paths to UTF-8 text files.
    format: ``"plain"``, ``"lines"`` or ``"wikitext"`` (see the module docstring).
    max_lines: if given, reads only the first ``max_lines`` lines of each file
      (for quick experiments and tests).

  Returns:
    The documents in file order; empty documents are dropped.
  """
  if format not in FORMATS:
    raise ValueError(f"{format=} must be one of {FORMATS}")
  if isinstance(paths, (str, os.PathLike)):
    paths = [paths]
  if not paths:
    raise ValueError(f"{paths=} must name at least one file")
  documents = []
  for path in paths:
    path = pathlib.Path(path)
    if not path.is_file():
      raise FileNotFoundError(f"corpus file {path} does not exist")
    text = path.read_text(encoding="utf-8")
    if max_lines is not None:
      text = "\n".join(text.splitlines()[:max_lines])
    documents.extend(_read_one(text, format))
  return documents


# ---------------------------------------------------------------------------
# Tokenizers
# ---------------------------------------------------------------------------


def _bert_wordpiece(vocab: dict[str, int] | None, lowercase: bool):
  """An untrained or vocabulary-backed BERT WordPiece tokenizer.

  With a vocabulary that has them, `encode` adds [CLS] A [SEP] (B [SEP]) as BERT's
  tokenizers do (`tokenize_documents` asks for no special tokens), so the saved
  ``tokenizer.json`` is a whole BERT tokenizer for an exported model.
  """
  from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

  model = (
    models.WordPiece(vocab, unk_token="[UNK]") if vocab else models.WordPiece(unk_token="[UNK]")
  )
  tokenizer = Tokenizer(model)
  tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
  tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tokenizer.decoder = decoders.WordPiece()
  if vocab and "[CLS]" in vocab and "[SEP]" in vocab:
    tokenizer.post_processor = processors.BertProcessing(
      ("[SEP]", vocab["[SEP]"]), ("[CLS]", vocab["[CLS]"])
    )
  return tokenizer


def _prepare(tokenizer):
  """Turns off padding and truncation, which a saved tokenizer.json may switch on."""
  tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # unwrap bertjax.Tokenizer
  tokenizer.no_padding()
  tokenizer.no_truncation()
  special_token_ids(tokenizer)  # every role has a token (BERT's or another family's)
  return tokenizer


def load_tokenizer(path: PathLike, *, lowercase: bool = True):
  """Loads a tokenizer from a ``vocab.txt``, a ``tokenizer.json`` or a directory.

  Args:
    path: a ``tokenizer.json`` file, a ``vocab.txt`` file (one token per line, the
      line number is the id: a BERT WordPiece), a model directory (its tokenizer as
      `bertjax.Tokenizer.from_pretrained` reads it for the model's family), or another
      directory holding either file (``tokenizer.json`` preferred).
    lowercase: for a ``vocab.txt`` only: whether the BERT normaliser lower-cases
      (True for uncased vocabularies).

  Returns:
    A `tokenizers.Tokenizer` with padding and truncation off.
  """
  from tokenizers import Tokenizer

  path = pathlib.Path(path)
  if path.is_dir() and (path / "config.json").is_file():
    # A model directory: its tokenizer as bertjax reads it for the model's family (MPNet's
    # vocab.txt with its <s> A </s></s> B </s> template, not BERT's).
    from bertjax.model.tokenizer import Tokenizer as FamilyTokenizer

    return _prepare(FamilyTokenizer.from_pretrained(path).tokenizer)
  if path.is_dir():
    for name in ("tokenizer.json", "vocab.txt"):
      if (path / name).is_file():
        return load_tokenizer(path / name, lowercase=lowercase)
    raise FileNotFoundError(f"{path} holds neither tokenizer.json nor vocab.txt")
  if not path.is_file():
    raise FileNotFoundError(f"tokenizer file {path} does not exist")
  if path.suffix == ".json":
    return _prepare(Tokenizer.from_file(str(path)))
  tokens = path.read_text(encoding="utf-8").splitlines()
  vocab = {}
  for i, token in enumerate(tokens):
    vocab.setdefault(token, i)
  tokenizer = _bert_wordpiece(vocab, lowercase)
  tokenizer.add_special_tokens([t for t in SPECIAL_TOKENS if t in vocab])
  return _prepare(tokenizer)


def _word_counts(sentences: Iterable[str], tokenizer) -> dict[str, int]:
  """Counts of the pre-tokenised words of `sentences`, in order of first appearance."""
  counts: dict[str, int] = {}
  normalize, split = tokenizer.normalizer.normalize_str, tokenizer.pre_tokenizer.pre_tokenize_str
  for sentence in sentences:
    for word, _ in split(normalize(sentence)):
      counts[word] = counts.get(word, 0) + 1
  return counts


def _train_merges(
  counts: dict[str, int],
  vocab_size: int,
  min_frequency: int,
  limit_alphabet: int | None,
  prefix: str = "##",
) -> list[str]:
  """The tokens of a WordPiece vocabulary learnt as `tokenizers`' WordPiece trainer learns it.

  The algorithm is the `tokenizers` library's (a BPE over characters where every non-initial
  character carries `prefix`; merged tokens join without the second part's prefix), with
  every order fixed: the alphabet (its `limit_alphabet` most frequent characters, ties by
  character) comes sorted, initial characters before continuation ones; a merge's new token
  takes the next id; ties between equally frequent pairs go to the pair of smaller ids.
  `tokenizers`' trainer numbers the continuation characters in hash-map order, so its
  vocabulary and, through ties, even its merges change from one process to the next.
  """
  import heapq

  alphabet, continuation = _alphabet(counts, limit_alphabet, prefix)
  tokens = [*alphabet, *continuation]
  ids = {t: i for i, t in enumerate(tokens)}
  allowed = set(alphabet)
  words, weights = [], []
  for word, n in counts.items():
    # Characters outside the alphabet are dropped; only the word's first one is initial.
    pieces = [ids[c if i == 0 else prefix + c] for i, c in enumerate(word) if c in allowed]
    words.append(pieces)
    weights.append(n)
  pair_counts: dict[tuple[int, int], int] = {}
  where: dict[tuple[int, int], set[int]] = {}
  for w, (pieces, n) in enumerate(zip(words, weights)):
    for pair in itertools.pairwise(pieces):
      pair_counts[pair] = pair_counts.get(pair, 0) + n
      where.setdefault(pair, set()).add(w)
  heap = [(-n, a, b) for (a, b), n in pair_counts.items()]
  heapq.heapify(heap)
  while len(tokens) < vocab_size and heap:
    neg, a, b = heapq.heappop(heap)
    current = pair_counts.get((a, b), 0)
    if current != -neg:  # a stale entry: its count changed since it was pushed
      if current > 0:
        heapq.heappush(heap, (-current, a, b))
      continue
    if current < max(min_frequency, 1):
      break
    merged = tokens[a] + tokens[b].removeprefix(prefix)
    if merged not in ids:
      ids[merged] = len(tokens)
      tokens.append(merged)
    changed = _apply_merge(words, weights, where, (a, b), ids[merged])
    for pair, delta in changed.items():
      if delta:
        pair_counts[pair] = pair_counts.get(pair, 0) + delta
        if delta > 0:
          heapq.heappush(heap, (-pair_counts[pair], *pair))
    pair_counts.pop((a, b), None)
  return tokens


def _alphabet(
  counts: dict[str, int], limit_alphabet: int | None, prefix: str
) -> tuple[list[str], list[str]]:
  """The initial tokens: the alphabet sorted (its `limit_alphabet` most frequent characters,
  ties by character), and the sorted continuation forms (`prefix` + character) that occur."""
  chars: dict[str, int] = {}
  for word, n in counts.items():
    for c in word:
      chars[c] = chars.get(c, 0) + n
  alphabet = sorted(chars)
  if limit_alphabet is not None and len(alphabet) > limit_alphabet:
    kept = sorted(chars, key=lambda c: (-chars[c], c))[:limit_alphabet]
    alphabet = sorted(kept)
  allowed = set(alphabet)
  continuation = sorted({prefix + c for word in counts for c in word[1:] if c in allowed})
  return alphabet, continuation


def _apply_merge(
  words: list[list[int]],
  weights: list[int],
  where: dict[tuple[int, int], set[int]],
  pair: tuple[int, int],
  new: int,
) -> dict[tuple[int, int], int]:
  """Replaces `pair` by `new` in every word that holds it (updating `words` and `where`).

  Returns:
    The change of each adjacent pair's weighted count.
  """
  a, b = pair
  changed: dict[tuple[int, int], int] = {}
  for w in sorted(where.pop(pair, ())):
    pieces, n = words[w], weights[w]
    if pair not in itertools.pairwise(pieces):
      continue
    for p in itertools.pairwise(pieces):
      changed[p] = changed.get(p, 0) - n
    out, i = [], 0
    while i < len(pieces):
      if i + 1 < len(pieces) and pieces[i] == a and pieces[i + 1] == b:
        out.append(new)
        i += 2
      else:
        out.append(pieces[i])
        i += 1
    words[w] = out
    for p in itertools.pairwise(out):
      changed[p] = changed.get(p, 0) + n
      where.setdefault(p, set()).add(w)
  return changed


def train_wordpiece(
  sentences: Iterable[str],
  vocab_size: int,
  *,
  min_frequency: int = 2,
  lowercase: bool = True,
  limit_alphabet: int = 1000,
  save_dir: PathLike | None = None,
):
  """Trains a BERT WordPiece tokenizer on text, deterministically.

  Uses BERT normalisation (cleaning, Chinese-character spacing, optional
  lower-casing and accent stripping) and BERT pre-tokenisation (split on
  whitespace and punctuation); the special tokens ``[PAD] [UNK] [CLS] [SEP]
  [MASK]`` get ids 0-4. The vocabulary is learnt by the algorithm of the
  `tokenizers` library's ``WordPieceTrainer`` with every order fixed (see
  `_train_merges`): the same text gives the same ``vocab.txt``, byte for byte, in
  every process, whatever the thread count or hash seed (``tokenizers``' own
  trainer does not).

  Args:
    sentences: training text, e.g. ``(s for doc in documents for s in doc)``.
    vocab_size: the size of the vocabulary, special tokens included.
    min_frequency: the minimum count of a merged pair.
    lowercase: whether to lower-case (an uncased vocabulary).
    limit_alphabet: the maximum number of distinct characters kept.
    save_dir: if given, the tokenizer is saved there (see `save_tokenizer`).

  Returns:
    The trained `tokenizers.Tokenizer`.
  """
  if vocab_size <= len(SPECIAL_TOKENS):
    raise ValueError(f"{vocab_size=} must exceed the {len(SPECIAL_TOKENS)} special tokens")
  counts = _word_counts(sentences, _bert_wordpiece(None, lowercase))
  learnt = _train_merges(counts, vocab_size - len(SPECIAL_TOKENS), min_frequency, limit_alphabet)
  vocab = {
    t: i for i, t in enumerate([*SPECIAL_TOKENS, *(t for t in learnt if t not in SPECIAL_TOKENS)])
  }
  tokenizer = _bert_wordpiece(vocab, lowercase)
  tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
  _prepare(tokenizer)
  if save_dir is not None:
    save_tokenizer(tokenizer, save_dir)
  return tokenizer


def save_tokenizer(tokenizer, directory: PathLike) -> pathlib.Path:
  """Saves a tokenizer as ``vocab.txt`` (id order) and ``tokenizer.json``.

  Args:
    tokenizer: a `tokenizers.Tokenizer`.
    directory: created if missing.

  Returns:
    The directory.
  """
  directory = pathlib.Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  vocab = tokenizer.get_vocab(with_added_tokens=True)
  by_id = sorted(vocab.items(), key=lambda kv: kv[1])
  if [i for _, i in by_id] != list(range(len(by_id))):
    raise ValueError("tokenizer ids are not contiguous from 0; cannot write vocab.txt")
  (directory / "vocab.txt").write_text("".join(t + "\n" for t, _ in by_id), encoding="utf-8")
  tokenizer.save(str(directory / "tokenizer.json"))
  return directory


# ---------------------------------------------------------------------------
# Tokenized corpus
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TokenizedCorpus:
  """A corpus as flat token arrays.

  Attributes:
    ids: int32 (N,) token ids of all sentences, concatenated.
    word_ids: int32 (N,) a corpus-wide word index per token: subwords of one
      pre-tokenizer word share it; it never repeats across words or sentences, so
      ``word_ids[i] != word_ids[i - 1]`` marks the start of a word.
    sentence_offsets: int64 (S+1,) sentence s is ``ids[sentence_offsets[s]:sentence_offsets[s+1]]``.
    doc_offsets: int64 (D+1,) document d is sentences ``doc_offsets[d]:doc_offsets[d+1]``.
    vocab_size: the tokenizer's vocabulary size.
    special_ids: ``{"[PAD]": 0, "[UNK]": ..., "[CLS]": ..., "[SEP]": ..., "[MASK]": ...}``:
      each special role (BERT's name) and its id in this vocabulary (``<s>``, ``</s>``,
      ``<pad>``, ``<mask>`` for RoBERTa-style vocabularies; see `ROLE_TOKENS`).
  """

  ids: np.ndarray
  word_ids: np.ndarray
  sentence_offsets: np.ndarray
  doc_offsets: np.ndarray
  vocab_size: int
  special_ids: dict

  @property
  def num_tokens(self) -> int:
    """Tokens in the corpus."""
    return int(self.ids.shape[0])

  @property
  def num_sentences(self) -> int:
    """Sentences in the corpus."""
    return int(self.sentence_offsets.shape[0] - 1)

  @property
  def num_documents(self) -> int:
    """Documents in the corpus."""
    return int(self.doc_offsets.shape[0] - 1)

  @property
  def doc_token_offsets(self) -> np.ndarray:
    """int64 (D+1,) document d is ``ids[doc_token_offsets[d]:doc_token_offsets[d+1]]``."""
    return self.sentence_offsets[self.doc_offsets]

  def sentence(self, s: int) -> np.ndarray:
    """The token ids of sentence ``s``."""
    return self.ids[self.sentence_offsets[s] : self.sentence_offsets[s + 1]]

  def document_of_token(self, positions) -> np.ndarray:
    """The document index of each token position."""
    return np.searchsorted(self.doc_token_offsets, positions, side="right") - 1

  def unk_rate(self) -> float:
    """The fraction of tokens that are ``[UNK]``."""
    return float(np.mean(self.ids == self.special_ids["[UNK]"])) if self.num_tokens else 0.0

  def save(self, path: PathLike) -> None:
    """Saves the arrays and metadata to one ``.npz`` file."""
    meta = json.dumps({"vocab_size": self.vocab_size, "special_ids": self.special_ids})
    np.savez(
      path,
      ids=self.ids,
      word_ids=self.word_ids,
      sentence_offsets=self.sentence_offsets,
      doc_offsets=self.doc_offsets,
      meta=np.array(meta),
    )

  @classmethod
  def load(cls, path: PathLike) -> TokenizedCorpus:
    """Loads a corpus written by `save`."""
    with np.load(path) as f:
      meta = json.loads(str(f["meta"]))
      return cls(
        ids=f["ids"],
        word_ids=f["word_ids"],
        sentence_offsets=f["sentence_offsets"],
        doc_offsets=f["doc_offsets"],
        **meta,
      )


def tokenize_documents(
  documents: Sequence[Sequence[str]], tokenizer, *, batch_size: int = 4096
) -> TokenizedCorpus:
  """Tokenizes every sentence once, in batches, into a `TokenizedCorpus`.

  Sentences that tokenize to nothing are dropped, and so are documents left empty.

  Args:
    documents: documents, each a list of sentences (from `read_documents`).
    tokenizer: a `tokenizers.Tokenizer` (from `load_tokenizer` / `train_wordpiece`) or a
      `bertjax.Tokenizer` wrapping one.
    batch_size: sentences per ``encode_batch`` call.

  Returns:
    The corpus.
  """
  if batch_size < 1:
    raise ValueError(f"{batch_size=} must be >= 1")
  tokenizer = _prepare(tokenizer)
  flat = [s for doc in documents for s in doc]
  doc_of_sentence = np.repeat(np.arange(len(documents)), [len(d) for d in documents])
  ids_parts, word_parts, lengths = [], [], []
  next_word = 0
  for start in range(0, len(flat), batch_size):
    for enc in tokenizer.encode_batch(flat[start : start + batch_size], add_special_tokens=False):
      n = len(enc.ids)
      lengths.append(n)
      if n == 0:
        continue
      # word_ids are None only for special tokens added by a post-processor (off
      # here); treat any such token as a word of its own.
      local = np.array([-1 if w is None else w for w in enc.word_ids], np.int64)
      starts = np.ones(n, bool)
      starts[1:] = local[1:] != local[:-1]
      starts |= local < 0
      words = next_word + np.cumsum(starts) - 1
      next_word = int(words[-1]) + 1
      ids_parts.append(np.asarray(enc.ids, np.int32))
      word_parts.append(words)
  lengths = np.asarray(lengths, np.int64)
  keep = lengths > 0
  sentence_offsets = np.concatenate([[0], np.cumsum(lengths[keep])]).astype(np.int64)
  kept_docs = doc_of_sentence[keep]
  _doc_ids, counts = np.unique(kept_docs, return_counts=True)  # documents stay in order
  doc_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
  if next_word >= np.iinfo(np.int32).max:
    raise ValueError(f"corpus has {next_word} words; more than int32 word ids allow")
  return TokenizedCorpus(
    ids=np.concatenate(ids_parts) if ids_parts else np.zeros(0, np.int32),
    word_ids=(np.concatenate(word_parts) if word_parts else np.zeros(0)).astype(np.int32),
    sentence_offsets=sentence_offsets,
    doc_offsets=doc_offsets,
    vocab_size=int(tokenizer.get_vocab_size(with_added_tokens=True)),
    special_ids=special_token_ids(tokenizer),
  )


def load_corpus(
  paths: PathLike | Sequence[PathLike],
  tokenizer,
  *,
  format: str = "plain",
  max_lines: int | None = None,
) -> TokenizedCorpus:
  """Reads and tokenizes text files: `read_documents` then `tokenize_documents`.

  Args:
    paths: one or many text files.
    tokenizer: a `tokenizers.Tokenizer`, or a path for `load_tokenizer`.
    format: ``"plain"``, ``"lines"`` or ``"wikitext"``.
    max_lines: read only the first lines of each file.

  Returns:
    The tokenized corpus.
  """
  if isinstance(tokenizer, (str, os.PathLike)):
    tokenizer = load_tokenizer(tokenizer)
  documents = read_documents(paths, format=format, max_lines=max_lines)
  return tokenize_documents(documents, tokenizer)
