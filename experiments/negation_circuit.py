"""The circuit that carries negation into a probe: EAP and EAP-IG against exact edge patching.

Run:
  ./run.sh experiment negation_circuit
  .venv/bin/python experiments/negation_circuit.py [--smoke] [--model DIR_OR_HUB_ID]
      [--pairs N] [--exact-edges N] [--out DIR | --update-results]

The method, the data and what differs from the paper: docs/experiments.md, section
`negation_circuit` (the site's Experiments page).
"""

from __future__ import annotations

import pathlib
import sys
import time
from collections.abc import Sequence

import common
import numpy as np
from rules import negation_circuit as rules

NAME = "negation_circuit"
SMOKE_MODEL = {**common.SMOKE_MODEL, "max_position_embeddings": 128}


def parse_args(argv: Sequence[str] | None = None):
  p = common.parser(__doc__, data=False)
  p.add_argument(
    "--pairs",
    type=int,
    default=48,
    help="negated/affirmative pairs analysed (default: 48; --smoke: 6)",
  )
  p.add_argument(
    "--exact-edges",
    type=int,
    default=None,
    help="edges patched exactly, chosen at random (default: every edge up to 10,000, else 2,000)",
  )
  p.add_argument("--steps", type=int, default=5, help="EAP-IG's steps (default: 5)")
  args = p.parse_args(argv)
  if args.smoke:
    args.pairs = min(args.pairs, 6)
  for name in ("pairs", "steps"):
    if getattr(args, name) < 1:
      raise common.UsageError(f"--{name}={getattr(args, name)} must be >= 1")
  if args.exact_edges is not None and args.exact_edges < 2:
    raise common.UsageError(f"--exact-edges={args.exact_edges} must be >= 2")
  return args


def figure(out, r: dict, graph, circuit: np.ndarray | None, stem: str) -> list[str]:
  """Scores against exact patching, faithfulness by size, and the circuit (`stem_circuit.png`)."""
  from bertjax.plots import circuits as plots

  path = plots.edge_agreement(
    r["exact_scores"],
    {k: r["edge_scores"][k] for k in ("eap", "eap_ig")},
    {k: r["faithfulness"][k] for k in ("topk", "greedy")},
    pathlib.Path(out) / f"{stem}_circuit.png",
    share=rules.FAITHFUL,
    graph=graph,
    circuit=circuit,
    title=f"{r['model']}: the edges that carry negation into the probe",
  )
  return [path.name]


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  with common.quick_compiles(args.smoke):
    return run_experiment(args)


def run_experiment(args) -> int:
  """The experiment on parsed arguments."""
  t_start = time.perf_counter()
  timings: dict[str, float] = {}
  from bertjax.analysis.interventions import circuits
  from bertjax.tasks import negation
  from bertjax.tasks.sentences import load_sentences

  with common.timed(timings, "load"):
    config, params, tok, name = common.load_model(
      args, smoke=lambda: common.tiny_model(0, "tiny random BERT (smoke stand-in)", **SMOKE_MODEL)
    )
    sentences = load_sentences()
  with common.timed(timings, "probe"):
    probe = negation.probe_metric(params, config, tok, sentences)
  clean, corrupted, kept = negation.pairs(tok, [s.text for s in sentences if s.negated], args.pairs)
  n = len(kept)
  targets = {"answer": np.ones(n, np.int32), "distractor": np.zeros(n, np.int32)}
  with common.timed(timings, "discover"):
    d = circuits.discover(
      params,
      config,
      clean,
      corrupted,
      probe,
      targets=targets,
      steps=args.steps,
      exact_edges=args.exact_edges,
      faithful=rules.FAITHFUL,
      seed=args.seed,
      log=common.log,
    )
  g, ig, exact, mask = d["graph"], d["eap_ig"], d["exact"], d["mask"]
  total = int(g.valid.sum())
  faith, circuit = d["faithfulness"], d["circuit"]
  for method, f in faith.items():
    common.log(
      f"{method}: " + ", ".join(f"{e} {v:.2f}" for e, v in zip(f["edges"], f["normalized"]))
    )
  chosen = np.argwhere(mask)
  pick = lambda s: s.values[mask]
  r = {
    "model": name,
    "pairs": n,
    "texts": kept,
    "graph": {"senders": g.n_senders, "receivers": g.n_receivers, "edges": total},
    "clean": float(ig.clean),
    "corrupted": float(ig.corrupted),
    "agreement": d["agreement"],
    "exact_edges": [[int(s), int(t)] for s, t in chosen],
    "exact_scores": pick(exact),
    "edge_scores": {"eap": pick(d["eap"]), "eap_ig": pick(ig)},
    "top_edges": {"eap_ig": ig.top(20), "exact": exact.top(20)},
    "faithfulness": faith,
    "circuit": None
    if circuit is None
    else [g.edge_name(s, t) for s, t in zip(*np.nonzero(circuit))],
    "timings": timings,
  }
  settings = {
    "model": name,
    "pairs": n,
    "steps": args.steps,
    "exact_edges": len(chosen),
    "sizes": faith["topk"]["sizes"],
    "seed": args.seed,
    "faithful": rules.FAITHFUL,
    "xla_optimised": not args.smoke,  # --smoke: `common.quick_compiles`
    "probe": "L2 logistic regression on mean-pooled final states of the 385 "
    "project sentences (bertjax.tasks.negation.fit_probe)",
  }
  figures = figure(args.out, r, g, circuit, common.results_stem(NAME, args.model))
  common.finish(NAME, args, r, settings, started=t_start, figures=figures)
  return 0


if __name__ == "__main__":
  sys.exit(main())
