"""Flax modules of the encoder block (every family): norms, embeddings, attention, the FFN.

Modules here compute one piece each; `bertjax.model.forward` composes them into a
model whose layer parameters are stacked on a leading axis and run under
`lax.scan`. Attention goes through `kernels.attention`, so the same layer runs
on the reference einsum or the fused Pallas kernel.

The block reads its family's row (`bertjax.model.families`), never `model_type`: norm placement
(post-LN `LN(x + f(x))`, or pre-LN `x + f(LN(x))`), LayerNorm or RMSNorm, biases, rotary
q/k, a relative-position bias, grouped key/value heads, a dense or gated FFN. What differs
per layer (the sliding window, the rotary theta, ModernBERT's missing first attention norm)
is indexed by the block's scanned index, so there is one layer and one scan.

Every internal of a block passes through `Sites.visit` (`bertjax.model.sites`), which
captures, patches and masks it.

Parameter layout of one encoder layer (shapes for hidden H, heads N, key/value heads G,
head dim D, intermediate I; biases where the family and config have them); per-head axes are
explicit so that head masks, pruning and effective attention index heads directly:

  attention/query/kernel (H, N, D)   attention/query/bias (N, D)
  attention/key/kernel (H, G, D)     attention/value/kernel (H, G, D)   (biases (G, D))
  attention/output/kernel (N, D, H)  attention/output/bias (H,)
  attention/LayerNorm/{scale,bias} (H,)   the attention sublayer's norm (after it, post-LN;
                                          before it, pre-LN)
  intermediate/kernel (H, I)   gate/kernel (H, I) (gated FFN: act(x Wg) * (x W1))
  output/kernel (I, H)         LayerNorm/{scale,bias} (H,)   the FFN sublayer's norm
  attention/{q_norm,k_norm}/scale (D,)   QK-norm (Gemma 3)
  attention/post_LayerNorm/scale (H,)    post_LayerNorm/scale (H,)   sandwich blocks (Gemma 3):
                                         the norms of the sublayers' outputs
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from bertjax import kernels
from bertjax.model.config import BertConfig
from bertjax.model.sites import SCORE_SITES, Sites, mix, take_rows
from bertjax.quantize import int8_dot_general

Params = dict[str, Any]


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


# Relevance rules as backward passes, in gradient x input form: the forward values are
# unchanged, and `x * grad` at any input is its relevance. Used where `config.relevance_rules`
# is "attnlrp" (Achtibat et al. 2024) or "cp-lrp" (Ali et al. 2022); `bertjax.analysis.attribution.lrp`.


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def divide_gradient(x, factor: float):
  """`x` itself; its backward pass divides the incoming gradient by `factor`: the uniform rule
  on the output of a product of two inputs (each gets half of the relevance)."""
  return x


def _divide_fwd(x, factor):
  return x, None


def _divide_bwd(factor, _, g):
  return (g / factor,)


divide_gradient.defvjp(_divide_fwd, _divide_bwd)


def identity_rule(fn):
  """`fn` (element-wise) whose backward pass multiplies by `fn(x) / x` instead of `fn'(x)`: the
  identity rule, which hands an activation's relevance to its input unchanged (0 where x is
  0, where `fn(x) * grad` is what the rule conserves)."""

  @jax.custom_vjp
  def rule(x):
    return fn(x)

  def fwd(x):
    y = fn(x)
    return y, jnp.where(x == 0, 0, y / jnp.where(x == 0, 1, x)).astype(x.dtype)

  def bwd(ratio, g):
    return (g * ratio,)

  rule.defvjp(fwd, bwd)
  return rule


def relevance_rules(config: BertConfig) -> bool:
  """Whether the backward pass follows relevance rules (either set) instead of the gradient."""
  return config.relevance_rules is not None


def activation_of(config: BertConfig, name: str):
  """The activation `name` in `config`'s backward rules (the identity rule under either)."""
  fn = activation(name)
  return identity_rule(fn) if relevance_rules(config) else fn


def compute_dtype(config: BertConfig):
  """Matmul dtype; parameters stay float32 (master weights) whatever it is.

  Raises:
    ValueError: for "float64" without 64-bit JAX, which would compute in float32.
  """
  if config.dtype == "float64" and not jax.config.jax_enable_x64:
    raise ValueError(
      "config.dtype='float64' needs 64-bit JAX: call "
      "jax.config.update('jax_enable_x64', True) first (without it JAX "
      "computes in float32)"
    )
  return {"bfloat16": jnp.bfloat16, "float32": jnp.float32, "float64": jnp.float64}[config.dtype]


