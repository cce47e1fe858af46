"""The modern families' tokenizers against transformers', on UD EWT dev text.

MPNet: the real all-mpnet-base-v2 files (tokenizer.json, and vocab.txt alone through
MPNetTokenizerFast's `<s> A </s></s> B </s>` template). ModernBERT and EuroBERT ship a
byte-level BPE `tokenizer.json` (no hub here): one is trained in the test in each family's
layout (ModernBERT: `[CLS] A [SEP]`, `[MASK]` with lstrip; EuroBERT: Llama 3's split regex
and `<|begin_of_text|> A <|end_of_text|>`), saved with the family's tokenizer_config.json,
and read by bertjax and by transformers' AutoTokenizer: ids, pairs and roles equal.
"""

import json
import shutil

import pytest

import bertjax

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

pytestmark = [pytest.mark.hf, pytest.mark.data]

# Llama 3's pre-tokenizer pattern (EuroBERT's tokenizer.json).
LLAMA3_SPLIT = (
  r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
  r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _ud_texts(data_dir, limit=500):
  texts = []
  for line in (data_dir / "ud_english_ewt" / "en_ewt-ud-dev.conllu").open(encoding="utf-8"):
    if line.startswith("# text = "):
      texts.append(line[len("# text = ") :].rstrip("\n"))
      if len(texts) == limit:
        break
  return texts


def _same_ids(ours, theirs, texts):
  got = ours.encode(texts)
  for b, text in enumerate(texts):
    want = theirs(text)["input_ids"]
    n = int(got.attention_mask[b].sum())
    assert got.input_ids[b, :n].tolist() == want, text
  pair = ours.encode(texts[:3], texts[3:6])
  for b in range(3):
    want = theirs(texts[b], texts[3 + b])["input_ids"]
    assert pair.input_ids[b, : len(want)].tolist() == want


def _byte_bpe(texts, specials, split=None):
  from tokenizers import decoders, models, pre_tokenizers, trainers

  tok = tokenizers.Tokenizer(models.BPE())
  byte = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split is None)
  tok.pre_tokenizer = (
    byte
    if split is None
    else pre_tokenizers.Sequence([pre_tokenizers.Split(tokenizers.Regex(split), "isolated"), byte])
  )
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=700, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
  )
  tok.train_from_iterator(texts, trainer)
  return tok


def _template(tok, single, pair, specials):
  from tokenizers import processors

  tok.post_processor = processors.TemplateProcessing(
    single=single, pair=pair, special_tokens=[(t, tok.token_to_id(t)) for t in specials]
  )


def test_modernbert_tokenizer_json(tmp_path, data_dir):
  texts = _ud_texts(data_dir)
  specials = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]", "|||IP_ADDRESS|||"]
  tok = _byte_bpe(texts, specials)
  _template(tok, "[CLS] $A [SEP]", "[CLS] $A [SEP] $B:1 [SEP]:1", ["[CLS]", "[SEP]"])
  tok.add_special_tokens([tokenizers.AddedToken("[MASK]", lstrip=True, normalized=False)])
  tok.save(str(tmp_path / "tokenizer.json"))
  (tmp_path / "tokenizer_config.json").write_text(
    json.dumps(
      {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 8192,
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "mask_token": "[MASK]",
        "model_input_names": ["input_ids", "attention_mask"],
      }
    )
  )
  (tmp_path / "config.json").write_text(json.dumps({"model_type": "modernbert"}))
  ours = bertjax.Tokenizer.from_pretrained(tmp_path)
  theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  _same_ids(ours, theirs, texts)
  assert (ours.cls_id, ours.sep_id, ours.pad_id, ours.mask_id) == (
    theirs.cls_token_id,
    theirs.sep_token_id,
    theirs.pad_token_id,
    theirs.mask_token_id,
  )
  assert not ours.token_types  # ModernBERT has no token types
  masked = "The capital of France is [MASK]."  # [MASK] takes the space before it (lstrip)
  assert ours.encode([masked]).input_ids[0].tolist() == theirs(masked)["input_ids"]


def test_eurobert_tokenizer_json(tmp_path, data_dir):
  texts = _ud_texts(data_dir)
  specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|mask|>", "<|pad|>"]
  tok = _byte_bpe(texts, specials, split=LLAMA3_SPLIT)
  _template(
    tok,
    "<|begin_of_text|> $A <|end_of_text|>",
    "<|begin_of_text|> $A <|end_of_text|> $B:1 <|end_of_text|>:1",
    ["<|begin_of_text|>", "<|end_of_text|>"],
  )
  tok.save(str(tmp_path / "tokenizer.json"))
  (tmp_path / "tokenizer_config.json").write_text(
    json.dumps(
      {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 8192,
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|end_of_text|>",
        "cls_token": "<|begin_of_text|>",
        "sep_token": "<|end_of_text|>",
        "pad_token": "<|end_of_text|>",
        "mask_token": "<|mask|>",
      }
    )
  )
  (tmp_path / "config.json").write_text(json.dumps({"model_type": "eurobert"}))
  ours = bertjax.Tokenizer.from_pretrained(tmp_path)
  theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  _same_ids(ours, theirs, texts)
  assert (ours.cls_id, ours.sep_id, ours.pad_id, ours.mask_id) == (
    theirs.cls_token_id,
    theirs.sep_token_id,
    theirs.pad_token_id,
    theirs.mask_token_id,
  )


def test_mpnet_wordpiece(tmp_path, data_dir, mpnet_dir):
  texts = _ud_texts(data_dir)
  ours = bertjax.Tokenizer.from_pretrained(mpnet_dir)
  theirs = transformers.MPNetTokenizerFast.from_pretrained(str(mpnet_dir))
  _same_ids(ours, theirs, texts)
  # vocab.txt alone (no tokenizer.json): MPNet's template, not BERT's.
  for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "config.json"):
    shutil.copy(mpnet_dir / name, tmp_path / name)
  bare = bertjax.Tokenizer.from_pretrained(tmp_path)
  _same_ids(bare, theirs, texts)
  pair = bare.encode(["a"], ["c"]).input_ids[0].tolist()  # <s> a </s></s> c </s>
  assert pair[0] == theirs.cls_token_id and pair[2:4] == [theirs.sep_token_id] * 2
