"""Clark statistics, Kovaleva patterns, attention change and effective attention vs NumPy references."""

import jax
import numpy as np
import pytest

import bertjax
from bertjax.analysis import attention as at

CONFIG = bertjax.BertConfig.preset("tiny", vocab_size=101)  # 2 layers x 4 heads, head_dim 16
CLS, SEP = 1, 2
PUNCT = np.array([3, 4, 5], np.int32)


@pytest.fixture(scope="module")
def params():
  p = bertjax.init(CONFIG, 11)
  rng = np.random.default_rng(4)  # NumPy noise: no per-shape compilation
  return jax.tree.map(lambda x: x + 0.3 * rng.standard_normal(x.shape).astype(np.float32), p)


def _batch(seed, batch=3, seq=20):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(6, seq + 1, batch)
  lengths[0] = seq
  ids = rng.integers(3, CONFIG.vocab_size, (batch, seq)).astype(np.int32)
  mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
  ids[:, 0] = CLS
  ids[np.arange(batch), lengths - 1] = SEP
  ids[0, seq // 2] = SEP  # a sentence pair
  types = np.zeros_like(ids)
  types[0, seq // 2 + 1:] = 1
  ids = np.where(mask > 0, ids, 0)
  return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types * mask}


BATCHES = [_batch(0), _batch(1)]


def test_clark_statistics_match_numpy_from_full_maps(params):
  got = at.clark_statistics(params, CONFIG, BATCHES, sep_id=SEP, punct_ids=PUNCT)
  sums = {k: 0.0 for k in at.CLARK_NAMES}
  count = 0
  for b in BATCHES:
    maps = np.asarray(bertjax.forward(params, CONFIG, b["input_ids"], b["attention_mask"],
                                      b["token_type_ids"], output_attentions=True).attentions)
    for i in range(len(b["input_ids"])):
      n = b["attention_mask"][i].sum()
      a = maps[:, i, :, :n, :n].astype(np.float64)  # (L, N, n, n)
      ids = b["input_ids"][i, :n]
      sums["cls"] += a[..., 0].sum(-1)
      sums["sep"] += a[..., ids == SEP].sum((-1, -2))
      sums["punct"] += a[..., np.isin(ids, PUNCT)].sum((-1, -2))
      sums["self"] += np.trace(a, axis1=-2, axis2=-1)
      sums["prev"] += np.trace(a, offset=-1, axis1=-2, axis2=-1)
      sums["next"] += np.trace(a, offset=1, axis1=-2, axis2=-1)
      sums["entropy"] += -(a * np.log(np.where(a > 0, a, 1))).sum((-1, -2))
      count += n
  for name in at.CLARK_NAMES:
    np.testing.assert_allclose(got[name], sums[name] / count, atol=2e-5, err_msg=name)
  assert got["punct"].max() > 0.01 and got["sep"].max() > 0.01


def test_punctuation_ids_from_tokenizer(minilm_dir):
  tok = bertjax.Tokenizer.from_pretrained(minilm_dir)
  ids = at.punctuation_ids(tok)
  tokens = set(tok.convert_ids_to_tokens(ids))
  assert {",", ".", "!", "?", "##.", "("} <= tokens
  assert not tokens & {"the", "[CLS]", "[SEP]", "a", "1"}


def test_word_attention():
  rng = np.random.default_rng(0)
  a = rng.dirichlet(np.ones(6), size=(2, 6))  # (heads, T, T), rows sum to 1
  word_ids = np.array([-1, 0, 1, 1, 2, -1])  # [CLS] w0 w1 w1 w2 [SEP]
  maps, groups = at.word_attention(a, word_ids)
  assert groups.tolist() == [-1, 0, 1, 2, -1]
  np.testing.assert_allclose(maps.sum(-1), 1.0)
  np.testing.assert_allclose(maps[:, 2, 1], (a[:, 2, 1] + a[:, 3, 1]) / 2)  # mean over queries
  np.testing.assert_allclose(maps[:, 1, 2], a[:, 1, 2] + a[:, 1, 3])  # sum over keys
  words, groups = at.word_attention(a, word_ids, np.array([1, 1, 1, 1, 0, 0]), keep_special=False)
  assert groups.tolist() == [0, 1] and words.shape == (2, 2, 2)


def _synthetic(kind, n=24, rng=None):
  """One map of each Kovaleva type on [CLS] A.. [SEP] B.. [SEP] with two segments."""
  rng = rng or np.random.default_rng(0)
  half = n // 2
  special = np.zeros(n, bool)
  special[[0, half - 1, n - 1]] = True
  seg = (np.arange(n) >= half).astype(int)
  i, j = np.mgrid[:n, :n]
  noise = rng.dirichlet(np.ones(n), n)
  stripes = special[None].repeat(n, 0) / special.sum()
  band = (np.abs(i - j) <= 1) / (np.abs(i - j) <= 1).sum(-1, keepdims=True)
  blocks = (seg[:, None] == seg[None]) / (seg[:, None] == seg[None]).sum(-1, keepdims=True)
  maps = {"vertical": 0.85 * stripes + 0.15 * noise,
          "diagonal": 0.85 * band + 0.15 * noise,
          "vertical+diagonal": 0.45 * stripes + 0.45 * band + 0.1 * noise,
          "block": 0.9 * blocks + 0.1 * noise,
          "heterogeneous": noise}
  return maps[kind], special, seg


def test_pattern_classifier_on_synthetic_maps():
  rng = np.random.default_rng(1)
  for code, kind in enumerate(at.PATTERN_TYPES):
    for _ in range(3):
      a, special, seg = _synthetic(kind, rng=rng)
      feats = at.pattern_features(a[None, None], special[None], np.ones((1, len(a))), seg[None])
      got = at.classify_patterns(feats)
      assert got.shape == (1, 1) and at.PATTERN_TYPES[got[0, 0]] == kind, (kind, feats)
  # One segment: no block is possible.
  a, special, _ = _synthetic("block")
  feats = at.pattern_features(a[None, None], special[None], np.ones((1, len(a))),
                              np.zeros((1, len(a)), int))
  assert np.isnan(feats["block"]).all() and at.classify_patterns(feats)[0, 0] != 3


def test_pattern_types_counts(params):
  result = at.pattern_types(params, CONFIG, BATCHES, special_ids=[CLS, SEP])
  n_seq = sum(len(b["input_ids"]) for b in BATCHES)
  assert result.counts.shape == (CONFIG.depth, CONFIG.num_attention_heads, 5)
  assert (result.counts.sum(-1) == n_seq).all()
  np.testing.assert_allclose(result.per_layer.sum(-1), 1.0)
  np.testing.assert_allclose(result.overall.sum(), 1.0)


def test_attention_change(params):
  same = at.attention_change(params, params, CONFIG, BATCHES)
  np.testing.assert_allclose(same.cosine, 1.0, atol=1e-6)
  np.testing.assert_allclose(same.cka, 1.0, atol=1e-4)
  other = jax.tree.map(lambda x: x * 1.0, params)
  layers = other["encoder"]["layers"]
  layers["attention"]["query"]["kernel"] = layers["attention"]["query"]["kernel"].at[1].multiply(-1)
  change = at.attention_change(params, other, CONFIG, BATCHES)
  np.testing.assert_allclose(change.cosine[0], 1.0, atol=1e-6)  # block 0 untouched
  assert (change.cosine[1] < 0.999).all()
  np.testing.assert_allclose(change.cka[:2], 1.0, atol=1e-4)
  assert change.cka[2] < 0.9999
  # Reference cosine of one head by hand.
  b = BATCHES[0]
  ma = np.asarray(bertjax.forward(params, CONFIG, b["input_ids"], b["attention_mask"],
                                  output_attentions=True).attentions)
  mb = np.asarray(bertjax.forward(other, CONFIG, b["input_ids"], b["attention_mask"],
                                  output_attentions=True).attentions)
  n = b["attention_mask"][1].sum()
  x, y = (m[1, 1, 2, :n, :n].ravel().astype(np.float64) for m in (ma, mb))
  one = at.attention_change(params, other, CONFIG, [{k: v[1:2] for k, v in b.items()}])
  np.testing.assert_allclose(one.cosine[1, 2], x @ y / np.linalg.norm(x) / np.linalg.norm(y),
                             atol=1e-6)  # float32 maps of a batch of 1 vs 3


def test_effective_attention_preserves_output_and_leaves_null_space(params):
  b = BATCHES[0]  # n = 20 > head_dim 16: the left null space is non-trivial
  out = bertjax.forward(params, CONFIG, b["input_ids"], b["attention_mask"],
                        output_attentions=True, output_hidden_states=True)
  n = int(b["attention_mask"][0].sum())
  block = 1
  e = np.asarray(out.hidden_states[block, 0, :n])
  t = at.head_value_outputs(params, CONFIG, block, e)  # (N, n, H)
  raw = np.asarray(out.attentions[block, 0, :, :n, :n], np.float64)
  eff = at.effective_attention(raw, t)
  np.testing.assert_allclose(np.einsum("nqk,nkh->nqh", eff, t),
                             np.einsum("nqk,nkh->nqh", raw, t), atol=1e-5)
  for h in range(CONFIG.num_attention_heads):
    null = at.left_null_space(t[h])
    assert null.shape == (n, n - CONFIG.head_dim)
    np.testing.assert_allclose(null.T @ t[h], 0, atol=1e-8)  # it is the left null space
    np.testing.assert_allclose(eff[h] @ null, 0, atol=1e-10)  # effective rows are outside it
    assert np.abs(raw[h] @ null).max() > 1e-3  # raw rows were not
  # The heads' outputs really are A @ T: rebuild the block's attention output.
  p = jax.tree.map(lambda x: np.asarray(x[block], np.float64), params["encoder"]["layers"])
  total = np.einsum("nqk,nkh->qh", raw, t) + p["attention"]["output"]["bias"]
  ln = p["attention"]["LayerNorm"]
  z = e + total
  z = (z - z.mean(-1, keepdims=True)) / np.sqrt(z.var(-1, keepdims=True) + CONFIG.layer_norm_eps)
  h = z * ln["scale"] + ln["bias"]
  from scipy.special import erf
  y = h @ p["intermediate"]["kernel"] + p["intermediate"]["bias"]
  y = 0.5 * y * (1 + erf(y / np.sqrt(2))) @ p["output"]["kernel"] + p["output"]["bias"]
  z = h + y
  z = (z - z.mean(-1, keepdims=True)) / np.sqrt(z.var(-1, keepdims=True) + CONFIG.layer_norm_eps)
  np.testing.assert_allclose(z * p["LayerNorm"]["scale"] + p["LayerNorm"]["bias"],
                             np.asarray(out.hidden_states[block + 1, 0, :n]), atol=5e-5)


def test_effective_attention_statistics(params):
  stats = at.effective_attention_statistics(params, CONFIG, BATCHES, cls_id=CLS, sep_id=SEP)
  clark = at.clark_statistics(params, CONFIG, BATCHES, sep_id=SEP)
  np.testing.assert_allclose(stats["raw"]["cls"], clark["cls"], atol=2e-5)
  np.testing.assert_allclose(stats["raw"]["sep"], clark["sep"], atol=2e-5)
  for kind in ("raw", "effective"):
    assert np.all(np.abs(stats[kind]["position_corr"]) <= 1 + 1e-9)
  assert np.all(np.abs(stats["effective"]["raw_corr"]) <= 1 + 1e-9)
  assert not np.allclose(stats["raw"]["sep"], stats["effective"]["sep"])
