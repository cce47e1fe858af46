"""Word features from every layer of a model, in one forward pass per batch.

``extract_word_features`` tokenises sentences given as word lists (e.g. UD
tokens), sorts them by subword length and groups them into buckets whose
sequence length is rounded up by ``bucket_width`` (so the
number of compiled shapes stays small) and whose batch size fills a token
budget; each bucket runs ``bertjax.forward(..., output_hidden_states=True)``
once, and ``probing.pool_subwords`` pools subwords to words (first or mean
subword). Words come back in corpus order as ``(layers + 1, n_words, hidden)``,
layer 0 being the embedding output.

With ``cache_dir`` the features are written to a ``.npy`` file keyed by a hash
of the model parameters and config, the token ids, the pooling and the dtype;
the next call with the same key memory-maps that file and runs no model.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import pathlib
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import bertjax
from bertjax.analysis.representations import probing

POOLINGS = ("first", "mean")
DTYPES = ("float32", "float16")
CACHE_VERSION = 1


@dataclasses.dataclass
class WordFeatures:
  """Per-word hidden states of every layer.

  Attributes:
    features: ``(layers + 1, n_words, hidden)``, embeddings first, words in corpus
      order (a read-only memory map when loaded from the cache).
    sentence_index: the sentence of each word ``(n_words,)``.
    word_index: each word's position within its sentence ``(n_words,)``.
    offsets: index of each sentence's first word ``(num_sentences + 1,)``.
    pooling: ``"first"`` or ``"mean"``.
    num_tokens: real subword tokens (special tokens included) over all sentences.
    padded_tokens: batch cells computed (``batch * seq`` summed over batches).
    num_batches: forward calls made (0 when loaded from the cache).
    shapes: the distinct ``(batch, seq)`` shapes run (each compiles once).
    missing_words: words that produced no subword (their features are zero).
    seconds: wall time of the model part (forward + pooling + copy to host).
    from_cache: True when loaded from ``cache_path`` without running the model.
    cache_path: the ``.npy`` file, or None without a cache.
  """

  features: np.ndarray
  sentence_index: np.ndarray
  word_index: np.ndarray
  offsets: np.ndarray
  pooling: str
  num_tokens: int
  padded_tokens: int
  num_batches: int = 0
  shapes: tuple[tuple[int, int], ...] = ()
  missing_words: int = 0
  seconds: float = 0.0
  from_cache: bool = False
  cache_path: pathlib.Path | None = None

  @property
  def num_layers(self) -> int:
    """How many layers the features hold (the embeddings and each block: L + 1)."""
    return self.features.shape[0]

  @property
  def padding_waste(self) -> float:
    """Share of computed batch cells that were padding."""
    return 1.0 - self.num_tokens / max(self.padded_tokens, 1)

  @property
  def tokens_per_second(self) -> float:
    """Real tokens per second of model time (nan when loaded from the cache)."""
    return self.num_tokens / self.seconds if self.seconds > 0 else float("nan")

  def sentence(self, i: int) -> np.ndarray:
    """The features of sentence ``i``: ``(layers + 1, n_i, hidden)``."""
    if not 0 <= i < len(self.offsets) - 1:
      raise IndexError(f"sentence {i=} outside [0, {len(self.offsets) - 1})")
    return self.features[:, self.offsets[i] : self.offsets[i + 1]]

  def summary(self) -> dict[str, Any]:
    """JSON-serialisable statistics of the extraction."""
    return {
      "layers": int(self.features.shape[0]),
      "words": int(self.features.shape[1]),
      "hidden": int(self.features.shape[2]),
      "sentences": int(len(self.offsets) - 1),
      "pooling": self.pooling,
      "tokens": int(self.num_tokens),
      "padded_tokens": int(self.padded_tokens),
      "padding_waste": float(self.padding_waste),
      "batches": int(self.num_batches),
      "shapes": [list(s) for s in self.shapes],
      "missing_words": int(self.missing_words),
      "seconds": float(self.seconds),
      "tokens_per_second": float(self.tokens_per_second),
      "from_cache": bool(self.from_cache),
    }


def _word_lists(sentences: Sequence[Any]) -> list[list[str]]:
  out = []
  for i, s in enumerate(sentences):
    words = s.forms if hasattr(s, "forms") else s
    if isinstance(words, str):
      raise TypeError(f"sentences[{i}] is a string; give each sentence as a list of words")
    words = list(words)
    if not words:
      raise ValueError(f"sentences[{i}] has no words")
    out.append(words)
  return out


def _round_up(x: int, m: int) -> int:
  return m * math.ceil(x / m)


def bucket_width(length: int, length_multiple: int = 8) -> int:
  """The padded length of a sequence: a multiple of ``length_multiple`` up to 64, then
  of an eighth of the next power of two (80, 96, ..., 128, 160, ..., 256, 320, ...),
  so padding stays under ~20% of long sequences and at most ~20 widths exist up to 512."""
  if length_multiple < 1:
    raise ValueError(f"{length_multiple=} must be >= 1")
  length = max(int(length), 1)
  step = max(length_multiple, (1 << (length - 1).bit_length()) // 8)
  return _round_up(length, step)


def plan_batches(
  lengths: Sequence[int],
  max_tokens: int = 4096,
  length_multiple: int = 8,
  row_multiple: int = 8,
) -> list[tuple[np.ndarray, int, int]]:
  """Groups sequences into length buckets under a token budget.

  Sequences are sorted by length; each batch pads to the bucket width (its
  longest member rounded up by ``bucket_width``) and holds at most
  ``max_tokens // width`` rows. A bucket's last, partial batch gets its row
  count rounded up to a multiple of ``row_multiple``, so there are at most two
  compiled shapes per width.

  Args:
    lengths: subword length of every sequence.
    max_tokens: batch cells (rows x width) per batch.
    length_multiple: the width granularity of short sequences (see ``bucket_width``).
    row_multiple: a partial batch's rows are rounded up to a multiple of this.

  Returns:
    ``[(indices, rows, width), ...]``: the sequences of each batch, the padded
    row count (>= ``len(indices)``) and width.
  """
  if length_multiple < 1 or row_multiple < 1:
    raise ValueError(f"{length_multiple=} and {row_multiple=} must be >= 1")
  lengths = np.asarray(lengths, np.int64)
  order = np.argsort(lengths, kind="stable")
  widths = np.asarray([bucket_width(n, length_multiple) for n in lengths[order]], np.int64)
  if widths.size and max_tokens < widths.max():
    raise ValueError(f"{max_tokens=} is smaller than the widest bucket ({widths.max()} tokens)")
  plan, start = [], 0
  while start < len(order):
    width = widths[start]
    cap = max(1, max_tokens // width)
    stop = start
    while stop < len(order) and widths[stop] == width and stop - start < cap:
      stop += 1
    n = stop - start
    rows = min(cap, _round_up(n, row_multiple))
    plan.append((order[start:stop], int(rows), int(width)))
    start = stop
  return plan


def _hash_params(params: Any, config: Any) -> str:
  h = hashlib.sha256(repr(config).encode())
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    a = np.asarray(leaf)
    h.update(jax.tree_util.keystr(path).encode())
    h.update(str((a.shape, a.dtype)).encode())
    h.update(np.ascontiguousarray(a).tobytes())
  return h.hexdigest()


def cache_key(
  params: Any,
  config: Any,
  encodings: Sequence[tuple[np.ndarray, np.ndarray]],
  pooling: str,
  dtype: str,
  model_id: str | None = None,
) -> str:
  """The cache key: a hash of model (or ``model_id``), token ids, word alignment, pooling, dtype."""
  h = hashlib.sha256(f"v{CACHE_VERSION}|{pooling}|{dtype}|".encode())
  h.update((model_id if model_id is not None else _hash_params(params, config)).encode())
  for ids, words in encodings:
    h.update(np.asarray(len(ids), np.int64).tobytes())
    h.update(np.asarray(ids, np.int32).tobytes())
    h.update(np.asarray(words, np.int32).tobytes())
  return h.hexdigest()[:24]


def _encode_all(tokenizer, sentences: list[list[str]], max_length: int):
  """Per-sentence (ids, word_ids) without padding."""
  out = []
  chunk = 256
  for start in range(0, len(sentences), chunk):
    batch = tokenizer.encode_words(sentences[start : start + chunk], max_length=max_length)
    n = batch.attention_mask.sum(1)
    for b in range(len(n)):
      out.append((batch.input_ids[b, : n[b]].copy(), batch.word_ids[b, : n[b]].copy()))
  return out


def _sentence_index(offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  counts = np.diff(offsets)
  sent = np.repeat(np.arange(len(counts)), counts)
  word = np.arange(offsets[-1]) - np.repeat(offsets[:-1], counts)
  return sent.astype(np.int32), word.astype(np.int32)


@functools.partial(jax.jit, static_argnames=("config", "num_words", "pooling", "dtype"))
def _extract(params, config, ids, mask, word_ids, num_words, pooling, dtype):
  """One compiled program per bucket shape: forward with all hidden states, then pooling."""
  hidden = bertjax.forward(
    params, config, ids, mask, jnp.zeros_like(ids), output_hidden_states=True
  ).hidden_states  # (L+1, rows, width, H)
  # probing.pool_subwords' jitted core, traced into this program (no host round trip).
  pooled, present = probing.pool_words(hidden, word_ids, num_words, pooling)
  return pooled.astype(dtype), present  # (L+1, rows, num_words, H), (rows, num_words)


def extract_word_features(
  params: Any,
  config: Any,
  tokenizer: Any,
  sentences: Sequence[Any],
  *,
  pooling: str = "first",
  dtype: str = "float32",
  max_tokens: int = 4096,
  length_multiple: int = 8,
  cache_dir: str | os.PathLike | None = None,
  model_id: str | None = None,
  progress: bool = True,
  mesh: Any = None,
) -> WordFeatures:
  """Hidden states of every layer pooled to words, one forward pass per length bucket.

  Args:
    params: model parameters (``bertjax.from_hf`` or ``bertjax.init``).
    config: the model's ``BertConfig``.
    tokenizer: a ``bertjax.Tokenizer``.
    sentences: word lists, or objects with ``forms`` (e.g. ``conllu.Sentence``).
    pooling: ``"first"`` subword or ``"mean"`` of a word's subwords.
    dtype: ``"float32"`` or ``"float16"`` for the returned features.
    max_tokens: batch cells (rows x padded length) per forward call.
    length_multiple: padded-length granularity (see ``bucket_width``; bounds compilations).
    cache_dir: directory of the on-disk cache, or None for no cache.
    model_id: a name standing for the model in the cache key (skips hashing the
      parameters); the caller must change it whenever the weights change.
    progress: show a tqdm progress bar.
    mesh: a ``jax.sharding.Mesh`` (``bertjax.mesh.make_mesh``): each batch's rows
      split over all its devices (rows rounded up to a multiple of their count; the
      extra rows are padding), parameters replicated (fsdp-sharded with an "fsdp" axis
      > 1); the features equal the single-device ones. With several processes each
      places only its devices' rows, every process gets the features, and only process 0
      writes the cache. None: one device.

  Returns:
    A ``WordFeatures``.
  """
  if pooling not in POOLINGS:
    raise ValueError(f"{pooling=} must be one of {POOLINGS}")
  if dtype not in DTYPES:
    raise ValueError(f"{dtype=} must be one of {DTYPES}")
  words = _word_lists(sentences)
  if not words:
    raise ValueError("sentences is empty")
  corpus = _encode_corpus(config, tokenizer, words)
  sent_idx, word_idx = _sentence_index(corpus.offsets)
  plan, stats = _plan(corpus, max_tokens, length_multiple, mesh)
  shape = (config.depth + 1, int(corpus.offsets[-1]), config.hidden_size)
  path = None
  if cache_dir is not None:
    key = cache_key(params, config, corpus.encodings, pooling, dtype, model_id)
    path = pathlib.Path(cache_dir) / f"features-{key}.npy"
    feats = _load_cached(path, shape, dtype)
    if feats is not None:
      return WordFeatures(
        feats,
        sent_idx,
        word_idx,
        corpus.offsets,
        pooling,
        **stats,
        from_cache=True,
        cache_path=path,
      )
  params, writer = _place(params, mesh)
  out = _Output(path if writer else None, shape, dtype)
  bar = _progress_bar(stats["num_tokens"]) if progress and writer else None
  t0 = time.perf_counter()
  try:
    missing = _fill_features(
      out.array,
      params,
      config,
      tokenizer,
      corpus,
      plan,
      pooling=pooling,
      dtype=dtype,
      length_multiple=length_multiple,
      mesh=mesh,
      bar=bar,
    )
    seconds = time.perf_counter() - t0
  except BaseException:
    out.discard()
    raise
  finally:
    if bar is not None:
      bar.close()
  feats = out.finish(
    {"pooling": pooling, "dtype": dtype, "shape": list(shape), "sentences": len(words)}
  )
  return WordFeatures(
    feats,
    sent_idx,
    word_idx,
    corpus.offsets,
    pooling,
    **stats,
    num_batches=len(plan),
    missing_words=missing,
    seconds=seconds,
    cache_path=out.path,
  )


@dataclasses.dataclass(frozen=True)
class _Corpus:
  """Sentences tokenised for extraction.

  Attributes:
    encodings: per sentence, ``(ids, word_ids)`` without padding.
    lengths: subwords per sentence (special tokens included).
    num_words: words per sentence.
    offsets: index of each sentence's first word ``(num_sentences + 1,)``.
  """

  encodings: list[tuple[np.ndarray, np.ndarray]]
  lengths: np.ndarray
  num_words: np.ndarray
  offsets: np.ndarray


def _encode_corpus(config: Any, tokenizer: Any, words: list[list[str]]) -> _Corpus:
  """Tokenises every sentence; raises for one longer than the model's positions."""
  max_len = config.max_length  # RoBERTa: max_position_embeddings - pad_token_id - 1
  num_words = np.asarray([len(w) for w in words])
  offsets = np.concatenate([[0], np.cumsum(num_words)]).astype(np.int64)
  encodings = _encode_all(tokenizer, words, max_len)
  lengths = np.asarray([len(ids) for ids, _ in encodings])
  too_long = np.flatnonzero(lengths > max_len)
  if too_long.size:
    raise ValueError(
      f"sentence {too_long[0]} has {lengths[too_long[0]]} subwords, more than "
      f"the model's {max_len} positions ({config.model_type}, "
      f"max_position_embeddings={config.max_position_embeddings})"
    )
  return _Corpus(encodings, lengths, num_words, offsets)


