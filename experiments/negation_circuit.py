"""The circuit that carries negation into a probe: EAP and EAP-IG against exact edge patching.

Run:
  ./run.sh experiment negation_circuit
  .venv/bin/python -m experiments.negation_circuit [--smoke] [--model DIR_OR_HUB_ID]
      [--pairs N] [--exact-edges N] [--out DIR | --update-results]

The method, the data and what differs from the paper: docs/experiments.md, section
`negation_circuit` (the site's Experiments page).
"""

from __future__ import annotations

import pathlib
import sys
import time
from collections.abc import Sequence

import numpy as np

from bertjax import claims, stats, study
from bertjax.claims import Claim, Test
from experiments import common

NAME = "negation_circuit"
SMOKE_MODEL = {**study.SMOKE_MODEL, "max_position_embeddings": 128}


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
      raise study.UsageError(f"--{name}={getattr(args, name)} must be >= 1")
  if args.exact_edges is not None and args.exact_edges < 2:
    raise study.UsageError(f"--exact-edges={args.exact_edges} must be >= 2")
  return args


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


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  with study.quick_compiles(args.smoke):
    return run_experiment(args)


def run_experiment(args) -> int:
  """The experiment on parsed arguments."""
  t_start = time.perf_counter()
  timings: dict[str, float] = {}
  from bertjax.analysis.interventions import circuits
  from bertjax.tasks import negation
  from bertjax.tasks.sentences import load_sentences

  with study.timed(timings, "load"):
    config, params, tok, name = study.load_model(
      args, smoke=lambda: study.tiny_model(0, "tiny random BERT (smoke stand-in)", **SMOKE_MODEL)
    )
    sentences = load_sentences()
  with study.timed(timings, "probe"):
    probe = negation.probe_metric(params, config, tok, sentences)
  clean, corrupted, kept = negation.pairs(tok, [s.text for s in sentences if s.negated], args.pairs)
  n = len(kept)
  targets = {"answer": np.ones(n, np.int32), "distractor": np.zeros(n, np.int32)}
  with study.timed(timings, "discover"):
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
      log=study.log,
    )
  g, ig, exact, mask = d["graph"], d["eap_ig"], d["exact"], d["mask"]
  total = int(g.valid.sum())
  faith, circuit = d["faithfulness"], d["circuit"]
  for method, f in faith.items():
    study.log(
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
    "xla_optimised": not args.smoke,  # --smoke: `study.quick_compiles`
    "probe": "L2 logistic regression on mean-pooled final states of the 385 "
    "project sentences (bertjax.tasks.negation.fit_probe)",
  }
  figures = figure(args.out, r, g, circuit, study.results_stem(NAME, args.model))
  study.finish(NAME, args, r, settings, findings=findings, started=t_start, figures=figures)
  return 0


# The claims ---------------------------------------------------------------------------------------
# `findings(results, settings)`: the Findings rows, made from the numbers as the JSON holds
# them; `uncertainty(results, settings)`: each claim's interval and verdict.

FAITHFUL = 0.8  # the share of the logit difference a circuit must keep
EAP, EAP_IG = "EAP's Pearson", "EAP-IG's Pearson"  # each against exact patching, over edges
SHARE = "the smallest faithful circuit's share of the edges"
SCORES = Claim(
  "Syed et al. 2023; Hanna et al. 2024",
  "Edge attribution patching approximates exact edge patching, and its "
  "integrated-gradients variant (EAP-IG) better than plain EAP",
  yes=(Test(EAP_IG, ">", 0.8), Test(EAP_IG, ">", EAP)),
)
CIRCUIT = Claim(
  "Conmy et al. 2023; Hanna et al. 2024",
  "A circuit of a few percent of the edges, found from attribution scores, "
  "keeps most of the model's behaviour",
  yes=(Test(SHARE, "<=", 0.05),),
  partly=(Test(SHARE, "<=", 0.2),),
  missing="no",
  missing_when=f"no circuit asked for keeps {FAITHFUL:.0%} of the logit difference",
)


