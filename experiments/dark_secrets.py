"""Revealing the Dark Secrets of BERT (Kovaleva et al. 2019) on a fine-tuned all-MiniLM-L6-v2.

Run:
  ./run.sh experiment dark_secrets
  .venv/bin/python experiments/dark_secrets.py [--smoke] [--model DIR_OR_HUB_ID] [--out DIR]
      [--data-dir DIR] [--seed N]

The method, the data and what differs from the paper: docs/experiments.md, section
`dark_secrets` (the site's Experiments page).
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import Any

import common
from rules import dark_secrets as rules

from bertjax.analysis.finetuning import effects_record, fine_tuning_effects
from bertjax.plots import finetuning as plots
from bertjax.tasks.acceptability import PairSplit, batches, finetune_classifier, load_pair_split

NAME = "dark_secrets"
SIZES = common.sizes(NAME)  # experiments/sizes.toml
SMOKE_MODEL = {**common.SMOKE_MODEL, "max_position_embeddings": 64}  # the tiny smoke BERT


# The run --------------------------------------------------------------------------------


def results_of(task: PairSplit, run: dict, m: dict[str, Any], config) -> dict[str, Any]:
  """The result file's `results`: the task, the fine-tuning run and every measurement."""
  held_phen, names, labels = task.held_phenomenon, task.phenomena, task.held["labels"]
  r = effects_record(m)
  r["attention_change"]["last_layers"] = max(1, round(config.depth * rules.LAST_FRACTION))
  task_record = {
    "name": "BLiMP acceptability (grammatical=1 vs ungrammatical=0)",
    "phenomena": names,
    "train_sentences": len(task.train["labels"]),
    "eval_sentences": len(labels),
    "chance": float(max(labels.mean(), 1 - labels.mean())),
    "eval_per_phenomenon": {n: int((held_phen == k).sum()) for k, n in enumerate(names)},
  }
  return {"task": task_record, "finetune": run, **r}


def main(argv: Sequence[str] | None = None) -> None:
  """Runs the experiment and writes `dark_secrets.json` and its figures."""
  args = common.parser(__doc__).parse_args(argv)
  t_start = time.perf_counter()
  from bertjax.analysis.attention import patterns
  from bertjax.training import finetune as ft

  size = SIZES["smoke" if args.smoke else "full"]
  timings: dict[str, float] = {}
  data_root = common.data_dir(args.data_dir, "blimp")

  with common.timed(timings, "load"):
    config, pre_params, tok, model_name = common.finetune_model(
      args, "classification", 2, smoke=SMOKE_MODEL, seed=args.seed
    )
    task = load_pair_split(
      data_root / "blimp",
      tok,
      max_len=size["max_len"],
      eval_pairs=size["eval_pairs"],
      train_pairs=size["train_pairs"],
      seed=args.seed,
    )
  common.log(
    f"{model_name}; BLiMP {task.phenomena}: {len(task.train['labels'])} train / "
    f"{len(task.held['labels'])} held-out sentences, length "
    f"{task.held['input_ids'].shape[1]}"
  )
  budget = {k: size[k] for k in ("steps", "batch_size", "learning_rate", "warmup_steps")}
  hp = ft.FinetuneConfig(**budget, seed=args.seed, eval_batch_size=size["eval_batch"])
  with common.timed(timings, "finetune"):
    params, run = finetune_classifier(config, pre_params, task, hp)
  common.log(f"fine-tuned: held-out {run['metrics']}")
  held = batches(task.held, size["eval_batch"])
  m = fine_tuning_effects(
    pre_params,
    params,
    config,
    held,
    batches(task.held, size["eval_batch"], size["analysis_sentences"]),
    special_ids=[tok.cls_id, tok.sep_id],
    strategy=size["ablation_strategy"],
  )
  timings.update(m.pop("seconds"))
  change = m["change"]
  stem = common.results_stem(NAME, args.model)  # the file names' start
  with common.timed(timings, "figures"):
    out = pathlib.Path(args.out)
    figures = [
      plots.pattern_types_before_after(m["before"], m["after"], out / f"{stem}_patterns.png"),
      plots.disabled_heads_and_layers(m["acc"], out / f"{stem}_ablation.png"),
      plots.attention_change(change.cosine, change.cka, out / f"{stem}_change.png"),
    ]
    figures = [p.name for p in figures]

  results = {**results_of(task, run, m, config), "timings_s": timings}
  settings = {
    "model": model_name,
    "model_config": {
      k: getattr(config, k)
      for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    },
    "special_tokens": common.special_tokens(tok),
    "task": "BLiMP acceptability, split by minimal pair",
    **size,
    "seed": args.seed,
    "ablation": "accuracy; uniform: every head, every layer, block skips; scale: every layer",
    "pattern_thresholds": dataclasses.asdict(patterns.PatternThresholds()),
    "analysis": f"held-out sentences (patterns and change: the first {size['analysis_sentences']})",
  }
  common.finish(NAME, args, results, settings, started=t_start, figures=figures)


if __name__ == "__main__":
  main(sys.argv[1:])