def _plan(corpus: _Corpus, max_tokens: int, length_multiple: int, mesh: Any):
  """The batches ``(indices, rows, width)`` (rows a multiple of the mesh's devices) and the
  extraction's token statistics."""
  plan = plan_batches(corpus.lengths, max_tokens, length_multiple)
  if mesh is not None:
    from bertjax import mesh as mesh_lib

    devices = mesh_lib.size_of(mesh, mesh.axis_names)
    plan = [(idx, mesh_lib.round_up(rows, devices), width) for idx, rows, width in plan]
  stats = {
    "num_tokens": int(corpus.lengths.sum()),
    "padded_tokens": int(sum(rows * width for _, rows, width in plan)),
    "shapes": tuple(sorted({(rows, width) for _, rows, width in plan})),
  }
  return plan, stats


def _load_cached(path: pathlib.Path, shape: tuple[int, ...], dtype: str) -> np.ndarray | None:
  """The cached features memory-mapped, or None when absent or of another shape or dtype."""
  if not path.exists():
    return None
  feats = np.load(path, mmap_mode="r")
  return feats if feats.shape == shape and feats.dtype == np.dtype(dtype) else None


def _place(params: Any, mesh: Any) -> tuple[Any, bool]:
  """`(params, writer)`: the parameters placed on `mesh` (as they are without one), and
  whether this process writes (of several processes, process 0)."""
  if mesh is None:
    return params, True
  from bertjax import mesh as mesh_lib

  return mesh_lib.shard_params(params, mesh), mesh_lib.is_primary()


