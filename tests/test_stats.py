"""`bertjax.stats`, where every shared statistic is defined once, against SciPy and NumPy."""

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
