"""Where is syntax strongest? Probing every layer of all-MiniLM-L6-v2 on UD English EWT.

Run:
  ./run.sh experiment probing_layers            # the full run (~2.5 min CPU; 4-8 min wall)
  .venv/bin/python -m experiments.probing_layers [--smoke] [--model DIR_OR_HUB_ID]

The method, the data and what differs from the paper: docs/experiments.md, section
`probing_layers` (the site's Experiments page).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
from collections.abc import Sequence

import numpy as np

from bertjax import claims, stats, study
from bertjax.claims import Claim, Test
from experiments import common

NAME = "probing_layers"


def _suite(args):
  """The probes of a run: every probe as the library fits it, or, for --smoke, a few steps."""
  from bertjax.analysis.representations import probing, probing_run, structural

  quick = {
    "probe": probing.ProbeConfig(learning_rate=1e-2, max_steps=20, batch_size=256, eval_every=10),
    "structural_config": structural.StructuralConfig(
      rank=8, max_steps=20, batch_size=8, eval_every=10
    ),
    "anisotropy_pairs": 200,
  }
  return probing_run.SuiteConfig(
    tasks=("upos", "deprel"),
    mlp=args.mlp,
    control=True,
    structural=True,
    structural_max_sentences=args.structural_sentences,
    seed=args.seed,
    **(quick if args.smoke else {}),
  )


@study.one_blas_thread
def main(argv: Sequence[str] | None = None) -> int:
  p = common.parser(__doc__)
  p.add_argument(
    "--sentences",
    type=int,
    default=None,
    help="use only the first N EWT dev sentences (default: all 2,001; --smoke: 40)",
  )
  p.add_argument(
    "--structural-sentences",
    type=int,
    default=1200,
    help="at most this many sentences (<= 40 words) for the structural probes",
  )
  p.add_argument(
    "--mlp",
    action=argparse.BooleanOptionalAction,
    default=True,
    help="also fit an MLP UPOS probe with its control task, for Hewitt & Liang's "
    "linear-vs-MLP selectivity comparison (default: on)",
  )
  args = p.parse_args(argv)
  t_start = time.perf_counter()
  timings: dict[str, float] = {}

  from bertjax.analysis.representations import probing_run
  from bertjax.data import conllu
  from bertjax.plots.probing import probing_layers_figures

  data = study.data_dir(args.data_dir, "ud_english_ewt")
  n_sent = args.sentences or (40 if args.smoke else None)
  path = study.ud_file(data, "dev")
  sentences = conllu.read_conllu(path, max_sentences=n_sent)
  with study.timed(timings, "load model"):
    config, params, tok, model_name = study.load_model(args)
  suite = _suite(args)
  study.log(f"probing {model_name} on {len(sentences)} sentences of {path.name}")
  with study.timed(timings, "probing suite"):
    r = probing_run.run_probing_suite(
      params, config, tok, sentences, suite=suite, model_name=model_name
    )

  curves = probing_run.layer_curves(r)
  summary = probing_run.layer_summary(r, curves)
  expected = summary["expected_layer"]

  stem = study.results_stem(NAME, args.model)
  figs = probing_layers_figures(curves, expected, r, args.out, stem, model_name=model_name)
  settings = {
    "model": model_name,
    "data": str(path.relative_to(data)),
    "sentences": len(sentences),
    "split": f"sentence-disjoint split of EWT dev: {r['splits']}",
    "suite": study.to_json(suite),
    "structural_sentences": r["structural"]["sentences"],
  }
  results = {
    "summary": summary,
    "curves": curves,
    # Each probe's results without its label list (`num_classes` stays).
    **{t: {k: v for k, v in r[t].items() if k != "labels"} for t in probing_run.PROBES if t in r},
    **{k: r[k] for k in ("structural", "anisotropy", "features", "splits")},
    "suite_seconds": r["seconds"],
    "timings": timings,
  }
  study.finish(NAME, args, results, settings, findings=findings, started=t_start, figures=figs)
  return 0


# The claims ---------------------------------------------------------------------------------------
# `findings(results, settings)`: the Findings rows, made from the numbers as the JSON holds
# them; `uncertainty(results, settings)`: each claim's interval and verdict.

PAPERS = "Tenney et al. 2019; Lin et al. 2019; Hewitt & Manning 2019"
# The syntactic measures whose peak layer is compared with the middle of the network.
SYNTACTIC = ("deprel", "uuas", "dspr", "root_acc", "nspr")


IN_MIDDLE = "the share of syntactic measures peaking in the middle third"
BEFORE_LAST = "the share peaking before the last layer"
LOWEST_GAP = "the lowest syntactic E[l] minus UPOS's"
MEAN_GAP = "their mean minus UPOS's"
LEAST, MOST = "the lower task's selectivity (pts)", "the higher task's"
LESS_SELECTIVE = "linear minus MLP selectivity (pts)"
ACCURACY = "MLP minus linear accuracy (pts)"
PEAKS = Claim(
  PAPERS,
  "Syntactic information (dependency labels, tree distance and depth) peaks in the "
  "middle layers, not the last.",
  yes=(Test(IN_MIDDLE, ">=", 1),),
  partly=(Test(BEFORE_LAST, ">", 0.5),),
)
POS_LOWER = Claim(
  "Tenney et al. 2019",
  "POS (surface) information sits lower in the network than "
  "syntactic structure (expected layer of POS < that of parsing tasks).",
  yes=(Test(LOWEST_GAP, ">=", 0.1),),
  partly=(Test(MEAN_GAP, ">", 0),),
  missing="no",
  missing_when="an expected layer is not finite",
)
SELECTIVE = Claim(
  "Hewitt & Liang 2019",
  "Linear probes are selective: high accuracy on the linguistic task, "
  "much lower on a control task of random word-type labels.",
  yes=(Test(LEAST, ">=", 20),),
  partly=(Test(MOST, ">=", 5),),
)
MLP = Claim(
  "Hewitt & Liang 2019",
  "MLP probes reach similar accuracy but are less selective than linear probes.",
  yes=(Test(LESS_SELECTIVE, ">", 0), Test(ACCURACY, ">=", -2)),
  partly=(Test(LESS_SELECTIVE, ">", 0),),
  partly_if="all",
)


def peak_quantities(peaks: dict[str, int], num_layers: int) -> dict[str, float]:
  """What `PEAKS` reads from each syntactic measure's best layer (0 = the embeddings)."""
  from bertjax.analysis.representations.probing_run import middle_layers

  lo, hi = middle_layers(num_layers)
  p = np.asarray(list(peaks.values()))  # (measures,) or (measures, resamples)
  return {
    IN_MIDDLE: np.mean((lo <= p) & (p <= hi), 0),
    BEFORE_LAST: np.mean(p < num_layers - 1, 0),
  }