def _progress_bar(num_tokens: int):
  from tqdm.auto import tqdm

  return tqdm(total=num_tokens, unit="tok", desc="features", leave=False)


class _Output:
  """Where the features go: given a cache path, a memory map under a temporary name that
  `finish` renames to the path (`discard` removes it); else an array in memory."""

  def __init__(self, path: pathlib.Path | None, shape: tuple[int, ...], dtype: str):
    self.path, self.tmp = path, None
    if path is None:
      self.array = np.empty(shape, dtype)
      return
    path.parent.mkdir(parents=True, exist_ok=True)
    self.tmp = path.with_suffix(f".tmp{os.getpid()}.npy")
    self.array = np.lib.format.open_memmap(self.tmp, mode="w+", dtype=dtype, shape=shape)

  def discard(self) -> None:
    if self.tmp is not None:
      del self.array
      self.tmp.unlink(missing_ok=True)

  def finish(self, meta: dict[str, Any]) -> np.ndarray:
    """The features: the array in memory, or the renamed file (with `meta` in a ``.json``
    beside it) memory-mapped."""
    if self.tmp is None:
      return self.array
    self.array.flush()
    del self.array
    os.replace(self.tmp, self.path)
    (self.path.with_suffix(".json")).write_text(json.dumps(meta))
    return np.load(self.path, mmap_mode="r")


