"""Checks of `experiments/negation_circuit.py`: its rules, its smoke run (`check_smoke`, run
by `test_experiments.py`), and the committed results (their rows are what the rules give for their numbers)."""

import json
import pathlib

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
from bertjax.analysis.interventions import circuits
from experiments import findings_pages
from experiments import negation_circuit as rules

RESULTS = REPO / "experiments" / "results"


def test_rules():
  score = lambda eap, eap_ig: rules.SCORES.verdict({rules.EAP: eap, rules.EAP_IG: eap_ig})
  assert score(0.7, 0.9) == "yes"
  assert score(0.95, 0.9) == "partly"  # agrees, but not better than EAP
  assert score(0.5, 0.6) == "partly"  # better than EAP, but below 0.8
  assert score(0.6, 0.5) == "no"
  circuit = lambda share: rules.CIRCUIT.verdict({rules.SHARE: share})
  assert circuit(0.01) == "yes"
  assert circuit(0.1) == "partly"
  assert circuit(0.5) == "no" and circuit(None) == "no"
  faith = {"edges": [10, 50, 200], "normalized": [0.3, 0.85, 0.95]}
  assert circuits.smallest_faithful(faith) == 50
  assert circuits.smallest_faithful(faith, 0.9) == 200
  assert circuits.smallest_faithful({"edges": [10], "normalized": [0.2]}) is None


def test_agreement_against_scipy():
  stats = pytest.importorskip("scipy.stats")
  rng = np.random.default_rng(0)
  x, y = rng.normal(size=50), rng.normal(size=50)
  x[3] = np.nan
  got = circuits.agreement(x, y)
  ok = np.isfinite(x)
  assert got["edges"] == 49
  assert got["pearson"] == pytest.approx(stats.pearsonr(x[ok], y[ok])[0], abs=1e-9)
  assert got["spearman"] == pytest.approx(stats.spearmanr(x[ok], y[ok])[0], abs=1e-9)


def check_smoke(doc: dict, out: pathlib.Path) -> None:
  """This script's own checks of its `--smoke` run (run by `test_experiments.py`)."""
  r = doc["results"]
  assert doc["smoke"] and len(doc["findings"]) == 2
  assert doc["settings"]["xla_optimised"] is False  # --smoke compiles unoptimised programs
  assert r["agreement"]["eap"]["edges"] == r["graph"]["edges"]  # every edge patched
  assert len(r["faithfulness"]["topk"]["normalized"]) == len(doc["settings"]["sizes"])
  # The full graph is the full model: every edge kept restores the clean logit difference.
  assert r["faithfulness"]["topk"]["normalized"][-1] == pytest.approx(1.0, abs=1e-3)
  # Each pair's circuit metric is kept, so the Findings resample the pairs.
  top = r["faithfulness"]["topk"]
  per_pair = np.asarray(top["rows"]["metric"])
  assert per_pair.shape == (len(top["sizes"]), r["pairs"])
  np.testing.assert_allclose(per_pair.mean(1), top["metric"], rtol=1e-6)
  u = findings_pages.uncertainty(doc)[1]
  assert u.text.startswith(f"95% CI over the {r['pairs']} pairs: the smallest faithful") and u.span
  assert (out / "negation_circuit_circuit.png").stat().st_size > 10_000


@pytest.mark.parametrize("stem", ["negation_circuit", "negation_circuit_all-mpnet-base-v2"])
def test_committed_rows_follow_the_rules(stem):
  path = RESULTS / f"{stem}.json"
  if not path.exists():
    pytest.skip(f"{path.name} is not committed")
  doc = json.loads(path.read_text())
  assert not doc["smoke"] and doc["findings"] == rules.findings(doc["results"], doc["settings"])
  r = doc["results"]
  assert r["agreement"]["eap_ig"]["edges"] >= 2000 and r["pairs"] >= 32
