"""Fine-tuning from random initialisation vs pre-trained weights (Kovaleva et al. 2019).

Run:
  ./run.sh experiment random_init
  .venv/bin/python experiments/random_init.py [--smoke] [--model DIR_OR_HUB_ID] [--out DIR]
      [--data-dir DIR] [--seed N] [--update-results]

The method, the data and what differs from the paper: docs/experiments.md, section
`random_init` (the site's Experiments page).
"""

from __future__ import annotations

import pathlib
import sys
import time
from collections.abc import Sequence
from typing import Any

import common
from rules import random_init as rules

from bertjax.tasks import init_control
from bertjax.training.early_stopping import EarlyStopping

NAME = "random_init"
TASKS = init_control.TASKS
SIZES = common.sizes(NAME)  # experiments/sizes.toml
SMOKE_MODEL = {**common.SMOKE_MODEL, "max_position_embeddings": 64}  # the tiny smoke BERT
RULE = (
  "r = (random - majority) / (pre-trained - majority) on the seeds' mean test accuracy; "
  "yes if r >= 0.75, partly if r >= 0.4, no below; n/a if pre-trained <= majority"
)


# Verdict --------------------------------------------------------------------------------


def summarise(
  runs: list[dict], baselines: list[dict], splits: list[dict] | None = None
) -> dict[str, Any]:
  """`init_control.summarise` of one task's runs with the verdict of `rules.LEXICAL` (`holds`)."""
  summary = init_control.summarise(runs, baselines, splits)
  return {**summary, "holds": rules.LEXICAL.verdict({rules.R: summary["gain_ratio"]})}


# The run --------------------------------------------------------------------------------


def scale_of(smoke: bool, layers: int) -> str:
  """The table of sizes.toml a run uses: "smoke", "base" for a model of 12 or more layers
  (BERT-base's shape runs at its own committed size: sizes.toml says why), else "full"."""
  return "smoke" if smoke else "base" if layers >= 12 else "full"


def _models(args, num_labels: int, kind: str, seed: int):
  """(config, pre-trained params, random params of the same architecture), fresh heads; the
  smoke run's stand-in for the pre-trained model is drawn with another seed than the random one."""
  from bertjax.training import finetune as ft

  stand_in = args.smoke and not args.model
  pre_seed = 10_000 + seed if stand_in else seed
  config, pre, _, _ = common.finetune_model(
    args, kind, num_labels, smoke=SMOKE_MODEL, seed=pre_seed
  )
  _, rnd = ft.prepare_model(kind, num_labels, config=config, seed=seed)
  return config, pre, rnd


def main(argv: Sequence[str] | None = None) -> None:
  """Runs the experiment and writes `random_init.json` and its figures."""
  import bertjax

  p = common.parser(__doc__)
  p.add_argument(
    "--tasks",
    default=",".join(TASKS),
    help=f"comma-separated subset of {','.join(TASKS)} (default: all)",
  )
  p.add_argument(
    "--seeds",
    type=int,
    default=None,
    help=f"seeds of every task (default: sizes.toml's, {SIZES['full']['seeds']}, fewer for some "
    f"tasks of a 12-layer model; --smoke: {SIZES['smoke']['seeds']})",
  )
  args = p.parse_args(argv)
  t_start = time.perf_counter()
  wanted = [t for t in args.tasks.split(",") if t]
  if not wanted or set(wanted) - set(TASKS):
    p.error(f"--tasks {args.tasks!r} must name some of {TASKS}")
  if args.seeds is not None and args.seeds < 1:
    p.error(f"--seeds {args.seeds} must be >= 1")
  timings: dict[str, float] = {}
  layers = 6  # all-MiniLM-L6-v2
  if args.model:
    config, _, tok, model_name = common.pretrained(args.model)
    layers = config.num_hidden_layers
  else:
    tok = bertjax.Tokenizer.from_pretrained(bertjax.minilm_path())
    model_name = "tiny random BERT (smoke stand-in)" if args.smoke else "all-MiniLM-L6-v2"
  scale = scale_of(args.smoke, layers)
  size = {**SIZES[scale], "scale": scale}
  if args.seeds is not None:
    size["seeds"], size["task_seeds"] = args.seeds, None
  task_seeds = {t: (size["task_seeds"] or {}).get(t, size["seeds"]) for t in wanted}
  common.log(f"sizes: [{NAME}.{scale}] of experiments/sizes.toml; seeds per task {task_seeds}")
  with common.timed(timings, "load"):
    need = [d for t, d in (("upos", "ud_english_ewt"), ("blimp", "blimp")) if t in wanted]
    root = common.data_dir(args.data_dir, *need) if need else None
    tasks = init_control.control_tasks(
      tok,
      size,
      ud=common.ud_file(root) if "upos" in wanted else None,
      blimp=root / "blimp" if "blimp" in wanted else None,
      wanted=wanted,
    )
  special = [tok.cls_id, tok.sep_id, tok.pad_id]
  rule = EarlyStopping.pick(size)
  results: dict[str, dict] = {}
  for name, task in tasks.items():
    with common.timed(timings, name):
      done = init_control.compare_inits(
        task,
        lambda seed, task=task: _models(args, task["num_labels"], task["kind"], seed),
        seeds=[args.seed + s for s in range(task_seeds[name])],
        rule=rule,
        special_ids=special,
        bow_steps=size["bow_steps"],
        log=lambda line, name=name: common.log(f"{name} {line}"),
      )
    results[name] = {
      "what": task["what"],
      "kind": task["kind"],
      **done,
      "summary": summarise(done["runs"], done["baselines"], done["splits"]),
    }
    common.log(f"{name}: {results[name]['summary']}")

  results = {"tasks": results, "timings_s": timings}
  settings = {
    "model": model_name,
    **size,
    "seed": args.seed,
    "rule": RULE,
    "optimizer": "AdamW (weight decay 0.01, clip 1.0), constant learning rate after "
    "linear warm-up, same for both initialisations",
    "stopping": "dev accuracy every eval_every steps; stop after patience "
    "evaluations without improvement (not before min_steps); test "
    "accuracy of the best-dev checkpoint",
    "lexical_baseline": "sentence tasks: L2 logistic regression on the set of "
    "subwords; upos: commonest training tag of the word's first "
    "subword",
  }
  with common.timed(timings, "figures"):
    from bertjax.plots import finetuning as plots

    stem = common.results_stem(NAME, args.model)  # the file names' start
    out = pathlib.Path(args.out)
    figures = [
      plots.init_learning_curves(results["tasks"], out / f"{stem}_curves.png").name,
      plots.init_scores(results["tasks"], out / f"{stem}_scores.png").name,
    ]
  common.finish(NAME, args, results, settings, started=t_start, figures=figures)


if __name__ == "__main__":
  main(sys.argv[1:])
