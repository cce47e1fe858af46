"""Causal variables in an encoder: both tracks of the interpretability benchmark (MIB).

Run:
  ./run.sh experiment causal_variables
  .venv/bin/python -m experiments.causal_variables [--smoke] [--model DIR_OR_HUB_ID]
      [--pairs N] [--steps N] [--out DIR | --update-results]

The method, the data and what differs from the paper: docs/experiments.md, section
`causal_variables` (the site's Experiments page).
"""

from __future__ import annotations

import pathlib
import sys
import time
from collections.abc import Sequence

import numpy as np

from bertjax import claims, study
from bertjax.claims import Claim, Test
from experiments import common

NAME = "causal_variables"
METHODS = ("full", "das", "dbm", "pca", "sae")  # full vector; DAS k=1; DBM; top PC; SAE mask
BASELINES = ("pca", "dbm", "sae")  # what DAS is compared with
SITE = "out"  # the residual stream after each block, at the variable's token


OPTIONS = (  # --name, its default and help
  ("pairs", 1024, "pairs built per task (default: 1024; --smoke: 24)"),
  ("train", 64, ("of the pairs the model answers right on both runs, at most this many "
                 "train; the next --held are held out (default: 64; --smoke: 6)")),
  ("held", 128, "held-out pairs at most (default: 128)"),
  ("min-pairs", 40, ("a task with fewer pairs answered right is reported, not analysed "
                     "(default: 40; --smoke: 8)")),
  ("steps", 30, ("full-batch Adam steps of DAS, DBM and the SAE mask (default: 30, where "
                 "MiniLM's IIA has settled; --smoke: 3)")),
  ("ig-steps", 5, "EAP-IG's steps (default: 5)"),
  ("mlm-windows", 3000, ("128-token windows an MLM head is fitted on when the checkpoint has "
                         "none (default: 3000, as tuned_lens, which reads the same cached "
                         "head; --smoke: 16)")),
  ("mlm-steps", 600, "optimiser steps of that fit (default: 600; --smoke: 20)"),
  ("sae-steps", 300, ("steps of each layer's top-k SAE (8x, k=32, 1,024 WikiText-2 tokens a "
                      "step; default: 300; --smoke: 5)")),
)  # fmt: skip


def parse_args(argv: Sequence[str] | None = None):
  p = common.parser(__doc__)
  for name, default, text in OPTIONS:
    p.add_argument(f"--{name}", type=int, default=default, help=text)
  args = p.parse_args(argv)
  for name, _, _ in OPTIONS:
    if getattr(args, name.replace("-", "_")) < 1:
      raise study.UsageError(f"--{name}={getattr(args, name.replace('-', '_'))} must be >= 1")
  if args.smoke:
    args.pairs, args.train, args.steps = min(args.pairs, 24), min(args.train, 6), min(args.steps, 3)
    args.mlm_windows, args.mlm_steps = min(args.mlm_windows, 16), min(args.mlm_steps, 20)
    args.min_pairs, args.sae_steps = min(args.min_pairs, 8), min(args.sae_steps, 5)
  return args


def analysed(tasks: dict) -> dict:
  """The tasks with enough pairs the model answers right."""
  return {k: v for k, v in tasks.items() if "skipped" not in v}


def circuit_track(params, config, t, held_rows, args) -> dict:
  """MIB's circuit scores of EAP and EAP-IG on the held-out pairs: CPR from signed scores,
  CMD from absolute ones, each with its curve's per-pair values."""
  from bertjax.analysis.interventions import circuits, edges, metrics

  pairs = t.pairs.take(held_rows)
  clean, corrupted, targets = pairs.for_patching(t.base_label[held_rows])
  run = (params, config, clean, corrupted, metrics.LogitDiff("mlm"))
  got = {}
  for method, kw in (("eap", {}), ("eap_ig", {"method": "eap-ig", "steps": args.ig_steps})):
    scores = edges.edge_attribution(*run, targets=targets, **kw)
    cpr = circuits.mib_curve(*run, scores, targets=targets, absolute=False)
    cmd = circuits.mib_curve(*run, scores, targets=targets, absolute=True)
    got[method] = {"cpr": _curve(cpr), "cmd": _curve(cmd)}
  return got


def _curve(c: dict) -> dict:
  keep = ("cpr", "cmd", "percentages", "edges", "faithfulness")
  return {**{k: c[k] for k in keep}, "rows": c["curve"]["rows"]}


