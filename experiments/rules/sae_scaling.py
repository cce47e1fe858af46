"""The Findings rules of `experiments/sae_scaling.py` (Scaling and evaluating sparse autoencoders:
Gao et al. 2024 on an encoder's residual stream): the claims, the measured quantities and their
thresholds, and `findings(results, settings)`, the rows from a results JSON."""

from __future__ import annotations

from collections.abc import Sequence

import common
import numpy as np

from bertjax import claims
from bertjax.claims import Claim, Test

PAPER = "Gao et al. 2024"


DEAD_LIMIT = 0.10  # the paper's 16M-latent GPT-4 SAE: 7% dead


FALLS = "the share of doublings that lower the FVU"
R2 = "the power law's R^2"
CHANGE = "the largest's FVU minus the smallest's"
MOST_DEAD, LEAST_DEAD = "the most dead latents at a size", "the fewest dead latents at a size"
SCALING = Claim(
  PAPER,
  "Reconstruction error of top-k SAEs falls as a power law in the number of latents.",
  yes=(Test(FALLS, ">=", 1), Test(R2, ">=", 0.95)),
  partly=(Test(CHANGE, "<", 0),),
  partly_if="all",
)
DEAD = Claim(
  PAPER,
  "With TopK, the AuxK loss and the tied initialisation few latents die, even at "
  "large sizes (their 16M-latent GPT-4 SAE: 7% dead).",
  yes=(Test(MOST_DEAD, "<=", DEAD_LIMIT),),
  partly=(Test(LEAST_DEAD, "<=", DEAD_LIMIT),),
  short="With TopK, AuxK and tied initialisation few latents die, even at large sizes (GPT-4: 7%).",
)


def scaling_quantities(fvu: Sequence[float], r2: float) -> dict[str, float]:
  """What `SCALING` reads from the FVU by size (smallest first) and the fit's R^2."""
  fvu = np.asarray(fvu, float)
  return {FALLS: float(np.mean(np.diff(fvu) < 0)), R2: r2, CHANGE: float(fvu[-1] - fvu[0])}


def dead_quantities(dead: Sequence[float]) -> dict[str, float]:
  """What `DEAD` reads from the dead shares by size."""
  return {MOST_DEAD: float(np.max(dead)), LEAST_DEAD: float(np.min(dead))}


def findings(r: dict, s: dict) -> list[dict]:
  """The two rows, from the results and settings as written to JSON (`findings.py --refresh`)."""
  r = common.from_json(r)
  sizes, fvu, dead = r["latents"], r["fvu"], r["dead"]
  fit = r["fit"]
  per = ", ".join(f"{n}: {v:.3f}" for n, v in zip(sizes, fvu))
  budget = f"{s['steps']} steps x {s['batch_tokens']} tokens"
  rec = r["loss_recovered"]
  scaling = (
    f"held-out FVU by latents (k = {s['k']}, {s['model']} layer {s['layer'] + 1} output, "
    f"{budget} each, {r['held_out_tokens']:,} held-out WikiText-2 tokens): {per}; fit FVU = "
    f"{fit['coefficient']:.2f} N^{fit['exponent']:.3f}, R^2 {fit['r2']:.3f}. With the largest "
    f"in place of the site the sentence embedding keeps {rec['recovered']:.2f} of what "
    "zero-ablating the site loses (squared distance to the clean embedding). Differs from "
    f"the paper: a {s['depth']}-layer sentence encoder rather than GPT-2 or GPT-4, and one "
    "fixed token budget for every size rather than each trained to convergence."
  )
  dead_text = (
    "dead latents (firing on no held-out token) by size: "
    + ", ".join(f"{n}: {100 * v:.1f}%" for n, v in zip(sizes, dead))
    + "; dense (firing on > 10% of tokens): "
    + ", ".join(f"{100 * v:.1f}%" for v in r["dense"])
    + "."
  )
  return [
    SCALING.row(scaling, scaling_quantities(fvu, fit["r2"])),
    DEAD.row(dead_text, dead_quantities(dead)),
  ]


# How sure each row is ------------------------------------------------------------------------


def uncertainty(r: dict, s: dict) -> list[claims.Judgement]:
  """The scaling row needs per-paragraph errors or repeated seeds; the dead latents are exact."""
  return [
    claims.rerun_needed("per-paragraph reconstruction errors or repeated seeds of each size"),
    claims.note(
      "exact: counted over every held-out token, nothing sampled; one training "
      "run per size (seed 0), seeds not repeated"
    ),
  ]
