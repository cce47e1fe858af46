"""The modern encoders against transformers 5 (PyTorch, float32), random weights.

ModernBERT (both config.json layouts: transformers 5's `layer_types` + `rope_parameters`, and
the released `global_attn_every_n_layers` / `global_rope_theta` / `local_rope_theta`), EuroBERT
(grouped key/value heads, untied decoder), MPNet (relative-position bias), NomicBERT
(rotary, SwiGLU, the hub's fused Wqkv layout), UltraBERT (windows by radius, a rotary
theta per layer type, a two-layer MLM head) and EmbeddingGemma (Gemma 3's bidirectional
block: sandwich norms, QK-norm, a query scale of its own), each with every class bertjax maps: odd
sizes, every parameter randomised (norms and biases too), padded batches on the right and
on the left: every hidden state, every attention map (local layers included) and the
head's logits within 1e-4 at real tokens; `to_hf` output loaded by transformers strictly
gives the same outputs, and `from_hf(to_hf(x))` is bitwise identical.
"""

import json

import jax
import numpy as np
import pytest

import bertjax

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.hf

ATOL = 1e-4
SIZES = dict(
  vocab_size=99,
  hidden_size=60,
  num_hidden_layers=4,
  num_attention_heads=5,
  intermediate_size=37,
  max_position_embeddings=64,
  pad_token_id=0,
  bos_token_id=1,
  eos_token_id=2,
  num_labels=3,
)
# key -> (model_type, class prefix, extra config)
CONFIGS = {
  "modernbert": (
    "modernbert",
    "ModernBert",
    dict(
      global_attn_every_n_layers=2,
      local_attention=4,
      cls_token_id=1,
      sep_token_id=2,
      norm_bias=True,
      attention_bias=True,
      mlp_bias=True,
      classifier_bias=True,
      classifier_pooling="mean",
      classifier_activation="silu",
    ),
  ),
  "modernbert_nobias": (
    "modernbert",
    "ModernBert",
    dict(
      global_attn_every_n_layers=3,
      local_attention=6,
      cls_token_id=1,
      sep_token_id=2,
      decoder_bias=False,
    ),
  ),
  "eurobert": (
    "eurobert",
    "EuroBert",
    dict(num_key_value_heads=5, mask_token_id=3, classifier_pooling="late"),
  ),
  "eurobert_gqa": (
    "eurobert",
    "EuroBert",
    dict(
      num_attention_heads=6,
      num_key_value_heads=2,
      mask_token_id=3,
      mlp_bias=True,
      attention_bias=True,
      classifier_pooling="bos",
      tie_word_embeddings=True,
    ),
  ),
  "mpnet": ("mpnet", "MPNet", dict(pad_token_id=1)),
  "nomic_bert": ("nomic_bert", "NomicBert", {}),
  # A window of radius 2 in three of four layers, a rotary theta per layer type, the
  # two-layer MLM head (24 wide) and its own decoder; then grouped heads, biases, tied.
  "ultrabert": (
    "ultrabert",
    "Ultrabert",
    dict(
      sliding_window=2,
      prediction_head_size=24,
      layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
      classifier_pooling="mean",
    ),
  ),
  "ultrabert_gqa": (
    "ultrabert",
    "Ultrabert",
    dict(
      num_attention_heads=6,
      num_key_value_heads=2,
      sliding_window=3,
      attention_bias=True,
      mlp_bias=True,
      tie_word_embeddings=True,
    ),
  ),
  # EmbeddingGemma: Gemma 3's bidirectional block (sandwich norms as `1 + w`, QK-norm,
  # sqrt(H) embedding scale) with a query scale of its own, a window of radius 2 in three
  # of four layers, a rotary theta per layer type, grouped heads; the base model only.
  "embeddinggemma": (
    "gemma3_text",
    "Gemma3Text",
    dict(
      head_dim=10,
      num_attention_heads=6,
      num_key_value_heads=2,
      query_pre_attn_scalar=7,
      sliding_window=4,
      use_bidirectional_attention=True,
      layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
      rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 5000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 300.0},
      },
    ),
  ),
}
CLASSES = {
  "Model": None,
  "ForMaskedLM": "mlm",
  "ForSequenceClassification": "classifier",
  "ForTokenClassification": "token_classifier",
}
BASE_ONLY = ("embeddinggemma",)  # families whose row maps the base model alone
CASES = [(key, cls) for key in CONFIGS for cls in CLASSES if key not in BASE_ONLY or cls == "Model"]


