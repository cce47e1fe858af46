"""Clark statistics, Kovaleva patterns, attention change and effective attention vs NumPy references."""

import jax
import numpy as np
import pytest
import reference_numpy as ref  # the float64 NumPy encoder block (tests/reference_numpy.py)

import bertjax
from bertjax.analysis.attention import effective as effective_attention_lib
from bertjax.analysis.attention import patterns, statistics

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
  types[0, seq // 2 + 1 :] = 1
  ids = np.where(mask > 0, ids, 0)
  return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types * mask}


BATCHES = [_batch(0), _batch(1)]


@pytest.mark.parametrize("smoothing", [0.0, 1e-4])  # kernel statistics path; maps path
def test_clark_statistics_token_weighted_match_numpy_from_full_maps(params, smoothing):
  got = statistics.clark_statistics(
    params,
    CONFIG,
    BATCHES,
    sep_id=SEP,
    punct_ids=PUNCT,
    weighting="token",
    entropy_smoothing=smoothing,
  )
  sums = {k: 0.0 for k in statistics.CLARK_NAMES}
  count = 0
  for b in BATCHES:
    maps = np.asarray(
      bertjax.forward(
        params,
        CONFIG,
        b["input_ids"],
        b["attention_mask"],
        b["token_type_ids"],
        output_attentions=True,
      ).attentions
    )
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
      p = (1 - smoothing) * a + smoothing / n
      sums["entropy"] += -(p * np.log(np.where(p > 0, p, 1))).sum((-1, -2))
      count += n
  for name in statistics.CLARK_NAMES:
    np.testing.assert_allclose(got[name], sums[name] / count, atol=2e-5, err_msg=name)
  assert got["punct"].max() > 0.01 and got["sep"].max() > 0.01


def test_clark_statistics_paths_agree_and_check_arguments(params):
  kw = {"sep_id": SEP, "punct_ids": PUNCT}
  for weighting in statistics.WEIGHTINGS:
    kernel = statistics.clark_statistics(
      params, CONFIG, BATCHES, weighting=weighting, entropy_smoothing=0.0, **kw
    )
    maps = statistics.clark_statistics(
      params, CONFIG, BATCHES, weighting=weighting, entropy_smoothing=1e-12, **kw
    )
    for name in statistics.CLARK_NAMES:
      np.testing.assert_allclose(kernel[name], maps[name], atol=2e-5, err_msg=name)
  doc = statistics.clark_statistics(params, CONFIG, BATCHES, **kw)  # the defaults: Clark's
  tok = statistics.clark_statistics(params, CONFIG, BATCHES, weighting="token", **kw)
  assert np.abs(doc["sep"] - tok["sep"]).max() > 1e-3  # the weighting matters here
  with pytest.raises(ValueError, match="weighting='tokens'"):
    statistics.clark_statistics(params, CONFIG, BATCHES, weighting="tokens", **kw)
  with pytest.raises(ValueError, match="entropy_smoothing=1.5"):
    statistics.clark_statistics(params, CONFIG, BATCHES, entropy_smoothing=1.5, **kw)
  with pytest.raises(ValueError, match="empty"):
    statistics.clark_statistics(params, CONFIG, [], **kw)
  assert statistics.uniform_entropy([4, 16]) == pytest.approx((np.log(4) + np.log(16)) / 2)
  assert statistics.uniform_entropy([4, 16], "token") == pytest.approx(
    (4 * np.log(4) + 16 * np.log(16)) / 20
  )
  with pytest.raises(ValueError, match="lengths"):
    statistics.uniform_entropy([3, 0])


# Clark et al.'s General_Analysis.ipynb on transformers' maps ------------------------------

HF_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", ".", ",", "!", "##."] + [f"w{i}" for i in range(40)]


def _clark_documents(seed=7):
  """Token lists of different lengths: single sentences and one segment pair, as Clark's data."""
  rng = np.random.default_rng(seed)
  words = HF_VOCAB[4:]
  docs = []
  for n in (5, 9, 30, 17, 12, 3, 24):
    body = list(rng.choice(words, n - 2))
    if n == 30:
      body[12] = "[SEP]"
    docs.append(["[CLS]", *body, "[SEP]"])
  return docs


