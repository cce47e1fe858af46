"""`kernels.attention_probs` (the model's map path) against the pure-jnp reference."""

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import kernels


def test_probs_equal_reference_values_and_gradients():
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.standard_normal((3, 9, 4, 8))) for _ in range(3))
  key_mask = np.ones((3, 9), bool)
  key_mask[1, 6:] = False
  key_mask[2, [0, 4]] = False  # not right padding: any key mask
  with jax.enable_x64(True):
    q64, k64, v64 = (a.astype(jnp.float64) for a in (q, k, v))
    got = kernels.attention_probs(q64, k64, key_mask=key_mask)
    _, want = kernels.reference_attention(q64, k64, v64, key_mask=key_mask, return_probs=True)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    weight = jnp.asarray(rng.standard_normal(got.shape))
    f = lambda fn: lambda q_, k_: (fn(q_, k_) * weight).sum()
    ours = jax.grad(
      f(lambda a, b: kernels.attention_probs(a, b, key_mask=key_mask)), argnums=(0, 1)
    )(q64, k64)
    ref = jax.grad(
      f(
        lambda a, b: kernels.reference_attention(a, b, v64, key_mask=key_mask, return_probs=True)[1]
      ),
      argnums=(0, 1),
    )(q64, k64)
    for a, b in zip(ours, ref):
      np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
  lengths = jnp.asarray([9, 5, 1])
  got = kernels.attention_probs(q, k, kv_lengths=lengths)
  _, want = kernels.reference_attention(q, k, v, kv_lengths=lengths, return_probs=True)
  np.testing.assert_allclose(got, want, atol=1e-6)
  assert not np.asarray(got[1, :, 5:]).any()  # padded query rows are zero
