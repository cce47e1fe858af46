"""Clark et al.'s attention-based dependency probe (`bertjax.analysis.attention.syntax`):
word-level maps equal `statistics.word_attention`, a head attending to the gold head scores
1, the offset baseline equals NumPy's counts, and on the real MiniLM and UD sentences the
probe equals a per-arc loop written from the paper's definition."""

import numpy as np
import pytest

import bertjax
from bertjax.analysis.attention import statistics, syntax
from bertjax.analysis.attention.statistics import word_attention

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
  ours = syntax.word_maps(attn, WORD_IDS, MASK, 5)
  ref, groups = word_attention(attn, WORD_IDS, MASK, keep_special=False)
  np.testing.assert_array_equal(groups, np.arange(5))
  np.testing.assert_allclose(ours, ref, atol=1e-12)


def test_attention_to_the_head_gives_accuracy_one():
  rng = np.random.default_rng(1)
  to_head = _attending(HEADS - 1, rng)  # the root attends to "itself": excluded, random pick
  to_dep = _attending(np.array([-1, 0, -1, -1, 3]), rng)  # heads attend to one dependent each
  maps = syntax.word_maps(np.stack([to_head, to_dep]), WORD_IDS, MASK, 5)
  pred = syntax.predictions(maps)
  arcs, dep_to_head, head_to_dep = syntax.arc_hits(pred, HEADS)
  np.testing.assert_array_equal(arcs, [0, 2, 3, 4])
  assert dep_to_head[:, 0].all()  # map 0: every dependent's top word is its head
  # Map 1: word 1 attends to word 0 and word 4 to word 3, so exactly those arcs hit.
  np.testing.assert_array_equal(head_to_dep[:, 1], [True, False, True, False])
  table = syntax.probe_table(
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
  table = syntax.probe_table(rels, offsets, split, hits, hits, ["x", "y", "all"], (2, 2))
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


def test_held_out_hits_are_what_the_accuracies_average():
  """With `sentences`, each row keeps its held-out arcs' sentences and the 0/1 hits of each
  direction's best head and of the offset; `probe_results` moves them to `held_out`, the head
  of the direction chosen on the selection half beside the offset's."""
  rng = np.random.default_rng(3)
  n = 300
  rels, split = rng.choice(["x", "y"], n), rng.integers(0, 2, n)
  offsets = rng.choice([-1, 1, 2], n)
  dep, head = rng.random((n, 4)) < 0.4, rng.random((n, 4)) < 0.6
  sentences = np.arange(n) // 3
  table = syntax.probe_table(rels, offsets, split, dep, head, ["x", "y"], (2, 2), sentences)
  for rel in ("x", "y"):
    row, held = table[rel], (rels == rel) & (split == 1)
    assert row["held_out_sentence"].tolist() == sentences[held].tolist()
    for name in ("dep_to_head", "head_to_dep", "baseline"):
      assert row[name]["held_out_hits"].mean() == row[name]["accuracy"]
  out = syntax.probe_results(table, ["x", "y"], [])
  assert "held_out_hits" not in out["relations"]["x"]["baseline"]
  for rel in ("x", "y"):
    kept, chosen = out["held_out"][rel], out["direction_chosen"][rel]
    assert kept["head"].mean() == out["accuracy_chosen_direction"][rel]
    assert chosen == "head_to_dep"  # its hits are likelier on the selection half too
    assert kept["offset"].mean() == table[rel]["baseline"]["accuracy"]
  assert "held_out" not in syntax.probe_results(
    syntax.probe_table(rels, offsets, split, dep, head, ["x"], (2, 2)), ["x"], []
  )


def test_relation_labels():
  assert syntax.relation("nmod:poss") == "poss"
  assert syntax.relation("obl:tmod") == "obl"
  assert syntax.relation("nsubj") == "nsubj"


@pytest.fixture(scope="module")
def minilm_probe(minilm_dir, data_dir):
  """The probe on the real MiniLM over 12 UD English EWT dev sentences, with its inputs."""
  from bertjax.data import conllu

  config, params = bertjax.from_hf(minilm_dir)
  tok = bertjax.Tokenizer.from_pretrained(minilm_dir)
  ud = conllu.read_conllu(data_dir / "ud_english_ewt" / "en_ewt-ud-dev.conllu", max_sentences=12)
  batches = []
  for idx in (np.arange(0, 6), np.arange(6, 12)):
    b = tok.encode_words([list(ud[i].forms) for i in idx])
    batches.append(
      (
        idx,
        {f: getattr(b, f) for f in ("input_ids", "attention_mask", "token_type_ids", "word_ids")},
      )
    )
  punct = statistics.clark_punctuation_ids(tok)
  probe = syntax.dependency_probe(params, config, batches, ud, 3, (tok.sep_id, punct, 1e-4))
  return config, params, tok, ud, batches, punct, probe


def _top_word(a, word_ids, n: int, w: int) -> np.ndarray:
  """(maps,): the word that word `w` attends to most in each map `a` (maps, T, T), itself
  excluded."""
  queries = np.flatnonzero(word_ids == w)
  score = [
    a[:, queries][:, :, word_ids == v].sum(-1).mean(-1) if v != w else np.full(len(a), -np.inf)
    for v in range(n)
  ]
  return np.stack(score, -1).argmax(-1)


def _loop_hits(config, params, ud, batches):
  """Clark et al.'s probe written arc by arc from the paper: a word's attention to another is
  the sum over that word's subword keys, averaged over its own subword queries; [CLS], [SEP]
  and the word itself are never predicted. Returns the relations of the arcs and the hits
  (arcs, layers * heads) of dependent -> head and head -> dependent."""
  rels, dep_hits, head_hits = [], [], []
  for idx, b in batches:
    maps = np.asarray(
      bertjax.forward(
        params, config, b["input_ids"], b["attention_mask"], output_attentions=True
      ).attentions,
      np.float64,
    )  # (L, batch, heads, T, T)
    for row, i in enumerate(idx):
      sent, word_ids = ud[i], b["word_ids"][row]
      n = sent.num_words
      a = maps[:, row].reshape(-1, *maps.shape[-2:])  # (L * heads, T, T)

      tops = [_top_word(a, word_ids, n, w) for w in range(n)]
      for d, h in enumerate(sent.heads_array()):
        if h == 0:
          continue
        rels.append(syntax.relation(sent.deprels[d]))
        dep_hits.append(tops[d] == h - 1)
        head_hits.append(tops[h - 1] == d)
  return np.asarray(rels), np.asarray(dep_hits), np.asarray(head_hits)


@pytest.mark.data
def test_the_probe_on_minilm_equals_an_arc_by_arc_loop(minilm_probe):
  config, params, tok, ud, batches, punct, probe = minilm_probe
  rels, dep_hits, head_hits = _loop_hits(config, params, ud, batches)
  assert probe["arcs"] == len(rels) == sum(int((s.heads_array() > 0).sum()) for s in ud)
  assert probe["counts"] == {r: int((rels == r).sum()) for r in set(rels)}
  grid = (config.depth, config.num_attention_heads)
  keep = rels != "punct"
  for name, hits in (("dep_to_head", dep_hits), ("head_to_dep", head_hits)):
    got = np.asarray(probe["table"]["all"][name]["per_head_in_sample"])
    np.testing.assert_allclose(got, hits[keep].mean(0).reshape(grid), atol=1e-12)
    for r in probe["frequent"]:
      want = hits[rels == r].mean(0)
      assert probe["table"][r][name]["in_sample_accuracy"] == pytest.approx(want.max())
  assert max(probe["check"]) < 1e-6 and probe["check"]
  # Per sentence, Clark's statistics averaged over sentences are the library's document-
  # weighted ones.
  plain = [{k: v for k, v in b.items() if k != "word_ids"} for _, b in batches]
  ref = statistics.clark_statistics(
    params,
    config,
    plain,
    sep_id=tok.sep_id,
    punct_ids=punct,
    weighting="document",
    entropy_smoothing=1e-4,
  )
  for k in syntax.SENTENCE_STATS:
    assert probe["per_sentence"][k].shape == (12, config.depth)
    np.testing.assert_allclose(
      probe["per_sentence"][k].mean(0), np.asarray(ref[k]).mean(-1), atol=1e-5
    )
  by_layer = {k: np.asarray(ref[k]).mean(-1) for k in syntax.SENTENCE_STATS}
  assert syntax.per_sentence_gap(probe["per_sentence"], by_layer) < 1e-5
  by_layer["sep"] = by_layer["sep"] + 0.25  # one statistic off by 0.25: the gap names it
  assert syntax.per_sentence_gap(probe["per_sentence"], by_layer) == pytest.approx(0.25, abs=1e-5)
