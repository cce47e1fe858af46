"""Every family and Hugging Face class against transformers (PyTorch, float32), random weights.

Odd sizes (3 layers, 5 heads of 12, vocab 99), every parameter randomised
(LayerNorms and biases too), padded batches: every hidden state, every
attention map and the head's logits within 1e-4 at real tokens; `to_hf` output
loaded by transformers with no missing or unexpected keys gives the same
logits, and `from_hf(to_hf(x))` is bitwise identical.
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
  num_hidden_layers=3,
  num_attention_heads=5,
  intermediate_size=37,
  max_position_embeddings=40,
  hidden_act="gelu",
)
DISTIL_SIZES = dict(
  vocab_size=99,
  dim=60,
  n_layers=3,
  n_heads=5,
  hidden_dim=37,
  max_position_embeddings=40,
  activation="gelu",
)

# (model_type, transformers class, our head or None, extra config)
CASES = [
  ("bert", "BertModel", None, {}),
  ("bert", "BertForPreTraining", "mlm+nsp", {}),
  (
    "albert",
    "AlbertForPreTraining",
    "mlm+sop",
    dict(embedding_size=16, num_hidden_groups=1, inner_group_num=1),
  ),
  ("roberta", "RobertaModel", None, dict(type_vocab_size=1, pad_token_id=1)),
  ("roberta", "RobertaForMaskedLM", "mlm", dict(type_vocab_size=1, pad_token_id=1)),
  (
    "roberta",
    "RobertaForSequenceClassification",
    "classifier",
    dict(type_vocab_size=1, pad_token_id=1, num_labels=3),
  ),
  (
    "roberta",
    "RobertaForTokenClassification",
    "token_classifier",
    dict(type_vocab_size=1, pad_token_id=1, num_labels=4),
  ),
  ("xlm-roberta", "XLMRobertaModel", None, dict(type_vocab_size=1, pad_token_id=1)),
  ("xlm-roberta", "XLMRobertaForMaskedLM", "mlm", dict(type_vocab_size=1, pad_token_id=1)),
  (
    "xlm-roberta",
    "XLMRobertaForTokenClassification",
    "token_classifier",
    dict(type_vocab_size=1, pad_token_id=1, num_labels=3),
  ),
  (
    "xlm-roberta",
    "XLMRobertaForSequenceClassification",
    "classifier",
    dict(type_vocab_size=1, pad_token_id=1, num_labels=2),
  ),
  ("electra", "ElectraModel", None, dict(embedding_size=24)),
  ("electra", "ElectraForPreTraining", "rtd", dict(embedding_size=24)),
  ("electra", "ElectraForMaskedLM", "mlm", dict(embedding_size=24)),
  (
    "electra",
    "ElectraForSequenceClassification",
    "classifier",
    dict(embedding_size=60, num_labels=3),
  ),
  (
    "electra",
    "ElectraForTokenClassification",
    "token_classifier",
    dict(embedding_size=24, num_labels=4),
  ),
  ("distilbert", "DistilBertModel", None, dict(sinusoidal_pos_embds=True)),
  ("distilbert", "DistilBertForMaskedLM", "mlm", dict(sinusoidal_pos_embds=False)),
  (
    "distilbert",
    "DistilBertForSequenceClassification",
    "classifier",
    dict(sinusoidal_pos_embds=True, num_labels=3),
  ),
  (
    "distilbert",
    "DistilBertForTokenClassification",
    "token_classifier",
    dict(sinusoidal_pos_embds=False, num_labels=4),
  ),
]


def _hf_model(model_type, cls_name, extra, seed=0):
  sizes = DISTIL_SIZES if model_type == "distilbert" else SIZES
  config = transformers.AutoConfig.for_model(model_type, **{**sizes, **extra})
  torch.manual_seed(seed)
  model = getattr(transformers, cls_name)(config)
  model.config._attn_implementation = "eager"
  with torch.no_grad():  # every parameter random, LayerNorms and biases included
    for name, p in model.named_parameters():
      p.normal_(0.0, 0.3 if "LayerNorm" in name or "layer_norm" in name else 0.08)
      if name.endswith(("LayerNorm.weight", "layer_norm.weight")):
        p.add_(1.0)
  model.tie_weights()
  return model.eval()


def _batch(config, left=False, seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, 99, (3, 11)).astype(np.int64)
  mask = np.ones((3, 11), np.int64)
  mask[1, 7:] = 0
  mask[2, 3:] = 0
  if left:
    mask = mask[:, ::-1].copy()
  ids = np.where(mask > 0, ids, config.pad_token_id)
  return ids, mask


def _close(ours, theirs, real, name):
  ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
  assert ours.shape == theirs.shape, (name, ours.shape, theirs.shape)
  diff = np.abs(ours[real] - theirs[real]).max()
  assert diff < ATOL, f"{name}: max abs diff {diff:.3g}"


def _head_outputs(params, config, out, head):
  return {h: bertjax.head_logits(params, config, out, h) for h in head.split("+")}


def _torch_heads(cls_name, hf_out):
  if cls_name.endswith("ForPreTraining") and hasattr(hf_out, "seq_relationship_logits"):
    return {"mlm": hf_out.prediction_logits, "nsp": hf_out.seq_relationship_logits}
  if cls_name == "AlbertForPreTraining":
    return {"mlm": hf_out.prediction_logits, "sop": hf_out.sop_logits}
  if cls_name == "ElectraForPreTraining":
    return {"rtd": hf_out.logits}
  return {
    "mlm"
    if "MaskedLM" in cls_name
    else "token_classifier"
    if "Token" in cls_name
    else "classifier": hf_out.logits
  }


def _compare(tmp_path, model_type, cls_name, head, extra, left=False):
  model = _hf_model(model_type, cls_name, extra)
  model.save_pretrained(tmp_path / "hf")
  config, params = bertjax.from_hf(tmp_path / "hf")
  assert config.model_type == model_type
  ids, mask = _batch(config, left=left)
  kwargs = dict(attention_mask=torch.tensor(mask))
  if config.type_vocab_size > 1:
    types = np.zeros_like(ids)
    types[:, 6:] = 1
    kwargs["token_type_ids"] = torch.tensor(types)
  with torch.no_grad():
    hf_out = model(
      input_ids=torch.tensor(ids), output_hidden_states=True, output_attentions=True, **kwargs
    )
  out = bertjax.forward(
    params,
    config,
    ids,
    mask,
    kwargs.get("token_type_ids"),
    output_hidden_states=True,
    output_attentions=True,
  )
  real = mask.astype(bool)
  states = hf_out.hidden_states
  attentions = hf_out.attentions
  assert len(states) == out.hidden_states.shape[0]
  for i, h in enumerate(states):
    _close(out.hidden_states[i], h.numpy(), real, f"hidden_states[{i}]")
  for i, a in enumerate(attentions):
    _close(
      np.moveaxis(np.asarray(out.attentions[i]), 1, 2),
      np.moveaxis(a.numpy(), 1, 2),
      real,
      f"attentions[{i}]",
    )
  if head is None:
    if getattr(hf_out, "pooler_output", None) is not None:
      np.testing.assert_allclose(out.pooler_output, hf_out.pooler_output.numpy(), atol=ATOL)
    else:
      assert out.pooler_output is None
    return config, params, out, None
  ours = _head_outputs(params, config, out, head)
  theirs = _torch_heads(cls_name, hf_out)
  for name, logits in ours.items():
    expected = theirs[name].numpy()
    _close(
      logits,
      expected,
      real if expected.ndim >= 2 and expected.shape[1] == ids.shape[1] else slice(None),
      f"{name} logits",
    )
  return config, params, out, ours


@pytest.mark.parametrize(
  "model_type, cls_name, head, extra",
  CASES,
  ids=[c[1] + "-" + str(c[3].get("sinusoidal_pos_embds", "")) for c in CASES],
)
def test_family_parity_and_export(tmp_path, model_type, cls_name, head, extra):
  config, params, _out, _logits = _compare(tmp_path, model_type, cls_name, head, extra)
  # Export: transformers loads it with no missing or unexpected keys, same outputs.
  bertjax.to_hf(config, params, tmp_path / "ours")
  _loaded, info = getattr(transformers, cls_name).from_pretrained(
    tmp_path / "ours", output_loading_info=True, attn_implementation="eager"
  )
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  assert not info["mismatched_keys"], info
  config2, params2 = bertjax.from_hf(tmp_path / "ours")
  assert config2 == config
  leaves = lambda p: {
    jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(p)
  }
  a, b = leaves(params), leaves(params2)
  assert a.keys() == b.keys()
  for k in a:
    assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k


def test_roberta_left_and_right_padding(tmp_path):
  extra = dict(type_vocab_size=1, pad_token_id=1)
  _compare(tmp_path / "right", "roberta", "RobertaForMaskedLM", "mlm", extra, left=False)
  config, *_ = _compare(tmp_path / "left", "roberta", "RobertaForMaskedLM", "mlm", extra, left=True)
  # The usable length: max_position_embeddings - pad_token_id - 1.
  assert config.max_length == 40 - 1 - 1
  params = bertjax.init(config, 0)
  bertjax.forward(params, config, np.full((1, 38), 7))
  with pytest.raises(ValueError, match="seq_len=39 must be <= 38"):
    bertjax.forward(params, config, np.full((1, 39), 7))


@pytest.mark.parametrize("model_type", ["bert", "roberta", "electra", "distilbert", "albert"])
def test_scale_head_mask_zero_equals_zeroed_output_slice(model_type):
  """Head mask "scale" with a zero = that head's slice of the output projection zeroed."""
  extra = {
    "roberta": dict(type_vocab_size=1, pad_token_id=1),
    "electra": dict(embedding_size=24),
    "albert": dict(embedding_size=16, num_hidden_groups=3),
    "distilbert": dict(type_vocab_size=0),
  }.get(model_type, {})
  config = bertjax.BertConfig(model_type=model_type, **{**SIZES, **extra})
  params = bertjax.init(config, 1)
  ids, mask = _batch(config)
  head_mask = np.ones((3, 5), np.float32)
  head_mask[1, 3] = 0
  got = bertjax.forward(params, config, ids, mask, head_mask=head_mask).last_hidden_state
  edited = jax.tree.map(np.array, params)
  edited["encoder"]["layers"]["attention"]["output"]["kernel"][1, 3] = 0
  want = bertjax.forward(edited, config, ids, mask).last_hidden_state
  np.testing.assert_allclose(got, want, atol=1e-6)


