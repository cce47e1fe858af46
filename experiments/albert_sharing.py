"""ALBERT's two parameter reductions vs BERT: parameters, MLM loss and step time.

    ./run.sh experiment albert_sharing
    .venv/bin/python experiments/albert_sharing.py [--smoke] [--out DIR] [--data-dir DIR]

The method, the data and what differs from the paper: docs/experiments.md, section
`albert_sharing` (the site's Experiments page).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import Any

import common
import numpy as np
from findings import Rule, Test

from bertjax.training.runs import train_run

NAME = "albert_sharing"
PAPER = "Lan et al. 2020"
VARIANTS = ("bert", "albert", "shared_only", "factorized_only")
# Lan et al. 2020, Table 1 (millions): BERT-base 108M, ALBERT-base 12M.
PAPER_BASE_RATIO = 12 / 108


@dataclasses.dataclass(frozen=True)
class Scale(common.PretrainScale):
  """Model, data and optimisation sizes of one run (`common.PretrainScale`), and ALBERT's
  factorised embedding width `embedding` (E)."""

  embedding: int


FULL = Scale(
  layers=6,
  hidden=128,
  heads=4,
  ffn=512,
  embedding=32,
  vocab=8000,
  seq_len=64,
  batch=32,
  steps=600,
  lr=1e-3,
  warmup=60,
  max_lines=None,
  eval_batches=16,
  window=20,
)
SMOKE = Scale(
  layers=2,
  hidden=32,
  heads=2,
  ffn=64,
  embedding=8,
  vocab=300,
  seq_len=32,
  batch=8,
  steps=6,
  lr=1e-3,
  warmup=1,
  max_lines=400,
  eval_batches=2,
  window=3,
)


def model_configs(sc: Scale, vocab_size: int) -> dict[str, Any]:
  """The four models: BERT, ALBERT (shared + factorised) and the two single reductions."""
  import bertjax

  shared = {
    "vocab_size": vocab_size,
    "hidden_size": sc.hidden,
    "num_hidden_layers": sc.layers,
    "num_attention_heads": sc.heads,
    "intermediate_size": sc.ffn,
    "max_position_embeddings": sc.seq_len,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
  }
  albert = {**shared, "model_type": "albert"}
  return {
    "bert": bertjax.BertConfig(**shared),
    "albert": bertjax.BertConfig(**albert, embedding_size=sc.embedding, num_hidden_groups=1),
    "shared_only": bertjax.BertConfig(**albert, embedding_size=sc.hidden, num_hidden_groups=1),
    "factorized_only": bertjax.BertConfig(
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
    "paper_ratio": PAPER_BASE_RATIO,
  }


BASE = "ALBERT-base's parameters over BERT-base's"
BASE_ERROR = "the distance of ALBERT-base's parameters over BERT-base's from 12/108"
SMALL = "ALBERT's share of BERT's parameters here"
LEAD = "the best model's lead over the unigram loss (nats)"
ALBERT_COST = "ALBERT's held-out loss minus BERT's"
SHARING_EXTRA = "sharing's cost minus factorising's"
STEP = "the sharing-only step time over BERT's"
PARAMS = Rule(
  PAPER,
  "ALBERT has far fewer parameters than BERT of the same depth and width "
  "(ALBERT-base 12M vs BERT-base 108M, ~1/9).",
  yes=(Test(BASE_ERROR, "<=", 0.02), Test(SMALL, "<", 1)),
  partly=(Test(BASE, "<", 0.5),),
  partly_if="all",
)
QUALITY = Rule(
  PAPER,
  "At the same depth and width ALBERT is somewhat worse than BERT; sharing "
  "layers costs more than factorising the embedding (Tables 3-4).",
  yes=(Test(ALBERT_COST, ">", 0), Test(SHARING_EXTRA, ">", 0)),
  applies=(Test(LEAD, ">=", 0.1),),  # before that, the models know only token frequencies
)
COMPUTE = Rule(
  PAPER,
  "Sharing parameters does not reduce per-step compute (every layer still runs).",
  yes=(Test(STEP, ">=", 0.85),),
  partly=(Test(STEP, ">=", 0.7),),
)


def quality_quantities(heldout: dict[str, float], unigram: float) -> dict[str, float]:
  """What `QUALITY` reads from the held-out MLM losses and the unigram loss."""
  return {
    LEAD: unigram - min(heldout.values()),
    ALBERT_COST: heldout["albert"] - heldout["bert"],
    SHARING_EXTRA: heldout["shared_only"] - heldout["factorized_only"],
  }


def findings(r: dict, s: dict) -> list[dict]:
  """The Findings rows from the results as written to JSON (`r`) and the settings `s`.

  Each `holds` follows the stated rule; the quality row says how this small, short run differs
  from Lan et al.'s comparison and what that can do to the order of the two costs.
  """
  r = common.from_json(r)
  base, params, data = r["base_size"], r["params"], r["data"]
  heldout = {v: h["mlm_loss"] for v, h in r["heldout"].items()}
  d, step = r["heldout_minus_bert"], r["median_step_s"]
  small_ratio = params["albert"]["total"] / params["bert"]["total"]
  shared_step = step["shared_only"] / step["bert"]
  unigram = data["unigram_heldout_mlm_loss"]
  load = r["loadavg"]
  early = unigram - heldout["bert"]
  return [
    PARAMS.row(
      f"presets: ALBERT-base {base['albert_base'] / 1e6:.1f}M vs BERT-base "
      f"{base['bert_base'] / 1e6:.1f}M = 1/{1 / base['ratio']:.1f}; here ({s['layers']} "
      f"layers x {s['hidden']}, vocab {data['vocab_size']}, with MLM head): ALBERT "
      f"{params['albert']['total'] / 1e6:.2f}M vs BERT {params['bert']['total'] / 1e6:.2f}M "
      f"= 1/{1 / small_ratio:.1f} (sharing only {params['shared_only']['total'] / 1e6:.2f}M, "
      f"factorising only {params['factorized_only']['total'] / 1e6:.2f}M).",
      {
        BASE: base["ratio"],
        BASE_ERROR: abs(base["ratio"] - PAPER_BASE_RATIO),
        SMALL: small_ratio,
      },
    ),
    QUALITY.row(
      f"held-out MLM loss after {s['steps']} steps (fixed masks): BERT {heldout['bert']:.3f}, "
      f"ALBERT {heldout['albert']:.3f} ({d['albert']:+.3f}), sharing only "
      f"{heldout['shared_only']:.3f} ({d['shared_only']:+.3f}), factorising only "
      f"{heldout['factorized_only']:.3f} ({d['factorized_only']:+.3f}); token frequencies "
      f"alone give {unigram:.3f}, BERT's accuracy {r['heldout']['bert']['mlm_accuracy']:.1%}. "
      f"Differs from Lan et al.: {s['steps']} steps from scratch at {s['layers']} x "
      f"{s['hidden']} (E = {s['embedding']}) on {data['train_tokens']:,} WikiText-2 tokens, "
      "scored by held-out MLM loss; Lan et al. compare base-size models (E = 128) after 125k "
      f"steps on downstream tasks. BERT is only {early:.2f} nats past the unigram loss: at "
      "this early stage what the models have learned is mostly token statistics, which a "
      "narrow embedding limits more than shared layers do, so the order of the two costs "
      "need not carry over to trained models.",
      quality_quantities(heldout, unigram),
    ),
    COMPUTE.row(
      f"median train step: BERT {step['bert'] * 1e3:.0f} ms, sharing only "
      f"{step['shared_only'] * 1e3:.0f} ms ({shared_step:.2f}x), ALBERT "
      f"{step['albert'] * 1e3:.0f} ms ({step['albert'] / step['bert']:.2f}x), factorising "
      f"only {step['factorized_only'] * 1e3:.0f} ms; shared CPU, load "
      f"{load['start'][0]:.1f}->{load['end'][0]:.1f}.",
      {STEP: shared_step},
    ),
  ]


def figures(out, runs: dict[str, dict], params: dict[str, dict], window: int) -> list[str]:
  """Loss against steps and the bars of parameters, held-out loss and step time per model."""
  from bertjax.plots import training as plots

  out = pathlib.Path(out)
  curves = [
    {**runs[v], "label": v, "legend": f"{v} ({params[v]['total'] / 1e6:.2f}M params)"}
    for v in VARIANTS
  ]
  loss = [runs[v]["heldout"]["mlm_loss"] for v in VARIANTS]
  panels = [
    {
      "values": [params[v]["total"] / 1e6 for v in VARIANTS],
      "label": "parameters (M, with MLM head)",
    },
    {
      "values": loss,
      "label": "held-out MLM loss (nats)",
      "ylim": (min(loss) - 0.2, max(loss) + 0.1),
    },
    {"values": [runs[v]["median_step_s"] for v in VARIANTS], "label": "median train step (s)"},
  ]
  paths = (
    plots.loss_against_steps(
      curves,
      window,
      out / f"{NAME}_loss_vs_steps.png",
      title="BERT vs ALBERT reductions: same data, steps and schedule",
    ),
    plots.model_bars(
      VARIANTS,
      panels,
      out / f"{NAME}_summary.png",
      title="Parameters, held-out MLM loss and step time per model",
      colours=("tab:blue", "tab:orange", "tab:green", "tab:red"),
    ),
  )
  return [p.name for p in paths]


def main(argv: Sequence[str] | None = None) -> int:
  parser = common.parser(__doc__, model=False)
  parser.add_argument(
    "--steps",
    type=int,
    default=None,
    help=f"optimizer steps per model (default: {FULL.steps}; warm-up stays 10%%)",
  )
  args = parser.parse_args(argv)
  with common.smoke_compilation_cache(args.smoke):
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
  figs = figures(args.out, runs, params, sc.window)
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
    "objective": "none (MLM only, RoBERTa FULL-SENTENCES)",
    "train": dataclasses.asdict(train),
    "model_configs": {v: dataclasses.asdict(c) for v, c in configs.items()},
  }
  common.write_results(
    NAME,
    args.out,
    results,
    findings=findings,
    settings=settings,
    smoke=args.smoke,
    seconds=time.perf_counter() - t_start,
    figures=figs,
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