def clark_notebook(docs_attns):
  """Clark et al.'s `General_Analysis.ipynb` (clarkkev/attention-analysis), cells 5 and 7,
  as released: tokens are strings, `attns` (layers, heads, n, n) per document."""
  n_docs = len(docs_attns)
  shape = docs_attns[0][1].shape[:2]
  avg_attns = {k: np.zeros(shape) for k in ["self", "right", "left", "sep", "cls", "punct"]}
  for tokens, attns in docs_attns:
    n_tokens = attns.shape[-1]
    seps, clss, puncts = (np.zeros(n_tokens) for _ in range(3))
    for position, token in enumerate(tokens):
      if token == "[SEP]":
        seps[position] = 1
      if token == "[CLS]":
        clss[position] = 1
      if token == "." or token == ",":
        puncts[position] = 1
    selectors = {
      "self": np.eye(n_tokens, n_tokens),
      "right": np.eye(n_tokens, n_tokens, 1),
      "left": np.eye(n_tokens, n_tokens, -1),
      "sep": np.tile(seps[np.newaxis], [n_tokens, 1]),
      "cls": np.tile(clss[np.newaxis], [n_tokens, 1]),
      "punct": np.tile(puncts[np.newaxis], [n_tokens, 1]),
    }
    for key, selector in selectors.items():
      avg_attns[key] += (attns * selector[np.newaxis, np.newaxis]).sum(-1).sum(-1) / (
        n_docs * n_tokens
      )
  uniform_attn_entropy = 0
  entropies = np.zeros(shape)
  for _, attns in docs_attns:
    attns = 0.9999 * attns + (0.0001 / attns.shape[-1])  # smooth to avoid NaNs
    uniform_attn_entropy -= np.log(1.0 / attns.shape[-1])
    entropies -= (attns * np.log(attns)).sum(-1).mean(-1)
  return (
    {
      "cls": avg_attns["cls"],
      "sep": avg_attns["sep"],
      "punct": avg_attns["punct"],
      "self": avg_attns["self"],
      "prev": avg_attns["left"],
      "next": avg_attns["right"],
      "entropy": entropies / n_docs,
    },
    uniform_attn_entropy / n_docs,
  )


@pytest.mark.hf
def test_clark_statistics_match_clark_notebook_on_transformers_maps(tmp_path):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  import bertjax

  torch.manual_seed(0)
  hf_config = transformers.BertConfig(
    vocab_size=len(HF_VOCAB),
    hidden_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
    attn_implementation="eager",
  )
  model = transformers.BertModel(hf_config).eval()
  with torch.no_grad():  # sharper attention than the 0.02 initialisation gives
    for name, p in model.named_parameters():
      if "attention.self.query.weight" in name or "attention.self.key.weight" in name:
        p.normal_(0.0, 0.4)
  model.save_pretrained(tmp_path)
  config, params = bertjax.from_hf(tmp_path)
  index = {t: i for i, t in enumerate(HF_VOCAB)}
  docs = _clark_documents()
  reference = []
  for tokens in docs:  # one document at a time, unpadded, segment ids 0: extract_attention.py
    ids = torch.tensor([[index[t] for t in tokens]])
    with torch.no_grad():
      out = model(ids, token_type_ids=torch.zeros_like(ids), output_attentions=True)
    reference.append((tokens, torch.stack(out.attentions)[:, 0].double().numpy()))
  want, want_uniform = clark_notebook(reference)

  batches = []
  for group in (docs[:4], docs[4:]):  # right-padded batches of mixed lengths
    width = max(map(len, group)) + 3
    ids = np.zeros((len(group), width), np.int32)
    mask = np.zeros_like(ids)
    for r, tokens in enumerate(group):
      ids[r, : len(tokens)] = [index[t] for t in tokens]
      mask[r, : len(tokens)] = 1
    batches.append({"input_ids": ids, "attention_mask": mask})
  punct = np.asarray([index["."], index[","]], np.int32)
  got = statistics.clark_statistics(params, config, batches, sep_id=index["[SEP]"], punct_ids=punct)
  for name in statistics.CLARK_NAMES:
    np.testing.assert_allclose(got[name], want[name], atol=1e-5, err_msg=name)
  lengths = [len(d) for d in docs]
  assert statistics.uniform_entropy(lengths) == pytest.approx(want_uniform, rel=1e-12)
  assert want["sep"].max() > 0.05 and want["punct"].max() > 0.05  # not a vacuous check
  # The kernel path (unsmoothed entropy) is within the stated bound of the notebook's.
  kernel = statistics.clark_statistics(
    params, config, batches, sep_id=index["[SEP]"], punct_ids=punct, entropy_smoothing=0.0
  )
  for name in statistics.CLARK_NAMES:
    tol = 2e-3 if name == "entropy" else 1e-5
    np.testing.assert_allclose(kernel[name], want[name], atol=tol, err_msg=name)
  # Token weighting: every query row of every document counts once.
  tok = statistics.clark_statistics(
    params, config, batches, sep_id=index["[SEP]"], punct_ids=punct, weighting="token"
  )
  sep_rows = sum(a[..., [t == "[SEP]" for t in tokens]].sum((-1, -2)) for tokens, a in reference)
  np.testing.assert_allclose(tok["sep"], sep_rows / sum(lengths), atol=1e-5)
  assert np.abs(tok["sep"] - got["sep"]).max() > 1e-3


