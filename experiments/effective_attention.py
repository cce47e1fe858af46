"""Are attention weights identifiable? Raw vs effective attention in all-MiniLM-L6-v2.

Run:
  ./run.sh experiment effective_attention            # the full run (~1.5 min CPU; 3-6 min wall)
  .venv/bin/python experiments/effective_attention.py [--smoke] [--model DIR_OR_HUB_ID]

The method, the data and what differs from the paper: docs/experiments.md, section
`effective_attention` (the site's Experiments page).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
from collections.abc import Sequence

import common
import numpy as np
from findings import Rule, Test

from bertjax.analysis.attention import effective

NAME = "effective_attention"
PAPER = "Brunner et al. 2020"


MATCH = "the share of heads x passages whose null-space dimension is max(0, n - d_head)"
LONG_NULL = "the share with n > d_head that have a null space"
OUTPUT_ERROR, BLOCK_ERROR = "the head outputs' relative error", "the block outputs' error"
SPECIAL_RATIO = "effective over raw mass on [CLS] and [SEP]"
NULL_SPACE = Rule(
  PAPER,
  "Attention weights are not identifiable once the sequence is longer than the head "
  "dimension: the left null space of T_h has dimension n - rank(T_h) = n - d_head > 0.",
  yes=(Test(MATCH, ">=", 1),),
  partly=(Test(LONG_NULL, ">=", 1),),
)
SAME_OUTPUT = Rule(
  PAPER,
  "Attention can change without changing the output: effective attention (raw minus "
  "its null-space part) gives the same head output.",
  yes=(Test(OUTPUT_ERROR, "<", 1e-4), Test(BLOCK_ERROR, "<", 1e-4)),
  partly_if="never",
)
SPECIAL = Rule(
  PAPER,
  "Effective attention puts much less weight on [CLS] and [SEP] than raw attention.",
  yes=(Test(SPECIAL_RATIO, "<=", 0.5),),
  partly=(Test(SPECIAL_RATIO, "<", 1),),
)


def null_space_quantities(
  lengths: Sequence[int], null_dims: dict[int, np.ndarray], head_dim: int
) -> dict[str, float]:
  """What `NULL_SPACE` reads from each length's null-space dimensions (heads x passages);
  with no length above `head_dim`, no head has a null space to show (0)."""
  expected = effective.expected_null_dim
  match = np.concatenate([np.ravel(null_dims[n] == expected(n, head_dim)) for n in lengths])
  longer = [np.ravel(null_dims[n] > 0) for n in lengths if n > head_dim]
  return {
    MATCH: float(match.mean()),
    LONG_NULL: float(np.concatenate(longer).mean()) if longer else 0.0,
  }


def figures(out, stem: str, model: str, sweep, head_dim: int, analysis, statistics, example):
  """The four figures, `out/stem_{null_space,special,heads,example}.png`; their names."""
  from bertjax.plots import effective as plots

  out = pathlib.Path(out)
  n = np.shape(analysis["raw_cls"])[0]
  paths = (
    plots.null_space_by_length(
      sweep, head_dim, out / f"{stem}_null_space.png", title=f"Brunner et al. (2020) on {model}"
    ),
    plots.class_mass_by_layer(
      analysis,
      statistics,
      out / f"{stem}_special.png",
      title=f"Raw vs effective attention by layer ({model}, {n} passages of "
      f"{analysis['length']} tokens)",
    ),
    plots.class_mass_by_head(analysis, out / f"{stem}_heads.png"),
    plots.example_maps(**example, path=out / f"{stem}_example.png"),
  )
  return [p.name for p in paths]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  """The shared experiment options and the passages' sizes."""
  p = common.parser(__doc__)
  p.add_argument(
    "--passages", type=int, default=32, help="passages in the main set (default: 32; --smoke: 4)"
  )
  p.add_argument(
    "--length",
    type=int,
    default=128,
    help="tokens per main-set passage, [CLS] and [SEP] included (default: 128)",
  )
  p.add_argument(
    "--sweep-passages",
    type=int,
    default=3,
    help="passages per length in the length sweep (default: 3)",
  )
  return p.parse_args(argv)


