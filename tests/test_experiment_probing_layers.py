"""Checks of `experiments/probing_layers.py`: the verdict rules and the committed results'
internal consistency (Tenney's expected layer is `stats.expected_layer`, in test_stats.py;
the smoke run is in test_experiments.py)."""

import json
import pathlib

import numpy as np
import pytest

from bertjax import stats
from bertjax.analysis.representations import probing_run

REPO = pathlib.Path(__file__).resolve().parents[1]
from experiments import probing_layers as rules

RESULTS = REPO / "experiments" / "results" / "probing_layers.json"


def test_rules():
  assert probing_run.middle_layers(7) == (2, 4)  # 6 blocks: the middle third is 2-4
  assert rules.PEAKS.verdict(rules.peak_quantities({"a": 2, "b": 4}, 7)) == "yes"
  assert rules.PEAKS.verdict(rules.peak_quantities({"a": 2, "b": 5, "c": 1}, 7)) == "partly"
  assert rules.PEAKS.verdict(rules.peak_quantities({"a": 6, "b": 6, "c": 3}, 7)) == "no"
  assert rules.POS_LOWER.verdict(rules.pos_quantities(1.0, {"a": 1.2, "b": 2.0})) == "yes"
  assert (
    rules.POS_LOWER.verdict(rules.pos_quantities(1.15, {"a": 1.2, "b": 2.0})) == "partly"
  )  # within the 0.1 margin
  assert rules.POS_LOWER.verdict(rules.pos_quantities(3.0, {"a": 1.2, "b": 2.0})) == "no"
  assert rules.POS_LOWER.verdict(rules.pos_quantities(float("nan"), {"a": 1.2})) == "no"
  assert (
    rules.SELECTIVE.verdict(rules.selectivity_quantities({"upos": 0.3, "deprel": 0.25})) == "yes"
  )
  assert (
    rules.SELECTIVE.verdict(rules.selectivity_quantities({"upos": 0.3, "deprel": 0.01})) == "partly"
  )
  assert (
    rules.SELECTIVE.verdict(rules.selectivity_quantities({"upos": -0.1, "deprel": 0.01})) == "no"
  )
  assert rules.MLP.verdict(rules.mlp_quantities(0.3, 0.2, 0.93, 0.94)) == "yes"
  assert rules.MLP.verdict(rules.mlp_quantities(0.3, 0.2, 0.93, 0.80)) == "partly"
  assert rules.MLP.verdict(rules.mlp_quantities(0.3, 0.4, 0.93, 0.94)) == "no"


def test_committed_results_are_consistent():
  if not RESULTS.exists():
    pytest.skip(f"{RESULTS} not written yet (./run.sh experiment probing_layers)")
  doc = json.loads(RESULTS.read_text())
  r = doc["results"]
  curves = {k: np.asarray(v, float) for k, v in r["curves"].items()}
  assert np.allclose(curves["upos"], r["upos"]["accuracy"])
  assert np.allclose(
    r["upos"]["selectivity"], np.subtract(r["upos"]["accuracy"], r["upos"]["control_accuracy"])
  )
  for key, ys in curves.items():
    assert r["summary"]["peak_layer"][key] == int(np.argmax(ys))
    e = r["summary"]["expected_layer"][key]
    assert (e is None and np.isnan(stats.expected_layer(ys))) or e == pytest.approx(
      stats.expected_layer(ys)
    )
  _check_items(r)
  peaks = {k: r["summary"]["peak_layer"][k] for k in rules.SYNTACTIC}
  assert doc["findings"][0]["holds"] == rules.PEAKS.verdict(
    rules.peak_quantities(peaks, len(curves["upos"]))
  )


def _check_items(r):
  """The per-sentence values the intervals resample give every curve back, and the control
  accuracies."""
  items = probing_run.sentence_items(r)
  assert len({len(v) for v in items.values()}) == 1  # one row per test sentence
  got = probing_run.item_curves(items)
  for key, curve in r["curves"].items():
    np.testing.assert_allclose(got[key], curve, rtol=1e-9, err_msg=key)
  for t in ("upos", "deprel"):
    np.testing.assert_allclose(got[f"{t}_control"], r[t]["control_accuracy"], rtol=1e-9)


def check_smoke(doc, out):
  """The smoke run keeps the per-sentence values, and every row's interval comes from them."""
  _check_items(doc["results"])
  judged = rules.uncertainty(doc["results"], doc["settings"])
  assert len(judged) == len(doc["findings"]) == 4
  for u, f in zip(judged, doc["findings"]):
    assert u.text.startswith("95% CI over the "), u.text
    lo, hi = u.intervals[f["value"]["name"]]
    assert not lo > hi, (f, u)
