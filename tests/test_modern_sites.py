"""Sites, patches and masks on the modern blocks, against PyTorch forward hooks.

For ModernBERT (pre-LN, windows, GeGLU), EuroBERT (pre-RMSNorm, grouped heads, SwiGLU),
NomicBERT (post-LN, rotary, SwiGLU), MPNet (relative-position bias), DeBERTa-v2
(disentangled attention), UltraBERT (EuroBERT's block with windows and a rotary theta
per layer type) and EmbeddingGemma (sandwich norms: `attn_out` and `ffn_out` are the
normed outputs the residual adds; q and k after QK-norm and rotary), tiny models with random weights loaded from transformers: every
site equals the same quantity read with forward hooks on the transformers model (q and k
after transformers' own rotary function; DeBERTa's position terms as the sum its
`disentangled_attention_bias` returns, its content logit from the hooked q and k);
a head-output patch equals the same edit made by a hook; weight 0 is bitwise the
unpatched forward; head masks give the same outputs on the fused and the map path, and the
"uniform" mode equals patching the probabilities with the uniform distribution over the
keys a layer may see (its window included).
"""

import jax
import numpy as np
import pytest

import bertjax

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from test_modern_families import _batch, _hf_model

pytestmark = pytest.mark.hf

FAMILIES = (
  "modernbert",
  "eurobert_gqa",
  "nomic_bert",
  "mpnet",
  "deberta",
  "ultrabert_gqa",
  "embeddinggemma",
)

# Per family: the layers, and site -> (module path in a layer, "out" output | "in" input).
# q, k, v come from the projections' outputs (then transformers' rotary function).
HOOKS = {
  "modernbert": dict(
    layers="layers",
    attn_in=("attn", "in"),
    head_out=("attn.Wo", "in"),
    attn_out=("attn.Wo", "out"),
    mid=("mlp_norm", "in"),
    resid_mid=("mlp_norm", "in"),
    ffn_in=("mlp", "in"),
    ffn_gate=("mlp.act", "out"),
    ffn_act=("mlp.Wo", "in"),
    ffn_out=("mlp.Wo", "out"),
    resid_out=("", "out"),
    out=("", "out"),
  ),
  "eurobert": dict(
    layers="layers",
    attn_in=("input_layernorm", "out"),
    q=("self_attn.q_proj", "out"),
    k=("self_attn.k_proj", "out"),
    v=("self_attn.v_proj", "out"),
    head_out=("self_attn.o_proj", "in"),
    attn_out=("self_attn.o_proj", "out"),
    mid=("post_attention_layernorm", "in"),
    resid_mid=("post_attention_layernorm", "in"),
    ffn_in=("post_attention_layernorm", "out"),
    ffn_gate=("mlp.act_fn", "out"),
    ffn_act=("mlp.down_proj", "in"),
    ffn_out=("mlp.down_proj", "out"),
    resid_out=("", "out"),
    out=("", "out"),
  ),
  "nomic_bert": dict(
    layers="layers",
    attn_in=("", "in"),
    q=("self_attn.q_proj", "out"),
    k=("self_attn.k_proj", "out"),
    v=("self_attn.v_proj", "out"),
    head_out=("self_attn.o_proj", "in"),
    attn_out=("self_attn.o_proj", "out"),
    resid_mid=("post_attention_layernorm", "in"),
    mid=("post_attention_layernorm", "out"),
    ffn_in=("mlp", "in"),
    ffn_gate=("mlp.act_fn", "out"),
    ffn_act=("mlp.down_proj", "in"),
    ffn_out=("mlp.down_proj", "out"),
    resid_out=("post_mlp_layernorm", "in"),
    out=("", "out"),
  ),
  "mpnet": dict(
    layers="encoder.layer",
    attn_in=("", "in"),
    q=("attention.attn.q", "out"),
    k=("attention.attn.k", "out"),
    v=("attention.attn.v", "out"),
    head_out=("attention.attn.o", "in"),
    attn_out=("attention.attn.o", "out"),
    resid_mid=("attention.LayerNorm", "in"),
    mid=("attention.LayerNorm", "out"),
    ffn_in=("intermediate", "in"),
    ffn_act=("intermediate", "out"),
    ffn_out=("output.dense", "out"),
    resid_out=("output.LayerNorm", "in"),
    out=("", "out"),
  ),
  "deberta": dict(
    layers="encoder.layer",
    attn_in=("", "in"),
    q=("attention.self.query_proj", "out"),
    k=("attention.self.key_proj", "out"),
    v=("attention.self.value_proj", "out"),
    head_out=("attention.output.dense", "in"),
    attn_out=("attention.output.dense", "out"),
    resid_mid=("attention.output.LayerNorm", "in"),
    mid=("attention.output.LayerNorm", "out"),
    ffn_in=("intermediate", "in"),
    ffn_act=("intermediate", "out"),
    ffn_out=("output.dense", "out"),
    resid_out=("output.LayerNorm", "in"),
    out=("", "out"),
  ),
}


