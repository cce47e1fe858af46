"""A masked-LM head fitted to a frozen encoder, for checkpoints released without one.

Sentence encoders (all-MiniLM-L6-v2, all-mpnet-base-v2) ship no masked-LM head, so what reads
one (the tuned lens, the masked-LM loss with outlier dimensions disabled) has nothing to read.
`fit_mlm_head` fits a fresh head of the family's own form (transform dense, activation and
LayerNorm where the family has them; the decoder tied to the frozen word embeddings, plus a
bias) to the frozen body's final states at BERT's masked positions (`mask_batches`: 15% of the
real tokens, 80% `[MASK]`, 10% a random token, 10% kept; `bertjax.data.pretraining`'s
masking). The body runs once per batch and the head trains on the cached states. With
`eval_every`, the head kept is the one with the lowest loss on held-out predictions checked
every `eval_every` steps (early stopping: a head of 0.6 M weights memorises a few ten
thousand predictions well before a fixed schedule ends).

A fitted head is not the pretrained one: its loss says how much of the masked token the frozen
final layer makes readable through a head of that form, which is what results using it state.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax import timing
from bertjax.data.pretraining import mask_sequence
from bertjax.data.pretraining_examples import PretrainingConfig
from bertjax.model.config import BertConfig
from bertjax.model.forward import forward
from bertjax.model.heads import head_module, mlm_logits

Params = dict[str, Any]


def mask_batches(
  batches: Iterable,
  *,
  mask_id: int,
  special_ids: Iterable[int],
  vocab_size: int,
  mask_prob: float = 0.15,
  seed: int = 0,
) -> list[dict[str, np.ndarray]]:
  """BERT's masking of every sequence of `batches` (dicts or `bertjax.Batch`es).

  Each sequence gets `floor(mask_prob * n + u)` of its n real, non-special tokens to predict
  (`data.pretraining.mask_sequence`, token masking): 80% become `mask_id`, 10% a random
  non-special token, 10% stay.

  Returns:
    One dict per batch: `input_ids` (masked), `attention_mask`, `token_type_ids`, and the
    predictions `positions`, `targets` (the original ids) and `weights` (1 real, 0 padding),
    each (B, P) with P the batch's most predictions.
  """
  if not 0 < mask_prob < 1:
    raise ValueError(f"mask_prob={mask_prob} must be in (0, 1)")
  special = np.asarray(sorted(int(i) for i in special_ids if i is not None), np.int64)
  random_ids = np.setdiff1d(np.arange(vocab_size), special)
  rng = np.random.default_rng(seed)
  out = []
  for b in batches:
    get = (lambda k, b=b: b[k]) if isinstance(b, dict) else (lambda k, b=b: getattr(b, k))
    ids, mask = np.asarray(get("input_ids")), np.asarray(get("attention_mask"))
    types = np.asarray(get("token_type_ids"))
    cfg = PretrainingConfig(masking="token", mask_prob=mask_prob, max_seq_len=ids.shape[1])
    masked, picked = ids.copy(), []
    for r in range(ids.shape[0]):
      maskable = (mask[r] > 0) & ~np.isin(ids[r], special)
      masked[r], pos = mask_sequence(
        ids[r],
        np.arange(ids.shape[1]),
        maskable,
        cfg,
        rng,
        mask_id=mask_id,
        random_ids=random_ids,
      )
      picked.append(pos)
    width = max(1, max(len(p) for p in picked))
    positions = np.zeros((ids.shape[0], width), np.int32)
    weights = np.zeros((ids.shape[0], width), np.float32)
    for r, pos in enumerate(picked):
      positions[r, : len(pos)] = pos
      weights[r, : len(pos)] = 1
    out.append(
      {
        "input_ids": masked.astype(np.int32),
        "attention_mask": mask.astype(np.int32),
        "token_type_ids": types.astype(np.int32),
        "positions": positions,
        "targets": np.take_along_axis(ids, positions, 1).astype(np.int32),
        "weights": weights,
      }
    )
  return out


@functools.partial(jax.jit, static_argnames=("config",))
def _states(params, config, b):
  out = forward(params, config, b["input_ids"], b["attention_mask"], b["token_type_ids"])
  rows = jnp.arange(b["positions"].shape[0])[:, None]
  return out.last_hidden_state[rows, b["positions"]]


def masked_states(
  params: Params, config: BertConfig, masked: Sequence[dict]
) -> tuple[np.ndarray, np.ndarray]:
  """The final states at every prediction of `mask_batches`' output and their targets:
  `(states (N, hidden) float32, targets (N,) int32)`."""
  states, targets = [], []
  for b in masked:
    keep = b["weights"] > 0
    states.append(np.asarray(_states(params, config, b), np.float32)[keep])
    targets.append(b["targets"][keep])
  return np.concatenate(states), np.concatenate(targets)


def _loss_terms(head, word, config, states, targets):
  """Per-prediction cross-entropy and correctness of `head` (an "mlm" subtree) decoding with
  the word embeddings `word`."""
  tree = {"embeddings": {"word_embeddings": {"embedding": word}}, "mlm": head}
  logits = mlm_logits(tree, config, states).astype(jnp.float32)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  return ce, (jnp.argmax(logits, -1) == targets)


@functools.partial(jax.jit, static_argnames=("config",))
def _eval_chunk(head, word, config, states, targets):
  ce, right = _loss_terms(head, word, config, states, targets)
  return ce.sum(), right.sum()


def mlm_loss(
  params: Params, config: BertConfig, masked: Sequence[dict], *, chunk: int = 2048
) -> dict[str, float]:
  """The masked-LM loss of `params`' own "mlm" head on `mask_batches`' output: mean
  cross-entropy (nats) and accuracy over every prediction, and their count."""
  if "mlm" not in params:
    raise ValueError("these parameters have no 'mlm' head: fit one with fit_mlm_head")
  states, targets = masked_states(params, config, masked)
  return _evaluate(params["mlm"], params, config, states, targets, chunk)


def _word(params):
  return jnp.asarray(params["embeddings"]["word_embeddings"]["embedding"])


def _evaluate(head, params, config, states, targets, chunk=2048) -> dict[str, float]:
  ce = right = 0.0
  word = _word(params)
  for i in range(0, len(targets), chunk):
    part = slice(i, i + chunk)
    c, r = _eval_chunk(head, word, config, states[part], targets[part])
    ce, right = ce + float(c), right + float(r)
  n = len(targets)
  return {"loss": ce / n, "accuracy": right / n, "predictions": n}


def fit_mlm_head(
  params: Params,
  config: BertConfig,
  masked: Sequence[dict],
  *,
  held_out: Sequence[dict] = (),
  steps: int = 600,
  batch_size: int = 512,
  learning_rate: float = 1e-3,
  weight_decay: float = 0.01,
  eval_every: int = 0,
  seed: int = 0,
  progress: bool = False,
) -> tuple[Params, dict[str, Any]]:
  """`params` with a masked-LM head fitted to their frozen body (module docstring).

  AdamW (linear warm-up over the first 10% of steps, then linear decay to 0) on the mean
  cross-entropy of `batch_size` predictions a step, drawn without replacement within each
  pass over the cached states. The head starts as `bertjax.init` starts one (the family's
  `normal_init`, LayerNorm at one, bias at zero); the word embeddings it decodes with are the
  body's and stay frozen.

  Args:
    params, config: the model; parameters that already have an "mlm" head are refused.
    masked: `mask_batches`' output to fit on.
    held_out: `mask_batches`' output to report the loss on (never fitted).
    steps, batch_size, learning_rate, weight_decay: the optimiser's.
    eval_every: when > 0, the held-out loss is taken every `eval_every` steps and after the
      last, and the head returned is the one where it was lowest (`held_out` required).
    seed: the head's initialisation and the order of the predictions.
    progress: a progress bar.

  Returns:
    `(params | {"mlm": head}, log)`: log has "loss" (each step's), "fit" and "held_out"
    (`mlm_loss`'s dicts for the fitted head; "held_out" None without `held_out`),
    "initial" (the held-out loss of the head before fitting, or None), and with `eval_every`
    "curve" (`[step, held-out loss]` at every check) and "best_step" (the step kept).
  """
  if "mlm" not in config.family.heads:
    raise ValueError(f"a {config.model_type} model has no masked-LM head to fit")
  if "mlm" in params:
    raise ValueError("these parameters already have an 'mlm' head; fit_mlm_head adds one")
  if steps < 1 or batch_size < 1:
    raise ValueError(f"steps={steps} and batch_size={batch_size} must be >= 1")
  if eval_every < 0 or (eval_every and not held_out):
    raise ValueError(f"eval_every={eval_every} must be >= 0, and > 0 only with held_out batches")
  states, targets = masked_states(params, config, masked)
  if not len(targets):
    raise ValueError("the masked batches hold no predictions")
  key = jax.random.key(seed)
  word = _word(params)
  x = jnp.zeros((1, config.hidden_size), jnp.float32)
  head = head_module(config, "mlm").init(key, x, word)["params"]
  warmup = max(1, steps // 10)
  schedule = optax.join_schedules(
    [
      optax.linear_schedule(0.0, learning_rate, warmup),
      optax.linear_schedule(learning_rate, 0.0, max(1, steps - warmup)),
    ],
    [warmup],
  )
  opt = optax.adamw(schedule, weight_decay=weight_decay)
  state = opt.init(head)

  @jax.jit
  def step(head, state, word, s, t):
    loss, grads = jax.value_and_grad(lambda h: _loss_terms(h, word, config, s, t)[0].mean())(head)
    updates, state = opt.update(grads, state, head)
    return optax.apply_updates(head, updates), state, loss

  held = masked_states(params, config, held_out) if held_out else None
  initial = _evaluate(head, params, config, *held) if held else None
  rng = np.random.default_rng(seed)
  size = min(batch_size, len(targets))
  order, at, losses = rng.permutation(len(targets)), 0, []
  curve, best = [], (np.inf, 0, head)

  def shown():  # the bar's postfix: the last loss, and the best held-out one once checked
    return {"loss": f"{losses[-1]:.3f}"} | ({"held_out": f"{best[0]:.3f}"} if curve else {})

  for _ in timing.steps(steps, "MLM head", show=progress, postfix=shown):
    if at + size > len(order):
      order, at = rng.permutation(len(targets)), 0
    idx = order[at : at + size]
    at += size
    head, state, loss = step(head, state, word, states[idx], targets[idx])
    losses.append(float(loss))
    done = len(losses)
    if eval_every and (done % eval_every == 0 or done == steps):
      checked = _evaluate(head, params, config, *held)["loss"]
      curve.append([done, checked])
      if checked < best[0]:
        best = (checked, done, head)
  if eval_every:
    head = best[2]  # the checked head with the lowest held-out loss
  log = {
    "loss": losses,
    "fit": _evaluate(head, params, config, states, targets),
    "held_out": _evaluate(head, params, config, *held) if held else None,
    "initial": initial,
  }
  if curve:
    log |= {"curve": curve, "best_step": best[1]}
  return {**params, "mlm": head}, log
