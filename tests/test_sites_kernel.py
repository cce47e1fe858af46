"""Sites through the fused Pallas kernel equal the map path (XLA attention).

Every site but `probs` is computed with `attention_impl="pallas"` (the kernel in interpret
mode on the CPU; compiled on a GPU, where it runs here as its own case) and compared with
the same capture, patch and patch-weight gradient on the map path, on a random BERT with
padded rows. On a GPU the XLA side's float32 dots run at full precision (XLA's default
there is TF32), as the kernel's do.
"""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax

FUSED_SITES = tuple(s for s in bertjax.model_sites(bertjax.BertConfig()) if s != "probs")


def _model():
  config = bertjax.BertConfig(
    vocab_size=500,
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=256,
    max_position_embeddings=64,
  )
  params = bertjax.init(config, 0)
  rng = np.random.default_rng(0)
  ids = rng.integers(5, config.vocab_size, (2, 3, 64)).astype(np.int32)  # runs A and B
  mask = np.ones((3, 64), np.int32)
  mask[1, 40:] = 0
  mask[2, 9:] = 0
  return config, params, ids, mask


def _precision():
  return (
    jax.default_matmul_precision("float32")
    if jax.default_backend() == "gpu"
    else contextlib.nullcontext()
  )


def _sites_patch_and_gradient(config, params, ids, mask):
  """(captured sites of run A, A's output with 2 heads' head_out and `mid` patched from B,
  d sum(probe . output) / d the patch weights)."""
  value = bertjax.forward(params, config, ids[1], mask, capture=("head_out", "mid")).cache
  probe = jax.random.normal(jax.random.key(3), (*ids[0].shape, config.hidden_size))

  def run(w_heads, w_mid):
    out = bertjax.forward(
      params,
      config,
      ids[0],
      mask,
      capture=FUSED_SITES,
      patch={
        "head_out": (value["head_out"], w_heads[:, None, None, :, None]),
        "mid": (value["mid"], w_mid[:, None, None, None]),
      },
    )
    return jnp.sum(out.last_hidden_state * probe), out

  w_heads = jnp.asarray([[0.0, 0.7], [0.4, 0.0]], jnp.float32)
  w_mid = jnp.asarray([0.0, 0.3], jnp.float32)
  plain = bertjax.forward(params, config, ids[0], mask, capture=FUSED_SITES)
  grads, patched = jax.jit(jax.grad(run, argnums=(0, 1), has_aux=True))(w_heads, w_mid)
  return plain.cache, patched.last_hidden_state, grads


@pytest.mark.parametrize(
  "where",
  [
    "here",
    pytest.param(
      "gpu",
      marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU (compiled kernels)"),
      ],
    ),
  ],
)
def test_sites_patches_and_gradients_through_the_kernel_equal_the_map_path(where):
  config, params, ids, mask = _model()
  real = mask.astype(bool)
  with _precision():
    xla = _sites_patch_and_gradient(config, params, ids, mask)
    fused = _sites_patch_and_gradient(config.replace(attention_impl="pallas"), params, ids, mask)
  (sites_x, out_x, grads_x), (sites_f, out_f, grads_f) = xla, fused
  fused_config = config.replace(attention_impl="pallas")
  program = jax.make_jaxpr(lambda p: _sites_patch_and_gradient(fused_config, p, ids, mask))
  assert "pallas_call" in str(program(params))  # the fused path ran the kernel
  assert set(sites_f) == set(FUSED_SITES)
  for site in FUSED_SITES:
    x, f = np.asarray(sites_x[site]), np.asarray(sites_f[site])
    assert x.shape == f.shape, site
    at_real = (lambda a: a[real]) if site == "embeddings" else (lambda a: a[:, real])
    np.testing.assert_allclose(at_real(f), at_real(x), atol=2e-5, rtol=1e-5, err_msg=site)
  out_x, out_f = np.asarray(out_x), np.asarray(out_f)
  plain = np.asarray(sites_x["out"][-1])
  assert np.abs(out_x[real] - plain[real]).max() > 1e-2  # the patch changes the output
  np.testing.assert_allclose(out_f[real], out_x[real], atol=2e-5, rtol=1e-5)
  for g_x, g_f in zip(grads_x, grads_f):
    g_x, g_f = np.asarray(g_x), np.asarray(g_f)
    assert np.abs(g_x).max() > 1e-3
    np.testing.assert_allclose(g_f, g_x, rtol=1e-4, atol=1e-4 * np.abs(g_x).max())
