"""Clark et al. (2019)'s attention-based dependency probe: which word each head attends to
most, scored against UD's gold arcs.

`word_maps` turns a sequence's token maps into word-level maps (attention to a word: the sum
over its subword keys; from a word: the mean over its subword queries), `predictions` takes
each word's most-attended other word, `arc_hits` scores those per gold arc in both
directions (dependent -> head, head -> dependent), and `probe_table` picks each relation's
best head and best fixed offset (Clark's Table 1) on one half of the sentences and scores
them on the other. `dependency_probe` runs it all over a model's batches of UD sentences,
with Clark's per-sentence statistics (`sentence_statistics`) from the same maps, and
`clark_study` runs Clark's whole study (these and `statistics.clark_summary`);
`experiments/what_bert_looks_at.py` reports it.

What Clark's claims read from those numbers, on all the items or on resampled ones: the
middle layers' attention sinks (`middle_masses`, `sep_margin`), broad attention early on
(`entropy_trend`), and the held-out hits of heads and offsets (`held_out_counts` per
sentence, `held_out_margins`; `held_out_correct` per arc).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from bertjax.analysis.attention import statistics
from bertjax.data.conllu import base_deprel
from bertjax.model.forward import forward

# The relations Clark et al. report, in UD's labels (nmod:poss as "poss").
CLARK_RELATIONS = (
  "nsubj",
  "obj",
  "iobj",
  "amod",
  "det",
  "case",
  "advmod",
  "aux",
  "nmod",
  "obl",
  "compound",
  "mark",
  "cc",
  "conj",
  "poss",
  "nummod",
  "cop",
  "advcl",
  "xcomp",
  "ccomp",
  "acl",
  "appos",
  "expl",
  "flat",
  "fixed",
  "parataxis",
)
MAX_OFFSET = 20  # fixed-offset baseline: offsets -20 .. 20
# How `dependency_probe` chooses and predicts, in words: for a run's settings.
PROBE_METHOD = {
  "max_offset": MAX_OFFSET,
  "selection": "best head / offset chosen on even-numbered sentences, scored on odd ones",
  "prediction": "argmax of word-level attention over the sentence's other words "
  "([CLS], [SEP] and the word itself excluded)",
  "clark_relations_of_interest": CLARK_RELATIONS,
}
# How `clark_study`'s results number layers and heads, as `clark_figures` and the rows read
# from them do: for a run's settings.
INDEXING = (
  "layers are numbered 1..L (blocks; 0 would be the embeddings) and heads 0..H-1 in "
  "results, figures and findings: a best head is [layer, head]; per-layer arrays hold "
  "layers 1..L in order, (L, H) arrays layer by head"
)


def relation(deprel: str) -> str:
  """The relation label used here: UD's without subtype, nmod:poss as "poss"."""
  return "poss" if deprel == "nmod:poss" else base_deprel(deprel)


def word_maps(attn, word_ids, attention_mask, num_words: int) -> np.ndarray:
  """Word-level maps (..., num_words, num_words) of one sequence, without special tokens.

  The same quantity as `bertjax.analysis.attention.statistics.word_attention(..., keep_special=False)`
  (attention to a word: sum over its subword keys; from a word: mean over its subword
  queries), computed with matrix products: that function's three-operand `np.einsum`
  takes ~0.6 s per sentence for 72 maps here. Words the tokenizer gave no subword are
  all-zero rows and columns.

  Args:
    attn: (..., T, T) maps.
    word_ids: (T,) word index per position, -1 for special tokens and padding.
    attention_mask: (T,) 1 for real tokens.
    num_words: the sentence's number of words.
  """
  word_ids = np.asarray(word_ids)
  real = np.asarray(attention_mask, bool) & (word_ids >= 0)
  member = np.zeros((word_ids.shape[0], num_words))
  member[np.flatnonzero(real), word_ids[real]] = 1.0  # (T, W)
  mean_q = (member / np.maximum(member.sum(0), 1)).T  # (W, T)
  return mean_q @ np.asarray(attn, np.float64) @ member


SENTENCE_STATS = ("cls", "sep", "punct", "entropy")  # kept per sentence, for the intervals


