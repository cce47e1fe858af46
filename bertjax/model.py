"""Flax modules of the encoder (every family) and its task heads, with named sites.

Modules here compute one piece each; `functional.py` composes them into a
model whose layer parameters are stacked on a leading axis and run under
`lax.scan`. Attention goes through `kernels.attention`, so the same layer runs
on the reference einsum or the fused Pallas kernel.

Every internal of a block is a named *site* (`SITES`): the block passes each
through `Sites.visit`, which records it when captured and replaces it when
patched (`weight * value + (1 - weight) * own`). Head masks and layer masks are
edits of the same sites (`head_out` and `out`), so analyses never re-implement
the layer.

Parameter layout of one encoder layer (shapes for hidden H, heads N, head dim D,
intermediate I); per-head axes are explicit so that head masks, pruning and
effective attention index heads directly:

  attention/query/kernel (H, N, D)   attention/query/bias (N, D)   (key, value alike)
  attention/output/kernel (N, D, H)  attention/output/bias (H,)
  attention/LayerNorm/{scale,bias} (H,)
  intermediate/kernel (H, I)   output/kernel (I, H)   LayerNorm/{scale,bias} (H,)
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from bertjax import kernels
from bertjax.config import BertConfig
from bertjax.quantize import int8_dot_general

# Site name -> (axes after depth, what it is). "embeddings" has no depth axis.
SITES = {
    "embeddings": ("batch seq hidden", "the embedding output (after LayerNorm, projection)"),
    "q": ("batch seq heads head_dim", "query projection with bias, before scaling"),
    "k": ("batch seq heads head_dim", "key projection with bias"),
    "v": ("batch seq heads head_dim", "value projection with bias"),
    "probs": ("batch heads seq seq", "attention probabilities (needs the map path)"),
    "head_out": ("batch seq heads head_dim",
                 "each head's context sum_j probs_ij v_j after any head mask"),
    "attn_out": ("batch seq hidden", "attention output projection (with bias), before residual"),
    "mid": ("batch seq hidden", "LayerNorm(x + attn_out)"),
    "ffn_act": ("batch seq intermediate", "the FFN's hidden activation"),
    "ffn_out": ("batch seq hidden", "the FFN's output projection, before residual"),
    "out": ("batch seq hidden", "the block's output (= hidden_states[1:])"),
}
BLOCK_SITES = tuple(s for s in SITES if s != "embeddings")
# Sites with a head axis, and where it sits in one block's array.
HEAD_AXIS = {"q": 2, "k": 2, "v": 2, "head_out": 2, "probs": 1}
# Sites with a query-position axis, and where it sits in one block's array: a block run at
# chosen rows only (`Sites.rows`, `run_layers(final_rows=)`) computes them there. Keys and
# values keep every position.
ROW_AXIS = {"q": 1, "probs": 2, "head_out": 1, "attn_out": 1, "mid": 1, "ffn_act": 1,
            "ffn_out": 1, "out": 1}


def site_shape(config: BertConfig, site: str, batch: int, seq: int) -> tuple[int, ...]:
  """The stacked shape of `site` for a (batch, seq) input: depth first, except embeddings."""
  if site not in SITES:
    raise ValueError(f"site {site!r} is unknown; expected one of {tuple(SITES)}")
  sizes = dict(batch=batch, seq=seq, hidden=config.hidden_size, heads=config.num_attention_heads,
               head_dim=config.head_dim, intermediate=config.intermediate_size)
  shape = tuple(sizes[a] for a in SITES[site][0].split())
  return shape if site == "embeddings" else (config.depth,) + shape


def mix(own, value, weight):
  """`weight * value + (1 - weight) * own` in `own`'s dtype."""
  dtype = own.dtype
  weight = jnp.asarray(weight)
  return (weight * jnp.asarray(value) + (1 - weight) * own).astype(dtype)


def take_rows(x, rows, axis: int = 1):
  """`x` at positions `rows` (B, R) along `axis` (an axis of size 1 broadcasts and stays)."""
  x = jnp.asarray(x)
  if x.shape[axis] == 1:
    return x
  x = jnp.broadcast_to(x, (rows.shape[0],) + x.shape[1:])
  index = rows.reshape(rows.shape + (1,) * (x.ndim - 2))
  index = jnp.moveaxis(index, 1, axis) if axis != 1 else index
  return jnp.take_along_axis(x, index, axis=axis)


