"""Checks of `experiments/effective_attention.py`: the null-space dimension rule and the
Findings rules and its committed results (the per-head analysis it
runs, `effective.head_analysis`, is checked in tests/test_attention_analysis.py)."""

import json
import pathlib

import numpy as np
import pytest

from bertjax import stats
from bertjax.analysis.attention import effective

REPO = pathlib.Path(__file__).resolve().parents[1]
from experiments import effective_attention as ea
from experiments import effective_attention as rules

RESULTS = REPO / "experiments" / "results" / "effective_attention.json"


def test_expected_null_dim_rule():
  assert effective.expected_null_dim(20, 32) == 0
  assert effective.expected_null_dim(32, 32) == 0
  assert effective.expected_null_dim(33, 32) == 1
  assert effective.expected_null_dim(128, 32) == 96
  null_space = lambda *a: rules.NULL_SPACE.verdict(rules.null_space_quantities(*a))
  special = lambda raw, effective: rules.SPECIAL.verdict({rules.SPECIAL_RATIO: effective / raw})
  assert null_space([8, 40], {8: np.zeros(3), 40: np.full(3, 8)}, 32) == "yes"
  assert null_space([8, 40], {8: np.zeros(3), 40: np.array([8, 9, 8])}, 32) == "partly"
  assert null_space([8, 40], {8: np.zeros(3), 40: np.array([8, 0, 8])}, 32) == "no"
  assert special(0.5, 0.2) == "yes"
  assert special(0.5, 0.4) == "partly"
  assert special(0.5, 0.6) == "no"


def test_passage_sizes_take_the_options_given_with_smoke_too():
  assert ea.passage_sizes(ea.parse_args([]), 32)[1:] == (128, 32, 3)
  assert ea.passage_sizes(ea.parse_args(["--smoke"]), 32)[1:] == (40, 4, 2)
  given = ea.parse_args(["--smoke", "--length", "64", "--passages", "2", "--sweep-passages", "1"])
  assert ea.passage_sizes(given, 32)[1:] == (64, 2, 1)
  with pytest.raises(ValueError, match="--length 32 must exceed d_head=32"):
    ea.passage_sizes(ea.parse_args(["--length", "32"]), 32)


def test_pearson_matches_numpy():
  rng = np.random.default_rng(0)
  x, y = rng.normal(size=(4, 5)), rng.normal(size=(4, 5))
  assert stats.pearson(x, y) == pytest.approx(np.corrcoef(x.ravel(), y.ravel())[0, 1])


def test_committed_results_are_consistent():
  if not RESULTS.exists():
    pytest.skip(f"{RESULTS} not written yet (./run.sh experiment effective_attention)")
  doc = json.loads(RESULTS.read_text())
  s = doc["results"]["summary"]
  # Independent values: all-MiniLM-L6-v2 has 12 heads of 384 / 12 = 32 dimensions, so T_h
  # (n x H, rank min(n, 32)) has a left null space of max(0, n - 32) dimensions, and where it is
  # empty effective attention is raw attention (correlation 1).
  assert doc["settings"]["model"] == "all-MiniLM-L6-v2" and s["head_dim"] == 384 // 12
  for n, dim in s["null_dim_mean"].items():
    assert (
      s["null_dim_expected"][n] == max(0, int(n) - 32) == effective.expected_null_dim(int(n), 32)
    )
    assert dim == pytest.approx(max(0, int(n) - 32))
    assert s["rank_min_max"][n] == [min(int(n), 32)] * 2
    if int(n) <= 32:
      assert s["corr_raw_effective_by_length"][n] == pytest.approx(1.0, abs=1e-9)
  assert s["max_relative_head_output_error"] < 1e-6
  # The verdicts are what the current rules give on these numbers.
  holds = [f["holds"] for f in doc["findings"]]
  if all(s["null_dim_matches"][n] == 1.0 for n in s["null_dim_mean"]):  # every head, every n
    assert holds[0] == "yes"
  assert holds[1] == (
    "yes"
    if s["max_relative_head_output_error"] < 1e-4
    and s["max_block_output_error"]["effective"] < 1e-4
    else "no"
  )
  ratio = s["special_mass"]["effective"] / s["special_mass"]["raw"]
  assert holds[2] == rules.SPECIAL.verdict({rules.SPECIAL_RATIO: ratio})
  # Same passages, batched by 8 in the library and all at once here: float32 maps differ ~1e-7.
  assert s["library_vs_direct_max_difference"] < 1e-6


def check_smoke(doc: dict, out: pathlib.Path) -> None:
  """The smoke run keeps each passage's mass on [CLS] + [SEP] (its mean over the heads); they
  average to the mass the row reads, and its interval resamples them."""
  summary = doc["results"]["summary"]
  per = summary["special_mass_per_passage"]
  for kind in ("raw", "effective"):
    assert len(per[kind]) == doc["settings"]["main_passages"]
    assert np.mean(per[kind]) == pytest.approx(summary["special_mass"][kind], rel=1e-9)
  null, same, special = rules.uncertainty(doc["results"], doc["settings"])
  assert null.text.startswith("exact:") and same.text.startswith("exact:")
  assert (
    special.text.startswith("95% CI over the") and special.verdict == doc["findings"][2]["holds"]
  )
  low, high = special.intervals[rules.SPECIAL_RATIO]
  assert low <= special.values[rules.SPECIAL_RATIO] <= high