def per_sentence_gap(per_sentence: dict[str, np.ndarray], by_layer: dict[str, np.ndarray]) -> float:
  """The largest |difference| between the mean over sentences of each of `SENTENCE_STATS`
  (`per_sentence[k]`: (sentences, L)) and the document-weighted statistic by layer
  (`statistics.clark_summary(..., weighting="document")["by_layer"][k]`): 0 up to rounding
  when the per-sentence statistics are the ones the summary averages."""
  return max(
    float(np.abs(np.mean(per_sentence[k], 0) - np.asarray(by_layer[k])).max())
    for k in SENTENCE_STATS
  )


def sentence_statistics(
  attn, ids, attention_mask, sep_id: int, punct_ids, smoothing: float
) -> dict[str, np.ndarray]:
  """Clark's statistics of one sentence by layer, (L,) each, mean over its heads: the mass
  each real query row puts on [CLS] (position 0), [SEP] and punctuation, and its entropy in
  nats of `(1 - smoothing) a + smoothing / n`, averaged over the real query rows (the
  notebook's per-document value; their mean over sentences is `clark_statistics`' with
  `weighting="document"`, which the run checks).

  Args:
    attn: (L, heads, T, T) maps of one sequence.
    ids, attention_mask: (T,) its token ids and real-token mask.
    sep_id, punct_ids: the [SEP] id and the punctuation ids.
    smoothing: the entropy's smoothing.
  """
  real = np.asarray(attention_mask, bool)
  a = np.asarray(attn, np.float64)[..., real, :][..., real]  # (L, heads, n, n)
  ids = np.asarray(ids)[real]
  p = (1 - smoothing) * a + smoothing / real.sum()
  per_row = {
    "cls": a[..., 0],
    "sep": a[..., ids == sep_id].sum(-1),
    "punct": a[..., np.isin(ids, punct_ids)].sum(-1),
    "entropy": -(p * np.log(np.where(p > 0, p, 1.0))).sum(-1),
  }
  return {k: v.mean((-1, -2)) for k, v in per_row.items()}


# Where Clark's heads sink their attention: name -> the statistic of `sentence_statistics`.
SINKS = {"[CLS]": "cls", "[SEP]": "sep", "punctuation": "punct"}


def middle_third(depth: int) -> tuple[int, int]:
  """The middle third of `depth` blocks as 1-based layers `lo..hi`: where Clark's BERT-base
  (layers 6-10 of 12) puts its [SEP] mass. At least layer 1; `middle_masses` reads layers
  `lo..max(hi, lo)`."""
  return max(1, round(depth / 3) + 1), max(1, round(2 * depth / 3))


