"""Attention dropout in the model: the fused kernel runs it (no silent fallback to maps)."""

import jax
import numpy as np
import pytest

import bertjax


def _setup(impl):
  config = bertjax.BertConfig.preset(
    "tiny", attention_impl=impl, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.2
  )
  params = bertjax.init(config, 0)
  rng = np.random.default_rng(0)
  ids = rng.integers(5, config.vocab_size, (2, 16)).astype(np.int32)
  mask = np.ones((2, 16), np.int32)
  mask[1, 11:] = 0
  return config, params, ids, mask


def test_training_forward_with_pallas_runs_the_kernel_and_matches_xla():
  config, params, ids, mask = _setup("pallas")
  key = jax.random.key(4)
  run = lambda p, c: (
    bertjax.forward(p, c, ids, mask, deterministic=False, rng=key).last_hidden_state
  )
  jaxpr = str(jax.make_jaxpr(lambda p: run(p, config))(params))
  assert "pallas_call" in jaxpr
  fused = run(params, config)
  xla = run(params, config.replace(attention_impl="xla"))
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(fused)[real], np.asarray(xla)[real], atol=2e-5)
  # Dropout really acts, and gradients flow through the kernel.
  clean = bertjax.forward(params, config, ids, mask).last_hidden_state
  assert np.abs(np.asarray(fused - clean)[real]).max() > 1e-3
  loss = lambda p, c: (run(p, c)[real] ** 2).sum()
  g_fused = jax.grad(loss)(params, config)
  g_xla = jax.grad(loss)(params, config.replace(attention_impl="xla"))
  for a, b in zip(jax.tree.leaves(g_fused), jax.tree.leaves(g_xla)):
    np.testing.assert_allclose(a, b, atol=2e-4, rtol=1e-3)


def test_different_keys_give_different_masks():
  config, params, ids, mask = _setup("xla")
  run = lambda k: (
    bertjax.forward(
      params, config, ids, mask, deterministic=False, rng=jax.random.key(k)
    ).last_hidden_state
  )
  assert np.array_equal(np.asarray(run(1)), np.asarray(run(1)))
  assert not np.array_equal(np.asarray(run(1)), np.asarray(run(2)))


def test_unhonourable_combination_is_an_error():
  config, params, ids, mask = _setup("xla")
  with pytest.raises(ValueError, match="cudnn"):
    bertjax.forward(
      params,
      config.replace(attention_impl="cudnn"),
      ids,
      mask,
      deterministic=False,
      rng=jax.random.key(0),
    )
