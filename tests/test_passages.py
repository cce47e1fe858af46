"""Passages of consecutive sentences (`bertjax.tasks.passages`) with MiniLM's real tokenizer."""

import numpy as np
import pytest

import bertjax
from bertjax.tasks import passages

SENTENCES = [
  "The cat sat on the mat.",
  "It did not move.",
  "Nobody knew why the dog barked at midnight.",
  "Rain fell.",
  "The committee postponed its decision until next spring.",
]


@pytest.fixture(scope="module")
def tok(minilm_dir):
  return bertjax.Tokenizer.from_pretrained(minilm_dir)


def test_joined_passages_reach_the_target_with_whole_sentences(tok):
  got = passages.joined(SENTENCES, tok, target=14, count=3)
  assert " ".join(got) == " ".join(SENTENCES[: sum(p.count(".") for p in got)])
  lengths = tok.encode(got).attention_mask.sum(-1)
  assert all(n >= 14 for n in lengths[:-1]) and len(got) <= 3
  assert passages.joined(SENTENCES, tok, target=1000, count=2) == [" ".join(SENTENCES)]
  with pytest.raises(ValueError, match="count=0"):
    passages.joined(SENTENCES, tok, target=14, count=0)


def test_fixed_length_passages_are_consecutive_word_pieces(tok):
  words = [s.split() for s in SENTENCES]
  pieces = passages.sentence_pieces(tok, words, batch=2)
  assert len(pieces) == 5
  want = tok.encode_words([words[2]]).input_ids[0]
  np.testing.assert_array_equal(pieces[2], want[1 : len(pieces[2]) + 1])
  assert tok.cls_id not in np.concatenate(pieces) and tok.sep_id not in np.concatenate(pieces)
  p = passages.fixed_length(pieces, 12, 6, tok.cls_id, tok.sep_id, seed=0)
  assert p.shape == (6, 12) and np.all(p[:, 0] == tok.cls_id) and np.all(p[:, -1] == tok.sep_id)
  flat, starts = np.concatenate(pieces * 2), np.cumsum([0] + [len(x) for x in pieces])[:-1]
  for row in p:  # consecutive sentences from a sentence start, wrapping around
    assert any(np.array_equal(row[1:-1], flat[s : s + 10]) for s in starts)


def test_fixed_length_refuses_what_it_cannot_build():
  stream = [np.arange(10, 15), np.arange(20, 23)]
  with pytest.raises(ValueError, match="fewer than length=100"):
    passages.fixed_length(stream, 100, 1, 1, 2)
  with pytest.raises(ValueError, match="length=2 must be >= 3"):
    passages.fixed_length(stream, 2, 1, 1, 2)


def test_paragraphs_skip_headings_and_short_lines(tmp_path):
  f = tmp_path / "t.txt"
  f.write_text(" = Heading = \n\n short line here .\n" + " ".join(["word"] * 13) + "\n")
  assert passages.wikitext_paragraphs(f) == [" ".join(["word"] * 13)]