def put_rows(x, rows, seq_len: int, axis: int = 1):
  """The inverse of `take_rows`: `x` (R along `axis`) placed at `rows` in zeros of `seq_len`."""
  x = jnp.moveaxis(x, axis, 1)  # (B, R, ...)
  full = jnp.zeros((x.shape[0], seq_len) + x.shape[2:], x.dtype)
  full = full.at[jnp.arange(x.shape[0])[:, None], rows].set(x)
  return jnp.moveaxis(full, 1, axis)


class Sites:
  """One block's view of the interventions: what to capture, patch and mask.

  Built fresh for each traced block (inside the layer scan); `visit` returns the
  site's (possibly replaced) value and records it when captured.

  Attributes:
    capture: names of sites to record.
    patch: site -> (value, weight), already sliced to this block.
    head_mask: float (N,) or (B, N) for this block, or None.
    head_ablation: "scale" (head_out * xi) or "uniform" (the attention becomes
      xi * A + (1 - xi) * U, i.e. head_out mixes with the mean value of the real keys).
    layer_mask: float scalar for this block, or None (out = m * out + (1 - m) * x).
    kept: original indices of this block's heads when it is pruned, else None.
    num_heads: the unpruned head count (captures are scattered back to it).
    rows: int (B, R) when the block runs at these query positions only (`ROW_AXIS`
      sites: patches are read there, captures are zero elsewhere), else None.
  """

  def __init__(self, capture=(), patch=None, head_mask=None, head_ablation="scale",
               layer_mask=None, kept=None, num_heads=None, rows=None):
    self.capture = frozenset(capture)
    self.patch = patch or {}
    self.head_mask = head_mask
    self.head_ablation = head_ablation
    self.layer_mask = layer_mask
    self.kept = kept
    self.num_heads = num_heads
    self.rows = rows
    self.seq_len = None  # set by the block when rows is given
    self.captured: dict[str, jax.Array] = {}

  def needs(self, name: str) -> bool:
    return name in self.capture or name in self.patch

  def visit(self, name: str, value):
    restricted = self.rows is not None and name in ROW_AXIS
    if name in self.patch:
      target, weight = self.patch[name]
      if self.kept is not None and name in HEAD_AXIS:
        target, weight = self._kept_heads(name, target), self._kept_heads(name, weight)
      if restricted:
        target, weight = (self._at_rows(name, a, value.ndim) for a in (target, weight))
      value = mix(value, target, weight)
    if name in self.capture:
      captured = self._all_heads(name, value)
      if restricted:
        captured = put_rows(captured, self.rows, self.seq_len, ROW_AXIS[name])
      self.captured[name] = captured
    return value

  def _at_rows(self, name, x, ndim):
    # A patch array (broadcasting to the block's full site) read at the block's rows.
    x = jnp.asarray(x)
    x = x.reshape((1,) * (ndim - x.ndim) + x.shape)
    return take_rows(x, self.rows, ROW_AXIS[name])

  def _kept_heads(self, name, x):
    # Patch arrays are indexed by original heads; a pruned block keeps some of them.
    x = jnp.asarray(x)
    axis = HEAD_AXIS[name] - (4 - x.ndim)
    if axis < 0 or x.shape[axis] == 1:
      return x
    return jnp.take(x, jnp.asarray(self.kept, jnp.int32), axis=axis)

  def _all_heads(self, name, x):
    # Captures of a pruned block show removed heads as zeros.
    if self.kept is None or name not in HEAD_AXIS:
      return x
    axis = HEAD_AXIS[name]
    shape = list(x.shape)
    shape[axis] = self.num_heads
    full = jnp.zeros(shape, x.dtype)
    index = [slice(None)] * x.ndim
    index[axis] = jnp.asarray(self.kept, jnp.int32)
    return full.at[tuple(index)].set(x)

  def mask_heads(self, head_out, v, key_mask):
    """Applies the head mask to head_out (B, T, N, D), the context of each head."""
    xi = self.head_mask
    if xi is None:
      return head_out
    xi = jnp.asarray(xi)
    xi = (xi[None, None, :, None] if xi.ndim == 1 else xi[:, None, :, None]).astype(head_out.dtype)
    if self.head_ablation == "scale":
      return head_out * xi
    # Uniform attention over the real keys: every query's context is their mean value.
    acc = jnp.promote_types(v.dtype, jnp.float32)
    m = key_mask.astype(acc)[:, :, None, None]  # (B, T, 1, 1)
    mean_v = (v.astype(acc) * m).sum(1, keepdims=True) / jnp.maximum(m.sum(1, keepdims=True), 1)
    return (xi * head_out + (1 - xi) * mean_v.astype(head_out.dtype)).astype(head_out.dtype)

  def mask_maps(self, probs, key_mask):
    """The attention Hugging Face returns under this head mask: xi A, or xi A + (1 - xi) U."""
    xi = self.head_mask
    if xi is None:
      return probs
    xi = jnp.asarray(xi)
    xi = (xi[None, :, None, None] if xi.ndim == 1 else xi[:, :, None, None]).astype(probs.dtype)
    if self.head_ablation == "scale":
      return xi * probs
    real = key_mask.astype(probs.dtype)[:, None, None, :]
    uniform = real / jnp.maximum(real.sum(-1, keepdims=True), 1)
    return xi * probs + (1 - xi) * uniform


