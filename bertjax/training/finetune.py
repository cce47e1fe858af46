"""Fine-tuning for sequence classification (single sentences and pairs) and token classification.

Data comes as dicts of NumPy arrays, padded to one length so that one compiled
step serves the whole run: ``input_ids``, ``attention_mask``, ``token_type_ids``
(N, T) and ``labels`` ((N,) int class ids, (N,) float targets for regression, or
(N, T) int tags with -100 where there is no label). Loaders build them from
local TSV/JSONL tables, BLiMP acceptability pairs, UD treebanks (POS tags on the
first subword of each word) and GLUE through tensorflow-datasets.

The model starts from a Hugging Face directory (`from_hf`, task heads dropped and
a fresh head added) or from random initialisation of a given config.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import pathlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.model.config import BertConfig
from bertjax.model.families import HEADS
from bertjax.model.forward import forward, init
from bertjax.model.heads import head_logits, token_classify
from bertjax.stats import pearson, spearman
from bertjax.training import optim
from bertjax.training.losses import IGNORE_INDEX
from bertjax.training.state import create_train_state
from bertjax.training.step import make_train_step
from bertjax.utils import flat_kwargs

TASKS = ("classification", "token_classification")
_HEAD = {"classification": "classifier", "token_classification": "token_classifier"}
GLUE = {  # name -> (text key, pair key or None, number of labels, eval split)
  "sst2": ("sentence", None, 2, "validation"),
  "mrpc": ("sentence1", "sentence2", 2, "validation"),
  "rte": ("sentence1", "sentence2", 2, "validation"),
}


# Metrics ----------------------------------------------------------------------


def classification_metrics(preds, labels, num_labels: int) -> dict[str, float]:
  """Accuracy, F1 (of class 1 when binary, else macro) and Matthews correlation.

  Args:
    preds: int predicted classes.
    labels: int gold classes (same shape).
    num_labels: the number of classes.
  """
  preds, labels = np.asarray(preds).ravel(), np.asarray(labels).ravel()
  cm = np.zeros((num_labels, num_labels), np.float64)  # rows gold, columns predicted
  np.add.at(cm, (labels, preds), 1)
  tp = np.diag(cm)
  prec_den, rec_den = cm.sum(0), cm.sum(1)
  f1s = np.where(prec_den + rec_den > 0, 2 * tp / np.maximum(prec_den + rec_den, 1e-12), 0.0)
  f1 = float(f1s[1]) if num_labels == 2 else float(f1s.mean())
  # Gorodkin's multi-class MCC; equals the binary formula for two classes.
  n, c = cm.sum(), tp.sum()
  t, p = rec_den, prec_den
  denom = np.sqrt((n * n - (p * p).sum()) * (n * n - (t * t).sum()))
  mcc = float((c * n - (t * p).sum()) / denom) if denom > 0 else 0.0
  return {"accuracy": float(c / max(n, 1)), "f1": f1, "matthews": mcc}


def regression_metrics(preds, targets) -> dict[str, float]:
  """Pearson, Spearman and mean squared error."""
  preds, targets = np.asarray(preds, np.float64).ravel(), np.asarray(targets, np.float64).ravel()
  return {
    "pearson": pearson(preds, targets),
    "spearman": spearman(preds, targets),
    "mse": float(np.mean((preds - targets) ** 2)),
  }


# Data -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LabelledTexts:
  """Sentences (or pairs) with labels, and the labels' names where they have them."""

  texts: list[str]
  pairs: list[str] | None
  labels: np.ndarray  # (N,) int class ids or float targets
  label_names: tuple[str, ...] | None = None  # class id -> name

  def head(self, n: int) -> LabelledTexts:
    """The first `n` examples."""
    return dataclasses.replace(
      self,
      texts=self.texts[:n],
      labels=self.labels[:n],
      pairs=None if self.pairs is None else self.pairs[:n],
    )


