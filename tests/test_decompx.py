"""DecompX (`bertjax.analysis.attribution.decompx`): the released algorithm, completeness, refusals.

The reference is a NumPy transliteration of the released code (`mohsenfayyaz/DecompX`,
`src/modeling_bert.py`: `BertLayer.forward` with `DecompXConfig(aggregation="vector")`
(the released default is `aggregation=None`, which carries nothing across blocks), `bias_decomposer`,
`ln_decomposer`, `ffn_decomposer` with "GeLU_ZO", the pooler's and the classifier's
`ffn_decomposer`), run on transformers' `BertForSequenceClassification` with its internals
read by hooks (random weights, norms and biases randomised, a padded batch with token types).
The released code itself is not on the package index; run once outside CI (transformers
4.20.1), it agreed with `decompx` within 5e-7 on the class logits' parts (README).
"""

import jax
import numpy as np
import pytest

import bertjax
from bertjax.analysis.attribution import decompx
from bertjax.model.heads import head_logits

SMALL = {
  "vocab_size": 300,
  "hidden_size": 32,
  "num_hidden_layers": 3,
  "num_attention_heads": 4,
  "intermediate_size": 48,
  "max_position_embeddings": 64,
}
SERVED = {
  "bert": {},
  "roberta": {"preset": "roberta-base", "max_position_embeddings": 66},
  "distilbert": {"preset": "distilbert-base"},
  "albert": {"preset": "albert-base", "embedding_size": 16, "num_hidden_groups": 1},
  "electra": {"preset": "electra-base"},
  "mpnet": {"preset": "mpnet-base"},
  "deberta": {"preset": "deberta-v3-base", "position_buckets": 8, "max_relative_positions": 16},
}


def _config(fields) -> bertjax.BertConfig:
  fields = dict(fields)
  preset = fields.pop("preset", "tiny")
  return bertjax.BertConfig.preset(preset, **{**SMALL, **fields})


def _randomised(config, seed=1):
  params = bertjax.init(config, seed, heads=("classifier",))
  leaves, tree = jax.tree_util.tree_flatten_with_path(params)
  rng = np.random.default_rng(seed)
  out = [
    leaf + 0.2 * rng.standard_normal(leaf.shape).astype(leaf.dtype)
    if "norm" in jax.tree_util.keystr(path).lower() or "bias" in jax.tree_util.keystr(path)
    else leaf
    for path, leaf in leaves
  ]
  return jax.tree_util.tree_unflatten(tree, out)


def _batch(config):
  rng = np.random.default_rng(0)
  mask = (np.arange(11)[None] < np.array([[11], [7], [4]])).astype(np.int32)
  ids = np.where(mask > 0, rng.integers(5, config.vocab_size, mask.shape), config.pad_token_id)
  return ids.astype(np.int32), mask


# A NumPy transliteration of the released code -----------------------------------------


def _bias(parts, bias):
  """`BertLayer.bias_decomposer`, "absdot"."""
  w = np.abs(
    np.einsum("...kd,...d->...k", parts, np.broadcast_to(bias, parts.shape[:-2] + bias.shape[-1:]))
  )
  w = w / (w.sum(-1, keepdims=True) + 1e-12)
  return (
    parts + w[..., None] * np.broadcast_to(bias, parts.shape[:-2] + bias.shape[-1:])[..., None, :]
  )


def _ln(parts, pre, gamma, beta, eps):
  """`BertLayer.ln_decomposer`."""
  var = ((pre - pre.mean(-1, keepdims=True)) ** 2).mean(-1, keepdims=True)[:, :, None]
  return _bias((parts - parts.mean(-1, keepdims=True)) / np.sqrt(var + eps) * gamma, beta)