def accum_dtype(config: BertConfig):
  """Embedding sums and logits: float32, or float64 in float64 mode."""
  return jnp.promote_types(compute_dtype(config), jnp.float32)


def normal_init(config: BertConfig):
  """The family's weight initialiser: normal with standard deviation `initializer_range`."""
  return nn.initializers.normal(stddev=config.initializer_range)


def float32_sum_dot_general(
  lhs: jax.Array, rhs: jax.Array, dimension_numbers, precision=None, preferred_element_type=None
) -> jax.Array:
  """`jax.lax.dot_general` summing in float32, its result in the inputs' dtype (or
  `preferred_element_type`): a drop-in `dot_general` for `flax.linen.Dense`/`DenseGeneral`.

  bfloat16 compute (`config.dtype="bfloat16"`) multiplies through it. The sums are float32, as
  on a GPU's tensor cores and in PyTorch's bfloat16 autocast, and the product is the form that
  XLA:CPU's YNNPACK dot fusions take (bfloat16 x bfloat16 -> float32): a bfloat16 -> bfloat16
  product it turns into a float32 one, so a bfloat16 forward ran no faster than float32 (BERT-
  base 8 x 128 on a 2-core Intel Xeon with AMX: 771 ms against 713 ms). Summed in float32 and
  compiled with `bertjax.xla_options.BF16_CPU_OPTIONS`, it runs in 267 ms
  (`benchmarks/results/bench_gemm.md`).
  """
  out = jax.lax.dot_general(
    lhs, rhs, dimension_numbers, precision=precision, preferred_element_type=jnp.float32
  )
  return out.astype(preferred_element_type or jnp.result_type(lhs, rhs))


def dense_kwargs(config: BertConfig) -> dict:
  """Extra `nn.Dense`/`nn.DenseGeneral` arguments: the int8 matmul when `config.quantize`;
  with bfloat16 compute, products summed in float32 (`float32_sum_dot_general`)."""
  if config.quantize == "int8":
    return {"dot_general": int8_dot_general}
  if config.dtype == "bfloat16":
    return {"dot_general": float32_sum_dot_general}
  return {}


class Norm(nn.Module):
  """LayerNorm or RMSNorm over the last axis, with parameters "scale" (and "bias").

  Statistics in at least float32; LayerNorm's variance in two passes (`mean((x - mean)^2)`,
  as PyTorch); RMSNorm `x * rsqrt(mean(x^2) + eps) * scale` (T5, Llama, EuroBERT). On the
  CPU the row sums are matrix-vector products with a column of ones, not reductions:
  XLA:CPU lowers a row reduction to a windowed tree reduction plus a second pass (1024 x
  768 float32 on the 2-core AMD EPYC: 0.68 ms this way vs 1.37 ms for `nn.LayerNorm`), and
  the YNNPACK reduce fusions bertjax enables for attention (`bertjax.xla_options`) make
  BERT-base's LayerNorms slower at batch 32 x 128 (forward 1.18x XLA's time with
  reductions, 0.94x with these products). Other backends keep the reductions, which they
  fuse well.
  """

  epsilon: float
  dtype: Any
  kind: str = "layernorm"
  use_bias: bool = True
  # The identity rule of AttnLRP: the 1 / std (1 / rms) factor is a constant in the backward
  # pass, so the norm is linear there.
  detach_scale: bool = False
  # Gemma's norms multiply by `1 + scale` (`Family.norm_offset`), their weights initialised to 0.
  offset: float = 0.0

  @nn.compact
  def __call__(self, x):
    n = x.shape[-1]
    init = nn.initializers.zeros if self.offset else nn.initializers.ones
    scale = self.param("scale", init, (n,))
    acc = jnp.promote_types(x.dtype, jnp.float32)
    if self.offset:
      scale = self.offset + scale.astype(acc)
    x = x.astype(acc)
    if jax.default_backend() == "cpu":
      ones = jnp.ones((n, 1), acc)
      row_mean = lambda a: (a @ ones) / n  # (..., 1)
    else:
      row_mean = lambda a: a.mean(-1, keepdims=True)
    detach = jax.lax.stop_gradient if self.detach_scale else lambda a: a
    if self.kind == "rmsnorm":
      y = x * detach(jax.lax.rsqrt(row_mean(x * x) + self.epsilon)) * scale.astype(acc)
    else:
      centred = x - row_mean(x)
      y = (
        centred
        * detach(jax.lax.rsqrt(row_mean(centred * centred) + self.epsilon))
        * scale.astype(acc)
      )
    if self.use_bias:
      y = y + self.param("bias", nn.initializers.zeros, (n,)).astype(acc)
    return y.astype(self.dtype)


