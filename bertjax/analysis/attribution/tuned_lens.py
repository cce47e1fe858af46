"""The tuned lens for masked LMs (Belrose et al. 2023), beside the logit lens.

Belrose, Furman, Smith, Halawi, Ostrovsky, McKinney, Biderman & Steinhardt 2023, "Eliciting
Latent Predictions from Transformers with the Tuned Lens". The logit lens
(`attribution.logit_lens`) reads an intermediate state with the model's own output head; the
tuned lens first maps it with one affine translator per layer, trained so that the head's
distribution matches the final layer's. Conventions of the released code
(`AlignmentResearch/tuned-lens`):

- the translator is residual, `h + h A_l + b_l`, zero-initialised (`TunedLens.transform_hidden`;
  an untrained lens is the logit lens, and weight decay pulls towards the identity);
- there is one per layer below the last: the embedding output and blocks 1 .. L-1's outputs
  (`hidden_states[:-1]`);
- the loss is `KL(final || lens)`, `sum_v p_final (log p_final - log p_lens)`, averaged over
  tokens (its `LossChoice.KL` with no token shift, the default for KL), here over real
  tokens only, summed over the layers (each translator gets its own layer's gradient);
- SGD with Nesterov momentum 0.9, learning rate `lr_scale * (1 - momentum)` decaying linearly
  to 0, weight decay 1e-3 added to the gradient (torch SGD's), 250 steps: `OptimizerConfig`'s
  defaults.

The head is the model's MLM head (`bertjax.mlm_logits`: transform, LayerNorm, tied decoder),
so the lens needs a checkpoint with one (`*ForMaskedLM`, `*ForPreTraining`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax import timing
from bertjax.analysis.batching import as_batch
from bertjax.model.config import BertConfig
from bertjax.model.forward import forward
from bertjax.model.heads import mlm_logits

Params = dict[str, Any]


class TunedLens(NamedTuple):
  """One translator per layer below the last: `h + h @ weight[l] + bias[l]`.

  Attributes:
    weight: (depth, hidden, hidden); layer 0 reads the embedding output, layer l the output
      of block l (counted from 1).
    bias: (depth, hidden).
  """

  weight: jax.Array
  bias: jax.Array


def init(config: BertConfig) -> TunedLens:
  """The zero translators: the logit lens."""
  h = config.hidden_size
  return TunedLens(
    jnp.zeros((config.depth, h, h), jnp.float32), jnp.zeros((config.depth, h), jnp.float32)
  )


def _check(params: Params, config: BertConfig) -> None:
  if "mlm" not in params or "mlm" not in config.family.heads:
    raise ValueError(
      "the tuned lens reads states with the MLM head; these parameters have "
      "none (load a *ForMaskedLM / *ForPreTraining checkpoint or "
      "init(..., heads=('mlm',)))"
    )


def _states(params, config, b):
  """(depth, B, T, H) the lens's inputs and (B, T, H) the last block's output."""
  out = forward(
    params,
    config,
    b["input_ids"],
    b["attention_mask"],
    b["token_type_ids"],
    capture=("embeddings", "out"),
  )
  states = jnp.concatenate([out.cache["embeddings"][None], out.cache["out"][:-1]])
  return states.astype(jnp.float32), out.cache["out"][-1].astype(jnp.float32)


def translate(lens: TunedLens, states) -> jax.Array:
  """Each layer's states (depth, ..., H) through its translator."""
  lead = states.shape[1:-1]
  flat = states.reshape(states.shape[0], -1, states.shape[-1])
  moved = flat + jnp.einsum("lnh,lhk->lnk", flat, lens.weight) + lens.bias[:, None, :]
  return moved.reshape(states.shape[:1] + lead + states.shape[-1:])


def _kl_terms(params, config, lens: TunedLens | None, states, final, mask):
  """(depth,) mean over real tokens of KL(final || lens) (the logit lens where lens is None)."""
  target = jax.nn.log_softmax(mlm_logits(params, config, final).astype(jnp.float32), -1)
  moved = states if lens is None else translate(lens, states)
  w = mask.astype(jnp.float32)

  def layer_kl(h):
    logp = jax.nn.log_softmax(mlm_logits(params, config, h).astype(jnp.float32), -1)
    kl = jnp.sum(jnp.exp(target) * (target - logp), -1)  # (B, T)
    return jnp.sum(kl * w) / jnp.maximum(w.sum(), 1)

  return jax.lax.map(layer_kl, moved)


