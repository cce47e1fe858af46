"""What does BERT look at? Clark et al. 2019 on all-MiniLM-L6-v2 and UD English EWT.

Run:
  ./run.sh experiment what_bert_looks_at
  .venv/bin/python experiments/what_bert_looks_at.py [--smoke] [--model DIR_OR_HUB_ID]

The method, the data and what differs from the paper: docs/experiments.md, section
`what_bert_looks_at` (the site's Experiments page).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

import common
import numpy as np
from rules import what_bert_looks_at as rules

NAME = "what_bert_looks_at"


def run_settings(smoke: bool, seed: int) -> dict[str, Any]:
  """The sizes of a run (`experiments/sizes.toml`): the full one, or the small smoke one."""
  return {**common.sizes(NAME)["smoke" if smoke else "full"], "seed": seed}


# The run ------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  """The shared experiment options and the attention statistics' definition."""
  p = common.parser(__doc__)
  p.add_argument(
    "--weighting",
    choices=("document", "token"),
    default="document",
    help="average the attention statistics per sentence, then over sentences "
    "(document, Clark's notebook), or over all tokens (default: document)",
  )
  p.add_argument(
    "--punctuation",
    choices=("clark", "all"),
    default="clark",
    help='punctuation keys: "." and "," (clark) or every punctuation entry of the '
    "vocabulary (all) (default: clark)",
  )
  p.add_argument(
    "--entropy-smoothing",
    type=float,
    default=1e-4,
    help="entropy of (1 - eps) a + eps / n, Clark's 1e-4 (default); 0: unsmoothed",
  )
  return p.parse_args(argv)


def main(argv=None) -> int:
  args = parse_args(argv)
  start = time.perf_counter()
  import jax

  from bertjax.analysis.attention import statistics, syntax
  from bertjax.data import conllu
  from bertjax.plots.attention import clark_figures
  from bertjax.tasks import text_batches

  data = common.data_dir(args.data_dir)
  s = run_settings(args.smoke, args.seed)
  timings: dict[str, float] = {}
  with common.timed(timings, "load"):
    config, params, tok, s["model"] = common.load_model(args, common.tiny_stand_in(s["model"]))
    path = common.ud_file(data, "dev")
    ud = conllu.read_conllu(path, max_sentences=s["max_sentences"])
    words = [list(x.forms) for x in ud]
    size = {k: s[k] for k in ("batch_size", "max_tokens")}
    batches = text_batches.fitting_batches(tok, words, **size)
  plain = [text_batches.plain(b) for _, b in batches]
  clark_kw = {"punctuation": args.punctuation, "smoothing": args.entropy_smoothing}
  with common.timed(timings, "clark"):
    clark = statistics.clark_summary(
      params, config, tok, plain, weighting=args.weighting, **clark_kw
    )
    common.log("[SEP] mass by layer: " + str(np.round(clark["by_layer"]["sep"], 3).tolist()))
  with common.timed(timings, "clark token-weighted"):
    # The earlier definition, for comparison.
    variant = statistics.clark_summary(
      params, config, tok, plain, weighting="token", punctuation="all", smoothing=0.0
    )
  with common.timed(timings, "probe"):
    punct = statistics.punctuation_of(tok, args.punctuation)
    probe = syntax.dependency_probe(
      params,
      config,
      batches,
      ud,
      s["min_count"],
      (tok.sep_id, punct, args.entropy_smoothing),
      common.log,
    )
  per_sentence = probe["per_sentence"]
  # Each sentence's statistics, averaged over sentences, are the library's document-weighted
  # ones (the intervals of the Findings resample these).
  document = args.weighting == "document"
  gap = syntax.per_sentence_gap(per_sentence, clark["by_layer"]) if document else float("nan")
  common.log(f"per-sentence statistics vs clark_statistics: max |diff| {gap:.1e}")
  n_tok = sum(int(b["attention_mask"].sum()) for b in plain)
  results = {
    "data": {
      "file": path.name,
      "sentences": len(ud),
      "sentences_used": sum(len(idx) for idx, _ in batches),
      "tokens": n_tok,
      "arcs": probe["arcs"],
      "relation_counts": probe["counts"],
    },
    "clark": clark,
    "clark_token_all_punct": variant,
    "probe": syntax.probe_results(probe["table"], probe["frequent"], probe["check"]),
    # (sentences, L) each, rounded to 1e-5: what the Findings' intervals resample.
    "per_sentence": {k: np.round(v, 5) for k, v in per_sentence.items()},
    "per_sentence_vs_clark_max_diff": gap,
  }
  results["timings_s"] = timings
  stem = common.results_stem(NAME, args.model)
  figs = clark_figures(results, probe["frequent"], args.out, stem)
  settings = {
    **s,
    "data": f"UD English EWT {path.name}",
    "layers": config.depth,
    "special_tokens": common.special_tokens(tok),
    "heads": config.num_attention_heads,
    "backend": jax.default_backend(),
    "max_offset": syntax.MAX_OFFSET,
    "indexing": rules.INDEXING,
    "selection": "best head / offset chosen on even-numbered sentences, scored on odd ones",
    "prediction": "argmax of word-level attention over the sentence's other words "
    "([CLS], [SEP] and the word itself excluded)",
    "clark_relations_of_interest": syntax.CLARK_RELATIONS,
    "clark_statistics": {
      **clark["definition"],
      "source": "clarkkev/attention-analysis "
      "General_Analysis.ipynb (cells 5 and 7) when document / clark / 1e-4",
      "variant": "clark_token_all_punct: token-weighted, every punctuation id, unsmoothed entropy",
    },
  }
  common.finish(NAME, args, results, settings, started=start, figures=figs)
  return 0


if __name__ == "__main__":
  sys.exit(main())