def test_punctuation_ids_from_tokenizer(minilm_dir):
  tok = bertjax.Tokenizer.from_pretrained(minilm_dir)
  ids = statistics.punctuation_ids(tok)
  tokens = set(tok.convert_ids_to_tokens(ids))
  assert {",", ".", "!", "?", "##.", "("} <= tokens
  assert not tokens & {"the", "[CLS]", "[SEP]", "a", "1"}
  clark = statistics.clark_punctuation_ids(tok)
  assert tok.convert_ids_to_tokens(clark) == [",", "."] and set(clark) <= set(ids.tolist())


def test_word_attention():
  rng = np.random.default_rng(0)
  a = rng.dirichlet(np.ones(6), size=(2, 6))  # (heads, T, T), rows sum to 1
  word_ids = np.array([-1, 0, 1, 1, 2, -1])  # [CLS] w0 w1 w1 w2 [SEP]
  maps, groups = statistics.word_attention(a, word_ids)
  assert groups.tolist() == [-1, 0, 1, 2, -1]
  np.testing.assert_allclose(maps.sum(-1), 1.0)
  np.testing.assert_allclose(maps[:, 2, 1], (a[:, 2, 1] + a[:, 3, 1]) / 2)  # mean over queries
  np.testing.assert_allclose(maps[:, 1, 2], a[:, 1, 2] + a[:, 1, 3])  # sum over keys
  words, groups = statistics.word_attention(
    a, word_ids, np.array([1, 1, 1, 1, 0, 0]), keep_special=False
  )
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
  maps = {
    "vertical": 0.85 * stripes + 0.15 * noise,
    "diagonal": 0.85 * band + 0.15 * noise,
    "vertical+diagonal": 0.45 * stripes + 0.45 * band + 0.1 * noise,
    "block": 0.9 * blocks + 0.1 * noise,
    "heterogeneous": noise,
  }
  return maps[kind], special, seg


def test_pattern_classifier_on_synthetic_maps():
  rng = np.random.default_rng(1)
  for code, kind in enumerate(patterns.PATTERN_TYPES):
    for _ in range(3):
      a, special, seg = _synthetic(kind, rng=rng)
      feats = patterns.pattern_features(
        a[None, None], special[None], np.ones((1, len(a))), seg[None]
      )
      got = patterns.classify_patterns(feats)
      assert got.shape == (1, 1) and patterns.PATTERN_TYPES[got[0, 0]] == kind, (kind, feats)
  # One segment: no block is possible.
  a, special, _ = _synthetic("block")
  feats = patterns.pattern_features(
    a[None, None], special[None], np.ones((1, len(a))), np.zeros((1, len(a)), int)
  )
  assert np.isnan(feats["block"]).all() and patterns.classify_patterns(feats)[0, 0] != 3


