"""Optimizers (AdamW, LAMB), learning-rate schedules and the weight-decay mask.

Gradient accumulation is done in the train step (`bertjax.training.step`), not
with `optax.MultiSteps`: the step sums per-example losses over micro-batches and
divides by the count of the whole batch, so k micro-batches give exactly the
update of one k-times-larger batch, even for MLM whose number of masked tokens
differs between micro-batches.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import optax

OPTIMIZERS = ("adamw", "lamb")
DECAYS = ("linear", "cosine", "constant")

# Leaves whose path contains one of these names get no weight decay.
_NO_DECAY_NAMES = ("bias", "LayerNorm", "layer_norm", "layernorm", "ln")


def learning_rate_schedule(
  peak: float,
  total_steps: int,
  warmup_steps: int = 0,
  decay: str = "linear",
  end_ratio: float = 0.0,
) -> optax.Schedule:
  """Linear warm-up from 0 to `peak`, then linear or cosine decay to `end_ratio * peak`.

  Args:
    peak: the learning rate at the end of warm-up.
    total_steps: the step at which decay ends (the schedule stays at its end after).
    warmup_steps: steps of linear warm-up (lr(0) = 0, lr(warmup_steps) = peak).
    decay: "linear", "cosine" or "constant".
    end_ratio: final learning rate as a fraction of `peak`.

  Returns:
    An optax schedule: step -> learning rate.
  """
  if decay not in DECAYS:
    raise ValueError(f"{decay=!r} must be one of {DECAYS}")
  if total_steps < 1:
    raise ValueError(f"{total_steps=} must be >= 1")
  if not 0 <= warmup_steps <= total_steps:
    raise ValueError(f"{warmup_steps=} must be in [0, {total_steps=}]")
  if peak < 0:
    raise ValueError(f"learning rate {peak=} must be >= 0")
  end = peak * end_ratio
  decay_steps = max(total_steps - warmup_steps, 1)
  if decay == "linear":
    main = optax.linear_schedule(peak, end, decay_steps)
  elif decay == "cosine":
    main = optax.cosine_decay_schedule(peak, decay_steps, alpha=end_ratio)
  else:
    main = optax.constant_schedule(peak)
  if warmup_steps == 0:
    return main
  warm = optax.linear_schedule(0.0, peak, warmup_steps)
  return optax.join_schedules([warm, main], [warmup_steps])


def _path_names(path) -> list[str]:
  return [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]


def decay_mask(params: Any) -> Any:
  """A pytree of bools like `params`: True where weight decay applies.

  Biases and LayerNorm parameters (scale and bias) get False; everything else
  (kernels, embeddings) True.
  """

  def keep(path, _):
    return not any(n in _NO_DECAY_NAMES for n in _path_names(path))

  return jax.tree_util.tree_map_with_path(keep, params)


def make_optimizer(
  name: str = "adamw",
  learning_rate: float | optax.Schedule = 1e-4,
  *,
  weight_decay: float = 0.01,
  clip_norm: float | None = 1.0,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-6,
) -> optax.GradientTransformation:
  """AdamW or LAMB with global-norm clipping and no decay on biases / LayerNorm.

  Args:
    name: "adamw" or "lamb".
    learning_rate: a float or a schedule (see `learning_rate_schedule`).
    weight_decay: decoupled weight decay (masked by `decay_mask`).
    clip_norm: clip gradients to this global norm first; None or 0 disables.
    b1, b2, eps: Adam moments' decay rates and epsilon.

  Returns:
    The optax transformation.
  """
  if name not in OPTIMIZERS:
    raise ValueError(f"optimizer {name=!r} must be one of {OPTIMIZERS}")
  if weight_decay < 0:
    raise ValueError(f"{weight_decay=} must be >= 0")
  if clip_norm is not None and clip_norm < 0:
    raise ValueError(f"{clip_norm=} must be >= 0 or None")
  if name == "adamw":
    opt = optax.adamw(
      learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=decay_mask
    )
  else:
    opt = optax.lamb(
      learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=decay_mask
    )
  if clip_norm:
    return optax.chain(optax.clip_by_global_norm(clip_norm), opt)
  return opt


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """The optimiser and its learning-rate schedule, declared once for every training run
  (`loop.TrainConfig.optim`, `finetune.FinetuneConfig.optim`).

  Attributes:
    optimizer: "adamw" or "lamb".
    learning_rate: peak learning rate.
    warmup_steps: linear warm-up steps.
    decay: "linear", "cosine" or "constant" after warm-up.
    end_lr_ratio: final learning rate as a fraction of the peak.
    clip_norm: global gradient-norm clipping (None or 0: off).
    weight_decay: decoupled weight decay (not on biases and LayerNorm).
    b1, b2, eps: Adam parameters.
  """

  optimizer: str = "adamw"
  learning_rate: float = 1e-4
  warmup_steps: int = 0
  decay: str = "linear"
  end_lr_ratio: float = 0.0
  clip_norm: float | None = 1.0
  weight_decay: float = 0.01
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-6

  def make(self, steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """`(tx, schedule)` for a run of `steps` optimizer steps."""
    schedule = learning_rate_schedule(
      self.learning_rate, steps, self.warmup_steps, self.decay, self.end_lr_ratio
    )
    tx = make_optimizer(
      self.optimizer,
      schedule,
      weight_decay=self.weight_decay,
      clip_norm=self.clip_norm,
      b1=self.b1,
      b2=self.b2,
      eps=self.eps,
    )
    return tx, schedule
