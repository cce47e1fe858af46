"""Tokenizers of every format against transformers' tokenizers, on tokenizers trained here.

A byte-level BPE (RoBERTa's vocab.json + merges.txt), a WordPiece (vocab.txt)
and a SentencePiece model (ALBERT's spiece.model), each trained in the test on
the project's sentences, saved in its family's file format, then loaded by
bertjax and by transformers: ids equal on the project's sentences and on the
UD EWT dev text; special-token roles come from the files (`<s>` is RoBERTa's
[CLS]); pre-split words align to byte-level BPE subwords.
"""

import json

import numpy as np
import pytest

import bertjax

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

pytestmark = pytest.mark.hf

SENTENCES = [
  "The keys to the cabinet are on the table.",
  "She didn't like it, did she?",
  "Colorless green ideas sleep furiously.",
  "A robin is a bird; a rose is not.",
  "Nobody has ever seen it never.",
]


def _ud_texts(data_dir, limit=400):
  texts = []
  for line in (data_dir / "ud_english_ewt" / "en_ewt-ud-dev.conllu").open(encoding="utf-8"):
    if line.startswith("# text = "):
      texts.append(line[len("# text = ") :].rstrip("\n"))
      if len(texts) == limit:
        break
  return texts


@pytest.fixture(scope="module")
def corpus(data_dir):
  return SENTENCES + _ud_texts(data_dir)


def _compare(ours, theirs, texts):
  got = ours.encode(texts)
  for b, text in enumerate(texts):
    want = theirs(text)["input_ids"]
    n = int(got.attention_mask[b].sum())
    assert got.input_ids[b, :n].tolist() == want, text


@pytest.mark.data
def test_byte_level_bpe_vocab_and_merges(tmp_path, corpus):
  bpe = tokenizers.ByteLevelBPETokenizer()
  bpe.train_from_iterator(
    corpus,
    vocab_size=600,
    min_frequency=2,
    special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
  )
  bpe.save_model(str(tmp_path))  # vocab.json + merges.txt, as RoBERTa ships them
  (tmp_path / "config.json").write_text(json.dumps({"model_type": "roberta"}))
  ours = bertjax.Tokenizer.from_pretrained(tmp_path)
  theirs = transformers.RobertaTokenizerFast.from_pretrained(str(tmp_path))
  _compare(ours, theirs, corpus)
  vocab = json.loads((tmp_path / "vocab.json").read_text())
  assert (ours.cls_id, ours.sep_id, ours.pad_id, ours.mask_id) == (
    vocab["<s>"],
    vocab["</s>"],
    vocab["<pad>"],
    vocab["<mask>"],
  )
  # Pairs: <s> A </s></s> B </s>, as transformers builds them.
  pair = ours.encode(SENTENCES[:2], SENTENCES[2:4])
  want = theirs(SENTENCES[0], SENTENCES[2])["input_ids"]
  assert pair.input_ids[0, : len(want)].tolist() == want
  # Pre-split words: every word gets its leading space (add_prefix_space=True).
  words = [s.rstrip(".?").split() for s in SENTENCES]
  batch = ours.encode_words(words)
  split = transformers.RobertaTokenizerFast.from_pretrained(str(tmp_path), add_prefix_space=True)
  for b, w in enumerate(words):
    enc = split(w, is_split_into_words=True)
    n = len(enc["input_ids"])
    assert batch.input_ids[b, :n].tolist() == enc["input_ids"]
    want_words = [-1 if i is None else i for i in enc.word_ids()]
    assert batch.word_ids[b, :n].tolist() == want_words