def activation(name: str):
  """The activation function a Hugging Face `hidden_act` names."""
  if name == "gelu":
    return gelu
  if name in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
    return lambda x: jax.nn.gelu(x, approximate=True)
  if name == "relu":
    return jax.nn.relu
  if name in ("silu", "swish"):
    return jax.nn.silu
  if name == "tanh":
    return jnp.tanh
  raise ValueError(f"hidden_act={name!r} is not supported")


@jax.custom_jvp
def gelu(x):
  """Exact GELU, `x / 2 * (1 + erf(x / sqrt(2)))`: PyTorch's formula.

  `jax.nn.gelu(approximate=False)` computes the same function through erfc, whose XLA:CPU
  expansion costs 1.6x this one (2.0 vs 1.25 ms for 1024 x 3072 float32 on the 2-core
  AMD EPYC; outputs within 5e-7). Its derivative `Phi(x) + x phi(x)` is written out
  (`_gelu_jvp`): a gradient then keeps one array per FFN activation where autodiff of the
  formula keeps three, which is most of what a backward pass stores for BERT's FFN.
  """
  return x * _normal_cdf(x)


def _normal_cdf(x):
  return (1 + jax.lax.erf(x * np.sqrt(0.5).astype(x.dtype))) / 2


@gelu.defjvp
def _gelu_jvp(primals, tangents):
  (x,), (t,) = primals, tangents
  cdf = _normal_cdf(x)
  pdf = jnp.exp(-0.5 * x * x) * np.sqrt(0.5 / np.pi).astype(x.dtype)
  return x * cdf, t * (cdf + x * pdf)


def compute_dtype(config: BertConfig):
  """Matmul dtype; parameters stay float32 (master weights) whatever it is.

  Raises:
    ValueError: for "float64" without 64-bit JAX, which would compute in float32.
  """
  if config.dtype == "float64" and not jax.config.jax_enable_x64:
    raise ValueError("config.dtype='float64' needs 64-bit JAX: call "
                     "jax.config.update('jax_enable_x64', True) first (without it JAX "
                     "computes in float32)")
  return {"bfloat16": jnp.bfloat16, "float32": jnp.float32, "float64": jnp.float64}[config.dtype]


def accum_dtype(config: BertConfig):
  """Embedding sums and logits: float32, or float64 in float64 mode."""
  return jnp.promote_types(compute_dtype(config), jnp.float32)


def _init(config: BertConfig):
  return nn.initializers.normal(stddev=config.initializer_range)


def _dense_kw(config: BertConfig) -> dict:
  """Extra `nn.Dense`/`nn.DenseGeneral` arguments: the int8 matmul when `config.quantize`."""
  return {"dot_general": int8_dot_general} if config.quantize == "int8" else {}


class LayerNorm(nn.Module):
  """LayerNorm over the last axis with `nn.LayerNorm`'s parameters ("scale", "bias").

  Statistics in at least float32, the variance in two passes (`mean((x - mean)^2)`, as
  PyTorch). On the CPU the row sums are matrix-vector products with a column of ones, not
  reductions: XLA:CPU lowers a row reduction to a windowed tree reduction plus a second
  pass (1024 x 768 float32 on the 2-core AMD EPYC: 0.68 ms this way vs 1.37 ms for
  `nn.LayerNorm`), and the YNNPACK reduce fusions bertjax enables for attention
  (`bertjax.xla_options`) make BERT-base's LayerNorms slower at batch 32 x 128 (forward
  1.18x XLA's time with reductions, 0.94x with these products). Other backends keep the
  reductions, which they fuse well.
  """

  epsilon: float
  dtype: Any

  @nn.compact
  def __call__(self, x):
    n = x.shape[-1]
    scale = self.param("scale", nn.initializers.ones, (n,))
    bias = self.param("bias", nn.initializers.zeros, (n,))
    acc = jnp.promote_types(x.dtype, jnp.float32)
    x = x.astype(acc)
    if jax.default_backend() == "cpu":
      ones = jnp.ones((n, 1), acc)
      row_mean = lambda a: (a @ ones) / n  # (..., 1)
    else:
      row_mean = lambda a: a.mean(-1, keepdims=True)
    centred = x - row_mean(x)
    inv = jax.lax.rsqrt(row_mean(centred * centred) + self.epsilon)
    y = centred * inv * scale.astype(acc) + bias.astype(acc)
    return y.astype(self.dtype)


