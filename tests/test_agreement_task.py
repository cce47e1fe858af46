"""The subject-verb agreement task's counterfactual pairs (`bertjax.tasks.agreement`), with the
real all-MiniLM-L6-v2 tokenizer: base and source differ only in the subject, whose number is
opposite; the label is the verb form agreeing with the source, the base label the base's;
positions point at the subject and target at the mask."""

import numpy as np
import pytest

import bertjax
from bertjax.tasks import agreement


@pytest.fixture(scope="module")
def tok():
  return bertjax.Tokenizer.from_pretrained(bertjax.minilm_path())


def test_pairs_differ_in_the_subject_and_its_number(tok):
  got = agreement.agreement_pairs(tok, 40, seed=3)
  p = got.pairs
  assert p.base_ids.shape == p.source_ids.shape == (40, 10)
  differs = p.base_ids != p.source_ids
  assert differs[:, 2].all() and not np.delete(differs, 2, axis=1).any()
  plural = {tok.convert_tokens_to_ids([pl])[0]: 1 for _, pl in agreement.NOUNS}
  number = lambda ids: np.asarray([plural.get(int(t), 0) for t in ids[:, 2]])
  np.testing.assert_array_equal(number(p.base_ids), got.base_label)
  np.testing.assert_array_equal(number(p.source_ids), p.label)
  assert (p.label != got.base_label).all()
  assert (p.base_ids[np.arange(40), p.target] == tok.mask_id).all()
  np.testing.assert_array_equal(p.candidates, tok.convert_tokens_to_ids(["is", "are"]))
  assert got.attractor.sum() == 20 and got.base_text[1].startswith("the ")
  # An attractor is always of the base subject's other number.
  for i in np.flatnonzero(got.attractor):
    attr = int(p.base_ids[i, 5])
    assert plural.get(attr, 0) != got.base_label[i]


def test_bad_requests_are_refused(tok):
  with pytest.raises(ValueError, match="verb=.*must be one of"):
    agreement.agreement_pairs(tok, 4, verb=("am", "are"))
  pairs = agreement.agreement_pairs(tok, 8, verb=("was", "were")).pairs
  np.testing.assert_array_equal(pairs.candidates, tok.convert_tokens_to_ids(["was", "were"]))