HOOKS["ultrabert"] = HOOKS["eurobert"]  # the same Llama-like modules
# Gemma 3: q and k after their norms (heads first there), the sublayers' outputs after theirs.
HOOKS["embeddinggemma"] = dict(
  HOOKS["eurobert"],
  q=("self_attn.q_norm", "out"),
  k=("self_attn.k_norm", "out"),
  attn_out=("post_attention_layernorm", "out"),
  mid=("pre_feedforward_layernorm", "in"),
  resid_mid=("pre_feedforward_layernorm", "in"),
  ffn_in=("pre_feedforward_layernorm", "out"),
  ffn_out=("post_feedforward_layernorm", "out"),
)


def _recorded(value, record):
  record("scores_pos", value)
  return value


def _module(root, path):
  for part in filter(None, path.split(".")):
    root = root[int(part)] if part.isdigit() else getattr(root, part)
  return root


def _torch_sites(model, family, ids, mask):
  """Every site of every layer, read with hooks (and q, k rotated as transformers does)."""
  spec = dict(HOOKS[family.removesuffix("_gqa")])
  base = model.base_model
  layers = _module(base, spec.pop("layers"))
  config = model.config
  heads, kv = config.num_attention_heads, getattr(config, "num_key_value_heads", None)
  kv = kv or heads
  d = getattr(config, "head_dim", None) or config.hidden_size // heads
  got, hooks = {}, []

  def record(site, value):
    got.setdefault(site, []).append(value.detach().numpy())

  for layer in layers:
    for site, (path, where) in spec.items():
      module = _module(layer, path)
      if where == "out":
        hooks.append(
          module.register_forward_hook(
            lambda m, i, o, s=site: record(s, o if torch.is_tensor(o) else o[0])
          )
        )
      else:
        hooks.append(
          module.register_forward_pre_hook(
            lambda m, i, kw, s=site: record(s, i[0] if i else kw["hidden_states"]), with_kwargs=True
          )
        )
    if family == "modernbert":
      hooks.append(layer.attn.Wqkv.register_forward_hook(lambda m, i, o: record("qkv", o)))
    if family == "deberta":  # the position terms' sum, as transformers adds it to the logits
      attn = layer.attention.self
      attn.disentangled_attention_bias = lambda *a, f=attn.disentangled_attention_bias: _recorded(
        f(*a), record
      )
  with torch.no_grad():
    out = model(
      torch.tensor(ids),
      attention_mask=torch.tensor(mask),
      output_attentions=True,
      output_hidden_states=True,
    )
  for h in hooks:
    h.remove()
  if family == "deberta":
    for layer in layers:
      vars(layer.attention.self).pop("disentangled_attention_bias")
  sites = {k: np.stack(v) for k, v in got.items()}
  if family == "embeddinggemma":  # the norms' outputs (L, B, N, T, D) -> (L, B, T, N D)
    for s in ("q", "k"):
      sites[s] = np.swapaxes(sites[s], 2, 3).reshape(*sites[s].shape[:2], ids.shape[1], -1)
  if "qkv" in sites:  # ModernBERT's fused projection
    qkv = sites.pop("qkv")
    sites["q"], sites["k"], sites["v"] = np.split(qkv, 3, axis=-1)
  split = lambda x, n: x.reshape(*x.shape[:-1], n, d)
  sites["q"], sites["k"], sites["v"] = (
    split(sites["q"], heads),
    split(sites["k"], kv),
    split(sites["v"], kv),
  )
  sites["head_out"] = split(sites["head_out"], heads)
  if hasattr(base, "rotary_emb"):  # q and k after rotation, by transformers' own function
    module = __import__(type(base).__module__, fromlist=["apply_rotary_pos_emb"])
    positions = torch.arange(ids.shape[1])[None]
    x = torch.zeros(1, ids.shape[1], config.hidden_size)
    for i in range(len(layers)):
      # a rotary theta per layer type
      typed = family in ("modernbert", "ultrabert_gqa", "embeddinggemma")
      args = (x, positions) + ((config.layer_types[i],) if typed else ())
      cos, sin = base.rotary_emb(*args)
      q, k = (torch.tensor(sites[s][i]) for s in ("q", "k"))
      q, k = module.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)
      sites["q"][i], sites["k"][i] = q.numpy(), k.numpy()
  if family == "deberta":  # (B * N, T, T) -> (B, N, T, T); the content logit from q and k
    pos = sites.pop("scores_pos")
    sites["scores_pos"] = pos.reshape(pos.shape[0], -1, heads, *pos.shape[2:])
    factor = 1 + len(config.pos_att_type)
    sites["scores_c2c"] = np.einsum("lbqhd,lbkhd->lbhqk", sites["q"], sites["k"]) / np.sqrt(
      d * factor
    )
  sites["probs"] = np.stack([a.numpy() for a in out.attentions])
  sites["embeddings"] = out.hidden_states[0].numpy()
  return sites


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
  key = request.param
  if key == "deberta":  # v2's layout: its own position projections, absolute positions
    from test_deberta import _hf_model as deberta_model

    model = deberta_model("v2", "Model")
  else:
    model = _hf_model(key, "Model")
  path = tmp_path_factory.mktemp(key)
  model.save_pretrained(path)
  config, params = bertjax.from_hf(path)
  ids, mask = _batch(config.pad_token_id)
  return key, model, config, params, ids, mask


