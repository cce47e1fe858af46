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
import sys
import time
from collections.abc import Sequence

import common
import jax
import numpy as np
from rules import stacking as rules

from bertjax.plots import training as plots
from bertjax.training.runs import estimates_record, stacking_comparison

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


FULL, GPU, SMOKE = (Scale(**common.sizes(NAME)[k]) for k in ("full", "gpu", "smoke"))


# Main -----------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  """The shared experiment options, `--steps`, `--repeats` and `--scale`."""
  parser = common.parser(__doc__, model=False, steps=FULL.steps)
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


def main(argv: Sequence[str] | None = None) -> int:
  return run_experiment(parse_args(argv))


@common.smoke_cached
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
  config = sc.bert_config(data.corpus.vocab_size)
  train = sc.train_config(args.seed)
  load_start = os.getloadavg()
  with common.timed(timings, "runs and timing"):
    c = stacking_comparison(
      config,
      data,
      train,
      shallow=sc.shallow,
      shallow_steps=round(sc.steps * sc.shallow_fraction),
      repeats=sc.repeats,
      window=sc.window,
      rounds=sc.rounds,
      judge=lambda ratios: rules.TIME.verdict(rules.time_quantities(ratios)),
      log=common.log,
    )
  runs, est = c["runs"], c["estimates"]
  load_end = os.getloadavg()

  per_repeat = est["per_repeat"]
  base_total = float(np.mean([r["total_s"] for r in runs if r["label"].startswith("baseline")]))
  figs = plots.stacking_figures(
    runs,
    args.out,
    prefix,
    window=sc.window,
    target=per_repeat[0]["target_smoothed_mlm_loss"],
    deadline=(rules.TARGET_RATIO * base_total, f"{rules.TARGET_RATIO}x baseline time (mean)"),
  )
  results = {
    "data": data.stats,
    "model": {
      "layers": config.num_hidden_layers,
      "hidden": config.hidden_size,
      "params": bertjax.param_counts(config, ("mlm",))["total"],
    },
    "schedule": c["schedule"],
    **estimates_record(runs, est, sc.window),
    "ratio_target": rules.TARGET_RATIO,
    "verdict": c["verdict"],
    "variation": c["variation"],
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
  common.finish(
    NAME, args, results, settings, started=t_start, figures=[p.name for p in figs], stem=prefix
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
