"""The circuit that carries negation into a probe: EAP and EAP-IG against exact edge patching.

Run:
  ./run.sh experiment negation_circuit
  .venv/bin/python experiments/negation_circuit.py [--smoke] [--model DIR_OR_HUB_ID]
      [--pairs N] [--exact-edges N] [--out DIR | --update-results]

The method, the data and what differs from the paper: docs/experiments.md, section
`negation_circuit` (the site's Experiments page).
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys
import time
from collections.abc import Sequence

import common
import numpy as np
from findings import Rule, Test

NAME = "negation_circuit"
FAITHFUL = 0.8  # the share of the logit difference a circuit must keep
EAP, EAP_IG = "EAP's Pearson", "EAP-IG's Pearson"  # each against exact patching, over edges
SHARE = "the smallest faithful circuit's share of the edges"
SCORES = Rule(
  "Syed et al. 2023; Hanna et al. 2024",
  "Edge attribution patching approximates exact edge patching, and its "
  "integrated-gradients variant (EAP-IG) better than plain EAP",
  yes=(Test(EAP_IG, ">", 0.8), Test(EAP_IG, ">", EAP)),
)
CIRCUIT = Rule(
  "Conmy et al. 2023; Hanna et al. 2024",
  "A circuit of a few percent of the edges, found from attribution scores, "
  "keeps most of the model's behaviour",
  yes=(Test(SHARE, "<=", 0.05),),
  partly=(Test(SHARE, "<=", 0.2),),
  missing="no",
  missing_when=f"no circuit asked for keeps {FAITHFUL:.0%} of the logit difference",
)
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


def findings(r: dict, s: dict) -> list[dict]:
  """The Findings rows from the results as written to JSON (`r`) and the settings `s`."""
  from bertjax.analysis.interventions.circuits import smallest_faithful

  r = common.from_json(r)
  name, total = r["model"], r["graph"]["edges"]
  a = r["agreement"]
  measured = (
    f"{name}, {r['pairs']} negated sentences against their affirmative twins, the negation "
    f"probe's logit difference (clean {r['clean']:.2f}, corrupted {r['corrupted']:.2f}); "
    f"against exact patching of {a['eap']['edges']:,} of the {total:,} edges: EAP Pearson "
    f"{a['eap']['pearson']:.2f} (Spearman {a['eap']['spearman']:.2f}), EAP-IG with "
    f"{s['steps']} steps Pearson {a['eap_ig']['pearson']:.2f} (Spearman "
    f"{a['eap_ig']['spearman']:.2f}). Differs from the papers: decoders with answer "
    "logits; here a sentence encoder and a linear probe."
  )
  rows = [SCORES.row(measured, {EAP: a["eap"]["pearson"], EAP_IG: a["eap_ig"]["pearson"]})]
  topk, greedy = r["faithfulness"]["topk"], r["faithfulness"]["greedy"]
  n_top, n_greedy = smallest_faithful(topk, FAITHFUL), smallest_faithful(greedy, FAITHFUL)
  best = min((n for n in (n_top, n_greedy) if n is not None), default=None)
  curve = ", ".join(f"{e} edges {v:.2f}" for e, v in zip(topk["edges"], topk["normalized"]))
  smallest = (
    "no circuit asked for reaches it"
    if best is None
    else f"the smallest reaching it has {best:,} edges ({best / total:.1%} of the graph; "
    f"top-k {n_top if n_top is not None else 'none'}, greedy "
    f"{n_greedy if n_greedy is not None else 'none'})"
  )
  measured = (
    f"{name}, the same pairs: top-k circuits from EAP-IG scores keep {curve} of the logit "
    f"difference; {smallest}. Differs from the papers: GPT-2 tasks; here negation read by "
    f"a probe. A circuit is faithful if it keeps >= {FAITHFUL:.0%} of the logit difference."
  )
  rows.append(CIRCUIT.row(measured, {SHARE: None if best is None else best / total}))
  return rows


def figure(out, r: dict, graph, circuit: np.ndarray | None, stem: str) -> list[str]:
  """Scores against exact patching, faithfulness by size, and the circuit (`stem_circuit.png`)."""
  from bertjax.plots import circuits as plots

  path = plots.edge_agreement(
    r["exact_scores"],
    {k: r["edge_scores"][k] for k in ("eap", "eap_ig")},
    {k: r["faithfulness"][k] for k in ("topk", "greedy")},
    pathlib.Path(out) / f"{stem}_circuit.png",
    share=FAITHFUL,
    graph=graph,
    circuit=circuit,
    title=f"{r['model']}: the edges that carry negation into the probe",
  )
  return [path.name]


def _probe(params, config, tok, sentences):
  """The negation probe (`bertjax.tasks.negation.fit_probe`: a logistic regression on the
  mean-pooled final states of every project sentence) as a negated - affirmative logit
  difference."""
  from bertjax.analysis.interventions import metrics
  from bertjax.tasks import negation

  feats, labels = negation.pooled_features(params, config, tok, sentences)
  w, b = negation.probe_weights(*negation.fit_probe(feats, labels))
  return metrics.ProbeLogitDiff(w.astype(np.float32), b.astype(np.float32), pooling="mean")


def _pairs(tok, sentences, count: int):
  """The first `count` negated sentences with a one-token cue, and their twins."""
  from bertjax.tasks import negation

  clean, corrupted, kept = negation.pairs(tok, [s.text for s in sentences if s.negated])
  n = min(count, len(kept))
  take = lambda x: dataclasses.replace(
    x,
    **{
      f: np.asarray(getattr(x, f))[:n]
      for f in ("input_ids", "attention_mask", "token_type_ids", "word_ids")
    },
  )
  return take(clean), take(corrupted), kept[:n]


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  t_start = time.perf_counter()
  timings: dict[str, float] = {}
  from bertjax.analysis.interventions import circuits
  from bertjax.tasks.sentences import load_sentences

  with common.timed(timings, "load"):
    config, params, tok, name = common.load_model(
      args, smoke=lambda: common.tiny_model(0, "tiny random BERT (smoke stand-in)", **SMOKE_MODEL)
    )
    sentences = load_sentences()
  with common.timed(timings, "probe"):
    probe = _probe(params, config, tok, sentences)
  clean, corrupted, kept = _pairs(tok, sentences, args.pairs)
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
      faithful=FAITHFUL,
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
    "faithful": FAITHFUL,
    "probe": "L2 logistic regression on mean-pooled final states of the 385 "
    "project sentences (bertjax.tasks.negation.fit_probe)",
  }
  figures = figure(args.out, r, g, circuit, common.results_stem(NAME, args.model))
  common.write_results(
    NAME,
    args.out,
    r,
    findings=findings,
    settings=settings,
    smoke=args.smoke,
    seconds=time.perf_counter() - t_start,
    figures=figures,
    model=args.model,
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