def read_table(
  path: str | pathlib.Path,
  text_column: str,
  label_column: str,
  pair_column: str | None = None,
  *,
  regression: bool = False,
  label_names: Sequence[str] | None = None,
) -> LabelledTexts:
  """Reads a TSV (header row) or JSONL file of labelled sentences or pairs.

  Args:
    path: ``.tsv``/``.txt`` (tab-separated, first row the column names) or ``.jsonl``.
    text_column, label_column, pair_column: column names.
    regression: labels are floats.
    label_names: the class names in id order, to map string labels the same way in
      another file (an evaluation table); a label outside them is an error. Without
      them, integer labels stay ids (no names) and string labels are named in sorted
      order.

  Returns:
    `LabelledTexts`.
  """
  path = pathlib.Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"table {path} does not exist")
  if path.suffix == ".jsonl":
    rows = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
      if line.strip():
        try:
          rows.append(json.loads(line))
        except json.JSONDecodeError as e:
          raise ValueError(f"{path}:{i}: not a JSON line ({e.msg})") from e
  else:
    with open(path, encoding="utf-8", newline="") as f:
      rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
  if not rows:
    raise ValueError(f"table {path} has no rows")
  for col in (text_column, label_column) + ((pair_column,) if pair_column else ()):
    if col not in rows[0]:
      raise ValueError(f"column {col!r} is not in {path}; columns: {sorted(rows[0])}")
  texts = [str(r[text_column]) for r in rows]
  pairs = [str(r[pair_column]) for r in rows] if pair_column else None
  raw = [r[label_column] for r in rows]
  names = None
  if regression:
    try:
      labels = np.asarray([float(v) for v in raw], np.float32)
    except (TypeError, ValueError) as e:
      raise ValueError(f"{path}: regression needs numeric labels in {label_column!r}: {e}") from e
  elif label_names is not None:
    names = tuple(label_names)
    unknown = sorted({str(v) for v in raw} - set(names))
    if unknown:
      raise ValueError(f"{path}: labels {unknown[:10]} are not among {list(names)}")
    labels = np.asarray([names.index(str(v)) for v in raw], np.int32)
  else:
    try:
      labels = np.asarray([int(v) for v in raw], np.int32)
    except (TypeError, ValueError):
      names = tuple(sorted(set(map(str, raw))))
      labels = np.asarray([names.index(str(v)) for v in raw], np.int32)
    else:
      if labels.min() < 0:
        raise ValueError(f"{path}: integer labels must be >= 0; found {int(labels.min())}")
  return LabelledTexts(texts, pairs, labels, names)


def load_table(
  path: str | pathlib.Path,
  text_column: str,
  label_column: str,
  pair_column: str | None = None,
  *,
  regression: bool = False,
) -> tuple[list[str], list[str] | None, np.ndarray]:
  """`read_table` as `(texts, pairs or None, labels)`; string labels become ids in sorted order."""
  t = read_table(path, text_column, label_column, pair_column, regression=regression)
  return t.texts, t.pairs, t.labels


def load_blimp(
  paths: str | pathlib.Path | Sequence[str | pathlib.Path],
) -> tuple[list[str], None, np.ndarray]:
  """BLiMP minimal pairs as acceptability data: ``sentence_good`` -> 1, ``sentence_bad`` -> 0."""
  if isinstance(paths, (str, pathlib.Path)):
    paths = [paths]
  texts, labels = [], []
  for path in paths:
    for line in pathlib.Path(path).read_text(encoding="utf-8").splitlines():
      if not line.strip():
        continue
      row = json.loads(line)
      texts += [row["sentence_good"], row["sentence_bad"]]
      labels += [1, 0]
  if not texts:
    raise ValueError(f"no BLiMP examples in {list(map(str, paths))}")
  return texts, None, np.asarray(labels, np.int32)


def encode_classification(
  tokenizer, texts: Sequence[str], pairs: Sequence[str] | None, labels, *, max_len: int = 128
) -> dict[str, np.ndarray]:
  """Tokenizes (and truncates to `max_len`) sentences or pairs into padded arrays with labels."""
  if len(texts) != len(labels) or (pairs is not None and len(pairs) != len(texts)):
    raise ValueError(
      f"{len(texts)} texts, {None if pairs is None else len(pairs)} pairs and "
      f"{len(labels)} labels must have the same length"
    )
  batch = tokenizer.encode(
    list(texts), None if pairs is None else list(pairs), max_length=max_len, truncation=True
  )
  return {
    "input_ids": batch.input_ids,
    "attention_mask": batch.attention_mask,
    "token_type_ids": batch.token_type_ids,
    "labels": np.asarray(labels),
  }