def test_sharded_export_and_load(tmp_path):
  config = bertjax.BertConfig(model_type="electra", **SIZES, embedding_size=24)
  params = bertjax.init(config, 0, ("rtd",))
  bertjax.to_hf(config, params, tmp_path, max_shard_size="40KB")
  shards = sorted(p.name for p in tmp_path.glob("model-*.safetensors"))
  assert len(shards) > 2 and (tmp_path / "model.safetensors.index.json").exists()
  assert not (tmp_path / "model.safetensors").exists()
  assert oct((tmp_path / shards[0]).stat().st_mode & 0o777) != oct(0o600)
  _model, info = transformers.ElectraForPreTraining.from_pretrained(
    tmp_path, output_loading_info=True
  )
  assert not info["missing_keys"] and not info["unexpected_keys"]
  _config2, params2 = bertjax.from_hf(tmp_path)
  for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
    assert np.array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.slow
def test_hub_id_from_local_cache(tmp_path, monkeypatch):
  """A hub id resolves through a real huggingface_hub cache layout, offline."""
  config = bertjax.BertConfig(model_type="roberta", **SIZES, type_vocab_size=1, pad_token_id=1)
  params = bertjax.init(config, 0, ("mlm",))
  snapshot = tmp_path / "hf_home" / "hub" / "models--bertology--tiny-roberta" / "snapshots"
  commit = "0123456789abcdef0123456789abcdef01234567"
  bertjax.to_hf(config, params, snapshot / commit)
  refs = snapshot.parent / "refs"
  refs.mkdir()
  (refs / "main").write_text(commit)
  import subprocess
  import sys

  code = (
    "import bertjax, sys\n"
    "c, p = bertjax.from_hf('bertology/tiny-roberta')\n"
    "print(c.model_type, sorted(p))\n"
    "try:\n  bertjax.from_hf('bertology/not-cached')\n"
    "except FileNotFoundError as e:\n  print('ERR', e)\n"
  )
  env = dict(__import__("os").environ, HF_HOME=str(tmp_path / "hf_home"), HF_HUB_OFFLINE="1")
  run = subprocess.run(
    [sys.executable, "-c", code],
    capture_output=True,
    text=True,
    env=env,
    timeout=300,
    check=False,
  )
  assert run.returncode == 0, run.stderr
  assert "roberta ['embeddings', 'encoder', 'mlm']" in run.stdout
  err = run.stdout.split("ERR", 1)[1]
  assert "'bertology/not-cached'" in err and str(tmp_path / "hf_home" / "hub") in err