def pos_quantities(e_pos, e_syntax: dict) -> dict:
  """What `POS_LOWER` reads from the expected layers (arrays: one value per resample); nan
  where one is not finite, which the rule reads as "no"."""
  syntax = np.stack(list(e_syntax.values()))
  return {LOWEST_GAP: syntax.min(0) - e_pos, MEAN_GAP: syntax.mean(0) - e_pos}


def selectivity_quantities(selectivity: dict[str, float]) -> dict[str, float]:
  """What `SELECTIVE` reads from each task's selectivity at its best layer (fractions)."""
  values = np.stack(list(selectivity.values()))  # (tasks,) or (tasks, resamples)
  return {LEAST: 100 * values.min(0), MOST: 100 * values.max(0)}


def mlp_quantities(linear_sel, mlp_sel, linear_acc, mlp_acc) -> dict:
  """What `MLP` reads from the two probes' selectivity and accuracy (fractions)."""
  return {LESS_SELECTIVE: 100 * (linear_sel - mlp_sel), ACCURACY: 100 * (mlp_acc - linear_acc)}


def findings(r: dict, s: dict) -> list[dict]:
  """The Findings rows from the results as written to JSON (`r`) and the settings `s`.

  Layers are numbered 0 (the embeddings) .. L; each `holds` follows the stated rule, and each
  row says where the papers' probes, models or data differ from these.
  """
  r = study.from_json(r)
  sm = r["summary"]
  curves = {k: np.asarray(v, np.float64) for k, v in r["curves"].items()}
  num_layers = len(curves["upos"])
  last = num_layers - 1
  lo, hi = sm["middle_layers"]
  peaks, expected = sm["peak_layer"], sm["expected_layer"]
  sel_at_best = sm["selectivity_at_best_layer"]
  data = f"{s['model']} on UD EWT {pathlib.PurePath(s['data']).name}"
  fmt = lambda k: f"{k} L{peaks[k]} ({curves[k][peaks[k]]:.3f}, last {curves[k][last]:.3f})"
  rows = [
    PEAKS.row(
      f"best layer of {last}: "
      + "; ".join(fmt(k) for k in SYNTACTIC)
      + f". Differs from the papers: {data}, one linear probe per layer (Tenney: edge probing "
      "with scalar mixes on OntoNotes; Hewitt & Manning: BERT-large on the PTB). The middle "
      f"third is layers {lo}-{hi}.",
      peak_quantities({k: peaks[k] for k in SYNTACTIC}, num_layers),
    ),
    POS_LOWER.row(
      f"expected layer E[l]: UPOS {expected['upos']:.2f} vs dependency labels (Tenney's "
      f"dependency task) {expected['deprel']:.2f}; against the structural probes, which are "
      "not Tenney's tasks: "
      + ", ".join(f"{k} {expected[k]:.2f}" for k in SYNTACTIC[1:])
      + f"; UPOS peaks at L{peaks['upos']}. Differs from Tenney: {data}; E[l] from the running "
      "best of one probe per layer, not from scalar-mixed probes; constituents, SRL and "
      "coreference are not probed. The rule reads the dependency task alone.",
      pos_quantities(expected["upos"], {"deprel": expected["deprel"]}),
    ),
    SELECTIVE.row(
      "selectivity at the best layer: "
      + ", ".join(
        f"{t} {100 * sel_at_best[t]:.1f} pts (acc {100 * r[t]['best_accuracy']:.1f} vs control "
        f"{100 * r[t]['control_accuracy'][r[t]['best_layer']]:.1f})"
        for t in ("upos", "deprel")
      )
      + f". Differs from Hewitt & Liang: {data}, not ELMo on the PTB.",
      selectivity_quantities(sel_at_best),
    ),
  ]
  if "upos_mlp" in r:
    lin, mlp = sel_at_best["upos"], sm["mlp_selectivity_at_best_layer"]
    accuracy = r["upos"]["best_accuracy"], r["upos_mlp"]["best_accuracy"]
    rows.append(
      MLP.row(
        f"UPOS selectivity at the best layer: linear {100 * lin:.1f} pts, MLP {100 * mlp:.1f} pts "
        f"(accuracy {100 * accuracy[0]:.1f} vs {100 * accuracy[1]:.1f}). Differs from Hewitt & "
        f"Liang: {data}, not ELMo on the PTB.",
        mlp_quantities(lin, mlp, *accuracy),
      )
    )
  return rows


