"""Tests of `kernels.attention`: the fused Pallas kernels against a float64 reference.

Run: JAX_PLATFORMS=cpu .venv/bin/python -m pytest tests/test_kernels.py -q

`AttentionTestBase` holds every case; `TestAttentionInterpret` runs it in Pallas interpret
mode on CPU and `TestAttentionGPU` reruns it compiled when a GPU is present.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import kernels
from bertjax.kernels import BlockSizes
from bertjax.kernels.flash_attention import flash_attention
from bertjax.kernels.flash_attention_stats import attention_statistics_pallas
from bertjax.kernels.flash_attention_tpu import flash_attention_tpu

# Forward block 32, backward q block 16: exercises different forward / backward tilings.
BLOCKS = BlockSizes(block_q=32, block_k=32, block_q_bwd=16, block_k_bwd=32)
FWD_TOL = {jnp.float32: 1e-5, jnp.bfloat16: 1e-2}
GRAD_TOL = {jnp.float32: 1e-5, jnp.bfloat16: 1e-2}


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
    args = [f64(x) for x in (q, k, v, xi)]
    extra = {
      name: (jnp.asarray(np.asarray(val)) if hasattr(val, "shape") else val)
      for name, val in kwargs.items()
    }

    def f(q_, k_, v_, xi_):
      return kernels.reference_attention(q_, k_, v_, head_mask=xi_, **extra)

    def run(q_, k_, v_, xi_, cot_):
      out, vjp = jax.vjp(f, q_, k_, v_, xi_)
      return out, vjp(cot_)

    # One program: op by op, the reference compiled a program per operation and shape.
    out, grads = jax.jit(run)(*args, f64(cot))
    return np.asarray(out), [np.asarray(g) for g in grads]


def _real_rows(x, lengths):
  """Zeroes query rows at or past each length so only real rows are compared."""
  if lengths is None:
    return np.asarray(x, np.float64)
  rows = np.arange(x.shape[1])[None, :] < np.asarray(lengths)[:, None]
  return np.where(rows[:, :, None, None], np.asarray(x, np.float64), 0.0)


class AttentionTestBase:
  """Every kernel case; subclasses choose interpret or compiled mode."""

  INTERPRET = True
  VARIANT = "triton"
  HAS_STATS = True

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
    self,
    *,
    seq,
    head_dim,
    dtype,
    lengths,
    ablation,
    heads=2,
    segment_ids=None,
    head_mask_1d=False,
    seed=0,
    backward="pallas",
  ):
    batch = 2 if lengths is None else len(lengths)
    q, k, v, cot, xi = _inputs(seed, batch, seq, heads, head_dim, dtype)
    if head_mask_1d:
      xi = xi[0]
    kv = None if lengths is None else jnp.asarray(lengths, jnp.int32)
    seg = None if segment_ids is None else jnp.asarray(segment_ids, jnp.int32)

    def f(q_, k_, v_, xi_):
      return self.attn(
        q_,
        k_,
        v_,
        kv_lengths=kv,
        segment_ids=seg,
        head_mask=xi_,
        ablation=ablation,
        backward=backward,
      )

    # One jitted program: interpret mode runs much faster compiled than op by op.
    out, grads = jax.jit(lambda *a: (f(*a), jax.vjp(f, *a)[1](cot)))(q, k, v, xi)
    xi_ref = jnp.broadcast_to(xi, (batch, heads))
    ref_out, ref_grads = _reference_vjp(
      q, k, v, xi_ref, cot, kv_lengths=kv, segment_ids=seg, ablation=ablation
    )
    if head_mask_1d:
      ref_grads[3] = ref_grads[3].sum(axis=0)

    assert out.dtype == dtype and out.shape == q.shape
    for name, x in zip(("out", "dq", "dk", "dv", "dxi"), (out, *grads)):
      assert np.all(np.isfinite(np.asarray(x, np.float32))), f"non-finite {name}"
    assert _rel_err(_real_rows(out, lengths), _real_rows(ref_out, lengths)) <= FWD_TOL[dtype]
    for name, g, r in zip(("dq", "dk", "dv", "dxi"), grads, ref_grads):
      err = _rel_err(g, r)
      assert err <= GRAD_TOL[dtype], f"{name}: relative error {err:.2e}"

  @pytest.mark.parametrize(
    "seq,head_dim,dtype,lengths,ablation,head_mask_1d",
    [
      (40, 32, jnp.float32, (40, 1), "scale", True),  # full length and length 1
      (96, 64, jnp.float32, (96, 50), "uniform", False),
      (33, 128, jnp.float32, (7, 33), "scale", False),  # seq not a block multiple
      (64, 64, jnp.bfloat16, (64, 37), "uniform", False),
      (96, 32, jnp.bfloat16, (20, 96), "scale", False),
      (48, 32, jnp.float32, None, "uniform", True),  # no padding at all
      (40, 32, jnp.float32, (0, 25), "uniform", False),  # an empty sequence
    ],
  )
  def test_forward_and_gradients(self, seq, head_dim, dtype, lengths, ablation, head_mask_1d):
    self.check_against_reference(
      seq=seq,
      head_dim=head_dim,
      dtype=dtype,
      lengths=lengths,
      ablation=ablation,
      head_mask_1d=head_mask_1d,
    )

  @pytest.mark.parametrize("ablation", ["scale", "uniform"])
  def test_segment_ids(self, ablation):
    # Three packed sequences in row 0, two in row 1 whose tail is padding.
    seg = np.array([[0] * 12 + [1] * 20 + [2] * 8, [0] * 25 + [1] * 15])
    self.check_against_reference(
      seq=40,
      head_dim=32,
      dtype=jnp.float32,
      lengths=(40, 31),
      ablation=ablation,
      heads=3,
      segment_ids=seg,
      seed=1,
    )

  def test_odd_head_dim_is_padded(self):
    self.check_against_reference(
      seq=24, head_dim=48, dtype=jnp.float32, lengths=(24, 10), ablation="uniform", seed=2
    )

  def test_reference_backward_fallback(self):
    self.check_against_reference(
      seq=24,
      head_dim=32,
      dtype=jnp.float32,
      lengths=(24, 10),
      ablation="uniform",
      seed=3,
      backward="reference",
    )

  def test_right_padding_key_mask_matches_lengths(self):
    q, k, v, _, xi = _inputs(4, 2, 24, 2, 32, jnp.float32)
    lengths = jnp.array([24, 9])
    key_mask = jnp.arange(24)[None, :] < lengths[:, None]
    by_mask = self.attn(q, k, v, key_mask=key_mask, head_mask=xi)
    by_len = self.attn(q, k, v, kv_lengths=lengths, head_mask=xi)
    np.testing.assert_allclose(by_mask, by_len, rtol=0, atol=0)

  @pytest.mark.parametrize("ablation", ["scale", "uniform"])
  def test_blocks_past_length_are_never_read(self, ablation):
    # NaN in every whole key/query block past the lengths: any read would poison the result
    # (0 * NaN = NaN in the matmuls), so finite outputs and gradients prove the skipping.
    batch, seq, heads, head_dim = 2, 96, 2, 32
    lengths = jnp.array([20, 40])  # blocks of 32: rows >= 32 and >= 64 are never read
    q, k, v, cot, xi = _inputs(10, batch, seq, heads, head_dim, jnp.float32)
    past = (jnp.arange(seq)[None, :] >= jnp.array([32, 64])[:, None])[:, :, None, None]
    poison = lambda x: jnp.where(past, jnp.nan, x)

    def f(q_, k_, v_, xi_):
      return self.attn(q_, k_, v_, kv_lengths=lengths, head_mask=xi_, ablation=ablation)

    out, vjp = jax.vjp(f, poison(q), poison(k), poison(v), xi)
    grads = vjp(poison(cot))
    for name, x in zip(("out", "dq", "dk", "dv", "dxi"), (out, *grads)):
      assert np.all(np.isfinite(np.asarray(x))), f"non-finite {name}"
    ref_out, ref_grads = _reference_vjp(q, k, v, xi, cot, kv_lengths=lengths, ablation=ablation)
    assert _rel_err(_real_rows(out, lengths), _real_rows(ref_out, lengths)) <= 1e-5
    for name, g, r in zip(("dq", "dk", "dv", "dxi"), grads, ref_grads):
      assert _rel_err(g, r) <= 1e-5, name
    if not self.HAS_STATS:
      return
    _, stats = kernels.attention_with_stats(
      poison(q),
      poison(k),
      poison(v),
      kv_lengths=lengths,
      head_mask=xi,
      ablation=ablation,
      impl="pallas",
      interpret=self.INTERPRET,
      block_sizes=BLOCKS,
    )
    assert all(np.all(np.isfinite(np.asarray(x))) for x in stats.values())

  def test_jit_and_vmap_over_head_masks(self):
    # An ablation sweep as one program: vmap over head masks, gradients w.r.t. them.
    q, k, v, _, _ = _inputs(11, 2, 24, 2, 32, jnp.float32)
    lengths = jnp.array([24, 13])
    sweep = jnp.asarray(np.random.default_rng(11).uniform(0, 1, (3, 2)), jnp.float32)

    def importance(attn_fn):
      loss = lambda xi: jnp.sum(
        jnp.tanh(attn_fn(q, k, v, kv_lengths=lengths, head_mask=xi, ablation="uniform"))
      )
      return jax.jit(jax.vmap(jax.value_and_grad(loss)))(sweep)

    got = importance(self.attn)
    want = importance(functools.partial(kernels.attention, impl="xla"))
    for g, w in zip(got, want):
      np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)

  @pytest.mark.parametrize("ablation,segments", [("scale", False), ("uniform", True)])
  def test_statistics(self, ablation, segments):
    if not self.HAS_STATS:
      pytest.skip(f"no statistics kernel for {self.VARIANT=}")
    batch, seq, heads = 2, 40, 2
    q, k, v, _, xi = _inputs(5, batch, seq, heads, 32, jnp.float32)
    lengths = jnp.array([37, 20])
    seg = jnp.asarray([[0] * 15 + [1] * 25, [0] * 8 + [1] * 32]) if segments else None
    special = np.zeros((batch, seq), bool)
    special[0, [14, 36]] = special[1, 19] = True  # [SEP]-like positions
    kwargs = {
      "kv_lengths": lengths,
      "segment_ids": seg,
      "head_mask": xi,
      "ablation": ablation,
      "special_mask": jnp.asarray(special),
    }
    out, stats = kernels.attention_with_stats(
      q, k, v, impl="pallas", interpret=self.INTERPRET, block_sizes=BLOCKS, **kwargs
    )
    with _x64():
      ref_stats = kernels.reference_statistics(
        *(jnp.asarray(np.asarray(x, np.float64)) for x in (q, k, v)),
        **{
          n: (x if n != "head_mask" else jnp.asarray(np.asarray(x, np.float64)))
          for n, x in kwargs.items()
        },
      )
      ref_stats = {n: np.asarray(x) for n, x in ref_stats.items()}
    ref_out = self.attn(
      q, k, v, kv_lengths=lengths, segment_ids=seg, head_mask=xi, ablation=ablation
    )
    np.testing.assert_allclose(out, ref_out, rtol=1e-6, atol=1e-6)
    assert set(stats) == set(kernels.STAT_NAMES)
    for name in kernels.STAT_NAMES:
      assert stats[name].shape == (batch, heads) and stats[name].dtype == jnp.float32
      np.testing.assert_allclose(stats[name], ref_stats[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert np.all(ref_stats["special"] > 0) and np.all(ref_stats["entropy"] > 0)


class TestAttentionInterpret(AttentionTestBase):
  INTERPRET = True


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU (compiled kernels)")
class TestAttentionGPU(AttentionTestBase):
  INTERPRET = False

  @pytest.fixture(autouse=True)
  def _exact_xla_float32(self):
    # XLA's float32 dots default to TF32 on GPUs (relative error ~5e-4), and the xla
    # implementation and the reference backward fallback run through them.
    with jax.default_matmul_precision("float32"):
      yield


class TestAttentionTPUKernelsInterpret(AttentionTestBase):
  """The Mosaic-layout (TPU) kernels in interpret mode, on a smaller grid of cases."""

  INTERPRET = True
  VARIANT = "tpu"
  HAS_STATS = False  # no TPU statistics kernel yet

  @pytest.mark.parametrize(
    "seq,head_dim,dtype,lengths,ablation,head_mask_1d",
    [
      (40, 32, jnp.float32, (40, 1), "scale", True),
      (64, 64, jnp.bfloat16, (64, 37), "uniform", False),
      (40, 128, jnp.float32, (0, 25), "uniform", False),
    ],
  )
  def test_forward_and_gradients(self, seq, head_dim, dtype, lengths, ablation, head_mask_1d):
    super().test_forward_and_gradients(seq, head_dim, dtype, lengths, ablation, head_mask_1d)

  @pytest.mark.parametrize("ablation", ["uniform"])
  def test_segment_ids(self, ablation):
    super().test_segment_ids(ablation)

  @pytest.mark.parametrize("ablation", ["uniform"])
  def test_blocks_past_length_are_never_read(self, ablation):
    super().test_blocks_past_length_are_never_read(ablation)

  def test_odd_head_dim_is_padded(self):
    pytest.skip("covered by the Triton variant; the TPU kernels use head_dim as is")

  def test_reference_backward_fallback(self):
    pytest.skip("the TPU variant has only the Pallas backward")


@pytest.mark.tpu
@pytest.mark.skipif(jax.default_backend() != "tpu", reason="needs a TPU (compiled kernels)")
class TestAttentionTPU(TestAttentionTPUKernelsInterpret):
  INTERPRET = False


@pytest.mark.parametrize(
  "dtype,head_dim,ablation,segments",
  [(jnp.bfloat16, 64, "scale", False), (jnp.float32, 48, "uniform", True)],
)
def test_kernels_lower_to_triton_without_a_gpu(dtype, head_dim, ablation, segments):
  # Exporting for CUDA runs the Pallas -> Triton IR lowering (power-of-two tiles, supported
  # ops) of all six kernels here on CPU; only the PTX compilation is left to a real GPU.
  from jax import export  # only this test needs it

  batch, seq, heads = 2, 150, 3
  x = jax.ShapeDtypeStruct((batch, seq, heads, head_dim), dtype)
  ints = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
  lens = jax.ShapeDtypeStruct((batch,), jnp.int32)
  xi = jax.ShapeDtypeStruct((batch, heads), jnp.float32)
  blocks = BlockSizes.get_default("gpu")

  def grads_and_stats(q, k, v, lengths, xi, seg):
    kw = {
      "mask": kernels.Mask(lengths, seg if segments else None),
      "ablation": ablation,
      "block_sizes": blocks,
      "interpret": False,
    }
    loss = lambda *a: jnp.sum(flash_attention(*a[:3], head_mask=a[3], **kw) ** 2)
    grads = jax.grad(loss, argnums=(0, 1, 2, 3))(q, k, v, xi)
    return grads, attention_statistics_pallas(q, k, v, head_mask=xi, special_mask=seg > 0, **kw)

  triton = "__gpu$xla.gpu.triton"
  exported = export.export(
    jax.jit(grads_and_stats),
    platforms=["cuda"],
    disabled_checks=[export.DisabledSafetyCheck.custom_call(triton)],
  )(x, x, x, lens, xi, ints)
  # fwd with residuals, bwd pre / dkv / dq, fwd + statistics pass.
  assert exported.mlir_module().count(f"@{triton}") == 6


@pytest.mark.parametrize("ablation,segments", [("scale", False), ("uniform", True)])
def test_tpu_kernels_lower_to_mosaic_without_a_tpu(ablation, segments):
  # Exporting for TPU runs the Pallas -> Mosaic lowering (tile shape rules, scalar prefetch,
  # SMEM/VMEM) of the forward and both backward kernels; libtpu's compile is not run here.
  from jax import export  # only this test needs it

  batch, seq, heads, head_dim = 2, 200, 3, 64
  x = jax.ShapeDtypeStruct((batch, seq, heads, head_dim), jnp.bfloat16)
  ints = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
  lens = jax.ShapeDtypeStruct((batch,), jnp.int32)
  xi = jax.ShapeDtypeStruct((batch, heads), jnp.float32)

  def grads(q, k, v, lengths, xi, seg):
    def loss(q, k, v, xi):
      out = flash_attention_tpu(
        q, k, v, mask=kernels.Mask(lengths, seg if segments else None), head_mask=xi,
        ablation=ablation,
      )  # fmt: skip
      return jnp.sum(out.astype(jnp.float32) ** 2)

    return jax.grad(loss, argnums=(0, 1, 2, 3))(q, k, v, xi)

  exported = export.export(jax.jit(grads), platforms=["tpu"])(x, x, x, lens, xi, ints)
  assert exported.mlir_module().count("tpu_custom_call") == 3  # fwd, dkv, dq


# ------------------------------------------------------------------------------------------
# The xla reference and the error paths (no kernel involved).


def _numpy_attention(q, k, v, lengths, xi, ablation):
  """Float64 NumPy attention with probabilities, one (batch, head) at a time."""
  batch, seq, heads, head_dim = q.shape
  out = np.zeros((batch, seq, heads, head_dim))
  probs = np.zeros((batch, heads, seq, seq))
  for b in range(batch):
    n = lengths[b]
    for h in range(heads):
      logits = q[b, :n, h] @ k[b, :n, h].T / np.sqrt(head_dim)  # (n, n)
      a = np.exp(logits - logits.max(-1, keepdims=True))
      a /= a.sum(-1, keepdims=True)
      used = xi[b, h] * a if ablation == "scale" else xi[b, h] * a + (1 - xi[b, h]) / n
      probs[b, h, :n, :n] = used
      out[b, :n, h] = used @ v[b, :n, h]
  return out, probs


@pytest.mark.parametrize("ablation", ["scale", "uniform"])
def test_xla_return_probs_against_numpy(ablation):
  q, k, v, _, xi = _inputs(6, 2, 20, 3, 16, jnp.float32)
  lengths = np.array([20, 13])
  out, probs = kernels.attention(
    q,
    k,
    v,
    kv_lengths=jnp.asarray(lengths),
    head_mask=xi,
    ablation=ablation,
    impl="xla",
    return_probs=True,
  )
  ref_out, ref_probs = _numpy_attention(
    *(np.asarray(x, np.float64) for x in (q, k, v)), lengths, np.asarray(xi, np.float64), ablation
  )
  assert probs.shape == (2, 3, 20, 20)
  np.testing.assert_allclose(probs, ref_probs, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-5)


def test_xla_arbitrary_key_mask():
  q, k, v, _, _ = _inputs(7, 1, 10, 1, 16, jnp.float32)
  key_mask = jnp.asarray([[True, False, True, True, False, True, True, True, False, True]])
  _, probs = kernels.attention(q, k, v, key_mask=key_mask, impl="xla", return_probs=True)
  probs = np.asarray(probs)
  assert np.all(probs[..., ~np.asarray(key_mask[0])] == 0)
  real_rows = np.asarray(key_mask[0])
  np.testing.assert_allclose(probs[0, 0, real_rows].sum(-1), 1.0, rtol=1e-6)


MASKINGS = {
  "none": {},
  "key_mask": {
    "key_mask": np.array(
      [[1, 1, 0, 1, 1, 0, 1], [1, 1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0]], bool
    )
  },
  "kv_lengths": {"kv_lengths": np.array([7, 3, 0])},
  "segment_ids": {"segment_ids": np.array([[0, 0, 0, 1, 1, 1, 1]] * 3)},
}


@pytest.mark.parametrize("ablation", ["scale", "uniform"])
@pytest.mark.parametrize("masking", list(MASKINGS))
def test_xla_custom_backward_equals_reference_autodiff(ablation, masking):
  """impl="xla" (hand-written VJP) vs autodiff of reference_attention, in float64."""
  from bertjax.kernels.attention import reference_attention

  rng = np.random.default_rng(3)
  with _x64():
    q, k, v = (jnp.asarray(rng.standard_normal((3, 7, 4, 8))) for _ in range(3))
    xi = jnp.asarray(rng.random((3, 4)))
    w = jnp.asarray(rng.standard_normal((3, 7, 4, 8)))
    kw = dict(MASKINGS[masking], ablation=ablation)
    lean = lambda q, k, v, xi: kernels.attention(q, k, v, head_mask=xi, impl="xla", **kw)
    ref = lambda q, k, v, xi: reference_attention(q, k, v, head_mask=xi, **kw)
    np.testing.assert_allclose(lean(q, k, v, xi), ref(q, k, v, xi), atol=1e-14)
    grads = [
      jax.grad(lambda *a, f=f: (f(*a) * w).sum(), argnums=(0, 1, 2, 3))(q, k, v, xi)
      for f in (lean, ref)
    ]
    for name, got, want in zip(("q", "k", "v", "xi"), *grads):
      assert got.dtype == jnp.float64, name
      np.testing.assert_allclose(got, want, atol=1e-13, err_msg=name)


def test_xla_custom_backward_bf16_inputs():
  """bf16 inputs: float32 compute inside, bf16 cotangents out; grads match the reference."""
  from bertjax.kernels.attention import reference_attention

  q, k, v, _, xi = _inputs(11, 2, 24, 3, 16, jnp.bfloat16)
  lens = jnp.asarray([24, 9])
  f = lambda impl: (
    lambda q, k, v: (
      (
        kernels.attention(q, k, v, kv_lengths=lens, head_mask=xi, impl="xla")
        if impl == "xla"
        else reference_attention(q, k, v, kv_lengths=lens, head_mask=xi)
      )
      .astype(jnp.float32)
      .sum()
    )
  )
  got, want = (jax.grad(f(i), argnums=(0, 1, 2))(q, k, v) for i in ("xla", "ref"))
  for g, r in zip(got, want):
    assert g.dtype == jnp.bfloat16
    np.testing.assert_allclose(
      np.asarray(g, np.float32), np.asarray(r, np.float32), rtol=2e-2, atol=2e-2
    )


@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_mask_argument_equals_keywords(impl):
  # One Mask in, each implementation takes it in its form: the same numbers as the keywords.
  q, k, v, _, xi = _inputs(10, 2, 12, 2, 16, jnp.float32)
  key_mask = jnp.arange(12)[None, :] < jnp.array([12, 7])[:, None]
  seg = jnp.array([[0] * 6 + [1] * 6, [0] * 12])
  kw = {"head_mask": xi, "impl": impl}
  by_mask = kernels.attention(q, k, v, mask=kernels.Mask(None, seg, key_mask), **kw)
  by_keywords = kernels.attention(q, k, v, segment_ids=seg, key_mask=key_mask, **kw)
  np.testing.assert_array_equal(by_mask, by_keywords)
  stats = kernels.attention_with_stats(q, k, v, mask=kernels.Mask(None, seg, key_mask), **kw)
  np.testing.assert_allclose(stats[0], by_mask, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="auto picks pallas on GPU")
def test_auto_on_cpu_is_xla():
  q, k, v, _, xi = _inputs(8, 2, 12, 2, 16, jnp.float32)
  out = kernels.attention(q, k, v, head_mask=xi)
  ref = kernels.attention(q, k, v, head_mask=xi, impl="xla")
  np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize(
  "kwargs,match",
  [
    ({"head_mask": jnp.ones((3,))}, r"head_mask.shape=\(3,\) must be \(2,\) or \(2, 2\)"),
    ({"head_mask": jnp.ones((2, 2, 2))}, r"head_mask.shape=\(2, 2, 2\)"),
    ({"impl": "triton"}, r"impl='triton' must be one of"),
    ({"ablation": "zero"}, r"ablation='zero' must be one of"),
    ({"impl": "pallas", "return_probs": True}, r"return_probs=True needs impl='xla'"),
    ({"kv_lengths": jnp.ones((3,), jnp.int32)}, r"kv_lengths.shape=\(3,\) must be \(2,\)"),
    ({"segment_ids": jnp.zeros((2, 5), jnp.int32)}, r"segment_ids.shape=\(2, 5\)"),
    ({"impl": "cudnn", "ablation": "uniform", "head_mask": jnp.ones((2,))}, r"impl='cudnn'"),
    ({"impl": "pallas", "backward": "jvp"}, r"backward='jvp' must be"),
    ({"impl": "pallas", "kernel_variant": "cuda"}, r"variant='cuda' must be one of"),
    ({"impl": "pallas", "interpret": False, "kernel_variant": "tpu"}, r"cannot run on backend"),
    ({"mask": kernels.Mask(), "key_mask": jnp.ones((2, 12), bool)}, r"either as mask= or"),
  ],
)
def test_clear_errors(kwargs, match):
  q, k, v, _, _ = _inputs(9, 2, 12, 2, 16, jnp.float32)
  with pytest.raises(ValueError, match=match):
    kernels.attention(q, k, v, **kwargs)


def test_block_sizes_validation_and_defaults():
  with pytest.raises(ValueError, match=r"block_q=48 must be a power of two"):
    BlockSizes(block_q=48)
  assert BlockSizes.get_default("tpu").block_q == 128
  assert BlockSizes.get_default("gpu").block_k == 64
  assert BlockSizes.get_default("cpu").block_q == 32