def load_ud_pos(
  path: str | pathlib.Path,
  tokenizer,
  *,
  max_len: int = 128,
  field: str = "upos",
  eval_fraction: float = 0.1,
  max_sentences: int | None = None,
  seed: int = 0,
):
  """UD POS tagging: each word's tag on its first subword, -100 on the other tokens.

  Sentences longer than `max_len` subwords are dropped.

  Returns:
    `(train, eval, labels)`: two data dicts and the tag names (the label ids' order).
  """
  from bertjax.data import conllu

  sentences = conllu.read_conllu(path, max_sentences=max_sentences)
  vocab = conllu.build_vocab(sentences, field)
  words = [list(s.forms) for s in sentences]
  lengths = [len(e.ids) for e in tokenizer.tokenizer.encode_batch(words, is_pretokenized=True)]
  keep = [i for i, n in enumerate(lengths) if n <= max_len]
  batch = tokenizer.encode_words([words[i] for i in keep], max_length=max_len)
  labels = np.full(batch.input_ids.shape, IGNORE_INDEX, np.int32)
  first = batch.first_subword()  # (N, W)
  for row, i in enumerate(keep):
    tags = vocab.encode(getattr(sentences[i], field))
    pos = first[row, : len(tags)]
    ok = pos >= 0
    labels[row, pos[ok]] = tags[ok]
  data = {
    "input_ids": batch.input_ids,
    "attention_mask": batch.attention_mask,
    "token_type_ids": batch.token_type_ids,
    "labels": labels,
  }
  train, evaluation = split(data, eval_fraction, seed=seed)
  return train, evaluation, list(vocab.labels)


def load_glue(
  name: str,
  tokenizer,
  *,
  max_len: int = 128,
  data_dir: str | None = None,
  max_examples: int | None = None,
):
  """A GLUE task (``sst2``, ``mrpc``, ``rte``) through `tensorflow_datasets.load`.

  Returns:
    `(train, eval, labels)` with the validation split as eval; `labels` are the task's
    class names from its tfds metadata (e.g. sst2: negative, positive).
  """
  if name not in GLUE:
    raise ValueError(f"GLUE task {name=!r} must be one of {sorted(GLUE)}")
  import tensorflow_datasets as tfds

  text_key, pair_key, num_labels, eval_split = GLUE[name]
  out, names = [], [str(i) for i in range(num_labels)]
  for split_name in ("train", eval_split):
    ds, info = tfds.load(f"glue/{name}", split=split_name, data_dir=data_dir, with_info=True)
    names = list(getattr(info.features["label"], "names", None) or names)
    texts, pairs, labels = [], [], []
    for ex in tfds.as_numpy(ds):
      if max_examples is not None and len(texts) >= max_examples:
        break
      texts.append(ex[text_key].decode("utf-8"))
      if pair_key:
        pairs.append(ex[pair_key].decode("utf-8"))
      labels.append(int(ex["label"]))
    out.append(
      encode_classification(
        tokenizer, texts, pairs if pair_key else None, np.asarray(labels, np.int32), max_len=max_len
      )
    )
  return out[0], out[1], names


def split(data: dict[str, np.ndarray], eval_fraction: float, *, seed: int = 0):
  """A seeded random split into `(train, eval)`."""
  if not 0 < eval_fraction < 1:
    raise ValueError(f"{eval_fraction=} must be in (0, 1)")
  n = len(data["labels"])
  perm = np.random.default_rng(seed).permutation(n)
  k = max(1, round(n * eval_fraction))
  pick = lambda idx: {key: v[np.sort(idx)] for key, v in data.items()}
  return pick(perm[k:]), pick(perm[:k])


# Model ------------------------------------------------------------------------