LayerNorm = Norm  # the BERT families' norm


def family_norm(
  config: BertConfig, name: str, kind: str | None = None, use_bias: bool | None = None
) -> Norm:
  """The family's norm (its kind, offset, `config.norm_bias`) under `name`."""
  return Norm(
    epsilon=config.layer_norm_eps,
    dtype=compute_dtype(config),
    kind=kind or config.family.norm_kind,
    use_bias=config.norm_bias if use_bias is None else use_bias,
    detach_scale=relevance_rules(config),
    offset=config.family.norm_offset,
    name=name,
  )


def sinusoidal_table(positions: int, dim: int) -> np.ndarray:
  """DistilBERT's fixed table: sin on even, cos on odd columns of pos / 10000^(2(j//2)/dim)."""
  angle = np.arange(positions)[:, None] / np.power(10000, 2 * (np.arange(dim) // 2) / dim)[None]
  table = np.empty((positions, dim), np.float32)
  table[:, 0::2] = np.sin(angle[:, 0::2])
  table[:, 1::2] = np.cos(angle[:, 1::2])
  return table


def position_ids(config: BertConfig, input_ids, positions=None):
  """(B, T) position ids: 0.. (BERT); RoBERTa counts real tokens from pad_token_id + 1.

  `positions` (B, T): each token's position in its own sequence (packed rows), instead of
  its column; RoBERTa's ids are then `pad_token_id + 1 + positions`, as in a padded batch.
  """
  if positions is not None:
    offset = config.pad_token_id + 1 if config.family.positions == "after_padding" else 0
    return jnp.asarray(positions) + offset
  if config.family.positions == "after_padding":
    # As transformers' create_position_ids_from_input_ids: padding is input_ids == pad.
    real = (input_ids != config.pad_token_id).astype(jnp.int32)
    return jnp.cumsum(real, axis=1) * real + config.pad_token_id
  return jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)


# Rotary positions ------------------------------------------------------------


def rotary_inv_freq(config: BertConfig) -> np.ndarray | None:
  """(depth, head_dim / 2) float32 inverse frequencies of each block, or None (no rotary).

  `1 / theta^(2i / head_dim)` computed in float32 as transformers' default rope.
  """
  thetas = config.layer_rope_thetas
  if thetas is None:
    return None
  exponent = np.arange(0, config.head_dim, 2, dtype=np.float32) / np.float32(config.head_dim)
  return np.stack([(1.0 / (np.float32(t) ** exponent)).astype(np.float32) for t in thetas])


def rotate(x, inv_freq, positions, layout: str = "halves"):
  """x (B, T, N, D) rotated at `positions` ((T,) or (B, T)), `f = position * inv_freq`.

  "halves" (transformers' layout): `x cos + rotate_half(x) sin` with `cos, sin` of
  `cat(f, f)`. "pairs" (NeoBERT's complex product): dimensions 2i and 2i + 1 turn by `f_i`,
  `x cos + (-x_{2i+1}, x_{2i}) sin` with `cos, sin` of `f` repeated pairwise."""
  freqs = jnp.asarray(positions, jnp.float32)[..., None] * inv_freq  # (.., T, D/2)
  if layout == "pairs":
    emb = jnp.repeat(freqs, 2, axis=-1)
  else:
    emb = jnp.concatenate([freqs, freqs], -1)
  cos, sin = jnp.cos(emb), jnp.sin(emb)
  if cos.ndim == 2:
    cos, sin = cos[None], sin[None]
  cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # (1 | B, T, 1, D)
  acc = jnp.promote_types(x.dtype, jnp.float32)
  xa = x.astype(acc)
  if layout == "pairs":
    rotated = jnp.stack([-xa[..., 1::2], xa[..., 0::2]], -1).reshape(xa.shape)
  else:
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-xa[..., half:], xa[..., :half]], -1)
  return (xa * cos + rotated * sin).astype(x.dtype)


