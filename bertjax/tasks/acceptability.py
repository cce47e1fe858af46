"""Acceptability as a task: BLiMP's minimal pairs (a grammatical sentence and its
ungrammatical twin) as labelled sentences, split so that every pair stays on one side, and
the row and batch helpers the experiments that fine-tune on it share (Kovaleva et al. 2019's
probing of what fine-tuning changes; their random-initialisation control)."""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import numpy as np


def load_blimp_task(blimp_dir: pathlib.Path, tokenizer, *, max_len: int):
  """Every BLiMP phenomenon file in `blimp_dir` as acceptability data.

  Returns:
    `(data, pair_ids, phenomenon, names)`: padded arrays with `labels` (1 grammatical,
    0 ungrammatical), the (N,) minimal-pair index of each sentence, the (N,) phenomenon
    index of each sentence, and the phenomenon names (file stems, sorted).
  """
  from bertjax.training import finetune as ft

  files = sorted(pathlib.Path(blimp_dir).glob("*.jsonl"))
  if not files:
    raise FileNotFoundError(f"no BLiMP *.jsonl files under {blimp_dir}")
  texts, labels, pairs, phen = [], [], [], []
  for k, path in enumerate(files):
    t, _, y = ft.load_blimp(path)  # good, bad, good, bad, ...
    offset = (pairs[-1] + 1) if pairs else 0
    texts += t
    labels.append(y)
    pairs += list(offset + np.arange(len(t)) // 2)
    phen += [k] * len(t)
  data = ft.encode_classification(tokenizer, texts, None, np.concatenate(labels), max_len=max_len)
  return data, np.asarray(pairs), np.asarray(phen), [p.stem for p in files]


def split_by_pair(pair_ids, eval_pairs: int, train_pairs: int | None, *, seed: int):
  """Sentence indices `(train, eval)` with every minimal pair wholly on one side.

  Args:
    pair_ids: (N,) pair index of each sentence.
    eval_pairs: pairs held out.
    train_pairs: pairs to train on (None: all the others).
    seed: the permutation's seed.
  """
  pair_ids = np.asarray(pair_ids)
  unique = np.unique(pair_ids)
  train_pairs = len(unique) - eval_pairs if train_pairs is None else train_pairs
  if eval_pairs < 1 or train_pairs < 1 or eval_pairs + train_pairs > len(unique):
    raise ValueError(
      f"{eval_pairs=} and {train_pairs=} must be >= 1 and fit in the {len(unique)} minimal pairs"
    )
  perm = np.random.default_rng(seed).permutation(unique)
  held, train = perm[:eval_pairs], perm[eval_pairs : eval_pairs + train_pairs]
  return np.flatnonzero(np.isin(pair_ids, train)), np.flatnonzero(np.isin(pair_ids, held))


@dataclasses.dataclass
class PairSplit:
  """BLiMP acceptability sentences split by minimal pair into training and held-out sets
  (`load_pair_split`)."""

  train: dict[str, np.ndarray]
  held: dict[str, np.ndarray]
  held_phenomenon: np.ndarray  # (held,) phenomenon index of each held-out sentence
  phenomena: list[str]
  # (held,) each held-out sentence's minimal pair, numbered 0 .. pairs - 1 (an interval over
  # the held-out data resamples whole pairs); None where the split was made without it.
  held_pair: np.ndarray | None = None


def load_pair_split(
  blimp_dir: pathlib.Path,
  tokenizer,
  *,
  max_len: int,
  eval_pairs: int,
  train_pairs: int | None,
  seed: int,
) -> PairSplit:
  """The BLiMP files in `blimp_dir` (`load_blimp_task`), `eval_pairs` minimal pairs held out
  and `train_pairs` (None: the rest) to train on, drawn by `split_by_pair` with `seed`."""
  data, pair_ids, phen, names = load_blimp_task(blimp_dir, tokenizer, max_len=max_len)
  train_idx, eval_idx = split_by_pair(pair_ids, eval_pairs, train_pairs, seed=seed)
  held_pair = np.unique(pair_ids[eval_idx], return_inverse=True)[1].reshape(-1)
  return PairSplit(
    subset(data, train_idx), subset(data, eval_idx), phen[eval_idx], names, held_pair
  )


def split_groups(
  groups, n_dev: int, n_test: int, n_train: int | None, *, seed: int, strata=None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Row indices `(train, dev, test)`, each group of rows wholly on one side.

  Args:
    groups: (N,) group id of each row (a minimal pair; `arange(N)` for independent rows).
    n_dev, n_test: groups held out for dev and test.
    n_train: groups to train on (None: all the others).
    seed: the permutation's seed.
    strata: optional (N,) label of each row, constant within a group; each split then takes
      every label in proportion to its share (rounded, so counts may move by one).
  """
  groups = np.asarray(groups)
  unique, first = np.unique(groups, return_index=True)
  n_train = len(unique) - n_dev - n_test if n_train is None else n_train
  if min(n_dev, n_test, n_train) < 1 or n_dev + n_test + n_train > len(unique):
    raise ValueError(
      f"{n_dev=}, {n_test=} and {n_train=} must be >= 1 and fit in the {len(unique)} groups"
    )
  rng = np.random.default_rng(seed)
  labels = np.zeros(len(unique), np.int64) if strata is None else np.asarray(strata)[first]
  parts: list[list[np.ndarray]] = [[], [], []]
  for value in np.unique(labels):
    members = rng.permutation(unique[labels == value])
    share = len(members) / len(unique)
    k_dev, k_test = round(n_dev * share), round(n_test * share)
    k_train = round(n_train * share)
    for part, (a, b) in zip(
      parts, ((k_dev + k_test, k_dev + k_test + k_train), (0, k_dev), (k_dev, k_dev + k_test))
    ):
      part.append(members[a:b])
  return tuple(np.flatnonzero(np.isin(groups, np.concatenate(p))) for p in parts)


def subset(data: dict[str, np.ndarray], idx) -> dict[str, np.ndarray]:
  """The rows `idx` of every array of a data dict."""
  return {k: v[idx] for k, v in data.items()}


def batches(data: dict[str, np.ndarray], size: int, limit: int | None = None) -> list[dict]:
  """The first `limit` (default all) rows of `data` in consecutive batches of `size`."""
  n = len(data["labels"]) if limit is None else min(limit, len(data["labels"]))
  if size < 1 or n < 1:
    raise ValueError(f"batch {size=} and the {n} rows must both be >= 1")
  return [{k: v[i : min(i + size, n)] for k, v in data.items()} for i in range(0, n, size)]


def accuracy_by_phenomenon(correct, split: PairSplit) -> dict[str, float]:
  """The share of `correct` (a bool per held-out sentence of `split`) in each phenomenon."""
  correct = np.asarray(correct)
  return {
    name: float(correct[split.held_phenomenon == k].mean())
    for k, name in enumerate(split.phenomena)
  }


def finetune_classifier(config, params, split: PairSplit, hp) -> tuple[Any, dict[str, Any]]:
  """Fine-tunes a sentence classifier (grammatical = 1) on the split's training sentences.

  Args:
    config, params: the model with its classification head (`finetune.prepare_model`).
    split: the BLiMP sentences, split by minimal pair (`load_pair_split`).
    hp: the `finetune.FinetuneConfig` (its `eval_batch_size` also batches the prediction).

  Returns:
    `(params, run)`: the fine-tuned parameters, and the run's held-out `metrics`,
    `final_loss`, `loss` curve and `accuracy_by_phenomenon`.
  """
  from bertjax.training import finetune as ft

  tuned = ft.finetune(config, params, split.train, split.held, task="classification", hp=hp)
  logits = ft.predict(
    tuned["params"], config, split.held, "classification", batch_size=hp.eval_batch_size
  )
  run = {
    "metrics": tuned["metrics"],
    "final_loss": tuned["final_loss"],
    "loss": [h["loss"] for h in tuned["history"]],
    "accuracy_by_phenomenon": accuracy_by_phenomenon(
      logits.argmax(-1) == split.held["labels"], split
    ),
  }
  return tuned["params"], run
