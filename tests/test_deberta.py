"""DeBERTa-v2/v3 ("deberta-v2") against transformers 5 (PyTorch, float32), random weights.

Every class bertjax maps (DebertaV2Model, ForMaskedLM in both head layouts,
ForSequenceClassification with its ContextPooler, ForTokenClassification) at odd sizes, every
parameter randomised (norms too), padded batches: every hidden state, attention map and
head's logits within 1e-4 at real tokens, with and without `share_att_key`, with both
position terms and each alone, log buckets set and unset, relative embeddings normed or not,
absolute positions and token types on (v2) or off (v3), factorised embeddings; `to_hf`
loads strictly in transformers and reads back bitwise. Then: the relative index against
transformers' `build_relative_position`; the XLA path of `kernels.DisentangledBias` against a
float64 NumPy loop, forward and gradients (the custom backward against autodiff of the
reference, and finite differences); the three score-term sites against the same formula on
captured q and the layer's parameters, and patched; the SentencePiece `spm.model` tokenizer
against `DebertaV2TokenizerFast` on UD EWT text.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_modern_families import _batch, _close, _compare

import bertjax
from bertjax import kernels

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.hf

SIZES = dict(
  vocab_size=99,
  hidden_size=60,
  num_hidden_layers=4,
  num_attention_heads=5,
  intermediate_size=37,
  max_position_embeddings=64,
  pad_token_id=0,
  num_labels=3,
)
V3 = dict(
  relative_attention=True,
  position_buckets=8,
  max_relative_positions=32,
  norm_rel_ebd="layer_norm",
  share_att_key=True,
  pos_att_type=["p2c", "c2p"],
  position_biased_input=False,
  type_vocab_size=0,
)
CONFIGS = {
  "v3": V3,
  # v2's layout: own position projections, no buckets, absolute positions, token types.
  "v2": dict(
    relative_attention=True, pos_att_type="c2p|p2c", type_vocab_size=2, max_relative_positions=16
  ),
  "c2p_only": dict(
    relative_attention=True,
    pos_att_type=["c2p"],
    position_buckets=6,
    max_relative_positions=20,
    type_vocab_size=0,
    position_biased_input=False,
  ),
  "p2c_only_factorised": dict(
    relative_attention=True,
    pos_att_type=["p2c"],
    embedding_size=24,
    type_vocab_size=0,
    norm_rel_ebd="layer_norm",
  ),
  "lm_head_layout": dict(V3, legacy=False),
  "no_relative_attention": dict(pos_att_type=["p2c", "c2p"], type_vocab_size=1),
}
CLASSES = {
  "Model": None,
  "ForMaskedLM": "mlm",
  "ForSequenceClassification": "classifier",
  "ForTokenClassification": "token_classifier",
}
CASES = (
  [("v3", c) for c in CLASSES]
  + [("v2", c) for c in CLASSES]
  + [
    ("c2p_only", "Model"),
    ("p2c_only_factorised", "ForMaskedLM"),
    ("lm_head_layout", "ForMaskedLM"),
    ("no_relative_attention", "ForSequenceClassification"),
  ]
)


def _hf_model(key, cls, seed=0):
  config = transformers.DebertaV2Config(**SIZES, **CONFIGS[key])
  torch.manual_seed(seed)
  model = getattr(transformers, "DebertaV2" + cls)(config)
  with torch.no_grad():  # every parameter random, norms and biases included
    for name, p in model.named_parameters():
      norm = "layernorm" in name.lower()
      p.normal_(0.0, 0.3 if norm else 0.08)
      if norm and name.endswith("weight"):
        p.add_(1.0)
  return model.eval()


@pytest.mark.parametrize("key,cls", CASES, ids=[f"{k}-{c}" for k, c in CASES])
def test_deberta_matches_transformers(tmp_path, key, cls):
  model = _hf_model(key, cls)
  model.save_pretrained(tmp_path / "hf")
  config, params = bertjax.from_hf(tmp_path / "hf")
  assert config.model_type == "deberta-v2"
  assert config.legacy == (key != "lm_head_layout")
  ids, mask, ref = _compare(model, config, params, cls)
  _compare(model, config, params, cls, left=True)
  bertjax.to_hf(config, params, tmp_path / "out")
  reloaded, info = getattr(transformers, "DebertaV2" + cls).from_pretrained(
    tmp_path / "out", output_loading_info=True
  )
  assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
  with torch.no_grad():
    again = reloaded.eval()(torch.tensor(ids), attention_mask=torch.tensor(mask))
  np.testing.assert_array_equal(again[0].numpy(), ref[0].numpy())
  config2, params2 = bertjax.from_hf(tmp_path / "out")
  assert config2 == config
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_released_v3_layout_loads(tmp_path):
  """A v3 checkpoint as microsoft/deberta-v3-* ship it: `lm_predictions.lm_head` and the RTD
  head `mask_predictions.*` beside the encoder, `legacy` unset in config.json."""
  from scipy.special import erf as scipy_erf

  model = _hf_model("lm_head_layout", "ForMaskedLM")
  model.save_pretrained(tmp_path)
  from safetensors.numpy import load_file, save_file

  state = load_file(tmp_path / "model.safetensors")
  rng = np.random.default_rng(0)
  head = {
    "LayerNorm.weight": (60,),
    "LayerNorm.bias": (60,),
    "dense.weight": (60, 60),
    "dense.bias": (60,),
    "classifier.weight": (1, 60),
    "classifier.bias": (1,),
  }
  for name, shape in head.items():
    state[f"mask_predictions.{name}"] = rng.normal(size=shape).astype(np.float32)
  save_file(state, tmp_path / "model.safetensors")
  hf = json.loads((tmp_path / "config.json").read_text())
  hf.pop("legacy")
  (tmp_path / "config.json").write_text(json.dumps(hf))
  config, params = bertjax.from_hf(tmp_path)
  assert not config.legacy and "mlm" in params and "rtd" in params
  _compare(model, config, params, "ForMaskedLM")
  # The RTD head is the released `LMMaskPredictionHead`: LayerNorm(h + h_0), dense, GELU.
  ids = rng.integers(5, config.vocab_size, (2, 9))
  h = np.asarray(
    bertjax.forward(params, config, ids, np.ones_like(ids)).last_hidden_state, np.float64
  )
  w = {k: state[f"mask_predictions.{k}"].astype(np.float64) for k in head}
  x = h + h[:, :1]
  x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + config.layer_norm_eps)
  x = x * w["LayerNorm.weight"] + w["LayerNorm.bias"]
  x = x @ w["dense.weight"].T + w["dense.bias"]
  x = x * (1 + scipy_erf(x / np.sqrt(2))) / 2
  want = (x @ w["classifier.weight"].T + w["classifier.bias"])[..., 0]
  ours = bertjax.head_logits(
    params, config, bertjax.forward(params, config, ids, np.ones_like(ids)), "rtd"
  )
  np.testing.assert_allclose(ours, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
  "seq,buckets,max_position", [(11, 8, 32), (300, 256, 512), (2048, 256, 512), (40, -1, 16)]
)
def test_relative_index_is_transformers(seq, buckets, max_position):
  from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position

  x = torch.zeros(1, seq, 4)
  rel = build_relative_position(x, x, bucket_size=buckets, max_position=max_position)[0].numpy()
  span = buckets if buckets > 0 else max_position
  want = np.clip(rel + span, 0, 2 * span - 1)
  np.testing.assert_array_equal(kernels.relative_index(seq, seq, span, buckets, max_position), want)


def _numpy_attention(q, k, v, kr, qr, idx, scale, key_mask):
  """DeBERTa's attention by its definition, float64 loops over (batch, head, query)."""
  batch, seq, heads, _ = q.shape
  out = np.zeros_like(q)
  for b in range(batch):
    for h in range(heads):
      for i in range(seq):
        if not key_mask[b, i]:
          continue
        s = (
          np.array(
            [
              q[b, i, h] @ k[b, j, h]
              + q[b, i, h] @ kr[idx[i, j], h]
              + k[b, j, h] @ qr[idx[i, j], h]
              for j in range(seq)
            ]
          )
          * scale
        )
        s = np.where(key_mask[b], s, -np.inf)
        p = np.exp(s - s.max())
        out[b, i, h] = (p / p.sum()) @ v[b, :, h]
  return out


