"""ALBERT's two parameter reductions vs BERT: parameters, MLM loss and step time.

    ./run.sh experiment albert_sharing
    .venv/bin/python experiments/albert_sharing.py [--smoke] [--out DIR] [--data-dir DIR]

The method, the data and what differs from the paper: docs/experiments.md, section
`albert_sharing` (the site's Experiments page).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import common
import numpy as np
from rules import albert_sharing as rules

from bertjax.plots import training as plots
from bertjax.training.runs import train_run

NAME = "albert_sharing"
VARIANTS = ("bert", "albert", "shared_only", "factorized_only")


@dataclasses.dataclass(frozen=True)
class Scale(common.PretrainScale):
  """Model, data and optimisation sizes of one run (`common.PretrainScale`), and ALBERT's
  factorised embedding width `embedding` (E)."""

  embedding: int


FULL, SMOKE = (Scale(**common.sizes(NAME)[k]) for k in ("full", "smoke"))


def model_configs(sc: Scale, vocab_size: int) -> dict[str, Any]:
  """The four models: BERT, ALBERT (shared + factorised) and the two single reductions."""
  dropout = {"hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}
  shared = {"vocab_size": vocab_size, "hidden_act": "gelu", **dropout}
  albert = {**shared, "model_type": "albert"}
  return {
    "bert": sc.bert_config(**shared),
    "albert": sc.bert_config(**albert, embedding_size=sc.embedding, num_hidden_groups=1),
    "shared_only": sc.bert_config(**albert, embedding_size=sc.hidden, num_hidden_groups=1),
    "factorized_only": sc.bert_config(
      **albert, embedding_size=sc.embedding, num_hidden_groups=sc.layers
    ),
  }


def base_size_counts() -> dict[str, Any]:
  """BERT-base and ALBERT-base (the presets, each with its own vocabulary), as in Table 1."""
  import bertjax

  bert = bertjax.param_counts(bertjax.BertConfig.preset("bert-base"))["model"]
  albert = bertjax.param_counts(bertjax.BertConfig.preset("albert-base"))["model"]
  return {
    "bert_base": bert,
    "albert_base": albert,
    "ratio": albert / bert,
    "paper_ratio": rules.PAPER_BASE_RATIO,
  }


def main(argv: Sequence[str] | None = None) -> int:
  parser = common.parser(__doc__, model=False, steps=FULL.steps)
  args = parser.parse_args(argv)
  with common.quick_compiles(args.smoke), common.smoke_compilation_cache(args.smoke):
    return run_experiment(args)


def run_experiment(args) -> int:
  """The experiment on parsed arguments."""
  t_start = time.perf_counter()
  import bertjax

  sc = (SMOKE if args.smoke else FULL).with_steps(args.steps, minimum=10)
  timings: dict[str, float] = {}
  data = common.load_wikitext(args, sc, timings)
  configs = model_configs(sc, data.corpus.vocab_size)
  params = {v: bertjax.param_counts(c, ("mlm",)) for v, c in configs.items()}
  base = base_size_counts()
  train = sc.train_config(args.seed)
  load_start = os.getloadavg()
  runs: dict[str, dict] = {}
  with common.timed(timings, "training"):
    for v in VARIANTS:
      r = train_run(v, configs[v], data, train, data.eval_batches, log=common.log)
      r["median_step_s"] = float(np.median(r["loop_step_s"][1:]))  # the first one compiles
      runs[v] = r
  load_end = os.getloadavg()

  heldout = {v: runs[v]["heldout"]["mlm_loss"] for v in VARIANTS}
  step = {v: runs[v]["median_step_s"] for v in VARIANTS}
  small_ratio = params["albert"]["total"] / params["bert"]["total"]
  title = "BERT vs ALBERT reductions: same data, steps and schedule"
  figs = plots.variant_figures(runs, params, sc.window, args.out, NAME, title)
  d = {v: heldout[v] - heldout["bert"] for v in VARIANTS}
  results = {
    "data": data.stats,
    "params": params,
    "base_size": base,
    "param_ratio_albert_vs_bert": small_ratio,
    "heldout": {v: runs[v]["heldout"] for v in VARIANTS},
    "heldout_minus_bert": d,
    "median_step_s": step,
    "step_ratio_vs_bert": {v: step[v] / step["bert"] for v in VARIANTS},
    "compile_s": {v: runs[v]["compile_s"] for v in VARIANTS},
    "approach": (
      "one process, runs in the order " + ", ".join(VARIANTS) + "; step time = the "
      "loop's own per-step time (data loading excluded), median over steps, "
      "first step (compile) excluded"
    ),
    "loadavg": {"start": load_start, "end": load_end},
    "runs": runs,
    "timings_s": timings,
  }
  settings = {
    **dataclasses.asdict(sc),
    "seed": args.seed,
    "xla_optimised": not args.smoke,  # --smoke: `common.quick_compiles`
    "objective": "none (MLM only, RoBERTa FULL-SENTENCES)",
    "train": dataclasses.asdict(train),
    "model_configs": {v: dataclasses.asdict(c) for v, c in configs.items()},
  }
  common.finish(NAME, args, results, settings, started=t_start, figures=[p.name for p in figs])
  return 0


if __name__ == "__main__":
  sys.exit(main())
