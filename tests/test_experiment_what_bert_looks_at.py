"""Script-specific checks of `experiments/what_bert_looks_at.py` (Clark et al.'s probe)."""

import pathlib
import sys

import numpy as np

from bertjax.analysis.attention.statistics import word_attention

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "experiments"))
import what_bert_looks_at as wbl

# [CLS] w0 w1 w1 w2 w3 w3 w3 w4 [SEP] pad pad: subword positions of 5 words.
WORD_IDS = np.array([-1, 0, 1, 1, 2, 3, 3, 3, 4, -1, -1, -1])
MASK = np.array([1] * 10 + [0] * 2)
HEADS = np.array([2, 0, 2, 5, 2])  # 1-based, word 1 is the root


def _attending(targets, rng):
  """Token-level maps (T, T) where every subword of word i puts most mass on word targets[i]."""
  t = len(WORD_IDS)
  attn = rng.random((t, t)) * 0.1 * MASK[None]
  for q in range(t):
    w = WORD_IDS[q]
    if w >= 0 and targets[w] >= 0:
      keys = np.flatnonzero(WORD_IDS == targets[w])
      attn[q, keys] += 1.0 / len(keys)  # the word's subwords share one unit of mass
  attn[:, [0, 9]] += 2.0  # heavy [CLS]/[SEP] attention must not count as a prediction
  return attn / attn.sum(-1, keepdims=True) * MASK[:, None]


def test_word_maps_equal_bertjax_word_attention():
  rng = np.random.default_rng(0)
  attn = rng.random((2, 3, 12, 12)) * MASK
  attn /= attn.sum(-1, keepdims=True)
  ours = wbl.word_maps(attn, WORD_IDS, MASK, 5)
  ref, groups = word_attention(attn, WORD_IDS, MASK, keep_special=False)
  np.testing.assert_array_equal(groups, np.arange(5))
  np.testing.assert_allclose(ours, ref, atol=1e-12)


def test_attention_to_the_head_gives_accuracy_one():
  rng = np.random.default_rng(1)
  to_head = _attending(HEADS - 1, rng)  # the root attends to "itself": excluded, random pick
  to_dep = _attending(np.array([-1, 0, -1, -1, 3]), rng)  # heads attend to one dependent each
  maps = wbl.word_maps(np.stack([to_head, to_dep]), WORD_IDS, MASK, 5)
  pred = wbl.predictions(maps)
  arcs, dep_to_head, head_to_dep = wbl.arc_hits(pred, HEADS)
  np.testing.assert_array_equal(arcs, [0, 2, 3, 4])
  assert dep_to_head[:, 0].all()  # map 0: every dependent's top word is its head
  # Map 1: word 1 attends to word 0 and word 4 to word 3, so exactly those arcs hit.
  np.testing.assert_array_equal(head_to_dep[:, 1], [True, False, True, False])
  table = wbl.probe_table(
    np.array(["a"] * 4),
    HEADS[arcs] - 1 - arcs,
    np.array([0, 1, 0, 1]),
    dep_to_head,
    head_to_dep,
    ["a"],
    (1, 2),
  )
  assert table["a"]["dep_to_head"]["head"] == [1, 0]  # layer 1 (the first block), head 0
  assert table["a"]["dep_to_head"]["accuracy"] == 1.0
  assert table["a"]["dep_to_head"]["in_sample_accuracy"] == 1.0


def test_offset_baseline_matches_numpy():
  rng = np.random.default_rng(2)
  offsets = rng.choice([-3, -1, 1, 2, 5], size=400, p=[0.1, 0.35, 0.3, 0.15, 0.1])
  split = rng.integers(0, 2, 400)
  rels = rng.choice(["x", "y"], size=400)
  hits = np.zeros((400, 4), bool)
  table = wbl.probe_table(rels, offsets, split, hits, hits, ["x", "y", "all"], (2, 2))
  for rel in ("x", "y", "all"):
    sel = np.ones(400, bool) if rel == "all" else rels == rel
    values, counts = np.unique(offsets[sel], return_counts=True)
    assert table[rel]["baseline"]["in_sample_accuracy"] == counts.max() / sel.sum()
    assert table[rel]["baseline"]["in_sample_offset"] == values[counts.argmax()]
    values, counts = np.unique(offsets[sel & (split == 0)], return_counts=True)
    k = values[counts.argmax()]
    assert table[rel]["baseline"]["offset"] == k
    held = sel & (split == 1)
    assert table[rel]["baseline"]["accuracy"] == (offsets[held] == k).mean()


def test_relation_labels():
  assert wbl.relation("nmod:poss") == "poss"
  assert wbl.relation("obl:tmod") == "obl"
  assert wbl.relation("nsubj") == "nsubj"


def test_committed_results_record_clark_s_definition():
  import json

  path = (
    pathlib.Path(__file__).resolve().parents[1] / "experiments" / "results" / f"{wbl.NAME}.json"
  )
  if not path.exists():
    return
  doc = json.loads(path.read_text())
  definition = doc["settings"]["clark_statistics"]
  assert (definition["weighting"], definition["punctuation"]) == ("document", "clark")
  assert definition["entropy_smoothing"] == 1e-4
  clark, variant = doc["results"]["clark"], doc["results"]["clark_token_all_punct"]
  assert clark["definition"]["punctuation_ids"] == 2
  assert variant["definition"] == {
    "weighting": "token",
    "punctuation": "all",
    "punctuation_ids": variant["definition"]["punctuation_ids"],
    "entropy_smoothing": 0.0,
  }
  for name in ("cls", "sep", "punct", "entropy"):
    np.testing.assert_allclose(clark["by_layer"][name], np.mean(clark[name], -1), atol=1e-12)
  sep = np.asarray(clark["by_layer"]["sep"])
  assert f"{sep.argmax() + 1} ({sep.max():.2f})" in doc["findings"][0]["measured"]