def test_disentangled_kernel_terms_match_numpy_and_gradients():
  rng = np.random.default_rng(0)
  batch, seq, heads, dim, span = 2, 9, 3, 4, 4
  q, k, v = (rng.normal(size=(batch, seq, heads, dim)) for _ in range(3))
  kr, qr = (rng.normal(size=(2 * span, heads, dim)) for _ in range(2))
  key_mask = np.ones((batch, seq), bool)
  key_mask[1, 6:] = False
  scale = 1 / np.sqrt(3 * dim)
  make = lambda kr, qr: kernels.DisentangledBias(
    kr, qr, span=span, buckets=4, max_position=8, scale=scale
  )
  idx = kernels.relative_index(seq, seq, span, 4, 8)
  want = _numpy_attention(q, k, v, kr, qr, idx, scale, key_mask)
  with jax.enable_x64(True):
    args = tuple(jnp.asarray(a) for a in (q, k, v, kr, qr))
    xla = lambda q, k, v, kr, qr: kernels.attention(
      q, k, v, key_mask=key_mask, bias=make(kr, qr), impl="xla"
    )
    ref = lambda q, k, v, kr, qr: kernels.reference_attention(
      q, k, v, key_mask=key_mask, bias=make(kr, qr)
    )
    np.testing.assert_allclose(xla(*args), want, atol=1e-12)
    np.testing.assert_allclose(ref(*args), want, atol=1e-12)
    probe = jnp.asarray(rng.normal(size=want.shape))
    loss = lambda f: lambda *a: (f(*a) * probe).sum()
    g_xla = jax.grad(loss(xla), argnums=range(5))(*args)
    g_ref = jax.grad(loss(ref), argnums=range(5))(*args)
    for name, a, b in zip(("q", "k", "v", "pos_key", "pos_query"), g_xla, g_ref):
      np.testing.assert_allclose(a, b, atol=1e-12, err_msg=name)

    # Finite differences of the definition itself, along one random direction per input.
    def shifted(i, d, eps):
      inputs = [a + eps * d if j == i else a for j, a in enumerate((q, k, v, kr, qr))]
      return float((_numpy_attention(*inputs, idx, scale, key_mask) * probe).sum())

    for i in range(5):
      d = rng.normal(size=args[i].shape)
      fd = (shifted(i, d, 1e-6) - shifted(i, d, -1e-6)) / 2e-6
      np.testing.assert_allclose(float((g_xla[i] * d).sum()), fd, rtol=1e-6)


