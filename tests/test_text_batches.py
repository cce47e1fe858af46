"""`bertjax.tasks.text_batches` with MiniLM's real tokenizer: which sentences a model reads whole,
and the even spread of indices."""

import numpy as np
import pytest

import bertjax
from bertjax.tasks import text_batches


@pytest.fixture(scope="module")
def tok(minilm_dir):
  return bertjax.Tokenizer.from_pretrained(minilm_dir)


def test_fitting_keeps_the_sentences_read_whole(tok):
  words = [["The", "cat", "sat", "."], ["Rain", "."], ["An", "extraordinarily"] * 300]
  lengths = [
    len(tok.encode_words([w], truncation=False, max_length=10**6).input_ids[0]) for w in words
  ]
  assert lengths[2] > 512  # longer than the model: counted whole, never cut to fit
  for limit in (lengths[1] - 1, lengths[1], lengths[0], lengths[2]):
    want = [i for i, n in enumerate(lengths) if n <= limit]
    np.testing.assert_array_equal(text_batches.fitting(tok, words, limit), want)
  assert text_batches.fitting(tok, [], 8).size == 0


def test_spread_is_even_and_whole_when_asked_for_all():
  np.testing.assert_array_equal(text_batches.spread(5, None), np.arange(5))
  np.testing.assert_array_equal(text_batches.spread(5, 9), np.arange(5))
  np.testing.assert_array_equal(text_batches.spread(9, 3), [0, 4, 8])


def test_first_fitting_is_one_padded_batch_of_whole_sentences(tok):
  words = [["An", "extraordinarily"] * 30, ["The", "cat", "sat", "."], ["Rain", "."], ["Go", "."]]
  b = text_batches.first_fitting(tok, words, 2, 16)
  assert b.input_ids.shape == b.attention_mask.shape == (2, 16)
  want = tok.encode_words(words[1:3], pad_to=16)
  np.testing.assert_array_equal(b.input_ids, want.input_ids)
  np.testing.assert_array_equal(b.attention_mask.sum(-1), [6, 4])
  with pytest.raises(ValueError, match="only 3 sentences fit in 16 tokens; 4 are needed"):
    text_batches.first_fitting(tok, words, 4, 16)


def test_fitting_batches_index_the_sentences_given(tok):
  words = [["Rain", "."], ["An", "extraordinarily"] * 30, ["The", "cat", "sat", "."], ["Go", "."]]
  got = text_batches.fitting_batches(tok, words, batch_size=2, max_tokens=16)
  assert sorted(i for idx, _ in got for i in idx) == [0, 2, 3]  # the long one is left out
  for idx, b in got:
    want = tok.encode_words([words[i] for i in idx], pad_to=b["input_ids"].shape[1])
    np.testing.assert_array_equal(b["input_ids"], want.input_ids)
