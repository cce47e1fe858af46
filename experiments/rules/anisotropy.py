"""The Findings rules of `experiments/anisotropy.py` (How contextual are all-MiniLM-L6-v2's word
representations? Ethayarajh (2019), layer by layer): the claims, the measured quantities and
their thresholds, and `findings(results, settings)`, the rows from a results JSON."""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

import common
import numpy as np

from bertjax import claims, stats
from bertjax.analysis.representations.geometry import MEV_DEFINITIONS
from bertjax.claims import Claim, Test

PAPER = "Ethayarajh 2019"
MEV_LABELS = {
  "truncated_svd": "TruncatedSVD, the paper's released code",
  "pca": "centred PCA",
  "uncentred": "uncentred sigma_1^2 / sum sigma_i^2",
}


def differs_note(model: str, data: str, anisotropy: Sequence[float]) -> str:
  """What differs from Ethayarajh's setting, and the likely cause of a falling last layer."""
  a = np.asarray(anisotropy, float)
  blocks = a[1:]
  note = (
    f"Differs from Ethayarajh: {model} on UD EWT {data} words, not BERT-base, ELMo or "
    "GPT-2 on SemEval STS sentences"
  )
  if "mpnet" in model.lower():
    note += (
      "; MPNet is not BERT either: pre-trained by permuted language modelling, with a "
      "relative-position bias in every layer's attention"
    )
  # Both real models here are sentence-transformers checkpoints trained with that loss.
  if ("minilm" in model.lower() or "mpnet" in model.lower()) and blocks.argmax() < len(blocks) - 1:
    note += (
      f"; {model} was trained further for sentence embeddings with a contrastive loss "
      "on its mean-pooled last layer, which rewards spread-out (isotropic) outputs: the "
      f"likely cause of the fall from {blocks.max():.2f} at layer "
      f"{int(blocks.argmax()) + 1} to {blocks[-1]:.2f} at layer {len(blocks)}"
    )
  return note + ". "


def trend(values: Sequence[float]) -> float:
  """Spearman rank correlation between layer index and value; nan if constant."""
  return stats.spearman(np.arange(len(values)), values)


LOWEST, HIGHEST = "the lowest layer's mean cosine", "the highest layer's"
RISE, RISE_TREND, RISE_STEPS = (
  "the last layer's minus layer 1's",
  "the Spearman with depth",
  "the share of steps that rise",
)
FALL, FALL_TREND, FALL_STEPS = (
  "layer 1's adjusted self-similarity minus the last layer's",
  "the Spearman with depth",
  "the share of steps that fall",
)
MEV_HIGHEST, MEV_LOWEST = "the highest layer's adjusted MEV", "the lowest layer's"
ANISOTROPIC = Claim(
  PAPER,
  "Contextual word representations are anisotropic: two random words have a mean "
  "cosine similarity well above 0.",
  yes=(Test(LOWEST, ">=", 0.1),),
  partly=(Test(HIGHEST, ">=", 0.1),),
)
RISES = Claim(
  PAPER,
  "Representations grow more anisotropic in upper layers.",
  yes=(Test(RISE, ">", 0), Test(RISE_TREND, ">=", 0.5)),
  partly=(Test(RISE, ">", 0), Test(RISE_STEPS, ">", 0.5)),
)
FALLS = Claim(
  PAPER,
  "Upper layers are more context-specific: the anisotropy-adjusted self-similarity of "
  "a word across contexts falls with depth.",
  yes=(Test(FALL, ">", 0), Test(FALL_TREND, "<=", -0.5)),
  partly=(Test(FALL, ">", 0), Test(FALL_STEPS, ">", 0.5)),
)
MEV = Claim(
  PAPER,
  "A static embedding explains little of a word's contextual representations: on "
  "average < 5% of their variance (the maximum explainable variance, MEV).",
  yes=(Test(MEV_HIGHEST, "<", 0.05),),
  partly=(Test(MEV_LOWEST, "<", 0.05),),
  short="A static embedding explains under 5% of the variance of a word's contextual representations (MEV).",
)


def anisotropy_quantities(raw: Sequence[float]) -> dict[str, float]:
  """What `ANISOTROPIC` reads from the mean cosine of layers 1-L."""
  return {LOWEST: float(np.min(raw)), HIGHEST: float(np.max(raw))}


def trend_quantities(values: Sequence[float], falls: bool = False) -> dict[str, float]:
  """What `RISES` (or with `falls`, `FALLS`) reads from a value of layers 1-L."""
  v = np.asarray(values, np.float64)
  if falls:
    return {FALL: v[0] - v[-1], FALL_TREND: trend(v), FALL_STEPS: np.mean(np.diff(v) < 0)}
  return {RISE: v[-1] - v[0], RISE_TREND: trend(v), RISE_STEPS: np.mean(np.diff(v) > 0)}


