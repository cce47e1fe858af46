"""SpanBERT's span boundary objective and StructBERT's word-order objective, as components.

* `SpanBoundary` ("sbo"; Joshi et al. 2020): every token x_i of a masked span
  (s, e) is predicted from the final states of the two boundary tokens x_{s-1},
  x_{e+1} and a relative position embedding p_{i-s}:
  ``h = LayerNorm(GELU(W1 [x_{s-1}; x_{e+1}; p] + b1))``,
  ``y = LayerNorm(GELU(W2 h + b2))``, logits ``y E^T + bias`` with E the (tied) word
  embeddings, cross-entropy against the original token; summed with MLM as in the
  paper. Needs span masking (`PretrainingConfig(masking="span")`), whose batches
  carry ``span_left`` / ``span_right``; the head's parameters live in ``params["sbo"]``.
* `WordOrder` ("word_order"; Wang et al. 2020, StructBERT): trigrams of unmasked tokens
  are shuffled (`data.pretraining.WordOrderIterator`) and the model reconstructs the
  original order by predicting, at each shuffled position, the token that was there
  (softmax over the vocabulary through the MLM head, as the paper's word objective).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from bertjax.model.config import BertConfig
from bertjax.training import losses
from bertjax.training.objective_base import Context, Objective


def init_sbo_params(config: BertConfig, rng: jax.Array, max_positions: int = 32) -> dict:
  """Fresh span-boundary head parameters (normal(0, initializer_range) weights, zero biases).

  Returns:
    ``{"position_embeddings" (max_positions, H), "dense1": {"kernel" (3H, H), "bias"},
    "ln1": {"scale", "bias"}, "dense2": {"kernel" (H, E), "bias"}, "ln2": {...},
    "bias" (V,)}``, E the embedding width.
  """
  h, e = config.hidden_size, config.embed_dim
  k = jax.random.split(rng, 3)
  std = config.initializer_range
  normal = lambda key, shape: std * jax.random.normal(key, shape, jnp.float32)
  return {
    "position_embeddings": normal(k[0], (max_positions, h)),
    "dense1": {"kernel": normal(k[1], (3 * h, h)), "bias": jnp.zeros(h)},
    "ln1": {"scale": jnp.ones(h), "bias": jnp.zeros(h)},
    "dense2": {"kernel": normal(k[2], (h, e)), "bias": jnp.zeros(e)},
    "ln2": {"scale": jnp.ones(e), "bias": jnp.zeros(e)},
    "bias": jnp.zeros(config.vocab_size),
  }


def _layer_norm(x, p, eps):
  mean = jnp.mean(x, -1, keepdims=True)
  var = jnp.mean(jnp.square(x - mean), -1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(var + eps) * p["scale"] + p["bias"]


def sbo_logits(
  sbo: dict,
  word_embeddings: jax.Array,
  config: BertConfig,
  hidden: jax.Array,
  positions: jax.Array,
  left: jax.Array,
  right: jax.Array,
) -> jax.Array:
  """Span-boundary logits for the masked positions.

  Args:
    sbo: the head's parameters (`init_sbo_params`).
    word_embeddings: (V, E) the tied output embeddings.
    config: the architecture (``layer_norm_eps``).
    hidden: (B, T, H) last hidden state.
    positions: int (B, P) masked positions.
    left, right: int (B, P) their span boundaries (``span_left``, ``span_right``).

  Returns:
    (B, P, V) float32 logits. Relative positions past the table's end use its last row.
  """
  hidden = hidden.astype(jnp.float32)
  table = sbo["position_embeddings"]
  rel = jnp.clip(positions - left - 1, 0, table.shape[0] - 1)  # (B, P)
  x = jnp.concatenate(
    [losses.gather_positions(hidden, left), losses.gather_positions(hidden, right), table[rel]], -1
  )  # (B, P, 3H)
  gelu = lambda v: jax.nn.gelu(v, approximate=False)
  eps = config.layer_norm_eps
  h = _layer_norm(gelu(x @ sbo["dense1"]["kernel"] + sbo["dense1"]["bias"]), sbo["ln1"], eps)
  y = _layer_norm(gelu(h @ sbo["dense2"]["kernel"] + sbo["dense2"]["bias"]), sbo["ln2"], eps)
  return y @ word_embeddings.astype(jnp.float32).T + sbo["bias"]  # (B, P, V)


def _ce(logits, ids, weights):
  weights = weights.astype(jnp.float32)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, ids.astype(jnp.int32))
  correct = (jnp.argmax(logits, -1) == ids).astype(jnp.float32)
  return {"loss_sum": jnp.sum(ce * weights), "correct_sum": jnp.sum(correct * weights)}


@dataclasses.dataclass(frozen=True)
class SpanBoundary(Objective):
  """SpanBERT's span boundary objective (see the module docstring); its own ``sbo`` params.

  Attributes:
    max_positions: rows of the relative position table (longest span, in tokens).
  """

  name: str = "sbo"
  max_positions: int = 32

  @property
  def fields(self):
    """The MLM fields and each masked token's span boundaries (`span_left`, `span_right`)."""
    return ("mlm_positions", "mlm_ids", "mlm_weights", "span_left", "span_right")

  def counts(self, batch):
    """The masked tokens (the sum of `mlm_weights`)."""
    return {self.name: jnp.sum(batch["mlm_weights"].astype(jnp.float32))}

  def init_params(self, config, rng):
    """The `sbo` head: its relative position table (`max_positions` rows) and MLP."""
    return {"sbo": init_sbo_params(config, rng, self.max_positions)}

  def terms(self, ctx: Context):
    """The cross-entropy and correct predictions of each masked token from its span's
    boundary states and relative position (the decoder shares the word embeddings)."""
    b = ctx.batch
    if "sbo" not in ctx.params:
      raise ValueError(
        "the span boundary objective needs params['sbo'] "
        "(objectives.init_objective_params or span_objectives.init_sbo_params)"
      )
    word = ctx.params["embeddings"]["word_embeddings"]["embedding"]
    logits = sbo_logits(
      ctx.params["sbo"],
      word,
      ctx.config,
      ctx.out.last_hidden_state,
      b["mlm_positions"],
      b["span_left"],
      b["span_right"],
    )
    return {self.name: _ce(logits, b["mlm_ids"], b["mlm_weights"])}


@dataclasses.dataclass(frozen=True)
class WordOrder(Objective):
  """StructBERT's word objective: the original token at each shuffled trigram position."""

  name: str = "word_order"

  @property
  def heads(self):
    """The MLM head, which predicts the original tokens."""
    return ("mlm",)

  @property
  def fields(self):
    """The shuffled positions, their original ids and their weights."""
    return ("word_order_positions", "word_order_ids", "word_order_weights")

  def counts(self, batch):
    """The shuffled tokens (the sum of `word_order_weights`)."""
    return {self.name: jnp.sum(batch["word_order_weights"].astype(jnp.float32))}

  def terms(self, ctx: Context):
    """The MLM head's cross-entropy and correct predictions at the shuffled positions."""
    b = ctx.batch
    t = losses.mlm_loss_terms(
      ctx.params,
      ctx.config,
      ctx.out.last_hidden_state,
      b["word_order_positions"],
      b["word_order_ids"],
      b["word_order_weights"],
    )
    return {self.name: t}