def test_every_site_equals_pytorch_hooks(family):
  key, model, config, params, ids, mask = family
  theirs = _torch_sites(model, key, ids, mask)
  sites = bertjax.model_sites(config)
  out = bertjax.forward(params, config, ids, mask, capture=sites)
  if "scores_pos" in theirs:  # transformers adds DeBERTa's two position terms as one
    sites = tuple(s for s in sites if s not in ("scores_c2p", "scores_p2c")) + ("scores_pos",)
    out.cache["scores_pos"] = out.cache["scores_c2p"] + out.cache["scores_p2c"]
  assert set(theirs) == set(sites), set(theirs) ^ set(sites)
  real = mask.astype(bool)
  for site in sites:
    got, want = np.asarray(out.cache[site]), theirs[site]
    assert got.shape == want.shape, site
    if site != "scores_pos":
      assert got.shape == bertjax.site_shape(config, site, *ids.shape), site
    if site.startswith("scores"):  # at real keys too (padding's states differ from layer 1)
      got, want = (np.where(real[None, :, None, None, :], a, 0) for a in (got, want))
    if site == "probs" or site.startswith("scores"):
      got, want = (np.moveaxis(a, 2, 3)[:, real] for a in (got, want))
    elif site == "embeddings":
      got, want = got[real], want[real]
    else:
      got, want = got[:, real], want[:, real]
    diff = np.abs(got - want).max()
    assert diff < 1e-5 * max(1.0, float(np.abs(want).max())), (site, diff)