def mev_quantities(adjusted: Sequence[float]) -> dict[str, float]:
  """What `MEV` reads from the adjusted MEV of layers 1-L."""
  return {MEV_HIGHEST: float(np.max(adjusted)), MEV_LOWEST: float(np.min(adjusted))}


def findings(r: dict, s: dict) -> list[dict]:
  """The Findings rows (anisotropy, its rise with depth, self-similarity's fall, MEV) from the
  results and settings as written to JSON (`findings.py --refresh` recomputes them)."""
  r = common.from_json(r)
  m = {k: np.asarray(v, np.float64) for k, v in r["per_layer"].items()}
  summary, definition, min_count = r["summary"], s["mev_definition"], s["min_count"]
  ctx = slice(1, None)  # the transformer layers; layer 0 is the embedding output
  last = len(m["anisotropy"]) - 1
  a, ss = m["anisotropy"], m["self_similarity_adjusted"]
  per_layer = lambda v: ", ".join(f"{x:.2f}" for x in v)
  other = [d for d in MEV_DEFINITIONS if d != definition]
  n_paper = f"{min(1000, s['sentences']):,}"
  kinds = "non-punctuation types" if s["punctuation"] == "exclude" else "types"
  differs = differs_note(s["model"], pathlib.PurePath(s["data"]).name, a)
  peak = int(np.argmax(a[ctx]))  # the block (0-based) where anisotropy peaks
  cap = (f"<= {s['mev_max_occurrences']}" if s["mev_max_occurrences"] else "all") + " occurrences"
  paper_mev = m[f"mev_{definition}_adjusted_paper"][ctx]
  mev_text = (
    f"MEV ({MEV_LABELS[definition]}) layers 1-{last}: {per_layer(m['mev'][ctx])}; "
    f"minus the MEV of as many random words: {per_layer(m['mev_adjusted'][ctx])} "
    f"({summary['mev_types']} {kinds} seen >= {min_count} times, {cap}). "
    + "; ".join(
      f"{MEV_LABELS[d]}: {per_layer(m[f'mev_{d}'][ctx])}, adjusted "
      f"{per_layer(m[f'mev_{d}_adjusted'][ctx])}"
      for d in other
    )
    + f". Differs from the paper: its baseline is one MEV of {n_paper} random words from "
    "distinct sentences; ours, per type, the MEV of as many random words as the type has "
    f"occurrences. With the paper's baseline the adjusted {definition} MEV is "
    f"{per_layer(paper_mev)} (rule: {MEV.verdict(mev_quantities(paper_mev))}). The rule reads "
    f"the adjusted {definition} MEV with the same-count baseline."
  )
  return [
    ANISOTROPIC.row(
      f"mean cosine of {s['pairs']} random word pairs, layers 1-{last}: {per_layer(a[ctx])} "
      f"(embeddings {a[0]:.2f}; mean-centred: {per_layer(m['anisotropy_centered'][ctx])}). "
      f"{differs}",
      anisotropy_quantities(a[ctx]),
    ),
    RISES.row(
      f"anisotropy layer 1 {a[1]:.3f} -> layer {last} {a[last]:.3f}, peak {a[ctx].max():.3f} at "
      f"layer {int(np.argmax(a[ctx])) + 1}; {int(np.sum(np.diff(a[ctx]) > 0))} of {last - 1} "
      f"steps rise; Spearman with depth {summary['trend_anisotropy']:.2f}; over layers "
      f"1-{peak + 1}, up to the peak, {int(np.sum(np.diff(a[1 : peak + 2]) > 0))} of {peak} steps "
      f"rise. {differs}",
      trend_quantities(a[ctx]),
    ),
    FALLS.row(
      f"self-similarity (raw) layers 1-{last}: {per_layer(m['self_similarity'][ctx])}; adjusted: "
      f"{per_layer(ss[ctx])} (Spearman {summary['trend_self_similarity_adjusted']:.2f}; "
      f"{summary['types_min_count']} {kinds} seen >= {min_count} times).",
      trend_quantities(ss[ctx], falls=True),
    ),
    MEV.row(mev_text, mev_quantities(m["mev_adjusted"][ctx])),
  ]


# How sure each row is ------------------------------------------------------------------------


def uncertainty(r: dict, s: dict) -> list[claims.Judgement]:
  """One judgement per row: none has an interval yet, as the JSON keeps no per-item values."""
  what = "per-pair cosines or per-type values"
  return [claims.rerun_needed(what)] * len(findings(r, s))
