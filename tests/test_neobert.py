"""NeoBERT (`neobert`) against its released code's computation, restated in PyTorch
(`tests/reference_neobert.py`: transformers has no NeoBERT, and the released file needs
xformers).

Odd sizes (5 heads of 12, a SwiGLU of int(2 * 40 / 3) rounded up to 32), every parameter
random (norms around 1), right- and left-padded batches: every block's output, every attention
map, the final states and each head's logits within 1e-4; `to_hf` output loads into the
reference strictly with the same outputs and reads back bitwise; the sites equal the same
quantities read with hooks (q and k after the reference's complex-number rotation); the
interleaved rotary layout is checked on its own against complex multiplication.
"""

import json

import jax
import numpy as np
import pytest

import bertjax
from bertjax.model.layers import rotate

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
import reference_neobert as ref

ATOL = 1e-4
SIZES = dict(
  hidden_size=60,
  num_hidden_layers=3,
  num_attention_heads=5,
  intermediate_size=40,
  vocab_size=99,
  max_length=64,
  norm_eps=1e-5,
  num_labels=3,
)
CLASSES = {
  "NeoBERT": None,
  "NeoBERTLMHead": "mlm",
  "NeoBERTForSequenceClassification": "classifier",
}


def _reference(cls: str, seed: int = 0):
  torch.manual_seed(seed)
  model = ref.CLASSES[cls](ref.NeoBERTConfig(**SIZES))
  with torch.no_grad():
    for name, p in model.named_parameters():
      norm = "norm" in name
      p.normal_(0.0, 0.3 if norm else 0.08)
      if norm:
        p.add_(1.0)
  return model.eval()


def _save(model, cls, directory):
  directory.mkdir(parents=True, exist_ok=True)
  safetensors_torch.save_file(
    {k: v.contiguous() for k, v in model.state_dict().items()}, directory / "model.safetensors"
  )
  hf = ref.config_json(model.config if cls == "NeoBERT" else model.model.config, cls)
  (directory / "config.json").write_text(json.dumps(hf))


def _batch(left=False):
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 99, (3, 11))
  mask = np.ones((3, 11), np.int64)
  mask[1, 7:] = 0
  mask[2, 3:] = 0
  if left:
    mask = mask[:, ::-1].copy()
  return np.where(mask > 0, ids, 0), mask


def _run(model, ids, mask):
  with torch.no_grad():
    return model(torch.tensor(ids), torch.tensor(mask), output_attentions=True)


def _close(ours, theirs, name):
  diff = np.abs(np.asarray(ours, np.float64) - np.asarray(theirs, np.float64)).max()
  assert diff < ATOL, f"{name}: max abs diff {diff:.3g}"


def _compare(model, config, params, head, left=False):
  ids, mask = _batch(left)
  theirs = _run(model, ids, mask)
  out = bertjax.forward(
    params, config, ids, mask, output_hidden_states=True, output_attentions=True
  )
  real = mask.astype(bool)
  # The reference's hidden states are the blocks' outputs, before the final norm; bertjax's
  # last one is after it, as transformers' pre-LN encoders give it (the last block's own
  # output is the `out` site, in the hooks test).
  for i, h in enumerate(theirs["hidden_states"][:-1]):
    _close(np.asarray(out.hidden_states[i + 1])[real], h.numpy()[real], f"block {i}")
  _close(np.asarray(out.last_hidden_state)[real], theirs["last_hidden_state"].numpy()[real], "last")
  for i, a in enumerate(theirs["attentions"]):
    ours = np.asarray(out.attentions[i]).transpose(0, 2, 1, 3)[real]
    _close(ours, a.numpy().transpose(0, 2, 1, 3)[real], f"attentions[{i}]")
  if head == "mlm":
    logits = bertjax.head_logits(params, config, out, "mlm")
    _close(np.asarray(logits)[real], theirs["logits"].numpy()[real], "mlm")
  elif head == "classifier":
    logits = np.asarray(bertjax.head_logits(params, config, out, "classifier"))
    first = real[:, 0]  # a left-padded row's first position is padding
    _close(logits[first], theirs["logits"].numpy()[first], "classifier")
  return ids, mask, theirs


