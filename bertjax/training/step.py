"""Jitted train steps for pretraining (MLM + NSP/SOP or MLM only) and fine-tuning.

A step takes the whole optimizer batch (global batch size `k * b`) and splits it
into `k = accumulation_steps` micro-batches run under `lax.scan`. Each loss term
is a sum over examples divided by the count of the *whole* batch (computed from
the batch before the forward passes), so the accumulated gradient equals the
gradient of one large batch. Compute runs in `config.dtype` (e.g. bfloat16);
parameters and optimizer state stay float32. A step whose loss or gradient is
not finite leaves the state unchanged and reports `finite = False`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from bertjax.config import BertConfig
from bertjax.functional import forward, head_logits, nsp_logits, sop_logits, token_classify
from bertjax.training import losses
from bertjax.training.state import TrainState

TASKS = ("pretrain", "classification", "token_classification")
_LABEL_KEYS = {"nsp": "next_sentence_labels", "sop": "sop_labels"}


def _terms(params, config: BertConfig, batch: dict, rng, task: str, objective: str,
           deterministic: bool) -> dict[str, dict[str, jax.Array]]:
  """Summed loss terms of one micro-batch, keyed by term name."""
  k_fwd, k_head = jax.random.split(rng)
  out = forward(params, config, batch["input_ids"], batch["attention_mask"],
                batch["token_type_ids"], deterministic=deterministic, rng=k_fwd)
  if task == "pretrain":
    terms = {"mlm": losses.mlm_loss_terms(params, config, out.last_hidden_state,
                                          batch["mlm_positions"], batch["mlm_ids"],
                                          batch["mlm_weights"])}
    if objective == "nsp":
      terms["nsp"] = losses.sentence_loss_terms(
          nsp_logits(params, config, out.pooler_output), batch["next_sentence_labels"])
    elif objective == "sop":
      logits = sop_logits(params, config, out.pooler_output, deterministic=deterministic,
                          rng=k_head)
      terms["sop"] = losses.sentence_loss_terms(logits, batch["sop_labels"])
    return terms
  if task == "classification":
    logits = head_logits(params, config, out, "classifier", deterministic=deterministic,
                         rng=k_head)
    return {"cls": losses.classification_loss_terms(logits, batch["labels"])}
  logits = token_classify(params, config, out.last_hidden_state, deterministic=deterministic,
                          rng=k_head)
  return {"tok": losses.token_classification_loss_terms(logits, batch["labels"])}


def _counts(batch: dict, task: str, objective: str) -> dict[str, jax.Array]:
  """Denominators of each term over the whole (accumulated) batch."""
  n = jnp.asarray(batch["input_ids"].shape[0], jnp.float32)
  if task == "pretrain":
    counts = {"mlm": jnp.sum(batch["mlm_weights"].astype(jnp.float32))}
    if objective in _LABEL_KEYS:
      counts[objective] = n
    return counts
  if task == "classification":
    return {"cls": n}
  return {"tok": jnp.sum((batch["labels"] != losses.IGNORE_INDEX).astype(jnp.float32))}


def _validate(task: str, objective: str, accumulation_steps: int):
  if task not in TASKS:
    raise ValueError(f"{task=!r} must be one of {TASKS}")
  if task == "pretrain" and objective not in ("nsp", "sop", "none"):
    raise ValueError(f"{objective=!r} must be one of ('nsp', 'sop', 'none')")
  if not isinstance(accumulation_steps, int) or accumulation_steps < 1:
    raise ValueError(f"{accumulation_steps=} must be a positive int")


def make_loss_and_grad(config: BertConfig, *, task: str = "pretrain", objective: str = "nsp",
                       accumulation_steps: int = 1, deterministic: bool = False) -> Callable:
  """`f(params, batch, rng) -> (loss, metrics, grads)` over the accumulated batch (not jitted).

  Args:
    config: the architecture; its `dtype` is the compute dtype.
    task: "pretrain", "classification" or "token_classification".
    objective: for pretraining, "nsp", "sop" or "none" (MLM only).
    accumulation_steps: k; the batch's leading size must be divisible by k.
    deterministic: disable dropout.
  """
  _validate(task, objective, accumulation_steps)
  k = accumulation_steps

  def loss_and_grad(params, batch, rng):
    counts = jax.tree.map(lambda c: jnp.maximum(c, 1e-8), _counts(batch, task, objective))
    size = batch["input_ids"].shape[0]
    if size % k:
      raise ValueError(f"batch size {size} is not divisible by accumulation_steps={k}")
    micro = jax.tree.map(lambda a: a.reshape((k, size // k) + a.shape[1:]), batch)

    def micro_loss(p, mb, key):
      terms = _terms(p, config, mb, key, task, objective, deterministic)
      loss = sum(t["loss_sum"] / counts[name] for name, t in terms.items())
      sums = {name: {"loss": t["loss_sum"], "correct": t["correct_sum"]}
              for name, t in terms.items()}
      return loss, sums

    grad_fn = jax.value_and_grad(micro_loss, has_aux=True)
    if k == 1:
      (loss, sums), grads = grad_fn(params, batch, rng)
    else:
      keys = jax.random.split(rng, k)

      def body(carry, xs):
        mb, key = xs
        (l, s), g = grad_fn(params, mb, key)
        return jax.tree.map(jnp.add, carry, (l, s, g)), None

      zeros = jax.eval_shape(lambda: grad_fn(params, jax.tree.map(lambda a: a[0], micro),
                                             keys[0]))
      zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), zeros)
      (loss, sums, grads), _ = jax.lax.scan(body, (zeros[0][0], zeros[0][1], zeros[1]),
                                            (micro, keys))
    metrics = {"loss": loss}
    for name, s in sums.items():
      metrics[f"{name}_loss"] = s["loss"] / counts[name]
      metrics[f"{name}_accuracy"] = s["correct"] / counts[name]
    return loss, metrics, grads

  return loss_and_grad


def make_train_step(config: BertConfig, tx: optax.GradientTransformation,
                    schedule: Callable | None = None, *, task: str = "pretrain",
                    objective: str = "nsp", accumulation_steps: int = 1,
                    deterministic: bool = False, state_sharding: Any = None,
                    batch_sharding: Any = None, donate: bool = False) -> Callable:
  """A jitted `step(state, batch) -> (state, metrics)`.

  Args:
    config: the architecture; `config.replace(dtype="bfloat16")` computes in
      bfloat16 while the state's parameters stay float32.
    tx: the optimizer (`optim.make_optimizer`).
    schedule: the learning-rate schedule, only to report "learning_rate".
    task: "pretrain", "classification" or "token_classification".
    objective: for pretraining, "nsp", "sop" or "none".
    accumulation_steps: micro-batches per optimizer step.
    deterministic: disable dropout.
    state_sharding: optional pytree of shardings for the state (see `sharding`).
    batch_sharding: optional sharding (or pytree) for the batch.
    donate: donate the input state's buffers.

  Returns:
    The step. Metrics: "loss", "<term>_loss" and "<term>_accuracy" for each
    term (mlm, nsp, sop, cls, tok), "grad_norm" (before clipping),
    "learning_rate", "finite" (bool; when False the update is skipped and the state returned
    unchanged, so the caller can stop with the last good state).
  """
  loss_and_grad = make_loss_and_grad(config, task=task, objective=objective,
                                     accumulation_steps=accumulation_steps,
                                     deterministic=deterministic)

  def step(state: TrainState, batch: dict):
    rng = jax.random.fold_in(state.rng, state.step)
    loss, metrics, grads = loss_and_grad(state.params, batch, rng)
    grad_norm = optax.global_norm(grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    keep = lambda a, b: jnp.where(finite, a, b)
    new = state.replace(step=jnp.where(finite, state.step + 1, state.step),
                        params=jax.tree.map(keep, params, state.params),
                        opt_state=jax.tree.map(keep, opt_state, state.opt_state))
    metrics["grad_norm"] = grad_norm
    metrics["learning_rate"] = (jnp.asarray(schedule(state.step), jnp.float32)
                                if schedule is not None else jnp.float32(jnp.nan))
    metrics["finite"] = finite
    return new, metrics

  kwargs = {}
  if state_sharding is not None:
    kwargs = dict(in_shardings=(state_sharding, batch_sharding),
                  out_shardings=(state_sharding, None))
  return jax.jit(step, donate_argnums=(0,) if donate else (), **kwargs)


def make_eval_step(config: BertConfig, *, task: str = "pretrain", objective: str = "nsp"):
  """A jitted `eval(params, batch) -> metrics` without dropout or update."""
  loss_and_grad = make_loss_and_grad(config, task=task, objective=objective, deterministic=True)

  def evaluate(params, batch):
    # Gradients are not needed; XLA removes the backward pass as dead code.
    _, metrics, _ = loss_and_grad(params, batch, jax.random.key(0))
    return metrics

  return jax.jit(evaluate)