def middle_masses(by_layer: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """The mean attention mass on [CLS], [SEP] and punctuation over the middle third's layers.

  Args:
    by_layer: "cls", "sep" and "punct" masses by layer, (..., L) each: `clark_summary`'s
      `by_layer`, or `dependency_probe`'s `per_sentence` (sentences, L).

  Returns:
    name of `SINKS` -> (...) mean over the layers of `middle_third(L)`.
  """
  lo, hi = middle_third(np.shape(by_layer["sep"])[-1])
  return {
    name: np.asarray(by_layer[k], float)[..., lo - 1 : max(hi, lo)].mean(-1)
    for name, k in SINKS.items()
  }


def sep_margin(masses: Mapping[str, np.ndarray]) -> np.ndarray:
  """[SEP]'s mass minus the larger of [CLS]'s and punctuation's (`middle_masses`' names):
  positive where [SEP] is the main sink, as in Clark's BERT-base."""
  return masses["[SEP]"] - np.maximum(masses["[CLS]"], masses["punctuation"])


def entropy_trend(entropy) -> dict[str, np.ndarray]:
  """Whether attention is broad early and focused later, from mean entropy by layer.

  Args:
    entropy: (..., L), e.g. `clark_summary`'s `by_layer["entropy"]`.

  Returns:
    (...) each: "first_vs_rest", layer 1's entropy minus the highest other layer's;
    "first_half" and "second_half", the mean over layers 1..L//2 and over the others.
  """
  e = np.asarray(entropy, float)
  half = e.shape[-1] // 2
  return {
    "first_vs_rest": e[..., 0] - e[..., 1:].max(-1),
    "first_half": e[..., :half].mean(-1),
    "second_half": e[..., half:].mean(-1),
  }


def predictions(maps) -> np.ndarray:
  """int (..., W): for each word, the other word it attends to most (itself excluded)."""
  maps = np.array(maps, np.float64)
  w = maps.shape[-1]
  maps[..., np.arange(w), np.arange(w)] = -np.inf
  return maps.argmax(-1)


def arc_hits(pred, heads) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Per-arc hits of every head's predictions for one sentence.

  Args:
    pred: int (heads, W) from `predictions`, flattened over (layer, head).
    heads: int (W,) gold heads, 1-based, 0 for the root.

  Returns:
    `(arcs, dep_to_head, head_to_dep)`: the indices of the non-root words (A,), and bool
    (A, heads) arrays: whether the dependent's top word is its head, and whether the head's
    top word is the dependent.
  """
  heads = np.asarray(heads)
  arcs = np.flatnonzero(heads > 0)
  gov = heads[arcs] - 1
  return arcs, (pred[:, arcs] == gov[None]).T, (pred[:, gov] == arcs[None]).T


def best_offset(offsets, select) -> tuple[int, float]:
  """The most frequent offset among `offsets[select]` (ties: smallest |k|, then k): (k, share)."""
  o = np.asarray(offsets)[np.asarray(select, bool)]
  if o.size == 0:
    return 0, 0.0
  ks = np.arange(-MAX_OFFSET, MAX_OFFSET + 1)
  counts = np.array([(o == k).sum() for k in ks])
  order = np.lexsort((ks, np.abs(ks), -counts))
  return int(ks[order[0]]), float(counts[order[0]] / o.size)


def layer_head(flat: int, config_shape: tuple[int, int]) -> list[int]:
  """`[layer, head]` of a flat (layers * heads) index: layers numbered 1..L, heads 0..H-1."""
  layer, head = np.unravel_index(flat, config_shape)
  return [int(layer) + 1, int(head)]


def probe_table(
  rels,
  offsets,
  split,
  dep_hits,
  head_hits,
  relations: Sequence[str],
  config_shape: tuple[int, int],
  sentences=None,
) -> dict[str, dict]:
  """Best head (each direction) and best offset per relation, held out and in sample.

  Args:
    rels: (A,) relation of each arc.
    offsets: (A,) head position minus dependent position.
    split: (A,) 0 = selection half, 1 = evaluation half.
    dep_hits, head_hits: bool (A, layers * heads) from `arc_hits`.
    relations: the relations to report ("all" means every arc given).
    config_shape: (layers, heads).
    sentences: (A,) the sentence of each arc; given, each row keeps its held-out arcs'
      sentences (`held_out_sentence`) and the 0/1 hits of each direction's best head and of
      the offset on them (`held_out_hits`): what an interval over the sentences resamples.

  Returns:
    Per relation, each direction's best head as `[layer, head]` (layers 1..L, heads 0..H-1),
    its accuracies and the per-head grid (row i is layer i + 1), and the offset baseline.
  """
  rels, offsets, split = np.asarray(rels), np.asarray(offsets), np.asarray(split)
  out = {}
  for rel in relations:
    sel = np.ones(len(rels), bool) if rel == "all" else rels == rel
    a, b = sel & (split == 0), sel & (split == 1)
    row = {"count": int(sel.sum()), "count_select": int(a.sum()), "count_eval": int(b.sum())}
    if sentences is not None:
      row["held_out_sentence"] = np.asarray(sentences)[b].astype(np.int32)
    for name, hits in (("dep_to_head", dep_hits), ("head_to_dep", head_hits)):
      acc_all = hits[sel].mean(0)
      acc_sel = hits[a].mean(0) if a.any() else np.zeros(hits.shape[1])
      best = int(np.argmax(acc_sel))
      row[name] = {
        "head": layer_head(best, config_shape),
        "select_accuracy": float(acc_sel[best]),
        "accuracy": float(hits[b, best].mean()) if b.any() else float("nan"),
        "in_sample_head": layer_head(int(np.argmax(acc_all)), config_shape),
        "in_sample_accuracy": float(acc_all.max()),
        "per_head_in_sample": acc_all.reshape(config_shape),
      }
      if sentences is not None:
        row[name]["held_out_hits"] = hits[b, best].astype(np.int8)
    k, _ = best_offset(offsets, a)
    k_all, share_all = best_offset(offsets, sel)
    row["baseline"] = {
      "offset": k,
      "accuracy": float((offsets[b] == k).mean()) if b.any() else float("nan"),
      "in_sample_offset": k_all,
      "in_sample_accuracy": share_all,
    }
    if sentences is not None:
      row["baseline"]["held_out_hits"] = (offsets[b] == k).astype(np.int8)
    out[rel] = row
  return out


def dependency_probe(
  params,
  config,
  batches,
  ud,
  min_count: int,
  clark_definition: tuple[int, Sequence[int], float],
  log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
  """Clark et al.'s attention-based probe over every arc of the used sentences, and
  `sentence_statistics` of every sentence (from the same maps).

  Args:
    params, config: the model.
    batches: `(sentence indices, batch)` pairs; each batch holds `input_ids`,
      `attention_mask`, `token_type_ids` and `word_ids` (`Tokenizer.encode_words`).
    ud: the UD sentences (`bertjax.data.conllu.read_conllu`), indexed as the batches are.
    min_count: arcs a relation needs to get a row of its own.
    clark_definition: `(sep_id, punct_ids, smoothing)` of `sentence_statistics`.
    log: where the held-out accuracies of the best heads, beside the offsets', are
      reported (None: not reported).

  Returns:
    `table` (`probe_table` rows: "all" arcs but punctuation, each frequent relation, and
    punctuation), `frequent` (the relations by count), `counts` (arcs by relation), `arcs`,
    `check` (`word_maps` against `statistics.word_attention` on a few sentences) and
    `per_sentence` (name -> (sentences, L), in the order of the sentences' indices).
  """
  depth, n_heads = config.depth, config.num_attention_heads
  rels, offsets, split, dep_hits, head_hits, arc_sentence = [], [], [], [], [], []
  check = []  # word_maps vs bertjax's word_attention on a few sentences
  per_sentence: dict[int, dict[str, np.ndarray]] = {}
  for idx, b in batches:
    maps = np.asarray(
      forward(
        params,
        config,
        b["input_ids"],
        b["attention_mask"],
        b["token_type_ids"],
        output_attentions=True,
      ).attentions
    )
    for row, i in enumerate(idx):
      per_sentence[int(i)] = sentence_statistics(
        maps[:, row], b["input_ids"][row], b["attention_mask"][row], *clark_definition
      )
      sent = ud[i]
      m = word_maps(maps[:, row], b["word_ids"][row], b["attention_mask"][row], sent.num_words)
      if len(check) < 3 and sent.num_words <= 30:
        ref, groups = statistics.word_attention(
          maps[:, row], b["word_ids"][row], b["attention_mask"][row], keep_special=False
        )
        check.append(float(np.abs(m[..., groups[:, None], groups[None, :]] - ref).max()))
      pred = predictions(m).reshape(depth * n_heads, -1)
      heads = sent.heads_array()
      arcs, dh, hd = arc_hits(pred, heads)
      rels += [relation(sent.deprels[a]) for a in arcs]
      offsets.append(heads[arcs] - 1 - arcs)
      split.append(np.full(len(arcs), i % 2))
      arc_sentence.append(np.full(len(arcs), i))
      dep_hits.append(dh)
      head_hits.append(hd)
  rels = np.asarray(rels)
  offsets, split = np.concatenate(offsets), np.concatenate(split)
  arc_sentence = np.concatenate(arc_sentence)
  dep_hits, head_hits = np.concatenate(dep_hits), np.concatenate(head_hits)
  counts = {r: int(c) for r, c in zip(*np.unique(rels, return_counts=True))}
  frequent = [
    r
    for r in sorted(counts, key=lambda r: -counts[r])
    if counts[r] >= min_count and r not in ("punct", "root")
  ]
  keep = rels != "punct"  # "all": every arc but punctuation, as Clark et al.'s tables
  table = probe_table(
    rels[keep],
    offsets[keep],
    split[keep],
    dep_hits[keep],
    head_hits[keep],
    ["all"],
    (depth, n_heads),
  )
  table.update(
    probe_table(
      rels,
      offsets,
      split,
      dep_hits,
      head_hits,
      [*frequent, *(["punct"] if "punct" in counts else [])],
      (depth, n_heads),
      sentences=arc_sentence,
    )
  )
  if log is not None:
    log(
      "best head (held-out, dep->head) vs offset: "
      + ", ".join(
        f"{r} {table[r]['dep_to_head']['accuracy']:.2f}/{table[r]['baseline']['accuracy']:.2f}"
        for r in ["all", *frequent]
      )
    )
  order = sorted(per_sentence)
  return {
    "table": table,
    "frequent": frequent,
    "counts": counts,
    "arcs": len(rels),
    "check": check,
    "per_sentence": {k: np.stack([per_sentence[i][k] for i in order]) for k in SENTENCE_STATS},
  }


def clark_study(
  params,
  config,
  tokenizer,
  batches,
  ud,
  *,
  min_count: int,
  weighting: str = "document",
  punctuation: str = "clark",
  smoothing: float = statistics.CLARK_ENTROPY_SMOOTHING,
  stage: Callable[[str], contextlib.AbstractContextManager] | None = None,
  log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
  """Clark et al.'s study of what a model's heads attend to, on UD sentences, in three stages:
  `statistics.clark_summary` of the given definition ("clark"), the same of the earlier one
  for comparison ("clark token-weighted": over all tokens, every punctuation id, unsmoothed
  entropy), and `dependency_probe` with each sentence's `sentence_statistics` ("probe").

  Args:
    params, config, tokenizer: the model and its tokenizer.
    batches, ud, min_count: as `dependency_probe`.
    weighting, punctuation, smoothing: the statistics' definition (`clark_summary`); the
      per-sentence statistics count the same punctuation with the same smoothing.
    stage: `stage(name)` gives a context manager around each stage, "clark", "clark
      token-weighted" and "probe" (as `bertjax.study.timed` to time them); None: none.
    log: where lines on the [SEP] mass, the probe's accuracies and the per-sentence
      statistics' agreement with "clark" go; None: nowhere.

  Returns:
    `data` (the sentences used, their tokens, their arcs and the arcs by relation), `clark`
    and `clark_token_all_punct` (the two `clark_summary`s), `probe` (`probe_results`),
    `per_sentence` (`dependency_probe`'s) and `per_sentence_vs_clark_max_diff`
    (`per_sentence_gap` against `clark`: 0 up to rounding where document-weighted, for each
    sentence's statistics averaged over sentences are the document-weighted ones; else NaN).
  """
  stage = stage or (lambda name: contextlib.nullcontext())
  log = log or (lambda line: None)
  plain = [{k: v for k, v in b.items() if k != "word_ids"} for _, b in batches]  # the inputs
  summary = functools.partial(statistics.clark_summary, params, config, tokenizer, plain)
  with stage("clark"):
    clark = summary(weighting=weighting, punctuation=punctuation, smoothing=smoothing)
    log("[SEP] mass by layer: " + str(np.round(clark["by_layer"]["sep"], 3).tolist()))
  with stage("clark token-weighted"):
    variant = summary(weighting="token", punctuation="all", smoothing=0.0)
  with stage("probe"):
    definition = (tokenizer.sep_id, statistics.punctuation_of(tokenizer, punctuation), smoothing)
    probe = dependency_probe(params, config, batches, ud, min_count, definition, log)
  per_sentence = probe["per_sentence"]
  document = weighting == "document"
  gap = per_sentence_gap(per_sentence, clark["by_layer"]) if document else float("nan")
  log(f"per-sentence statistics vs clark_statistics: max |diff| {gap:.1e}")
  data = {
    "sentences_used": sum(len(idx) for idx, _ in batches),
    "tokens": sum(int(b["attention_mask"].sum()) for b in plain),
    "arcs": probe["arcs"],
    "relation_counts": probe["counts"],
  }
  return {
    "data": data,
    "clark": clark,
    "clark_token_all_punct": variant,
    "probe": probe_results(probe["table"], probe["frequent"], probe["check"]),
    "per_sentence": per_sentence,
    "per_sentence_vs_clark_max_diff": gap,
  }


def probe_results(table: dict, frequent: list[str], check: list[float]) -> dict[str, Any]:
  """The result file's `probe` entry: the table, and each frequent relation's margin over the
  best fixed offset, for dependent -> head and for the direction chosen on the selection half.

  Where the table keeps held-out hits (`probe_table(..., sentences=)`), they leave it for
  `held_out`: per frequent relation, the sentence of each held-out arc and the 0/1 hits of the
  head of the chosen direction (`head`) and of the offset (`offset`) on it."""
  held = {}
  table = {rel: dict(row) for rel, row in table.items()}
  for rel, row in table.items():
    sentence = row.pop("held_out_sentence", None)
    hits = {k: row[k].get("held_out_hits") for k in ("dep_to_head", "head_to_dep", "baseline")}
    for k in hits:
      row[k] = {n: v for n, v in row[k].items() if n != "held_out_hits"}
    if sentence is not None:
      held[rel] = {"sentence": sentence, **hits}
  margins = {
    x: table[x]["dep_to_head"]["accuracy"] - table[x]["baseline"]["accuracy"] for x in frequent
  }
  # The direction of each relation is chosen on the selection half too, then scored held out.
  direction = {
    x: max(("dep_to_head", "head_to_dep"), key=lambda d: table[x][d]["select_accuracy"])
    for x in frequent
  }
  chosen = {x: table[x][direction[x]]["accuracy"] for x in frequent}
  margins_any = {x: chosen[x] - table[x]["baseline"]["accuracy"] for x in frequent}
  kept = {
    x: {
      "sentence": held[x]["sentence"],
      "head": held[x][direction[x]],
      "offset": held[x]["baseline"],
    }
    for x in frequent
    if x in held
  }
  return {
    "relations": table,
    "frequent": frequent,
    "margin_dep_to_head_vs_offset": margins,
    "direction_chosen": direction,
    "accuracy_chosen_direction": chosen,
    "margin_chosen_direction_vs_offset": margins_any,
    "word_maps_vs_word_attention_max_diff": max(check) if check else 0.0,
    **({"held_out": kept} if kept else {}),
  }


def held_out_counts(
  held: Mapping[str, dict], relations: Sequence[str]
) -> tuple[np.ndarray, np.ndarray]:
  """Per held-out sentence and relation: its arcs and the hits of the chosen head and of the
  offset, what an interval over the sentences resamples (`held_out_margins` sums them).

  Args:
    held: `probe_results(...)["held_out"]`: per relation, each held-out arc's `sentence` and
      the 0/1 hits on it of the head of the chosen direction (`head`) and of the offset
      (`offset`).
    relations: the relations to count, each a key of `held`.

  Returns:
    `(sentences, counts)`: the sentences with a held-out arc of any of `relations`, sorted,
    (S,); and (S, len(relations), 3) counts: arcs, head hits, offset hits.
  """
  sentences = np.unique(np.concatenate([np.asarray(held[x]["sentence"]) for x in relations]))
  counts = np.zeros((len(sentences), len(relations), 3))
  for j, x in enumerate(relations):
    at = np.searchsorted(sentences, np.asarray(held[x]["sentence"]))
    for c, hits in enumerate((1, held[x]["head"], held[x]["offset"])):
      np.add.at(counts[:, j, c], at, np.broadcast_to(np.asarray(hits, float), at.shape))
  return sentences, counts


def held_out_correct(row: Mapping[str, Any], direction: str = "dep_to_head") -> np.ndarray:
  """The 0/1 held-out hits of a `probe_table` row's best head in `direction`: as many ones as
  its accuracy on the row's `count_eval` held-out arcs makes, in no particular order. What an
  interval over the held-out arcs resamples where the row keeps no per-arc hits (as "all")."""
  n = row["count_eval"]
  hits = round(row[direction]["accuracy"] * n)
  return np.r_[np.ones(hits), np.zeros(n - hits)]


def held_out_margins(counts) -> np.ndarray:
  """Each relation's held-out accuracy of the chosen head minus the offset's, from
  `held_out_counts`' counts (..., S, relations, 3) summed over the sentences: (...,
  relations), NaN for a relation with no arcs among them."""
  t = np.asarray(counts).sum(-3)
  with np.errstate(invalid="ignore", divide="ignore"):
    return (t[..., 1] - t[..., 2]) / t[..., 0]
