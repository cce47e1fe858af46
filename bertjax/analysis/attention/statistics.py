"""Where attention goes (Clark et al. 2019): mass on [CLS], [SEP], punctuation, self and
neighbours, and entropy, per layer and head; word-level maps.

Every data-set statistic is streamed over batches with running sums; no full set of
attention maps is ever held (one batch's maps at most). Batches are mappings (or
`bertjax.Batch`) with `input_ids` and optionally `attention_mask`, `token_type_ids`,
`word_ids`; padding is right padding.

* `clark_statistics`: as Clark et al.'s released notebook computes them (per document first,
  then over documents; "." and "," as punctuation, `clark_punctuation_ids`; smoothed
  entropy), or token-weighted over the whole data set. Unsmoothed, it runs the kernel
  statistics path (`bertjax.attention_statistics`; fused on GPU, no maps held) twice per
  batch.
* `word_attention`: Clark et al.'s word-level maps (sum over a word's subword keys, mean
  over its subword queries).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from bertjax.analysis import sharded
from bertjax.analysis.batching import as_batch, model_token_types
from bertjax.analysis.sharded import maps_runner
from bertjax.model.config import BertConfig
from bertjax.model.forward import attention_statistics, forward

Params = dict[str, Any]


CLARK_NAMES = ("cls", "sep", "punct", "self", "prev", "next", "entropy")


CLARK_PUNCTUATION = (".", ",")  # General_Analysis.ipynb: token == "." or token == ","


CLARK_ENTROPY_SMOOTHING = 1e-4  # General_Analysis.ipynb: 0.9999 * attns + 0.0001 / n_tokens


WEIGHTINGS = ("document", "token")


def _is_punct(text: str) -> bool:
  return bool(text) and all(
    unicodedata.category(c).startswith("P") or c in "$+<=>^`|~" for c in text
  )


def _word_start_markers(tokenizer) -> tuple[str, ...]:
  """Prefixes marking a word-initial token: "Ġ" (byte-level BPE), "▁" (SentencePiece)."""
  return ("Ġ", "▁") if getattr(tokenizer, "byte_level", False) else ("▁",)


def punctuation_ids(tokenizer) -> np.ndarray:
  """Sorted ids of the vocabulary entries made only of punctuation.

  A broader set than Clark et al.'s ("." and ",", `clark_punctuation_ids`): every
  vocabulary entry of Unicode punctuation or ASCII symbols (~185 in BERT's
  uncased vocabulary), after a WordPiece "##" or a word-start marker (byte-level
  BPE's "Ġ", SentencePiece's "▁") is set aside, so RoBERTa's "Ġ," counts as ",".
  """
  vocab = tokenizer.tokenizer.get_vocab()
  special = set(tokenizer.special_ids)
  markers = _word_start_markers(tokenizer)

  def bare(tok: str) -> str:
    tok = tok.removeprefix("##")
    for m in markers:
      tok = tok.removeprefix(m)
    return tok

  ids = [
    i
    for tok, i in vocab.items()
    if i not in special and not (tok.startswith("[") and tok.endswith("]")) and _is_punct(bare(tok))
  ]
  return np.asarray(sorted(ids), np.int32)


def clark_punctuation_ids(tokenizer) -> np.ndarray:
  """Ids of the tokens Clark et al. count as punctuation: "." and "," (`CLARK_PUNCTUATION`).

  Their notebook (clarkkev/attention-analysis, `General_Analysis.ipynb`) tests
  `token == "." or token == ","`; entries missing from the vocabulary are skipped.
  For byte-level BPE (RoBERTa) and SentencePiece vocabularies the word-initial
  forms count too ("Ġ." and "▁.": what a "." after a space, or a pre-split word "."
  with its added leading space, becomes); WordPiece's "##." does not (the notebook's
  test excludes it).
  """
  vocab = tokenizer.tokenizer.get_vocab()
  forms = [m + t for t in CLARK_PUNCTUATION for m in ("",) + _word_start_markers(tokenizer)]
  return np.asarray(sorted({vocab[t] for t in forms if t in vocab}), np.int32)


def _maps_statistics(maps, ids, mask, sep_id: int, punct_ids, smoothing: float):
  """Per-sequence means over real query rows, (depth, B, heads) each, from full maps.

  `maps` (depth, B, heads, T, T); on real keys the entropy is that of
  `(1 - smoothing) * a + smoothing / n` (n: the sequence's real tokens).
  """
  real = np.asarray(mask, bool)  # (B, T)
  n = real.sum(-1).astype(np.float64)  # (B,)
  rows = real / np.maximum(n, 1)[:, None]  # (B, T): mean over real query rows
  keys = {"sep": real & (ids == sep_id), "punct": real & np.isin(ids, punct_ids)}
  out = {name: [] for name in CLARK_NAMES}
  uniform = (smoothing / np.maximum(n, 1))[:, None, None, None] * real[:, None, None, :]
  for a in maps:  # one layer at a time: (B, heads, T, T)
    a = np.asarray(a, np.float64) * real[:, None, None, :]
    per_row = {
      "cls": a[..., 0],
      "sep": (a * keys["sep"][:, None, None, :]).sum(-1),
      "punct": (a * keys["punct"][:, None, None, :]).sum(-1),
      "self": np.diagonal(a, 0, -2, -1),
      "prev": np.pad(np.diagonal(a, -1, -2, -1), ((0, 0), (0, 0), (1, 0))),
      "next": np.pad(np.diagonal(a, 1, -2, -1), ((0, 0), (0, 0), (0, 1))),
    }
    p = (1 - smoothing) * a + uniform  # (B, heads, T, T); zero on padded keys
    per_row["entropy"] = -(p * np.log(np.where(p > 0, p, 1.0))).sum(-1)
    for name, v in per_row.items():  # v: (B, heads, T) with T query rows
      out[name].append(np.einsum("bnt,bt->bn", v, rows))
  return {name: np.stack(v) for name, v in out.items()}


def clark_statistics(
  params: Params,
  config: BertConfig,
  batches: Iterable,
  *,
  sep_id: int,
  punct_ids: Sequence[int] = (),
  weighting: str = "document",
  entropy_smoothing: float = CLARK_ENTROPY_SMOOTHING,
  mesh=None,
) -> dict[str, np.ndarray]:
  """Clark et al.'s per-head attention statistics over a data set.

  Follows "Computing Average Attention to Particular Tokens/Positions" and
  "Computing Attention Head Entropies" in Clark et al.'s released notebook
  (github.com/clarkkev/attention-analysis, `General_Analysis.ipynb`): for every
  document (sequence), each statistic of a query row is averaged over *all* its
  real query rows ([CLS] and [SEP] rows included); then, with
  `weighting="document"` (the notebook's), over documents, each counting once.
  `weighting="token"` averages over every real query token of the data set
  instead (long sequences count more). The statistics: "cls", mass on position 0
  (the notebook: on tokens equal to "[CLS]"; the same where [CLS] comes only
  first); "sep", on [SEP] tokens; "punct", on `punct_ids` (the notebook: "." and
  ",", `clark_punctuation_ids`); "self"; "prev" (key = query - 1, the notebook's
  "left"; 0 for the first query); "next" (key = query + 1, "right"; 0 for the
  last); "entropy", of each row in nats, after the notebook's smoothing `(1 -
  entropy_smoothing) * a + entropy_smoothing / n` (n: the document's tokens).

  Where bertjax differs: the notebook reads float16 maps of BERT-base on 1,000
  Wikipedia segment pairs of up to 128 tokens; here, the maps are the model's
  float32 ones on whatever `batches` hold. With `entropy_smoothing > 0` the
  statistics come from the attention maps (`bertjax.forward(...,
  output_attentions=True)`, one batch at a time); with 0 from the kernel
  statistics path (`bertjax.attention_statistics`, no maps), whose entropy is
  unsmoothed (it differs from the smoothed one by at most `eps log(n) + h(eps)`
  nats, h the binary entropy: < 0.002 for eps = 1e-4, n <= 512).

  Args:
    params, config: the model.
    batches: iterable of batches.
    sep_id: the [SEP] id.
    punct_ids: ids counted as punctuation: `clark_punctuation_ids(tokenizer)` for
      Clark's, `punctuation_ids(tokenizer)` for every punctuation entry; empty
      reports zeros (and skips the kernel path's second pass).
    weighting: "document" (mean of per-sequence means, Clark's) or "token" (mean
      over all real query tokens).
    entropy_smoothing: Clark's 1e-4 by default; 0 for the plain entropy (and the
      kernel path).
    mesh: a `jax.sharding.Mesh` (`bertjax.mesh.make_mesh`): each batch's rows split
      over all its devices (padded with empty rows, which weigh 0), parameters replicated
      (fsdp-sharded with an "fsdp" axis > 1); the maps path still reduces the maps on the
      host, after gathering them. None: one device.

  Returns:
    name -> float64 (layers, heads) for the names in `CLARK_NAMES`.
  """
  if weighting not in WEIGHTINGS:
    raise ValueError(f"weighting={weighting!r} must be one of {WEIGHTINGS}")
  if not 0 <= entropy_smoothing < 1:
    raise ValueError(f"entropy_smoothing={entropy_smoothing} must be in [0, 1)")
  punct_ids = np.asarray(punct_ids, np.int32)
  sums = {name: np.zeros((config.depth, config.num_attention_heads)) for name in CLARK_NAMES}
  count = 0.0
  runner = None if mesh is None else sharded.AttentionRunner(params, config, mesh)
  for batch in batches:
    b = as_batch(batch) if runner is None else runner.batch(as_batch(batch))
    lengths = np.asarray(b["attention_mask"]).sum(-1).astype(np.float64)  # (B,)
    # Per-sequence weights: 1 per non-empty document, or its number of real tokens.
    weight = (lengths > 0).astype(np.float64) if weighting == "document" else lengths
    stats = _batch_clark_statistics(params, config, b, runner, sep_id, punct_ids, entropy_smoothing)
    for name in CLARK_NAMES:  # (layers, B, heads) per-sequence means, weighted over B
      per_seq = np.nan_to_num(np.asarray(stats[name], np.float64))  # empty rows: 0 x weight 0
      sums[name] += np.einsum("dbn,b->dn", per_seq, weight)
    count += weight.sum()
  if count == 0:
    raise ValueError("batches is empty (no real tokens)")
  return {name: s / count for name, s in sums.items()}


def _batch_clark_statistics(
  params, config, b, runner, sep_id: int, punct_ids, entropy_smoothing: float
) -> dict[str, Any]:
  """Per-sequence means of one batch, (depth, B, heads) each: from the maps with smoothing,
  else from the kernel statistics path (a second pass for punctuation)."""
  types = model_token_types(config, b["token_type_ids"])
  ids, mask = np.asarray(b["input_ids"]), np.asarray(b["attention_mask"])
  if entropy_smoothing > 0:
    maps = (
      forward(
        params, config, b["input_ids"], b["attention_mask"], types, output_attentions=True
      ).attentions
      if runner is None
      else runner.maps(b)
    )  # (L, B, N, T, T)
    return _maps_statistics(np.asarray(maps), ids, mask, sep_id, punct_ids, entropy_smoothing)
  if runner is not None:
    stats_of = runner.statistics
  else:
    stats_of = lambda b, special: attention_statistics(
      params, config, b["input_ids"], b["attention_mask"], types, special_mask=jnp.asarray(special)
    )
  out = stats_of(b, ids == sep_id)
  stats = {
    ours: out[theirs]
    for ours, theirs in (
      ("cls", "first"),
      ("sep", "special"),
      ("self", "self"),
      ("prev", "prev"),
      ("next", "next"),
      ("entropy", "entropy"),
    )
  }
  stats["punct"] = np.zeros_like(stats["cls"])
  if punct_ids.size:
    stats["punct"] = stats_of(b, np.isin(ids, punct_ids))["special"]
  return stats


def uniform_entropy(lengths, weighting: str = "document") -> float:
  """Entropy (nats) of uniform attention, averaged as `clark_statistics` averages.

  Clark et al.'s reference line: the mean over documents of `log(n)`, n the
  document's tokens ("document"); or over tokens, `sum n log n / sum n`
  ("token").

  Args:
    lengths: (documents,) real tokens per sequence (all > 0).
    weighting: "document" or "token".
  """
  if weighting not in WEIGHTINGS:
    raise ValueError(f"weighting={weighting!r} must be one of {WEIGHTINGS}")
  n = np.asarray(lengths, np.float64).ravel()
  if n.size == 0 or (n <= 0).any():
    raise ValueError(f"lengths must be positive token counts, got {n.tolist()[:8]}")
  return float(np.log(n).mean() if weighting == "document" else (n * np.log(n)).sum() / n.sum())


PUNCTUATION_KINDS = ("clark", "all")


def punctuation_of(tokenizer, kind: str = "clark") -> np.ndarray:
  """The punctuation ids a statistic counts: "clark" ("." and ",", `clark_punctuation_ids`) or
  "all" (every punctuation entry of the vocabulary, `punctuation_ids`)."""
  if kind not in PUNCTUATION_KINDS:
    raise ValueError(f"punctuation={kind!r} must be one of {PUNCTUATION_KINDS}")
  return clark_punctuation_ids(tokenizer) if kind == "clark" else punctuation_ids(tokenizer)


def clark_summary(
  params: Params,
  config: BertConfig,
  tokenizer,
  batches: Sequence,
  *,
  weighting: str = "document",
  punctuation: str = "clark",
  smoothing: float = CLARK_ENTROPY_SMOOTHING,
) -> dict[str, Any]:
  """`clark_statistics` of one definition, per head and by layer, with the entropy of uniform
  attention averaged alike (Clark et al.'s reference line).

  Args:
    params, config: the model.
    tokenizer: its tokenizer ([SEP] and the punctuation ids).
    batches: batches with `input_ids` and `attention_mask` (a list: read twice).
    weighting: "document" or "token" (`clark_statistics`).
    punctuation: "clark" or "all" (`punctuation_of`).
    smoothing: the entropy's smoothing eps (0: unsmoothed).

  Returns:
    name -> (layers, heads) for each of `CLARK_NAMES`; `by_layer`: name -> (layers,), the
    mean over heads; `uniform_entropy`; `definition`: the settings above and how many
    punctuation ids were counted.
  """
  batches = list(batches)
  punct = punctuation_of(tokenizer, punctuation)
  stats = clark_statistics(
    params,
    config,
    batches,
    sep_id=tokenizer.sep_id,
    punct_ids=punct,
    weighting=weighting,
    entropy_smoothing=smoothing,
  )
  out: dict[str, Any] = {k: np.asarray(v) for k, v in stats.items()}
  out["by_layer"] = {k: v.mean(-1) for k, v in out.items()}
  lengths = np.concatenate([np.asarray(as_batch(b)["attention_mask"]).sum(-1) for b in batches])
  out["uniform_entropy"] = uniform_entropy(lengths, weighting)
  out["definition"] = {
    "weighting": weighting,
    "punctuation": punctuation,
    "punctuation_ids": len(punct),
    "entropy_smoothing": smoothing,
  }
  return out


def special_mass_by_layer(params: Params, config: BertConfig, batches, sep_id: int) -> np.ndarray:
  """(L,) the attention mass on [CLS] (position 0) and [SEP] by layer, mean over heads
  (`clark_statistics`, per sentence then over sentences): where attention sinks, which
  outlier dimensions are said to drive."""
  s = clark_statistics(params, config, batches, sep_id=sep_id)
  return np.asarray(s["cls"] + s["sep"]).mean(-1)


def word_attention(attn, word_ids, attention_mask=None, *, keep_special: bool = True):
  """Clark et al.'s word-level attention of one sequence.

  Attention *to* a word is the sum over its subword keys; attention *from* a
  word is the mean over its subword queries, so rows still sum to 1.

  Args:
    attn: (..., T, T) maps of one sequence (e.g. (layers, heads, T, T)).
    word_ids: (T,) word index per position, -1 for special tokens and padding.
    attention_mask: (T,) 1 for real tokens; None means all real.
    keep_special: keep each real special token ([CLS], [SEP]) as a word of its own
      (Clark et al. do); otherwise drop them (rows then sum to less than 1).

  Returns:
    `(maps (..., W, W), groups)`: `groups[w]` is the word index of unit w, or -1
    for a special token, in order of position.
  """
  word_ids = np.asarray(word_ids)
  seq = word_ids.shape[0]
  real = np.ones(seq, bool) if attention_mask is None else np.asarray(attention_mask, bool)
  units, labels = [], []
  seen = {}
  for t in range(seq):
    w = int(word_ids[t])
    if not real[t]:
      continue
    if w < 0:
      if keep_special:
        units.append([t])
        labels.append(-1)
    elif w in seen:
      units[seen[w]].append(t)
    else:
      seen[w] = len(units)
      units.append([t])
      labels.append(w)
  member = np.zeros((seq, len(units)))
  for u, positions in enumerate(units):
    member[positions, u] = 1.0
  mean_q = (member / np.maximum(member.sum(0), 1)).T  # (W, T)
  maps = mean_q @ np.asarray(attn, np.float64) @ member  # two matmuls, broadcast over `...`
  return maps, np.asarray(labels, np.int32)


def word_level_attention(
  params: Params, config: BertConfig, batches: Iterable, *, keep_special: bool = True, mesh=None
):
  """Yields `(maps (layers, heads, W, W), groups)` per sequence; batches need `word_ids`.

  With `mesh` (`bertjax.mesh.make_mesh`) each batch's rows are split over all its
  devices for the forward pass (padding rows dropped after it); the word maps are formed on
  the host as on one device.
  """
  run = maps_runner(params, config, mesh)
  for batch in batches:
    b = as_batch(batch)
    if "word_ids" not in b:
      raise ValueError(
        "word_level_attention needs batches with 'word_ids' (Tokenizer.encode_words)"
      )
    maps, _ = run(b)
    for i in range(maps.shape[1]):
      yield word_attention(
        maps[:, i],
        np.asarray(b["word_ids"][i]),
        np.asarray(b["attention_mask"][i]),
        keep_special=keep_special,
      )
