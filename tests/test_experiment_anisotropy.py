"""Checks of `experiments/anisotropy.py`: MEV against a direct eigen-decomposition, the
geometry measures it relies on against NumPy, the verdict rules, and the committed results."""

import json
import pathlib
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "experiments"))
import anisotropy as an

RESULTS = REPO / "experiments" / "results" / "anisotropy.json"


def test_mev_matches_eigenvalues_of_the_second_moment():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(3, 7, 5))
  eig = np.linalg.eigvalsh(np.einsum("lnd,lne->lde", x, x))  # ascending
  np.testing.assert_allclose(an.mev(x), eig[:, -1] / eig.sum(-1), rtol=1e-10)


def test_mev_extremes():
  v = np.random.default_rng(1).normal(size=6)
  assert an.mev(np.outer([1.0, 2.0, -3.0], v)) == pytest.approx(1.0)  # one direction
  assert an.mev(np.eye(4, 6)) == pytest.approx(0.25)  # orthonormal occurrences: 1 / n
  with pytest.raises(ValueError, match="occurrences"):
    an.mev(np.ones((1, 4)))


def test_max_explainable_variance_groups_by_type():
  rng = np.random.default_rng(2)
  direction = rng.normal(size=8)
  same = np.outer(rng.uniform(1, 2, 5), direction)  # type "a": 5 parallel vectors
  other = rng.normal(size=(20, 8))  # types "b".. seen once or twice
  reps = np.concatenate([same, other])[None].repeat(2, 0)  # (2 layers, 25, 8)
  ids = ["a"] * 5 + [f"w{i // 2}" for i in range(20)]
  out = an.max_explainable_variance(reps, ids, min_count=5, seed=0)
  assert out["types"] == 1
  np.testing.assert_allclose(out["mev"], 1.0)
  assert np.all(out["baseline"] < 1.0)
  np.testing.assert_allclose(out["adjusted"], out["mev"] - out["baseline"])


def test_geometry_measures_against_numpy():
  from bertjax.analysis import geometry

  rng = np.random.default_rng(3)
  reps = rng.normal(size=(2, 12, 6)) + 0.5
  words = np.array([0, 1, 0, 2, 1, 0, 3, 3, 4, 5, 6, 7])
  unit = reps / np.linalg.norm(reps, axis=-1, keepdims=True)
  want = []
  for layer in unit:
    per_type = []
    for w in np.unique(words):
      idx = np.flatnonzero(words == w)
      if len(idx) >= 2:
        c = layer[idx] @ layer[idx].T
        per_type.append(c[~np.eye(len(idx), dtype=bool)].mean())
    want.append(np.mean(per_type))
  np.testing.assert_allclose(geometry.self_similarity(reps, words), want, rtol=1e-5)
  cos = np.einsum("lnd,lmd->lnm", unit, unit)
  all_pairs = (cos.sum((1, 2)) - 12) / (12 * 11)
  np.testing.assert_allclose(geometry.anisotropy(reps, None), all_pairs, rtol=1e-5)


def test_trend_and_rules():
  assert an.trend([0.1, 0.2, 0.3]) == pytest.approx(1.0)
  assert an.trend([0.3, 0.2, 0.1]) == pytest.approx(-1.0)
  assert np.isnan(an.trend([0.2, 0.2]))
  assert an.anisotropic_rule([0.2, 0.3]) == "yes"
  assert an.anisotropic_rule([0.05, 0.3]) == "partly"
  assert an.anisotropic_rule([0.05, 0.0]) == "no"
  assert an.rises_rule([0.1, 0.2, 0.3]) == "yes"
  assert an.rises_rule([0.1, 0.3, 0.25, 0.2, 0.15, 0.12]) == "partly"  # last > first, trend < 0.5
  assert an.rises_rule([0.3, 0.2, 0.1]) == "no"
  assert an.rises_rule([0.12, 0.13, 0.15, 0.17, 0.21, 0.03]) == "partly"  # 4 of 5 steps rise
  assert an.rises_rule([0.3, 0.2, 0.1], falls=True) == "yes"
  assert an.mev_rule([0.01, 0.04]) == "yes"
  assert an.mev_rule([0.01, 0.2]) == "partly"


def test_committed_results_are_consistent():
  if not RESULTS.exists():
    pytest.skip(f"{RESULTS} not written yet (./run.sh experiment anisotropy)")
  doc = json.loads(RESULTS.read_text())
  m = {k: np.asarray(v, float) for k, v in doc["results"]["per_layer"].items()}
  np.testing.assert_allclose(m["self_similarity_adjusted"], m["self_similarity"] - m["anisotropy"],
                             atol=1e-6)
  np.testing.assert_allclose(m["mev_adjusted"], m["mev"] - m["mev_baseline"], atol=1e-9)
  holds = [f["holds"] for f in doc["findings"]]
  assert holds == [an.anisotropic_rule(m["anisotropy"][1:]), an.rises_rule(m["anisotropy"][1:]),
                   an.rises_rule(m["self_similarity_adjusted"][1:], falls=True),
                   an.mev_rule(m["mev_adjusted"][1:])]
