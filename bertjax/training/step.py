"""Jitted train steps: pretraining (a weighted sum of objectives) and fine-tuning.

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

from bertjax.model.config import BertConfig
from bertjax.training import objectives as objectives_lib
from bertjax.training.objective_base import Context
from bertjax.training.state import TrainState

TASKS = ("pretrain", "classification", "token_classification")


def _validate(task: str, objective, accumulation_steps: int):
  if task not in TASKS:
    raise ValueError(f"{task=!r} must be one of {TASKS}")
  if not isinstance(accumulation_steps, int) or accumulation_steps < 1:
    raise ValueError(f"{accumulation_steps=} must be a positive int")
  return objectives_lib.resolve(objective, task=task)


def make_loss_and_grad(
  config: BertConfig,
  *,
  task: str = "pretrain",
  objective: str = "nsp",
  accumulation_steps: int = 1,
  deterministic: bool = False,
) -> Callable:
  """`f(params, batch, rng) -> (loss, metrics, grads)` over the accumulated batch (not jitted).

  Args:
    config: the architecture; its `dtype` is the compute dtype.
    task: "pretrain", "classification" or "token_classification".
    objective: for pretraining, "nsp", "sop" or "none" (MLM only), "+"-joined objective
      names ("mlm+sbo"), or `objective_base.Objective` components (see `objectives.resolve`);
      the loss is the sum of their terms, each over its whole-batch count, times its weight.
    accumulation_steps: k; the batch's leading size must be divisible by k.
    deterministic: disable dropout.
  """
  objs = _validate(task, objective, accumulation_steps)
  weights = {name: w for o in objs for name, w in o.weights.items()}
  k = accumulation_steps

  def micro_terms(p, mb, key):
    ctx = Context(p, config, mb, key, deterministic)
    terms = {}
    for o in objs:
      terms.update(o.terms(ctx))
    return terms

  def loss_and_grad(params, batch, rng):
    for o in objs:
      o.check_batch(batch)
    counts = {}
    for o in objs:
      counts.update(o.counts(batch))
    counts = jax.tree.map(lambda c: jnp.maximum(c, 1e-8), counts)
    size = batch["input_ids"].shape[0]
    if size % k:
      raise ValueError(f"batch size {size} is not divisible by accumulation_steps={k}")
    micro = jax.tree.map(lambda a: a.reshape((k, size // k) + a.shape[1:]), batch)

    def micro_loss(p, mb, key):
      terms = micro_terms(p, mb, key)
      # A weight of 1 is not multiplied in, so MLM/NSP/SOP losses stay bitwise as before.
      loss = sum(
        t["loss_sum"] / counts[name] * weights[name]
        if weights[name] != 1.0
        else t["loss_sum"] / counts[name]
        for name, t in terms.items()
      )
      # A term without "correct_sum" (a distance, not a prediction) gets no accuracy.
      sums = {
        name: {
          "loss": t["loss_sum"],
          **({"correct": t["correct_sum"]} if "correct_sum" in t else {}),
        }
        for name, t in terms.items()
      }
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

      zeros = jax.eval_shape(lambda: grad_fn(params, jax.tree.map(lambda a: a[0], micro), keys[0]))
      zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), zeros)
      (loss, sums, grads), _ = jax.lax.scan(
        body, (zeros[0][0], zeros[0][1], zeros[1]), (micro, keys)
      )
    metrics = {"loss": loss}
    for name, s in sums.items():
      metrics[f"{name}_loss"] = s["loss"] / counts[name]
      if "correct" in s:
        metrics[f"{name}_accuracy"] = s["correct"] / counts[name]
    return loss, metrics, grads

  return loss_and_grad


def make_train_step(
  config: BertConfig,
  tx: optax.GradientTransformation,
  schedule: Callable | None = None,
  *,
  task: str = "pretrain",
  objective: str = "nsp",
  accumulation_steps: int = 1,
  deterministic: bool = False,
  state_sharding: Any = None,
  batch_sharding: Any = None,
  donate: bool = False,
) -> Callable:
  """A jitted `step(state, batch) -> (state, metrics)`.

  Args:
    config: the architecture; `config.replace(dtype="bfloat16")` computes in
      bfloat16 while the state's parameters stay float32.
    tx: the optimizer (`optim.make_optimizer`).
    schedule: the learning-rate schedule, only to report "learning_rate".
    task: "pretrain", "classification" or "token_classification".
    objective: for pretraining, what `make_loss_and_grad` takes.
    accumulation_steps: micro-batches per optimizer step.
    deterministic: disable dropout.
    state_sharding: optional pytree of shardings for the state (see `sharding`).
    batch_sharding: optional sharding (or pytree) for the batch.
    donate: donate the input state's buffers.

  Returns:
    The step. Metrics: "loss", "<term>_loss" for each term (mlm, nsp, sop, cls, tok, or
    the configured objectives' terms) and "<term>_accuracy" for each term that counts
    correct predictions (not, e.g., distillation's distances), "grad_norm" (before clipping),
    "learning_rate", "finite" (bool; when False the update is skipped and the state returned
    unchanged, so the caller can stop with the last good state).
  """
  loss_and_grad = make_loss_and_grad(
    config,
    task=task,
    objective=objective,
    accumulation_steps=accumulation_steps,
    deterministic=deterministic,
  )

  def step(state: TrainState, batch: dict):
    rng = jax.random.fold_in(state.rng, state.step)
    loss, metrics, grads = loss_and_grad(state.params, batch, rng)
    grad_norm = optax.global_norm(grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    keep = lambda a, b: jnp.where(finite, a, b)
    new = state.replace(
      step=jnp.where(finite, state.step + 1, state.step),
      params=jax.tree.map(keep, params, state.params),
      opt_state=jax.tree.map(keep, opt_state, state.opt_state),
    )
    metrics["grad_norm"] = grad_norm
    metrics["learning_rate"] = (
      jnp.asarray(schedule(state.step), jnp.float32)
      if schedule is not None
      else jnp.float32(jnp.nan)
    )
    metrics["finite"] = finite
    return new, metrics

  kwargs = {}
  if state_sharding is not None:
    kwargs = {
      "in_shardings": (state_sharding, batch_sharding),
      "out_shardings": (state_sharding, None),
    }
  return jax.jit(step, donate_argnums=(0,) if donate else (), **kwargs)


def make_eval_step(config: BertConfig, *, task: str = "pretrain", objective: str = "nsp"):
  """A jitted `eval(params, batch) -> metrics` without dropout or update."""
  loss_and_grad = make_loss_and_grad(config, task=task, objective=objective, deterministic=True)

  def evaluate(params, batch):
    # Gradients are not needed; XLA removes the backward pass as dead code.
    _, metrics, _ = loss_and_grad(params, batch, jax.random.key(0))
    return metrics

  return jax.jit(evaluate)
