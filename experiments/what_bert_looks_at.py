"""What does BERT look at? Clark et al. 2019 on all-MiniLM-L6-v2 and UD English EWT.

Run:
  ./run.sh experiment what_bert_looks_at
  .venv/bin/python experiments/what_bert_looks_at.py [--smoke] [--model DIR_OR_HUB_ID]

The method, the data and what differs from the paper: docs/experiments.md, section
`what_bert_looks_at` (the site's Experiments page).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import Any

import common
import numpy as np
from findings import Rule, Test

NAME = "what_bert_looks_at"
PAPER = "Clark et al. 2019"
INDEXING = (
  "layers are numbered 1..L (blocks; 0 would be the embeddings) and heads 0..H-1 in "
  "results, figures and findings: a best head is [layer, head]; per-layer arrays hold "
  "layers 1..L in order, (L, H) arrays layer by head"
)


def run_settings(smoke: bool, seed: int) -> dict[str, Any]:
  """The sizes of a run: the full one, or the small smoke one."""
  if smoke:
    return {
      "model": "tiny random (2 layers x 4 heads, 64 wide, MiniLM vocabulary)",
      "max_sentences": 24,
      "max_tokens": 128,
      "batch_size": 16,
      "min_count": 3,
      "seed": seed,
    }
  return {
    "model": "all-MiniLM-L6-v2",
    "max_sentences": None,
    "max_tokens": 128,
    "batch_size": 32,
    "min_count": 100,
    "seed": seed,
  }


def _not_bert_base(model: str, depth: int) -> str:
  """How the analysed model differs from Clark's BERT-base (empty for a BERT-base)."""
  what = common.describe_model(model, depth)
  return f"{what}; " if what else ""


MIDDLE = "the middle third's attention to [CLS], [SEP] and punctuation"
SEP_MARGIN = "[SEP]'s share minus the larger other's"
FIRST = "layer 1's entropy minus the highest other layer's"
HALVES = "the first half's mean entropy minus the second's"
BEATEN = "the share of frequent relations where a head beats the offset by 5 points"
OVERALL = "the best head's accuracy over all arcs"
SINK = Rule(
  PAPER,
  "Heads in the middle layers put most of their attention on a few tokens, [SEP] "
  "above all (BERT-base: layers 6-10 give [SEP] over half), which Clark reads as a no-op "
  "when a head's function does not apply.",
  yes=(Test(MIDDLE, ">", 0.5), Test(SEP_MARGIN, ">", 0)),
  partly=(Test(MIDDLE, ">", 0.5),),
)
ENTROPY = Rule(
  PAPER,
  "Early layers attend broadly (high attention entropy); later heads focus.",
  yes=(Test(FIRST, ">=", 0), Test(HALVES, ">", 0)),
)
RELATIONS = Rule(
  PAPER,
  "Particular heads track particular dependency relations well, well above a "
  "fixed-offset baseline.",
  yes=(Test(BEATEN, ">=", 2 / 3),),
  partly=(Test(BEATEN, ">=", 1 / 3),),
)
NO_SYNTAX_HEAD = Rule(
  PAPER,
  "No single head does well at syntax overall.",
  yes=(Test(OVERALL, "<", 0.5),),
  partly=(Test(OVERALL, "<", 0.7),),
)


def _roles(s: dict) -> str:
  """Which tokens play [CLS] and [SEP] where they are not BERT's strings (MPNet: <s>, </s>)."""
  tokens = s.get("special_tokens") or {}
  other = {k: v for k, v in tokens.items() if k in ("[CLS]", "[SEP]") and k != v}
  return (
    ""
    if not other
    else " ([CLS] and [SEP] are the tokenizer's roles: "
    + ", ".join(f"{k} is {v}" for k, v in other.items())
    + ")"
  )


