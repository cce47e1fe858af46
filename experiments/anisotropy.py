"""How contextual are all-MiniLM-L6-v2's word representations? Ethayarajh (2019), layer by layer.

Run:
  ./run.sh experiment anisotropy            # the full run (~1.5 min on 2 CPU cores)
  .venv/bin/python experiments/anisotropy.py [--smoke] [--model DIR_OR_HUB_ID]

The method, the data and what differs from the paper: docs/experiments.md, section
`anisotropy` (the site's Experiments page).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import common
import numpy as np
from rules import anisotropy as rules

from bertjax.analysis.representations.geometry import MEV_DEFINITIONS

NAME = "anisotropy"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  """The shared experiment options and the measures' sizes and definitions."""
  p = common.parser(__doc__)
  p.add_argument(
    "--sentences",
    type=int,
    default=None,
    help="use only the first N EWT dev sentences (default: all 2,001; --smoke: 40)",
  )
  p.add_argument(
    "--pairs", type=int, default=20000, help="random word pairs for anisotropy (default: 20000)"
  )
  p.add_argument(
    "--min-count",
    type=int,
    default=5,
    help="a word type needs this many occurrences for self-similarity and MEV "
    "(default: 5, as Ethayarajh)",
  )
  p.add_argument(
    "--mev-definition",
    choices=MEV_DEFINITIONS,
    default="truncated_svd",
    help="the MEV definition of the Findings row (all three are measured; "
    "default: truncated_svd, the code behind the paper's released numbers)",
  )
  p.add_argument(
    "--mev-max-occurrences",
    type=int,
    default=None,
    help="at most this many occurrences per type for MEV (a seeded sample; "
    "default: all, as Ethayarajh)",
  )
  p.add_argument(
    "--punctuation",
    choices=("exclude", "include"),
    default="exclude",
    help="whether punctuation words (UPOS PUNCT) are word types of self-similarity "
    "and MEV (default: exclude, as Ethayarajh's word index)",
  )
  return p.parse_args(argv)


def summarise(
  m: dict[str, np.ndarray], mv: dict, type_counts: np.ndarray, min_count: int, definition: str
) -> dict:
  """Depth trends (Spearman over layers 1..L) of the measures, and the word-type counts."""
  ctx = slice(1, None)  # the transformer layers; layer 0 is the embedding output
  return {
    "trend_anisotropy": rules.trend(m["anisotropy"][ctx]),
    "trend_self_similarity": rules.trend(m["self_similarity"][ctx]),
    "trend_self_similarity_adjusted": rules.trend(m["self_similarity_adjusted"][ctx]),
    "trend_intra_sentence_adjusted": rules.trend(m["intra_sentence_adjusted"][ctx]),
    "trend_mev_adjusted": rules.trend(m["mev_adjusted"][ctx]),
    "types_min_count": int((type_counts >= min_count).sum()),
    "mev_types": mv["types"],
    "mev_occurrences": mv["occurrences"],
    "mev_definition": definition,
  }


@common.one_blas_thread
def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  t_start = time.perf_counter()
  timings: dict[str, float] = {}

  from bertjax.analysis.representations import features, geometry
  from bertjax.data import conllu
  from bertjax.plots.geometry import anisotropy_figures

  data = common.data_dir(args.data_dir)
  path = common.ud_file(data, "dev")
  sentences = conllu.read_conllu(path, max_sentences=args.sentences or (40 if args.smoke else None))
  min_count = 2 if args.smoke else args.min_count
  with common.timed(timings, "load model"):
    config, params, tok, model_name = common.load_model(args)
  common.log(f"features of {model_name} on {len(sentences)} sentences of {path.name}")
  with common.timed(timings, "features"):
    wf = features.extract_word_features(params, config, tok, sentences, progress=False)
    reps = np.asarray(wf.features, np.float32)  # (L+1, n_words, H)
  types = np.asarray([w.lower() for s in sentences for w in s.forms])
  measured = np.ones(len(types), bool)
  if args.punctuation == "exclude":
    measured = np.asarray([u != "PUNCT" for s in sentences for u in s.upos])
  with common.timed(timings, "measures"):
    m, mevs = geometry.ethayarajh_measures(
      reps,
      types,
      wf.sentence_index,
      measured=measured,
      num_pairs=args.pairs,
      min_count=min_count,
      max_occurrences=args.mev_max_occurrences,
      seed=args.seed,
    )
  mv = mevs[args.mev_definition]  # the verdict's definition
  m["mev"], m["mev_baseline"], m["mev_adjusted"] = mv["mev"], mv["baseline"], mv["adjusted"]
  counts = np.unique(types[measured], return_counts=True)[1]
  summary = summarise(m, mv, counts, min_count, args.mev_definition)
  stem = common.results_stem(NAME, args.model)
  figs = anisotropy_figures(
    m, args.out, stem, model_name=model_name, definition=args.mev_definition
  )
  settings = {
    "model": model_name,
    "data": str(path.relative_to(data)),
    "sentences": len(sentences),
    "words": int(reps.shape[1]),
    "pooling": wf.pooling,
    "min_count": min_count,
    **{k: getattr(args, k) for k in ("pairs", "mev_max_occurrences", "mev_definition", "seed")},
    "mev_definitions": geometry.MEV_SOURCES,
    "mev_baseline": "per measured type, the MEV (same definition) of as many tokens "
    "drawn uniformly from all words; averaged over types",
    "mev_baseline_paper": f"mev_*_baseline_paper: one MEV of {min(1000, len(sentences)):,} "
    "words, one from each of as many random sentences (kawine/contextual "
    "explore_embedding_space)",
    "punctuation": args.punctuation,
    "word_types": "lower-cased UD word forms"
    + (", UPOS PUNCT left out" if args.punctuation == "exclude" else ""),
  }
  results = {"summary": summary, "per_layer": m, "features": wf.summary(), "timings": timings}
  common.finish(NAME, args, results, settings, started=t_start, figures=figs)
  return 0


if __name__ == "__main__":
  sys.exit(main())
