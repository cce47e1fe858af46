"""`bertjax.stats`, where every shared statistic is defined once, against SciPy and NumPy."""

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from bertjax import stats


def test_correlations_match_scipy():
  rng = np.random.default_rng(0)
  x, y = rng.normal(size=50), rng.normal(size=50)
  y[:10] = x[:10]  # some ties in rank would need equal values: add them
  y[10:13] = y[13]
  assert stats.pearson(x, y) == pytest.approx(scipy_stats.pearsonr(x, y).statistic, abs=1e-12)
  assert stats.spearman(x, y) == pytest.approx(scipy_stats.spearmanr(x, y).statistic, abs=1e-12)
  assert np.isnan(stats.pearson(x, np.ones(50)))


def test_pearson_from_running_sums_equals_pearson():
  rng = np.random.default_rng(1)
  x, y = rng.normal(size=(3, 40)), rng.normal(size=(3, 40))
  y[1] = 2 * x[1] + 0.1 * y[1]
  sums = (x.sum(-1), y.sum(-1), (x * x).sum(-1), (y * y).sum(-1), (x * y).sum(-1), 40)
  np.testing.assert_allclose(stats.pearson_from_sums(*sums), stats.pearson_rows(x, y), atol=1e-12)


@pytest.mark.parametrize(
  ("lost", "gained", "same"), [(8, 1, 11), (0, 0, 5), (3, 3, 0), (30, 12, 70), (0, 9, 1)]
)
def test_mcnemar_is_scipys_exact_binomial_test(lost, gained, same):
  base = np.array([True] * lost + [False] * gained + [True] * same)
  other = np.array([False] * lost + [True] * gained + [True] * same)
  want = 1.0 if lost + gained == 0 else scipy_stats.binomtest(lost, lost + gained, 0.5).pvalue
  assert stats.mcnemar_p(base, other) == pytest.approx(want, rel=1e-12)
  with pytest.raises(ValueError, match="shape"):
    stats.mcnemar_p(base, other[:-1])


def test_wilcoxon_p():
  rng = np.random.default_rng(2)
  a, b = rng.normal(size=30), rng.normal(size=30) + 0.5
  assert stats.wilcoxon_p(a, b) == pytest.approx(scipy_stats.wilcoxon(b - a).pvalue)
  assert stats.wilcoxon_p(a, a) == 1.0


def test_mcnemar_exact_and_curve_area():
  base = np.array([True] * 20)
  other = base.copy()
  other[:8] = False  # 8 lost
  base[19], other[19] = False, True  # 1 gained
  expected = min(1.0, 2 * sum(math.comb(9, k) for k in range(2)) / 2**9)
  assert math.isclose(stats.mcnemar_p(base, other), expected, rel_tol=1e-9)
  assert stats.mcnemar_p(base, base) == 1.0
  assert stats.wilcoxon_p(np.ones(5), np.ones(5)) == 1.0
  assert math.isclose(stats.curve_area([0, 0.5, 1.0], [1.0, 1.0, 0.0]), 0.75)
  x, y = np.array([0.0, 0.1, 0.25, 0.5]), np.array([0.9, 0.8, 0.85, 0.4])
  assert math.isclose(stats.curve_area(x, y), np.trapezoid(y, x) / 0.5, rel_tol=1e-12)


def test_min_detectable_drop_is_the_first_significant_count():
  # Exact McNemar with every discordant pair one way: p = 2 / 2^b.
  assert (
    stats.mcnemar_min_detectable_drop(115, 0.01) == 8 / 115
  )  # 2 / 2^8 = 0.0078; 2 / 2^7 = 0.0156
  assert stats.mcnemar_min_detectable_drop(100, 0.05) == 6 / 100
  lost = np.ones(115, bool)
  other = lost.copy()
  other[:8] = False
  assert stats.mcnemar_p(lost, other) < 0.01
  other[7] = True
  assert stats.mcnemar_p(lost, other) >= 0.01


def test_expected_layer_hand_example():
  # running best 0.5, 0.7, 0.9, 0.9: gains 0.2 (layer 1), 0.2 (layer 2), 0 (layer 3)
  assert stats.expected_layer([0.5, 0.7, 0.9, 0.8]) == pytest.approx(1.5)
  assert stats.expected_layer([0.0, 1.0, 2.0, 3.0]) == pytest.approx(2.0)  # (1 + 2 + 3) / 3
  assert stats.expected_layer([0.0, 0.0, 0.0, 3.0]) == pytest.approx(3.0)
  assert np.isnan(stats.expected_layer([0.9, 0.8, 0.7]))  # nothing improves on layer 0


def test_expected_layer_is_tenneys_formula_for_monotone_scores():
  rng = np.random.default_rng(0)
  s = np.cumsum(rng.uniform(0, 1, 8))
  delta = np.diff(s)
  want = np.sum(np.arange(1, 8) * delta) / delta.sum()
  assert stats.expected_layer(s) == pytest.approx(want)


def test_expected_layer_rejects_bad_shapes():
  with pytest.raises(ValueError, match="scores"):
    stats.expected_layer([0.5])
  with pytest.raises(ValueError, match="scores"):
    stats.expected_layer(np.zeros((2, 1)))


def test_expected_layer_of_many_is_each_one_s():
  """Layers last, leading axes (a bootstrap's resamples): one E[l] each, nan where no layer
  improves on layer 0."""
  rows = np.array([[0.5, 0.7, 0.9, 0.8], [0.0, 1.0, 2.0, 3.0], [0.9, 0.5, 0.4, 0.1]])
  got = stats.expected_layer(rows)
  want = [stats.expected_layer(r) for r in rows]
  np.testing.assert_allclose(got, want)
  assert got.shape == (3,) and np.isnan(got[2])
  assert stats.expected_layer(rows[None]).shape == (1, 3)


def test_power_law_fit_against_scipy():
  n = np.array([384, 768, 1536, 3072, 6144])
  fvu = 2.1 * n**-0.23 * np.exp(np.array([0.01, -0.02, 0.015, 0.0, -0.01]))
  fit = stats.power_law_fit(n, fvu)
  ref = scipy_stats.linregress(np.log(n), np.log(fvu))
  assert fit["exponent"] == pytest.approx(ref.slope, rel=1e-9)
  assert fit["coefficient"] == pytest.approx(np.exp(ref.intercept), rel=1e-9)
  assert fit["r2"] == pytest.approx(ref.rvalue**2, rel=1e-9)
  with pytest.raises(ValueError, match="positive"):
    stats.power_law_fit([1, 2], [0.5, 0.0])