def word_scale(config: BertConfig) -> np.float32:
  """The factor on the word vectors as the embedding sum adds them: `sqrt(hidden_size)`
  rounded to float32, as transformers' Gemma (`Family.embedding_scale`); 1 elsewhere."""
  return np.float32(np.sqrt(config.hidden_size) if config.family.embedding_scale else 1.0)


class Embeddings(nn.Module):
  """Word (+ token-type) (+ position) embeddings, norm, dropout, and E->H projection.

  Which parts exist is the family's row: token types (`Family.token_types`), a position
  table for absolute positions (none for rotary families), a norm (`Family.embedding_names`
  has "norm"; ModernBERT's without bias, EuroBERT has none).
  """

  config: BertConfig

  @nn.compact
  def __call__(
    self, input_ids, token_type_ids, deterministic: bool = True, positions=None, offset=None
  ):
    cfg = self.config
    fam = cfg.family
    dtype = compute_dtype(cfg)
    embed = lambda n, name, init=None: nn.Embed(
      n, cfg.embed_dim, embedding_init=init or normal_init(cfg), dtype=accum_dtype(cfg), name=name
    )
    # Same summation order as Hugging Face: (word + type) + position.
    x = embed(cfg.vocab_size, "word_embeddings")(input_ids)  # (B, T, E)
    if fam.embedding_scale:  # Gemma
      x = x * word_scale(cfg).astype(x.dtype)
    if cfg.type_vocab_size:
      x = x + embed(cfg.type_vocab_size, "token_type_embeddings")(token_type_ids)
    if cfg.position_table is not None:
      if cfg.position_table == "sinusoidal":
        fixed = lambda *_: jnp.asarray(sinusoidal_table(cfg.max_position_embeddings, cfg.embed_dim))
        table = embed(cfg.max_position_embeddings, "position_embeddings", fixed)
        x = x + jax.lax.stop_gradient(table(position_ids(cfg, input_ids, positions)))  # fixed
      else:
        x = x + embed(cfg.max_position_embeddings, "position_embeddings")(
          position_ids(cfg, input_ids, positions)
        )
    if offset is not None:  # (B, T, E) added to the sum: its gradient is the sum's
      x = x + offset
    x = x.astype(dtype)
    project = lambda x: nn.Dense(
      cfg.hidden_size,
      use_bias=fam.projection_bias,
      kernel_init=normal_init(cfg),
      **dense_kwargs(cfg),
      dtype=dtype,
      name="projection",
    )(x)
    if cfg.has_embedding_projection and fam.project_before_norm:  # DeBERTa: E -> H, then norm
      x = project(x)
    if "norm" in fam.embedding_names:
      x = family_norm(cfg, "LayerNorm", kind="layernorm")(x)
    x = nn.Dropout(cfg.hidden_dropout_prob)(x, deterministic=deterministic)
    if cfg.has_embedding_projection and not fam.project_before_norm:  # ALBERT, ELECTRA
      x = project(x)
    return x  # (B, T, H)


def final_norm_module(config: BertConfig) -> Norm | None:
  """The norm after the last block of a pre-LN family (`params["encoder"]["LayerNorm"]`)."""
  return family_norm(config, "LayerNorm") if config.family.final_norm else None


