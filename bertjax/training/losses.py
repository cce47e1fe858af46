"""Training losses and accuracy metrics.

Every loss here comes in two forms: the mean (what one calls in a notebook) and,
for the train step, the *sum* over examples together with its count, so that
gradient accumulation over micro-batches can divide by the count of the whole
(accumulated) batch and equal one large batch exactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from bertjax.model.config import BertConfig
from bertjax.model.heads import mlm_logits
from bertjax.model.layers import Params

IGNORE_INDEX = -100


def gather_positions(hidden: jax.Array, positions: jax.Array) -> jax.Array:
  """Hidden states at the given positions.

  Args:
    hidden: (B, T, H).
    positions: int (B, P).

  Returns:
    (B, P, H).
  """
  return jnp.take_along_axis(hidden, positions[..., None].astype(jnp.int32), axis=1)


def mlm_loss_terms(
  params: Params,
  config: BertConfig,
  hidden: jax.Array,
  positions: jax.Array,
  ids: jax.Array,
  weights: jax.Array,
) -> dict[str, jax.Array]:
  """Weighted sums of the masked-LM cross-entropy and of correct predictions.

  Only the gathered positions go through the vocabulary projection.

  Args:
    params: parameters with an "mlm" head.
    config: the architecture.
    hidden: last hidden state (B, T, H).
    positions: int (B, P) masked positions.
    ids: int (B, P) original token ids there.
    weights: (B, P), 1 for real predictions, 0 for padding slots.

  Returns:
    Dict with "loss_sum", "correct_sum" and "count" (sum of weights), float32 scalars.
  """
  ce, correct, weights = _mlm_token_terms(params, config, hidden, positions, ids, weights)
  return {
    "loss_sum": jnp.sum(ce * weights),
    "correct_sum": jnp.sum(correct * weights),
    "count": jnp.sum(weights),
  }


def mlm_sequence_terms(
  params: Params,
  config: BertConfig,
  hidden: jax.Array,
  positions: jax.Array,
  ids: jax.Array,
  weights: jax.Array,
) -> dict[str, jax.Array]:
  """`mlm_loss_terms` per sequence: the same sums, each of one sequence's masked positions,
  for statistics that resample sequences (a held-out loss's bootstrap interval).

  Returns:
    Dict with "loss_sum", "correct_sum" and "count", float32 (B,); their sums over the batch
    are `mlm_loss_terms`' values.
  """
  ce, correct, weights = _mlm_token_terms(params, config, hidden, positions, ids, weights)
  return {
    "loss_sum": jnp.sum(ce * weights, -1),
    "correct_sum": jnp.sum(correct * weights, -1),
    "count": jnp.sum(weights, -1),
  }


def _mlm_token_terms(params, config, hidden, positions, ids, weights):
  """Cross-entropy, correctness and weights at each masked position, float32 (B, P)."""
  logits = mlm_logits(params, config, gather_positions(hidden, positions))  # (B, P, V)
  logits = logits.astype(jnp.float32)
  weights = weights.astype(jnp.float32)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, ids.astype(jnp.int32))
  correct = (jnp.argmax(logits, -1) == ids).astype(jnp.float32)
  return ce, correct, weights


def mlm_loss(
  params: Params,
  config: BertConfig,
  hidden: jax.Array,
  positions: jax.Array,
  ids: jax.Array,
  weights: jax.Array,
) -> tuple[jax.Array, jax.Array]:
  """Masked-LM loss: weighted mean cross-entropy at the masked positions.

  Returns:
    `(loss, accuracy)`, float32 scalars (0 when no weight is positive).
  """
  t = mlm_loss_terms(params, config, hidden, positions, ids, weights)
  count = jnp.maximum(t["count"], 1e-8)
  return t["loss_sum"] / count, t["correct_sum"] / count


def _ce_terms(logits: jax.Array, labels: jax.Array, valid: jax.Array) -> dict[str, jax.Array]:
  logits = logits.astype(jnp.float32)
  valid = valid.astype(jnp.float32)
  safe = jnp.where(valid > 0, labels, 0).astype(jnp.int32)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, safe)
  correct = (jnp.argmax(logits, -1) == safe).astype(jnp.float32)
  return {
    "loss_sum": jnp.sum(ce * valid),
    "correct_sum": jnp.sum(correct * valid),
    "count": jnp.sum(valid),
  }


def sentence_loss_terms(logits: jax.Array, labels: jax.Array) -> dict[str, jax.Array]:
  """Summed cross-entropy for NSP / SOP (or any (B, C) logits with (B,) int labels)."""
  return _ce_terms(logits, labels, jnp.ones(labels.shape, jnp.float32))


def sentence_loss(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
  """NSP / SOP loss: mean cross-entropy of (B, 2) logits; returns `(loss, accuracy)`."""
  t = sentence_loss_terms(logits, labels)
  return t["loss_sum"] / t["count"], t["correct_sum"] / t["count"]


def classification_loss_terms(logits: jax.Array, labels: jax.Array) -> dict[str, jax.Array]:
  """Summed sequence-classification loss: cross-entropy, or squared error if 1 output.

  Args:
    logits: (B, C); C == 1 means regression.
    labels: int (B,) class ids, or float (B,) targets for regression.

  Returns:
    Dict with "loss_sum", "correct_sum" (0 for regression) and "count".
  """
  if logits.shape[-1] == 1:
    err = logits[..., 0].astype(jnp.float32) - labels.astype(jnp.float32)
    return {
      "loss_sum": jnp.sum(err**2),
      "correct_sum": jnp.zeros((), jnp.float32),
      "count": jnp.asarray(labels.shape[0], jnp.float32),
    }
  return _ce_terms(logits, labels, jnp.ones(labels.shape, jnp.float32))


def classification_loss(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Mean sequence-classification loss (cross-entropy; MSE when `logits` has 1 column).

  Returns:
    `(loss, accuracy)`; accuracy is 0 for regression.
  """
  t = classification_loss_terms(logits, labels)
  return t["loss_sum"] / t["count"], t["correct_sum"] / t["count"]


def token_classification_loss_terms(
  logits: jax.Array, labels: jax.Array, ignore_index: int = IGNORE_INDEX
) -> dict[str, jax.Array]:
  """Summed token-classification cross-entropy over labels != `ignore_index`.

  Args:
    logits: (B, T, C).
    labels: int (B, T); `ignore_index` (-100) marks positions without a label.
    ignore_index: the label value to skip.
  """
  return _ce_terms(logits, labels, labels != ignore_index)


def token_classification_loss(
  logits: jax.Array, labels: jax.Array, ignore_index: int = IGNORE_INDEX
) -> tuple[jax.Array, jax.Array]:
  """Mean token-classification loss over labelled tokens; returns `(loss, accuracy)`."""
  t = token_classification_loss_terms(logits, labels, ignore_index)
  count = jnp.maximum(t["count"], 1e-8)
  return t["loss_sum"] / count, t["correct_sum"] / count
