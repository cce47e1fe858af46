"""Kovaleva et al. 2019's random-initialisation control: one architecture fine-tuned from its
pre-trained weights and from random ones, with the same budget and early stopping, on fresh
train / dev / test splits per seed, beside a majority-class and a lexical baseline.

`compare_inits` runs one task over its seeds; `summarise` gives the means, spreads and the
gain ratio r, random's share of the pre-trained model's gain over the majority class.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from bertjax.tasks.acceptability import split_groups, subset
from bertjax.tasks.baselines import bag_of_words_accuracy, majority_accuracy, word_tag_accuracy
from bertjax.training.early_stopping import EarlyStopping, train_early_stopping

INITS = ("pretrained", "random")


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
    `splits` (sizes per seed), `baselines` (`majority` and `lexical` test accuracy per seed:
    the lexical one is the commonest tag of a word for token tasks, a logistic regression on
    the set of subwords for sentence tasks) and `runs` (per seed: `seed` and, per
    initialisation, `train_early_stopping`'s result).
  """
  out: dict[str, list] = {"splits": [], "baselines": [], "runs": []}
  for seed in seeds:
    tr, dv, te = split_groups(task["groups"], *task["counts"], seed=seed, strata=task["strata"])
    train, dev, test = (subset(task["data"], i) for i in (tr, dv, te))
    out["splits"].append({"train": len(tr), "dev": len(dv), "test": len(te)})
    if task["kind"] == "token_classification":
      lexical = word_tag_accuracy(train, test)
    else:
      lexical = bag_of_words_accuracy(train, test, special_ids, steps=bow_steps)
    out["baselines"].append({"majority": majority_accuracy(train, test), "lexical": lexical})
    config, pre, rnd = models(seed)
    run: dict[str, Any] = {"seed": seed}
    for init, params in zip(INITS, (pre, rnd), strict=True):
      r = train_early_stopping(
        config, params, train, dev, test, kind=task["kind"], rule=rule, seed=seed
      )
      run[init] = r
      if log:
        log(
          f"seed {seed} {init}: test {r['test']:.3f} (dev {r['dev']:.3f} at step "
          f"{r['best_step']} of {r['steps']}; converged {r['converged']})"
        )
    out["runs"].append(run)
  return out


def gain_ratio(random: float, pretrained: float, majority: float) -> float | None:
  """r: random's share of the pre-trained model's gain over the majority class (None when the
  pre-trained model does not beat it)."""
  gain = pretrained - majority
  return None if gain <= 0 else float((random - majority) / gain)


def summarise(runs: Sequence[dict], baselines: Sequence[dict]) -> dict[str, Any]:
  """Means and spreads (sample SD; 0 for one seed) of one task's `compare_inits` runs: each
  initialisation's test accuracy, the baselines, the per-seed gap, `gain_ratio` of the means,
  `score_ratio` (random's mean over the pre-trained one's), how many runs converged before
  the step budget, and each run's steps."""
  pre = np.asarray([r["pretrained"]["test"] for r in runs])
  rnd = np.asarray([r["random"]["test"] for r in runs])
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
  }