def _hf_model(key, cls, seed=0):
  model_type, prefix, extra = CONFIGS[key]
  config = transformers.AutoConfig.for_model(model_type, **{**SIZES, **extra})
  torch.manual_seed(seed)
  model = getattr(transformers, prefix + cls)(config)
  with torch.no_grad():  # every parameter random, norms and biases included
    for name, p in model.named_parameters():
      norm = "norm" in name.lower() or "emb_ln" in name
      p.normal_(0.0, 0.3 if norm else 0.08)
      if norm and name.endswith("weight"):
        p.add_(1.0)
  model.config._attn_implementation = "eager"
  return model.eval()


def _batch(pad_token_id, left=False, seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, 99, (3, 11))
  mask = np.ones((3, 11), np.int64)
  mask[1, 7:] = 0
  mask[2, 3:] = 0
  if left:
    mask = mask[:, ::-1].copy()
  return np.where(mask > 0, ids, pad_token_id), mask


def _close(ours, theirs, name):
  ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
  assert ours.shape == theirs.shape, (name, ours.shape, theirs.shape)
  diff = np.abs(ours - theirs).max()
  assert diff < ATOL, f"{name}: max abs diff {diff:.3g}"


def _compare(model, config, params, cls, left=False):
  ids, mask = _batch(config.pad_token_id, left=left)
  with torch.no_grad():
    ref = model(
      torch.tensor(ids),
      attention_mask=torch.tensor(mask),
      output_hidden_states=True,
      output_attentions=True,
    )
  out = bertjax.forward(
    params, config, ids, mask, output_hidden_states=True, output_attentions=True
  )
  real = mask.astype(bool)
  assert len(ref.hidden_states) == config.depth + 1
  for i, h in enumerate(ref.hidden_states):
    _close(np.asarray(out.hidden_states[i])[real], h.numpy()[real], f"hidden_states[{i}]")
  assert len(ref.attentions) == config.depth
  for i, a in enumerate(ref.attentions):  # every map, at real query rows
    ours = np.asarray(out.attentions[i]).transpose(0, 2, 1, 3)[real]
    _close(ours, a.numpy().transpose(0, 2, 1, 3)[real], f"attentions[{i}]")
  head = CLASSES[cls]
  if head is not None:
    logits = bertjax.head_logits(params, config, out, head, attention_mask=mask)
    theirs = ref.logits.numpy()
    if theirs.ndim == 3:
      _close(np.asarray(logits)[real], theirs[real], head)
    else:  # a left-padded row's first position is padding, which bertjax leaves at zero
      first = real[:, 0]
      _close(np.asarray(logits)[first], theirs[first], head)
  return ids, mask, ref


@pytest.mark.parametrize("key,cls", CASES, ids=[f"{k}-{c}" for k, c in CASES])
def test_family_matches_transformers(tmp_path, key, cls):
  model = _hf_model(key, cls)
  model.save_pretrained(tmp_path / "hf")
  config, params = bertjax.from_hf(tmp_path / "hf")
  assert config.model_type == CONFIGS[key][0]
  ids, mask, ref = _compare(model, config, params, cls)
  _compare(model, config, params, cls, left=True)
  # Both directions: transformers loads what to_hf writes, strictly, with the same outputs;
  # reading it back gives the same parameters bit for bit.
  bertjax.to_hf(config, params, tmp_path / "out")
  back = getattr(transformers, CONFIGS[key][1] + cls).from_pretrained(
    tmp_path / "out", attn_implementation="eager", output_loading_info=True
  )
  reloaded, info = back
  assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
  with torch.no_grad():
    again = reloaded.eval()(torch.tensor(ids), attention_mask=torch.tensor(mask))
  np.testing.assert_array_equal(again[0].numpy(), ref[0].numpy())
  config2, params2 = bertjax.from_hf(tmp_path / "out")
  assert config2 == config
  assert jax.tree.structure(params2) == jax.tree.structure(params)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_modernbert_legacy_config_layout(tmp_path):
  """The released ModernBERT config.json (global_attn_every_n_layers, global/local rope
  thetas, no layer_types or rope_parameters) loads in both libraries with the same layers."""
  model = _hf_model("modernbert", "Model")
  model.save_pretrained(tmp_path / "hf")
  file = tmp_path / "hf" / "config.json"
  hf = json.loads(file.read_text())
  for key in ("layer_types", "rope_parameters"):
    hf.pop(key, None)
  hf.update(global_attn_every_n_layers=3, global_rope_theta=50000.0, local_rope_theta=2000.0)
  file.write_text(json.dumps(hf))
  legacy = transformers.ModernBertModel.from_pretrained(
    tmp_path / "hf", attn_implementation="eager"
  ).eval()
  assert legacy.config.layer_types == [
    "full_attention",
    "sliding_attention",
    "sliding_attention",
    "full_attention",
  ]
  config, params = bertjax.from_hf(tmp_path / "hf")
  assert config.layer_types == tuple(legacy.config.layer_types)
  assert (config.rope_theta, config.local_rope_theta) == (50000.0, 2000.0)
  _compare(legacy, config, params, "Model")