def _released_decompx(model, ids, mask, types):
  import torch

  grab = {}

  def keep(name, which):
    def hook(module, inputs, output):
      grab.setdefault(name, []).append((inputs[0] if which == "in" else output).detach().numpy())

    return hook

  layers = model.bert.encoder.layer
  handles = []
  for layer in layers:
    handles += [
      layer.attention.output.LayerNorm.register_forward_hook(keep("pre_ln1", "in")),
      layer.attention.self.value.register_forward_hook(keep("value", "out")),
      layer.intermediate.dense.register_forward_hook(keep("pre_act", "out")),
      layer.intermediate.register_forward_hook(keep("act", "out")),
      layer.output.LayerNorm.register_forward_hook(keep("pre_ln2", "in")),
    ]
  with torch.no_grad():
    out = model(
      input_ids=torch.as_tensor(ids).long(),
      attention_mask=torch.as_tensor(mask).long(),
      token_type_ids=torch.as_tensor(types).long(),
      output_attentions=True,
      output_hidden_states=True,
    )
  for h in handles:
    h.remove()
  w = lambda t: t.detach().numpy().astype(np.float64)
  n = model.config.num_attention_heads
  hidden = [h.numpy().astype(np.float64) for h in out.hidden_states]
  batch, seq, size = hidden[0].shape
  parts = None
  for l, layer in enumerate(layers):
    probs = out.attentions[l].numpy().astype(np.float64)  # (B, N, T, T)
    wo = w(layer.attention.output.dense.weight).reshape(size, n, size // n)  # (H, N, D)
    if parts is None:  # the first layer: value_layer (with its bias) weighted by attention
      value = grab["value"][l].astype(np.float64).reshape(batch, seq, n, size // n)
      transformed = np.einsum("bsnv,dnv->bnsd", value, wo)
      attn = np.einsum("bnks,bnsd->bksd", probs, transformed)
      residual = np.einsum("sk,bsd->bskd", np.eye(seq), hidden[l])
      bias = w(layer.attention.output.dense.bias)
    else:  # "vector" aggregation: the previous layer's parts through W_V (no bias)
      dv = np.einsum("bijd,vd->bijv", parts, w(layer.attention.self.value.weight))
      dv = dv.reshape(batch, seq, seq, n, size // n)
      transformed = np.einsum("bsqnv,dnv->bnsqd", dv, wo)
      attn = np.einsum("bnks,bnsqd->bkqd", probs, transformed)
      residual = parts
      bias = w(layer.attention.output.dense.weight) @ w(layer.attention.self.value.bias) + w(
        layer.attention.output.dense.bias
      )
    res = _bias(attn + residual, bias)
    ln1 = layer.attention.output.LayerNorm
    post_ln = _ln(res, grab["pre_ln1"][l].astype(np.float64), w(ln1.weight), w(ln1.bias), ln1.eps)
    z = _bias(
      np.einsum("ld,bskd->bskl", w(layer.intermediate.dense.weight), post_ln),
      w(layer.intermediate.dense.bias),
    )
    m = grab["act"][l].astype(np.float64) / (grab["pre_act"][l].astype(np.float64) + 1e-12)
    ffn = _bias(
      np.einsum("bskl,dl->bskd", z * m[:, :, None, :], w(layer.output.dense.weight)),
      w(layer.output.dense.bias),
    )
    ln2 = layer.output.LayerNorm
    parts = _ln(
      post_ln + ffn, grab["pre_ln2"][l].astype(np.float64), w(ln2.weight), w(ln2.bias), ln2.eps
    )
  pooler = model.bert.pooler.dense
  pre = hidden[-1][:, 0] @ w(pooler.weight).T + w(pooler.bias)
  pooled = _bias(np.einsum("ld,bsd->bsl", w(pooler.weight), parts[:, 0]), w(pooler.bias))
  pooled = pooled * (np.tanh(pre) / (pre + 1e-12))[:, None, :]
  logits = _bias(
    np.einsum("ld,bkd->bkl", w(model.classifier.weight), pooled), w(model.classifier.bias)
  )
  return parts, logits, out.logits.numpy()


@pytest.mark.hf
def test_matches_the_released_algorithm(tmp_path):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  cfg = transformers.BertConfig(
    vocab_size=120,
    hidden_size=48,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=72,
    max_position_embeddings=40,
    num_labels=3,
    attn_implementation="eager",
  )
  torch.manual_seed(0)
  model = transformers.BertForSequenceClassification(cfg).eval()
  gen = torch.Generator().manual_seed(1)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "LayerNorm" in name or name.endswith("bias"):
        p.add_(0.2 * torch.randn(p.shape, generator=gen))
  model.save_pretrained(tmp_path)
  config, params = bertjax.from_hf(tmp_path)
  ids, mask = _batch(config)
  types = (np.arange(ids.shape[1])[None] >= 5).astype(np.int32) * mask
  parts, logits, hf_logits = _released_decompx(model, ids, mask, types)
  got = decompx.decompx(params, config, ids, mask, types, head="classifier")
  real = (mask[:, :, None] * mask[:, None, :]).astype(bool)
  np.testing.assert_allclose(np.asarray(got.parts)[real], parts[real], atol=1e-4)
  np.testing.assert_allclose(np.asarray(got.logits)[mask > 0], logits[mask > 0], atol=1e-5)
  np.testing.assert_allclose(np.asarray(got.logits).sum(1), hf_logits, atol=1e-5)


@pytest.mark.parametrize("family", sorted(SERVED))
def test_parts_sum_to_the_states_and_the_logits(family):
  config = _config(SERVED[family])
  params = _randomised(config)
  ids, mask = _batch(config)
  got = decompx.decompx(params, config, ids, mask, head="classifier")
  out = bertjax.forward(params, config, ids, mask)
  state = np.asarray(out.last_hidden_state)
  np.testing.assert_allclose(
    np.asarray(got.parts).sum(2)[mask > 0], state[mask > 0], atol=2e-5 * np.abs(state).max()
  )
  np.testing.assert_allclose(
    np.asarray(got.logits).sum(1),
    np.asarray(head_logits(params, config, out, "classifier")),
    atol=1e-5,
  )
  parts = np.asarray(got.parts)
  assert not parts[mask == 0].any() and not parts.swapaxes(1, 2)[mask == 0].any()  # padding


def test_bias_conventions_keep_completeness_and_without_biases_lose_it():
  config = _config(SERVED["bert"])
  params = _randomised(config)
  ids, mask = _batch(config)
  state = np.asarray(bertjax.forward(params, config, ids, mask).last_hidden_state)
  for kind in decompx.BIAS_DECOMPOSITIONS:
    if kind == "dot":  # signed weights can nearly cancel; the sum still holds
      continue
    got = decompx.decompx(params, config, ids, mask, bias_decomp=kind)
    np.testing.assert_allclose(
      np.asarray(got.parts).sum(2)[mask > 0], state[mask > 0], atol=1e-4, err_msg=kind
    )
  cls = np.asarray(decompx.decompx(params, config, ids, mask, bias_decomp="cls").parts)
  absdot = np.asarray(decompx.decompx(params, config, ids, mask).parts)
  assert np.abs(cls - absdot).max() > 1e-3
  bare = np.asarray(decompx.decompx(params, config, ids, mask, include_biases=False).parts)
  assert np.abs(bare.sum(2) - state)[mask > 0].max() > 1e-2


def test_minilm_parts_sum_to_its_states(minilm_dir):
  config, params = bertjax.from_hf(minilm_dir)
  tok = bertjax.Tokenizer.from_pretrained(minilm_dir)
  b = tok.encode(["Nobody ever answers the door after nine.", "Did you not see the sign?"])
  got = decompx.decompx(params, config, b.input_ids, b.attention_mask, b.token_type_ids)
  state = np.asarray(
    bertjax.forward(
      params, config, b.input_ids, b.attention_mask, b.token_type_ids
    ).last_hidden_state
  )
  m = b.attention_mask > 0
  np.testing.assert_allclose(np.asarray(got.parts).sum(2)[m], state[m], atol=1e-4)


def test_refusals():
  config = _config(SERVED["bert"])
  params = _randomised(config)
  ids, mask = _batch(config)
  with pytest.raises(ValueError, match="bias_decomp='x'"):
    decompx.decompx(params, config, ids, mask, bias_decomp="x")
  with pytest.raises(ValueError, match="needs params with a classifier"):
    decompx.decompx(bertjax.init(config), config, ids, mask, head="classifier")
  modern = bertjax.BertConfig.preset("modernbert-base", **SMALL, pad_token_id=0)
  with pytest.raises(ValueError, match="post-LayerNorm"):
    decompx.decompx(bertjax.init(modern), modern, ids, mask)
  nomic = bertjax.BertConfig.preset("nomic-bert", **SMALL)
  with pytest.raises(ValueError, match="gated"):
    decompx.decompx(bertjax.init(nomic), nomic, ids, mask)
  with pytest.raises(ValueError, match="quantize='int8'"):
    decompx.decompx(
      params, bertjax.BertConfig(**{**config.__dict__, "quantize": "int8"}), ids, mask
    )