def _pattern_type_by_hand(a, ids, seg, t):
  """Kovaleva type of one real-token map a (n, n), row by row from the definitions."""
  n = len(a)
  special = [i for i in range(n) if ids[i] in (CLS, SEP)]
  plain = [k for k in range(n) if k not in special]
  vertical = np.mean([a[q, special].sum() for q in range(n)])
  diagonal = np.mean([sum(a[q, k] for k in plain if abs(q - k) <= 1) for q in range(n)])
  if len({seg[k] for k in plain}) > 1:
    block = np.mean(
      [sum(a[q, k] for k in plain if seg[k] == seg[q]) / a[q, plain].sum() for q in range(n)]
    )
  else:
    block = -1.0
  if vertical >= t.mixed_each and diagonal >= t.mixed_each and vertical + diagonal >= t.mixed_sum:
    return "vertical+diagonal"
  if vertical >= t.vertical_min:
    return "vertical"
  if diagonal >= t.diagonal_min:
    return "diagonal"
  return "block" if block >= t.block_min else "heterogeneous"


@pytest.mark.parametrize("loose", [False, True])
def test_pattern_types_counts_match_classifying_each_map_by_hand(params, loose):
  # Loose thresholds make the random model's maps fall into several types.
  t = (
    patterns.PatternThresholds(
      vertical_min=0.2, diagonal_min=0.3, mixed_each=0.15, mixed_sum=0.4, block_min=0.6
    )
    if loose
    else patterns.PatternThresholds()
  )
  result = patterns.pattern_types(params, CONFIG, BATCHES, special_ids=[CLS, SEP], thresholds=t)
  want = np.zeros((CONFIG.depth, CONFIG.num_attention_heads, 5), np.int64)
  per_sequence = []  # each sequence's maps of each type
  for b in BATCHES:
    maps = np.asarray(
      bertjax.forward(
        params,
        CONFIG,
        b["input_ids"],
        b["attention_mask"],
        b["token_type_ids"],
        output_attentions=True,
      ).attentions,
      np.float64,
    )  # (L, B, N, T, T)
    for i, n in enumerate(b["attention_mask"].sum(-1)):
      before = want.sum((0, 1))
      for layer in range(CONFIG.depth):
        for head in range(CONFIG.num_attention_heads):
          kind = _pattern_type_by_hand(
            maps[layer, i, head, :n, :n], b["input_ids"][i, :n], b["token_type_ids"][i, :n], t
          )
          want[layer, head, patterns.PATTERN_TYPES.index(kind)] += 1
      per_sequence.append(want.sum((0, 1)) - before)
  np.testing.assert_array_equal(result.counts, want)
  np.testing.assert_array_equal(result.per_sequence, per_sequence)
  assert result.summary()["per_sequence"] is result.per_sequence
  if loose:
    assert (want.sum((0, 1)) > 0).sum() >= 3, want.sum((0, 1))  # the check tells types apart
  np.testing.assert_allclose(result.per_layer, want.sum(1) / want.sum((1, 2))[:, None])
  np.testing.assert_allclose(result.overall, want.sum((0, 1)) / want.sum())


