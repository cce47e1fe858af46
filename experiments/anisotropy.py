"""How contextual are all-MiniLM-L6-v2's word representations? Ethayarajh (2019), layer by layer.

Run:
  ./run.sh experiment anisotropy            # the full run (~1.5 min on 2 CPU cores)
  .venv/bin/python -m experiments.anisotropy [--smoke] [--model DIR_OR_HUB_ID]

The method, the data and what differs from the paper: docs/experiments.md, section
`anisotropy` (the site's Experiments page).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
from collections.abc import Sequence

import numpy as np

from bertjax import claims, study
from bertjax.analysis.representations import features, geometry
from bertjax.claims import Claim, Test
from experiments import common

NAME = "anisotropy"
TRENDED = "anisotropy self_similarity self_similarity_adjusted intra_sentence_adjusted mev_adjusted"
RESAMPLES = 1000  # of the sentences, for the intervals of the anisotropy and self-similarity rows


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  """The shared experiment options and the measures' sizes and definitions."""
  p = common.parser(__doc__)
  add = p.add_argument
  add("--sentences", type=int, help="the first N EWT dev sentences (default: all; --smoke: 40)")
  add("--pairs", type=int, default=20000, help="random word pairs for anisotropy (default: 20000)")
  add(
    "--min-count",
    type=int,
    default=5,
    help="occurrences a word type needs for self-similarity and MEV (default: 5, as Ethayarajh)",
  )
  add(
    "--mev-definition",
    choices=geometry.MEV_DEFINITIONS,
    default="truncated_svd",
    help="the MEV definition of the Findings row (all three are measured; default: "
    "truncated_svd, the code behind the paper's released numbers)",
  )
  add("--mev-max-occurrences", type=int, help="MEV on a seeded sample of <= N occurrences a type")
  add(
    "--punctuation",
    choices=("exclude", "include"),
    default="exclude",
    help="whether punctuation words (UPOS PUNCT) are word types of self-similarity and MEV "
    "(default: exclude, as Ethayarajh's word index)",
  )
  return p.parse_args(argv)


@study.one_blas_thread
def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  t_start = time.perf_counter()
  timings: dict[str, float] = {}

  from bertjax.data import conllu
  from bertjax.plots.geometry import anisotropy_figures

  data = study.data_dir(args.data_dir)
  path = study.ud_file(data, "dev")
  sentences = conllu.read_conllu(path, max_sentences=args.sentences or (40 if args.smoke else None))
  min_count = 2 if args.smoke else args.min_count
  definition = args.mev_definition  # the MEV definition of the verdict (all three are measured)
  with study.timed(timings, "load model"):
    config, params, tok, model_name = study.load_model(args)
  study.log(f"features of {model_name} on {len(sentences)} sentences of {path.name}")
  with study.timed(timings, "features"):
    wf = features.extract_word_features(params, config, tok, sentences, progress=False)
    reps = np.asarray(wf.features, np.float32)  # (L+1, n_words, H)
  types = np.asarray([w.lower() for s in sentences for w in s.forms])
  upos = np.asarray([u for s in sentences for u in s.upos])
  measured = (upos != "PUNCT") | (args.punctuation == "include")
  words = (reps, types, wf.sentence_index)
  both = dict(measured=measured, min_count=min_count, seed=args.seed)
  with study.timed(timings, "measures"):
    sizes = dict(num_pairs=args.pairs, max_occurrences=args.mev_max_occurrences)
    m, mevs = geometry.ethayarajh_measures(*words, **sizes, **both)
  with study.timed(timings, "sentence resamples"):  # for the first three rows' intervals
    resampled = geometry.sentence_resamples(*words, resamples=RESAMPLES, **both)
  mv = mevs[definition]
  m["mev"], m["mev_baseline"], m["mev_adjusted"] = mv["mev"], mv["baseline"], mv["adjusted"]
  counts = np.unique(types[measured], return_counts=True)[1]  # per measured word type
  summary = {  # depth trends (Spearman over layers 1..L, not the embeddings) and type counts
    **{f"trend_{k}": geometry.depth_trend(m[k][1:]) for k in TRENDED.split()},
    "types_min_count": int((counts >= min_count).sum()),
    **{f"mev_{k}": mv[k] for k in ("types", "occurrences", "definition")},
  }
  stem = study.results_stem(NAME, args.model)
  figs = anisotropy_figures(m, args.out, stem, model_name=model_name, definition=definition)
  settings = {
    "model": model_name,
    "data": str(path.relative_to(data)),
    "sentences": len(sentences),
    "words": int(reps.shape[1]),
    "pooling": wf.pooling,
    "min_count": min_count,
    **{k: getattr(args, k) for k in ("pairs", "mev_max_occurrences", "mev_definition", "seed")},
    "sentence_resamples": RESAMPLES,
    "mev_definitions": geometry.MEV_SOURCES,
    "mev_baseline": geometry.MEV_BASELINES["same_count"],
    "mev_baseline_paper": geometry.MEV_BASELINES["paper"].replace(
      "`paper_samples`", f"{min(1000, len(sentences)):,}"
    ),
    "punctuation": args.punctuation,
    "word_types": "lower-cased UD word forms"
    + (", UPOS PUNCT left out" if args.punctuation == "exclude" else ""),
  }
  results = {"summary": summary, "per_layer": m, "features": wf.summary(), "timings": timings}
  results["mev_per_type"] = mv.get("per_type")  # each measured type's MEV and baseline
  # Per resample of the sentences and per layer: the all-pairs anisotropy and self-similarity.
  results["sentence_resamples"] = {k: np.round(v, 5) for k, v in resampled.items()}
  study.finish(NAME, args, results, settings, findings=findings, started=t_start, figures=figs)
  return 0