def test_implementations_without_it_refuse_it_by_name():
  config = bertjax.BertConfig.for_family(
    "deberta-v2", **{**SIZES, **V3, "pos_att_type": ("p2c", "c2p")}
  )
  params = bertjax.init(config, 0)
  ids = np.arange(5, 13)[None]
  with pytest.raises(ValueError, match="impl='cudnn' does not support DeBERTa"):
    bertjax.forward(params, config.replace(attention_impl="cudnn"), ids)
  q = jnp.ones((1, 8, 5, 12))
  bias = kernels.DisentangledBias(jnp.ones((64, 5, 12)), span=32)
  with pytest.raises(
    ValueError, match=r"kernel_variant='tpu' does not support a position bias \(disentangled\)"
  ):
    kernels.attention(q, q, q, bias=bias, impl="pallas", kernel_variant="tpu", interpret=True)
  with pytest.raises(ValueError, match="backward='reference' with a DisentangledBias"):
    kernels.attention(q, q, q, bias=bias, impl="pallas", backward="reference")
  with pytest.raises(ValueError, match="pos_att_type=.*p2p"):
    config.replace(pos_att_type=("p2p",))
  with pytest.raises(ValueError, match="share_att_key=True is a DeBERTa option"):
    bertjax.BertConfig(share_att_key=True)
  with pytest.raises(ValueError, match="conv_kernel_size=3"):
    bertjax.BertConfig.from_hf_dict(
      {**transformers.DebertaV2Config(**SIZES, conv_kernel_size=3).to_dict()}
    )


