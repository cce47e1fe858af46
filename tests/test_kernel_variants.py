"""Modern attention in every implementation: windows, position biases, grouped heads, and
DeBERTa's disentangled terms.

The fused Pallas kernels (Triton layout, interpret mode here; compiled on a GPU with the
`gpu` marker's suite), the XLA path (whole and banded) and the statistics pass, each against
the float64 reference: the forward and every gradient (q, k, v, the head mask, the bias
table; DeBERTa's position keys and queries), with head masks in both modes, dropout and
padding combined. Key blocks outside a window are skipped, not masked. Implementations
without a variant refuse it by name. A model of each modern family (DeBERTa-v3 included)
gives the same outputs, gradients and statistics on the fused kernel as on the XLA path.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax import kernels
from bertjax.kernels.tiling import KernelConfig, key_blocks, query_blocks
from bertjax.kernels.xla_banded import banded_attention

B, T, H, D = 2, 45, 4, 8
# (kv heads, window, bias kind, ablation, dropout)
CASES = [
  (4, None, None, "scale", 0.0),
  (2, None, None, "uniform", 0.0),
  (4, 10, None, "scale", 0.0),
  (4, 10, None, "uniform", 0.3),
  (1, None, "buckets", "scale", 0.0),
  (2, 6, "alibi", "uniform", 0.0),
  (2, 12, "buckets", "uniform", 0.25),
]
IMPLS = {
  "pallas": lambda q, k, v, **kw: kernels.attention(q, k, v, impl="pallas", **kw),
  "xla": lambda q, k, v, **kw: kernels.attention(q, k, v, impl="xla", **kw),
  "banded": lambda q, k, v, **kw: banded_attention(
    q, k, v, **{**kw, "head_mask": jnp.broadcast_to(kw["head_mask"], (B, H))}
  ),
}


@pytest.fixture(autouse=True)
def _full_float32_dots():
  """XLA runs float32 dots as TF32 on GPUs by default (5e-4 relative); the references here are
  float64, so every case runs at full float32 precision (the CPU's default already)."""
  with jax.default_matmul_precision("float32"):
    yield


def _case(kv, window, kind, seed=0):
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(B, T, H, D)).astype(np.float32)
  k, v = (rng.normal(size=(B, T, kv, D)).astype(np.float32) for _ in range(2))
  xi = rng.uniform(size=(B, H)).astype(np.float32)
  table = rng.normal(size=(32, H) if kind == "buckets" else (H,)).astype(np.float32)
  mask = kernels.Mask(kv_lengths=jnp.asarray([T, 30]), window=window)
  return q, k, v, xi, table, mask


def _bias(kind, table):
  return None if kind is None else kernels.PositionBias(table, kind)


def _jitted(outputs, fn):
  """`outputs(fn, *arrays)` as one program: op by op, the forward and gradients of each case
  compiled a program per operation (about 25 per test)."""
  return jax.jit(functools.partial(outputs, fn))


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("kv,window,kind,ablation,rate", CASES)
def test_variant_equals_float64_reference(impl, kv, window, kind, ablation, rate):
  if impl == "banded" and window is None:
    pytest.skip("the banded path is for window layers")
  q, k, v, xi, table, mask = _case(kv, window, kind)
  kw = dict(
    mask=mask, ablation=ablation, dropout_rate=rate, dropout_seed=jnp.int32(7) if rate else None
  )
  probe = np.cos(np.arange(D))
  loss = lambda fn: (
    lambda q, k, v, xi, t: (fn(q, k, v, head_mask=xi, bias=_bias(kind, t), **kw) * probe).sum()
  )

  def outputs(fn, q, k, v, xi, t):
    return fn(q, k, v, head_mask=xi, bias=_bias(kind, t), **kw), jax.grad(
      loss(fn), argnums=(0, 1, 2, 3, 4)
    )(q, k, v, xi, t)

  out, grads = _jitted(outputs, IMPLS[impl])(q, k, v, xi, table)
  with jax.enable_x64(True):
    f64 = [jnp.asarray(np.asarray(a, np.float64)) for a in (q, k, v, xi, table)]
    ref, want = _jitted(outputs, kernels.reference_attention)(*f64)
  ref, want = np.asarray(ref), [np.asarray(g) for g in want]
  np.testing.assert_allclose(out, ref, atol=2e-6)
  for name, got, w in zip(("dq", "dk", "dv", "dxi", "dtable"), grads, want):
    # float32 sums of a few hundred terms: dxi reached 3.04 with an error of 2.1e-5 (6.8e-6
    # relative) on a Zen 3 without AVX-512, so the bound scales with the value too.
    np.testing.assert_allclose(got, w, rtol=1e-5, atol=2e-5, err_msg=name)
  if kind is not None:
    assert np.abs(want[4]).max() > 1e-2  # the bias table really gets a gradient