def findings(r: dict, s: dict) -> list[dict]:
  """The Findings rows from the results as written to JSON (`r`) and the settings `s`.

  Each `holds` follows the stated rule from the numbers; each row says where the data or the
  model differ from Clark et al.'s (BERT-base on Wikipedia segment pairs).
  """
  r = common.from_json(r)
  clark, variant, probe = r["clark"], r["clark_token_all_punct"], r["probe"]
  depth, model = s["layers"], s.get("model") or "the model"
  by = {k: np.asarray(v, float) for k, v in clark["by_layer"].items()}
  vb = variant["by_layer"]
  sep, ent = by["sep"], by["entropy"]
  peak = int(np.argmax(sep))
  # The middle third of the blocks (1-based lo..hi), where Clark's BERT-base puts its [SEP] mass.
  lo, hi = max(1, round(depth / 3) + 1), max(1, round(2 * depth / 3))
  inner = slice(lo - 1, max(hi, lo))
  masses = {
    name: float(by[key][inner].mean())
    for name, key in (("[CLS]", "cls"), ("[SEP]", "sep"), ("punctuation", "punct"))
  }
  total = sum(masses.values())
  sink = max(masses, key=masses.get)
  d = clark["definition"]
  how = (
    "per sentence, then over sentences (Clark's notebook)"
    if d["weighting"] == "document"
    else "over all tokens"
  )
  punct_how = (
    '"." and ","' if d["punctuation"] == "clark" else f"all {d['punctuation_ids']} punctuation ids"
  )
  rounded = lambda v, k=3: np.round(v, k).tolist()
  measured = (
    f"in layers {lo}-{hi} of {depth} (the middle third) [CLS], [SEP] and punctuation take "
    f"{total:.2f} of the attention{_roles(s)}, most of it {sink} ({masses[sink]:.2f}"
    + ("" if sink == "[SEP]" else f"; [SEP] {masses['[SEP]']:.2f}")
    + f"). By layer, averaged {how}: [SEP] {rounded(sep)} (peak at layer "
    f"{peak + 1} ({sep[peak]:.2f})), [CLS] {rounded(by['cls'])}, punctuation ({punct_how}) "
    f"{rounded(by['punct'])}. Averaged over all tokens with all "
    f"{variant['definition']['punctuation_ids']} punctuation ids instead: [SEP] "
    f"{rounded(vb['sep'])}, [CLS] {rounded(vb['cls'])}, punctuation {rounded(vb['punct'])}. "
    f"Differs from Clark: {_not_bert_base(model, depth)}read on single EWT sentences with "
    "one [SEP] rather than Wikipedia segment pairs, so which special token serves as the sink "
    "may differ."
  )
  margin = masses["[SEP]"] - max(masses["[CLS]"], masses["punctuation"])
  rows = [SINK.row(measured, {MIDDLE: total, SEP_MARGIN: margin})]
  first_half, second_half = ent[: depth // 2].mean(), ent[depth // 2 :].mean()
  measured = (
    f"mean entropy by layer {rounded(ent, 2)} nats (averaged {how}, smoothing "
    f"{d['entropy_smoothing']:g}; uniform attention: {clark['uniform_entropy']:.2f}); first "
    f"half {first_half:.2f} vs second half {second_half:.2f}. Over all tokens, unsmoothed: "
    f"{rounded(vb['entropy'], 2)} (uniform {variant['uniform_entropy']:.2f})."
  )
  quantities = {FIRST: ent[0] - ent[1:].max(), HALVES: first_half - second_half}
  rows.append(ENTROPY.row(measured, quantities))
  table, frequent = probe["relations"], probe["frequent"]
  # The direction of each relation is chosen on the selection half too, then scored held out.
  chosen, margins = probe["accuracy_chosen_direction"], probe["margin_chosen_direction_vs_offset"]
  beat = [x for x in frequent if margins[x] >= 0.05]
  share = len(beat) / max(len(frequent), 1)
  best = sorted(frequent, key=lambda x: -margins[x])[:5]
  below = [x for x in frequent if x not in beat]
  measured = (
    f"the best single head (head and direction chosen on even sentences) beats the best fixed "
    f"offset by >=5 points on the odd sentences in {len(beat)} of {len(frequent)} frequent "
    "relations; largest margins: "
    + ", ".join(f"{x} {chosen[x]:.2f} vs {table[x]['baseline']['accuracy']:.2f}" for x in best)
    + f"; under the 5-point margin: {', '.join(below) or 'none'}"
    + ". Differs from Clark: UD relations on EWT, not Stanford dependencies on the WSJ."
  )
  rows.append(RELATIONS.row(measured, {BEATEN: share}))
  overall = table["all"]["dep_to_head"]["accuracy"]
  measured = (
    f"the best single head over all non-punctuation arcs predicts the head for "
    f"{overall:.2f} of held-out arcs (best fixed offset "
    f"{table['all']['baseline']['accuracy']:.2f})."
  )
  rows.append(NO_SYNTAX_HEAD.row(measured, {OVERALL: overall}))
  return rows


# Figures ------------------------------------------------------------------------------------


def figures(r: dict, out, relations: Sequence[str], stem: str = NAME) -> list[str]:
  """Attention by layer, the probe by relation and by head (`stem`: the file names' start)."""
  from bertjax.plots import attention as plots

  out, table = pathlib.Path(out), r["probe"]["relations"]
  paths = (
    plots.clark_by_layer(r["clark"], out / f"{stem}_special_tokens.png"),
    plots.probe_relations(table, relations, out / f"{stem}_relations.png"),
    plots.probe_head_grids(table, relations, out / f"{stem}_heads.png"),
  )
  return [p.name for p in paths]


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
  from bertjax.tasks import text_batches

  data = common.data_dir(args.data_dir)
  s = run_settings(args.smoke, args.seed)
  timings: dict[str, float] = {}
  with common.timed(timings, "load"):
    config, params, tok, s["model"] = common.load_model(
      args,
      lambda: common.tiny_model(
        0, s["model"], preset="tiny", num_hidden_layers=2, max_position_embeddings=512
      ),
    )
    path = common.ud_file(data, "dev")
    ud = conllu.read_conllu(path, max_sentences=s["max_sentences"])
    words = [list(x.forms) for x in ud]
    keep = text_batches.fitting(tok, words, s["max_tokens"])
    batches = [
      (keep[idx], b)
      for idx, b in text_batches.batches(
        tok, words=[words[i] for i in keep], batch_size=s["batch_size"], max_length=s["max_tokens"]
      )
    ]
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
  gap = (
    max(
      float(np.abs(per_sentence[k].mean(0) - clark["by_layer"][k]).max())
      for k in syntax.SENTENCE_STATS
    )
    if args.weighting == "document"
    else float("nan")
  )
  common.log(f"per-sentence statistics vs clark_statistics: max |diff| {gap:.1e}")
  n_tok = sum(int(b["attention_mask"].sum()) for b in plain)
  results = {
    "data": {
      "file": path.name,
      "sentences": len(ud),
      "sentences_used": len(keep),
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
  figs = figures(results, args.out, probe["frequent"], common.results_stem(NAME, args.model))
  settings = {
    **s,
    "data": f"UD English EWT {path.name}",
    "layers": config.depth,
    "special_tokens": common.special_tokens(tok),
    "heads": config.num_attention_heads,
    "backend": jax.default_backend(),
    "max_offset": syntax.MAX_OFFSET,
    "indexing": INDEXING,
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
  common.write_results(
    NAME,
    args.out,
    results,
    findings=findings,
    settings=settings,
    smoke=args.smoke,
    seconds=time.perf_counter() - start,
    figures=figs,
    model=args.model,
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
