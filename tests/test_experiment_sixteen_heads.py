"""Checks of `experiments/sixteen_heads.py`'s claims: their intervals over the test sentences
(`rules.uncertainty`) on planted correctness, and on its smoke run (`check_smoke`, run by
`test_experiments.py`); the ablation and pruning themselves are checked in
test_pruning_study.py."""

import pathlib

import numpy as np

from bertjax import stats

REPO = pathlib.Path(__file__).resolve().parents[1]
from experiments import sixteen_heads as rules


def _planted(n: int, rng) -> tuple[dict, dict]:
  """An ablation and a pruning result with per-example correctness: layer 1's best kept head
  is as good as the intact model, layer 2's are all 30 points worse; the importance curve
  stays up while random orders fall."""
  base = rng.random(n) < 0.9
  keep_one = np.stack(
    [
      [base, rng.random(n) < 0.5],
      [rng.random(n) < 0.6, rng.random(n) < 0.6],
    ]
  )
  fractions = np.array([0, 0.25, 0.5, 0.75])
  iterative = np.stack([base, base, base, rng.random(n) < 0.7])
  random = np.stack([np.stack([base, *(rng.random((3, n)) < 0.7)]) for _ in range(3)])
  ab = {
    "num_test": n,
    "per_example": {"correct_baseline": base, "correct_keep_one": keep_one},
  }
  pr = {
    "tolerance": 0.02,
    "fractions": fractions,
    "per_example": {"correct": {"iterative": iterative, "random": random}},
  }
  return ab, pr


def test_intervals_resample_the_test_sentences():
  """Each statistic's interval is the percentile bootstrap of the statistic computed directly
  on resampled sentences (`bertjax.stats.bootstrap_ci`, the same draws), and the point value
  is the statistic on all of them."""
  rng = np.random.default_rng(0)
  n = 60
  ab, pr = _planted(n, rng)
  one, kept, order = rules._per_sentence(ab, pr)
  base = ab["per_example"]["correct_baseline"].astype(float)
  keep = ab["per_example"]["correct_keep_one"].astype(float)

  def layers_ok(b, k):  # one resample, written out
    best = k.mean(-1).max(-1)
    return float(np.mean(best >= b.mean() - 0.02))

  lo, hi = stats.bootstrap_ci(
    (base, np.moveaxis(keep, -1, 0)),
    lambda b, k: layers_ok(b, np.moveaxis(k, 0, -1)),
    n_resamples=2000,
  )
  assert one.intervals[rules.LAYERS_OK] == (lo, hi)
  assert one.values[rules.LAYERS_OK] == layers_ok(base, keep) == 0.5
  assert one.text.startswith("95% CI over the 60 test sentences: ")
  # The pruning curve keeps accuracy up to 50%; the importance order beats every random one.
  assert kept.values[rules.KEPT] == 0.5 and kept.verdict == "yes"
  area = lambda acc: stats.curve_area(pr["fractions"], acc)
  curves = pr["per_example"]["correct"]
  random_areas = [area(c.mean(-1)) for c in curves["random"]]
  assert order.values[rules.OVER_ALL] == area(curves["iterative"].mean(-1)) - max(random_areas)
  assert order.verdict == "yes" and order.span is not None


def test_a_result_without_per_example_values_says_so():
  rows = rules._per_sentence({"num_test": 5}, {"tolerance": 0.02})
  assert [r.text for r in rows] == [
    "CI: rerun needed (the JSON keeps no per-example correctness under each mask)"
  ] * 3


def check_smoke(doc: dict, out: pathlib.Path) -> None:
  """The smoke run keeps each test sentence's correctness, and every row but the per-head
  tests' has a 95% interval over them."""
  ab = doc["results"]["ablation"]
  assert len(ab["per_example"]["correct_baseline"]) == ab["num_test"]
  judged = rules.uncertainty(doc["results"], doc["settings"])
  assert len(judged) == len(doc["findings"]) == 5
  assert judged[0].text.startswith("test the rule applies: exact McNemar")
  for j in judged[1:]:
    assert j.text.startswith("95% CI over the") and j.span is not None, j.text
