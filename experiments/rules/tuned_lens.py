"""The Findings rules of `experiments/tuned_lens.py` (The tuned lens against the logit lens:
Belrose et al. 2023 on a masked-LM encoder): the claim, the measured quantity and its
thresholds, and `findings(results, settings)`, the rows from a results JSON."""

from __future__ import annotations

from collections.abc import Sequence

import common
import numpy as np

from bertjax import claims, stats
from bertjax.claims import Claim, Test

CLOSER = "the share of layers where the tuned lens's KL is below the logit lens's"
LENS = Claim(
  "Belrose et al. 2023",
  "A tuned lens (an affine translator per layer, trained to match the final layer's "
  "distribution) reads every layer's prediction closer to the final layer's than the logit "
  "lens does (lower KL).",
  yes=(Test(CLOSER, ">=", 1),),
  partly=(Test(CLOSER, ">=", 0.5),),
  short="A tuned lens reads every layer's prediction closer to the final layer's than the logit lens.",
)


def closer(tuned: Sequence[float], logit: Sequence[float]) -> float:
  """The share of layers where the tuned lens's KL is below the logit lens's."""
  return float(np.mean(np.asarray(tuned) < np.asarray(logit)))


def findings(r: dict, s: dict) -> list[dict]:
  """The row, from the results and settings as written to JSON (`findings.py --refresh`)."""
  r = common.from_json(r)
  source = common.head_source(r["head"])
  layers = len(r["tuned"])
  by_layer = lambda v: ", ".join(f"{x:.2f}" for x in v)
  measured = (
    f"{s['model']}, read by {source}; the lens trained {s['steps']} steps (lr_scale "
    f"{s.get('lr_scale', 1.0):g}) on {r['train_tokens']:,} WikiText-2 validation tokens; "
    "KL(final || lens) in nats on "
    f"{r['tokens']:,} held-out test tokens, layers 0-{layers - 1} (0 the embeddings): tuned "
    f"{by_layer(r['tuned'])}; logit {by_layer(r['logit'])}. Differs from the paper: decoders "
    "with next-token heads, lenses trained on 2^18 tokens a step at lr_scale 1; here a "
    "masked-LM head read at every token of unmasked text, and at most 256 tokens a step."
  )
  return [LENS.row(measured, {CLOSER: closer(r["tuned"], r["logit"])})]


# How sure each row is ------------------------------------------------------------------------


def uncertainty(r: dict, s: dict) -> list[claims.Judgement]:
  """Held-out KL by layer per batch of windows, over resampled batches (each weighted by its
  tokens): the interval of the smallest logit - tuned gap over the layers, and the verdict on
  the layers' share where the tuned lens is closer."""
  per = r["per_batch"]
  n = np.asarray(per["tokens"], float)
  items = (n, np.asarray(per["tuned"], float), np.asarray(per["logit"], float))

  def smallest_gap(n, tuned, logit):  # (R, batches, ...) -> (R,): the least logit - tuned KL
    w = n[..., None] / n.sum(1)[:, None, None]
    return ((logit - tuned) * w).sum(1).min(-1)

  lo, hi = stats.bootstrap_ci(items, smallest_gap, n_resamples=claims.RESAMPLES, vectorized=True)
  share = lambda n, t, g: closer(*(np.asarray(n) @ x / np.sum(n) for x in (t, g)))
  return [
    claims.note(
      f"95% CI over the {len(n)} held-out batches: the logit lens's KL minus the tuned lens's "
      f"at the layer where it is least [{lo:.2f}, {hi:.2f}] nats",
      claims.span_of(items, lambda *a: LENS.verdict({CLOSER: share(*a)})),
    )
  ]