def _mix_values(probs, v):
  """`probs @ v`: (B, N, Tq, Tk) and values (B, Tk, G, D) -> (B, Tq, N, D), heads first
  inside (the layout XLA:CPU is fast with); grouped values are never repeated."""
  batch, heads, seq_q, _ = probs.shape
  groups = v.shape[2]
  vh = jnp.swapaxes(v.astype(probs.dtype), 1, 2)  # (B, G, Tk, D)
  if groups == heads:
    out = jnp.einsum("bnqk,bnkd->bnqd", probs, vh)
  else:
    grouped = probs.reshape(batch, groups, heads // groups, seq_q, -1)
    out = jnp.einsum("bgrqk,bgkd->bgrqd", grouped, vh).reshape(batch, heads, seq_q, -1)
  return jnp.swapaxes(out, 1, 2)


class SelfAttention(nn.Module):
  """The attention sublayer: its norm (before or after, per the family), multi-head
  attention, the output projection and the residual.

  `num_heads` below `config.num_attention_heads` is a physically pruned layer. `layer`
  is the block's index in [0, depth) (traced under the layer scan): it picks the block's
  window and rotary frequencies. `bias_table` is the relative-position bias table shared by
  every block (MPNet), or None. Returns `(mid, maps)`: maps are the attention Hugging Face
  reports (after the head mask) when `output_attentions`, the per-head statistics in stats
  mode, else None.
  """

  config: BertConfig
  num_heads: int | None = None

  @nn.compact
  def __call__(
    self,
    x,
    key_mask,
    sites: Sites,
    output_attentions: bool = False,
    deterministic: bool = True,
    stats_special_mask=None,
    stats: bool = False,
    layer=0,
    bias_table=None,
  ):
    cfg = self.config
    fam = cfg.family
    dtype = compute_dtype(cfg)
    n = cfg.num_attention_heads if self.num_heads is None else self.num_heads
    d = cfg.head_dim
    proj = lambda heads, name: nn.DenseGeneral(
      (heads, d),
      use_bias=cfg.attention_bias,
      kernel_init=normal_init(cfg),
      **dense_kwargs(cfg),
      dtype=dtype,
      name=name,
    )
    norm = family_norm(cfg, "LayerNorm")
    q_proj, k_proj = proj(n, "query"), None
    a_in = x
    if fam.pre_norm:
      a_in = norm(x)
      if not fam.first_attn_norm:  # block 0 reads the (already normed) embeddings
        a_in = jnp.where(jnp.asarray(layer) == 0, x, a_in)
    a_in = sites.visit("attn_in", a_in)
    # At chosen rows, queries (and all that follows) come from those positions only; padded
    # rows among them give zeros, as at full length (where the kernels see Tq == Tk).
    x_q, q_in, real = x, a_in, None
    if sites.rows is not None:
      x_q, q_in = take_rows(x, sites.rows), take_rows(a_in, sites.rows)  # (B, R, H)
      real = take_rows(key_mask, sites.rows)  # (B, R)
    q = q_proj(q_in)  # (B, T | R, N, D)
    kv = cfg.kv_heads if self.num_heads is None else n  # (pruning excludes grouped heads)
    k_proj = proj(kv, "key")
    k = k_proj(a_in)  # (B, T, G, D)
    v = proj(kv, "value")(a_in)
    if fam.qk_norm:  # each head's query and key normed over its width, before rotary
      q, k = family_norm(cfg, "q_norm")(q), family_norm(cfg, "k_norm")(k)
    if fam.positions == "rotary":
      inv_freq = jnp.asarray(rotary_inv_freq(cfg))[layer]  # this block's theta
      seq = jnp.arange(x.shape[1]) if sites.packing is None else sites.packing.positions
      layout = fam.rotary_layout
      q = rotate(q, inv_freq, seq if sites.rows is None else sites.rows, layout)
      k = rotate(k, inv_freq, seq, layout)
    q, k, v = sites.visit("q", q), sites.visit("k", k), sites.visit("v", v)
    if cfg.relevance_rules == "attnlrp":  # the uniform rule on the product q k^T
      q, k = divide_gradient(q, 2.0), divide_gradient(k, 2.0)
    elif cfg.relevance_rules == "cp-lrp":  # the attention weights are constants
      q, k = jax.lax.stop_gradient(q), jax.lax.stop_gradient(k)
      bias_table = jax.lax.stop_gradient(bias_table)
    bias = None
    if fam.position_bias == "relative_buckets":
      bias = kernels.PositionBias(
        bias_table[:, :n]
        if self.num_heads is None
        else bias_table[:, np.asarray(sites.kept, np.int32)]
      )
    elif cfg.disentangled_terms:
      bias = _disentangled_bias(
        cfg, bias_table, q_proj, k_proj, proj(n, "pos_key"), proj(n, "pos_query"), deterministic
      )
    dropout = 0.0 if deterministic else cfg.attention_probs_dropout_prob
    map_path = output_attentions or any(sites.needs(s) for s in ("probs",) + SCORE_SITES)
    # Created only where used: a module's name is part of its dropout key (Dropout_0, ...).
    probs_dropout = nn.Dropout(dropout) if dropout and map_path and not stats else None
    seed = None
    if dropout and not (map_path or stats or n == 0):
      # The kernels draw the mask from a counter-based stream keyed by this seed.
      seed = jax.random.bits(self.make_rng("dropout"), (), jnp.uint32)
    head_out, maps = _attention_core(
      cfg,
      q,
      k,
      v,
      key_mask,
      sites,
      layer,
      bias,
      stats,
      stats_special_mask,
      output_attentions,
      probs_dropout,
      seed,
    )
    if cfg.relevance_rules == "attnlrp":  # the uniform rule on the product probs v
      head_out = divide_gradient(head_out, 2.0)
    if real is not None and not map_path:
      head_out = head_out * real[:, :, None, None].astype(head_out.dtype)
    if not stats and sites.head_mask is not None:
      head_out = _per_window(
        attention_windows(cfg),
        jnp.asarray(_window_index(cfg))[layer],
        lambda w: sites.mask_heads(head_out.astype(dtype), v, key_mask, w, sites.rows),
      )
    head_out = sites.visit("head_out", head_out.astype(dtype))
    y = nn.DenseGeneral(
      cfg.hidden_size,
      axis=(-2, -1),
      use_bias=cfg.attention_bias,
      kernel_init=normal_init(cfg),
      **dense_kwargs(cfg),
      dtype=dtype,
      name="output",
    )(head_out)  # (B, T, H)
    if fam.norm == "sandwich":  # attn_out is what the residual adds: the normed output
      y = family_norm(cfg, "post_LayerNorm")(y)
    y = sites.visit("attn_out", y)
    y = nn.Dropout(cfg.hidden_dropout_prob)(y, deterministic=deterministic)
    resid = sites.visit("resid_mid", x_q + y)
    return sites.visit("mid", norm(resid) if fam.norm == "post" else resid), maps


def _attention_core(
  cfg: BertConfig,
  q,
  k,
  v,
  key_mask,
  sites: Sites,
  layer,
  bias,
  stats: bool,
  special_mask,
  output_attentions: bool,
  probs_dropout,
  seed,
):
  """Each head's context (B, T | R, N, D) and the maps (or statistics), on the path the
  request needs: the statistics pass, the map path (maps returned, captured or patched) or
  the config's attention implementation; a window layer's band through `_per_window`."""
  n = q.shape[2]
  per_window = functools.partial(
    _per_window, attention_windows(cfg), jnp.asarray(_window_index(cfg))[layer]
  )
  mask = lambda w: sites.attention_mask(key_mask, w)
  scale = cfg.attention_scale  # None: 1 / sqrt(head_dim)
  if n == 0:  # every head pruned: the block adds only the output bias
    maps = jnp.zeros((q.shape[0], 0, q.shape[1], k.shape[1]), jnp.float32)
    for site in ("probs",) + SCORE_SITES:  # zeros at every (removed) head, as head_out is
      if sites.needs(site):
        sites.visit(site, maps)
    return q, maps
  if stats:
    # Per-head statistics instead of maps, inside the fused kernel when the config selects
    # it; the head mask acts inside the kernel so the statistics see it. cuDNN has no
    # statistics pass: its configs compute them with xla.
    impl = "xla" if cfg.attention_impl == "cudnn" else cfg.attention_impl
    return per_window(
      lambda w: kernels.attention_with_stats(
        q,
        k,
        v,
        mask=mask(w),
        head_mask=sites.head_mask,
        ablation=sites.head_ablation,
        special_mask=special_mask,
        impl=impl,
        bias=bias,
        scale=scale,
      )
    )
  if any(sites.needs(s) for s in SCORE_SITES):
    probs = _probs_from_terms(cfg, q, k, key_mask, sites, bias)
  elif output_attentions or sites.needs("probs"):
    probs = per_window(
      lambda w: kernels.attention_probs(q, k, mask=mask(w), bias=bias, scale=scale)
    )
  if output_attentions or any(sites.needs(s) for s in ("probs",) + SCORE_SITES):
    if sites.rows is not None:  # padded rows among the chosen ones give zeros
      real = take_rows(key_mask, sites.rows)
      probs = probs * real[:, None, :, None].astype(probs.dtype)
    probs = sites.visit("probs", probs)  # (B, N, Tq, T)
    used = probs if probs_dropout is None else probs_dropout(probs, deterministic=False)
    head_out = _mix_values(used, v).astype(compute_dtype(cfg))  # (B, T, N, D)
    maps = per_window(lambda w: sites.mask_maps(probs, key_mask, w)) if output_attentions else None
    return head_out, maps
  extra = (
    {} if seed is None else {"dropout_rate": cfg.attention_probs_dropout_prob, "dropout_seed": seed}
  )
  return per_window(
    lambda w: kernels.attention(
      q, k, v, mask=mask(w), impl=cfg.attention_impl, bias=bias, scale=scale, **extra
    )
  ), None


def _probs_from_terms(cfg: BertConfig, q, k, key_mask, sites: Sites, bias):
  """DeBERTa's attention through its score terms, each a site (B, N, Tq, Tk): the content
  logit `scores_c2c` and the position terms `scores_c2p`, `scores_p2c`, all scaled by
  `1 / sqrt(f d)`; their sum is masked and normalised as `kernels.attention_probs` does
  (padded query rows zero)."""
  acc = accum_dtype(cfg)
  c2c = jnp.einsum("bqhd,bkhd->bhqk", q.astype(acc), k.astype(acc)) * jnp.asarray(
    cfg.attention_scale, acc
  )
  logits = sites.visit("scores_c2c", c2c)
  if bias is not None:
    for term, value in bias.terms(q, k, acc).items():
      logits = logits + sites.visit(f"scores_{term}", value)
  allowed, row_real = sites.attention_mask(key_mask).allowed(*logits.shape[:1], *logits.shape[2:])
  allowed = allowed[:, None]  # (B, 1, Tq, Tk)
  logits = jnp.where(allowed, logits, -jnp.inf)
  row_max = jax.lax.stop_gradient(jnp.max(logits, -1, keepdims=True))
  unnorm = jnp.where(allowed, jnp.exp(logits - jnp.where(jnp.isfinite(row_max), row_max, 0)), 0)
  probs = unnorm / jnp.maximum(unnorm.sum(-1, keepdims=True), jnp.finfo(acc).tiny)
  return probs * row_real[:, None, :, None].astype(acc)


def _disentangled_bias(
  cfg: BertConfig, rel, q_proj, k_proj, pos_key_proj, pos_query_proj, deterministic: bool
) -> kernels.DisentangledBias:
  """DeBERTa's position terms for this block: its projections of the shared relative
  embeddings `rel` (2 s, H) (after their dropout, as transformers' `pos_dropout`): position
  keys for c2p, position queries for p2c, through the content projections with
  `share_att_key`, else the block's own `pos_key` / `pos_query`."""
  rel = nn.Dropout(cfg.hidden_dropout_prob)(rel, deterministic=deterministic)
  rel = rel.astype(compute_dtype(cfg))[None]  # (1, 2 s, H)
  terms = cfg.disentangled_terms
  pos_key = pos_query = None
  if "c2p" in terms:
    pos_key = (k_proj if cfg.share_att_key else pos_key_proj)(rel)[0]  # (2 s, N, D)
  if "p2c" in terms:
    pos_query = (q_proj if cfg.share_att_key else pos_query_proj)(rel)[0]
  return kernels.DisentangledBias(
    pos_key,
    pos_query,
    span=cfg.rel_span,
    buckets=cfg.position_buckets,
    max_position=cfg.rel_max_position,
    scale=cfg.attention_scale,
  )


def relative_embeddings(params: Params, config: BertConfig):
  """The position table every block reads: MPNet's bias table (buckets, heads), DeBERTa's
  relative embeddings (2 s, H) after their norm (`norm_rel_ebd`), or None."""
  enc = params["encoder"]
  if config.family.position_bias == "relative_buckets":
    return enc["relative_attention_bias"]["embedding"]
  if not config.disentangled_terms:
    return None
  rel = enc["rel_embeddings"]["embedding"]
  if config.norm_rel_ebd == "layer_norm":
    norm = Norm(epsilon=config.layer_norm_eps, dtype=accum_dtype(config))
    rel = norm.apply({"params": enc["rel_norm"]}, rel)
  return rel


def attention_windows(config: BertConfig) -> tuple[int | None, ...]:
  """The distinct attention windows of the model's blocks (None: full attention)."""
  return tuple(sorted(set(config.layer_windows), key=lambda w: -1 if w is None else w))


def _window_index(config: BertConfig) -> np.ndarray:
  """(depth,) int32: each block's index into `attention_windows`."""
  windows = attention_windows(config)
  return np.asarray([windows.index(w) for w in config.layer_windows], np.int32)


def _per_window(windows, index, fn):
  """`fn(window)` for this block's window: directly when the model has one kind of layer,
  else a `lax.switch` over the kinds (each branch has its window as a static number, so a
  window layer runs the banded computation and a global layer the full one)."""
  if len(windows) == 1:
    return fn(windows[0])
  return jax.lax.switch(index, [functools.partial(fn, w) for w in windows])


class EncoderLayer(nn.Module):
  """One transformer block: the attention sublayer, then the feed-forward sublayer.

  Post-LN (BERT): `mid = LN(x + attn(x))`, `out = LN(mid + ffn(mid))`. Pre-LN (ModernBERT,
  EuroBERT): `mid = x + attn(LN(x))`, `out = mid + ffn(LN(mid))`. Sandwich (Gemma 3):
  `mid = x + LN'(attn(LN(x)))`, `out = mid + LN'(ffn(LN(mid)))`. The FFN is
  `W2 act(W1 x)` or gated, `W2 (act(Wg x) * W1 x)`.

  With `sites.rows` (B, R) the block runs at those query positions only: keys and
  values come from every position of `x`, every other step (queries, head outputs,
  the output projection, norms, the FFN) from the R rows, and it returns
  (B, R, H), equal to the full block's output at those rows. A caller that reads only
  some positions of the last block (a patching metric) skips the rest of its work.
  """

  config: BertConfig
  num_heads: int | None = None

  @nn.compact
  def __call__(
    self,
    x,
    key_mask,
    sites: Sites | None = None,
    output_attentions: bool = False,
    deterministic: bool = True,
    stats_special_mask=None,
    stats: bool = False,
    layer=0,
    bias_table=None,
  ):
    cfg = self.config
    fam = cfg.family
    dtype = compute_dtype(cfg)
    sites = Sites() if sites is None else sites
    sites.seq_len = x.shape[1]
    h, maps = SelfAttention(cfg, self.num_heads, name="attention")(
      x,
      key_mask,
      sites,
      output_attentions,
      deterministic,
      stats_special_mask,
      stats,
      layer,
      bias_table,
    )
    norm = family_norm(cfg, "LayerNorm")
    dense = lambda n, name: nn.Dense(
      n,
      use_bias=cfg.mlp_bias,
      kernel_init=normal_init(cfg),
      **dense_kwargs(cfg),
      dtype=dtype,
      name=name,
    )
    f_in = sites.visit("ffn_in", norm(h) if fam.pre_norm else h)
    a = dense(cfg.ffn_size, "intermediate")(f_in)
    if fam.ffn == "gated":
      gate = sites.visit(
        "ffn_gate", activation_of(cfg, cfg.hidden_act)(dense(cfg.ffn_size, "gate")(f_in))
      )
      if cfg.relevance_rules == "cp-lrp":  # the gate is a constant
        gate = jax.lax.stop_gradient(gate)
      a = gate * a
      if cfg.relevance_rules == "attnlrp":  # the uniform rule on the gate's product
        a = divide_gradient(a, 2.0)
    else:
      a = activation_of(cfg, cfg.hidden_act)(a)
    a = sites.visit("ffn_act", a)
    if fam.ffn_dropout == "inside":
      a = nn.Dropout(cfg.hidden_dropout_prob)(a, deterministic=deterministic)
    y = dense(cfg.hidden_size, "output")(a)
    if fam.norm == "sandwich":  # ffn_out is what the residual adds: the normed output
      y = family_norm(cfg, "post_LayerNorm")(y)
    y = sites.visit("ffn_out", y)
    if fam.ffn_dropout == "after":
      y = nn.Dropout(cfg.hidden_dropout_prob)(y, deterministic=deterministic)
    y = sites.visit("resid_out", h + y)
    if fam.norm == "post":
      y = norm(y)
    if sites.layer_mask is not None:  # 0 skips the block: its output is its input
      y = mix(y, x if sites.rows is None else take_rows(x, sites.rows), 1 - sites.layer_mask)
    return sites.visit("out", y), maps