def test_attention_change(params):
  same = patterns.attention_change(params, CONFIG, params, BATCHES)
  np.testing.assert_allclose(same.cosine, 1.0, atol=1e-6)
  np.testing.assert_allclose(same.cka, 1.0, atol=1e-4)
  other = jax.tree.map(lambda x: x * 1.0, params)
  layers = other["encoder"]["layers"]
  layers["attention"]["query"]["kernel"] = layers["attention"]["query"]["kernel"].at[1].multiply(-1)
  change = patterns.attention_change(params, CONFIG, other, BATCHES)
  with pytest.warns(DeprecationWarning, match="attention_change"):  # the README's older order
    old = patterns.attention_change(params, other, CONFIG, BATCHES)
  np.testing.assert_array_equal(old.cosine, change.cosine)
  np.testing.assert_allclose(change.cosine[0], 1.0, atol=1e-6)  # block 0 untouched
  assert (change.cosine[1] < 0.999).all()
  np.testing.assert_allclose(change.cka[:2], 1.0, atol=1e-4)
  assert change.cka[2] < 0.9999
  # Reference cosine of one head by hand.
  b = BATCHES[0]
  ma = np.asarray(
    bertjax.forward(
      params, CONFIG, b["input_ids"], b["attention_mask"], output_attentions=True
    ).attentions
  )
  mb = np.asarray(
    bertjax.forward(
      other, CONFIG, b["input_ids"], b["attention_mask"], output_attentions=True
    ).attentions
  )
  n = b["attention_mask"][1].sum()
  x, y = (m[1, 1, 2, :n, :n].ravel().astype(np.float64) for m in (ma, mb))
  one = patterns.attention_change(params, CONFIG, other, [{k: v[1:2] for k, v in b.items()}])
  np.testing.assert_allclose(
    one.cosine[1, 2], x @ y / np.linalg.norm(x) / np.linalg.norm(y), atol=1e-6
  )  # float32 maps of a batch of 1 vs 3
  # Each sequence's layer means (over heads), in order; their mean is the cosine's.
  np.testing.assert_allclose(change.per_sequence[1], one.per_sequence[0], atol=1e-6)
  assert change.per_sequence.shape == (sum(len(b["input_ids"]) for b in BATCHES), CONFIG.depth)
  np.testing.assert_allclose(change.per_sequence.mean(0), change.cosine.mean(-1), atol=1e-12)


def test_effective_attention_preserves_output_and_leaves_null_space(params):
  b = BATCHES[0]  # n = 20 > head_dim 16: the left null space is non-trivial
  out = bertjax.forward(
    params,
    CONFIG,
    b["input_ids"],
    b["attention_mask"],
    output_attentions=True,
    output_hidden_states=True,
    capture=("v",),
  )
  n = int(b["attention_mask"][0].sum())
  block = 1
  e = np.asarray(out.hidden_states[block, 0, :n])
  t = effective_attention_lib.head_value_outputs(
    params, CONFIG, block, out.cache["v"][block, 0, :n]
  )  # (N, n, H)
  raw = np.asarray(out.attentions[block, 0, :, :n, :n], np.float64)
  eff = effective_attention_lib.effective_attention(raw, t)
  np.testing.assert_allclose(
    np.einsum("nqk,nkh->nqh", eff, t), np.einsum("nqk,nkh->nqh", raw, t), atol=1e-5
  )
  for h in range(CONFIG.num_attention_heads):
    null = effective_attention_lib.left_null_space(t[h])
    assert null.shape == (n, n - CONFIG.head_dim)
    np.testing.assert_allclose(null.T @ t[h], 0, atol=1e-8)  # it is the left null space
    np.testing.assert_allclose(eff[h] @ null, 0, atol=1e-10)  # effective rows are outside it
    assert np.abs(raw[h] @ null).max() > 1e-3  # raw rows were not
  # The heads' outputs really are A @ T: rebuild the block's attention output.
  p = ref.layer_params(params, block)
  total = np.einsum("nqk,nkh->qh", raw, t) + p["attention"]["output"]["bias"]
  np.testing.assert_allclose(
    ref.after_attention(p, e, total, CONFIG.layer_norm_eps),
    np.asarray(out.hidden_states[block + 1, 0, :n]),
    atol=5e-5,
  )


def test_effective_attention_statistics(params):
  stats = effective_attention_lib.effective_attention_statistics(
    params, CONFIG, BATCHES, cls_id=CLS, sep_id=SEP
  )
  clark = statistics.clark_statistics(params, CONFIG, BATCHES, sep_id=SEP, weighting="token")
  np.testing.assert_allclose(stats["raw"]["cls"], clark["cls"], atol=2e-5)
  np.testing.assert_allclose(stats["raw"]["sep"], clark["sep"], atol=2e-5)
  for kind in ("raw", "effective"):
    assert np.all(np.abs(stats[kind]["position_corr"]) <= 1 + 1e-9)
  assert np.all(np.abs(stats["effective"]["raw_corr"]) <= 1 + 1e-9)
  assert not np.allclose(stats["raw"]["sep"], stats["effective"]["sep"])


@pytest.fixture(scope="module")
def small_model():
  """2 layers x 2 heads of 16 dimensions: null spaces from 17 tokens on."""
  import bertjax

  config = bertjax.BertConfig(
    vocab_size=50,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=48,
    max_position_embeddings=64,
  )
  return config, bertjax.init(config, 0)


