"""The task heads of every family, and what each reads from a forward output.

Each head reads what its Hugging Face class reads: BERT's, ALBERT's and NomicBERT's
classifiers the pooler output; RoBERTa's, ELECTRA's, DistilBERT's and MPNet's the first
token's final state; ModernBERT's and EuroBERT's what `config.classifier_pooling` says (the
first token, the masked mean of the tokens, or EuroBERT's "late" mean of per-token logits);
MLM, RTD and token classifiers every token. Which tensors a head has is the family's row
(`families.Head`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from bertjax.model.config import BertConfig
from bertjax.model.families import HEADS
from bertjax.model.layers import (
  Params,
  accum_dtype,
  activation_of,
  compute_dtype,
  dense_kwargs,
  family_norm,
  normal_init,
)

# `out` arguments are `forward.BertOutput`s (not imported: forward imports this module).
BertOutput = Any


class Pooler(nn.Module):
  """tanh(W h_[CLS] + b)."""

  config: BertConfig

  @nn.compact
  def __call__(self, hidden):
    cfg = self.config
    x = hidden[:, 0]
    x = nn.Dense(
      cfg.hidden_size,
      kernel_init=normal_init(cfg),
      **dense_kwargs(cfg),
      dtype=compute_dtype(cfg),
      name="dense",
    )(x)
    return activation_of(cfg, "tanh")(x)


def head_activation(config: BertConfig, act: str | None) -> str:
  """A head's activation name: its own, the config's classifier_activation, or hidden_act."""
  if act == "classifier":
    return config.classifier_activation or config.hidden_act
  return act or config.hidden_act


class MLMHead(nn.Module):
  """Masked-LM logits: a transform (dense H->E, activation, norm) where the family has one
  (UltraBERT's: dense H->P, activation, dense P->E, activation, no norm), then the decoder:
  the word embeddings (tied) or its own matrix, plus a bias where present.
  """

  config: BertConfig

  @nn.compact
  def __call__(self, hidden, word_embeddings):
    cfg = self.config
    spec = cfg.family.heads["mlm"]
    dtype = compute_dtype(cfg)
    x = hidden
    dense = lambda width, name: nn.Dense(
      width,
      use_bias=spec.has_tensor(cfg, (name, "bias")),
      kernel_init=normal_init(cfg),
      **dense_kwargs(cfg),
      dtype=dtype,
      name=name,
    )
    act = activation_of(cfg, head_activation(cfg, spec.act))
    if spec.has("dense"):
      x = act(dense(getattr(cfg, spec.width) if spec.width else cfg.embed_dim, "dense")(x))
    if spec.has("dense2"):
      x = act(dense(cfg.embed_dim, "dense2")(x))
    if spec.has("LayerNorm"):
      x = family_norm(
        cfg, "LayerNorm", kind="layernorm", use_bias=spec.has_tensor(cfg, ("LayerNorm", "bias"))
      )(x)
    if spec.has_tensor(cfg, ("decoder",)):
      decoder = self.param("decoder", normal_init(cfg), (cfg.embed_dim, cfg.vocab_size))
      logits = jnp.einsum("...e,ev->...v", x, decoder.astype(dtype))
    else:
      logits = jnp.einsum("...e,ve->...v", x, word_embeddings.astype(dtype))
    logits = logits.astype(accum_dtype(cfg))
    if spec.has_tensor(cfg, ("bias",)):
      logits = logits + self.param("bias", nn.initializers.zeros, (cfg.vocab_size,))
    return logits


class Classifier(nn.Module):
  """Dropout then a linear layer; a two-layer head first runs dense, activation (and norm).

  One linear layer: BERT's NSP, SOP, sequence and token classifiers. The two-layer
  form is RoBERTa's and MPNet's (tanh), ELECTRA's and EuroBERT's (GELU), DistilBERT's
  (ReLU) classifier and ModernBERT's prediction head (dense, activation, norm).
  """

  config: BertConfig
  num_outputs: int
  dropout: float = 0.0
  spec: Any = None  # the family's `Head`; None: one linear layer

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    cfg = self.config
    spec = self.spec
    dtype = compute_dtype(cfg)
    if spec is not None and spec.has("pre"):
      if spec.pre_dropout:
        x = nn.Dropout(self.dropout)(x, deterministic=deterministic)
      x = nn.Dense(
        cfg.hidden_size,
        use_bias=spec.has_tensor(cfg, ("pre", "bias")),
        kernel_init=normal_init(cfg),
        **dense_kwargs(cfg),
        dtype=dtype,
        name="pre",
      )(x)
      x = activation_of(cfg, head_activation(cfg, spec.act))(x)
      if spec.has("norm"):
        x = family_norm(
          cfg, "norm", kind="layernorm", use_bias=spec.has_tensor(cfg, ("norm", "bias"))
        )(x)
    x = nn.Dropout(self.dropout)(x, deterministic=deterministic)
    x = nn.Dense(
      self.num_outputs, kernel_init=normal_init(cfg), **dense_kwargs(cfg), dtype=dtype, name="dense"
    )(x)
    return x.astype(accum_dtype(cfg))


class RTDHead(nn.Module):
  """A discriminator: dense, hidden_act, one logit per token (replaced or not): ELECTRA's.
  DeBERTa-v3's first adds the first token's state to every token and normalises,
  `LayerNorm(h + h_0)` (its released `LMMaskPredictionHead`), where the family's head has a
  "norm"."""

  config: BertConfig

  @nn.compact
  def __call__(self, hidden):
    cfg = self.config
    dtype = compute_dtype(cfg)
    if cfg.family.heads["rtd"].has("norm"):
      hidden = family_norm(cfg, "norm", kind="layernorm")(hidden + hidden[..., :1, :])
    x = nn.Dense(
      cfg.hidden_size, kernel_init=normal_init(cfg), **dense_kwargs(cfg), dtype=dtype, name="dense"
    )(hidden)
    x = activation_of(cfg, cfg.hidden_act)(x)
    x = nn.Dense(1, kernel_init=normal_init(cfg), **dense_kwargs(cfg), dtype=dtype, name="out")(x)
    return x[..., 0].astype(accum_dtype(cfg))


def head_module(config: BertConfig, head: str):
  """The flax module of `head` ("mlm", "rtd", "nsp" or one of the family's task heads)
  for `config`, with the dropout its family spec names."""
  spec = config.family.heads[head]
  if head == "mlm":
    return MLMHead(config)
  if head == "rtd":
    return RTDHead(config)
  if head == "nsp":
    return Classifier(config, 2, 0.0)
  dropout = {
    "classifier": config.classifier_dropout,
    "hidden": config.hidden_dropout_prob,
    "none": 0.0,
  }[spec.dropout]
  # Hugging Face sizes ALBERT's SOP head by num_labels too (2 in every released model).
  return Classifier(config, config.num_labels, dropout, spec)


def pool(params: Params, config: BertConfig, last_hidden_state) -> jax.Array | None:
  """The pooler output (batch, hidden), or None for a model without a pooler."""
  if "pooler" not in params:
    return None
  return Pooler(config).apply({"params": params["pooler"]}, last_hidden_state)


def _head_params(params: Params, head: str) -> Params:
  if head not in params:
    present = [h for h in HEADS if h in params]
    raise ValueError(f"these parameters have no {head!r} head; heads present: {present}")
  return params[head]


def _apply_head(
  head: str,
  params: Params,
  config: BertConfig,
  x,
  deterministic: bool = True,
  rng: jax.Array | None = None,
) -> jax.Array:
  head_reads(config, head)  # a head the family has
  rngs = None if deterministic else {"dropout": rng}
  module = head_module(config, head)
  if head == "mlm":
    word = params["embeddings"]["word_embeddings"]["embedding"]
    return module.apply({"params": _head_params(params, head)}, x, word)
  if head == "rtd":
    return module.apply({"params": _head_params(params, head)}, x)
  return module.apply(
    {"params": _head_params(params, head)}, x, deterministic=deterministic, rngs=rngs
  )


def head_reads(config: BertConfig, head: str) -> str:
  """What `head` reads: "pooled", "first", "tokens", "mean" or "late" (the family's head,
  with `config.classifier_pooling` deciding where the family pools by config)."""
  if head not in config.family.heads:
    raise ValueError(
      f"a {config.model_type} model has no {head!r} head; its heads are "
      f"{tuple(config.family.heads)}"
    )
  reads = config.family.heads[head].reads
  if reads == "pooling":
    return {"cls": "first", "bos": "first"}.get(
      config.classifier_pooling, config.classifier_pooling
    )
  return reads


def head_input(config: BertConfig, out: BertOutput, head: str, attention_mask=None) -> jax.Array:
  """What `head` reads from a forward output: the pooler output, the first token, the
  masked mean of the tokens ("mean" pooling; `attention_mask` None means all real), or all
  tokens (token heads, and "late" pooling, whose logits are averaged afterwards)."""
  reads = head_reads(config, head)
  if reads == "pooled":
    if out.pooler_output is None:
      raise ValueError(f"the {head!r} head reads the pooler output, and this model has no pooler")
    return out.pooler_output
  if reads == "first":
    return out.last_hidden_state[:, 0]
  if reads == "mean":
    return masked_mean(out.last_hidden_state, attention_mask)
  return out.last_hidden_state


def masked_mean(x, attention_mask=None):
  """The mean of x (B, T, ...) over the real positions of each sequence (as transformers'
  mean pooling: `sum(x * mask) / sum(mask)`)."""
  if attention_mask is None:
    return x.mean(1)
  m = jnp.asarray(attention_mask).astype(x.dtype).reshape(x.shape[:2] + (1,) * (x.ndim - 2))
  return (x * m).sum(1) / m.sum(1)


def head_logits(
  params: Params,
  config: BertConfig,
  out: BertOutput,
  head: str,
  *,
  attention_mask=None,
  deterministic: bool = True,
  rng: jax.Array | None = None,
) -> jax.Array:
  """A task head's logits from `forward`'s output, for any family.

  Each head reads what its Hugging Face class reads: BERT's, ALBERT's and NomicBERT's
  classifiers the pooler output; RoBERTa's, ELECTRA's, DistilBERT's and MPNet's the first
  token's final state; ModernBERT's and EuroBERT's what `config.classifier_pooling` says
  (the first token, the masked mean of the tokens, or, EuroBERT's "late", the masked mean of
  per-token logits); MLM, RTD and token classifiers every token.

  Args:
    params: parameters with the head.
    config: the architecture.
    out: `forward`'s output.
    head: "mlm" (B, T, vocab), "nsp" (B, 2), "sop" (B, num_labels), "rtd" (B, T),
      "classifier" (B, num_labels) or "token_classifier" (B, T, num_labels).
    attention_mask: (B, T), for "mean" and "late" pooling (None: every position is real).
    deterministic, rng: dropout inside the head (training).

  Returns:
    The logits.
  """
  logits = _apply_head(
    head, params, config, head_input(config, out, head, attention_mask), deterministic, rng
  )
  if head_reads(config, head) == "late":
    logits = masked_mean(logits, attention_mask)
  return logits


def mlm_logits(params: Params, config: BertConfig, hidden) -> jax.Array:
  """Masked-LM logits (..., vocab) from hidden states (..., hidden); decoder tied to embeddings.

  Pass only the gathered masked positions (batch, predictions, hidden) to avoid
  a full-vocabulary projection of every token.
  """
  return _apply_head("mlm", params, config, hidden)


def rtd_logits(params: Params, config: BertConfig, hidden) -> jax.Array:
  """Replaced-token-detection logits (B, T) from hidden states (B, T, hidden); > 0 = replaced
  (ELECTRA's head, or DeBERTa-v3's, which also reads the first token's state)."""
  return _apply_head("rtd", params, config, hidden)


def nsp_logits(params: Params, config: BertConfig, pooled) -> jax.Array:
  """Next-sentence-prediction logits (batch, 2) from the pooler output; 0 = is next."""
  return _apply_head("nsp", params, config, pooled)


def sop_logits(
  params: Params,
  config: BertConfig,
  pooled,
  *,
  deterministic: bool = True,
  rng: jax.Array | None = None,
) -> jax.Array:
  """ALBERT sentence-order-prediction logits (batch, 2) from the pooler output."""
  return _apply_head("sop", params, config, pooled, deterministic, rng)


def classify(
  params: Params, config: BertConfig, x, *, deterministic: bool = True, rng: jax.Array | None = None
) -> jax.Array:
  """Sequence-classification logits from what the family's head reads.

  `x` is the pooler output for BERT and ALBERT and the first token's final state
  for RoBERTa, XLM-R, ELECTRA and DistilBERT (`head_input(config, out,
  "classifier")` gives the right one; `head_logits` does both steps, and also the
  averaging of EuroBERT's "late" pooling, where `x` is every token and the result
  (batch, seq, num_labels)).
  """
  return _apply_head("classifier", params, config, x, deterministic, rng)


def token_classify(
  params: Params,
  config: BertConfig,
  hidden,
  *,
  deterministic: bool = True,
  rng: jax.Array | None = None,
) -> jax.Array:
  """Token-classification logits (batch, seq, num_labels) from the last hidden state."""
  return _apply_head("token_classifier", params, config, hidden, deterministic, rng)
