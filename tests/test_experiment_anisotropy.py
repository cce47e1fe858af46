"""Checks of `experiments/anisotropy.py`: the verdict rules, with the depth trend they read
(`geometry.depth_trend`), and the committed results (the measures it runs,
`geometry.ethayarajh_measures`, are checked in test_geometry.py)."""

import json
import pathlib

import numpy as np
import pytest

from bertjax.analysis.representations import geometry
from experiments import anisotropy as rules

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "experiments" / "results" / "anisotropy.json"


def test_every_mev_definition_is_labelled_and_documented():
  assert set(geometry.MEV_LABELS) == set(geometry.MEV_SOURCES) == set(geometry.MEV_DEFINITIONS)


def test_trend_and_rules():
  rises = lambda v: rules.RISES.verdict(rules.quantities(rules.RISES, v))
  assert geometry.depth_trend([0.1, 0.2, 0.3]) == pytest.approx(1.0)
  assert geometry.depth_trend([0.3, 0.2, 0.1]) == pytest.approx(-1.0)
  assert np.isnan(geometry.depth_trend([0.2, 0.2]))
  assert rules.ANISOTROPIC.verdict(rules.quantities(rules.ANISOTROPIC, [0.2, 0.3])) == "yes"
  assert rules.ANISOTROPIC.verdict(rules.quantities(rules.ANISOTROPIC, [0.05, 0.3])) == "partly"
  assert rules.ANISOTROPIC.verdict(rules.quantities(rules.ANISOTROPIC, [0.05, 0.0])) == "no"
  assert rises([0.1, 0.2, 0.3]) == "yes"
  assert rises([0.1, 0.3, 0.25, 0.2, 0.15, 0.12]) == "partly"  # last > first, trend < 0.5
  assert rises([0.3, 0.2, 0.1]) == "no"
  assert rises([0.12, 0.13, 0.15, 0.17, 0.21, 0.03]) == "partly"  # 4 of 5 steps rise
  assert rules.FALLS.verdict(rules.quantities(rules.FALLS, [0.3, 0.2, 0.1])) == "yes"
  assert rules.MEV.verdict(rules.quantities(rules.MEV, [0.01, 0.04])) == "yes"
  assert rules.MEV.verdict(rules.quantities(rules.MEV, [0.01, 0.2])) == "partly"


def test_committed_results_are_consistent():
  if not RESULTS.exists():
    pytest.skip(f"{RESULTS} not written yet (./run.sh experiment anisotropy)")
  doc = json.loads(RESULTS.read_text())
  m = {k: np.asarray(v, float) for k, v in doc["results"]["per_layer"].items()}
  np.testing.assert_allclose(
    m["self_similarity_adjusted"], m["self_similarity"] - m["anisotropy"], atol=1e-6
  )
  np.testing.assert_allclose(m["mev_adjusted"], m["mev"] - m["mev_baseline"], atol=1e-9)
  definition = doc["settings"]["mev_definition"]
  assert definition == doc["results"]["summary"]["mev_definition"]
  for d in geometry.MEV_DEFINITIONS:
    np.testing.assert_allclose(
      m[f"mev_{d}_adjusted"], m[f"mev_{d}"] - m[f"mev_{d}_baseline"], atol=1e-9
    )
    np.testing.assert_allclose(
      m[f"mev_{d}_adjusted_paper"], m[f"mev_{d}"] - m[f"mev_{d}_baseline_paper"], atol=1e-9
    )
    assert d in doc["settings"]["mev_definitions"]
  np.testing.assert_array_equal(m["mev"], m[f"mev_{definition}"])
  holds = [f["holds"] for f in doc["findings"]]
  assert holds == [
    rules.ANISOTROPIC.verdict(rules.quantities(rules.ANISOTROPIC, m["anisotropy"][1:])),
    rules.RISES.verdict(rules.quantities(rules.RISES, m["anisotropy"][1:])),
    rules.FALLS.verdict(rules.quantities(rules.FALLS, m["self_similarity_adjusted"][1:])),
    rules.MEV.verdict(rules.quantities(rules.MEV, m["mev_adjusted"][1:])),
  ]
  _check_mev_items(doc)
  _check_sentence_resamples(doc)


def _check_mev_items(doc):
  """Each type's MEV and baseline, kept for the MEV row's interval over the types, give the
  per-layer numbers back, and the row's interval comes from them."""
  per, m = doc["results"]["mev_per_type"], doc["results"]["per_layer"]
  for key, mean in (("mev", m["mev"]), ("baseline", m["mev_baseline"])):
    np.testing.assert_allclose(np.nanmean(np.asarray(per[key], float), 0), mean, rtol=1e-9)
  u = rules.uncertainty(doc["results"], doc["settings"])[3]
  assert u.text.startswith(f"95% CI over the {len(per['mev'])} word types"), u.text
  lo, hi = u.intervals[rules.MEV_HIGHEST]
  assert lo <= hi


def _check_sentence_resamples(doc):
  """The first three rows' intervals come from the resamples of the sentences the run kept
  (each resample's anisotropy and self-similarity per layer)."""
  boot, s = doc["results"]["sentence_resamples"], doc["settings"]
  layers = len(doc["results"]["per_layer"]["anisotropy"])
  for key in ("anisotropy", "self_similarity"):
    assert np.shape(boot[key]) == (s["sentence_resamples"], layers)
  for u in rules.uncertainty(doc["results"], s)[:3]:
    assert u.text.startswith(f"95% CI over {s['sentence_resamples']} resamples of the "), u.text
    assert u.span is not None and all(lo <= hi for lo, hi in u.intervals.values())


def check_smoke(doc, out):
  _check_mev_items(doc)
  _check_sentence_resamples(doc)
