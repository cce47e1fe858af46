"""Flax modules of the BERT/ALBERT encoder and its task heads.

Modules here compute one piece each; `functional.py` composes them into a
model whose layer parameters are stacked on a leading axis and run under
`lax.scan`. Attention goes through `kernels.attention`, so the same layer runs
on the reference einsum or the fused Pallas kernel.

Parameter layout of one encoder layer (shapes for hidden H, heads N, head dim D,
intermediate I); per-head axes are explicit so that head masks, pruning and
effective attention index heads directly:

  attention/query/kernel (H, N, D)   attention/query/bias (N, D)   (key, value alike)
  attention/output/kernel (N, D, H)  attention/output/bias (H,)
  attention/LayerNorm/{scale,bias} (H,)
  intermediate/kernel (H, I)   output/kernel (I, H)   LayerNorm/{scale,bias} (H,)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

import kernels
from bertjax.config import BertConfig


def activation(name: str):
  """The activation function a Hugging Face `hidden_act` names."""
  if name == "gelu":
    return lambda x: jax.nn.gelu(x, approximate=False)
  if name in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
    return lambda x: jax.nn.gelu(x, approximate=True)
  if name == "relu":
    return jax.nn.relu
  if name in ("silu", "swish"):
    return jax.nn.silu
  if name == "tanh":
    return jnp.tanh
  raise ValueError(f"hidden_act={name!r} is not supported")


def compute_dtype(config: BertConfig):
  """Matmul dtype; parameters stay float32 (master weights) whatever it is."""
  return {"bfloat16": jnp.bfloat16, "float32": jnp.float32, "float64": jnp.float64}[config.dtype]


def accum_dtype(config: BertConfig):
  """Embedding sums and logits: float32, or float64 in float64 mode."""
  return jnp.promote_types(compute_dtype(config), jnp.float32)


def _init(config: BertConfig):
  return nn.initializers.normal(stddev=config.initializer_range)


def _layer_norm(config: BertConfig, name: str) -> nn.LayerNorm:
  # Statistics in float32 whatever the compute dtype (Flax promotes them).
  return nn.LayerNorm(epsilon=config.layer_norm_eps, dtype=compute_dtype(config), name=name)


class Embeddings(nn.Module):
  """Word + token-type + position embeddings, LayerNorm, dropout, and E->H projection."""

  config: BertConfig

  @nn.compact
  def __call__(self, input_ids, token_type_ids, deterministic: bool = True):
    cfg = self.config
    dtype = compute_dtype(cfg)
    embed = lambda n, name: nn.Embed(n, cfg.embed_dim, embedding_init=_init(cfg),
                                     dtype=accum_dtype(cfg), name=name)
    seq_len = input_ids.shape[1]
    # Same summation order as Hugging Face: (word + type) + position.
    x = embed(cfg.vocab_size, "word_embeddings")(input_ids)  # (B, T, E)
    x = x + embed(cfg.type_vocab_size, "token_type_embeddings")(token_type_ids)
    x = x + embed(cfg.max_position_embeddings, "position_embeddings")(jnp.arange(seq_len))[None]
    x = _layer_norm(cfg, "LayerNorm")(x.astype(dtype))
    x = nn.Dropout(cfg.hidden_dropout_prob)(x, deterministic=deterministic)
    if cfg.has_embedding_projection:
      x = nn.Dense(cfg.hidden_size, kernel_init=_init(cfg), dtype=dtype, name="projection")(x)
    return x  # (B, T, H)


class SelfAttention(nn.Module):
  """Multi-head self-attention with its output projection, residual and LayerNorm.

  `num_heads` below `config.num_attention_heads` is a physically pruned layer.
  """

  config: BertConfig
  num_heads: int | None = None

  @nn.compact
  def __call__(self, x, key_mask, kv_lengths, head_mask, head_ablation: str,
               output_attentions: bool, deterministic: bool, output_stats: bool = False,
               special_mask=None):
    cfg = self.config
    dtype = compute_dtype(cfg)
    n = cfg.num_attention_heads if self.num_heads is None else self.num_heads
    d = cfg.head_dim
    proj = lambda name: nn.DenseGeneral((n, d), kernel_init=_init(cfg), dtype=dtype, name=name)
    q, k, v = proj("query")(x), proj("key")(x), proj("value")(x)  # (B, T, N, D)

    attention_dropout = cfg.attention_probs_dropout_prob > 0 and not deterministic
    if n == 0:  # every head pruned: the block adds only the output bias
      out, probs = q, jnp.zeros(x.shape[:1] + (0,) + x.shape[1:2] * 2, jnp.float32)
    elif output_stats:
      # Per-head statistics instead of maps ("probs" carries them): computed inside
      # the fused kernel when the config selects it, from the maps otherwise.
      impl = "xla" if cfg.attention_impl in ("xla", "cudnn") else cfg.attention_impl
      lengths = dict(key_mask=key_mask) if impl == "xla" else dict(kv_lengths=kv_lengths)
      out, probs = kernels.attention_with_stats(
          q, k, v, head_mask=head_mask, ablation=head_ablation, special_mask=special_mask,
          impl=impl, **lengths)
    elif attention_dropout or output_attentions:
      # Maps are needed (returned, or dropped out as BERT does): reference path.
      out, probs = kernels.attention(
          q, k, v, key_mask=key_mask, head_mask=head_mask, ablation=head_ablation,
          impl="xla", return_probs=True)
      if attention_dropout:
        dropped = nn.Dropout(cfg.attention_probs_dropout_prob)(probs, deterministic=False)
        out = jnp.einsum("bnqk,bknd->bqnd", dropped.astype(v.dtype), v)
    else:
      probs = None
      if cfg.attention_impl in ("xla",):
        out = kernels.attention(q, k, v, key_mask=key_mask, head_mask=head_mask,
                                ablation=head_ablation, impl="xla")
      else:
        # Fused kernels take right padding as per-sequence lengths.
        out = kernels.attention(q, k, v, kv_lengths=kv_lengths, head_mask=head_mask,
                                ablation=head_ablation, impl=cfg.attention_impl)
    out = out.astype(dtype)
    y = nn.DenseGeneral(cfg.hidden_size, axis=(-2, -1), kernel_init=_init(cfg), dtype=dtype,
                        name="output")(out)  # (B, T, H)
    y = nn.Dropout(cfg.hidden_dropout_prob)(y, deterministic=deterministic)
    y = _layer_norm(cfg, "LayerNorm")(x + y)
    return y, probs


class EncoderLayer(nn.Module):
  """One post-LN transformer block: attention, then the feed-forward network."""

  config: BertConfig
  num_heads: int | None = None

  @nn.compact
  def __call__(self, x, key_mask, kv_lengths, head_mask=None, head_ablation: str = "scale",
               output_attentions: bool = False, deterministic: bool = True,
               output_stats: bool = False, special_mask=None):
    cfg = self.config
    dtype = compute_dtype(cfg)
    h, probs = SelfAttention(cfg, self.num_heads, name="attention")(
        x, key_mask, kv_lengths, head_mask, head_ablation, output_attentions, deterministic,
        output_stats, special_mask)
    y = nn.Dense(cfg.intermediate_size, kernel_init=_init(cfg), dtype=dtype,
                 name="intermediate")(h)
    y = activation(cfg.hidden_act)(y)
    y = nn.Dense(cfg.hidden_size, kernel_init=_init(cfg), dtype=dtype, name="output")(y)
    y = nn.Dropout(cfg.hidden_dropout_prob)(y, deterministic=deterministic)
    return _layer_norm(cfg, "LayerNorm")(h + y), probs


class Pooler(nn.Module):
  """tanh(W h_[CLS] + b)."""

  config: BertConfig

  @nn.compact
  def __call__(self, hidden):
    cfg = self.config
    x = hidden[:, 0]
    x = nn.Dense(cfg.hidden_size, kernel_init=_init(cfg), dtype=compute_dtype(cfg),
                 name="dense")(x)
    return jnp.tanh(x)


class MLMHead(nn.Module):
  """Transform (dense H->E, activation, LayerNorm) then the decoder tied to the word embeddings."""

  config: BertConfig

  @nn.compact
  def __call__(self, hidden, word_embeddings):
    cfg = self.config
    dtype = compute_dtype(cfg)
    x = nn.Dense(cfg.embed_dim, kernel_init=_init(cfg), dtype=dtype, name="dense")(hidden)
    x = activation(cfg.hidden_act)(x)
    x = _layer_norm(cfg, "LayerNorm")(x)
    bias = self.param("bias", nn.initializers.zeros, (cfg.vocab_size,))
    logits = jnp.einsum("...e,ve->...v", x, word_embeddings.astype(dtype))
    return logits.astype(accum_dtype(cfg)) + bias


class Classifier(nn.Module):
  """Dropout then a linear layer: NSP, SOP, sequence and token classification heads."""

  config: BertConfig
  num_outputs: int
  dropout: float = 0.0

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    cfg = self.config
    x = nn.Dropout(self.dropout)(x, deterministic=deterministic)
    x = nn.Dense(self.num_outputs, kernel_init=_init(cfg), dtype=compute_dtype(cfg),
                 name="dense")(x)
    return x.astype(accum_dtype(cfg))