@pytest.mark.data
def test_wordpiece_vocab_txt(tmp_path, corpus):
  wp = tokenizers.BertWordPieceTokenizer(lowercase=True)
  wp.train_from_iterator(
    corpus, vocab_size=500, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  )
  wp.save_model(str(tmp_path))
  ours = bertjax.Tokenizer.from_pretrained(tmp_path)
  theirs = transformers.BertTokenizerFast.from_pretrained(str(tmp_path))
  _compare(ours, theirs, corpus)
  assert ours.convert_ids_to_tokens([ours.cls_id, ours.sep_id]) == ["[CLS]", "[SEP]"]
  assert ours.encode(["a b"], ["c d"]).token_type_ids.max() == 1
  # DistilBERT has no token types: pairs get all-zero ids, as its model needs.
  (tmp_path / "config.json").write_text(json.dumps({"model_type": "distilbert"}))
  distil = bertjax.Tokenizer.from_pretrained(tmp_path)
  pair = distil.encode(["a b"], ["c d"])
  assert (
    not pair.token_type_ids.any()
    and (pair.input_ids == ours.encode(["a b"], ["c d"]).input_ids).all()
  )


@pytest.mark.data
def test_sentencepiece_model(tmp_path, corpus):
  spm = pytest.importorskip("sentencepiece")
  spm.SentencePieceTrainer.train(
    sentence_iterator=iter(corpus),
    model_prefix=str(tmp_path / "spiece"),
    vocab_size=300,
    pad_id=0,
    unk_id=1,
    bos_id=2,
    eos_id=3,
    user_defined_symbols=["[MASK]"],
    control_symbols=["[CLS]", "[SEP]"],
    model_type="unigram",
  )
  (tmp_path / "config.json").write_text(json.dumps({"model_type": "albert"}))
  ours = bertjax.Tokenizer.from_pretrained(tmp_path)
  theirs = transformers.AlbertTokenizerFast.from_pretrained(str(tmp_path))
  _compare(ours, theirs, corpus)
  assert ours.cls_token == "[CLS]" and ours.pad_id == 0


@pytest.mark.data
def test_xlm_roberta_sentencepiece_bpe_model(tmp_path, corpus):
  """XLM-R's `sentencepiece.bpe.model` (fairseq's id offset, <s> <pad> </s> <unk> first and
  <mask> last) against transformers' XLMRobertaTokenizerFast built from the same file."""
  spm = pytest.importorskip("sentencepiece")
  spm.SentencePieceTrainer.train(
    sentence_iterator=iter(corpus),
    model_prefix=str(tmp_path / "sentencepiece.bpe"),
    vocab_size=300,
    model_type="bpe",
  )  # sentencepiece's ids: <unk> 0, <s> 1, </s> 2
  (tmp_path / "config.json").write_text(json.dumps({"model_type": "xlm-roberta"}))
  ours = bertjax.Tokenizer.from_pretrained(tmp_path)
  theirs = transformers.XLMRobertaTokenizerFast.from_pretrained(str(tmp_path))
  _compare(ours, theirs, corpus)
  assert (ours.cls_id, ours.pad_id, ours.sep_id, ours.mask_id) == (
    theirs.cls_token_id,
    theirs.pad_token_id,
    theirs.sep_token_id,
    theirs.mask_token_id,
  )
  assert (ours.cls_token, ours.mask_token) == ("<s>", "<mask>") and ours.pad_id == 1


def test_roles_from_tokenizer_config(tmp_path):
  """Declared roles win over the vocabulary's conventions."""
  vocab = {t: i for i, t in enumerate(["<pad>", "<unk>", "<bos>", "<eos>", "<m>", "a", "b"])}
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
  tok.save(str(tmp_path / "tokenizer.json"))
  (tmp_path / "tokenizer_config.json").write_text(
    json.dumps(
      {
        "cls_token": "<bos>",
        "sep_token": {"content": "<eos>"},
        "mask_token": "<m>",
        "pad_token": "<pad>",
      }
    )
  )
  ours = bertjax.Tokenizer.from_pretrained(tmp_path)
  assert (ours.cls_id, ours.sep_id, ours.mask_id, ours.pad_id) == (2, 3, 4, 0)
  assert np.isin([2, 3, 4, 0], list(ours.special_ids)).all()