def test_head_out_patch_equals_pytorch_hook_edit(family):
  key, model, config, params, ids, mask = family
  other = np.where(mask > 0, (ids * 7 + 3) % 90 + 5, config.pad_token_id)
  source = bertjax.forward(params, config, other, mask, capture=("head_out",)).cache["head_out"]
  chosen = {(1, 2), (3, 0)}
  weight = np.zeros((config.depth, 1, 1, config.num_attention_heads, 1), np.float32)
  for layer, head in chosen:
    weight[layer, ..., head, 0] = 1.0
  ours = bertjax.forward(params, config, ids, mask, patch={"head_out": (source, weight)})
  spec = HOOKS[key.removesuffix("_gqa")]
  layers = _module(model.base_model, spec["layers"])
  d = config.head_dim

  def edit(layer):
    def pre_hook(module, inputs):
      x = inputs[0].clone()
      for l_, h in chosen:
        if l_ == layer:
          x[..., h * d : (h + 1) * d] = torch.tensor(np.asarray(source[layer])[..., h, :])
      return (x,)

    return pre_hook

  path = spec["head_out"][0]
  hooks = [_module(layers[i], path).register_forward_pre_hook(edit(i)) for i in range(config.depth)]
  try:
    with torch.no_grad():
      want = model(torch.tensor(ids), attention_mask=torch.tensor(mask))[0].numpy()
  finally:
    for h in hooks:
      h.remove()
  real = mask.astype(bool)
  clean = bertjax.forward(params, config, ids, mask).last_hidden_state
  assert np.abs(np.asarray(clean)[real] - want[real]).max() > 1e-3  # the edit matters
  assert np.abs(np.asarray(ours.last_hidden_state)[real] - want[real]).max() < 1e-4


def test_weight_zero_is_bitwise_the_unpatched_forward(family):
  key, _model, config, params, ids, mask = family
  sites = bertjax.model_sites(config)
  if key != "modernbert":  # the mechanism is one; ModernBERT's block has every kind of site
    sites = tuple(s for s in sites if s in ("attn_in", "k", "probs", "ffn_gate", "resid_out"))
  base = bertjax.forward(params, config, ids, mask, capture=sites)
  plain = bertjax.forward(params, config, ids, mask)
  maps = bertjax.forward(params, config, ids, mask, output_attentions=True)
  for site in sites:
    value = jax.random.normal(jax.random.key(1), base.cache[site].shape)
    zero = bertjax.forward(params, config, ids, mask, patch={site: (value, 0.0)})
    want = maps if site == "probs" else plain
    assert np.array_equal(np.asarray(zero.last_hidden_state), np.asarray(want.last_hidden_state)), (
      site
    )


def test_head_masks_fused_and_map_path_agree(family):
  _key, _model, config, params, ids, mask = family
  rng = np.random.default_rng(0)
  xi = rng.uniform(size=(config.depth, config.num_attention_heads)).astype(np.float32)
  for mode in ("scale", "uniform"):
    fused = bertjax.forward(params, config, ids, mask, head_mask=xi, head_ablation=mode)
    maps = bertjax.forward(
      params, config, ids, mask, head_mask=xi, head_ablation=mode, output_attentions=True
    )
    np.testing.assert_allclose(fused.last_hidden_state, maps.last_hidden_state, atol=2e-5)
  # "uniform" = the attention mixed with the uniform distribution over the keys each layer
  # may see (real keys, within its window), set through the probs site.
  probs = maps.attentions  # (L, B, N, T, T) after the uniform mix: xi A + (1 - xi) U
  via_probs = bertjax.forward(params, config, ids, mask, patch={"probs": (probs, 1.0)})
  np.testing.assert_allclose(via_probs.last_hidden_state, fused.last_hidden_state, atol=2e-5)
  windows = [w for w in config.layer_windows if w]
  if windows:  # the mix stays inside the band
    d = int(np.argmax([w is not None for w in config.layer_windows]))
    band = np.abs(np.arange(ids.shape[1])[:, None] - np.arange(ids.shape[1])) <= windows[0] // 2
    assert not np.asarray(probs[d])[..., ~band].any()


def test_layer_mask_zero_skips_a_block(family):
  _key, _model, config, params, ids, mask = family
  lm = np.ones(config.depth, np.float32)
  lm[1] = 0.0
  out = bertjax.forward(params, config, ids, mask, layer_mask=lm, output_hidden_states=True)
  np.testing.assert_array_equal(out.hidden_states[2], out.hidden_states[1])
