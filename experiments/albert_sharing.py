"""ALBERT's two parameter reductions vs BERT: parameters, MLM loss and step time.

    ./run.sh experiment albert_sharing
    .venv/bin/python -m experiments.albert_sharing [--smoke] [--out DIR] [--data-dir DIR]

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

import numpy as np

from bertjax import claims, study
from bertjax.claims import Claim, Test
from bertjax.plots import training as plots
from bertjax.training.runs import heldout_losses, heldout_sequence_items, train_run
from experiments import common

NAME = "albert_sharing"
VARIANTS = ("bert", "albert", "shared_only", "factorized_only")


@dataclasses.dataclass(frozen=True)
class Scale(study.PretrainScale):
  """Model, data and optimisation sizes of one run (`study.PretrainScale`), and ALBERT's
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
    "paper_ratio": PAPER_BASE_RATIO,
  }


def main(argv: Sequence[str] | None = None) -> int:
  parser = common.parser(__doc__, model=False, steps=FULL.steps)
  args = parser.parse_args(argv)
  with study.quick_compiles(args.smoke), study.smoke_compilation_cache(args.smoke):
    return run_experiment(args)


def run_experiment(args) -> int:
  """The experiment on parsed arguments."""
  t_start = time.perf_counter()
  import bertjax

  sc = (SMOKE if args.smoke else FULL).with_steps(args.steps, minimum=10)
  timings: dict[str, float] = {}
  data = study.load_wikitext(args, sc, timings)
  configs = model_configs(sc, data.corpus.vocab_size)
  params = {v: bertjax.param_counts(c, ("mlm",)) for v, c in configs.items()}
  base = base_size_counts()
  train = sc.train_config(args.seed)
  load_start = os.getloadavg()
  runs: dict[str, dict] = {}
  with study.timed(timings, "training"):
    for v in VARIANTS:
      r = train_run(v, configs[v], data, train, data.eval_batches, log=study.log)
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
    "xla_optimised": not args.smoke,  # --smoke: `study.quick_compiles`
    "objective": "none (MLM only, RoBERTa FULL-SENTENCES)",
    "train": dataclasses.asdict(train),
    "model_configs": {v: dataclasses.asdict(c) for v, c in configs.items()},
  }
  study.finish(
    NAME,
    args,
    results,
    settings,
    findings=findings,
    started=t_start,
    figures=[p.name for p in figs],
  )
  return 0


# The claims ---------------------------------------------------------------------------------------
# `findings(results, settings)`: the Findings rows, made from the numbers as the JSON holds
# them; `uncertainty(results, settings)`: each claim's interval and verdict.

PAPER = "Lan et al. 2020"


# Lan et al. 2020, Table 1 (millions): BERT-base 108M, ALBERT-base 12M.
PAPER_BASE_RATIO = 12 / 108


BASE = "ALBERT-base's parameters over BERT-base's"
BASE_ERROR = "the distance of ALBERT-base's parameters over BERT-base's from 12/108"
SMALL = "ALBERT's share of BERT's parameters here"
LEAD = "the best model's lead over the unigram loss (nats)"
ALBERT_COST = "ALBERT's held-out loss minus BERT's"
SHARING_EXTRA = "sharing's cost minus factorising's"
STEP = "the sharing-only step time over BERT's"
PARAMS = Claim(
  PAPER,
  "ALBERT has far fewer parameters than BERT of the same depth and width "
  "(ALBERT-base 12M vs BERT-base 108M, ~1/9).",
  yes=(Test(BASE_ERROR, "<=", 0.02), Test(SMALL, "<", 1)),
  partly=(Test(BASE, "<", 0.5),),
  partly_if="all",
)
QUALITY = Claim(
  PAPER,
  "At the same depth and width ALBERT is somewhat worse than BERT; sharing "
  "layers costs more than factorising the embedding (Tables 3-4).",
  yes=(Test(ALBERT_COST, ">", 0), Test(SHARING_EXTRA, ">", 0)),
  applies=(Test(LEAD, ">=", 0.1),),  # before that, the models know only token frequencies
  short="ALBERT is somewhat worse than BERT at the same size; sharing layers costs more than factorising embeddings.",
)
COMPUTE = Claim(
  PAPER,
  "Sharing parameters does not reduce per-step compute (every layer still runs).",
  yes=(Test(STEP, ">=", 0.85),),
  partly=(Test(STEP, ">=", 0.7),),
)


def quality_quantities(heldout: dict[str, float], unigram: float) -> dict[str, float]:
  """What `QUALITY` reads from the held-out MLM losses and the unigram loss (numbers, or
  arrays with one value per resample)."""
  return {
    LEAD: unigram - np.min(np.stack(list(heldout.values())), 0),
    ALBERT_COST: heldout["albert"] - heldout["bert"],
    SHARING_EXTRA: heldout["shared_only"] - heldout["factorized_only"],
  }


def findings(r: dict, s: dict) -> list[dict]:
  """The Findings rows from the results as written to JSON (`r`) and the settings `s`.

  Each `holds` follows the stated rule; the quality row says how this small, short run differs
  from Lan et al.'s comparison and what that can do to the order of the two costs.
  """
  r = study.from_json(r)
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


# How sure each row is ------------------------------------------------------------------------


def uncertainty(r: dict, s: dict) -> list[claims.Judgement]:
  """Parameter counts are exact; the quality over the held-out sequences (the four models'
  losses and the unigram loss's paired); the step-time ratio over the runs' steps."""
  steps = np.asarray(
    [r["runs"][k]["loop_step_s"][1:] for k in ("bert", "shared_only")], float
  ).T  # (steps, 2); the first step compiles
  step = findings(r, s)[2]["value"]["value"]  # the row's own ratio, of the runs' medians
  ratio = lambda t: {STEP: np.median(t[..., 1], 1) / np.median(t[..., 0], 1)}
  return [
    claims.note("exact: parameter counts, nothing sampled"),
    _quality(r),
    COMPUTE.judge(
      steps, ratio, point={STEP: step}, over=f"{len(steps)} steps", shown={STEP: "{:.2f}"}
    ),
  ]


def _quality(r: dict) -> claims.Judgement:
  """The quality row over the held-out sequences (`heldout_sequence_items`)."""
  items = heldout_sequence_items([r["runs"][v] for v in VARIANTS], r["data"])
  if items is None:
    return claims.rerun_needed("per-sequence held-out MLM losses: the run predates them")
  heldout = {v: h["mlm_loss"] for v, h in r["heldout"].items()}
  point = quality_quantities(heldout, r["data"]["unigram_heldout_mlm_loss"])

  def quantities(x):  # (R, n, 6) -> what the rule reads, (R,) each
    *losses, unigram = heldout_losses(x)
    return quality_quantities(dict(zip(VARIANTS, losses)), unigram)

  shown = {ALBERT_COST: "{:+.3f}", SHARING_EXTRA: "{:+.3f}", LEAD: "{:.2f}"}
  over = f"the {len(items)} held-out sequences (the four models paired)"
  return QUALITY.judge(items, quantities, point=point, over=over, shown=shown)


# Why a model has no run of this experiment (model tag -> the sentence).
NOT_RUN = {
  "all-mpnet-base-v2": (
    "not run on MPNet: it pre-trains its own small BERT and ALBERT models from scratch, "
    "which no checkpoint's weights enter (ALBERT's sharing has no MPNet counterpart: "
    "BertConfig refuses num_hidden_groups for model_type mpnet)"
  ),
}


if __name__ == "__main__":
  sys.exit(main())