@pytest.mark.parametrize("length", [12, 16, 24])
def test_head_analysis_null_space_and_output_identity(small_model, length):
  """`effective.head_analysis`: each head's null space has Brunner et al.'s dimension, effective
  attention leaves the head's output, and every block's, unchanged."""
  config, params = small_model
  ids = np.random.default_rng(length).integers(5, 50, (2, length)).astype(np.int32)
  ids[:, 0], ids[:, -1] = 1, 2
  r = effective_attention_lib.head_analysis(
    params, config, ids, cls_id=1, sep_id=2, punct_ids=np.array([7, 8])
  )
  assert np.all(
    r["null_dim"] == effective_attention_lib.expected_null_dim(length, config.head_dim)
  )  # d_head 16
  assert np.all(r["rank"] == min(length, config.head_dim))
  assert r["null_residual"].max() < 1e-10 and r["output_error"].max() < 1e-10
  assert r["block_error_raw"].max() < 1e-4 and r["block_error_effective"].max() < 1e-4
  if length <= config.head_dim:  # no null space: effective attention is raw attention
    np.testing.assert_allclose(r["effective_sep"], r["raw_sep"], atol=1e-10)


def test_head_analysis_masses_against_numpy_and_library(small_model):
  import bertjax

  config, params = small_model
  ids = np.random.default_rng(1).integers(5, 50, (3, 24)).astype(np.int32)
  ids[:, 0], ids[:, -1] = 1, 2
  ids[:, 5] = 7
  r = effective_attention_lib.head_analysis(
    params, config, ids, cls_id=1, sep_id=2, punct_ids=np.array([7, 8])
  )
  maps = np.asarray(bertjax.forward(params, config, ids, output_attentions=True).attentions)
  punct = np.isin(ids, [7, 8])  # (P, n)
  want = np.einsum("lpnqk,pk->pln", maps, punct) / ids.shape[1]
  np.testing.assert_allclose(r["raw_punct"], want, rtol=1e-5)
  np.testing.assert_allclose(r["raw_sep"], maps[..., -1].mean(-1).transpose(1, 0, 2), rtol=1e-5)
  lib = effective_attention_lib.effective_attention_statistics(
    params, config, [{"input_ids": ids}], cls_id=1, sep_id=2
  )
  for kind in effective_attention_lib.KINDS:
    for c in ("cls", "sep"):
      np.testing.assert_allclose(lib[kind][c], r[f"{kind}_{c}"].mean(0), atol=1e-9)