@pytest.mark.parametrize("cls", list(CLASSES))
def test_neobert_matches_its_released_computation(tmp_path, cls):
  model = _reference(cls)
  _save(model, cls, tmp_path / "ref")
  config, params = bertjax.from_hf(tmp_path / "ref")
  assert config.model_type == "neobert" and config.ffn_size == 32
  head = CLASSES[cls]
  ids, mask, theirs = _compare(model, config, params, head)
  _compare(model, config, params, head, left=True)
  # to_hf: the reference loads it strictly, with the same outputs; it reads back bitwise.
  bertjax.to_hf(config, params, tmp_path / "out")
  saved = json.loads((tmp_path / "out" / "config.json").read_text())
  assert saved["architectures"] == [cls] and "rope_parameters" not in saved
  again = ref.CLASSES[cls](ref.NeoBERTConfig(**SIZES)).eval()
  state = safetensors_torch.load_file(tmp_path / "out" / "model.safetensors")
  again.load_state_dict(state, strict=True)
  key = "logits" if head else "last_hidden_state"
  np.testing.assert_array_equal(_run(again, ids, mask)[key].numpy(), theirs[key].numpy())
  config2, params2 = bertjax.from_hf(tmp_path / "out")
  assert jax.tree.structure(params2) == jax.tree.structure(params)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert config2.replace(use_pooler=config.use_pooler) == config


def test_interleaved_rotary_is_the_complex_product():
  """ "pairs": dimensions (2i, 2i + 1) as one complex number times exp(i t f_i)."""
  rng = np.random.default_rng(1)
  x = rng.standard_normal((2, 7, 3, 8)).astype(np.float32)
  inv_freq = (1.0 / 10000 ** (np.arange(0, 8, 2) / 8)).astype(np.float32)
  got = np.asarray(rotate(x, inv_freq, np.arange(7), "pairs"))
  z = (x[..., 0::2] + 1j * x[..., 1::2]) * np.exp(1j * np.arange(7)[:, None, None] * inv_freq)
  want = np.stack([z.real, z.imag], -1).reshape(x.shape)
  np.testing.assert_allclose(got, want, atol=2e-6)
  halves = np.asarray(rotate(x, inv_freq, np.arange(7)))
  assert np.abs(halves - want).max() > 0.1  # the two layouts differ


def test_sites_equal_the_reference_read_with_hooks(tmp_path):
  model = _reference("NeoBERT")
  _save(model, "NeoBERT", tmp_path)
  config, params = bertjax.from_hf(tmp_path)
  ids, mask = _batch()
  got, hooks = {}, []

  def record(site):  # "<": the module's input; a block returns (output, maps)
    def hook(module, inputs, output):
      value = inputs[0] if site.endswith("<") else output
      got.setdefault(site.rstrip("<"), []).append(value[0] if isinstance(value, tuple) else value)

    return hook

  for block in model.transformer_encoder:
    for site, module in (
      ("attn_in", block.attention_norm),
      ("qkv", block.qkv),
      ("head_out<", block.wo),
      ("attn_out", block.wo),
      ("ffn_in", block.ffn_norm),
      ("ffn_act<", block.ffn.w3),
      ("ffn_out", block.ffn.w3),
      ("out", block),
    ):
      hooks.append(module.register_forward_hook(record(site)))
  try:
    _run(model, ids, mask)
  finally:
    for h in hooks:
      h.remove()
  theirs = {k: np.stack([t.detach().numpy() for t in v]) for k, v in got.items()}
  n, d = config.num_attention_heads, config.head_dim
  qkv = torch.tensor(theirs.pop("qkv")).view(config.depth, *ids.shape, n, 3 * d)
  rotation = ref._rotation(d, ids.shape[1])
  q, k, v = qkv.chunk(3, dim=-1)
  theirs["q"] = np.stack([ref._rotate(q[i], rotation).numpy() for i in range(config.depth)])
  theirs["k"] = np.stack([ref._rotate(k[i], rotation).numpy() for i in range(config.depth)])
  theirs["v"] = v.numpy()
  theirs["head_out"] = theirs["head_out"].reshape(config.depth, *ids.shape, n, d)
  out = bertjax.forward(params, config, ids, mask, capture=tuple(theirs))
  real = mask.astype(bool)
  for site, want in theirs.items():
    ours = np.asarray(out.cache[site])
    assert ours.shape == want.shape, (site, ours.shape, want.shape)
    _close(ours[:, real], want[:, real], site)


def test_fixed_theta_and_unknown_keys_are_refused():
  hf = ref.config_json(ref.NeoBERTConfig(**SIZES), "NeoBERT")
  config = bertjax.BertConfig.from_hf_dict(hf)
  assert (config.rope_theta, config.layer_norm_eps, config.max_length) == (10000.0, 1e-5, 64)
  with pytest.raises(ValueError, match=r"does not know: \['rope_theta'\]"):
    bertjax.BertConfig.from_hf_dict(dict(hf, rope_theta=5000.0))  # its code fixes 10000
  with pytest.raises(ValueError, match="rope_theta=5000.0 has no Hugging Face equivalent"):
    config.replace(rope_theta=5000.0).to_hf_dict()
  with pytest.raises(ValueError, match=r"\['ngpt'\]"):  # the training code's nGPT variant
    bertjax.BertConfig.from_hf_dict(dict(hf, ngpt=True))
