"""Kovaleva et al. 2019's random-initialisation control: one architecture fine-tuned from its
pre-trained weights and from random ones, with the same budget and early stopping, on fresh
train / dev / test splits per seed, beside a majority-class and a lexical baseline.

`control_tasks` loads the four tasks (negation and questions from the shipped sentences, UD
EWT UPOS, BLiMP's minimal pairs), `compare_inits` runs one task over its seeds, and
`summarise` gives the means, spreads and the gain ratio r, random's share of the pre-trained
model's gain over the majority class. `pooled_counts` and `pooled_scores` give the same means
and r from each test example's correctness, for a bootstrap over the test examples.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from bertjax.tasks.acceptability import load_blimp_task, split_groups, subset
from bertjax.tasks.baselines import bag_of_words_accuracy, majority_accuracy, word_tag_accuracy
from bertjax.tasks.sentences import labelled_sentences
from bertjax.training import finetune as ft
from bertjax.training.early_stopping import EarlyStopping, train_early_stopping
from bertjax.training.losses import IGNORE_INDEX

INITS = ("pretrained", "random")
TASKS = ("negation", "question", "upos", "blimp")


def control_tasks(
  tok,
  size: Mapping[str, Any],
  *,
  ud: pathlib.Path | None = None,
  blimp: pathlib.Path | None = None,
  wanted: Sequence[str] = TASKS,
) -> dict[str, dict[str, Any]]:
  """The `wanted` tasks of `TASKS` as `compare_inits` takes them: each one's data, groups
  (what a split keeps together: BLiMP's minimal pairs), strata, label count, kind, the
  (dev, test, train) counts from `size` and what its metric is.

  Args:
    tok: the model's `bertjax.Tokenizer`.
    size: the sizes: `max_len`, `sentence_dev`, `sentence_test`, `sentence_limit` (optional:
      the first sentences only), `upos_max_len`, `upos_dev`, `upos_test`, `upos_train`,
      `blimp_dev`, `blimp_test`, `blimp_train`.
    ud: UD English EWT's dev `.conllu` file (needed for "upos").
    blimp: the directory of BLiMP's paradigms (needed for "blimp").
    wanted: which of `TASKS`.

  Raises:
    ValueError: a task of `wanted` that is not in `TASKS`, or whose data was not given.
  """
  unknown = [t for t in wanted if t not in TASKS]
  missing = [t for t, p in (("upos", ud), ("blimp", blimp)) if t in wanted and p is None]
  if unknown or missing:
    raise ValueError(
      f"tasks {unknown} are not among {TASKS}" if unknown else f"tasks {missing} need their data"
    )
  limit = size.get("sentence_limit")
  tasks = {}
  for name, field in (("negation", "negated"), ("question", "question")):
    if name not in wanted:
      continue
    data = labelled_sentences(tok, field, max_len=size["max_len"], limit=limit)
    n = len(data["labels"])
    tasks[name] = {
      "data": data,
      "groups": np.arange(n),
      "strata": data["labels"],
      "num_labels": 2,
      "kind": "classification",
      "counts": (size["sentence_dev"], size["sentence_test"], None),
      "what": f"sentences.tsv, {field} = 1 (sentence accuracy)",
    }
  if "upos" in wanted:
    # load_ud_pos splits; its tiny held-out share is put back so each seed splits the lot.
    part, held, tags = ft.load_ud_pos(ud, tok, max_len=size["upos_max_len"], eval_fraction=0.01)
    data = {k: np.concatenate([part[k], held[k]]) for k in part}
    tasks["upos"] = {
      "data": data,
      "groups": np.arange(len(data["labels"])),
      "strata": None,
      "num_labels": len(tags),
      "kind": "token_classification",
      "tags": tags,
      "counts": (size["upos_dev"], size["upos_test"], size["upos_train"]),
      "what": "UD EWT dev, UPOS of each word (token accuracy)",
    }
  if "blimp" in wanted:
    data, pairs, _, phenomena = load_blimp_task(blimp, tok, max_len=size["max_len"])
    tasks["blimp"] = {
      "data": data,
      "groups": pairs,
      "strata": None,
      "num_labels": 2,
      "kind": "classification",
      "phenomena": phenomena,
      "counts": (size["blimp_dev"], size["blimp_test"], size["blimp_train"]),
      "what": "BLiMP " + ", ".join(phenomena) + " (sentence accuracy)",
    }
  return tasks


def compare_inits(
  task: dict[str, Any],
  models: Callable[[int], tuple[Any, Any, Any]],
  *,
  seeds: Sequence[int],
  rule: EarlyStopping,
  special_ids: Sequence[int],
  bow_steps: int,
  log: Callable[[str], None] | None = None,
) -> dict[str, list]:
  """Both initialisations of one task, one split per seed.

  Args:
    task: `data` (padded arrays with `labels`), `groups` (items that stay on one side of a
      split, e.g. BLiMP's minimal pairs), `strata` (labels to stratify by, or None), `counts`
      (dev, test, train sizes; train None: the rest) and `kind` ("classification" or
      "token_classification").
    models: seed -> `(config, pre-trained params, random params)`, both with a fresh head.
    seeds: one split and one pair of fine-tunings each.
    rule: the early stopping both fine-tunings use.
    special_ids: token ids the bag-of-words baseline leaves out ([CLS], [SEP], padding).
    bow_steps: the bag-of-words baseline's optimisation steps.
    log: called with one line per fine-tuning.

  Returns:
    `splits` (sizes per seed; `test_items`: the test accuracy's denominator, sentences or
    labelled tokens; `test_groups` and `test_scored`: each test row's group and how many
    items it scores), `baselines` (`majority` and `lexical` test accuracy per seed: the
    lexical one is the commonest tag of a word for token tasks, a logistic regression on the
    set of subwords for sentence tasks; `majority_correct`: the majority class's correctness
    on each test item) and `runs` (per seed: `seed` and, per initialisation,
    `train_early_stopping`'s result, its `test_correct` as a string). A correctness is a
    string of "0" and "1", one per scored item (sentences, or labelled tokens row by row).
  """
  out: dict[str, list] = {"splits": [], "baselines": [], "runs": []}
  for seed in seeds:
    tr, dv, te = split_groups(task["groups"], *task["counts"], seed=seed, strata=task["strata"])
    train, dev, test = (subset(task["data"], i) for i in (tr, dv, te))
    keep = test["labels"] != IGNORE_INDEX
    per_row = keep.reshape(len(te), -1).sum(1)  # 1 per sentence, or its labelled tokens
    out["splits"].append(
      {
        "train": len(tr),
        "dev": len(dv),
        "test": len(te),
        "test_items": int(per_row.sum()),  # sentences, or labelled tokens
        "test_groups": np.asarray(task["groups"])[te].tolist(),
        "test_scored": per_row.tolist(),
      }
    )
    if task["kind"] == "token_classification":
      lexical = word_tag_accuracy(train, test)
    else:
      lexical = bag_of_words_accuracy(train, test, special_ids, steps=bow_steps)
    majority = majority_correct(train, test)
    out["baselines"].append(
      {
        "majority": majority_accuracy(train, test),
        "lexical": lexical,
        "majority_correct": bits(majority),
      }
    )
    config, pre, rnd = models(seed)
    run: dict[str, Any] = {"seed": seed}
    for init, params in zip(INITS, (pre, rnd), strict=True):
      r = train_early_stopping(
        config, params, train, dev, test, kind=task["kind"], rule=rule, seed=seed
      )
      run[init] = {**r, "test_correct": bits(r["test_correct"])}
      if log:
        log(
          f"seed {seed} {init}: test {r['test']:.3f} (dev {r['dev']:.3f} at step "
          f"{r['best_step']} of {r['steps']}; converged {r['converged']})"
        )
    out["runs"].append(run)
  return out


def bits(correct) -> str:
  """Booleans as a string of "0" and "1" (compact in JSON)."""
  return "".join("1" if c else "0" for c in np.asarray(correct, bool).tolist())


def majority_correct(train: dict, test: dict) -> np.ndarray:
  """Whether `train`'s commonest label (tag) is right on each scored item of `test` (-100
  marks no label; row by row): the items `baselines.majority_accuracy` averages."""
  y_train, y_test = train["labels"], test["labels"]
  y_train, y_test = y_train[y_train != IGNORE_INDEX], y_test[y_test != IGNORE_INDEX]
  return y_test == np.bincount(y_train).argmax()


def gain_ratio(random: float, pretrained: float, majority: float) -> float | None:
  """r: random's share of the pre-trained model's gain over the majority class (None when the
  pre-trained model does not beat it)."""
  gain = pretrained - majority
  return None if gain <= 0 else float((random - majority) / gain)


def summarise(
  runs: Sequence[dict], baselines: Sequence[dict], splits: Sequence[dict] | None = None
) -> dict[str, Any]:
  """Means and spreads (sample SD; 0 for one seed) of one task's `compare_inits` runs: each
  initialisation's test accuracy, the baselines, the per-seed gap, `gain_ratio` of the means,
  `score_ratio` (random's mean over the pre-trained one's), how many runs converged before
  the step budget, and each run's steps. With `splits` (`test_items` per seed), also each
  mean's test-sampling standard error, `pretrained_se` and `random_se`: the binomial
  sqrt(sum_s p_s (1 - p_s) / n_s) / seeds over the seeds' test accuracies p_s on n_s items
  (it ignores that a sentence's tokens are not independent, and the seed-to-seed spread)."""
  pre = np.asarray([r["pretrained"]["test"] for r in runs])
  rnd = np.asarray([r["random"]["test"] for r in runs])
  se = {}
  if splits is not None:
    n = np.asarray([s["test_items"] for s in splits], dtype=np.float64)
    for init, p in (("pretrained", pre), ("random", rnd)):
      se[f"{init}_se"] = float(np.sqrt(np.sum(p * (1 - p) / n)) / len(p))
  majority = float(np.mean([b["majority"] for b in baselines]))
  gap = pre - rnd
  sd = lambda x: float(x.std(ddof=1)) if len(x) > 1 else 0.0
  return {
    "pretrained": float(pre.mean()),
    "pretrained_sd": sd(pre),
    "random": float(rnd.mean()),
    "random_sd": sd(rnd),
    "majority": majority,
    "lexical_baseline": float(np.mean([b["lexical"] for b in baselines])),
    "gap": float(gap.mean()),
    "gap_sd": sd(gap),
    "gap_min": float(gap.min()),
    "gap_max": float(gap.max()),
    "gain_ratio": gain_ratio(float(rnd.mean()), float(pre.mean()), majority),
    "score_ratio": float(rnd.mean() / pre.mean()),
    "converged": {init: sum(r[init]["converged"] for r in runs) for init in INITS},
    "steps": {init: [r[init]["steps"] for r in runs] for init in INITS},
    **se,
  }


def pooled_counts(task: Mapping[str, Any]) -> np.ndarray | None:
  """Each test group's counts per seed, the items a bootstrap over test examples resamples.

  The seeds' test splits are drawn from one pool and may overlap, so the items are the groups
  (sentences; BLiMP's minimal pairs) in any seed's test split, and a group drawn k times
  counts k times in every seed whose test split holds it: the seeds stay paired.

  Args:
    task: one task's `compare_inits` result (`splits`, `baselines`, `runs`, with the
      per-example fields).

  Returns:
    (groups, 4, seeds) counts: scored items, then the pre-trained model's, the random one's
    and the majority class's correct items (0 where a seed's test split lacks the group); or
    None where the result keeps no per-example correctness (runs before it was kept).
  """
  splits, runs, base = task["splits"], task["runs"], task["baselines"]
  if any("test_groups" not in s for s in splits):
    return None
  groups = np.unique(np.concatenate([s["test_groups"] for s in splits]))
  out = np.zeros((len(groups), 4, len(splits)), np.int64)
  for k, (split, run, b) in enumerate(zip(splits, runs, base, strict=True)):
    rows = np.searchsorted(groups, split["test_groups"])
    item_rows = np.repeat(rows, split["test_scored"])  # each scored item's group
    out[:, 0, k] = np.bincount(item_rows, minlength=len(groups))
    marks = (run["pretrained"]["test_correct"], run["random"]["test_correct"])
    for j, m in enumerate((*marks, b["majority_correct"]), 1):
      if len(m) != len(item_rows):
        raise ValueError(f"{len(m)=} correctness marks for the {len(item_rows)} scored items")
      right = np.frombuffer(m.encode(), np.uint8) == ord("1")
      out[:, j, k] = np.bincount(item_rows, weights=right, minlength=len(groups))
  return out


def pooled_scores(counts: np.ndarray) -> dict[str, np.ndarray]:
  """The seeds' mean test accuracy of each initialisation and of the majority class, the
  pre-trained model's gain over the majority class, and `gain_ratio` of them, "r" (NaN where
  the gain is not positive), from `pooled_counts` with any leading axes:
  `(..., groups, 4, seeds)` -> `(...)` each. All are NaN where a seed scores no item."""
  c = np.asarray(counts, np.float64).sum(-3)  # (..., 4, seeds)
  n = np.broadcast_to(c[..., :1, :], c[..., 1:, :].shape)
  acc = np.divide(c[..., 1:, :], n, out=np.full(n.shape, np.nan), where=n > 0).mean(-1)
  pre, rnd, maj = acc[..., 0], acc[..., 1], acc[..., 2]
  gain = pre - maj
  r = np.where(gain > 0, (rnd - maj) / np.where(gain > 0, gain, 1), np.nan)
  return {"pretrained": pre, "random": rnd, "majority": maj, "gain": gain, "r": r}
