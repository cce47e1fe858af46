"""All-layer word features: equality with per-sentence passes, alignment, bucketing, cache."""

import numpy as np
import pytest

import bertjax
from bertjax.analysis.representations import features

SENTENCES = [
  ["Unbelievably", ",", "the", "hypothesized", "transformations", "worked", "."],
  ["Hi"],
  ["The", "cat", "sat", "on", "the", "mat", "in", "Reykjavík", "yesterday", "."],
  ["I", "can't", "believe", "it's", "not", "butter", "!"],
  ["Antidisestablishmentarianism", "is", "long"],
  ["A", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q"],
]


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
  return bertjax.Tokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def model():
  config = bertjax.BertConfig.preset("tiny", vocab_size=30522)
  return config, bertjax.init(config, 1)


def _reference(params, config, tokenizer, words, pooling):
  """One unpadded forward pass; word spans found by tokenising each word on its own."""
  pieces = [tokenizer.tokenizer.encode(w, add_special_tokens=False).ids for w in words]
  ids = np.asarray([[tokenizer.cls_id] + [i for p in pieces for i in p] + [tokenizer.sep_id]])
  hidden = np.asarray(
    bertjax.forward(params, config, ids, output_hidden_states=True).hidden_states
  )[:, 0]  # (L+1, T, H)
  out, start = [], 1
  for p in pieces:
    span = hidden[:, start : start + len(p)]
    out.append(span[:, 0] if pooling == "first" else span.mean(1))
    start += len(p)
  return np.stack(out, 1)  # (L+1, n_words, H)


@pytest.mark.parametrize("pooling", ["first", "mean"])
def test_one_pass_equals_per_sentence_passes(model, tokenizer, pooling):
  config, params = model
  wf = features.extract_word_features(
    params, config, tokenizer, SENTENCES, pooling=pooling, max_tokens=64, progress=False
  )
  assert wf.features.shape == (config.depth + 1, sum(map(len, SENTENCES)), config.hidden_size)
  assert wf.features.dtype == np.float32 and wf.missing_words == 0
  assert wf.num_batches > 1  # the budget forces several buckets
  for i, words in enumerate(SENTENCES):
    np.testing.assert_allclose(
      wf.sentence(i), _reference(params, config, tokenizer, words, pooling), atol=1e-5, rtol=0
    )
    np.testing.assert_array_equal(wf.sentence_index[wf.offsets[i] : wf.offsets[i + 1]], i)
    np.testing.assert_array_equal(
      wf.word_index[wf.offsets[i] : wf.offsets[i + 1]], np.arange(len(words))
    )


def test_alignment_of_words_split_into_several_subwords(model, tokenizer):
  config, params = model
  words = SENTENCES[0]
  split = [w for w in words if len(tokenizer.tokenizer.encode(w, add_special_tokens=False).ids) > 1]
  assert len(split) >= 2  # the sentence does exercise multi-piece words
  first = features.extract_word_features(params, config, tokenizer, [words], progress=False)
  mean = features.extract_word_features(
    params, config, tokenizer, [words], pooling="mean", progress=False
  )
  batch = tokenizer.encode_words([words])
  hidden = np.asarray(
    bertjax.forward(params, config, batch.input_ids, output_hidden_states=True).hidden_states
  )[:, 0]
  for w, word in enumerate(words):
    pos = np.flatnonzero(batch.word_ids[0] == w)
    np.testing.assert_allclose(first.features[:, w], hidden[:, pos[0]], atol=1e-6)
    np.testing.assert_allclose(mean.features[:, w], hidden[:, pos].mean(1), atol=1e-6)
    if word in split:
      assert len(pos) > 1 and not np.allclose(first.features[:, w], mean.features[:, w])


def test_float16_option(model, tokenizer):
  config, params = model
  a = features.extract_word_features(params, config, tokenizer, SENTENCES, progress=False)
  b = features.extract_word_features(
    params, config, tokenizer, SENTENCES, dtype="float16", progress=False
  )
  assert b.features.dtype == np.float16
  np.testing.assert_allclose(b.features, a.features, atol=2e-2, rtol=1e-2)
  with pytest.raises(ValueError, match="pooling='last'"):
    features.extract_word_features(params, config, tokenizer, SENTENCES, pooling="last")
  with pytest.raises(TypeError, match="sentences\\[0\\]"):
    features.extract_word_features(params, config, tokenizer, ["not split"])


def test_bucketing_wastes_little_padding(tokenizer, data_dir):
  from bertjax.data import conllu

  sents = conllu.read_conllu(data_dir / "ud_english_ewt" / "en_ewt-ud-dev.conllu", 600)
  enc = features._encode_all(tokenizer, [s.forms for s in sents], 512)
  lengths = np.asarray([len(ids) for ids, _ in enc])
  plan = features.plan_batches(lengths, max_tokens=4096)
  cells = sum(rows * width for _, rows, width in plan)
  waste = 1 - lengths.sum() / cells
  # Naive batching: corpus order, 64 per batch, padded to the longest in the batch.
  naive = sum(64 * lengths[i : i + 64].max() for i in range(0, len(lengths), 64))
  naive_waste = 1 - lengths.sum() / naive
  assert waste < 0.25 and waste < naive_waste / 2, (waste, naive_waste)
  assert sorted(np.concatenate([idx for idx, _, _ in plan]).tolist()) == list(range(len(lengths)))
  widths = {w for _, _, w in plan}
  assert len({(r, w) for _, r, w in plan}) <= 2 * len(widths)  # compiled shapes stay few
  assert all(w % 8 == 0 for w in widths)


def test_cache_reused_and_invalidated(model, tokenizer, tmp_path, monkeypatch):
  config, params = model
  kw = {"cache_dir": tmp_path, "progress": False}
  first = features.extract_word_features(params, config, tokenizer, SENTENCES, **kw)
  assert not first.from_cache and first.num_batches > 0 and first.cache_path.exists()

  def no_model(*args, **kwargs):
    raise AssertionError("the model ran although the cache should have been used")

  with monkeypatch.context() as m:
    m.setattr(features, "_extract", no_model)
    again = features.extract_word_features(params, config, tokenizer, SENTENCES, **kw)
  assert again.from_cache and again.num_batches == 0 and again.cache_path == first.cache_path
  assert isinstance(again.features, np.memmap)
  np.testing.assert_array_equal(again.features, first.features)

  mean = features.extract_word_features(params, config, tokenizer, SENTENCES, pooling="mean", **kw)
  assert not mean.from_cache and mean.cache_path != first.cache_path
  other = features.extract_word_features(
    bertjax.init(config, 2), config, tokenizer, SENTENCES, **kw
  )
  assert not other.from_cache  # new weights, new key
  fewer = features.extract_word_features(params, config, tokenizer, SENTENCES[:3], **kw)
  assert not fewer.from_cache  # new data, new key
  assert len(list(tmp_path.glob("*.tmp*"))) == 0
