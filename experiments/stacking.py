"""Progressive stacking vs full-depth training: MLM loss against wall-clock time.

    ./run.sh experiment stacking
    .venv/bin/python -m experiments.stacking [--smoke] [--out DIR] [--data-dir DIR]
    .venv/bin/python -m experiments.stacking --scale gpu     (on a GPU: stacking_gpu.json)

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

import jax
import numpy as np

from bertjax import claims, study
from bertjax.claims import Claim, Test
from bertjax.plots import training as plots
from bertjax.training import runs as run_lib
from experiments import common

NAME = "stacking"


@dataclasses.dataclass(frozen=True)
class Scale(study.PretrainScale):
  """Model, data and optimisation sizes of one run (`study.PretrainScale`), and the runs'.

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
  repeats = f"1: baseline, stacked; 2: ABBA (default: {FULL.repeats})"
  parser.add_argument("--repeats", type=int, choices=(1, 2), default=None, help=repeats)
  scale = "cpu: the 6-layer run above; gpu: a 12-layer 256-wide BERT stacked 6 -> 12 "
  scale += "(results and figures named stacking_gpu*)"
  parser.add_argument("--scale", choices=("cpu", "gpu"), default="cpu", help=scale)
  return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
  return run_experiment(parse_args(argv))


@study.smoke_cached
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
  data = study.load_wikitext(args, sc, timings)
  config = sc.bert_config(data.corpus.vocab_size)
  train = sc.train_config(args.seed)
  load_start = os.getloadavg()
  with study.timed(timings, "runs and timing"):
    c = run_lib.stacking_comparison(
      config,
      data,
      train,
      shallow=sc.shallow,
      shallow_steps=round(sc.steps * sc.shallow_fraction),
      repeats=sc.repeats,
      window=sc.window,
      rounds=sc.rounds,
      judge=lambda ratios: TIME.verdict(time_quantities(ratios)),
      log=study.log,
    )
  runs, est = c["runs"], c["estimates"]
  load_end = os.getloadavg()

  per_repeat = est["per_repeat"]
  base_total = float(np.mean([r["total_s"] for r in runs if r["label"].startswith("baseline")]))
  target, deadline = per_repeat[0]["target_smoothed_mlm_loss"], TARGET_RATIO * base_total
  deadline = (deadline, f"{TARGET_RATIO}x baseline time (mean)")
  kw = {"window": sc.window, "target": target, "deadline": deadline}
  figs = plots.stacking_figures(runs, args.out, prefix, **kw)
  n = bertjax.param_counts(config, ("mlm",))["total"]
  results = {
    "data": data.stats,
    "model": {"layers": config.num_hidden_layers, "hidden": config.hidden_size, "params": n},
    "schedule": c["schedule"],
    **run_lib.estimates_record(runs, est, sc.window),
    "ratio_target": TARGET_RATIO,
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
  figs = [p.name for p in figs]
  kw = {"findings": findings, "started": t_start, "figures": figs, "stem": prefix}
  study.finish(NAME, args, results, settings, **kw)
  return 0


# The claims ---------------------------------------------------------------------------------------
# `findings(results, settings)`: the Findings rows, made from the numbers as the JSON holds
# them; `uncertainty(results, settings)`: each claim's interval and verdict.

PAPER = "Gong et al. 2019"
TARGET_RATIO = 0.8


SLOWEST, FASTEST = "the largest estimate of the time ratio", "the smallest"
GAP = "stacked minus full-depth held-out loss (nats)"
LEAD = "the baseline's lead over the unigram loss (nats)"
TIME = Claim(
  PAPER,
  "Progressive stacking reaches the full-depth model's loss in less wall-clock "
  f"time (issue #6: <= {TARGET_RATIO}x the baseline's time).",
  yes=(Test(SLOWEST, "<=", TARGET_RATIO),),
  partly=(Test(FASTEST, "<=", TARGET_RATIO), Test(SLOWEST, "<", 1)),
  missing="no",
  missing_when="a run never reaches the loss",
)
QUALITY = Claim(
  PAPER,
  "The stacked model ends as good as the one trained at full depth.",
  yes=(Test(GAP, "<=", 0.05), Test(LEAD, ">=", 0.1)),  # before 0.1, the test is weak
  partly=(Test(GAP, "<=", 0.15),),
  partly_if="all",
)


def time_quantities(ratios: Sequence[float | None]) -> dict[str, float | None]:
  """What `TIME` reads from the estimates of the time ratio (None: never reached), compile
  excluded."""
  if any(r is None for r in ratios):
    return {SLOWEST: None, FASTEST: None}
  return {SLOWEST: max(ratios), FASTEST: min(ratios)}


def _fmt(r: float | None) -> str:
  return "never" if r is None else f"{r:.2f}x"


def findings(r: dict, s: dict) -> list[dict]:
  """The Findings rows from the results as written to JSON (`r`) and the settings `s`: the
  time to the baseline's loss, the final quality, and the variation's time when there was one."""
  runs = r["runs"]
  base = [x for x in runs if x["label"].startswith("baseline")]
  stack = [x for x in runs if x["label"].startswith("stacked")]
  per_repeat, priced, interleaved = r["ratio_per_repeat"], r["ratio_priced"], r["ratio_interleaved"]
  turn_price = {int(k): v for k, v in r["interleaved_median_step_s"].items()}
  stats_, schedule, variation = r["data"], r["schedule"], r["variation"]
  hb, hs = base[0]["heldout"]["mlm_loss"], stack[0]["heldout"]["mlm_loss"]
  gap = hs - hb
  unigram = stats_["unigram_heldout_mlm_loss"]
  learned = unigram - hb >= 0.1  # past the stage where only token frequencies are known
  acc = base[0]["heldout"]["mlm_accuracy"]
  caveat = (
    f"Both models are {'past' if learned else 'still at'} the unigram stage (held-out "
    f"MLM loss {hb:.3f}, accuracy {acc:.1%}; token frequencies alone give {unigram:.3f})"
    f"; the baseline itself first reached its final smoothed loss at step "
    f"{per_repeat[0]['baseline_reach_step']} of {s['steps']}, stacked at step "
    f"{per_repeat[0]['reach_step']}."
  )
  rep = "; ".join(
    f"repeat {i + 1} {_fmt(c['ratio'])} ({_fmt(c['ratio_with_compile'])} with compile)"
    for i, c in enumerate(per_repeat)
  )
  where = f"on {s['device']}, " if s.get("device") else ""
  shallow, layers = s["shallow"], s["layers"]
  ratios = [c["ratio"] for c in per_repeat] + [priced["ratio"], interleaved["ratio"]]
  rows = [
    TIME.row(
      f"{where}{r['model']['layers']}-layer {r['model']['hidden']}-wide BERT, {s['steps']} "
      "steps on "
      f"WikiText-2, schedule {schedule}: time to reach the baseline's final smoothed MLM loss "
      f"{per_repeat[0]['target_smoothed_mlm_loss']:.3f} / baseline time = {rep}; "
      f"priced at median step times of all runs {_fmt(priced['ratio'])} "
      f"({_fmt(priced['ratio_with_compile'])} with compile); priced at step times measured in "
      f"turns {_fmt(interleaved['ratio'])} ({_fmt(interleaved['ratio_with_compile'])} with "
      f"compile; {shallow}/{layers}-layer step "
      f"{turn_price[shallow] / turn_price[layers]:.2f}x). {caveat} The rule reads the "
      "estimates with compile time excluded.",
      time_quantities(ratios),
    ),
    QUALITY.row(
      f"held-out MLM loss (fixed masks, {stats_['heldout_masked_tokens']} tokens): "
      f"stacked {hs:.3f} vs full depth {hb:.3f} (diff {gap:+.3f} nats; unigram "
      f"{unigram:.3f}).",
      {GAP: gap, LEAD: unigram - hb},
    ),
  ]
  if variation is not None:
    vr = "; ".join(
      f"vs baseline repeat {i + 1} {_fmt(c['ratio'])}"
      for i, c in enumerate(variation["vs_each_baseline"])
    )
    claim = (
      f"(variation, as the {schedule} schedule missed {TARGET_RATIO}x) stacking with "
      f"schedule {variation['schedule']} reaches the full-depth loss in <= {TARGET_RATIO}x "
      "the time."
    )
    ratios = [c["ratio"] for c in variation["vs_each_baseline"]] + [variation["priced"]["ratio"]]
    rows.append(
      dataclasses.replace(TIME, statement=claim).row(
        f"{vr}; priced {_fmt(variation['priced']['ratio'])}; held-out MLM loss "
        f"{runs[-1]['heldout']['mlm_loss']:.3f} vs {hb:.3f}.",
        time_quantities(ratios),
      )
    )
  return rows


# How sure each row is ------------------------------------------------------------------------


def uncertainty(r: dict, s: dict) -> list[claims.Judgement]:
  """The time rows over resampled step times (`run_lib.resampled_estimates`), the quality row
  over the held-out sequences (the two models' losses paired)."""
  rounds = len(r["interleaved_step_s"][str(s["layers"])])
  steps = "each depth's steps of the runs (the per-repeat ratios, one run each, as measured)"
  est = run_lib.resampled_estimates(r, s["window"], resamples=claims.RESAMPLES)
  time = [_time(e, o) for e, o in zip(est, [f"the {rounds} interleaved rounds and {steps}", steps])]
  return [time[0], _quality(r, *r["runs"][:2]), *time[1:]]


def _time(e: dict, over: str) -> claims.Judgement:
  """A time row's judgement on one of `run_lib.resampled_estimates`' dicts."""
  point = time_quantities(e["measured"] + list(e["priced"].values()))
  if point[SLOWEST] is None or any(x is None for x in e["resampled"].values()):
    return TIME.exact(point, "a run never reaches the loss, whatever the step times")
  ratios = np.stack(np.broadcast_arrays(*e["measured"], *e["resampled"].values()))  # (k, R)
  qs = {SLOWEST: ratios.max(0), FASTEST: ratios.min(0), **e["resampled"]}
  low, high = ({k: float(np.percentile(x, q)) for k, x in qs.items()} for q in (2.5, 97.5))
  return TIME.at_ends(point, low, high, over=over, shown=dict.fromkeys(qs, "{:.2f}"))


def _quality(r: dict, base: dict, stacked: dict) -> claims.Judgement:
  """The quality row over the held-out sequences (`run_lib.heldout_sequence_items`)."""
  items = run_lib.heldout_sequence_items([base, stacked], r["data"])
  if items is None:
    return claims.rerun_needed("per-sequence held-out MLM losses: the run predates them")
  h = (base["heldout"]["mlm_loss"], stacked["heldout"]["mlm_loss"])
  point = {GAP: h[1] - h[0], LEAD: r["data"]["unigram_heldout_mlm_loss"] - h[0]}

  def gap(x):  # (R, n, 4) -> stacked's and the unigram's loss minus the baseline's
    base, stacked, unigram = run_lib.heldout_losses(x)
    return {GAP: stacked - base, LEAD: unigram - base}

  shown, over = {GAP: "{:+.3f}", LEAD: "{:.2f}"}, f"the {len(items)} held-out sequences (paired)"
  return QUALITY.judge(items, gap, point=point, over=over, shown=shown)


# Why a model has no run of this experiment (model tag -> the sentence).
NOT_RUN = {
  "all-mpnet-base-v2": (
    "not run on MPNet: it pre-trains its own BERTs from scratch (progressive stacking), "
    "which no checkpoint's weights enter; at MPNet's size (12 x 768) one forward of 32 x "
    "128 tokens takes ~4 s on this CPU class (BERT-base, Measured results), so each "
    "1,000-step run would take > 3 h and the experiment trains three"
  ),
}


if __name__ == "__main__":
  sys.exit(main())
