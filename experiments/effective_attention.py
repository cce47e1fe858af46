"""Are attention weights identifiable? Raw vs effective attention in all-MiniLM-L6-v2.

Run:
  ./run.sh experiment effective_attention            # the full run (~1.5 min CPU; 3-6 min wall)
  .venv/bin/python -m experiments.effective_attention [--smoke] [--model DIR_OR_HUB_ID]

The method, the data and what differs from the paper: docs/experiments.md, section
`effective_attention` (the site's Experiments page).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import numpy as np

from bertjax import claims, study
from bertjax.analysis.attention import effective
from bertjax.claims import Claim, Test
from experiments import common

NAME = "effective_attention"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  """The shared experiment options and the passages' sizes."""
  p = common.parser(__doc__)
  p.add_argument("--passages", type=int, help="passages in the main set (default: 32; --smoke: 4)")
  p.add_argument(
    "--length",
    type=int,
    help="tokens per main-set passage, [CLS] and [SEP] included (default: 128; --smoke: 40)",
  )
  p.add_argument(
    "--sweep-passages",
    type=int,
    help="passages per length in the length sweep (default: 3; --smoke: 2)",
  )
  return p.parse_args(argv)


def passage_sizes(args, head_dim: int) -> tuple[list[int], int, int, int]:
  """`(lengths, length, count, per_len)`: the sweep's lengths, the main set's passage length
  and count, and the sweep's passages per length: the run's (`--smoke`: the small one's;
  `experiments/sizes.toml`), with `--length`, `--passages` and `--sweep-passages` where given.

  Raises:
    ValueError: the main set's passages are not longer than `head_dim`.
  """
  size = common.sizes(NAME)["smoke" if args.smoke else "full"]
  given = {k: getattr(args, k) for k in ("length", "passages", "sweep_passages")}
  size.update({k: v for k, v in given.items() if v is not None})
  lengths, length, count, per_len = (size[k] for k in ("lengths", *given))
  if length <= head_dim:
    raise study.UsageError(
      f"--length {length} must exceed d_head={head_dim} (else effective = raw)"
    )
  return lengths, length, count, per_len


@study.one_blas_thread
def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  t_start = time.perf_counter()
  timings: dict[str, float] = {}

  from bertjax.analysis.attention import statistics
  from bertjax.data import conllu
  from bertjax.plots.effective import effective_attention_figures
  from bertjax.tasks import passages

  data = study.data_dir(args.data_dir, "ud_english_ewt")
  path = study.ud_file(data, "dev")
  sentences = conllu.read_conllu(path, max_sentences=60 if args.smoke else None)
  with study.timed(timings, "load model"):
    config, params, tok, model_name = study.load_model(args)
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
  study.log(f"length sweep {lengths}, {per_len} passages each ({model_name}, d_head={head_dim})")
  with study.timed(timings, "length sweep"):
    sweep = {
      n: effective.head_analysis(params, config, cut(n, per_len, args.seed + n), **kw)
      for n in lengths
    }
  study.log(f"main set: {count} passages of {length} tokens")
  ids = cut(length, count, args.seed)
  batches = [
    {"input_ids": b, "attention_mask": np.ones_like(b), "token_type_ids": np.zeros_like(b)}
    for b in np.split(ids, range(8, count, 8))
  ]
  with study.timed(timings, "effective_attention_statistics"):
    lib = effective.effective_attention_statistics(
      params, config, batches, cls_id=tok.cls_id, sep_id=tok.sep_id
    )
  with study.timed(timings, "per-head analysis"):
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
  stem = study.results_stem(NAME, args.model)
  figs = effective_attention_figures(
    sweep, main_r, lib, example, args.out, stem, model=model_name, head_dim=head_dim
  )
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
    "sweep": effective.sweep_means(sweep),
    "example": {
      "layer": example["layer"] + 1,
      "head": example["head"],
      "tokens": tok.convert_ids_to_tokens(ex_ids[0]),
    },
    "timings": timings,
  }
  study.finish(NAME, args, results, settings, findings=findings, started=t_start, figures=figs)
  return 0


# The claims ---------------------------------------------------------------------------------------
# `findings(results, settings)`: the Findings rows, made from the numbers as the JSON holds
# them; `uncertainty(results, settings)`: each claim's interval and verdict.

PAPER = "Brunner et al. 2020"


MATCH = "the share of heads x passages whose null-space dimension is max(0, n - d_head)"
LONG_NULL = "the share with n > d_head that have a null space"
OUTPUT_ERROR, BLOCK_ERROR = "the head outputs' relative error", "the block outputs' error"
SPECIAL_RATIO = "effective over raw mass on [CLS] and [SEP]"
NULL_SPACE = Claim(
  PAPER,
  "Attention weights are not identifiable once the sequence is longer than the head "
  "dimension: the left null space of T_h has dimension n - rank(T_h) = n - d_head > 0.",
  yes=(Test(MATCH, ">=", 1),),
  partly=(Test(LONG_NULL, ">=", 1),),
  short="Attention weights are not identifiable past the head dimension: their null space has dimension n - d_head.",
)
SAME_OUTPUT = Claim(
  PAPER,
  "Attention can change without changing the output: effective attention (raw minus "
  "its null-space part) gives the same head output.",
  yes=(Test(OUTPUT_ERROR, "<", 1e-4), Test(BLOCK_ERROR, "<", 1e-4)),
  partly_if="never",
)
SPECIAL = Claim(
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


def findings(r: dict, s: dict) -> list[dict]:
  """The Findings rows (the null space, the unchanged output, the mass on [CLS] and [SEP])
  from the results and settings as written to JSON (`python -m experiments.findings --refresh`)."""
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


def uncertainty(r: dict, s: dict) -> list[claims.Judgement]:
  """One judgement per row: the null space and the reconstruction are exact (nothing is
  sampled); the mass on [CLS] and [SEP], a 95% interval over the main set's passages."""
  summary = r["summary"]
  ratio = {SPECIAL_RATIO: summary["special_mass"]["effective"] / summary["special_mass"]["raw"]}
  sweep = {int(n): v for n, v in r["sweep"].items()}
  lengths = summary["lengths"]
  null_dims = {n: np.asarray(sweep[n]["null_dim"]) for n in lengths}
  null = null_space_quantities(lengths, null_dims, summary["head_dim"])
  errors = {
    OUTPUT_ERROR: summary["max_relative_head_output_error"],
    BLOCK_ERROR: summary["max_block_output_error"]["effective"],
  }
  rows = [
    NULL_SPACE.exact(null, "linear algebra (null-space dimensions), nothing sampled"),
    SAME_OUTPUT.exact(errors, "float64 reconstruction errors, nothing sampled"),
    claims.rerun_needed("per-passage attention masses"),
  ]
  per = summary.get("special_mass_per_passage")
  if per is not None:
    masses = np.stack([np.asarray(per[k], float) for k in ("raw", "effective")], 1)
    mean_ratio = lambda x: {SPECIAL_RATIO: x[..., 1].mean(1) / x[..., 0].mean(1)}
    rows[2] = SPECIAL.judge(masses, mean_ratio, point=ratio, over=f"the {len(masses)} passages")
  return rows


if __name__ == "__main__":
  sys.exit(main())