def prepare_model(
  task: str,
  num_labels: int,
  *,
  init_from: str | pathlib.Path | None = None,
  config: BertConfig | None = None,
  seed: int = 0,
  label_names: Sequence[str] | None = None,
):
  """A model with a fresh task head: from a Hugging Face model (any family) or random.

  The head is the family's (`config.family.heads`): BERT's and ALBERT's sequence
  classifier reads the pooler, so a checkpoint saved without one (a `*ForMaskedLM`)
  gets a fresh pooler; RoBERTa's, ELECTRA's and DistilBERT's classifiers read the
  first token's final state, and token classifiers every token, so those models keep
  no pooler (their Hugging Face classes have none).

  Args:
    task: "classification" or "token_classification".
    num_labels: outputs of the head (1 for regression).
    init_from: a Hugging Face directory or hub id (its task heads are dropped).
    config: the architecture for random initialisation (when no `init_from`).
    seed: the head's (and random model's) initialisation seed.
    label_names: the classes' names, index order (exported as `id2label`); None
      means `LABEL_0` ... (Hugging Face's default).

  Returns:
    `(config, params)`.
  """
  from bertjax.model.hf import from_hf

  if task not in TASKS:
    raise ValueError(f"{task=!r} must be one of {TASKS}")
  if (init_from is None) == (config is None):
    raise ValueError("give exactly one of init_from (a Hugging Face directory) or config")
  if label_names is not None:
    label_names = tuple(str(name) for name in label_names)
    if len(label_names) != num_labels:
      raise ValueError(f"label_names={list(label_names)} must name num_labels={num_labels} classes")
  head = _HEAD[task]
  base = None
  if init_from is not None:
    config, base = from_hf(init_from)
  reads_pooler = config.family.heads[head].reads == "pooled"
  # Labels of the checkpoint's own head (a different task) do not carry over.
  config = config.replace(num_labels=num_labels, label_names=label_names, use_pooler=reads_pooler)
  fresh = init(config, seed, heads=(head,))
  if base is None:
    return config, fresh
  params = {k: v for k, v in base.items() if k not in HEADS and k != "pooler"}
  if reads_pooler:
    params["pooler"] = base.get("pooler", fresh["pooler"])
  params[head] = fresh[head]
  return config, params


@flat_kwargs("optim")
@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
  """Fine-tuning hyper-parameters.

  Attributes:
    steps: optimizer steps.
    batch_size: examples per step (all micro-batches together).
    accumulation_steps: micro-batches per step.
    optim: the optimiser and schedule (`optim.OptimConfig`; its fields may also be given
      flat: `FinetuneConfig(steps=100, learning_rate=3e-5)`).
    dtype: compute dtype, "float32" or "bfloat16".
    seed: the task head's initialisation and the batch order.
    eval_every: evaluate every N steps (0: only at the end).
    eval_batch_size: examples per evaluation batch.
  """

  steps: int = 500
  batch_size: int = 32
  accumulation_steps: int = 1
  optim: optim.OptimConfig = optim.OptimConfig(learning_rate=2e-5)  # noqa: RUF009 (frozen)
  dtype: str = "float32"
  seed: int = 0
  eval_every: int = 0
  eval_batch_size: int = 64


def predict(
  params, config: BertConfig, data: dict[str, np.ndarray], task: str, *, batch_size: int = 64
) -> np.ndarray:
  """Logits for every example: (N, C) or (N, T, C); the last batch is padded (one compile)."""

  @jax.jit
  def logits_fn(p, ids, mask, types):
    out = forward(p, config, ids, mask, types)
    if task == "classification":
      return head_logits(p, config, out, "classifier")
    return token_classify(p, config, out.last_hidden_state)

  n = len(data["labels"])
  chunks = []
  for start in range(0, n, batch_size):
    idx = np.arange(start, start + batch_size) % n
    part = logits_fn(
      params, data["input_ids"][idx], data["attention_mask"][idx], data["token_type_ids"][idx]
    )
    chunks.append(np.asarray(part)[: min(batch_size, n - start)])
  return np.concatenate(chunks)


def evaluate(
  params, config: BertConfig, data: dict[str, np.ndarray], task: str, *, batch_size: int = 64
) -> dict[str, float]:
  """Task metrics on `data`: classification or regression metrics, token accuracy/F1."""
  logits = predict(params, config, data, task, batch_size=batch_size).astype(np.float32)
  labels = data["labels"]
  if task == "classification" and logits.shape[-1] == 1:
    return regression_metrics(logits[:, 0], labels)
  preds = logits.argmax(-1)
  if task == "token_classification":
    keep = labels != IGNORE_INDEX
    preds, labels = preds[keep], labels[keep]
  return classification_metrics(preds, labels, logits.shape[-1])