@functools.partial(jax.jit, static_argnums=(1,))
def _evaluate_batch(params, config, lens, b):
  states, final = _states(params, config, b)
  return (
    _kl_terms(params, config, lens, states, final, b["attention_mask"]),
    _kl_terms(params, config, None, states, final, b["attention_mask"]),
    b["attention_mask"].sum(),
  )


def evaluate(params: Params, config: BertConfig, lens: TunedLens, batches) -> dict:
  """Per-layer KL(final || lens) in nats on `batches`, tuned and logit lens.

  Returns:
    "tuned" and "logit": (depth,) lists, layer 0 the embedding output; "tokens": the real
    tokens averaged over; "per_batch": each batch's {"tokens": (n,), "tuned", "logit":
    (n, depth)} lists (what an interval over the batches resamples).
  """
  _check(params, config)
  per = {"tokens": [], "tuned": [], "logit": []}
  for b in batches:
    t, lg, n = _evaluate_batch(params, config, lens, as_batch(b))
    per["tokens"].append(int(n))
    per["tuned"].append(np.asarray(t, np.float64).tolist())
    per["logit"].append(np.asarray(lg, np.float64).tolist())
  tokens = np.asarray(per["tokens"], np.float64)
  if not tokens.sum():
    raise ValueError("the batches have no real tokens")
  mean = lambda k: (tokens @ np.asarray(per[k]) / tokens.sum()).tolist()
  return {
    "tuned": mean("tuned"),
    "logit": mean("logit"),
    "tokens": int(tokens.sum()),
    "per_batch": per,
  }


def optimizer(
  steps: int, lr_scale: float = 1.0, momentum: float = 0.9, weight_decay: float = 1e-3
) -> optax.GradientTransformation:
  """The released code's SGD: Nesterov momentum, `lr_scale * (1 - momentum)` decaying
  linearly to 0 over `steps`, weight decay added to the gradient."""
  schedule = optax.linear_schedule(lr_scale * (1 - momentum), 0.0, steps)
  return optax.chain(
    optax.add_decayed_weights(weight_decay), optax.sgd(schedule, momentum=momentum, nesterov=True)
  )


def train(
  params: Params,
  config: BertConfig,
  batches: Sequence,
  *,
  steps: int = 250,
  lr_scale: float = 1.0,
  momentum: float = 0.9,
  weight_decay: float = 1e-3,
  lens: TunedLens | None = None,
  progress: bool = False,
) -> tuple[TunedLens, list]:
  """Trains every translator on `batches` (cycled, one batch a step).

  Args:
    params, config: a model with an MLM head (frozen).
    batches: dicts or `bertjax.Batch`es (input_ids, attention_mask, token_type_ids).
    steps: optimiser steps.
    lr_scale, momentum, weight_decay: the optimiser's (`optimizer`).
    lens: where to start (default: `init(config)`, the logit lens).
    progress: a progress bar.

  Returns:
    `(lens, log)`: log holds the summed training loss of each step.
  """
  _check(params, config)
  if steps < 1 or not batches:
    raise ValueError(f"steps={steps} must be >= 1 and batches must not be empty")
  batches = [as_batch(b) for b in batches]
  opt = optimizer(steps, lr_scale, momentum, weight_decay)
  lens = init(config) if lens is None else lens
  state = opt.init(lens)

  @jax.jit
  def step(lens, state, b):
    states, final = _states(params, config, b)
    loss, grads = jax.value_and_grad(
      lambda ln: _kl_terms(params, config, ln, states, final, b["attention_mask"]).sum()
    )(lens)
    updates, state = opt.update(grads, state, lens)
    return optax.apply_updates(lens, updates), state, loss

  log = []
  for i in timing.steps(
    steps, "tuned lens", show=progress, postfix=lambda: {"loss": f"{log[-1]:.3f}"}
  ):
    lens, state, loss = step(lens, state, batches[i % len(batches)])
    log.append(float(loss))
  return lens, log
