"""Truncation and sliding windows against transformers' tokenizer on the real MiniLM files.

`Tokenizer.encode(..., truncation=..., max_length=N)` and `encode_words` must give
transformers' ids (longest_first for pairs, special tokens kept); `encode_windows` must
give the windows of `return_overflowing_tokens=True` with `stride`, and each window's
offset into the text's own tokens.
"""

import numpy as np
import pytest

import bertjax

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.hf

LONG = (
  "The keys to the cabinet, which nobody had seen for years, are on the table in the hall "
  "beside the old clock that stopped when the war began."
)
SHORT = "Nobody knows why."
MEDIUM = "She didn't like it, but she said nothing and went home early."


@pytest.fixture(scope="module")
def pair(minilm_dir):
  return (
    bertjax.Tokenizer.from_pretrained(minilm_dir),
    transformers.AutoTokenizer.from_pretrained(str(minilm_dir)),
  )


def _ids(batch, b=0):
  return batch.input_ids[b, : int(batch.attention_mask[b].sum())].tolist()


@pytest.mark.parametrize("max_length", [6, 9, 14, 25, 60])
@pytest.mark.parametrize("strategy", [True, "longest_first", "only_first"])
@pytest.mark.parametrize("second", [None, SHORT, MEDIUM])
def test_encode_truncation_equals_transformers(pair, max_length, strategy, second):
  ours, theirs = pair
  try:
    want = theirs(LONG, second, truncation=strategy, max_length=max_length)
  except Exception:  # noqa: BLE001 - transformers cannot cut this; neither may we, clearly
    with pytest.raises(ValueError, match=f"max_length={max_length}"):
      ours.encode(
        [LONG], None if second is None else [second], truncation=strategy, max_length=max_length
      )
    return
  got = ours.encode(
    [LONG], None if second is None else [second], truncation=strategy, max_length=max_length
  )
  assert _ids(got) == want["input_ids"]
  n = len(want["input_ids"])
  assert got.token_type_ids[0, :n].tolist() == want["token_type_ids"]
  assert n <= max_length and got.input_ids[0, 0] == ours.cls_id and _ids(got)[-1] == ours.sep_id


def test_only_second_and_a_batch_of_mixed_lengths(pair):
  ours, theirs = pair
  texts, seconds = [SHORT, MEDIUM, SHORT], [LONG, LONG, MEDIUM]
  got = ours.encode(texts, seconds, truncation="only_second", max_length=30, pad_to=32)
  want = theirs(texts, seconds, truncation="only_second", max_length=30)
  assert got.input_ids.shape == (3, 32)
  for b in range(3):
    assert _ids(got, b) == want["input_ids"][b]
  # Longest-first over a batch: each pair is cut on its own.
  texts, seconds = [SHORT, LONG, MEDIUM], [LONG, SHORT, MEDIUM]
  got = ours.encode(texts, seconds, truncation=True, max_length=20)
  want = theirs(texts, seconds, truncation=True, max_length=20)
  assert [_ids(got, b) for b in range(3)] == want["input_ids"]


def test_truncation_defaults_and_errors(pair):
  ours, theirs = pair
  long_text = " ".join([LONG] * 30)  # > 512 tokens
  with pytest.raises(ValueError, match="truncation=True"):
    ours.encode([long_text])
  got = ours.encode([long_text], truncation=True)  # max_length: the model's 512
  assert _ids(got) == theirs(long_text, truncation=True)["input_ids"]
  assert got.input_ids.shape[1] == 512
  with pytest.raises(ValueError, match="truncation='sideways'"):
    ours.encode([LONG], truncation="sideways", max_length=8)
  with pytest.raises(ValueError, match="only_second"):
    ours.encode([LONG], truncation="only_second", max_length=8)
  # The backend is left as it was: no truncation afterwards.
  assert ours.tokenizer.truncation is None
  with pytest.raises(ValueError, match="max_length=8"):
    ours.encode([LONG], max_length=8)


def test_encode_words_truncation_equals_transformers(pair, minilm_dir):
  ours, theirs = pair
  words = [LONG.split(), MEDIUM.split(), SHORT.split()]
  for max_length in (5, 12, 17):
    got = ours.encode_words(words, truncation=True, max_length=max_length)
    want = theirs(words, is_split_into_words=True, truncation=True, max_length=max_length)
    for b in range(3):
      assert _ids(got, b) == want["input_ids"][b]
      n = len(want["input_ids"][b])
      want_words = [-1 if w is None else w for w in want.word_ids(b)]
      assert got.word_ids[b, :n].tolist() == want_words


@pytest.mark.parametrize("max_length, stride", [(16, 0), (24, 5), (24, 11), (40, 8)])
def test_windows_equal_return_overflowing_tokens(pair, max_length, stride):
  ours, theirs = pair
  doc = " ".join([LONG, MEDIUM, SHORT] * 4)
  windows = ours.encode_windows(doc, max_length=max_length, stride=stride)
  want = theirs(
    doc, truncation=True, max_length=max_length, stride=stride, return_overflowing_tokens=True
  )["input_ids"]
  assert len(windows.sample) == len(want) > 3
  assert (windows.sample == 0).all()
  full = ours.encode([doc], max_length=100_000).input_ids[0, 1:-1]  # the text's own tokens
  for k, ids in enumerate(want):
    assert _ids(windows.batch, k) == ids
    content = np.asarray(ids[1:-1])
    start = int(windows.start[k])
    np.testing.assert_array_equal(full[start : start + len(content)], content)
    if k:  # consecutive windows share `stride` tokens
      prev = int(windows.start[k - 1])
      assert start - prev == max_length - 2 - stride
  assert windows.start[-1] + len(want[-1]) - 2 == len(full)  # the last window reaches the end


def test_windows_of_several_texts_with_a_question(pair):
  ours, theirs = pair
  docs = [" ".join([LONG] * 3), SHORT, " ".join([MEDIUM] * 5)]
  questions = ["Where are the keys?", "Who knows?", "What did she say?"]
  windows = ours.encode_windows(docs, questions, max_length=32, stride=6)
  got = [_ids(windows.batch, k) for k in range(len(windows.sample))]
  want = []
  for doc, q in zip(docs, questions):
    want += theirs(
      q, doc, truncation="only_second", max_length=32, stride=6, return_overflowing_tokens=True
    )["input_ids"]
  assert got == want
  assert windows.sample.tolist() == sorted(windows.sample.tolist()) and set(windows.sample) == {
    0,
    1,
    2,
  }
  for k in range(len(got)):
    i = int(windows.sample[k])
    types = windows.batch.token_type_ids[k, : len(got[k])]
    text_ids = np.asarray(got[k])[(types == 1)][:-1]  # segment 1 without its [SEP]
    full = ours.encode([docs[i]], max_length=100_000).input_ids[0, 1:-1]
    start = int(windows.start[k])
    np.testing.assert_array_equal(full[start : start + len(text_ids)], text_ids)
  with pytest.raises(ValueError, match="stride=30"):
    ours.encode_windows(docs, questions, max_length=32, stride=30)