def test_sliding_window_boundary_is_transformers():
  """A window w lets a query see keys with |q - k| <= w // 2, as transformers' mask."""
  from transformers.masking_utils import sliding_window_bidirectional_overlay

  for w in (2, 5, 128):
    inner = sliding_window_bidirectional_overlay(w // 2)
    theirs = np.array([[bool(inner(0, 0, q, k)) for k in range(300)] for q in range(300)])
    allowed, _ = bertjax.kernels.Mask(window=w).allowed(1, 300, 300)
    np.testing.assert_array_equal(np.asarray(allowed[0]), theirs)


def test_relative_position_bucket_is_transformers():
  """MPNet's bucket function over every distance up to 5000 (float32 log, as torch's)."""
  from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

  rel = np.arange(-5000, 5001)
  theirs = MPNetEncoder.relative_position_bucket(torch.tensor(rel)).numpy()
  np.testing.assert_array_equal(np.asarray(bertjax.kernels.relative_position_bucket(rel)), theirs)


def test_block_options_are_named_errors():
  """Options a family cannot take are errors naming the value, before any compute."""
  with pytest.raises(ValueError, match="rope_theta.*no rotary"):
    bertjax.BertConfig(rope_theta=10000.0)
  with pytest.raises(ValueError, match="num_key_value_heads=3"):
    bertjax.BertConfig.for_family(
      "eurobert", num_attention_heads=4, hidden_size=64, num_key_value_heads=3
    )
  with pytest.raises(ValueError, match="sliding_window is required"):
    bertjax.BertConfig.for_family(
      "modernbert",
      num_hidden_layers=2,
      sliding_window=None,
      layer_types=("full_attention", "sliding_attention"),
    )
  with pytest.raises(ValueError, match="classifier_pooling='late'"):
    bertjax.BertConfig.for_family("modernbert", classifier_pooling="late")
  with pytest.raises(ValueError, match="sliding_window=5 must be even for model_type='ultrabert'"):
    bertjax.BertConfig.for_family("ultrabert", sliding_window=5)
  # UltraBERT's older released layout (a window per layer, a theta list) is refused by name.
  hf = bertjax.BertConfig.for_family("ultrabert").to_hf_dict()
  old = {k: v for k, v in hf.items() if k not in ("layer_types", "rope_parameters")}
  with pytest.raises(
    ValueError, match="rope_theta=\\[10000.0, 2560000.0\\] in config.json is not one"
  ):
    bertjax.BertConfig.from_hf_dict(dict(old, rope_theta=[10000.0, 2560000.0]))
  with pytest.raises(ValueError, match="'ultrabert' model gives no layer_types"):
    bertjax.BertConfig.from_hf_dict(old)
  with pytest.raises(ValueError, match="ffn_gate.*does not exist on a bert block"):
    bertjax.site_shape(bertjax.BertConfig(), "ffn_gate", 1, 4)


def test_preset_depth_keeps_the_layer_pattern():
  """A ModernBERT preset at another depth repeats its global-every-third pattern."""
  config = bertjax.BertConfig.preset("modernbert-base", num_hidden_layers=5)
  assert config.layer_types == (
    "full_attention",
    "sliding_attention",
    "sliding_attention",
    "full_attention",
    "sliding_attention",
  )
  assert len(bertjax.BertConfig.preset("modernbert-base").layer_types) == 22


def test_embeddinggemma_refuses_what_it_does_not_implement():
  """A causal Gemma 3, logit soft-capping, or a head width that is not H / heads: refused by
  name in config.json, never loaded as another model."""
  hf = bertjax.BertConfig.for_family("gemma3_text", hidden_size=64, num_attention_heads=4)
  hf = hf.to_hf_dict(["Gemma3TextModel"])
  assert hf["use_bidirectional_attention"] is True and hf["attn_logit_softcapping"] is None
  assert bertjax.BertConfig.from_hf_dict(hf).attention_scale == 256**-0.5
  for key, value in (("use_bidirectional_attention", False), ("attn_logit_softcapping", 50.0)):
    with pytest.raises(ValueError, match=f"{key}={value!r} in config.json of a 'gemma3_text'"):
      bertjax.BertConfig.from_hf_dict(dict(hf, **{key: value}))
  with pytest.raises(ValueError, match="head_dim=256 with num_attention_heads=4"):
    bertjax.BertConfig.from_hf_dict(dict(hf, head_dim=256))
  with pytest.raises(ValueError, match="query_pre_attn_scalar=0 must be a positive number"):
    bertjax.BertConfig.for_family("gemma3_text", query_pre_attn_scalar=0)