def passage_sizes(args, head_dim: int) -> tuple[list[int], int, int, int]:
  """`(lengths, length, count, per_len)`: the sweep's lengths, the main set's passage length
  and count, and the sweep's passages per length.

  Raises:
    ValueError: the main set's passages are not longer than `head_dim`.
  """
  if args.smoke:
    lengths, length, count, per_len = [8, 16, 24, 32, 48], 40, 4, 2
  else:
    lengths = [8, 16, 24, 32, 40, 48, 64, 96, 128, 192, 256]
    length, count, per_len = args.length, args.passages, args.sweep_passages
  if length <= head_dim:
    raise common.UsageError(
      f"--length {length} must exceed d_head={head_dim} (else effective = raw)"
    )
  return lengths, length, count, per_len


def findings(r: dict, s: dict) -> list[dict]:
  """The Findings rows (the null space, the unchanged output, the mass on [CLS] and [SEP])
  from the results and settings as written to JSON (`findings.py --refresh`)."""
  summary = dict(r["summary"])
  summary["corr_raw_effective_by_length"] = {
    int(n): v for n, v in summary["corr_raw_effective_by_length"].items()
  }
  sweep = {int(n): v for n, v in r["sweep"].items()}
  heads = int(np.size(r["main_per_head"]["raw_cls"]))
  count, length = s["main_passages"], s["main_length"]
  head_dim, lengths = summary["head_dim"], summary["lengths"]
  null_dims = {n: np.asarray(sweep[n]["null_dim"]) for n in lengths}
  ranks, corr_by_len = summary["rank_min_max"], summary["corr_raw_effective_by_length"]
  out_err, block_err = summary["max_relative_head_output_error"], summary["max_block_output_error"]
  special, per_class = summary["special_mass"], summary["mass"]
  heads_lower = summary["heads_with_lower_effective_special"]
  long = [n for n in lengths if n > head_dim]
  null = null_space_quantities(lengths, null_dims, head_dim)
  return [
    NULL_SPACE.row(
      f"d_head {head_dim}; null-space dim = max(0, n - {head_dim}) for {100 * null[MATCH]:.0f}% "
      f"of heads x passages over n = {lengths[0]}..{lengths[-1]} (rank range "
      f"{min(r[0] for r in ranks.values())}-{max(r[1] for r in ranks.values())}); raw/effective "
      f"correlation {corr_by_len[lengths[0]]:.3f} at n={lengths[0]} -> {corr_by_len[long[-1]]:.3f} "
      f"at n={long[-1]}.",
      null,
    ),
    SAME_OUTPUT.row(
      f"max relative |A_eff T - A T| {out_err:.1e} (float64); block outputs with every block's "
      f"effective attention set through the probs site vs the model's hidden states: max abs "
      f"error {block_err['effective']:.1e} (raw: {block_err['raw']:.1e}).",
      {OUTPUT_ERROR: out_err, BLOCK_ERROR: block_err["effective"]},
    ),
    SPECIAL.row(
      f"mean mass per query on [CLS]+[SEP] over {heads} heads, "
      f"{count} passages of {length} tokens: raw {special['raw']:.3f}, effective "
      f"{special['effective']:.3f} ([CLS] {per_class['raw_cls']:.3f} -> "
      f"{per_class['effective_cls']:.3f}, [SEP] {per_class['raw_sep']:.3f} -> "
      f"{per_class['effective_sep']:.3f}; punctuation {per_class['raw_punct']:.3f} -> "
      f"{per_class['effective_punct']:.3f}); lower in {100 * heads_lower:.0f}% of heads.",
      {SPECIAL_RATIO: special["effective"] / special["raw"]},
    ),
  ]