def finetune(
  config: BertConfig,
  params,
  train_data: dict[str, np.ndarray],
  eval_data: dict[str, np.ndarray] | None,
  *,
  task: str,
  hp: FinetuneConfig = FinetuneConfig(),
  callback: Callable[[str, dict], None] | None = None,
  objective: Any = None,
) -> dict[str, Any]:
  """Fine-tunes and evaluates.

  Batches are drawn from a seeded permutation per epoch (batch k is a pure
  function of seed and k).

  Args:
    config, params: the model with its task head (`prepare_model`); it returns the trained
      model, so the pair comes in `from_hf`'s order.
    train_data, eval_data: data dicts (see the module docstring); eval may be None.
    task: "classification" or "token_classification".
    hp: the hyper-parameters.
    callback: called as `callback("train", record)` after every step (record:
      step, loss, learning_rate, examples_per_s, seconds since the start) and as
      `callback("eval", record)` after every evaluation (step and `eval_<metric>`
      values), for progress bars and metric logs.
    objective: objective components replacing the task's loss (`training.objectives`),
      e.g. `distill.TaskDistillation` with a fine-tuned teacher; None: the task's own.

  Returns:
    Dict with "metrics" (final eval), "eval_history", "history" (the per-step
    records), "final_loss", "steps", "wall_time_s", "examples_per_s" (over the
    run, compilation included), "params" and "config".
  """
  if task not in TASKS:
    raise ValueError(f"{task=!r} must be one of {TASKS}")
  n = len(train_data["labels"])
  if n < hp.batch_size:
    raise ValueError(f"batch_size={hp.batch_size} exceeds the {n} training examples")
  tx, schedule = hp.optim.make(hp.steps)
  state = create_train_state(params, tx, hp.seed)
  step_fn = make_train_step(
    config.replace(dtype=hp.dtype),
    tx,
    schedule,
    task=task,
    accumulation_steps=hp.accumulation_steps,
    **({} if objective is None else {"objective": objective}),
  )
  report = callback or (lambda kind, record: None)
  per_epoch = n // hp.batch_size
  history, eval_history = [], []
  perm, perm_epoch = None, -1
  start = time.perf_counter()
  for k in range(hp.steps):
    epoch, i = divmod(k, per_epoch)
    if epoch != perm_epoch:
      perm = np.random.default_rng([hp.seed, epoch]).permutation(n)
      perm_epoch = epoch
    idx = perm[i * hp.batch_size : (i + 1) * hp.batch_size]
    batch = {key: v[idx] for key, v in train_data.items()}
    t0 = time.perf_counter()
    state, m = step_fn(state, batch)
    m = jax.device_get(m)
    now = time.perf_counter()
    if not m["finite"]:
      raise FloatingPointError(f"non-finite fine-tuning loss={float(m['loss'])} at step {k + 1}")
    record = {
      "step": k + 1,
      "loss": float(m["loss"]),
      "learning_rate": float(m["learning_rate"]),
      "examples_per_s": hp.batch_size / max(now - t0, 1e-9),
      "seconds": now - start,
    }
    history.append(record)
    report("train", record)
    if eval_data is not None and hp.eval_every and (k + 1) % hp.eval_every == 0:
      metrics = evaluate(state.params, config, eval_data, task, batch_size=hp.eval_batch_size)
      eval_history.append({"step": k + 1, **metrics})
      report("eval", {"step": k + 1, **{f"eval_{name}": v for name, v in metrics.items()}})
  wall = time.perf_counter() - start
  metrics = (
    evaluate(state.params, config, eval_data, task, batch_size=hp.eval_batch_size)
    if eval_data is not None
    else {}
  )
  if metrics and (not eval_history or eval_history[-1]["step"] != hp.steps):
    report("eval", {"step": hp.steps, **{f"eval_{name}": v for name, v in metrics.items()}})
  return {
    "metrics": metrics,
    "eval_history": eval_history,
    "history": history,
    "final_loss": history[-1]["loss"],
    "steps": hp.steps,
    "wall_time_s": wall,
    "examples_per_s": hp.steps * hp.batch_size / max(wall, 1e-9),
    "params": jax.tree.map(jnp.asarray, state.params),
    "config": config,
  }
