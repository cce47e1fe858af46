"""Negation detection from the sentence embedding, scored by a fixed probe.

`fit_task` fits a logistic-regression probe on every layer's mean-pooled states of a
stratified training split of labelled sentences, and puts the final layer's probe into the
parameters under `PROBE_KEY`; `task_loss`, `task_accuracy` and `task_rows` score that fixed
probe as `bertjax.analysis.interventions.ablation` metrics. The report's sections 3-5, 9 and
10 and `experiments/sixteen_heads.py` read it; `TaskSettings` holds its sizes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

import bertjax
from bertjax import stats
from bertjax.analysis.representations import probing
from bertjax.tasks import text_batches
from bertjax.tasks.sentences import Sentence


@dataclasses.dataclass(frozen=True)
class TaskSettings:
  """The task's split and probe.

  Attributes:
    test_fraction: held-out share of the sentences (stratified by label).
    probe_steps, probe_l2: the probes' full-batch Adam steps and L2 penalty.
    batch_size: sentences per forward call.
    seed: the seed of the split and of the probes.
  """

  test_fraction: float = 0.3
  probe_steps: int = 500
  probe_l2: float = 0.1
  batch_size: int = 64
  seed: int = 0


PROBE_KEY = "report_task_probe"  # where the task classifier rides inside the params pytree

TASK_NAME = "negation detection from the sentence embedding"
TASK_WHY = (
  "Every sentence of the project's own set is labelled negated (it contains not, n't, never, "
  "no, nobody, nothing, none, neither, nor or nowhere) or affirmative, so the task needs no "
  "download. A logistic-regression head is fitted on the frozen model's mean-pooled final "
  "layer (the sentence embedding all-MiniLM-L6-v2 is used through) of a stratified training "
  "split and scored on the held-out split. The head stays fixed while heads and layers are "
  "ablated, so every change in held-out cross-entropy and accuracy is the encoder's doing. "
  "Negation is a property sentence-embedding models are known to blur (their training pulls "
  "'X' and 'not X' together), so how well it survives to the last layer, and which heads "
  "carry it there, is a question worth asking of this model; questions vs statements "
  "would be decided by the final '?' alone."
)

_mean_pool = jax.jit(stats.mean_pool)


def _task_logits(params, last_hidden_state, attention_mask):
  p = params[PROBE_KEY]
  x = _mean_pool(last_hidden_state.astype(jnp.float32), attention_mask)
  return ((x - p["mean"]) / p["scale"]) @ p["w"] + p["b"]


def task_loss(params, config, batch, last_hidden_state, pooled):
  """Cross-entropy of the task head on `batch["labels"]`: (sum, count)."""
  logp = jax.nn.log_softmax(_task_logits(params, last_hidden_state, batch["attention_mask"]))
  nll = -jnp.take_along_axis(logp, batch["labels"][:, None].astype(jnp.int32), -1)[:, 0]
  return nll.sum(), jnp.asarray(nll.shape[0], jnp.float32)


def task_accuracy(params, config, batch, last_hidden_state, pooled):
  """Accuracy of the task head on `batch["labels"]`: (correct, count)."""
  pred = _task_logits(params, last_hidden_state, batch["attention_mask"]).argmax(-1)
  correct = (pred == batch["labels"]).astype(jnp.float32)
  return correct.sum(), jnp.asarray(correct.shape[0], jnp.float32)


def task_rows(params, config, batch, last_hidden_state, pooled):
  """Per sentence, the task head's cross-entropy and correctness: (batch, 2).

  Their means are `task_loss` and `task_accuracy`; as an `ablation.evaluate_masks_per_row`
  function they give the per-sentence values behind every ablation and pruning number (the
  items of the readings' confidence intervals).
  """
  logp = jax.nn.log_softmax(_task_logits(params, last_hidden_state, batch["attention_mask"]))
  labels = batch["labels"][:, None].astype(jnp.int32)
  nll = -jnp.take_along_axis(logp, labels, -1)[:, 0]
  return jnp.stack([nll, (logp.argmax(-1) == labels[:, 0]).astype(nll.dtype)], -1)


def _stratified_split(labels: np.ndarray, test_fraction: float, seed: int):
  """Train and test indices with each label split in the same proportion."""
  rng = np.random.default_rng(seed)
  train, test = [], []
  for value in np.unique(labels):
    idx = rng.permutation(np.flatnonzero(labels == value))
    k = max(1, round(test_fraction * len(idx)))
    test.append(idx[:k])
    train.append(idx[k:])
  return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def _sentence_embeddings(params, config, batches, n: int) -> np.ndarray:
  """Mean-pooled hidden states of every layer, embeddings first: (layers + 1, n, H)."""
  out = np.zeros((config.depth + 1, n, config.hidden_size), np.float32)
  for idx, batch in batches:
    o = bertjax.forward(
      params,
      config,
      batch["input_ids"],
      batch["attention_mask"],
      batch["token_type_ids"],
      output_hidden_states=True,
    )
    out[:, idx] = np.asarray(_mean_pool(o.hidden_states, jnp.asarray(batch["attention_mask"])))
  return out


def fit_task(
  params,
  config,
  tok,
  sentences: Sequence[Sentence],
  settings: TaskSettings,
  log: Callable[[str], None] = print,
) -> tuple[dict, dict]:
  """Fits the negation heads (one per layer) and returns `(results, task)`.

  Args:
    params, config, tok: the model under analysis and its tokenizer.
    sentences: labelled sentences (both labels present), split by `settings`.
    settings: the split, the probes' steps and L2, the batch size and the seed (the report
      passes `ReportSettings.task`).
    log: where the per-layer held-out accuracies are reported.

  Returns:
    `results`: the task's numbers (the report's section 3). `task`: the parameters with the
    final layer's head under `PROBE_KEY`, and the held-out (`test`) and training
    (`train`) batches, with labels, for the ablation analyses.

  Raises:
    ValueError: the sentences carry only one label.
  """
  texts = [s.text for s in sentences]
  labels = np.asarray([s.negated for s in sentences], np.int32)
  if len(np.unique(labels)) < 2:
    raise ValueError(
      f"the task needs negated and affirmative sentences; labels are all {labels[0]}"
    )
  train, test = _stratified_split(labels, settings.test_fraction, settings.seed)
  batches = text_batches.batches(
    tok, texts, batch_size=settings.batch_size, max_length=config.max_length
  )
  feats = _sentence_embeddings(params, config, batches, len(texts))  # (L + 1, n, H)
  mean = feats[:, train].mean(1, keepdims=True)
  scale = feats[:, train].std(1, keepdims=True) + 1e-6
  z = (feats - mean) / scale
  probe = probing.fit_probe(
    z[:, train],
    labels[train],
    num_classes=2,
    config=probing.ProbeConfig(
      l2=settings.probe_l2, max_steps=settings.probe_steps, patience=None, seed=settings.seed
    ),
  )
  logits = np.asarray(probe.logits(z[:, test]), np.float64)  # (L + 1, n_test, 2)
  logp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
  nll = -np.take_along_axis(logp, labels[test][None, :, None], -1)[..., 0].mean(-1)
  acc = probe.accuracy(z[:, test], labels[test])
  correct = probe.predict(z[:, test]) == labels[test]  # (L + 1, n_test)
  log(f"negation probe held-out accuracy by layer: {np.round(acc, 3).tolist()}")
  head = jax.tree.map(lambda a: np.asarray(a[-1]), probe.params)
  task_params = {
    **params,
    PROBE_KEY: {
      "mean": jnp.asarray(mean[-1, 0]),
      "scale": jnp.asarray(scale[-1, 0]),
      "w": jnp.asarray(head["w"]),
      "b": jnp.asarray(head["b"]),
    },
  }
  split = lambda idx: [
    text_batches.plain(b)
    for _, b in text_batches.batches(
      tok,
      [texts[i] for i in idx],
      batch_size=settings.batch_size,
      max_length=config.max_length,
      extra={"labels": labels[idx]},
    )
  ]
  results = {
    "name": TASK_NAME,
    "why": TASK_WHY,
    "classifier": (
      f"logistic regression (linear probe, L2 {settings.probe_l2}, "
      f"{settings.probe_steps} full-batch Adam steps) on standardised mean-pooled "
      "states"
    ),
    "num_train": len(train),
    "num_test": len(test),
    "test_negated_fraction": float(labels[test].mean()),
    "majority_accuracy": float(max(labels[test].mean(), 1 - labels[test].mean())),
    "probe_accuracy_by_layer": acc.tolist(),
    "probe_loss_by_layer": nll.tolist(),
    "test_accuracy": float(acc[-1]),
    "test_loss": float(nll[-1]),
    # Per held-out sentence, for the reading's confidence interval.
    "probe_correct_by_layer": correct.astype(np.int8),
  }
  return results, {"params": task_params, "train": split(train), "test": split(test)}