def _bucket_arrays(tokenizer: Any, corpus: _Corpus, idx: np.ndarray, rows: int, width: int):
  """The padded ``(ids, mask, word_ids)`` of one batch, each ``(rows, width)`` int32."""
  ids = np.full((rows, width), tokenizer.pad_id, np.int32)
  mask = np.zeros((rows, width), np.int32)
  wids = np.full((rows, width), -1, np.int32)
  for r, s in enumerate(idx):
    sid, sw = corpus.encodings[s]
    ids[r, : len(sid)], mask[r, : len(sid)], wids[r, : len(sid)] = sid, 1, sw
  return ids, mask, wids


def _fill_features(
  out: np.ndarray,
  params: Any,
  config: Any,
  tokenizer: Any,
  corpus: _Corpus,
  plan,
  *,
  pooling: str,
  dtype: str,
  length_multiple: int,
  mesh: Any,
  bar: Any,
) -> int:
  """Runs every batch of `plan` and writes its words' features into `out` in corpus order.

  Returns:
    How many words produced no subword.
  """
  if mesh is not None:
    from bertjax import mesh as mesh_lib
  missing = 0
  for idx, rows, width in plan:
    ids, mask, wids = _bucket_arrays(tokenizer, corpus, idx, rows, width)
    num_words = bucket_width(int(corpus.num_words[idx].max()), length_multiple)
    bertjax.check_inputs(config, ids, mask)
    arrays = (ids, mask, wids) if mesh is None else mesh_lib.shard_rows((ids, mask, wids), mesh)
    pooled, present = _extract(params, config, *arrays, num_words, pooling, dtype)
    if mesh is not None:  # gathered from every device (and process)
      pooled, present = mesh_lib.to_host((pooled, present))
    pooled, present = np.asarray(pooled), np.asarray(present)  # (L+1, rows, num_words, H)
    n = corpus.num_words[idx]  # words of each real row
    rows_of = np.repeat(np.arange(len(idx)), n)
    words_of = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)
    out[:, corpus.offsets[idx][rows_of] + words_of] = pooled[:, rows_of, words_of]
    missing += int(n.sum() - present[rows_of, words_of].sum())
    if bar is not None:
      bar.update(int(corpus.lengths[idx].sum()))
  return missing


