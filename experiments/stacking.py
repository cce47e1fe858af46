"""Progressive stacking vs full-depth training: MLM loss against wall-clock time.

    ./run.sh experiment stacking
    .venv/bin/python experiments/stacking.py [--smoke] [--out DIR] [--data-dir DIR]
    .venv/bin/python experiments/stacking.py --scale gpu     (on a GPU: stacking_gpu.json)

The method, the data and what differs from the paper: docs/experiments.md, section
`stacking` (the site's Experiments page).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import Any

import common
import jax
import numpy as np
from rules import stacking as rules

from bertjax.training.runs import (
  PretrainingData,
  abba_runs,
  compare_runs,
  median_step_prices,
  time_ratio_estimates,
  train_run,
)

NAME = "stacking"


@dataclasses.dataclass(frozen=True)
class Scale(common.PretrainScale):
  """Model, data and optimisation sizes of one run (`common.PretrainScale`), and the runs'.

  Attributes:
    repeats: 1: baseline, stacked; 2: baseline, stacked, stacked, baseline (ABBA).
    rounds: steps of each depth timed in turns after the runs.
    shallow: the depth of the stacked run's first stage.
    shallow_fraction: the share of the steps trained at that depth.
  """

  repeats: int
  rounds: int
  shallow: int
  shallow_fraction: float


FULL = Scale(
  layers=6,
  hidden=128,
  heads=4,
  ffn=512,
  vocab=8000,
  seq_len=64,
  batch=32,
  steps=1000,
  lr=1e-3,
  warmup=100,
  max_lines=None,
  eval_batches=16,
  window=20,
  repeats=2,
  rounds=20,
  shallow=3,
  shallow_fraction=0.5,
)
# A 12-layer model for a GPU (`--scale gpu`), stacked 6 -> 12 halfway; 600 steps of 64 x 128
# tokens are ~20 epochs of the 228k-token training text (more would only memorise it).
GPU = Scale(
  layers=12,
  hidden=256,
  heads=4,
  ffn=1024,
  vocab=8000,
  seq_len=128,
  batch=64,
  steps=600,
  lr=5e-4,
  warmup=60,
  max_lines=None,
  eval_batches=8,
  window=20,
  repeats=2,
  rounds=20,
  shallow=6,
  shallow_fraction=0.5,
)
SMOKE = Scale(
  layers=2,
  hidden=32,
  heads=2,
  ffn=64,
  vocab=300,
  seq_len=32,
  batch=8,
  steps=8,
  lr=1e-3,
  warmup=1,
  max_lines=400,
  eval_batches=2,
  window=3,
  repeats=1,
  rounds=3,
  shallow=1,
  shallow_fraction=0.5,
)


# Figures --------------------------------------------------------------------


def figures(
  out, runs: list[dict], window: int, target: float, base_total: float, prefix: str = NAME
) -> list[str]:
  """Loss against time and against steps, and every step's time (`prefix_*.png`)."""
  from bertjax.plots import training as plots

  out = pathlib.Path(out)
  colours = {"baseline": "tab:blue", "stacked": "tab:orange", "variation": "tab:green"}
  named = [{**r, "legend": f"{r['label']} ({r['stacking'] or 'full depth'})"} for r in runs]
  first: dict[str, dict] = {}  # of each kind: repeats have the same losses (same seeds)
  for r in runs:
    first.setdefault(r["label"].split("#")[0], r)
  firsts = [{**r, "legend": f"{k} ({r['stacking'] or 'full depth'})"} for k, r in first.items()]
  paths = (
    plots.loss_against_time(
      named,
      window,
      out / f"{prefix}_loss_vs_time.png",
      colours=colours,
      target=target,
      deadline=(rules.TARGET_RATIO * base_total, f"{rules.TARGET_RATIO}x baseline time (mean)"),
      title="Progressive stacking vs full depth: MLM loss against wall-clock time",
    ),
    plots.loss_against_steps(
      firsts,
      window,
      out / f"{prefix}_loss_vs_steps.png",
      colours=colours,
      per_step=True,
      title="MLM loss against steps (dotted: stacking)",
    ),
    plots.step_times(runs, out / f"{prefix}_step_time.png", colours=colours),
  )
  return [p.name for p in paths]


# Main -----------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  """The shared experiment options, `--steps`, `--repeats` and `--scale`."""
  parser = common.parser(__doc__, model=False)
  parser.add_argument(
    "--steps",
    type=int,
    default=None,
    help=f"optimizer steps per run (default: {FULL.steps}; warm-up stays 10%%)",
  )
  parser.add_argument(
    "--repeats",
    type=int,
    choices=(1, 2),
    default=None,
    help=f"1: baseline, stacked; 2: ABBA (default: {FULL.repeats})",
  )
  parser.add_argument(
    "--scale",
    choices=("cpu", "gpu"),
    default="cpu",
    help="cpu: the 6-layer run above; gpu: a 12-layer 256-wide BERT stacked "
    "6 -> 12 (results and figures named stacking_gpu*)",
  )
  return parser.parse_args(argv)