# DeBERTa: (terms, log buckets, ablation, dropout). T = 37 > the span of 8, so rows clip,
# and with buckets several keys of a query share a row: the scatter-add must sum them.
DEBERTA_CASES = [
  (("c2p", "p2c"), True, "scale", 0.0),
  (("c2p", "p2c"), False, "uniform", 0.3),
  (("c2p",), True, "uniform", 0.0),
  (("p2c",), False, "scale", 0.25),
]


def _deberta_case(terms, buckets, seed=0):
  """q, k, v (B, 37, H, D), xi, the position keys and queries, and a maker of the bias."""
  rng = np.random.default_rng(seed)
  span, seq = 8, 37
  q, k, v = (rng.normal(size=(B, seq, H, D)).astype(np.float32) for _ in range(3))
  kr, qr = (rng.normal(size=(2 * span, H, D)).astype(np.float32) for _ in range(2))
  xi = rng.uniform(size=(B, H)).astype(np.float32)

  def make(kr, qr):
    return kernels.DisentangledBias(
      kr if "c2p" in terms else None,
      qr if "p2c" in terms else None,
      span=span,
      buckets=span if buckets else -1,
      max_position=24,
      scale=1 / np.sqrt((1 + len(terms)) * D),
    )

  return q, k, v, xi, kr, qr, make


@pytest.mark.parametrize("terms,buckets,ablation,rate", DEBERTA_CASES)
def test_fused_disentangled_attention_equals_float64_reference(terms, buckets, ablation, rate):
  """The Triton-layout kernels gather c2p and p2c per tile from the per-row position scores;
  the forward and the gradients of q, k, v, the head mask and both position tables equal
  the float64 reference (whose terms are formed by the XLA path's gather)."""
  q, k, v, xi, kr, qr, make = _deberta_case(terms, buckets)
  mask = kernels.Mask(kv_lengths=jnp.asarray([37, 23]))
  kw = dict(
    mask=mask, ablation=ablation, dropout_rate=rate, dropout_seed=jnp.int32(7) if rate else None
  )
  probe = np.cos(np.arange(D))
  loss = lambda fn: (
    lambda q, k, v, xi, kr, qr: (fn(q, k, v, head_mask=xi, bias=make(kr, qr), **kw) * probe).sum()
  )
  fused = lambda q, k, v, **a: kernels.attention(q, k, v, impl="pallas", **a)

  def outputs(fn, q, k, v, xi, kr, qr):
    out = fn(q, k, v, head_mask=xi, bias=make(kr, qr), **kw)
    return out, jax.grad(loss(fn), argnums=range(6))(q, k, v, xi, kr, qr)

  out, grads = _jitted(outputs, fused)(q, k, v, xi, kr, qr)
  with jax.enable_x64(True):
    f64 = [jnp.asarray(np.asarray(a, np.float64)) for a in (q, k, v, xi, kr, qr)]
    ref, want = _jitted(outputs, kernels.reference_attention)(*f64)
  np.testing.assert_allclose(out, np.asarray(ref), atol=2e-6)
  names = ("dq", "dk", "dv", "dxi", "dpos_key", "dpos_query")
  for name, got, w in zip(names, grads, want):
    np.testing.assert_allclose(got, np.asarray(w), atol=2e-5, err_msg=name)
  for term, got in zip(("c2p", "p2c"), grads[4:]):  # a term present really gets a gradient
    assert (np.abs(np.asarray(got)).max() > 1e-2) == (term in terms)


