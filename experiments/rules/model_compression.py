"""The Findings rules of `experiments/model_compression.py` (Compressing a fine-tuned 6-layer
model: distillation, layer sharing and int8 (the slides' table)): the claims, the measured
quantities and their thresholds, and `findings(results, settings)`, the rows from a results
JSON."""

from __future__ import annotations

import numpy as np

from bertjax import claims
from bertjax.claims import Claim, Test

RETAINED = "the score retained"
SPEEDUP = "the forward speed-up"
PARAMS = "the parameters over the teacher's"
DISTIL = Claim(
  "Sanh et al. 2019",
  "A student with half the teacher's layers, initialised from every other layer and "
  "distilled, keeps ~97% of the score and runs ~1.6x faster (DistilBERT).",
  yes=(Test(RETAINED, ">=", 0.95), Test(SPEEDUP, ">=", 1.3)),
  short="A half-depth distilled student keeps ~97% of the score and runs ~1.6x faster (DistilBERT).",
)
SHARING = Claim(
  "Lan et al. 2020",
  "Sharing one layer's parameters across all layers divides the parameter count (ALBERT) "
  "but not the compute, at some cost in score.",
  yes=(Test(PARAMS, "<=", 0.7), Test(SPEEDUP, "<", 1.25), Test(RETAINED, ">=", 0.9)),
  partly=(Test(PARAMS, "<=", 0.7), Test(SPEEDUP, "<", 1.25)),
  partly_if="all",
  missing="n/a",
  missing_when="the teacher has no ALBERT counterpart",
  short="Sharing one layer's parameters across all layers divides parameters but not compute, at some cost.",
)
INT8 = Claim(
  "Zafrir et al. 2019",
  "Int8 linear layers (Q8BERT) keep ~99% of the score with 4x smaller linear weights.",
  yes=(Test(RETAINED, ">=", 0.99),),
  partly=(Test(RETAINED, ">=", 0.97),),
)


def findings(r: dict, s: dict) -> list[dict]:
  """The Findings rows (DistilBERT, ALBERT, Q8BERT) from the results and settings as written to
  JSON (`findings.py --refresh`)."""
  rows, majority, cpu = r["rows"], r["majority_tag_accuracy"], r["cpu"]["cpu"]
  teacher = rows["teacher"]
  d, sh, q = rows["distilled_3l"], rows.get("shared_6l"), rows["int8"]
  lab = rows["labels_3l"]
  if sh is None:
    sharing = SHARING.row(
      "not measured: the teacher is not a BERT, and only BERT's family row has an ALBERT "
      "counterpart with shared layers (this family's block, e.g. MPNet's relative-position "
      "bias, has none); the row for sharing is the all-MiniLM-L6-v2 run's.",
      {PARAMS: None, SPEEDUP: None, RETAINED: None},
    )
  else:
    sharing = SHARING.row(
      f"{sh['depth']} layers sharing one set (from teacher block {s['shared_layer']}, "
      "distilled): "
      f"{sh['params'] / 1e6:.2f}M vs {teacher['params'] / 1e6:.2f}M parameters "
      f"({sh['param_ratio']:.0%}; the embeddings dominate), {sh['score']:.2%} = "
      f"{sh['retained']:.1%} retained, forward {sh['speedup']:.2f}x the teacher's speed.",
      {PARAMS: sh["param_ratio"], SPEEDUP: sh["speedup"], RETAINED: sh["retained"]},
    )
  return [
    DISTIL.row(
      f"UPOS (UD EWT dev, held-out words): teacher {teacher['score']:.2%} (majority tag "
      f"{majority:.1%}); {d['depth']}-layer student {d['score']:.2%} = {d['retained']:.1%} "
      "retained "
      f"with {1 - d['param_ratio']:.0%} fewer parameters, {d['speedup']:.2f}x faster "
      f"forward on the CPU; trained on labels only {lab['score']:.2%} "
      f"({lab['retained']:.1%}).",
      {RETAINED: d["retained"], SPEEDUP: d["speedup"]},
    ),
    sharing,
    INT8.row(
      f"dynamic int8 of the fine-tuned teacher: {q['score']:.2%} = {q['retained']:.2%} "
      f"retained; weights {q['mb']:.1f} MB vs {teacher['mb']:.1f} MB "
      f"({q['compression']:.2f}x smaller; the float32 embedding table is most of what is "
      f"left); forward {q['speedup']:.2f}x the float32 speed on {cpu} (XLA's "
      "integer dot; no fused int8 kernel).",
      {RETAINED: q["retained"]},
    ),
  ]


# How sure each row is ------------------------------------------------------------------------


def uncertainty(r: dict, s: dict) -> list[claims.Judgement]:
  """The speed rounds (interleaved); the retained scores need per-word predictions."""
  rows, sp = r["rows"], r["speed"]
  names = [k for k in ("teacher", "distilled_3l", "shared_6l") if k in sp]
  rounds = np.asarray([sp[k]["rounds_s"] for k in names], float).T  # (rounds, models)
  d_ci, *sh_ci = claims.interval_text(
    rounds, lambda t: np.median(t[..., :1], 1) / np.median(t[..., 1:], 1), "{:.2f}x"
  )
  speed = lambda t, i: float(np.median(t[:, 0]) / np.median(t[:, i]))
  d, sh = rows["distilled_3l"], rows.get("shared_6l")
  distil = claims.span_of(
    rounds, lambda t: DISTIL.verdict({RETAINED: d["retained"], SPEEDUP: speed(t, 1)})
  )
  words = "per-word predictions of each model (paired with the teacher's)"
  first = claims.note(
    f"95% CI over the {len(rounds)} interleaved rounds: speed-up {d_ci}; "
    f"retained: rerun needed (the JSON keeps no {words})",
    distil,
  )
  if sh is None:  # a teacher without an ALBERT counterpart: the sharing row is n/a
    return [first, claims.note("n/a: nothing measured"), claims.rerun_needed(words)]
  sharing = claims.span_of(
    rounds,
    lambda t: SHARING.verdict(
      {PARAMS: sh["param_ratio"], SPEEDUP: speed(t, 2), RETAINED: sh["retained"]}
    ),
  )
  return [
    first,
    claims.note(
      f"exact: parameters; 95% CI over the {len(rounds)} rounds: speed "
      f"{sh_ci[0]}; retained: rerun needed (no {words})",
      sharing,
    ),
    claims.rerun_needed(words),
  ]