def variation_run(
  runs: list[dict],
  per_repeat: list[dict],
  config,
  data: PretrainingData,
  train,
  sc: Scale,
  timings: dict[str, float],
) -> dict[str, Any]:
  """One variation of the shallow stage's length, run when the criterion fails: a quality
  shortfall (never reached) gets a shorter shallow stage, a time shortfall a longer one.

  Appends the run to `runs`. Returns its schedule, why, its estimates and its verdict.
  """
  base = [r for r in runs if r["label"].startswith("baseline")]
  never = any(c["ratio"] is None for c in per_repeat)
  frac = 0.3 if never else 0.7
  var_schedule = f"{sc.shallow}:{round(sc.steps * frac)},{sc.layers}"
  with common.timed(timings, "variation"):
    run = train_run(
      "variation#1",
      config,
      data,
      dataclasses.replace(train, stacking=var_schedule),
      data.eval_batches,
      log=common.log,
    )
  runs.append(run)
  v_measured = [compare_runs(b, run, sc.window) for b in base]
  # The variation ran once: its measured time against each baseline repeat, and priced.
  v_priced = compare_runs(base[0], run, sc.window, step_price=median_step_prices(runs))
  return {
    "schedule": var_schedule,
    "why": "never reached the target: shorter shallow stage"
    if never
    else "reached it too late: longer shallow stage",
    "shallow_fraction": frac,
    "vs_each_baseline": v_measured,
    "priced": v_priced,
    "verdict": rules.TIME.verdict(
      rules.time_quantities([c["ratio"] for c in v_measured] + [v_priced["ratio"]])
    ),
  }


APPROACH = (
  "per-step time = from handing over batch k to asking for batch k+1 "
  "(step, logging, growth), data loading excluded; compile = first step of each "
  "stage minus the stage's median step, removed from the curves and reported; "
  "smoothed loss = trailing {window}-step mean of the training MLM loss "
  "(same batches and masks in every run); target = baseline's final smoothed "
  "loss; ratio = first time the stacked smoothed loss <= target / baseline "
  "total time; 'priced' prices each step at the median step time of its depth "
  "over all runs (robust to load spikes); 'interleaved' at the median of steps "
  "of each depth timed in turns after the runs (robust to load drift)"
)


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  with common.smoke_compilation_cache(args.smoke):
    return run_experiment(args)


def run_experiment(args) -> int:
  """The experiment on parsed arguments."""
  t_start = time.perf_counter()
  import bertjax

  sc = SMOKE if args.smoke else GPU if args.scale == "gpu" else FULL
  prefix = NAME if args.scale == "cpu" else f"{NAME}_gpu"
  sc = sc.with_steps(args.steps, minimum=10)
  if args.repeats is not None:
    sc = dataclasses.replace(sc, repeats=args.repeats)
  timings: dict[str, float] = {}
  data = common.load_wikitext(args, sc, timings)
  config = bertjax.BertConfig(
    vocab_size=data.corpus.vocab_size,
    hidden_size=sc.hidden,
    num_hidden_layers=sc.layers,
    num_attention_heads=sc.heads,
    intermediate_size=sc.ffn,
    max_position_embeddings=sc.seq_len,
  )
  train = sc.train_config(args.seed)
  shallow_steps = round(sc.steps * sc.shallow_fraction)
  schedule = f"{sc.shallow}:{shallow_steps},{sc.layers}"
  load_start = os.getloadavg()
  with common.timed(timings, "training"):
    runs = abba_runs(config, data, train, schedule, repeats=sc.repeats, log=common.log)
  with common.timed(timings, "interleaved timing"):
    est = time_ratio_estimates(
      runs,
      config,
      data,
      train,
      window=sc.window,
      depths=(sc.shallow, sc.layers),
      rounds=sc.rounds,
      log=common.log,
    )
  verdict = rules.TIME.verdict(rules.time_quantities(est["ratios"]))
  variation = None
  if verdict != "yes":
    variation = variation_run(runs, est["per_repeat"], config, data, train, sc, timings)
  price = median_step_prices(runs)
  load_end = os.getloadavg()

  per_repeat = est["per_repeat"]
  base_total = float(np.mean([r["total_s"] for r in runs if r["label"].startswith("baseline")]))
  figs = figures(
    args.out, runs, sc.window, per_repeat[0]["target_smoothed_mlm_loss"], base_total, prefix
  )
  results = {
    "data": data.stats,
    "model": {
      "layers": config.num_hidden_layers,
      "hidden": config.hidden_size,
      "params": bertjax.param_counts(config, ("mlm",))["total"],
    },
    "approach": (
      "one process; runs in the order "
      + ", ".join(r["label"] for r in runs)
      + "; "
      + APPROACH.format(window=sc.window)
    ),
    "schedule": schedule,
    "ratio_per_repeat": per_repeat,
    "ratio_priced": est["priced"],
    "ratio_interleaved": est["interleaved"],
    "interleaved_step_s": est["turns"],
    "interleaved_median_step_s": est["turn_price"],
    "median_step_s_by_depth": price,
    "ratio_target": rules.TARGET_RATIO,
    "verdict": verdict,
    "variation": variation,
    "repeat_max_abs_loss_diff": est["determinism"],
    "heldout_mlm_loss": {r["label"]: r["heldout"] for r in runs},
    "compile_s": {r["label"]: r["compile_s"] for r in runs},
    "loadavg": {"start": load_start, "end": load_end},
    "runs": runs,
    "timings_s": timings,
  }
  settings = {
    **dataclasses.asdict(sc),
    "seed": args.seed,
    "objective": "none (MLM only, RoBERTa FULL-SENTENCES)",
    "optimizer": "adamw",
    "decay": "linear",
    "train": dataclasses.asdict(train),
    "model_config": dataclasses.asdict(config),
    "device": jax.devices()[0].device_kind if args.scale == "gpu" else None,
  }
  common.write_results(
    NAME,
    args.out,
    results,
    findings=rules.findings,
    settings=settings,
    smoke=args.smoke,
    seconds=time.perf_counter() - t_start,
    figures=figs,
    stem=prefix,
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
