"""The negation and indirect-object tasks' counterfactual pairs (`bertjax.tasks.counterfactual`),
with the real all-MiniLM-L6-v2 tokenizer: base and source differ in the one token that carries
the variable (the polarity word, the repeated name), `positions` points at it and `target` at
the mask; each pair's candidates and labels follow the task's high-level model, read back from
the sentences' own tokens."""

import numpy as np
import pytest

import bertjax
from bertjax.tasks import counterfactual as cf


@pytest.fixture(scope="module")
def tok():
  return bertjax.Tokenizer.from_pretrained(bertjax.minilm_path())


def _word(tok, ids, i, j):
  return tok.convert_ids_to_tokens([int(ids[i, j])])[0]


def _aligned(tok, p):
  """The mask at `target`, and base and source differing in exactly the `positions` column."""
  rows = np.arange(len(p.target))
  assert (p.base_ids[rows, p.target] == tok.mask_id).all()
  differs = p.base_ids != p.source_ids
  assert (differs.sum(1) == 1).all() and differs[rows, p.positions[:, 0]].all()
  return rows


def test_negation_pairs_flip_the_polarity(tok):
  got = cf.negation_pairs(tok, 40, seed=2)
  p = got.pairs
  rows = _aligned(tok, p)
  antonym = {a: b for _, a, b in cf.ANTONYMS} | {b: a for _, a, b in cf.ANTONYMS}
  for i in rows:
    pol = _word(tok, p.base_ids, i, p.positions[i, 0])
    stated = _word(tok, p.base_ids, i, p.positions[i, 0] + 1)
    answer = antonym[stated] if pol == "not" else stated  # the high-level model
    words = tok.convert_ids_to_tokens([int(c) for c in p.candidates[i]])
    assert words == [stated, antonym[stated]]
    assert words[got.base_label[i]] == answer and p.label[i] == 1 - got.base_label[i]
    assert {pol, _word(tok, p.source_ids, i, p.positions[i, 0])} == set(cf.POLARITY)
  assert 10 < got.base_label.sum() < 30  # both polarities in the base
  assert got.base_text[0].count(tok.convert_ids_to_tokens([tok.mask_id])[0]) == 1


def test_ioi_pairs_swap_the_repeated_name(tok):
  got = cf.ioi_pairs(tok, 30, seed=5)
  p = got.pairs
  rows = _aligned(tok, p)
  for i in rows:
    names = tok.convert_ids_to_tokens([int(c) for c in p.candidates[i]])
    repeated = _word(tok, p.base_ids, i, p.positions[i, 0])
    assert repeated in names and names[0] != names[1]
    assert names[got.base_label[i]] != repeated  # the answer: the name not repeated
    assert names[p.label[i]] == repeated  # the source repeats the other name
    assert list(p.base_ids[i]).count(p.candidates[i, got.base_label[i]]) == 1
  assert 5 < got.base_label.sum() < 25


def test_bad_requests_are_refused(tok, monkeypatch):
  monkeypatch.setattr(cf, "NAMES", ("mary", "xqzzyv", "john"))
  with pytest.raises(ValueError, match="only 2 of the task's names are one token"):
    cf.ioi_pairs(tok, 4)
  monkeypatch.setattr(cf, "POLARITY", ("still", "notwithstandingly"))
  with pytest.raises(ValueError, match="polarity words .* must be one token"):
    cf.negation_pairs(tok, 4)


def test_for_patching_gives_the_circuit_tools_the_same_pairs(tok):
  """`CounterfactualPairs.for_patching`: base clean, source corrupted; the answer is the base's
  own (in IOI the name said once, in agreement the verb agreeing with the base subject), the
  distractor the source's, read at the mask; the shared (C,) and per-pair (B, C) candidates
  alike."""
  from bertjax.tasks import agreement

  ioi = cf.ioi_pairs(tok, 12, seed=1)
  clean, corrupted, targets = ioi.pairs.for_patching(ioi.base_label)
  np.testing.assert_array_equal(clean["input_ids"], ioi.pairs.base_ids)
  np.testing.assert_array_equal(corrupted["input_ids"], ioi.pairs.source_ids)
  np.testing.assert_array_equal(targets["position"], ioi.pairs.target)
  for i in range(12):
    ids = list(clean["input_ids"][i])
    assert ids.count(targets["answer"][i]) == 1 and ids.count(targets["distractor"][i]) == 2
  agr = agreement.agreement_pairs(tok, 8, seed=0)
  _, _, t = agr.pairs.for_patching(agr.base_label)
  verbs = np.asarray(tok.convert_tokens_to_ids(["is", "are"]))
  np.testing.assert_array_equal(t["answer"], verbs[agr.base_label])
  np.testing.assert_array_equal(t["distractor"], verbs[1 - agr.base_label])
  with pytest.raises(ValueError, match=r"base_label shape \(3,\) must be \(8,\)"):
    agr.pairs.for_patching(agr.base_label[:3])
