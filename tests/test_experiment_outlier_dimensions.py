"""Checks of `experiments/outlier_dimensions.py`: its verdict rules and the committed results
(the census follows from the committed z-scores, and each row is what the rules give for its
numbers); what it runs is checked in test_outliers.py."""

import json
import pathlib

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
from experiments import outlier_dimensions as rules

RESULTS = REPO / "experiments" / "results"


def test_rules():
  ablation = lambda drop, randoms: rules.ABLATION.verdict(
    {rules.MARGIN: rules.ablation_margin(drop, randoms)}
  )
  assert rules.ABLATION.verdict({rules.MARGIN: None}) == "no"  # no outlier dimensions
  assert ablation(0.08, [0.01, 0.02]) == "yes"
  assert ablation(0.04, [0.01, 0.02]) == "partly"
  assert ablation(0.01, [0.01, 0.02]) == "no"
  frequency = lambda rho, fall: rules.FREQUENCY.verdict({rules.RHO: rho, rules.SINK_FALL: fall})
  assert frequency(None, None) == "n/a"
  assert frequency(0.35, 0.1) == "yes"
  assert frequency(0.35, -0.1) == "partly"
  assert frequency(0.0, 0.1) == "partly"
  assert frequency(0.0, -0.1) == "no"
  massive = lambda share: rules.MASSIVE.verdict({rules.MASSIVE_SHARE: share})
  assert [massive(v) for v in (2 / 3, 1 / 3, 0.0)] == ["yes", "partly", "no"]
  assert [rules.INT8.verdict({rules.INT8_RHO: v}) for v in (0.6, 0.3, 0.1)] == [
    "yes",
    "partly",
    "no",
  ]


def check_smoke(doc: dict, out: pathlib.Path) -> None:
  """This script's own checks of its `--smoke` run (run by `test_experiments.py`): the tiny
  model ships no MLM head, so one is fitted, and every condition's loss is reported."""
  m = doc["results"]["mlm"]
  assert m["head"]["source"] == "fitted to the frozen body" and m["head"]["steps"] == 20
  assert set(m["loss"]) == {"intact", "outliers", "random_0", "random_1"} or (
    not doc["results"]["dims"] and set(m["loss"]) == {"intact"}
  )
  assert m["predictions"] > 20 and all(np.isfinite(v) for v in m["loss"].values())
  assert "Masked-LM loss on" in doc["findings"][0]["measured"]


@pytest.mark.parametrize("stem", ["outlier_dimensions", "outlier_dimensions_all-mpnet-base-v2"])
def test_committed_results_are_consistent(stem):
  path = RESULTS / f"{stem}.json"
  if not path.exists():
    pytest.skip(f"{path.name} is not committed")
  doc = json.loads(path.read_text())
  r, s = doc["results"], doc["settings"]
  assert not doc["smoke"] and doc["findings"] == rules.findings(r, s)
  z = np.asarray(r["z"])
  assert z.shape[0] in (6, 12) and np.allclose(z.mean(1), 0, atol=1e-6)
  outlying = np.abs(z) >= s["sigmas"]
  assert r["outliers_per_layer"] == outlying.sum(1).tolist()
  assert r["dims"] == np.flatnonzero(outlying.mean(0) >= s["min_fraction"]).tolist()
  acc = r["probe"]["accuracy"]
  for name, right in r["probe"]["correct"].items():  # accuracies are the stored per-word marks
    assert np.allclose(np.mean(right, 1), acc[name])
  assert acc["intact"][-1] > 0.5 and r["probe"]["test_words"] > 3000
  assert len(r["random_dims"]) == s["random_draws"]
  for dims in r["random_dims"].values():
    assert len(dims) == len(r["dims"]) and not set(dims) & set(r["dims"])