def test_sharded_pytorch_bin_checkpoint_loads(tmp_path):
  """A checkpoint in sharded `pytorch_model-*.bin` files with `pytorch_model.bin.index.json`
  (no safetensors), as older hub models ship it (transformers 5 writes only safetensors, so
  the shards are laid out here with torch.save under transformers 4's names), loads with the
  same outputs."""
  model = _hf_model("roberta", "RobertaForMaskedLM", dict(type_vocab_size=1, pad_token_id=1))
  model.config.save_pretrained(tmp_path)
  state = model.state_dict()
  names = sorted(state)
  shards = [names[i::3] for i in range(3)]
  weight_map = {}
  for i, shard in enumerate(shards, 1):
    file = f"pytorch_model-{i:05d}-of-{len(shards):05d}.bin"
    torch.save({k: state[k].clone() for k in shard}, tmp_path / file)
    weight_map.update(dict.fromkeys(shard, file))
  (tmp_path / "pytorch_model.bin.index.json").write_text(
    json.dumps({"metadata": {}, "weight_map": weight_map})
  )
  config, params = bertjax.from_hf(tmp_path)
  ids, mask = _batch(config)
  out = bertjax.forward(params, config, ids, mask)
  with torch.no_grad():
    want = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
  real = mask.astype(bool)
  _close(bertjax.head_logits(params, config, out, "mlm"), want, real, "mlm logits")


