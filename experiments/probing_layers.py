"""Where is syntax strongest? Probing every layer of all-MiniLM-L6-v2 on UD English EWT.

Run:
  ./run.sh experiment probing_layers            # the full run (~2.5 min CPU; 4-8 min wall)
  .venv/bin/python experiments/probing_layers.py [--smoke] [--model DIR_OR_HUB_ID]

The method, the data and what differs from the paper: docs/experiments.md, section
`probing_layers` (the site's Experiments page).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import common
from rules import probing_layers as rules

NAME = "probing_layers"


def _suite(args):
  from bertjax.analysis.representations import probing, probing_run, structural

  if not args.smoke:
    return probing_run.SuiteConfig(
      tasks=("upos", "deprel"),
      mlp=args.mlp,
      control=True,
      structural=True,
      structural_max_sentences=args.structural_sentences,
      seed=args.seed,
    )
  return probing_run.SuiteConfig(
    tasks=("upos", "deprel"),
    mlp=args.mlp,
    control=True,
    structural=True,
    probe=probing.ProbeConfig(learning_rate=1e-2, max_steps=20, batch_size=256, eval_every=10),
    structural_config=structural.StructuralConfig(
      rank=8, max_steps=20, batch_size=8, eval_every=10
    ),
    anisotropy_pairs=200,
    seed=args.seed,
  )


@common.one_blas_thread
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

  data = common.data_dir(args.data_dir, "ud_english_ewt")
  n_sent = args.sentences or (40 if args.smoke else None)
  path = common.ud_file(data, "dev")
  sentences = conllu.read_conllu(path, max_sentences=n_sent)
  with common.timed(timings, "load model"):
    config, params, tok, model_name = common.load_model(args)
  suite = _suite(args)
  common.log(f"probing {model_name} on {len(sentences)} sentences of {path.name}")
  with common.timed(timings, "probing suite"):
    r = probing_run.run_probing_suite(
      params, config, tok, sentences, suite=suite, model_name=model_name
    )

  curves = probing_run.layer_curves(r)
  summary = {
    **probing_run.layer_summary(r, curves),
    "middle_layers": list(rules.middle_layers(len(curves["upos"]))),
  }
  expected = summary["expected_layer"]

  stem = common.results_stem(NAME, args.model)
  figs = probing_layers_figures(curves, expected, r, args.out, stem, model_name=model_name)
  settings = {
    "model": model_name,
    "data": str(path.relative_to(data)),
    "sentences": len(sentences),
    "split": f"sentence-disjoint split of EWT dev: {r['splits']}",
    "suite": common.to_json(suite),
    "structural_sentences": r["structural"]["sentences"],
  }
  results = {
    "summary": summary,
    "curves": curves,
    "upos": _strip(r["upos"]),
    "deprel": _strip(r["deprel"]),
    "structural": r["structural"],
    "anisotropy": r["anisotropy"],
    "features": r["features"],
    "splits": r["splits"],
    "suite_seconds": r["seconds"],
    "timings": timings,
  }
  if "upos_mlp" in r:
    results["upos_mlp"] = _strip(r["upos_mlp"])
  common.finish(NAME, args, results, settings, started=t_start, figures=figs)
  return 0


def _strip(task: dict) -> dict:
  """A task's results without its label list (`num_classes` stays)."""
  return {k: v for k, v in task.items() if k != "labels"}


if __name__ == "__main__":
  sys.exit(main())
