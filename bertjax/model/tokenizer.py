"""A thin wrapper over the `tokenizers` library with word <-> subword alignment.

Every family's format: `tokenizer.json` (ModernBERT's and EuroBERT's byte-level BPE, and
every recent checkpoint); WordPiece `vocab.txt` (BERT, ELECTRA, DistilBERT; MPNet's
through its transformers class, for its `<s> A </s></s> B </s>` template); byte-level BPE
`vocab.json` + `merges.txt` (RoBERTa);
SentencePiece `spiece.model` (ALBERT), `sentencepiece.bpe.model` (XLM-R) or `spm.model`
(DeBERTa-v2/v3).
Special-token roles (cls, sep, pad, mask, unk, bos, eos) come from the
checkpoint's `tokenizer_config.json` / `special_tokens_map.json`, else from its
family's defaults, never from BERT's strings. Batches come back as NumPy
arrays, with `word_ids` (batch, seq): the index of the word each subword
belongs to, -1 for special tokens and padding.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
from collections.abc import Sequence

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


@dataclasses.dataclass(frozen=True)
class Windows:
  """Overlapping windows of long texts (`Tokenizer.encode_windows`)."""

  batch: Batch  # every window, padded; word_ids index the words of the whole text
  sample: np.ndarray  # (W,) int32: the text each window comes from
  start: np.ndarray  # (W,) int32: the window's first token, in the text's own tokens


# `truncation=` values -> the `tokenizers` strategy (None: no truncation).
_TRUNCATION = {
  False: None,
  "do_not_truncate": None,
  True: "longest_first",
  "longest_first": "longest_first",
  "only_first": "only_first",
  "only_second": "only_second",
}


class Tokenizer:
  """Tokenises text or pre-split words into padded NumPy batches."""

  def __init__(
    self,
    tokenizer,
    model_max_length: int = 512,
    roles: dict[str, str] | None = None,
    token_types: bool = True,
  ):
    self.tokenizer = tokenizer
    self.model_max_length = model_max_length
    # False for families without token-type embeddings (DistilBERT): ids are all 0.
    self.token_types = token_types
    vocab = tokenizer.get_vocab()
    roles = dict(roles or {})
    # Without declared roles: the first of the families' conventions the vocabulary has.
    for role, names in (
      ("cls", ("[CLS]", "<s>")),
      ("sep", ("[SEP]", "</s>")),
      ("pad", ("[PAD]", "<pad>")),
      ("mask", ("[MASK]", "<mask>")),
      ("unk", ("[UNK]", "<unk>")),
      ("bos", ("<s>",)),
      ("eos", ("</s>",)),
    ):
      if role not in roles:
        roles[role] = next((n for n in names if n in vocab), None)
    self.roles = {role: token for role, token in roles.items() if token in vocab}
    ids = {role: vocab[token] for role, token in self.roles.items()}
    self.pad_id = ids.get("pad")
    self.cls_id = ids.get("cls")
    self.sep_id = ids.get("sep")
    self.mask_id = ids.get("mask")
    self.unk_id = ids.get("unk")
    self.bos_id = ids.get("bos")
    self.eos_id = ids.get("eos")
    if self.pad_id is None:
      raise ValueError(f"tokenizer has no padding token (roles found: {self.roles})")
    self.special_ids = frozenset(
      i
      for i in (self.pad_id, self.cls_id, self.sep_id, self.mask_id, self.bos_id, self.eos_id)
      if i is not None
    )
    # Byte-level BPE marks a word start by a leading space: pre-split words need one.
    self.byte_level = '"ByteLevel"' in tokenizer.to_str()

  @property
  def cls_token(self) -> str | None:
    """The sequence-start token ("[CLS]", "<s>"), None if the tokenizer has none."""
    return self.roles.get("cls")

  @property
  def mask_token(self) -> str | None:
    """The mask token ("[MASK]", "<mask>"), None if the tokenizer has none."""
    return self.roles.get("mask")

  @property
  def vocab_size(self) -> int:
    """Tokens in the vocabulary, added tokens included."""
    return self.tokenizer.get_vocab_size()

  @classmethod
  def from_pretrained(cls, path, *, cache_dir=None) -> Tokenizer:
    """Loads a model directory's (or hub id's) tokenizer, in whichever format it ships.

    Looks for `tokenizer.json`, then `vocab.txt` (WordPiece), `vocab.json` +
    `merges.txt` (byte-level BPE), `spiece.model` / `sentencepiece.bpe.model` / `spm.model`
    (SentencePiece).
    """
    from bertjax.model.hf import resolve_model_path

    path = resolve_model_path(path, cache_dir)
    settings = _read_json(path / "tokenizer_config.json")
    model_config = _read_json(path / "config.json")
    model_type = model_config.get("model_type")
    max_len = settings.get("model_max_length", 512)
    max_len = max_len if isinstance(max_len, int) and max_len < 100_000 else 512
    roles = _roles(path, settings, model_type)
    tok = _load_backend(path, settings, roles, model_type)
    tok.no_padding()
    tok.no_truncation()
    from bertjax.model.families import FAMILIES

    # Pairs get segment ids where the model has token-type embeddings (DeBERTa-v3 has none).
    token_types = (FAMILIES[model_type].token_types if model_type in FAMILIES else True) and (
      model_config.get("type_vocab_size") != 0
    )
    return cls(tok, max_len, roles, token_types)

  def encode(
    self,
    texts: Sequence[str],
    pairs: Sequence[str] | None = None,
    *,
    max_length: int | None = None,
    pad_to: int | None = None,
    truncation: bool | str = False,
  ) -> Batch:
    """Tokenises sentences (or sentence pairs) with [CLS]/[SEP], padded to the longest (or `pad_to`).

    Args:
      texts: the sentences (a list, even of one).
      pairs: second sentences, one per text (segment 1), or None.
      max_length: the longest sequence allowed, special tokens included (default: the
        tokenizer's `model_max_length`). Without truncation a longer one is an error.
      pad_to: pad every sequence to this length instead of to the longest.
      truncation: as transformers' tokenizers: False (or "do_not_truncate"); True or
        "longest_first" (pairs: drop tokens from the longer side, one at a time in
        effect, until the pair fits); "only_first" or "only_second" (cut only that
        side). The special tokens are always kept.

    Returns:
      A `Batch` of NumPy arrays.
    """
    if isinstance(texts, str):
      raise TypeError("encode takes a list of strings; wrap a single sentence in a list")
    inputs = list(texts) if pairs is None else list(zip(texts, pairs))
    if pairs is not None and len(pairs) != len(texts):
      raise ValueError(f"{len(texts)} texts but {len(pairs)} pairs; give one pair per text")
    max_length = max_length or self.model_max_length
    with self._truncating(truncation, max_length):
      encodings = self.tokenizer.encode_batch(inputs)
    return self._batch(encodings, max_length, pad_to)

  def encode_words(
    self,
    sentences: Sequence[Sequence[str]],
    *,
    max_length: int | None = None,
    pad_to: int | None = None,
    truncation: bool | str = False,
  ) -> Batch:
    """Tokenises pre-split words (e.g. UD tokens); `word_ids` index those words.

    `truncation` and `max_length` as in `encode` (truncated words are simply absent
    from `word_ids`; a word cut in the middle keeps its first subwords).
    """
    words = self._split_words(sentences)
    max_length = max_length or self.model_max_length
    with self._truncating(truncation, max_length):
      encodings = self.tokenizer.encode_batch(words, is_pretokenized=True)
    return self._batch(encodings, max_length, pad_to)

  def encode_windows(
    self,
    texts: str | Sequence[str],
    pairs: Sequence[str] | None = None,
    *,
    max_length: int | None = None,
    stride: int = 0,
    pad_to: int | None = None,
  ) -> Windows:
    """Long documents as overlapping windows, as transformers' `return_overflowing_tokens`.

    Each text is tokenised whole and cut into windows of at most `max_length` tokens
    (special tokens included); consecutive windows of one text share `stride` tokens.
    With `pairs` (question-answering style), the pair is kept whole in every window and
    only the text is cut ("only_second" in transformers, where the pair comes first:
    here `pairs[i]` is segment 0 and `texts[i]` segment 1).

    Args:
      texts: one document or a list of them.
      pairs: a first segment per text (e.g. a question), repeated in each of its windows.
      max_length: tokens per window, special tokens included (default: `model_max_length`).
      stride: tokens shared by consecutive windows of a text (0 <= stride < the text's
        room in a window).
      pad_to: pad every window to this length (default: the longest window).

    Returns:
      `Windows`: the windows as one `Batch`, with `sample` (which text each window
      comes from) and `start` (the index, in the text's tokens without special tokens,
      of the window's first token).
    """
    texts = [texts] if isinstance(texts, str) else list(texts)
    max_length = max_length or self.model_max_length
    if stride < 0:
      raise ValueError(f"{stride=} must be >= 0")
    if pairs is not None and len(pairs) != len(texts):
      raise ValueError(f"{len(texts)} texts but {len(pairs)} pairs; give one pair per text")
    inputs = texts if pairs is None else list(zip(pairs, texts))
    # The text's room in a window: what the special tokens and the whole pair leave.
    specials = self.tokenizer.num_special_tokens_to_add(pairs is not None)
    fixed = (
      [0] * len(texts)
      if pairs is None
      else [len(e.ids) for e in self.tokenizer.encode_batch(list(pairs), add_special_tokens=False)]
    )
    for i, n in enumerate(fixed):
      room = max_length - specials - n
      if room <= stride:
        raise ValueError(
          f"max_length={max_length} leaves {room} tokens of text {i} per window "
          f"(after {specials} special tokens and {n} of its pair), which must "
          f"exceed {stride=}"
        )
    strategy = "longest_first" if pairs is None else "only_second"
    encodings, sample, start = [], [], []
    with self._truncating(strategy, max_length, stride=stride):
      for i, e in enumerate(self.tokenizer.encode_batch(inputs)):
        step = max_length - specials - fixed[i] - stride
        for k, window in enumerate([e, *e.overflowing]):
          encodings.append(window)
          sample.append(i)
          start.append(k * step)
    return Windows(
      self._batch(encodings, max_length, pad_to),
      np.asarray(sample, np.int32),
      np.asarray(start, np.int32),
    )

  def _split_words(self, sentences: Sequence[Sequence[str]]) -> list[list[str]]:
    words = [list(s) for s in sentences]
    if self.byte_level:  # as transformers' add_prefix_space=True: every word starts one
      words = [[w if w.startswith(" ") else " " + w for w in s] for s in words]
    return words

  @contextlib.contextmanager
  def _truncating(self, truncation: bool | str, max_length: int, stride: int = 0):
    """The backend set to truncate (or not) for one call, then restored."""
    if not isinstance(truncation, (bool, str)) or truncation not in _TRUNCATION:
      raise ValueError(
        f"truncation={truncation!r} must be True, False or one of "
        f"{[k for k in _TRUNCATION if isinstance(k, str)]}"
      )
    strategy = _TRUNCATION[truncation]
    if not isinstance(max_length, int) or max_length < 1:
      raise ValueError(f"max_length={max_length!r} must be a positive int")
    backend = self.tokenizer
    before = backend.truncation
    if strategy is None:
      backend.no_truncation()
    else:
      backend.enable_truncation(max_length, stride=stride, strategy=strategy)
    try:
      yield
    except Exception as e:  # `tokenizers` raises a bare Exception when a cut cannot fit
      if strategy is None or isinstance(e, (ValueError, TypeError)):
        raise
      raise ValueError(
        f"cannot truncate to max_length={max_length} with truncation={truncation!r}: {e}"
      ) from e
    finally:
      if before is None:
        backend.no_truncation()
      else:
        backend.enable_truncation(**before)

  def _batch(self, encodings, max_length: int | None, pad_to: int | None) -> Batch:
    max_length = max_length or self.model_max_length
    longest = max((len(e.ids) for e in encodings), default=0)
    if longest > max_length:
      raise ValueError(
        f"a sequence has {longest} tokens; max_length={max_length} "
        "(pass truncation=True, use encode_windows, or raise max_length)"
      )
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
      if self.token_types:
        types[b, :n] = e.type_ids
      words[b, :n] = [-1 if w is None else w for w in e.word_ids]
      # Special tokens carry no word (some tokenizers give them the word id of a neighbour).
      special = np.asarray(e.special_tokens_mask, bool)
      words[b, :n][special] = -1
    return Batch(ids, mask, types, words)

  def save_pretrained(self, directory: str | pathlib.Path) -> pathlib.Path:
    """Writes the tokenizer's files as a Hugging Face model directory holds them.

    `tokenizer.json` (the whole tokenizer, as `tokenizers` saves it); `vocab.txt` for a
    WordPiece vocabulary (BERT's format: one token a line, the line number its id);
    `tokenizer_config.json` (`model_max_length`, `do_lower_case` for BERT's normaliser,
    each role's token) and `special_tokens_map.json`. `from_pretrained` and
    transformers' `AutoTokenizer` read them back.

    Returns:
      The directory (created if missing).
    """
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    backend = self.tokenizer
    state = json.loads(backend.to_str())
    if state.get("truncation") or state.get("padding"):
      raise ValueError(
        "the tokenizer has truncation or padding switched on; call "
        "tokenizer.tokenizer.no_truncation() / no_padding() first"
      )
    backend.save(str(directory / "tokenizer.json"))
    if state["model"]["type"] == "WordPiece":
      by_id = sorted(backend.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
      if [i for _, i in by_id] != list(range(len(by_id))):
        raise ValueError(
          f"token ids are not contiguous from 0 (vocabulary of {len(by_id)}); "
          "cannot write vocab.txt"
        )
      (directory / "vocab.txt").write_text("".join(t + "\n" for t, _ in by_id), encoding="utf-8")
    roles = {f"{role}_token": token for role, token in self.roles.items()}
    settings = {"model_max_length": self.model_max_length, **roles}
    normalizer = state.get("normalizer") or {}
    if normalizer.get("type") == "BertNormalizer":
      settings["do_lower_case"] = bool(normalizer.get("lowercase"))
    (directory / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")
    (directory / "special_tokens_map.json").write_text(json.dumps(roles, indent=2) + "\n")
    return directory

  def decode(self, ids: Sequence[int]) -> str:
    """The text of `ids` (the tokenizer's decoder joins the pieces)."""
    return self.tokenizer.decode(list(map(int, ids)))

  def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
    """The token string of each id."""
    return [self.tokenizer.id_to_token(int(i)) for i in ids]

  def convert_tokens_to_ids(self, tokens: Sequence[str]) -> list[int]:
    """The id of each token string.

    Raises:
      ValueError: a token is not in the vocabulary."""
    out = []
    for t in tokens:
      i = self.tokenizer.token_to_id(t)
      if i is None:
        raise ValueError(f"token {t!r} is not in the vocabulary")
      out.append(i)
    return out


def _read_json(file: pathlib.Path) -> dict:
  return json.loads(file.read_text()) if file.exists() else {}


def _roles(path: pathlib.Path, settings: dict, model_type: str | None) -> dict[str, str]:
  """Special-token roles from the tokenizer files, then the family's defaults."""
  from bertjax.model.families import FAMILIES

  roles = {}
  declared = {**_read_json(path / "special_tokens_map.json"), **settings}
  for role in ("cls", "sep", "pad", "mask", "unk", "bos", "eos"):
    token = declared.get(f"{role}_token")
    if isinstance(token, dict):
      token = token.get("content")
    if isinstance(token, str):
      roles[role] = token
  if model_type in FAMILIES:
    for role, token in FAMILIES[model_type].special_tokens.items():
      roles.setdefault(role, token)
  return roles


def _load_backend(
  path: pathlib.Path, settings: dict, roles: dict[str, str], model_type: str | None = None
):
  import tokenizers

  from bertjax.model.families import FAMILIES

  if (path / "tokenizer.json").exists():
    return tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
  wordpiece_class = FAMILIES[model_type].wordpiece_class if model_type in FAMILIES else None
  if (path / "vocab.txt").exists() and wordpiece_class:
    return _transformers_backend(wordpiece_class, path)
  if (path / "vocab.txt").exists():
    from tokenizers.implementations import BertWordPieceTokenizer

    return BertWordPieceTokenizer(
      str(path / "vocab.txt"), lowercase=settings.get("do_lower_case", True)
    )._tokenizer
  if (path / "vocab.json").exists() and (path / "merges.txt").exists():
    return _byte_level_bpe(path, roles)
  if (path / "spiece.model").exists():
    return _transformers_backend("AlbertTokenizerFast", path)
  if (path / "sentencepiece.bpe.model").exists():
    return _transformers_backend("XLMRobertaTokenizerFast", path)
  if (path / "spm.model").exists():
    return _transformers_backend("DebertaV2TokenizerFast", path)
  raise FileNotFoundError(
    f"no tokenizer.json, vocab.txt, vocab.json + merges.txt, spiece.model, "
    f"sentencepiece.bpe.model or spm.model in {path}"
  )


def _byte_level_bpe(path: pathlib.Path, roles: dict[str, str]):
  """RoBERTa's vocab.json + merges.txt: byte-level BPE, <s> A </s></s> B </s>."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

  tok = Tokenizer(models.BPE.from_file(str(path / "vocab.json"), str(path / "merges.txt")))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  vocab = tok.get_vocab()
  cls_token, sep_token = roles.get("cls", "<s>"), roles.get("sep", "</s>")
  missing = [t for t in (cls_token, sep_token) if t not in vocab]
  if missing:
    raise ValueError(f"{path / 'vocab.json'} lacks the special tokens {missing}")
  tok.post_processor = processors.RobertaProcessing(
    (sep_token, vocab[sep_token]),
    (cls_token, vocab[cls_token]),
    trim_offsets=True,
    add_prefix_space=False,
  )
  specials = [t for t in roles.values() if t in vocab]
  tok.add_special_tokens(specials)
  return tok


def _transformers_backend(name: str, directory: pathlib.Path):
  """A slow-format tokenizer converted to `tokenizers` the way transformers converts it.

  The conversion (normaliser, pre-tokeniser, the <s> A </s></s> B </s> or
  [CLS] A [SEP] B [SEP] template) is transformers', so ids match its tokenizers.
  """
  try:
    import transformers
  except ImportError as e:
    raise ImportError(f"reading {directory} needs transformers (pip install 'bertjax[hf]')") from e
  return getattr(transformers, name).from_pretrained(str(directory)).backend_tokenizer
