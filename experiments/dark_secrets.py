"""Revealing the Dark Secrets of BERT (Kovaleva et al. 2019) on a fine-tuned all-MiniLM-L6-v2.

Run:
  ./run.sh experiment dark_secrets
  .venv/bin/python -m experiments.dark_secrets [--smoke] [--model DIR_OR_HUB_ID] [--out DIR]
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

import numpy as np

from bertjax import claims, study
from bertjax.analysis import finetuning as ftx
from bertjax.claims import Claim, Test
from bertjax.plots import finetuning as plots
from bertjax.tasks.acceptability import PairSplit, batches, finetune_classifier, load_pair_split
from experiments import common

NAME = "dark_secrets"
SIZES = common.sizes(NAME)  # experiments/sizes.toml
SMOKE_MODEL = {**study.SMOKE_MODEL, "max_position_embeddings": 64}  # the tiny smoke BERT


# The run --------------------------------------------------------------------------------


def results_of(task: PairSplit, run: dict, m: dict[str, Any], config) -> dict[str, Any]:
  """The result file's `results`: the task, the fine-tuning run and every measurement."""
  held_phen, names, labels = task.held_phenomenon, task.phenomena, task.held["labels"]
  r = ftx.effects_record(m)
  if task.held_pair is not None:  # each held-out sentence's minimal pair, for the interval
    r["ablation"]["per_example"]["pair"] = task.held_pair
  r["attention_change"]["last_layers"] = max(1, round(config.depth * LAST_FRACTION))
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
  data_root = study.data_dir(args.data_dir, "blimp")

  with study.timed(timings, "load"):
    config, pre_params, tok, model_name = study.finetune_model(
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
  study.log(
    f"{model_name}; BLiMP {task.phenomena}: {len(task.train['labels'])} train / "
    f"{len(task.held['labels'])} held-out sentences, length "
    f"{task.held['input_ids'].shape[1]}"
  )
  budget = {k: size[k] for k in ("steps", "batch_size", "learning_rate", "warmup_steps")}
  hp = ft.FinetuneConfig(**budget, seed=args.seed, eval_batch_size=size["eval_batch"])
  with study.timed(timings, "finetune"):
    params, run = finetune_classifier(config, pre_params, task, hp)
  study.log(f"fine-tuned: held-out {run['metrics']}")
  held = batches(task.held, size["eval_batch"])
  m = ftx.fine_tuning_effects(
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
  stem = study.results_stem(NAME, args.model)  # the file names' start
  with study.timed(timings, "figures"):
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
    "special_tokens": study.special_tokens(tok),
    "task": "BLiMP acceptability, split by minimal pair",
    **size,
    "seed": args.seed,
    "ablation": "accuracy; uniform: every head, every layer, block skips; scale: every layer",
    "pattern_thresholds": dataclasses.asdict(patterns.PatternThresholds()),
    "analysis": f"held-out sentences (patterns and change: the first {size['analysis_sentences']})",
  }
  study.finish(NAME, args, results, settings, findings=findings, started=t_start, figures=figures)


# The claims ---------------------------------------------------------------------------------------
# `findings(results, settings)`: the Findings rows, made from the numbers as the JSON holds
# them; `uncertainty(results, settings)`: each claim's interval and verdict.

PAPER = "Kovaleva et al. 2019"


LAST_FRACTION = 1 / 3  # "the last layers": the top third of the stack (layers 4-5 of 6)


FEWEST, MOST = "the lower of the two models' repeated-type shares", "the higher"
VERTICAL = "the models whose commonest repeated type is vertical"
HEADS, LAYERS = "the heads that improve when disabled", "the layers"
OVER_SE = "the best gain minus one standard error"
LAST_LOWEST = "the least-similar layer lies in the last third (1 or 0)"
LAST_GAP = "the last third's mean cosine minus the rest's"
PATTERNS = Claim(
  PAPER,
  "Attention maps fall into a few repeated types (vertical, diagonal, both, block); "
  "vertical is the commonest.",
  yes=(Test(FEWEST, ">=", 0.5), Test(VERTICAL, ">=", 2)),
  partly=(Test(MOST, ">=", 0.25),),
  partly_if="all",
)
DISABLING = Claim(
  PAPER,
  "Disabling some single heads or whole layers improves the fine-tuned model.",
  yes=(Test(HEADS, ">", 0), Test(LAYERS, ">", 0), Test(OVER_SE, ">", 0)),
  partly=(Test(HEADS, ">", 0), Test(LAYERS, ">", 0)),
)
CHANGE = Claim(
  PAPER,
  "Fine-tuning changes the attention of the last layers most.",
  yes=(Test(LAST_LOWEST, ">=", 1), Test(LAST_GAP, "<", 0)),
)


def pattern_quantities(before: dict, after: dict) -> dict[str, float]:
  """What `PATTERNS` reads from the two models' `PatternCounts.summary`."""
  shares = [p["repeated_share"] for p in (before, after)]
  vertical = sum(p["commonest_repeated"] == "vertical" for p in (before, after))
  return {FEWEST: min(shares), MOST: max(shares), VERTICAL: vertical}


def disabling_quantities(acc: dict, standard_error: float) -> dict[str, float]:
  """What `DISABLING` reads from one mode's `AblationResult.improvements` (or from
  `finetuning.disabling_gains`, one value per resample)."""
  best = np.maximum(acc["best_head_delta"], acc["best_layer_delta"])
  return {
    HEADS: acc["heads_improving"],
    LAYERS: acc["layers_improving"],
    OVER_SE: best - standard_error,
  }


def change_quantities(layer_cosine) -> dict[str, float]:
  """What `CHANGE` reads from the mean cosine of each layer's maps before and after."""
  cos = np.asarray(layer_cosine, np.float64)
  k = max(1, round(len(cos) * LAST_FRACTION))
  return {
    LAST_LOWEST: float(int(np.argmin(cos)) >= len(cos) - k),
    LAST_GAP: float(cos[-k:].mean() - cos[:-k].mean()),
  }


def findings(r: dict, s: dict) -> list[dict]:
  """The Findings rows (pattern types, disabling heads and layers, what fine-tuning changes)
  from the results and settings as written to JSON."""
  before, after = r["patterns"]["before"], r["patterns"]["after"]
  change = r["attention_change"]
  layer_cos = np.asarray(change["layer_cosine"], np.float64)
  depth, heads = len(layer_cos), len(change["cosine"][0])
  k_last = max(1, round(depth * LAST_FRACTION))
  u, sc, se = (
    r["ablation"]["uniform"],
    r["ablation"]["scale"],
    r["ablation"]["accuracy_standard_error"],
  )
  pct = lambda x: f"{100 * x:.0f}%"
  return [
    PATTERNS.row(
      f"{s['model']} on BLiMP sentences: repeated types "
      f"{pct(before['repeated_share'])} of maps before fine-tuning, "
      f"{pct(after['repeated_share'])} after (vertical "
      f"{pct(before['overall'][0])} -> {pct(after['overall'][0])}; heterogeneous "
      f"{pct(before['overall'][4])} -> {pct(after['overall'][4])}); commonest repeated type "
      f"{before['commonest_repeated']} / {after['commonest_repeated']}; no block type with "
      "single sentences.",
      pattern_quantities(before, after),
    ),
    DISABLING.row(
      f"uniform mode: {u['heads_improving']}/{depth * heads} heads and {u['layers_improving']}/"
      f"{depth} layers beat the baseline accuracy {100 * u['baseline']:.1f}% (best "
      f"{100 * u['best_head_delta']:+.1f} / {100 * u['best_layer_delta']:+.1f} points; 1 SE = "
      f"{100 * se:.1f}, {r['task']['eval_sentences']} sentences); {sc['layers_improving']} "
      f"layers in scale mode, {u['layer_skips_improving']} skipped blocks.",
      disabling_quantities(u, se),
    ),
    CHANGE.row(
      "mean cosine of attention maps before/after by layer "
      + ", ".join(f"{c:.2f}" for c in layer_cos)
      + f" (last {k_last} layers {layer_cos[-k_last:].mean():.2f} vs "
      f"{layer_cos[:-k_last].mean():.2f}); hidden-state CKA, embeddings then layers, "
      + ", ".join(f"{c:.2f}" for c in change["cka"])
      + ".",
      change_quantities(layer_cos),
    ),
  ]


# How sure each row is ------------------------------------------------------------------------


def uncertainty(r: dict, s: dict) -> list[claims.Judgement]:
  """One judgement per row: 95% intervals over the analysed sentences for the pattern types
  (each sentence's maps of each type, before and after, resampled together) and for what
  fine-tuning changes (each sentence's cosine by layer); over the held-out minimal pairs for
  disabling (each sentence's correctness intact and under every uniform mask, a pair's two
  sentences resampled together; every count recomputed on each resample)."""
  p, change = r["patterns"], r["attention_change"]
  over = lambda n: f"the {n} analysed sentences"
  patterns = claims.rerun_needed("per-sentence pattern types")
  if p["before"].get("per_sequence") is not None:
    types = np.stack([np.asarray(p[k]["per_sequence"], float) for k in ("before", "after")], 1)

    def shares(x):  # (R, n, 2, 5): each model's repeated share and commonest repeated type
      c = x.sum(1)
      share = c / c.sum(-1, keepdims=True)
      repeated = share[..., :4].sum(-1)
      vertical = (share[..., :4].argmax(-1) == 0).sum(-1)
      return {FEWEST: repeated.min(-1), MOST: repeated.max(-1), VERTICAL: vertical}

    shown = {FEWEST: "{:.2f}", MOST: "{:.2f}"}
    patterns = PATTERNS.judge(types, shares, over=over(len(types)), shown=shown)
  moved = claims.rerun_needed("per-sentence attention maps' cosines")
  if change.get("per_sentence_layer_cosine") is not None:
    cos = np.asarray(change["per_sentence_layer_cosine"], float)
    k = max(1, round(cos.shape[1] * LAST_FRACTION))

    def last(x):  # (R, n, L): where the least similar layer is, the last third's gap
      c = x.mean(1)
      return {
        LAST_LOWEST: (c.argmin(-1) >= c.shape[-1] - k).astype(float),
        LAST_GAP: c[:, -k:].mean(-1) - c[:, :-k].mean(-1),
      }

    moved = CHANGE.judge(cos, last, over=over(len(cos)), shown={LAST_GAP: "{:+.3f}"})
  return [patterns, _disabling(r["ablation"]), moved]


def _disabling(ab: dict) -> claims.Judgement:
  """The disabling row over the held-out minimal pairs."""
  c = ftx.disabling_correct(ab)
  if c is None:
    return claims.rerun_needed("per-sentence correctness under each mask")
  n = len(c["baseline"])
  items = tuple(ftx.by_group(c[k], c["pair"]) for k in ("baseline", "heads", "layers"))

  def gains(*x):  # (R, pairs, 2, ...): each mask's accuracy on a resample of the pairs
    g = ftx.disabling_gains(*(a.mean((1, 2)) for a in x), n=n)
    return disabling_quantities(g, g["standard_error"])

  over = f"the {len(items[0])} held-out minimal pairs ({n} sentences)"
  point = disabling_quantities(ab["uniform"], ab["accuracy_standard_error"])
  shown = {HEADS: "{:.0f}", LAYERS: "{:.0f}", OVER_SE: "{:+.3f}"}
  return DISABLING.judge(items, gains, point=point, over=over, shown=shown)


if __name__ == "__main__":
  sys.exit(main())
