"""Attention dropout in `kernels.attention`: kernels vs reference with the same mask.

Run: JAX_PLATFORMS=cpu .venv/bin/python -m pytest tests/test_kernel_dropout.py -q -n0

`DropoutTestBase` holds the kernel cases; it runs in Pallas interpret mode on CPU for the
Triton-style and the TPU (Mosaic-layout) kernels, and compiled where a GPU or TPU is present.
The module-level tests cover the mask itself, the xla paths and the errors.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import kernels
from bertjax.kernels import BlockSizes
from bertjax.kernels import dropout as drop
from bertjax.kernels.flash_attention import flash_attention
from bertjax.kernels.flash_attention_tpu import flash_attention_tpu

# Forward block 32, backward q block 16: the three kernels tile differently.
BLOCKS = BlockSizes(block_q=32, block_k=32, block_q_bwd=16, block_k_bwd=32)
FWD_TOL = {jnp.float32: 1e-5, jnp.bfloat16: 1e-2}
GRAD_TOL = {jnp.float32: 1e-5, jnp.bfloat16: 1e-2}
SEED = jnp.uint32(0xDEADBEEF)


def _x64():
  """Context enabling float64 for the reference (API moved across JAX versions)."""
  if hasattr(jax, "enable_x64"):
    return jax.enable_x64(True)
  from jax.experimental import enable_x64  # pylint: disable=g-import-not-at-top

  return enable_x64()


def _rel_err(x, ref):
  x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
  return np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-30)


def _inputs(seed, batch, seq, heads, head_dim, dtype):
  rng = np.random.default_rng(seed)
  q, k, v, cot = (rng.standard_normal((batch, seq, heads, head_dim)) for _ in range(4))
  xi = rng.uniform(0.2, 1.3, (batch, heads))
  cast = lambda x: jnp.asarray(x, dtype)
  return cast(q), cast(k), cast(v), cast(cot), jnp.asarray(xi, jnp.float32)


def _reference_vjp(q, k, v, xi, cot, **kwargs):
  """Output and gradients of the pure-jnp reference in float64 (inputs upcast exactly)."""
  with _x64():
    f64 = lambda x: jnp.asarray(np.asarray(x, np.float64))

    def f(q_, k_, v_, xi_):
      return kernels.reference_attention(q_, k_, v_, head_mask=xi_, **kwargs)

    def run(q_, k_, v_, xi_, cot_):
      out, vjp = jax.vjp(f, q_, k_, v_, xi_)
      return out, vjp(cot_)

    # One program: op by op, the reference compiled a program per operation and shape.
    out, grads = jax.jit(run)(*(f64(x) for x in (q, k, v, xi, cot)))
    return np.asarray(out), [np.asarray(g) for g in grads]


def _probe_inputs(batch, seq, heads):
  """q = 0, k = v = one-hot keys (head_dim = seq): every kernel's mask becomes readable.

  With zero logits the softmax is 1/n on each real key, so `out[b, i, h, j] = M_ij / n`
  (M: the mask times 1 / (1 - rate)); with a one-hot cotangent `dv[b, j, h, i] = M_ij / n`;
  with an all-ones cotangent `dq[b, i, h, j] = scale * (M_ij - delta_i) / n`.
  """
  eye = jnp.broadcast_to(jnp.eye(seq)[None, :, None, :], (batch, seq, heads, seq))
  return jnp.zeros((batch, seq, heads, seq), jnp.float32), eye, eye


def _check_dq_mask(dq, want):
  """dq rows are `scale * (M_ij - delta_i) / n`, delta_i the row mean of M: positive where
  kept, negative where dropped, all zero in a row wholly kept or wholly dropped."""
  seq = dq.shape[-1]
  x = np.asarray(dq, np.float64) * seq * np.sqrt(seq)  # M_ij - delta_i; |x| >= 1 / n or 0
  uniform_row = np.abs(x).max(axis=-1) < 1e-3
  assert np.all(want[uniform_row].all(-1) | ~want[uniform_row].any(-1))
  np.testing.assert_array_equal((x > 1e-3)[~uniform_row], want[~uniform_row], err_msg="dQ")


class DropoutTestBase:
  """Kernel cases; subclasses choose the variant and interpret or compiled mode."""

  INTERPRET = True
  VARIANT = "triton"

  def attn(self, *args, **kwargs):
    return kernels.attention(
      *args,
      impl="pallas",
      interpret=self.INTERPRET,
      block_sizes=BLOCKS,
      kernel_variant=self.VARIANT,
      **kwargs,
    )

  def check_against_reference(
    self, *, seq, head_dim, dtype, lengths, ablation, rate=0.2, segment_ids=None, seed=0,
    backward="pallas",
  ):  # fmt: skip
    heads = 2
    batch = len(lengths)
    q, k, v, cot, xi = _inputs(seed, batch, seq, heads, head_dim, dtype)
    kv = jnp.asarray(lengths, jnp.int32)
    seg = None if segment_ids is None else jnp.asarray(segment_ids, jnp.int32)
    kw = {"kv_lengths": kv, "segment_ids": seg, "ablation": ablation, "dropout_rate": rate}

    def f(q_, k_, v_, xi_, s):
      return self.attn(q_, k_, v_, head_mask=xi_, dropout_seed=s, backward=backward, **kw)

    # One jitted program with a traced seed: interpret mode runs faster compiled.
    out, grads = jax.jit(
      lambda q_, k_, v_, xi_, s: (
        f(q_, k_, v_, xi_, s),
        jax.vjp(lambda *a: f(*a, s), q_, k_, v_, xi_)[1](cot),
      )
    )(q, k, v, xi, SEED)
    ref_out, ref_grads = _reference_vjp(q, k, v, xi, cot, dropout_seed=SEED, **kw)
    undropped, _ = _reference_vjp(q, k, v, xi, cot, **{**kw, "dropout_rate": 0.0})
    assert _rel_err(ref_out, undropped) > 0.05  # dropout did something

    assert out.dtype == dtype and out.shape == q.shape
    rows = np.arange(seq)[None, :, None, None] < np.asarray(lengths)[:, None, None, None]
    real = lambda x: np.where(rows, np.asarray(x, np.float64), 0.0)
    err = _rel_err(real(out), real(ref_out))
    assert err <= FWD_TOL[dtype], f"out: relative error {err:.2e}"
    for name, g, r in zip(("dq", "dk", "dv", "dxi"), grads, ref_grads):
      assert np.all(np.isfinite(np.asarray(g, np.float32))), f"non-finite {name}"
      err = _rel_err(g, r)
      assert err <= GRAD_TOL[dtype], f"{name}: relative error {err:.2e}"

  @pytest.mark.parametrize(
    "seq,head_dim,dtype,lengths,ablation",
    [
      (40, 32, jnp.float32, (40, 17), "scale"),
      (40, 32, jnp.float32, (33, 40), "uniform"),
      (48, 64, jnp.bfloat16, (48, 21), "uniform"),
      (40, 32, jnp.bfloat16, (0, 40), "scale"),  # an empty sequence
    ],
  )
  def test_matches_reference(self, seq, head_dim, dtype, lengths, ablation):
    self.check_against_reference(
      seq=seq, head_dim=head_dim, dtype=dtype, lengths=lengths, ablation=ablation
    )

  def test_matches_reference_with_segments(self):
    seg = np.array([[0] * 12 + [1] * 20 + [2] * 8, [0] * 25 + [1] * 15])
    self.check_against_reference(
      seq=40, head_dim=32, dtype=jnp.float32, lengths=(40, 31), ablation="uniform", rate=0.5,
      segment_ids=seg, seed=1,
    )  # fmt: skip

  def test_every_kernel_draws_the_reference_mask(self):
    # Forward, dK/dV and dQ kernels each recompute the mask of their tiles; read all three
    # back (see _probe_inputs) and compare bit for bit with the reference mask. Also the
    # drop rate: 2 x 4 x 128 x 128 = 131072 entries at rate 0.1, within 5 binomial sigmas.
    batch, seq, heads, rate = 2, 128, 4, 0.1
    q, k, v = _probe_inputs(batch, seq, heads)

    @jax.jit
    def probe(seed):
      f = lambda q_, k_, v_: self.attn(q_, k_, v_, dropout_rate=rate, dropout_seed=seed)
      out, vjp = jax.vjp(f, q, k, v)
      _, _, dv = vjp(jnp.broadcast_to(jnp.eye(seq)[None, :, None, :], out.shape))
      dq, _, _ = vjp(jnp.ones_like(out))
      return out, dv, dq

    out, dv, dq = probe(SEED)
    want = np.asarray(drop.keep_mask(drop.seed_to_int32(SEED), batch, heads, seq, seq, rate))
    to_bhqk = lambda x: np.asarray(x).transpose(0, 2, 1, 3)  # (B, T, H, T) -> (B, H, T, T)
    np.testing.assert_array_equal(to_bhqk(out) > 0, want, err_msg="forward kernel")
    np.testing.assert_array_equal(to_bhqk(dv).swapaxes(-1, -2) > 0, want, err_msg="dK/dV")
    _check_dq_mask(to_bhqk(dq), want)
    kept = np.asarray(out)[np.asarray(out) > 0]
    np.testing.assert_allclose(kept, 1.0 / (seq * (1 - rate)), rtol=1e-6)  # inverted dropout
    observed = 1.0 - want.mean()
    sigma = np.sqrt(rate * (1 - rate) / want.size)
    assert abs(observed - rate) < 5 * sigma, f"{observed=} vs {rate=} ({sigma=:.1e})"
    # Same seed: the same mask; another seed: about 2 r (1 - r) of the entries differ.
    np.testing.assert_array_equal(probe(SEED)[0], out)
    other = to_bhqk(probe(jnp.uint32(1))[0]) > 0
    differ = np.mean(other != want)
    assert abs(differ - 2 * rate * (1 - rate)) < 5 * np.sqrt(0.18 * 0.82 / want.size)

  def test_rate_zero_is_the_no_dropout_path(self):
    q, k, v, _, xi = _inputs(3, 2, 40, 2, 32, jnp.float32)
    kw = {"kv_lengths": jnp.array([40, 23]), "head_mask": xi, "ablation": "uniform"}
    plain = self.attn(q, k, v, **kw)
    np.testing.assert_array_equal(self.attn(q, k, v, dropout_rate=0.0, dropout_seed=SEED, **kw),
                                  plain)  # fmt: skip
    np.testing.assert_array_equal(self.attn(q, k, v, dropout_rate=0.0, **kw), plain)

  def test_vmap_over_seeds(self):
    q, k, v, _, _ = _inputs(4, 2, 24, 2, 16, jnp.float32)
    seeds = jnp.arange(3, dtype=jnp.uint32)
    f = lambda s: self.attn(q, k, v, kv_lengths=jnp.array([24, 9]), dropout_rate=0.3,
                            dropout_seed=s)  # fmt: skip
    batched = jax.jit(jax.vmap(f))(seeds)
    one = jax.jit(f)
    for i, s in enumerate(seeds):
      np.testing.assert_allclose(batched[i], one(s), rtol=1e-6, atol=1e-6)
    assert _rel_err(batched[0], batched[1]) > 0.05


class TestDropoutTritonInterpret(DropoutTestBase):
  def test_reference_backward_fallback(self):
    self.check_against_reference(
      seq=24, head_dim=32, dtype=jnp.float32, lengths=(24, 10), ablation="uniform", seed=3,
      backward="reference",
    )  # fmt: skip


class TestDropoutTPUKernelsInterpret(DropoutTestBase):
  """The Mosaic-layout (TPU) kernels in interpret mode."""

  VARIANT = "tpu"


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU (compiled kernels)")
class TestDropoutGPU(TestDropoutTritonInterpret):
  INTERPRET = False

  @pytest.fixture(autouse=True)
  def _exact_xla_float32(self):
    with jax.default_matmul_precision("float32"):  # XLA's GPU float32 default is TF32
      yield


@pytest.mark.tpu
@pytest.mark.skipif(jax.default_backend() != "tpu", reason="needs a TPU (compiled kernels)")
class TestDropoutTPU(TestDropoutTPUKernelsInterpret):
  INTERPRET = False


@pytest.mark.parametrize("ablation", ["scale", "uniform"])
def test_dropout_kernels_lower_to_triton_and_mosaic(ablation):
  # Exporting runs the Pallas -> Triton and Pallas -> Mosaic lowerings of the forward and both
  # backward kernels with the integer hash (wrapping multiply, xor, logical shifts) on CPU.
  from jax import export  # only this test needs it

  batch, seq, heads, head_dim = 2, 150, 3, 64
  x = jax.ShapeDtypeStruct((batch, seq, heads, head_dim), jnp.bfloat16)
  lens = jax.ShapeDtypeStruct((batch,), jnp.int32)
  xi = jax.ShapeDtypeStruct((batch, heads), jnp.float32)
  seed = jax.ShapeDtypeStruct((), jnp.uint32)

  def grads(fn, **kw):
    def run(q, k, v, lengths, xi, seed):
      def loss(q, k, v, xi):
        out = fn(q, k, v, mask=kernels.Mask(lengths), head_mask=xi, ablation=ablation,
                 dropout_rate=0.1, dropout_seed=seed, **kw)  # fmt: skip
        return jnp.sum(out.astype(jnp.float32) ** 2)

      return jax.grad(loss, argnums=(0, 1, 2, 3))(q, k, v, xi)

    return jax.jit(run)

  triton = "__gpu$xla.gpu.triton"
  exported = export.export(
    grads(flash_attention, block_sizes=BlockSizes.get_default("gpu"), interpret=False),
    platforms=["cuda"],
    disabled_checks=[export.DisabledSafetyCheck.custom_call(triton)],
  )(x, x, x, lens, xi, seed)
  assert exported.mlir_module().count(f"@{triton}") == 4  # fwd, bwd pre, dkv, dq
  exported = export.export(grads(flash_attention_tpu), platforms=["tpu"])(x, x, x, lens, xi, seed)
  assert exported.mlir_module().count("tpu_custom_call") == 3  # fwd, dkv, dq


# ------------------------------------------------------------------------------------------
# The mask, the xla paths and the errors (no kernel involved).


def test_mask_statistics():
  # 2 x 4 x 256 x 256 entries: the rate, and no correlation between neighbouring entries
  # along keys, queries, heads and batch (P(both dropped) = rate^2), nor between seeds.
  rate = 0.25
  m = ~np.asarray(drop.keep_mask(drop.seed_to_int32(5), 2, 4, 256, 256, rate))  # dropped
  sigma = lambda p, n: 5 * np.sqrt(p * (1 - p) / n)
  assert abs(m.mean() - rate) < sigma(rate, m.size)
  pairs = {
    "keys": m[..., 1:] & m[..., :-1],
    "queries": m[..., 1:, :] & m[..., :-1, :],
    "heads": m[:, 1:] & m[:, :-1],
    "batch": m[1:] & m[:-1],
    "transpose": (m & m.swapaxes(-1, -2))[..., ~np.eye(256, dtype=bool)],
  }
  for name, both in pairs.items():
    assert abs(both.mean() - rate**2) < sigma(rate**2, both.size), name
  other = ~np.asarray(drop.keep_mask(drop.seed_to_int32(6), 2, 4, 256, 256, rate))
  assert abs((m & other).mean() - rate**2) < sigma(rate**2, m.size)


def test_seed_conventions():
  as_int = lambda s: int(drop.seed_to_int32(s))
  assert as_int(jnp.uint32(0xFFFFFFFB)) == as_int(jnp.int32(-5)) == as_int(-5) == -5
  assert as_int(2**32 + 7) == as_int(np.int64(7)) == 7
  key = jax.random.key(42)
  assert as_int(key) == as_int(jax.random.bits(key, (), jnp.uint32))
  # The reference mask does not depend on the float width (int32 arithmetic throughout).
  mask = lambda: np.asarray(drop.keep_mask(drop.seed_to_int32(9), 1, 2, 16, 16, 0.5))
  with _x64():
    np.testing.assert_array_equal(mask(), np.asarray(mask()))
  np.testing.assert_array_equal(drop.keep_mask(jnp.int32(3), 1, 1, 8, 8, 0.0), True)


@pytest.mark.parametrize("ablation", ["scale", "uniform"])
def test_xla_return_probs_is_the_dropped_attention(ablation):
  q, k, v, _, xi = _inputs(6, 2, 20, 3, 16, jnp.float32)
  kw = {"kv_lengths": jnp.array([20, 13]), "head_mask": xi, "ablation": ablation, "impl": "xla"}
  out, probs = kernels.attention(
    q, k, v, return_probs=True, dropout_rate=0.3, dropout_seed=SEED, **kw
  )
  _, plain = kernels.attention(q, k, v, return_probs=True, **kw)
  mult = drop.multiplier(drop.seed_to_int32(SEED), 2, 3, 20, 20, 0.3, jnp.float32)
  # Uniform mode: dropout after the mix, one mask for xi A and (1 - xi) U alike.
  np.testing.assert_allclose(probs, plain * mult, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(out, jnp.einsum("bhqk,bkhd->bqhd", probs, v), rtol=1e-5, atol=1e-6)
  lean = kernels.attention(q, k, v, dropout_rate=0.3, dropout_seed=SEED, **kw)
  np.testing.assert_allclose(lean, out, rtol=1e-5, atol=1e-6)


MASKINGS = {
  "none": {},
  "key_mask": {"key_mask": np.array([[1, 1, 0, 1, 1, 0, 1], [1, 1, 1, 0, 0, 0, 0],
                                     [0, 0, 0, 0, 0, 0, 0]], bool)},
  "kv_lengths": {"kv_lengths": np.array([7, 3, 0])},
  "segment_ids": {"segment_ids": np.array([[0, 0, 0, 1, 1, 1, 1]] * 3)},
}  # fmt: skip


@pytest.mark.parametrize("ablation", ["scale", "uniform"])
@pytest.mark.parametrize("masking", list(MASKINGS))
def test_xla_custom_backward_equals_reference_autodiff(ablation, masking):
  """impl="xla" (hand-written VJP, mask recomputed) vs autodiff of the reference, float64."""
  rng = np.random.default_rng(3)
  with _x64():
    q, k, v, w = (jnp.asarray(rng.standard_normal((3, 7, 4, 8))) for _ in range(4))
    xi = jnp.asarray(rng.random((3, 4)))
    kw = dict(MASKINGS[masking], ablation=ablation, dropout_rate=0.4, dropout_seed=SEED)
    lean = lambda q, k, v, xi: kernels.attention(q, k, v, head_mask=xi, impl="xla", **kw)
    ref = lambda q, k, v, xi: kernels.reference_attention(q, k, v, head_mask=xi, **kw)
    np.testing.assert_allclose(lean(q, k, v, xi), ref(q, k, v, xi), atol=1e-14)
    grads = [
      jax.grad(lambda *a, f=f: (f(*a) * w).sum(), argnums=(0, 1, 2, 3))(q, k, v, xi)
      for f in (lean, ref)
    ]
    for name, got, want in zip(("q", "k", "v", "xi"), *grads):
      assert got.dtype == jnp.float64, name
      np.testing.assert_allclose(got, want, atol=1e-13, err_msg=name)


@pytest.mark.parametrize("impl", ["reference", "xla"])
@pytest.mark.parametrize("ablation", ["scale", "uniform"])
def test_gradients_against_finite_differences(impl, ablation):
  """Float64 central differences: for a fixed seed dropout is a fixed linear mask."""
  from jax.test_util import check_grads  # only this test needs it

  rng = np.random.default_rng(4)
  with _x64():
    q, k, v = (jnp.asarray(rng.standard_normal((2, 6, 2, 4))) for _ in range(3))
    xi = jnp.asarray(rng.uniform(0.2, 1.3, (2, 2)))
    kw = {"kv_lengths": jnp.array([6, 4]), "ablation": ablation, "dropout_rate": 0.3,
          "dropout_seed": SEED}  # fmt: skip
    if impl == "xla":
      f = lambda q, k, v, xi: kernels.attention(q, k, v, head_mask=xi, impl="xla", **kw)
    else:
      f = lambda q, k, v, xi: kernels.reference_attention(q, k, v, head_mask=xi, **kw)
    check_grads(f, (q, k, v, xi), order=1, modes=("rev",), eps=1e-6, atol=1e-7, rtol=1e-7)


def test_rate_zero_is_bitwise_no_dropout_in_xla_and_reference():
  q, k, v, _, xi = _inputs(7, 2, 16, 2, 16, jnp.float32)
  kw = {"kv_lengths": jnp.array([16, 5]), "head_mask": xi, "ablation": "uniform"}
  for f in (
    lambda **a: kernels.attention(q, k, v, impl="xla", **kw, **a),
    lambda **a: kernels.attention(q, k, v, impl="xla", return_probs=True, **kw, **a)[1],
    lambda **a: kernels.reference_attention(q, k, v, **kw, **a),
  ):
    np.testing.assert_array_equal(f(dropout_rate=0.0, dropout_seed=SEED), f())
    assert not np.array_equal(f(dropout_rate=0.1, dropout_seed=SEED), f())


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="auto picks pallas on GPU")
def test_auto_on_cpu_is_xla_with_dropout():
  q, k, v, _, xi = _inputs(8, 2, 12, 2, 16, jnp.float32)
  kw = {"head_mask": xi, "dropout_rate": 0.2, "dropout_seed": SEED}
  np.testing.assert_array_equal(kernels.attention(q, k, v, **kw),
                                kernels.attention(q, k, v, impl="xla", **kw))  # fmt: skip


@pytest.mark.parametrize(
  "kwargs,match",
  [
    ({"impl": "cudnn", "dropout_rate": 0.1, "dropout_seed": 1},
     r"impl='cudnn' with dropout_rate=0.1 is not supported"),
    ({"dropout_rate": 0.1}, r"dropout_rate=0.1 needs a dropout_seed"),
    ({"dropout_rate": 1.0, "dropout_seed": 1}, r"dropout_rate=1.0 must be in \[0, 1\)"),
    ({"dropout_rate": -0.1, "dropout_seed": 1}, r"dropout_rate=-0.1 must be in \[0, 1\)"),
    ({"dropout_rate": "0.1", "dropout_seed": 1}, r"dropout_rate='0.1' must be a static"),
    ({"dropout_rate": 0.1, "dropout_seed": 1.5}, r"dropout_seed=1.5 must be an int32/uint32"),
    ({"dropout_rate": 0.1, "dropout_seed": jnp.zeros((2,), jnp.uint32)},
     r"dropout_seed must be an integer scalar, got shape=\(2,\)"),
    ({"dropout_rate": 0.1, "dropout_seed": jnp.float32(1)},
     r"dropout_seed must be an integer scalar, got shape=\(\) dtype=float32"),
    ({"impl": "pallas", "kernel_variant": "tpu", "backward": "reference", "dropout_rate": 0.1,
      "dropout_seed": 1}, r"backward='reference' is not available for the TPU kernels"),
  ],
)  # fmt: skip
def test_clear_errors(kwargs, match):
  q, k, v, _, _ = _inputs(9, 2, 12, 2, 16, jnp.float32)
  with pytest.raises(ValueError, match=match):
    kernels.attention(q, k, v, **kwargs)


def test_traced_rate_is_refused():
  q, k, v, _, _ = _inputs(9, 1, 8, 1, 16, jnp.float32)
  f = lambda r: kernels.attention(q, k, v, impl="xla", dropout_rate=r, dropout_seed=1)
  with pytest.raises(ValueError, match=r"must be a static Python float"):
    jax.jit(f)(0.1)


def test_attention_with_stats_refuses_dropout():
  q, k, v, _, _ = _inputs(10, 2, 12, 2, 16, jnp.float32)
  with pytest.raises(ValueError, match=r"attention_with_stats is inference only: dropout_rate"):
    kernels.attention_with_stats(q, k, v, dropout_rate=0.1, dropout_seed=SEED)
  out, _ = kernels.attention_with_stats(q, k, v, dropout_rate=0.0)  # 0 is the plain pass
  np.testing.assert_array_equal(out, kernels.attention_with_stats(q, k, v)[0])