def _layer_norm(config: BertConfig, name: str) -> LayerNorm:
  return LayerNorm(epsilon=config.layer_norm_eps, dtype=compute_dtype(config), name=name)


def sinusoidal_table(positions: int, dim: int) -> np.ndarray:
  """DistilBERT's fixed table: sin on even, cos on odd columns of pos / 10000^(2(j//2)/dim)."""
  angle = np.arange(positions)[:, None] / np.power(10000, 2 * (np.arange(dim) // 2) / dim)[None]
  table = np.empty((positions, dim), np.float32)
  table[:, 0::2] = np.sin(angle[:, 0::2])
  table[:, 1::2] = np.cos(angle[:, 1::2])
  return table


def position_ids(config: BertConfig, input_ids):
  """(B, T) position ids: 0.. (BERT); RoBERTa counts real tokens from pad_token_id + 1."""
  if config.family.positions == "after_padding":
    # As transformers' create_position_ids_from_input_ids: padding is input_ids == pad.
    real = (input_ids != config.pad_token_id).astype(jnp.int32)
    return jnp.cumsum(real, axis=1) * real + config.pad_token_id
  return jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)


class Embeddings(nn.Module):
  """Word + token-type + position embeddings, LayerNorm, dropout, and E->H projection."""

  config: BertConfig

  @nn.compact
  def __call__(self, input_ids, token_type_ids, deterministic: bool = True):
    cfg = self.config
    dtype = compute_dtype(cfg)
    embed = lambda n, name, init=None: nn.Embed(
        n, cfg.embed_dim, embedding_init=init or _init(cfg), dtype=accum_dtype(cfg), name=name)
    # Same summation order as Hugging Face: (word + type) + position.
    x = embed(cfg.vocab_size, "word_embeddings")(input_ids)  # (B, T, E)
    if cfg.type_vocab_size:
      x = x + embed(cfg.type_vocab_size, "token_type_embeddings")(token_type_ids)
    if cfg.sinusoidal_positions:
      table = lambda *_: jnp.asarray(sinusoidal_table(cfg.max_position_embeddings, cfg.embed_dim))
      positions = embed(cfg.max_position_embeddings, "position_embeddings", table)
      x = x + jax.lax.stop_gradient(positions(position_ids(cfg, input_ids)))  # fixed, not trained
    else:
      x = x + embed(cfg.max_position_embeddings, "position_embeddings")(position_ids(cfg, input_ids))
    x = _layer_norm(cfg, "LayerNorm")(x.astype(dtype))
    x = nn.Dropout(cfg.hidden_dropout_prob)(x, deterministic=deterministic)
    if cfg.has_embedding_projection:
      x = nn.Dense(cfg.hidden_size, kernel_init=_init(cfg), **_dense_kw(cfg), dtype=dtype,
                   name="projection")(x)
    return x  # (B, T, H)


class SelfAttention(nn.Module):
  """Multi-head self-attention with its output projection, residual and LayerNorm.

  `num_heads` below `config.num_attention_heads` is a physically pruned layer.
  Returns `(mid, maps)`: maps are the attention Hugging Face reports (after the
  head mask) when `output_attentions`, the per-head statistics in stats mode,
  else None.
  """

  config: BertConfig
  num_heads: int | None = None

  @nn.compact
  def __call__(self, x, key_mask, sites: Sites, output_attentions: bool = False,
               deterministic: bool = True, stats_special_mask=None, stats: bool = False):
    cfg = self.config
    dtype = compute_dtype(cfg)
    n = cfg.num_attention_heads if self.num_heads is None else self.num_heads
    d = cfg.head_dim
    proj = lambda name: nn.DenseGeneral((n, d), kernel_init=_init(cfg), **_dense_kw(cfg),
                                        dtype=dtype, name=name)
    # At chosen rows, queries (and all that follows) come from those positions only; padded
    # rows among them give zeros, as at full length (where the kernels see Tq == Tk).
    x_q, real = x, None
    if sites.rows is not None:
      x_q = take_rows(x, sites.rows)  # (B, R, H)
      real = take_rows(key_mask, sites.rows)  # (B, R)
    q = sites.visit("q", proj("query")(x_q))  # (B, T | R, N, D)
    k = sites.visit("k", proj("key")(x))  # (B, T, N, D)
    v = sites.visit("v", proj("value")(x))

    dropout = 0.0 if deterministic else cfg.attention_probs_dropout_prob
    # The padding as one description; kernels hands each implementation the form it takes.
    mask = kernels.Mask(key_mask=key_mask)
    maps = None
    if n == 0:  # every head pruned: the block adds only the output bias
      head_out = q
      maps = jnp.zeros((x.shape[0], 0, q.shape[1], x.shape[1]), jnp.float32)
      if sites.needs("probs"):  # captured as zeros at every (removed) head, as head_out is
        sites.visit("probs", maps)
    elif stats:
      # Per-head statistics instead of maps, inside the fused kernel when the config
      # selects it; the head mask acts inside the kernel so the statistics see it. cuDNN
      # has no statistics pass: its configs compute them with xla.
      head_out, maps = kernels.attention_with_stats(
          q, k, v, mask=mask, head_mask=sites.head_mask, ablation=sites.head_ablation,
          special_mask=stats_special_mask,
          impl="xla" if cfg.attention_impl == "cudnn" else cfg.attention_impl)
    elif output_attentions or sites.needs("probs"):
      # The map path: the probabilities are returned, captured or patched.
      probs = kernels.attention_probs(q, k, mask=mask)  # (B, N, T | R, T)
      if real is not None:
        probs = probs * real[:, None, :, None].astype(probs.dtype)
      probs = sites.visit("probs", probs)
      used = probs
      if dropout:
        used = nn.Dropout(dropout)(probs, deterministic=False)
      # Heads-first batched matmul (the layout XLA:CPU is fast with), back to (B, T, N, D).
      vh = jnp.swapaxes(v.astype(used.dtype), 1, 2)
      head_out = jnp.swapaxes(jnp.einsum("bnqk,bnkd->bnqd", used, vh), 1, 2).astype(dtype)
      maps = sites.mask_maps(probs, key_mask) if output_attentions else None
    else:
      extra = {}
      if dropout:
        # The kernels draw the mask from a counter-based stream keyed by this seed.
        seed = jax.random.bits(self.make_rng("dropout"), (), jnp.uint32)
        extra = {"dropout_rate": dropout, "dropout_seed": seed}
      head_out = kernels.attention(q, k, v, mask=mask, impl=cfg.attention_impl, **extra)
    if real is not None and not (output_attentions or sites.needs("probs")):
      head_out = head_out * real[:, :, None, None].astype(head_out.dtype)
    if not stats:
      head_out = sites.mask_heads(head_out.astype(dtype), v, key_mask)
    head_out = sites.visit("head_out", head_out.astype(dtype))
    y = nn.DenseGeneral(cfg.hidden_size, axis=(-2, -1), kernel_init=_init(cfg), **_dense_kw(cfg),
                        dtype=dtype, name="output")(head_out)  # (B, T, H)
    y = sites.visit("attn_out", y)
    y = nn.Dropout(cfg.hidden_dropout_prob)(y, deterministic=deterministic)
    return sites.visit("mid", _layer_norm(cfg, "LayerNorm")(x_q + y)), maps


class EncoderLayer(nn.Module):
  """One post-LN transformer block: attention, then the feed-forward network.

  With `sites.rows` (B, R) the block runs at those query positions only: keys and
  values come from every position of `x`, every other step (queries, head outputs,
  the output projection, LayerNorms, the FFN) from the R rows, and it returns
  (B, R, H), equal to the full block's output at those rows. A caller that reads only
  some positions of the last block (a patching metric) skips the rest of its work.
  """

  config: BertConfig
  num_heads: int | None = None

  @nn.compact
  def __call__(self, x, key_mask, sites: Sites | None = None,
               output_attentions: bool = False, deterministic: bool = True,
               stats_special_mask=None, stats: bool = False):
    cfg = self.config
    dtype = compute_dtype(cfg)
    sites = Sites() if sites is None else sites
    sites.seq_len = x.shape[1]
    h, maps = SelfAttention(cfg, self.num_heads, name="attention")(
        x, key_mask, sites, output_attentions, deterministic, stats_special_mask, stats)
    y = nn.Dense(cfg.intermediate_size, kernel_init=_init(cfg), **_dense_kw(cfg), dtype=dtype,
                 name="intermediate")(h)
    y = sites.visit("ffn_act", activation(cfg.hidden_act)(y))
    y = nn.Dense(cfg.hidden_size, kernel_init=_init(cfg), **_dense_kw(cfg), dtype=dtype,
                 name="output")(y)
    y = sites.visit("ffn_out", y)
    y = nn.Dropout(cfg.hidden_dropout_prob)(y, deterministic=deterministic)
    y = _layer_norm(cfg, "LayerNorm")(h + y)
    if sites.layer_mask is not None:  # 0 skips the block: its output is its input
      y = mix(y, x if sites.rows is None else take_rows(x, sites.rows), 1 - sites.layer_mask)
    return sites.visit("out", y), maps


# Heads ----------------------------------------------------------------------


class Pooler(nn.Module):
  """tanh(W h_[CLS] + b)."""

  config: BertConfig

  @nn.compact
  def __call__(self, hidden):
    cfg = self.config
    x = hidden[:, 0]
    x = nn.Dense(cfg.hidden_size, kernel_init=_init(cfg), **_dense_kw(cfg),
                 dtype=compute_dtype(cfg),
                 name="dense")(x)
    return jnp.tanh(x)


class MLMHead(nn.Module):
  """Transform (dense H->E, activation, LayerNorm) then the decoder tied to the word embeddings."""

  config: BertConfig
  act: str | None = None  # None: the config's hidden_act

  @nn.compact
  def __call__(self, hidden, word_embeddings):
    cfg = self.config
    dtype = compute_dtype(cfg)
    x = nn.Dense(cfg.embed_dim, kernel_init=_init(cfg), **_dense_kw(cfg), dtype=dtype,
                 name="dense")(hidden)
    x = activation(self.act or cfg.hidden_act)(x)
    x = _layer_norm(cfg, "LayerNorm")(x)
    bias = self.param("bias", nn.initializers.zeros, (cfg.vocab_size,))
    logits = jnp.einsum("...e,ve->...v", x, word_embeddings.astype(dtype))
    return logits.astype(accum_dtype(cfg)) + bias


class Classifier(nn.Module):
  """Dropout then a linear layer; with `pre_act`, dropout, dense, activation first.

  One linear layer: BERT's NSP, SOP, sequence and token classifiers. The two-layer
  form is RoBERTa's (tanh), ELECTRA's (GELU) and DistilBERT's (ReLU) classifier.
  """

  config: BertConfig
  num_outputs: int
  dropout: float = 0.0
  pre_act: str | None = None
  pre_dropout: bool = True  # DistilBERT has no dropout before its first dense

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    cfg = self.config
    dtype = compute_dtype(cfg)
    if self.pre_act is not None:
      if self.pre_dropout:
        x = nn.Dropout(self.dropout)(x, deterministic=deterministic)
      x = nn.Dense(cfg.hidden_size, kernel_init=_init(cfg), **_dense_kw(cfg), dtype=dtype,
                   name="pre")(x)
      x = activation(self.pre_act)(x)
    x = nn.Dropout(self.dropout)(x, deterministic=deterministic)
    x = nn.Dense(self.num_outputs, kernel_init=_init(cfg), **_dense_kw(cfg), dtype=dtype,
                 name="dense")(x)
    return x.astype(accum_dtype(cfg))


class RTDHead(nn.Module):
  """ELECTRA's discriminator: dense, hidden_act, one logit per token (replaced or not)."""

  config: BertConfig

  @nn.compact
  def __call__(self, hidden):
    cfg = self.config
    dtype = compute_dtype(cfg)
    x = nn.Dense(cfg.hidden_size, kernel_init=_init(cfg), **_dense_kw(cfg), dtype=dtype,
                 name="dense")(hidden)
    x = activation(cfg.hidden_act)(x)
    x = nn.Dense(1, kernel_init=_init(cfg), **_dense_kw(cfg), dtype=dtype, name="out")(x)
    return x[..., 0].astype(accum_dtype(cfg))


Params = dict[str, Any]