def uncertainty(r: dict, s: dict) -> list[claims.Judgement]:
  """One judgement per row, over the test sentences: each probe's correct words (edges) and
  the structural probes' metrics per sentence (`probing_run.sentence_items`), resampled
  together, every rule applied to every resample."""
  from bertjax.analysis.representations import probing_run

  rows = findings(r, s)
  items = probing_run.sentence_items(study.from_json(r))
  layers = len(r["curves"]["upos"])

  sel = lambda c, t: probing_run.at_best_layer(c[t], c[t] - c[f"{t}_control"])
  best = lambda c, t: np.max(c[t], -1)
  e = lambda c, t: stats.expected_layer(c[t])
  rules = (  # each claim, what it reads of the curves, and the probes whose values it resamples
    (PEAKS, lambda c: peak_quantities({k: np.argmax(c[k], -1) for k in SYNTACTIC}, layers)),
    (POS_LOWER, lambda c: pos_quantities(e(c, "upos"), {"deprel": e(c, "deprel")})),
    (SELECTIVE, lambda c: selectivity_quantities({t: sel(c, t) for t in ("upos", "deprel")})),
    (MLP, lambda c: mlp_quantities(*(f(c, t) for f in (sel, best) for t in ("upos", "upos_mlp")))),
  )
  words = ("upos", "deprel")
  reads = (("deprel", "distance", "depth"), words, words, ("upos", "upos_mlp"))
  return [
    probing_run.judge_by_sentence(claim, items, quantities, probes, row["value"])
    for (claim, quantities), row, probes in zip(rules, rows, reads)
  ]


# The likely cause where the models' verdicts differ (or agree for different reasons), as
# the committed numbers show it: (row index, model tag) -> the sentence on the Findings page.
CAUSES = {
  (0, "all-mpnet-base-v2"): (
    "one probe: MPNet's four other measures peak in its middle (L4-L6 of 12), but root "
    "accuracy from the depth probe peaks at L1 (0.550, with 0.48-0.52 through L2-L7); "
    "that probe is weak and flat in both models (MiniLM at most 0.51)"
  ),
}


if __name__ == "__main__":
  sys.exit(main())
