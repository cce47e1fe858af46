"""Direct logit attribution with frozen LayerNorms (`analysis.dla`), against a float64 NumPy
decomposition that carries every component forward through the LayerNorms."""

import jax
import numpy as np
import pytest

import bertjax
from bertjax.analysis.attribution import dla

SIZES = dict(
  vocab_size=90,
  hidden_size=30,
  num_hidden_layers=3,
  num_attention_heads=5,
  intermediate_size=37,
  max_position_embeddings=40,
)


def _model(model_type, **extra):
  config = bertjax.BertConfig.for_family(model_type, **{**SIZES, **extra})
  params = bertjax.init(config, 1)
  # Larger weights and non-trivial norms, so every term matters.
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(2), len(leaves))
  leaves = [a + 0.1 * jax.random.normal(k, a.shape) for a, k in zip(leaves, keys)]
  return config, jax.tree.unflatten(tree, leaves)


def _batch(config):
  rng = np.random.default_rng(0)
  ids = rng.integers(5, config.vocab_size, (2, 11)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[1, 7:] = 0
  return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def numpy_decomposition(params, config, batch):
  """Every component's carried contribution to h_L, (n, B, T, H) float64, in the order
  embeddings, then per layer: heads 0..N-1, FFN; and the carried biases summed, (B, T, H)."""
  x = np.asarray(
    bertjax.embed(params, config, batch["input_ids"], batch["token_type_ids"]), np.float64
  )
  run = bertjax.run_layers(
    params,
    config,
    bertjax.embed(params, config, batch["input_ids"], batch["token_type_ids"]),
    batch["attention_mask"],
    capture=("head_out", "ffn_out", "resid_mid", "resid_out"),
  )
  c = {k: np.asarray(v, np.float64) for k, v in run.cache.items()}
  lay = jax.tree.map(lambda a: np.asarray(a, np.float64), params["encoder"]["layers"])
  idx = config.layer_param_index
  eps = config.layer_norm_eps

  def ln(v, resid, scale):  # frozen sigma of `resid`, no bias
    r = resid - resid.mean(-1, keepdims=True)
    sigma = np.sqrt((r * r).mean(-1, keepdims=True) + eps)
    return scale * (v - v.mean(-1, keepdims=True)) / sigma

  parts, bias = [x], np.zeros_like(x)
  for layer in range(config.depth):
    p = jax.tree.map(lambda a, i=idx[layer]: a[i], lay)
    heads = np.einsum("btnd,ndh->nbth", c["head_out"][layer], p["attention"]["output"]["kernel"])
    parts += list(heads)
    bias = bias + p["attention"]["output"]["bias"]
    parts = [ln(v, c["resid_mid"][layer], p["attention"]["LayerNorm"]["scale"]) for v in parts]
    bias = (
      ln(bias, c["resid_mid"][layer], p["attention"]["LayerNorm"]["scale"])
      + p["attention"]["LayerNorm"]["bias"]
    )
    parts.append(c["ffn_out"][layer])
    parts = [ln(v, c["resid_out"][layer], p["LayerNorm"]["scale"]) for v in parts]
    bias = ln(bias, c["resid_out"][layer], p["LayerNorm"]["scale"]) + p["LayerNorm"]["bias"]
  return np.stack(parts), bias, np.asarray(run.last, np.float64)


@pytest.mark.parametrize("model_type", ["bert", "albert", "mpnet", "deberta-v2"])
def test_dla_equals_the_numpy_decomposition_and_sums_to_the_readout(model_type):
  extra = dict(num_hidden_groups=1) if model_type == "albert" else {}
  config, params = _model(model_type, **extra)
  batch = _batch(config)
  parts, bias, last = numpy_decomposition(params, config, batch)
  np.testing.assert_allclose(parts.sum(0) + bias, last, atol=2e-4)  # the decomposition is exact
  d = np.random.default_rng(3).normal(size=config.hidden_size)
  positions = np.array([[0, 3, 6], [1, 2, 6]])
  got = dla.direct_logit_attribution(params, config, batch, d, positions=positions)
  at = (
    lambda a: np.take_along_axis(  # (..., B, T, H) -> (..., B, P, H)
      a, np.broadcast_to(positions[..., None], a.shape[:-3] + positions.shape + (1,)), -2
    )
  )
  want = at(parts) @ d  # (n, B, P)
  n, depth = config.num_attention_heads, config.depth
  per_layer = want[1:].reshape(depth, n + 1, *want.shape[1:])
  np.testing.assert_allclose(got.embeddings, want[0], rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(got.heads, per_layer[:, :n], rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(got.ffn, per_layer[:, n], rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(got.bias, at(bias) @ d, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(got.total, at(last) @ d, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got.parts_sum(), got.total, rtol=1e-4, atol=1e-4)


def test_dla_reads_every_position_and_a_direction_per_position():
  config, params = _model("bert")
  batch = _batch(config)
  d = np.random.default_rng(4).normal(size=(2, 11, config.hidden_size))
  got = dla.direct_logit_attribution(params, config, batch, d)
  assert got.heads.shape == (3, 5, 2, 11)
  _, _, last = numpy_decomposition(params, config, batch)
  np.testing.assert_allclose(got.total, (last * d).sum(-1), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got.parts_sum(), got.total, rtol=1e-4, atol=1e-4)


def test_dla_refuses_by_name():
  config, params = _model("modernbert")
  with pytest.raises(ValueError, match="a modernbert block is pre-norm"):
    dla.direct_logit_attribution(params, config, _batch(config), np.ones(30))
  config, params = _model("bert")
  with pytest.raises(ValueError, match="direction shape"):
    dla.direct_logit_attribution(params, config, _batch(config), np.ones(7))
  with pytest.raises(ValueError, match="positions must be in"):
    dla.direct_logit_attribution(
      params, config, _batch(config), np.ones(30), positions=np.array([[0], [11]])
    )
