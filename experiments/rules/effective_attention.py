"""The Findings rules of `experiments/effective_attention.py` (Are attention weights identifiable?
Raw vs effective attention in all-MiniLM-L6-v2): the claims, the measured quantities and their
thresholds, and `findings(results, settings)`, the rows from a results JSON."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bertjax import claims
from bertjax.analysis.attention import effective
from bertjax.claims import Claim, Test

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