def forward_throughput(
  params: Any,
  config: Any,
  tokenizer: Any,
  sentences: Sequence[Any],
  *,
  max_tokens: int = 4096,
  length_multiple: int = 8,
  repeats: int = 1,
) -> dict[str, float]:
  """Plain forward throughput (last hidden state only) on the batches extraction would run.

  Every shape is compiled before timing; the figure to compare with
  ``WordFeatures.tokens_per_second``.

  Returns:
    ``{"tokens", "seconds", "tokens_per_second"}`` (real tokens, best of ``repeats``).
  """
  words = _word_lists(sentences)
  encodings = _encode_all(tokenizer, words, config.max_length)
  lengths = np.asarray([len(ids) for ids, _ in encodings])
  batches = []
  for idx, rows, width in plan_batches(lengths, max_tokens, length_multiple):
    ids = np.full((rows, width), tokenizer.pad_id, np.int32)
    mask = np.zeros((rows, width), np.int32)
    for r, s in enumerate(idx):
      ids[r, : lengths[s]], mask[r, : lengths[s]] = encodings[s][0], 1
    batches.append((ids, mask))
  run = lambda ids, mask: bertjax.forward(params, config, ids, mask, np.zeros_like(ids))
  for ids, mask in {b[0].shape: b for b in batches}.values():
    jax.block_until_ready(run(ids, mask).last_hidden_state)
  best = math.inf
  for _ in range(repeats):
    t0 = time.perf_counter()
    for ids, mask in batches:
      np.asarray(run(ids, mask).last_hidden_state)
    best = min(best, time.perf_counter() - t0)
  return {
    "tokens": int(lengths.sum()),
    "seconds": best,
    "tokens_per_second": float(lengths.sum() / best),
  }