# The claims ---------------------------------------------------------------------------------------
# `findings(results, settings)`: the Findings rows, made from the numbers as the JSON holds
# them; `uncertainty(results, settings)`: each claim's interval and verdict.

PAPER = "Ethayarajh 2019"


def differs_note(model: str, data: str, anisotropy: Sequence[float]) -> str:
  """What differs from Ethayarajh's setting, and the likely cause of a falling last layer."""
  blocks, name = np.asarray(anisotropy, float)[1:], model.lower()
  what = study.describe_model(model, len(blocks))
  note = f"Differs from Ethayarajh: UD EWT {data} words, not SemEval STS sentences" + (
    f"; {what} (nor ELMo or GPT-2)" if what else ""
  )
  # Both real models here are sentence-transformers checkpoints trained with that loss.
  if ("minilm" in name or "mpnet" in name) and blocks.argmax() < len(blocks) - 1:
    note += (
      "; the contrastive loss rewards spread-out (isotropic) outputs: the likely cause of the "
      f"fall from {blocks.max():.2f} at layer {int(blocks.argmax()) + 1} to {blocks[-1]:.2f} "
      f"at layer {len(blocks)}"
    )
  return note + ". "


LOWEST, HIGHEST = "the lowest layer's mean cosine", "the highest layer's"
RISE, TREND = "the last layer's minus layer 1's", "the Spearman with depth"  # TREND: `depth_trend`
FALL = "layer 1's adjusted self-similarity minus the last layer's"
RISE_STEPS, FALL_STEPS = "the share of steps that rise", "the share of steps that fall"
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
  yes=(Test(RISE, ">", 0), Test(TREND, ">=", 0.5)),
  partly=(Test(RISE, ">", 0), Test(RISE_STEPS, ">", 0.5)),
)
FALLS = Claim(
  PAPER,
  "Upper layers are more context-specific: the anisotropy-adjusted self-similarity of "
  "a word across contexts falls with depth.",
  yes=(Test(FALL, ">", 0), Test(TREND, "<=", -0.5)),
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


# What each claim reads from a measure of layers 1-L (`geometry.layer_statistics`' names).
READS = {
  ANISOTROPIC: {"lowest": LOWEST, "highest": HIGHEST},
  RISES: {"rise": RISE, "trend": TREND, "rising": RISE_STEPS},
  FALLS: {"fall": FALL, "trend": TREND, "falling": FALL_STEPS},
  MEV: {"highest": MEV_HIGHEST, "lowest": MEV_LOWEST},
}


def quantities(claim: Claim, values) -> dict[str, float]:
  """What `claim` reads from a measure of layers 1-L (`(..., L)`: one per resample)."""
  stats = geometry.layer_statistics(values)
  return {name: stats[k] for k, name in READS[claim].items()}


def findings(r: dict, s: dict) -> list[dict]:
  """The rows (anisotropy, its rise with depth, self-similarity's fall, MEV) from the results
  and settings as written to JSON (`python -m experiments.findings --refresh` does too)."""
  r = study.from_json(r)
  summary, definition, min_count = r["summary"], s["mev_definition"], s["min_count"]
  full = np.asarray(r["per_layer"]["anisotropy"], np.float64)  # layer 0: the embedding output
  m = {k: np.asarray(v, np.float64)[1:] for k, v in r["per_layer"].items()}  # layers 1..L
  a, ss, last = m["anisotropy"], m["self_similarity_adjusted"], len(m["anisotropy"])
  per_layer = lambda v: ", ".join(f"{x:.2f}" for x in v)
  rising = lambda v: int(np.sum(np.diff(v) > 0))  # how many steps from layer to layer rise
  kinds = "non-punctuation types" if s["punctuation"] == "exclude" else "types"
  differs = differs_note(s["model"], pathlib.PurePath(s["data"]).name, full)
  peak = int(np.argmax(a))  # the block (0-based) where anisotropy peaks
  cap = (f"<= {s['mev_max_occurrences']}" if s["mev_max_occurrences"] else "all") + " occurrences"
  paper_mev = m[f"mev_{definition}_adjusted_paper"]
  mev_text = (
    f"MEV ({geometry.MEV_LABELS[definition]}) layers 1-{last}: {per_layer(m['mev'])}; minus the MEV of "
    f"as many random words: {per_layer(m['mev_adjusted'])} ({summary['mev_types']} {kinds} "
    f"seen >= {min_count} times, {cap}). "
    + "; ".join(
      f"{geometry.MEV_LABELS[d]}: {per_layer(m[f'mev_{d}'])}, adjusted {per_layer(m[f'mev_{d}_adjusted'])}"
      for d in geometry.MEV_DEFINITIONS
      if d != definition
    )
    + f". Differs from the paper: its baseline is one MEV of {min(1000, s['sentences']):,} random "
    "words from distinct sentences; ours, per type, the MEV of as many random words as the type "
    f"has occurrences. With the paper's baseline the adjusted {definition} MEV is "
    f"{per_layer(paper_mev)} (rule: {MEV.verdict(quantities(MEV, paper_mev))}). The rule reads "
    f"the adjusted {definition} MEV with the same-count baseline."
  )
  return [
    ANISOTROPIC.row(
      f"mean cosine of {s['pairs']} random word pairs, layers 1-{last}: {per_layer(a)} "
      f"(embeddings {full[0]:.2f}; mean-centred: {per_layer(m['anisotropy_centered'])}). {differs}",
      quantities(ANISOTROPIC, a),
    ),
    RISES.row(
      f"anisotropy layer 1 {a[0]:.3f} -> layer {last} {a[-1]:.3f}, peak {a[peak]:.3f} at layer "
      f"{peak + 1}; {rising(a)} of {last - 1} steps rise; Spearman with depth "
      f"{summary['trend_anisotropy']:.2f}; over layers 1-{peak + 1}, up to the peak, "
      f"{rising(a[: peak + 1])} of {peak} steps rise. {differs}",
      quantities(RISES, a),
    ),
    FALLS.row(
      f"self-similarity (raw) layers 1-{last}: {per_layer(m['self_similarity'])}; adjusted: "
      f"{per_layer(ss)} (Spearman {summary['trend_self_similarity_adjusted']:.2f}; "
      f"{summary['types_min_count']} {kinds} seen >= {min_count} times).",
      quantities(FALLS, ss),
    ),
    MEV.row(mev_text, quantities(MEV, m["mev_adjusted"])),
  ]


# How sure each row is ------------------------------------------------------------------------


def uncertainty(r: dict, s: dict) -> list[claims.Judgement]:
  """The anisotropy and self-similarity rows over resamples of the sentences, computed in the
  run (`geometry.sentence_resamples`: every word's vectors are too large to keep); the MEV row
  over the word types (each type's MEV and same-count baseline, resampled together)."""
  rows, per = findings(r, s), r.get("mev_per_type")
  why = "per-sentence values (the random pairs and the types share them)"
  judged = [claims.rerun_needed(why)] * len(rows)
  boot = r.get("sentence_resamples")
  if boot:  # absent from a run before they were kept
    a, ss = (np.asarray(boot[k], np.float64)[:, 1:] for k in ("anisotropy", "self_similarity"))
    layers = lambda k: np.asarray(r["per_layer"][k], np.float64)[1:]
    pa, pss = layers("anisotropy"), layers("self_similarity_adjusted")
    over = f"{len(a)} resamples of the {s['sentences']:,} sentences (all their word pairs)"
    trend = lambda name: {name: "{:+.3f}", TREND: "{:.2f}"}
    judged[:3] = [
      claim.resampled(quantities(claim, p), quantities(claim, v), over=over, shown=shown)
      for claim, p, v, shown in (
        (ANISOTROPIC, pa, a, {LOWEST: "{:.3f}"}),
        (RISES, pa, a, trend(RISE)),
        (FALLS, pss, ss - a, trend(FALL)),
      )
    ]
  if per:  # absent from a run before they were kept, or with no type measured
    m, b = (np.asarray(per[k], np.float64)[:, 1:] for k in ("mev", "baseline"))
    adjusted = lambda m, b: quantities(MEV, np.nanmean(m, -2) - np.nanmean(b, -2))
    point = {rows[3]["value"]["name"]: rows[3]["value"]["value"]}
    judged[3] = MEV.judge((m, b), adjusted, point=point, over=f"the {len(m)} word types")
  return judged


# The likely cause where the models' verdicts differ (or agree for different reasons), as
# the committed numbers show it: (row index, model tag) -> the sentence on the Findings page.
CAUSES = {
  (1, "all-mpnet-base-v2"): (
    "the same shape, a different start: both rise up to their second-to-last layer "
    "(MiniLM 4 of 4 steps to 0.21, MPNet 10 of 10 to 0.18) and fall at the last, "
    "contrastively trained one (0.03, 0.04); MPNet's layer 1 starts low (0.035, MiniLM's "
    "0.116), so its last layer ends 0.002 above its first and the rule says yes"
  ),
}


if __name__ == "__main__":
  sys.exit(main())