@common.one_blas_thread
def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  t_start = time.perf_counter()
  timings: dict[str, float] = {}

  from bertjax.analysis.attention import statistics
  from bertjax.data import conllu
  from bertjax.tasks import passages

  data = common.data_dir(args.data_dir, "ud_english_ewt")
  path = common.ud_file(data, "dev")
  sentences = conllu.read_conllu(path, max_sentences=60 if args.smoke else None)
  with common.timed(timings, "load model"):
    config, params, tok, model_name = common.load_model(args)
  head_dim = config.head_dim
  lengths, length, count, per_len = passage_sizes(args, head_dim)
  pieces = passages.sentence_pieces(tok, [s.forms for s in sentences])
  cut = lambda n, k, seed: passages.fixed_length(pieces, n, k, tok.cls_id, tok.sep_id, seed)
  kw = {
    "cls_id": tok.cls_id,
    "sep_id": tok.sep_id,
    "punct_ids": statistics.punctuation_ids(tok),
    "rebuild": 1,
  }
  common.log(f"length sweep {lengths}, {per_len} passages each ({model_name}, d_head={head_dim})")
  with common.timed(timings, "length sweep"):
    sweep = {
      n: effective.head_analysis(params, config, cut(n, per_len, args.seed + n), **kw)
      for n in lengths
    }
  common.log(f"main set: {count} passages of {length} tokens")
  ids = cut(length, count, args.seed)
  batches = [
    {"input_ids": b, "attention_mask": np.ones_like(b), "token_type_ids": np.zeros_like(b)}
    for b in np.split(ids, range(8, count, 8))
  ]
  with common.timed(timings, "effective_attention_statistics"):
    lib = effective.effective_attention_statistics(
      params, config, batches, cls_id=tok.cls_id, sep_id=tok.sep_id
    )
  with common.timed(timings, "per-head analysis"):
    main_r = effective.head_analysis(params, config, ids, **kw, null_space=False)
  main_r["length"] = length
  summary = effective.summarise(sweep, main_r, lib, head_dim)

  # An example: the head with the most raw [CLS]+[SEP] mass, on a short passage.
  special = (main_r["raw_cls"] + main_r["raw_sep"]).mean(0)
  layer, head = np.unravel_index(int(np.argmax(special)), special.shape)
  ex_ids = cut(min(48, max(lengths)) if args.smoke else 64, 1, args.seed + 1)
  example = {
    **effective.example_head(params, config, ex_ids, int(layer), int(head)),
    "layer": int(layer),
    "head": int(head),
  }
  stem = common.results_stem(NAME, args.model)
  figs = figures(args.out, stem, model_name, sweep, head_dim, main_r, lib, example)
  settings = {
    "model": model_name,
    "data": str(path.relative_to(data)),
    "sentences": len(sentences),
    "main_passages": count,
    "main_length": length,
    "sweep_lengths": lengths,
    "sweep_passages_per_length": per_len,
    "seed": args.seed,
    "null_space_rtol": 1e-10,
    "passages": "[CLS] + consecutive EWT dev sentences' word pieces (cut) + [SEP], one segment",
    "indexing": "layers are numbered 1..L (blocks) and heads 0..H-1; per-layer arrays "
    "hold layers 1..L in order, (L, H) arrays layer by head",
  }
  per_head = lambda r: {k: r[k].mean(0) for k in r if isinstance(r[k], np.ndarray)}
  results = {
    "summary": summary,
    "library_statistics": lib,
    "main_per_head": per_head(main_r),
    "sweep": {
      n: {
        "null_dim": sweep[n]["null_dim"].mean(0),
        "rank": sweep[n]["rank"].mean(0),
        "corr": sweep[n]["corr"].mean(0),
        "special_raw": (sweep[n]["raw_cls"] + sweep[n]["raw_sep"]).mean(0),
        "special_effective": (sweep[n]["effective_cls"] + sweep[n]["effective_sep"]).mean(0),
      }
      for n in lengths
    },
    "example": {
      "layer": example["layer"] + 1,
      "head": example["head"],
      "tokens": tok.convert_ids_to_tokens(ex_ids[0]),
    },
    "timings": timings,
  }
  common.write_results(
    NAME,
    args.out,
    results,
    findings=findings,
    settings=settings,
    smoke=args.smoke,
    seconds=time.perf_counter() - t_start,
    figures=figs,
    model=args.model,
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