def test_summarise_example_head_and_figures(small_model, tmp_path):
  """`effective.summarise` counts what the analyses hold; `example_head` is one head's maps, the
  effective one with the same output; the figures draw them."""
  import bertjax
  from bertjax.plots import effective as plots

  config, params = small_model
  rng = np.random.default_rng(3)
  sweep = {}
  for n in (12, 24):
    ids = rng.integers(5, 50, (2, n)).astype(np.int32)
    ids[:, 0], ids[:, -1] = 1, 2
    sweep[n] = effective_attention_lib.head_analysis(
      params, config, ids, cls_id=1, sep_id=2, punct_ids=np.array([7])
    )
  main = dict(sweep[24])
  lib = effective_attention_lib.effective_attention_statistics(
    params, config, [{"input_ids": ids}], cls_id=1, sep_id=2
  )
  s = effective_attention_lib.summarise(sweep, main, lib, config.head_dim)
  assert s["null_dim_expected"] == {12: 0, 24: 8} and s["null_dim_matches"] == {12: 1.0, 24: 1.0}
  assert s["rank_min_max"] == {12: (12, 12), 24: (16, 16)}
  assert s["corr_raw_effective_by_length"][12] == pytest.approx(1.0)
  special = main["effective_cls"] + main["effective_sep"]
  assert s["special_mass"]["effective"] == pytest.approx(special.mean())
  lower = special.mean(0) < (main["raw_cls"] + main["raw_sep"]).mean(0)
  assert s["heads_with_lower_effective_special"] == lower.mean()
  assert s["library_vs_direct_max_difference"] < 1e-6
  means = effective_attention_lib.sweep_means(sweep)
  assert list(means) == [12, 24] and means[24]["rank"].shape == sweep[24]["rank"].shape[1:]
  np.testing.assert_array_equal(means[12]["null_dim"], sweep[12]["null_dim"].mean(0))
  raw = sweep[24]["raw_cls"][:, 1, 0] + sweep[24]["raw_sep"][:, 1, 0]
  assert means[24]["special_raw"][1, 0] == pytest.approx(raw.mean())
  ex = effective_attention_lib.example_head(params, config, ids[:1], 1, 0)
  maps = bertjax.forward(params, config, ids[:1], output_attentions=True).attentions
  np.testing.assert_allclose(ex["raw"], np.asarray(maps)[1, 0, 0], atol=1e-7)
  assert np.abs(ex["effective"] - ex["raw"]).max() > 1e-3  # 24 tokens > d_head: they differ
  with pytest.raises(ValueError, match=r"layer=2, head=0 must be within"):
    effective_attention_lib.example_head(params, config, ids[:1], 2, 0)
  with pytest.raises(ValueError, match=r"\(1, n\)"):
    effective_attention_lib.example_head(params, config, ids, 0, 0)
  main["length"] = 24
  paths = [
    plots.null_space_by_length(sweep, config.head_dim, tmp_path / "a.png"),
    plots.class_mass_by_layer(main, lib, tmp_path / "b.png"),
    plots.class_mass_by_head(main, tmp_path / "c.png"),
    plots.example_maps(**ex, layer=1, head=0, path=tmp_path / "d.png"),
  ]
  assert all(p.stat().st_size > 10_000 for p in paths)


def test_clark_summary_is_the_statistics_by_layer_and_draws(minilm_dir, tmp_path):
  """`statistics.clark_summary` holds `clark_statistics` of the chosen definition per head, their
  means over heads, and uniform attention's entropy averaged alike; the figure draws it."""
  from bertjax.plots import attention as plots

  tok = bertjax.Tokenizer.from_pretrained(minilm_dir)  # [SEP] = 102: outside the tiny vocabulary
  batches = [
    {**b, "input_ids": np.where(b["input_ids"] == SEP, tok.sep_id, b["input_ids"])} for b in BATCHES
  ]
  tiny = CONFIG.replace(vocab_size=tok.sep_id + 1)
  p = bertjax.init(tiny, 11)
  got = statistics.clark_summary(
    p, tiny, tok, batches, weighting="token", punctuation="all", smoothing=0.0
  )
  want = statistics.clark_statistics(
    p,
    tiny,
    batches,
    sep_id=tok.sep_id,
    punct_ids=statistics.punctuation_ids(tok),
    weighting="token",
  )
  for k in statistics.CLARK_NAMES:
    np.testing.assert_allclose(got[k], want[k], atol=1e-7)
    np.testing.assert_allclose(got["by_layer"][k], np.asarray(want[k]).mean(-1), atol=1e-7)
  assert got["sep"].min() > 0  # [SEP] is seen
  lengths = np.concatenate([b["attention_mask"].sum(-1) for b in batches])
  assert got["uniform_entropy"] == pytest.approx((lengths * np.log(lengths)).sum() / lengths.sum())
  assert got["definition"]["punctuation_ids"] == len(statistics.punctuation_ids(tok))
  assert len(statistics.punctuation_of(tok, "clark")) == 2
  with pytest.raises(ValueError, match="punctuation='some' must be one of"):
    statistics.punctuation_of(tok, "some")
  assert plots.clark_by_layer(got, tmp_path / "c.png").stat().st_size > 10_000


def test_special_mass_by_layer_is_cls_and_sep_mass_over_heads(params):
  got = statistics.special_mass_by_layer(params, CONFIG, BATCHES, SEP)
  s = statistics.clark_statistics(params, CONFIG, BATCHES, sep_id=SEP)
  np.testing.assert_allclose(got, (np.asarray(s["cls"]) + np.asarray(s["sep"])).mean(-1))
  assert got.shape == (CONFIG.depth,) and np.all((got > 0) & (got < 1))