def findings(r: dict, s: dict) -> list[dict]:
  """The Findings rows from the results as written to JSON (`r`) and the settings `s`."""
  from bertjax.analysis.interventions.circuits import smallest_faithful

  r = study.from_json(r)
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


# How sure each row is ------------------------------------------------------------------------


def uncertainty(r: dict, s: dict) -> list[claims.Judgement]:
  """Exact vs EAP and EAP-IG scores over the edges (paired); the circuit's share over the
  pairs."""
  r = study.from_json(r)
  rows = findings(r, s)
  ex = np.asarray(r["exact_scores"], float)
  eap, ig = (np.asarray(r["edge_scores"][k], float) for k in ("eap", "eap_ig"))
  ok = np.isfinite(ex) & np.isfinite(eap) & np.isfinite(ig)
  items = (ex[ok], eap[ok], ig[ok])
  pearsons = lambda x, e, i: {EAP: stats.pearson_rows(e, x), EAP_IG: stats.pearson_rows(i, x)}
  a = r["agreement"]
  point = {EAP: a["eap"]["pearson"], EAP_IG: a["eap_ig"]["pearson"]}
  first = SCORES.judge(items, pearsons, point=point, over=f"the {int(ok.sum())} edges")
  return [first, _circuit_share(r, rows[1]["value"]["value"])]


def _circuit_share(r: dict, point: float | None) -> claims.Judgement:
  """The smallest faithful circuit's share of the edges, over resampled pairs: each circuit's
  normalised metric is recomputed from its per-pair values on each resample (the whole graph,
  1, where no circuit asked for is faithful: the rule's "no", as for no circuit at all)."""
  faith = r["faithfulness"]
  if any(f.get("rows") is None for f in faith.values()):
    return claims.rerun_needed(
      "per-pair circuit metrics (each circuit's metric is the pairs' mean)"
    )
  names, total = list(faith), r["graph"]["edges"]
  rows = faith[names[0]]["rows"]
  items = [np.asarray(rows[k], float) for k in ("clean", "corrupted")]
  items += [np.asarray(faith[m]["rows"]["metric"], float).T for m in names]  # (pairs, circuits)

  def share(clean, corrupted, *metrics):  # (R, pairs) and (R, pairs, circuits) -> (R,)
    c, x = clean.mean(-1)[:, None], corrupted.mean(-1)[:, None]
    best = np.ones(len(c))
    for m, v in zip(names, metrics):
      with np.errstate(invalid="ignore", divide="ignore"):
        faithful = (v.mean(-2) - x) / (c - x) >= FAITHFUL  # (R, circuits)
      edges = np.where(faithful, np.asarray(faith[m]["edges"], float) / total, 1.0)
      best = np.minimum(best, edges.min(-1))
    return {SHARE: best}

  return CIRCUIT.judge(
    tuple(items),
    share,
    point={SHARE: point},
    over=f"the {len(items[0])} pairs",
    shown={SHARE: "{:.1%}"},
  )


# The likely cause where the models' verdicts differ (or agree for different reasons), as
# the committed numbers show it: (row index, model tag) -> the sentence on the Findings page.
CAUSES = {
  (0, "all-mpnet-base-v2"): (
    "EAP leaves no room: on MPNet's 2,000 sampled edges (6% of its 32,491, most with tiny"
    " effects where one gradient is exact) EAP already reaches Pearson 0.99, and EAP-IG's"
    " 5 points give 0.84; on MiniLM, every edge patched, both are near 0.93-0.94. Both "
    "pass the 0.8 bar; only 'better than EAP' fails on MPNet"
  ),
  (1, "all-mpnet-base-v2"): (
    "a wider interval, not another kind of result: MPNet's smallest faithful circuit is "
    "3.0% of its 32,491 edges (MiniLM's 1.0% of 7,588), and over its 32 pairs (MiniLM 48)"
    " the 95% interval runs to 6.1%, past the 5% line"
  ),
}


if __name__ == "__main__":
  sys.exit(main())
