"""Parity with Hugging Face `transformers` (PyTorch, CPU, float32): real and random weights."""

import json

import numpy as np
import pytest

import bertjax

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.hf

ATOL = 1e-4


def _batch(vocab_size, batch=3, seq=11, seed=0):
  """Random ids with padding and two segments (never all zeros)."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, vocab_size, (batch, seq)).astype(np.int32)
  mask = np.ones((batch, seq), np.int32)
  mask[1, 7:] = 0
  mask[2, 3:] = 0
  types = np.zeros((batch, seq), np.int32)
  types[:, seq // 2 :] = 1
  types *= mask
  return ids, mask, types


def _torch_outputs(model, ids, mask, types):
  with torch.no_grad():
    return model(
      input_ids=torch.tensor(ids).long(),
      attention_mask=torch.tensor(mask).long(),
      token_type_ids=torch.tensor(types).long(),
      output_hidden_states=True,
      output_attentions=True,
    )


def _assert_close(ours, theirs, mask, name):
  """Compares at real tokens (padded query rows are defined as zero attention here)."""
  ours, theirs = np.asarray(ours), np.asarray(theirs)
  assert ours.shape == theirs.shape, (name, ours.shape, theirs.shape)
  m = mask.astype(bool)
  diff = np.abs(ours[m] - theirs[m]).max()
  assert diff < ATOL, f"{name}: max abs diff {diff:.3g}"
  return diff


def _assert_states_close(out, hf_out, mask):
  assert out.hidden_states.shape[0] == len(hf_out.hidden_states)
  for i, h in enumerate(hf_out.hidden_states):
    _assert_close(out.hidden_states[i], h.numpy(), mask, f"hidden_states[{i}]")
  if hf_out.attentions:
    assert out.attentions.shape[0] == len(hf_out.attentions)
    for i, a in enumerate(hf_out.attentions):
      # (B, N, Tq, Tk): compare real query rows of every head.
      ours = np.moveaxis(np.asarray(out.attentions[i]), 1, 2)
      _assert_close(ours, np.moveaxis(a.numpy(), 1, 2), mask, f"attentions[{i}]")


def test_minilm_real_weights_parity(minilm_dir):
  config, params = bertjax.from_hf(minilm_dir)
  tok = bertjax.Tokenizer.from_pretrained(minilm_dir)
  batch = tok.encode(
    [
      "The keys to the cabinet are on the table.",
      "Why?",
      "Colorless green ideas sleep furiously, don't they?",
    ],
    ["It was not there yesterday.", "Because the sky is blue.", "No."],
  )
  model = transformers.BertModel.from_pretrained(str(minilm_dir), attn_implementation="eager")
  hf_out = _torch_outputs(model.eval(), batch.input_ids, batch.attention_mask, batch.token_type_ids)
  out = bertjax.forward(
    params,
    config,
    batch.input_ids,
    batch.attention_mask,
    batch.token_type_ids,
    output_hidden_states=True,
    output_attentions=True,
  )
  assert (batch.attention_mask == 0).any() and (batch.token_type_ids == 1).any()
  _assert_states_close(out, hf_out, batch.attention_mask)
  diff = _assert_close(
    out.last_hidden_state,
    hf_out.last_hidden_state.numpy(),
    batch.attention_mask,
    "last_hidden_state",
  )
  assert diff < 1e-5
  np.testing.assert_allclose(out.pooler_output, hf_out.pooler_output.numpy(), atol=ATOL)


def _bert_config(**kw):
  # Odd sizes: 3 layers, 5 heads of 12.
  return transformers.BertConfig(
    vocab_size=97,
    hidden_size=60,
    num_hidden_layers=3,
    num_attention_heads=5,
    intermediate_size=37,
    max_position_embeddings=32,
    num_labels=3,
    **kw,
  )


def _albert_config(**kw):
  return transformers.AlbertConfig(
    vocab_size=97,
    embedding_size=24,
    hidden_size=60,
    num_hidden_layers=3,
    num_attention_heads=5,
    intermediate_size=37,
    num_hidden_groups=2,
    inner_group_num=2,
    max_position_embeddings=32,
    num_labels=3,
    **kw,
  )


# (HF class, config factory, how to compute our logits, name of HF's logits field)
CASES = {
  "BertModel": (_bert_config, None, None),
  "BertForMaskedLM": (_bert_config, "mlm", "logits"),
  "BertForPreTraining": (_bert_config, "mlm+nsp", "prediction_logits"),
  "BertForSequenceClassification": (_bert_config, "classifier", "logits"),
  "BertForTokenClassification": (_bert_config, "token_classifier", "logits"),
  "AlbertModel": (_albert_config, None, None),
  "AlbertForMaskedLM": (_albert_config, "mlm", "logits"),
  "AlbertForPreTraining": (_albert_config, "mlm+sop", "prediction_logits"),
  "AlbertForSequenceClassification": (_albert_config, "classifier", "logits"),
}


def _hf_model(name, act):
  make_config, _, _ = CASES[name]
  torch.manual_seed(sum(map(ord, name)))
  model = getattr(transformers, name)(make_config(hidden_act=act, attn_implementation="eager"))
  # Non-trivial LayerNorm and bias values, so a swapped or dropped one cannot pass.
  with torch.no_grad():
    for pname, p in model.named_parameters():
      if pname.endswith("bias") or "LayerNorm" in pname or "layer_norm" in pname:
        p.add_(0.1 * torch.randn_like(p))
  return model.eval()


@pytest.mark.parametrize("name", list(CASES))
def test_random_weights_parity(name, tmp_path):
  act = "gelu_new" if name.startswith("Albert") else "gelu"
  model = _hf_model(name, act)
  model.save_pretrained(tmp_path)
  config, params = bertjax.from_hf(tmp_path)
  ids, mask, types = _batch(config.vocab_size)
  hf_out = _torch_outputs(model, ids, mask, types)
  out = bertjax.forward(
    params, config, ids, mask, types, output_hidden_states=True, output_attentions=True
  )
  _assert_states_close(out, hf_out, mask)
  _, head, field = CASES[name]
  if head is None:
    return
  if head.startswith("mlm"):
    logits = bertjax.mlm_logits(params, config, out.last_hidden_state)
    _assert_close(logits, getattr(hf_out, field).numpy(), mask, "mlm logits")
    if head == "mlm+nsp":
      np.testing.assert_allclose(
        bertjax.nsp_logits(params, config, out.pooler_output),
        hf_out.seq_relationship_logits.numpy(),
        atol=ATOL,
      )
    if head == "mlm+sop":
      np.testing.assert_allclose(
        bertjax.sop_logits(params, config, out.pooler_output), hf_out.sop_logits.numpy(), atol=ATOL
      )
  elif head == "classifier":
    np.testing.assert_allclose(
      bertjax.classify(params, config, out.pooler_output), hf_out.logits.numpy(), atol=ATOL
    )
  else:
    logits = bertjax.token_classify(params, config, out.last_hidden_state)
    _assert_close(logits, hf_out.logits.numpy(), mask, "token logits")


@pytest.mark.parametrize(
  "name",
  ["BertForPreTraining", "AlbertForPreTraining", "BertForTokenClassification", "AlbertModel"],
)
def test_round_trip(name, tmp_path):
  """from_hf -> to_hf loads strictly in transformers with equal outputs; and is bitwise stable."""
  model = _hf_model(name, "gelu")
  model.save_pretrained(tmp_path / "orig")
  config, params = bertjax.from_hf(tmp_path / "orig")
  bertjax.to_hf(config, params, tmp_path / "ours")
  hf_config = json.loads((tmp_path / "ours" / "config.json").read_text())
  assert hf_config["architectures"] == [name]
  reloaded, info = getattr(transformers, name).from_pretrained(
    tmp_path / "ours", output_loading_info=True, attn_implementation="eager"
  )
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  assert not info["mismatched_keys"], info
  ids, mask, types = _batch(config.vocab_size, seed=1)
  a, b = _torch_outputs(model, ids, mask, types), _torch_outputs(reloaded.eval(), ids, mask, types)
  for x, y in zip(a.hidden_states, b.hidden_states):
    np.testing.assert_array_equal(x.numpy(), y.numpy())
  config2, params2 = bertjax.from_hf(tmp_path / "ours")
  assert config2 == config
  import jax

  for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert jax.tree.structure(params) == jax.tree.structure(params2)


def test_init_to_hf_loads_in_transformers(tmp_path):
  """A model initialised here (not converted) exports to a loadable checkpoint."""
  config = bertjax.BertConfig.preset("tiny", num_labels=4)
  params = bertjax.init(config, 3, heads=("classifier",))
  bertjax.to_hf(config, params, tmp_path)
  model, info = transformers.BertForSequenceClassification.from_pretrained(
    tmp_path, output_loading_info=True, attn_implementation="eager"
  )
  assert not any(info.values()), info
  ids, mask, types = _batch(config.vocab_size)
  with torch.no_grad():
    hf_logits = model.eval()(
      input_ids=torch.tensor(ids).long(),
      attention_mask=torch.tensor(mask).long(),
      token_type_ids=torch.tensor(types).long(),
    ).logits.numpy()
  out = bertjax.forward(params, config, ids, mask, types)
  np.testing.assert_allclose(
    bertjax.classify(params, config, out.pooler_output), hf_logits, atol=ATOL
  )


def test_old_names_no_prefix_and_pytorch_bin(tmp_path):
  """gamma/beta LayerNorm names, no `bert.` prefix, pytorch_model.bin, tied decoder absent."""
  model = _hf_model("BertForMaskedLM", "gelu")
  state = {}
  for k, v in model.state_dict().items():
    if k == "cls.predictions.decoder.weight":
      continue  # tied: old files often omit it
    k = k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
    state[k] = v.clone()
  torch.save(state, tmp_path / "pytorch_model.bin")
  model.config.to_json_file(tmp_path / "config.json")
  config, params = bertjax.from_hf(tmp_path)
  ids, mask, types = _batch(config.vocab_size)
  hf_out = _torch_outputs(model, ids, mask, types)
  out = bertjax.forward(params, config, ids, mask, types)
  _assert_close(
    bertjax.mlm_logits(params, config, out.last_hidden_state),
    hf_out.logits.numpy(),
    mask,
    "mlm logits",
  )

  # A bare BertModel state dict without the "bert." prefix.
  base = _hf_model("BertModel", "gelu")
  (tmp_path / "bare").mkdir()
  torch.save(base.state_dict(), tmp_path / "bare" / "pytorch_model.bin")
  base.config.to_json_file(tmp_path / "bare" / "config.json")
  config, params = bertjax.from_hf(tmp_path / "bare")
  hf_out = _torch_outputs(base, ids, mask, types)
  out = bertjax.forward(params, config, ids, mask, types)
  _assert_close(out.last_hidden_state, hf_out.last_hidden_state.numpy(), mask, "bare")