def test_score_term_sites(tmp_path):
  """The three terms are what the formula gives on captured q and the layer's parameters;
  their masked softmax is the attention; zeroing the position terms of one head changes that
  head alone, into the softmax of its content logits."""
  model = _hf_model("v3", "Model")
  model.save_pretrained(tmp_path)
  config, params = bertjax.from_hf(tmp_path)
  ids, mask = _batch(config.pad_token_id)
  sites = ("q", "k", "scores_c2c", "scores_c2p", "scores_p2c", "probs")
  out = bertjax.forward(params, config, ids, mask, capture=sites, output_attentions=True)
  cache = {s: np.asarray(out.cache[s], np.float64) for s in sites}
  layer, d = 1, config.head_dim
  scale = 1 / np.sqrt(3 * d)
  from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position

  x = torch.zeros(1, ids.shape[1], 4)
  rel = build_relative_position(x, x, bucket_size=8, max_position=32)[0].numpy()
  idx = np.clip(rel + 8, 0, 15)
  table = model.encoder.LayerNorm(model.encoder.rel_embeddings.weight).detach().numpy()
  attn = model.encoder.layer[layer].attention.self
  kr = table @ attn.key_proj.weight.detach().numpy().T + attn.key_proj.bias.detach().numpy()
  qr = table @ attn.query_proj.weight.detach().numpy().T + attn.query_proj.bias.detach().numpy()
  kr, qr = kr.reshape(16, 5, d), qr.reshape(16, 5, d)
  q, k = cache["q"][layer], cache["k"][layer]
  c2p = np.einsum("bihd,ijhd->bhij", q, kr[idx]) * scale
  p2c = np.einsum("bjhd,ijhd->bhij", k, qr[idx]) * scale
  c2c = np.einsum("bihd,bjhd->bhij", q, k) * scale
  real = mask.astype(bool)
  for name, want in (("scores_c2p", c2p), ("scores_p2c", p2c), ("scores_c2c", c2c)):
    _close(cache[name][layer].transpose(0, 2, 1, 3)[real], want.transpose(0, 2, 1, 3)[real], name)
  logits = sum(cache[s] for s in ("scores_c2c", "scores_c2p", "scores_p2c"))
  logits = np.where(real[None, :, None, None, :], logits, -np.inf)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  _close(
    probs.transpose(0, 1, 3, 2, 4)[:, real],
    np.asarray(out.attentions).transpose(0, 1, 3, 2, 4)[:, real],
    "softmax of the terms",
  )
  # Zero both position terms of head 2 in block 1.
  weight = np.zeros((config.depth, 1, config.num_attention_heads, 1, 1), np.float32)
  weight[layer, :, 2] = 1
  zeros = np.zeros_like(weight)
  patched = bertjax.forward(
    params,
    config,
    ids,
    mask,
    output_attentions=True,
    patch={"scores_c2p": (zeros, weight), "scores_p2c": (zeros, weight)},
  )
  before, after = np.asarray(out.attentions), np.asarray(patched.attentions)
  changed = np.abs(after - before).max((1, 3, 4))  # (depth, heads)
  # The other heads, and the layers before, keep their maps to float32 rounding (the patched
  # program may round differently: 3e-8 with XLA:CPU's loop emitters).
  assert changed[layer, 2] > 1e-3 and np.delete(changed[layer], 2).max() < 1e-6
  assert changed[:layer].max() < 1e-6
  content = np.where(real[:, None, :], c2c[:, 2], -np.inf)
  content = np.exp(content - content.max(-1, keepdims=True))
  _close(
    after[layer, :, 2][real], (content / content.sum(-1, keepdims=True))[real], "content-only head"
  )
  # A function patch removes them everywhere; the captured terms are then zero.
  none = bertjax.forward(
    params,
    config,
    ids,
    mask,
    capture=("scores_c2p",),
    patch={"scores_c2p": lambda v, layer: v * 0, "scores_p2c": lambda v, layer: v * 0},
  )
  assert not np.asarray(none.cache["scores_c2p"]).any()
  with pytest.raises(ValueError, match="scores_c2p.*does not exist on a bert block"):
    bertjax.site_shape(bertjax.BertConfig(), "scores_c2p", 1, 4)


@pytest.mark.data
def test_spm_tokenizer_matches_transformers(tmp_path, data_dir):
  spm = pytest.importorskip("sentencepiece")
  texts = []
  for line in (data_dir / "ud_english_ewt" / "en_ewt-ud-dev.conllu").open(encoding="utf-8"):
    if line.startswith("# text = "):
      texts.append(line[len("# text = ") :].rstrip("\n"))
  # DeBERTa-v3's spm.model layout: [PAD] 0, [CLS] 1, [SEP] 2, [UNK] 3; [MASK] added after.
  spm.SentencePieceTrainer.train(
    sentence_iterator=iter(texts),
    model_prefix=str(tmp_path / "spm"),
    vocab_size=800,
    pad_id=0,
    bos_id=1,
    eos_id=2,
    unk_id=3,
    pad_piece="[PAD]",
    bos_piece="[CLS]",
    eos_piece="[SEP]",
    unk_piece="[UNK]",
    model_type="unigram",
  )
  (tmp_path / "config.json").write_text(
    json.dumps({"model_type": "deberta-v2", "type_vocab_size": 0})
  )
  theirs = transformers.DebertaV2TokenizerFast.from_pretrained(str(tmp_path))
  ours = bertjax.Tokenizer.from_pretrained(tmp_path)
  got = ours.encode(texts[:600])
  for b, text in enumerate(texts[:600]):
    n = int(got.attention_mask[b].sum())
    assert got.input_ids[b, :n].tolist() == theirs(text)["input_ids"], text
  specials = ours.convert_ids_to_tokens([ours.cls_id, ours.sep_id, ours.pad_id])
  assert specials == ["[CLS]", "[SEP]", "[PAD]"]
  assert ours.mask_id == theirs.mask_token_id
  pair = ours.encode(texts[:1], texts[1:2])
  n = int(pair.attention_mask[0].sum())
  assert pair.input_ids[0, :n].tolist() == theirs(texts[0], texts[1])["input_ids"]
  assert not pair.token_type_ids.any()  # v3 has no token-type embeddings
