"""Fine-tuning until the dev score stops improving, as Kovaleva et al. (2019) train their
pre-trained and randomly initialised BERTs: `EarlyStopping` (the schedule and the patience
rule), `padded_correct` and `padded_accuracy` (each prediction's correctness, and the
accuracy, over sentences or tokens in batches of one shape) and
`train_early_stopping` (the loop, scored on test at the best dev step)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import numpy as np

from bertjax.model.forward import forward
from bertjax.model.heads import head_logits
from bertjax.training import optim
from bertjax.training.losses import IGNORE_INDEX
from bertjax.training.state import create_train_state
from bertjax.training.step import make_train_step

KINDS = ("classification", "token_classification")


@dataclasses.dataclass(frozen=True)
class EarlyStopping:
  """The optimiser's schedule and the stopping rule.

  Training runs at most `max_steps` AdamW steps of `batch_size` rows (weight decay 0.01,
  gradient norm clipped to 1, `warmup_steps` of linear warm-up to a constant
  `learning_rate`), scores dev every `eval_every` steps and stops once `patience` scores in
  a row fail to improve on the best, but not before `min_steps`.
  """

  batch_size: int
  learning_rate: float
  warmup_steps: int
  max_steps: int
  min_steps: int
  eval_every: int
  patience: int
  eval_batch: int

  @classmethod
  def pick(cls, settings: dict[str, Any]) -> EarlyStopping:
    """The fields of this class from a larger settings dict (other keys are ignored)."""
    return cls(**{f.name: settings[f.name] for f in dataclasses.fields(cls)})

  def __post_init__(self):
    for f in dataclasses.fields(self):
      if f.name != "learning_rate" and not isinstance(getattr(self, f.name), int):
        raise ValueError(f"{f.name}={getattr(self, f.name)!r} not understood: expected an int")
    small = {f: getattr(self, f) for f in ("batch_size", "max_steps", "eval_every", "patience")}
    small = {k: v for k, v in small.items() if v < 1}
    if small or self.eval_batch < 1 or self.learning_rate <= 0:
      raise ValueError(
        f"EarlyStopping({self}) not understood: batch sizes, max_steps, eval_every and "
        "patience must be >= 1 and the learning rate > 0"
      )


def _check_kind(kind: str) -> None:
  if kind not in KINDS:
    raise ValueError(f"kind={kind!r} not understood: expected one of {', '.join(KINDS)}")


@functools.partial(jax.jit, static_argnames=("config", "kind"))
def _logits(params, ids, mask, types, *, config, kind: str):
  out = forward(params, config, ids, mask, types)
  head = "classifier" if kind == "classification" else "token_classifier"
  return head_logits(params, config, out, head)


def padded_correct(params, config, data: dict, kind: str, batch_size: int) -> np.ndarray:
  """Whether each prediction is right: one bool per sentence ("classification"), or per
  labelled token ("token_classification", -100 marks no label; row by row, left to right),
  of `data`'s "labels".

  Every batch has `batch_size` rows (the last one wraps around to the first rows, whose
  predictions are dropped), so the model compiles once whatever the data's length.
  """
  _check_kind(kind)
  n, right = len(data["labels"]), []
  for start in range(0, n, batch_size):
    idx = np.arange(start, start + batch_size) % n
    real = min(batch_size, n - start)
    logits = _logits(
      params,
      data["input_ids"][idx],
      data["attention_mask"][idx],
      data["token_type_ids"][idx],
      config=config,
      kind=kind,
    )
    pred = np.asarray(logits).argmax(-1)[:real]
    labels = data["labels"][idx][:real]
    right.append((pred == labels)[labels != IGNORE_INDEX])
  return np.concatenate(right)


def padded_accuracy(params, config, data: dict, kind: str, batch_size: int) -> float:
  """Sentence accuracy ("classification"), or token accuracy over the labelled tokens
  ("token_classification", -100 marks no label), of `data`'s "labels": the mean of
  `padded_correct`."""
  return float(padded_correct(params, config, data, kind, batch_size).mean())


@functools.cache
def _trainer(config, kind: str, learning_rate: float, warmup_steps: int, max_steps: int):
  """(optimizer, jitted step) shared by every run with one schedule: compiled once."""
  schedule = optim.learning_rate_schedule(learning_rate, max_steps, warmup_steps, "constant")
  tx = optim.make_optimizer("adamw", schedule, weight_decay=0.01, clip_norm=1.0)
  return tx, make_train_step(config, tx, schedule, task=kind)


def train_early_stopping(
  config, params, train: dict, dev: dict, test: dict, *, kind: str, rule: EarlyStopping, seed: int
) -> dict[str, Any]:
  """Fine-tunes `params` on `train` until dev accuracy stops improving (see `EarlyStopping`);
  scores the best-dev parameters on `test`. Each epoch is a fresh permutation of `train`
  drawn from `(seed, epoch)`; a partial last batch is dropped.

  Returns:
    "curve" (per evaluation: step, mean training loss since the last one, dev accuracy),
    "best_step", "steps" run, "converged" (stopped by the patience rule, not by
    `max_steps`), "dev" (best) and "test" (at the best step) accuracy.
  """
  _check_kind(kind)
  n, bs = len(train["labels"]), rule.batch_size
  if n < bs:
    raise ValueError(f"batch_size={bs} exceeds the {n} training examples")
  tx, step_fn = _trainer(config, kind, rule.learning_rate, rule.warmup_steps, rule.max_steps)
  state = create_train_state(params, tx, seed)
  per_epoch = n // bs
  curve, losses = [], []
  best, best_step, best_params, stale = -1.0, 0, state.params, 0
  converged = False
  for k in range(rule.max_steps):
    epoch, i = divmod(k, per_epoch)
    if i == 0:
      perm = np.random.default_rng([seed, epoch]).permutation(n)
    rows = perm[i * bs : (i + 1) * bs]
    state, m = step_fn(state, {key: v[rows] for key, v in train.items()})
    m = jax.device_get(m)
    if not m["finite"]:
      raise FloatingPointError(f"non-finite loss={float(m['loss'])} at step {k + 1}")
    losses.append(float(m["loss"]))
    if (k + 1) % rule.eval_every:
      continue
    score = padded_accuracy(state.params, config, dev, kind, rule.eval_batch)
    curve.append({"step": k + 1, "train_loss": float(np.mean(losses)), "dev": score})
    losses = []
    if score > best + 1e-9:
      best, best_step, best_params, stale = score, k + 1, state.params, 0
    else:
      stale += 1
    if stale >= rule.patience and k + 1 >= rule.min_steps:
      converged = True
      break
  right = padded_correct(best_params, config, test, kind, rule.eval_batch)
  return {
    "curve": curve,
    "best_step": best_step,
    "steps": k + 1,
    "converged": converged,
    "dev": best,
    "test": float(right.mean()),
    "test_correct": right,
  }