@pytest.mark.parametrize("model_type", ["roberta", "electra", "distilbert"])
def test_fused_kernel_and_sites_on_the_family(model_type):
  """The fused Pallas kernel (interpret mode) gives the XLA path's outputs on every family,
  with a head mask; capture and patch work there too: `out` stacks the hidden states,
  weight 0 is the unpatched run, weight 1 takes the patched value."""
  extra = {
    "roberta": dict(type_vocab_size=1, pad_token_id=1),
    "electra": dict(embedding_size=24),
    "distilbert": dict(sinusoidal_pos_embds=True),
  }[model_type]
  sizes = {**(DISTIL_SIZES if model_type == "distilbert" else SIZES), **extra}
  config = bertjax.BertConfig.from_hf_dict({"model_type": model_type, **sizes})
  params = bertjax.init(config, 0)
  ids, mask = _batch(config)  # right padding, as the fused kernel assumes
  hm = np.ones((config.depth, config.num_attention_heads), np.float32)
  hm[1, 2] = 0.0
  xla = bertjax.forward(
    params, config, ids, mask, head_mask=hm, output_hidden_states=True, capture=("out", "head_out")
  )
  fused = bertjax.forward(params, config.replace(attention_impl="pallas"), ids, mask, head_mask=hm)
  real = mask.astype(bool)
  _close(fused.last_hidden_state, xla.last_hidden_state, real, f"{model_type} pallas")
  np.testing.assert_array_equal(np.asarray(xla.cache["out"]), np.asarray(xla.hidden_states[1:]))
  assert not np.asarray(xla.cache["head_out"][1, :, :, 2]).any()  # the masked head
  value = xla.cache["head_out"] + 1.0
  for w, want in ((0.0, xla.last_hidden_state), (1.0, None)):
    out = bertjax.forward(
      params, config, ids, mask, head_mask=hm, capture=("head_out",), patch={"head_out": (value, w)}
    )
    if want is not None:
      np.testing.assert_array_equal(np.asarray(out.last_hidden_state), np.asarray(want))
    else:
      np.testing.assert_allclose(np.asarray(out.cache["head_out"]), np.asarray(value), atol=1e-6)


def test_a_registered_row_is_a_family(tmp_path, monkeypatch):
  """`families.register`: a row added at run time (CamemBERT, RoBERTa's block under its own
  class names) loads a transformers checkpoint and matches it; duplicates and unknown roles
  or heads are refused by name."""
  import dataclasses

  from bertjax.model import families

  roberta = families.FAMILIES["roberta"]
  rename = lambda name: name.replace("Roberta", "Camembert")
  row = dataclasses.replace(
    roberta,
    model_type="camembert",
    architectures={k: rename(v) for k, v in roberta.architectures.items()},
    no_pooler=frozenset(map(rename, roberta.no_pooler)),
  )
  with pytest.raises(ValueError, match="'camembert' in config.json is not supported"):
    bertjax.BertConfig.from_hf_dict({"model_type": "camembert"})
  monkeypatch.setitem(families.FAMILIES, "camembert", row)  # the row goes again after the test
  del families.FAMILIES["camembert"]
  assert families.register(row) is row
  with pytest.raises(ValueError, match="already a family"):
    families.register(row)
  with pytest.raises(ValueError, match="layer role 'querry'"):
    families.register(dataclasses.replace(row, layer_names={"querry": "q"}), replace=True)
  with pytest.raises(ValueError, match="head 'pooler'"):
    families.register(dataclasses.replace(row, heads={"pooler": None}), replace=True)
  torch.manual_seed(0)
  hf = transformers.CamembertForMaskedLM(
    transformers.CamembertConfig(**{**SIZES, "intermediate_size": 37})
  ).eval()
  hf.save_pretrained(tmp_path)
  config, params = bertjax.from_hf(tmp_path)
  assert config.model_type == "camembert" and "mlm" in params
  ids = np.random.RandomState(0).randint(3, 99, (2, 9))
  mask = np.ones((2, 9), np.int64)
  mask[1, 6:] = 0
  out = bertjax.forward(params, config, ids, mask)
  with torch.no_grad():
    ref = hf(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
  got = np.asarray(bertjax.head_logits(params, config, out, "mlm"))
  np.testing.assert_allclose(got[mask == 1], ref[mask == 1], atol=ATOL)