def layer_saes(params, config, tok, data, args) -> list:
  """An SAE per layer at SITE, on WikiText-2 validation paragraphs (64 tokens each)."""
  from bertjax.analysis.causal import localisation
  from bertjax.tasks import passages

  texts = passages.wikitext_paragraphs(data / "wikitext2_tokens" / "valid.txt")
  batches = [
    tok.encode(texts[i : i + 32], max_length=64, truncation=True) for i in range(0, len(texts), 32)
  ]
  return localisation.layer_saes(
    params, config, batches, SITE, steps=args.sae_steps, seed=args.seed
  )


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  with study.quick_compiles(args.smoke):
    return run_experiment(args)


def run_experiment(args) -> int:
  """The experiment on parsed arguments."""
  t_start = time.perf_counter()
  timings: dict[str, float] = {}
  data = study.data_dir(args.data_dir, "wikitext2_tokens")
  with study.timed(timings, "load model"):
    config, params, tok, name = study.load_model(args)
  params, head = study.with_mlm_head(
    args, params, config, tok, data, timings, windows=args.mlm_windows, steps=args.mlm_steps
  )
  r = {"model": name, "head": head, "tasks": {}, "timings": timings}
  from bertjax.analysis.causal import localisation
  from bertjax.tasks import counterfactual

  with study.timed(timings, "SAEs"):
    saes = layer_saes(params, config, tok, data, args)
  for task in counterfactual.TASKS:
    t = counterfactual.task(task, tok, args.pairs, args.seed)
    keep, acc = counterfactual.solved(params, config, t)
    keep = np.arange(len(t.base_label)) if args.smoke else keep  # a random model: keep all
    entry = r["tasks"][task] = {"built": len(t.base_label), "accuracy": acc, "solved": len(keep)}
    if len(keep) < args.min_pairs:
      entry["skipped"] = (
        f"the model answers {len(keep)} of its {len(t.base_label)} pairs right on both runs "
        f"(base accuracy {acc['base']:.2f}, source {acc['source']:.2f}): fewer than {args.min_pairs}"
      )
      study.log(f"{task}: not analysed: {entry['skipped']}")
      continue
    cut = min(args.train, len(keep) // 2)
    held_rows = keep[cut : cut + args.held]
    train, held = t.pairs.take(keep[:cut]), t.pairs.take(held_rows)
    with study.timed(timings, f"{task}: variables"):
      correct = localisation.correctness(
        params, config, train, held, SITE, steps=args.steps, seed=args.seed, saes=saes
      )
    with study.timed(timings, f"{task}: circuits"):
      circuit = circuit_track(params, config, t, held_rows, args)
    iia = {m: v.mean(1).round(4).tolist() for m, v in correct.items()}
    study.log(
      f"{task}: accuracy {acc}, {cut} train / {len(held.label)} held out; IIA by layer {iia}"
    )
    study.log(
      f"{task}: CPR/CMD "
      + ", ".join(f"{m} {c['cpr']['cpr']:.3f}/{c['cmd']['cmd']:.3f}" for m, c in circuit.items())
    )
    entry.update(
      train=cut,
      held_out=len(held.label),
      iia=iia,
      correct={m: v.tolist() for m, v in correct.items()},
      circuits=circuit,
      example={"base": t.base_text[int(keep[0])], "source": t.source_text[int(keep[0])]},
    )
  settings = {
    "model": name,
    "depth": config.depth,
    "site": SITE,
    "pairs": args.pairs,
    "train": args.train,
    "held": args.held,
    "min_pairs": args.min_pairs,
    "steps": args.steps,
    "ig_steps": args.ig_steps,
    "mlm_windows": args.mlm_windows,
    "mlm_steps": args.mlm_steps,
    "seed": args.seed,
    "sae_steps": args.sae_steps,
    "methods": "full: the whole vector; das: a learned 1-d rotation (k=1); dbm: a learned "
    "mask over the neurons; pca: the top principal direction of the training pairs; sae: a "
    "learned mask over the latents of a top-k SAE per layer (8x, k=32, trained on up to "
    "65,536 WikiText-2 validation tokens, 64-token paragraphs)",
    "indexing": "per-layer arrays hold layers 1..L (the blocks' outputs)",
  }
  from bertjax.plots import circuits as plots

  stem = study.results_stem(NAME, args.model)
  shown = {
    k: {"iia": v["iia"], "circuits": {m: c["cpr"] for m, c in v["circuits"].items()}}
    for k, v in analysed(r["tasks"]).items()
  }
  fig = plots.localisation(shown, pathlib.Path(args.out) / f"{stem}_localisation.png", title=name)
  study.finish(NAME, args, r, settings, findings=findings, started=t_start, figures=[fig.name])
  return 0


# The claims ---------------------------------------------------------------------------------------

DAS_GAP = "DAS's mean IIA over layers minus the best baseline's (PCA, DBM, SAE), mean over tasks"
CPR_GAP = "EAP-IG's CPR minus EAP's, mean over tasks"
NONE = "the model answers too few pairs of every task right"
DAS = Claim(
  "Geiger et al. 2024; Mueller et al. 2025 (MIB)",
  "A learned rotation (DAS) localises causal variables better than unsupervised or "
  "neuron-level bases (PCA, DBM over neurons, SAE features)",
  yes=(Test(DAS_GAP, ">=", 0.05),),
  partly=(Test(DAS_GAP, ">", 0.0),),
  missing="n/a",
  missing_when=NONE,
  unit="pairs",
  short="DAS localises causal variables better than PCA, neuron masks or SAE features.",
)
CIRCUIT = Claim(
  "Hanna et al. 2024; Mueller et al. 2025 (MIB)",
  "EAP-IG finds more faithful circuits than EAP (a higher circuit performance ratio)",
  yes=(Test(CPR_GAP, ">", 0.0),),
  missing="n/a",
  missing_when=NONE,
  unit="pairs",
  short="EAP-IG's circuits are more faithful than EAP's (higher CPR).",
)


def gaps(tasks: dict) -> dict[str, float | None]:
  """Both rows' statistics on all the held-out pairs of the analysed tasks (None: none)."""
  das, cpr = [], []
  for v in analysed(tasks).values():
    iia = {m: float(np.mean(v["correct"][m])) for m in METHODS}
    das.append(iia["das"] - max(iia[m] for m in BASELINES))
    cpr.append(v["circuits"]["eap_ig"]["cpr"]["cpr"] - v["circuits"]["eap"]["cpr"]["cpr"])
  mean = lambda x: float(np.mean(x)) if x else None
  return {DAS_GAP: mean(das), CPR_GAP: mean(cpr)}


def findings(r: dict, s: dict) -> list[dict]:
  """The rows, from the results and settings as written to JSON."""
  r = study.from_json(r)
  tasks = analysed(r["tasks"])
  per = "; ".join(
    f"{k}: not analysed, {v['skipped']}"
    if "skipped" in v
    else f"{k}: {v['train']} train / {v['held_out']} held-out pairs, best-layer IIA "
    + ", ".join(f"{m} {max(v['iia'][m]):.2f}" for m in METHODS)
    for k, v in r["tasks"].items()
  )
  g = gaps(tasks)
  measured = (
    f"{s['model']}, read by {study.head_source(r['head'])}; the residual stream at the "
    f"variable's token, every layer; {per}. Differs from MIB: decoders and their own tasks; "
    "here masked prediction on agreement, negation and indirect objects."
  )
  rows = [DAS.row(measured, {DAS_GAP: g[DAS_GAP]})]
  cpr = lambda v, m: v["circuits"][m]["cpr"]["cpr"]
  measured = (
    f"{s['model']}, the same held-out pairs, the masked answer's logit difference; CPR "
    + "; ".join(
      f"{k}: EAP {cpr(v, 'eap'):.3f}, EAP-IG {cpr(v, 'eap_ig'):.3f}" for k, v in tasks.items()
    )
    + ". Differs from MIB: decoders; here an encoder's masked answer (tasks as above)."
  )
  rows.append(CIRCUIT.row(measured, {CPR_GAP: g[CPR_GAP]}))
  return rows


def uncertainty(r: dict, s: dict) -> list[claims.Judgement]:
  """Both gaps over resampled held-out pairs, each task's pairs resampled on their own."""
  from bertjax.analysis.interventions.circuits import mib_resampled

  r = study.from_json(r)
  point = gaps(r["tasks"])
  if not analysed(r["tasks"]):
    return [c.unsampled(point, "no task analysed") for c in (DAS, CIRCUIT)]
  rng = np.random.default_rng(0)
  das, cpr = [], []
  for v in analysed(r["tasks"]).values():
    idx = rng.integers(0, v["held_out"], (claims.RESAMPLES, v["held_out"]))
    c = {m: np.asarray(v["correct"][m], float)[:, idx].mean((0, 2)) for m in METHODS}  # (R,)
    das.append(c["das"] - np.max([c[m] for m in BASELINES], 0))
    area = {
      m: mib_resampled(v["circuits"][m]["cpr"]["percentages"], v["circuits"][m]["cpr"]["rows"], idx)
      for m in ("eap", "eap_ig")
    }
    cpr.append(area["eap_ig"]["cpr"] - area["eap"]["cpr"])
  over = "the held-out pairs, each task's resampled on its own"
  return [
    DAS.resampled({DAS_GAP: point[DAS_GAP]}, {DAS_GAP: np.mean(das, 0)}, over=over),
    CIRCUIT.resampled({CPR_GAP: point[CPR_GAP]}, {CPR_GAP: np.mean(cpr, 0)}, over=over),
  ]


if __name__ == "__main__":
  sys.exit(main())