@pytest.mark.parametrize("terms,buckets,ablation,rate", DEBERTA_CASES[:2])
def test_disentangled_statistics_pass_equals_reference(terms, buckets, ablation, rate):
  q, k, v, xi, kr, qr, make = _deberta_case(terms, buckets, seed=1)
  mask = kernels.Mask(kv_lengths=jnp.asarray([37, 23]))
  special = np.zeros((B, 37), bool)
  special[:, [0, 7]] = True
  kw = dict(mask=mask, ablation=ablation, special_mask=special)
  _, got = kernels.attention_with_stats(
    q, k, v, head_mask=xi, impl="pallas", bias=make(kr, qr), **kw
  )
  with jax.enable_x64(True):
    f64 = [jnp.asarray(np.asarray(a, np.float64)) for a in (q, k, v, xi, kr, qr)]
    want = kernels.reference_statistics(*f64[:3], head_mask=f64[3], bias=make(*f64[4:]), **kw)
  for name in kernels.STAT_NAMES:
    np.testing.assert_allclose(got[name], np.asarray(want[name]), atol=2e-6, err_msg=name)


def test_disentangled_layout_reads_the_reference_rows():
  """The kernels' relative-row table gives, for every (query, key), the row the reference's
  `DisentangledBias.index` gives, shifted by the first row read."""
  from bertjax.kernels.flash_attention import disentangled_layout

  for buckets, seq_pad in ((-1, 48), (8, 48), (256, 512)):
    bias = kernels.DisentangledBias(span=8 if buckets < 256 else 256, buckets=buckets)
    lut, lo, width = disentangled_layout(bias, seq_pad)
    i, j = np.meshgrid(np.arange(seq_pad), np.arange(seq_pad), indexing="ij")
    np.testing.assert_array_equal(lut[i - j + seq_pad - 1] + lo, bias.index(seq_pad, seq_pad))
    assert width >= lut.max() + 1 and width & (width - 1) == 0


@pytest.mark.parametrize("kv,window,kind,ablation,rate", CASES)
def test_statistics_pass_equals_reference(kv, window, kind, ablation, rate):
  q, k, v, xi, table, mask = _case(kv, window, kind, seed=1)
  special = np.zeros((B, T), bool)
  special[:, [0, 7]] = True
  _, got = kernels.attention_with_stats(
    q,
    k,
    v,
    mask=mask,
    head_mask=xi,
    ablation=ablation,
    special_mask=special,
    impl="pallas",
    bias=_bias(kind, table),
  )
  with jax.enable_x64(True):
    f64 = [jnp.asarray(np.asarray(a, np.float64)) for a in (q, k, v, xi, table)]
    want = kernels.reference_statistics(
      *f64[:3],
      mask=mask,
      head_mask=f64[3],
      ablation=ablation,
      special_mask=special,
      bias=_bias(kind, f64[4]),
    )
    want = {n: np.asarray(x) for n, x in want.items()}
  for name in kernels.STAT_NAMES:
    np.testing.assert_allclose(got[name], want[name], atol=2e-6, err_msg=name)


