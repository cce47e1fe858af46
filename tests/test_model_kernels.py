"""The whole model on the fused Pallas kernel (interpret mode on CPU) vs the reference path."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax


@pytest.fixture(scope="module")
def minilm(minilm_dir):
  config, params = bertjax.from_hf(minilm_dir)
  tok = bertjax.Tokenizer.from_pretrained(minilm_dir)
  batch = tok.encode(
    [
      "The keys to the cabinet are on the table.",
      "Why is the sky blue, and the grass so green?",
      "No.",
    ],
    ["Yes, they are.", "Because of scattering.", "Fine."],
  )
  return config, params, tok, batch


def test_pallas_model_matches_xla_on_minilm(minilm):
  config, params, _, b = minilm
  rng = np.random.default_rng(0)
  xi = rng.uniform(0.2, 1.0, (config.depth, config.num_attention_heads)).astype(np.float32)
  m = b.attention_mask.astype(bool)
  for ablation in ("scale", "uniform"):
    run = lambda impl, ablation=ablation: (
      bertjax.forward(
        params,
        config.replace(attention_impl=impl),
        b.input_ids,
        b.attention_mask,
        b.token_type_ids,
        head_mask=xi,
        head_ablation=ablation,
      ).last_hidden_state
    )
    xla, pallas = np.asarray(run("xla")), np.asarray(run("pallas"))
    assert np.abs(xla[m] - pallas[m]).max() < 1e-4
    assert np.isfinite(pallas).all()


def test_pallas_model_gradients_match_xla(minilm):
  """Training and head importance run on the fused kernel's backward pass."""
  config, params, _, b = minilm
  weight = jnp.asarray(b.attention_mask, jnp.float32)[..., None]

  def loss(p, xi, impl):
    out = bertjax.forward(
      p,
      config.replace(attention_impl=impl),
      b.input_ids,
      b.attention_mask,
      b.token_type_ids,
      head_mask=xi,
    )
    return jnp.sum(jnp.tanh(out.last_hidden_state) * weight)

  xi = jnp.ones((config.depth, config.num_attention_heads))
  grad = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)
  (gp_x, gxi_x), (gp_p, gxi_p) = grad(params, xi, "xla"), grad(params, xi, "pallas")
  rel = lambda a, b: float(jnp.linalg.norm(a - b) / jnp.linalg.norm(a))
  assert rel(gxi_x, gxi_p) < 1e-4
  q_x = gp_x["encoder"]["layers"]["attention"]["query"]["kernel"]
  q_p = gp_p["encoder"]["layers"]["attention"]["query"]["kernel"]
  assert rel(q_x, q_p) < 1e-4


@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_attention_statistics_match_maps(minilm, impl):
  config, params, tok, b = minilm
  sep = b.input_ids == tok.sep_id
  stats = bertjax.attention_statistics(
    params,
    config.replace(attention_impl=impl),
    b.input_ids,
    b.attention_mask,
    b.token_type_ids,
    special_mask=sep,
  )
  maps = np.asarray(
    bertjax.forward(
      params, config, b.input_ids, b.attention_mask, b.token_type_ids, output_attentions=True
    ).attentions
  )
  m = b.attention_mask.astype(bool)
  t = np.arange(m.shape[1])
  mean_over_queries = lambda x: (x * m[None, :, None, :]).sum(-1) / m.sum(-1)[None, :, None]
  expected = {
    "entropy": -(maps * np.log(np.where(maps > 0, maps, 1))).sum(-1),
    "first": maps[..., 0],
    "special": (maps * sep[None, :, None, None, :]).sum(-1),
    "self": maps[..., t, t],
    "prev": np.pad(maps[..., t[1:], t[:-1]], [(0, 0)] * 3 + [(1, 0)]),
    "next": np.pad(maps[..., t[:-1], t[1:]], [(0, 0)] * 3 + [(0, 1)]),
  }
  assert set(stats) == set(expected)
  for name, value in expected.items():
    np.testing.assert_allclose(
      np.asarray(stats[name]), mean_over_queries(value), atol=2e-6, err_msg=name
    )
  assert float(np.asarray(stats["special"]).max()) > 0.2  # some heads attend to [SEP]
