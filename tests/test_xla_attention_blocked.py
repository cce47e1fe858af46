"""The CPU inference path that computes attention scores in cache-sized blocks of heads.

`kernels.xla_attention` switches to it when the scores would exceed
`_WHOLE_MAX_BYTES`; here the threshold is lowered so small inputs take it, and every
masking case is compared with the reference and with the whole-tensor path.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import kernels
from bertjax.kernels import reference, xla_attention


def _inputs(batch=3, seq=24, heads=6, dim=16, seed=0):
  rng = np.random.default_rng(seed)
  q, k, v = (
    jnp.asarray(rng.standard_normal((batch, seq, heads, dim)), jnp.float32) for _ in range(3)
  )
  return q, k, v


@pytest.fixture
def blocked(monkeypatch):
  monkeypatch.setattr(xla_attention, "_WHOLE_MAX_BYTES", 0)
  monkeypatch.setattr(xla_attention, "_BLOCK_BYTES", 2 * 24 * 24 * 4)  # 2 heads per block


def test_heads_per_block_divides_the_heads():
  assert xla_attention._heads_per_block(8, 12, 512, 512, 4) == 4  # 4 MiB blocks
  assert xla_attention._heads_per_block(32, 12, 128, 128, 4) is None  # 25 MiB: whole
  assert xla_attention._heads_per_block(2, 7, 2048, 2048, 4) == 1


@pytest.mark.parametrize("case", ["lengths", "key_mask", "segments"])
@pytest.mark.parametrize("ablation", ["scale", "uniform"])
def test_blocked_path_equals_reference(blocked, case, ablation):
  q, k, v = _inputs()
  masks = {
    "lengths": {"kv_lengths": jnp.array([24, 11, 1], jnp.int32)},
    "key_mask": {"key_mask": jnp.asarray(np.random.default_rng(1).random((3, 24)) > 0.3)},
    "segments": {
      "segment_ids": jnp.asarray(np.repeat([[0, 1, 2]], 8, axis=1).repeat(3, 0)),
      "kv_lengths": jnp.array([24, 20, 16], jnp.int32),
    },
  }[case]
  head_mask = jnp.asarray(np.random.default_rng(2).random((3, 6)), jnp.float32)
  assert xla_attention._heads_per_block(3, 6, 24, 24, 4) == 2
  ours = jax.jit(
    lambda q, k, v: kernels.attention(
      q, k, v, impl="xla", head_mask=head_mask, ablation=ablation, **masks
    )
  )(q, k, v)
  ref = reference.reference_attention(q, k, v, head_mask=head_mask, ablation=ablation, **masks)
  np.testing.assert_allclose(np.asarray(ours), np.asarray(ref), atol=2e-6, rtol=0)


def test_blocked_and_whole_paths_agree_and_share_the_gradient(monkeypatch):
  q, k, v = _inputs(seed=3)
  lengths = jnp.array([24, 9, 17], jnp.int32)
  f = lambda q, k, v: kernels.attention(q, k, v, impl="xla", kv_lengths=lengths)
  loss = lambda q, k, v: jnp.sum(jnp.sin(f(q, k, v)))
  whole, g_whole = jax.jit(f)(q, k, v), jax.grad(loss, (0, 1, 2))(q, k, v)
  monkeypatch.setattr(xla_attention, "_WHOLE_MAX_BYTES", 0)
  monkeypatch.setattr(xla_attention, "_BLOCK_BYTES", 24 * 24 * 4)
  blocked_out, g_blocked = jax.jit(f)(q, k, v), jax.grad(loss, (0, 1, 2))(q, k, v)
  np.testing.assert_allclose(np.asarray(blocked_out), np.asarray(whole), atol=1e-6, rtol=0)
  for a, b in zip(g_blocked, g_whole):  # training keeps the whole map as its residual
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
