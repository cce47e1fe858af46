"""Checks of `experiments/causal_variables.py`: its verdict rules, its smoke run (`check_smoke`,
run by `test_experiments.py`) and the committed results (their rows are what the rules give for
their numbers); the methods themselves are checked in test_causal.py, test_causal_pyvene.py,
test_counterfactual_tasks.py and test_edges.py."""

import json
import pathlib

import numpy as np
import pytest

from experiments import causal_variables as rules

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "experiments" / "results"


def _task(das, pca, dbm, sae, eap, eap_ig):
  rows = lambda n: np.ones((2, n), np.int8)
  correct = {"full": rows(4), "das": das, "pca": pca, "dbm": dbm, "sae": sae}
  curve = lambda cpr: {"cpr": {"cpr": cpr}}
  return {"correct": correct, "circuits": {"eap": curve(eap), "eap_ig": curve(eap_ig)}}


def test_rules():
  """The gaps average over tasks: DAS against the best of PCA, DBM and the SAE mask, EAP-IG's
  CPR against EAP's; the verdicts follow the thresholds."""
  one, half, zero = np.ones((2, 4)), np.array([[1, 1, 0, 0]] * 2), np.zeros((2, 4))
  quarter = np.array([[1, 0, 0, 0]] * 2)
  tasks = {
    "a": _task(one, half, zero, quarter, 0.5, 0.7),
    "b": _task(half, zero, quarter, one, 0.6, 0.5),
  }
  g = rules.gaps(tasks)
  assert g[rules.DAS_GAP] == pytest.approx((0.5 - 0.5) / 2)
  tasks["b"]["correct"]["sae"] = quarter  # now DBM's quarter is b's best baseline
  g = rules.gaps(tasks)
  assert g[rules.DAS_GAP] == pytest.approx((0.5 + 0.25) / 2)
  assert g[rules.CPR_GAP] == pytest.approx((0.2 - 0.1) / 2)
  assert rules.DAS.verdict(g) == "yes" and rules.CIRCUIT.verdict(g) == "yes"
  assert rules.DAS.verdict({rules.DAS_GAP: 0.02}) == "partly"
  assert rules.DAS.verdict({rules.DAS_GAP: -0.1}) == "no"
  assert rules.CIRCUIT.verdict({rules.CPR_GAP: -0.01}) == "no"


def check_smoke(doc: dict, out: pathlib.Path) -> None:
  """Every task ran both tracks on its pairs: per method a (layers, held-out pairs) table of
  0/1 whose means are the IIA by layer; each curve's MIB grid, and the uncertainty resamples
  the held-out pairs and brackets the rows' values."""
  r, s = doc["results"], doc["settings"]
  assert set(r["tasks"]) == {"agreement", "negation", "ioi"}
  for v in r["tasks"].values():
    assert v["train"] == 6 and v["train"] + v["held_out"] == v["built"] == 24
    for m in rules.METHODS:
      c = np.asarray(v["correct"][m])
      assert c.shape == (s["depth"], v["held_out"]) and set(np.unique(c)) <= {0, 1}
      np.testing.assert_allclose(c.mean(1), v["iia"][m], atol=1e-4)
    for m in ("eap", "eap_ig"):
      curve = v["circuits"][m]["cpr"]
      assert len(curve["faithfulness"]) == len(curve["percentages"]) == 10
      assert np.asarray(curve["rows"]["metric"]).shape == (10, v["held_out"])
  das, circuit = rules.uncertainty(r, s)
  for j, name in ((das, rules.DAS_GAP), (circuit, rules.CPR_GAP)):
    assert j.text.startswith("95% CI over the held-out pairs"), j.text
    lo, hi = j.intervals[name]
    assert lo <= hi and np.isfinite([lo, hi]).all()


@pytest.mark.parametrize("stem", ["causal_variables", "causal_variables_all-mpnet-base-v2"])
def test_committed_rows_follow_the_rule(stem):
  path = RESULTS / f"{stem}.json"
  if not path.exists():
    pytest.skip(f"{path.name} is not committed")
  doc = json.loads(path.read_text())
  assert not doc["smoke"] and doc["findings"] == rules.findings(doc["results"], doc["settings"])
  tasks = doc["results"]["tasks"]
  assert set(tasks) == {"agreement", "negation", "ioi"}
  for v in tasks.values():  # analysed on enough held-out pairs, or said why not
    assert v["held_out"] >= 20 if "skipped" not in v else v["solved"] < doc["settings"]["min_pairs"]
  assert rules.analysed(tasks), "no task analysed"
