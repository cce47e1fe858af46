"""The Findings rules of `experiments/negation_circuit.py` (The circuit that carries negation into
a probe: EAP and EAP-IG against exact edge patching): the claims, the measured quantities and
their thresholds, and `findings(results, settings)`, the rows from a results JSON."""

from __future__ import annotations

import common
import numpy as np

from bertjax import claims, stats
from bertjax.claims import Claim, Test

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


# How sure each row is ------------------------------------------------------------------------


def uncertainty(r: dict, s: dict) -> list[claims.Judgement]:
  """Exact vs EAP and EAP-IG scores per edge; the circuits' metric is kept as a mean only."""
  r = common.from_json(r)
  ex = np.asarray(r["exact_scores"], float)
  eap, ig = (np.asarray(r["edge_scores"][k], float) for k in ("eap", "eap_ig"))
  ok = np.isfinite(ex) & np.isfinite(eap) & np.isfinite(ig)
  items = (ex[ok], eap[ok], ig[ok])
  pearsons = lambda x, e, i: {EAP: stats.pearson_rows(e, x), EAP_IG: stats.pearson_rows(i, x)}
  a = r["agreement"]
  point = {EAP: a["eap"]["pearson"], EAP_IG: a["eap_ig"]["pearson"]}
  first = SCORES.judge(items, pearsons, point=point, over=f"the {int(ok.sum())} edges")
  return [first, _circuit_share(r)]


def _circuit_share(r: dict) -> claims.Judgement:
  """The smallest faithful circuit's share of the edges, over resampled pairs: each circuit's
  normalised metric is recomputed from its per-pair values on each resample."""
  from bertjax.analysis.interventions.circuits import smallest_faithful

  faith = r["faithfulness"]
  if any(f.get("rows") is None for f in faith.values()):
    return claims.rerun_needed(
      "per-pair circuit metrics (each circuit's metric is the pairs' mean)"
    )
  names, total = list(faith), r["graph"]["edges"]
  rows = faith[names[0]]["rows"]
  items = [np.asarray(rows[k], float) for k in ("clean", "corrupted")]
  items += [np.asarray(faith[m]["rows"]["metric"], float).T for m in names]  # (pairs, circuits)

  def share(clean, corrupted, *metrics):  # one resample of the pairs
    c, x = clean.mean(), corrupted.mean()
    kept = [
      smallest_faithful(
        {"edges": faith[m]["edges"], "normalized": (v.mean(0) - x) / (c - x)}, FAITHFUL
      )
      for m, v in zip(names, metrics)
    ]
    kept = [k for k in kept if k is not None]
    return min(kept) / total if kept else None

  def verdict(*a):
    return CIRCUIT.verdict({SHARE: share(*a)})

  def share_or_whole(*a):  # no faithful circuit among those asked: the whole graph, 1
    x = share(*a)
    return 1.0 if x is None else x

  lo, hi = stats.bootstrap_ci(tuple(items), share_or_whole, n_resamples=claims.RESAMPLES)
  return claims.note(
    f"95% CI over the {len(items[0])} pairs: the smallest faithful circuit's share of the "
    f"edges [{lo:.1%}, {hi:.1%}]",
    claims.span_of(tuple(items), verdict),
  )
