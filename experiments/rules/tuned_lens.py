"""The Findings rules of `experiments/tuned_lens.py` (The tuned lens against the logit lens:
Belrose et al. 2023 on a masked-LM encoder): the claim, the measured quantity and its
thresholds, and `findings(results, settings)`, the rows from a results JSON."""

from __future__ import annotations

from collections.abc import Sequence

import common
import numpy as np

from bertjax import claims
from bertjax.claims import Claim, Test

CLOSER = "the share of layers where the tuned lens's KL is below the logit lens's"
GAP = "the logit lens's KL minus the tuned lens's where it is least (nats)"
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
  tokens): the share of layers where the tuned lens is closer, and the smallest logit - tuned
  gap over the layers."""
  per = r["per_batch"]
  n = np.asarray(per["tokens"], float)
  items = (n, np.asarray(per["tuned"], float), np.asarray(per["logit"], float))

  def kl(n, tuned, logit):  # (R, batches, layers): token-weighted KL per layer, each lens
    w = n[..., None] / n.sum(1)[:, None, None]
    t, g = (tuned * w).sum(1), (logit * w).sum(1)
    return {CLOSER: (t < g).mean(-1), GAP: (g - t).min(-1)}

  shown = {CLOSER: "{:.2f}", GAP: "{:.2f}"}
  over = f"the {len(n)} held-out batches"
  return [
    LENS.judge(items, kl, point={CLOSER: closer(r["tuned"], r["logit"])}, over=over, shown=shown)
  ]