def test_window_tiles_outside_the_band_are_skipped():
  """A query block visits exactly the key blocks its band meets, and a key block exactly the
  query blocks that see it: the cost is T x window, not T x T."""
  half, block, length = 20, 16, 200
  cfg = KernelConfig(
    scale=1.0,
    ablation="scale",
    block_sizes=kernels.BlockSizes(),
    has_segments=False,
    interpret=True,
    backward="pallas",
    half_window=half,
  )
  for start in range(0, 224, block):
    lo, hi = (int(x) for x in key_blocks(cfg, jnp.int32(start), block, block, length))
    meets = [
      j
      for j in range(-(-length // block))
      if start < length
      and j * block <= start + block - 1 + half
      and (j + 1) * block - 1 >= start - half
    ]
    assert list(range(lo, hi)) == meets, (start, lo, hi)
    lo, hi = (int(x) for x in query_blocks(cfg, jnp.int32(start), block, block, length))
    assert list(range(lo, hi)) == meets
  assert hi - lo <= 2 * half // block + 2


@pytest.mark.parametrize("variant", ["window", "bias", "groups"])
def test_implementations_without_a_variant_refuse_it(variant):
  q, k, v, _xi, table, mask = _case(
    2 if variant == "groups" else 4,
    10 if variant == "window" else None,
    "buckets" if variant == "bias" else None,
  )
  kw = dict(mask=mask, bias=_bias("buckets", table) if variant == "bias" else None)
  with pytest.raises(ValueError, match="kernel_variant='tpu' does not support"):
    kernels.attention(q, k, v, impl="pallas", kernel_variant="tpu", interpret=True, **kw)


@pytest.mark.parametrize(
  "family",
  ["modernbert", "mpnet", "eurobert", "deberta-v2", "ultrabert", "gemma3_text", "neobert"],
)
def test_model_on_the_fused_kernel_equals_the_xla_path(family):
  """A model of each family runs on the fused kernel (interpret mode): outputs, statistics,
  and the gradients of its parameters (MPNet's bias table included) equal the XLA path's."""
  extra = {
    "modernbert": dict(layer_types=("full_attention", "sliding_attention"), sliding_window=6),
    "mpnet": dict(pad_token_id=1, type_vocab_size=0),
    "eurobert": dict(num_key_value_heads=2),
    "ultrabert": dict(
      num_key_value_heads=2, layer_types=("sliding_attention", "full_attention"), sliding_window=6
    ),
    "gemma3_text": dict(  # its own query scale, QK-norm and sandwich norms around the kernel
      num_key_value_heads=2,
      layer_types=("sliding_attention", "full_attention"),
      sliding_window=6,
      query_pre_attn_scalar=5,
    ),
    "neobert": dict(),  # rotary on interleaved pairs, q/k/v fused head by head
    "deberta-v2": dict(  # v3's layout: log buckets, shared keys, both terms
      relative_attention=True,
      position_buckets=8,
      max_relative_positions=32,
      norm_rel_ebd="layer_norm",
      share_att_key=True,
      pos_att_type=("p2c", "c2p"),
      position_biased_input=False,
      type_vocab_size=0,
    ),
  }[family]
  config = bertjax.BertConfig.for_family(
    family,
    vocab_size=50,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=40,
    max_position_embeddings=64,
    **extra,
  )
  mlm = "mlm" in config.family.heads  # EmbeddingGemma has none: the last states then
  params = bertjax.init(config, 0, heads=("mlm",) if mlm else ())
  rng = np.random.default_rng(0)
  ids = rng.integers(3, 50, (2, 21))
  mask = np.ones_like(ids)
  mask[1, 15:] = 0
  ids = np.where(mask > 0, ids, config.pad_token_id)
  xi = rng.uniform(size=(config.depth, config.num_attention_heads)).astype(np.float32)

  def loss(p, c):
    out = bertjax.forward(p, c, ids, mask, head_mask=xi, head_ablation="uniform")
    read = bertjax.head_logits(p, c, out, "mlm") if mlm else out.last_hidden_state
    return (read[:, 3, :7] * mask[:, 3, None]).sum()

  fused = config.replace(attention_impl="pallas")
  np.testing.assert_allclose(loss(params, fused), loss(params, config), rtol=1e-5)
  g_fused, g_xla = (jax.grad(loss)(params, c) for c in (fused, config))
  for a, b in zip(jax.tree.leaves(g_fused), jax.tree.leaves(g_xla)):
    # float32 rounding relative to the gradient's size (Gemma's sqrt(H) scale makes it ~30)
    np.testing.assert_allclose(a, b, atol=1e-5 * max(1.0, float(np.abs(b).max())))
  sf, sx = (bertjax.attention_statistics(params, c, ids, mask) for c in (fused, config))
  for name in sf:
    np.testing.assert_allclose(sf[name], sx[name], atol=2e-6, err_msg=name)
