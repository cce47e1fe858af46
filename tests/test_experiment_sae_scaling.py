"""Checks of `experiments/sae_scaling.py`: its fit against SciPy, its verdict rules, and the
committed results (their rows are what the rules give for their numbers)."""

import json
import pathlib
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "experiments"))
import sae_scaling as ss

RESULTS = REPO / "experiments" / "results" / "sae_scaling.json"


def test_power_law_fit_against_scipy():
  stats = pytest.importorskip("scipy.stats")
  n = np.array([384, 768, 1536, 3072, 6144])
  fvu = 2.1 * n**-0.23 * np.exp(np.array([0.01, -0.02, 0.015, 0.0, -0.01]))
  fit = ss.power_law(n, fvu)
  ref = stats.linregress(np.log(n), np.log(fvu))
  assert fit["exponent"] == pytest.approx(ref.slope, rel=1e-9)
  assert fit["coefficient"] == pytest.approx(np.exp(ref.intercept), rel=1e-9)
  assert fit["r2"] == pytest.approx(ref.rvalue**2, rel=1e-9)


def test_rules():
  scaling = lambda fvu, r2: ss.SCALING.verdict(ss.scaling_quantities(fvu, r2))
  assert scaling([0.4, 0.35, 0.3], 0.99) == "yes"
  assert scaling([0.4, 0.35, 0.3], 0.90) == "partly"  # falls, but not a power law
  assert scaling([0.4, 0.41, 0.3], 0.99) == "partly"  # one doubling did not help
  assert scaling([0.3, 0.35, 0.4], 0.99) == "no"
  dead = lambda d: ss.DEAD.verdict(ss.dead_quantities(d))
  assert dead([0.0, 0.05, 0.1]) == "yes"
  assert dead([0.0, 0.2]) == "partly"
  assert dead([0.3, 0.2]) == "no"


def test_paragraphs_skip_headings_and_short_lines(tmp_path):
  f = tmp_path / "t.txt"
  f.write_text(" = Heading = \n\n short line here .\n" + " ".join(["word"] * 13) + "\n")
  assert ss.paragraphs(f) == [" ".join(["word"] * 13)]


def test_committed_rows_follow_the_rules():
  if not RESULTS.exists():
    pytest.skip("sae_scaling.json is not committed")
  doc = json.loads(RESULTS.read_text())
  assert not doc["smoke"] and doc["findings"] == ss.findings(doc["results"], doc["settings"])
  r = doc["results"]
  assert r["latents"] == [e * 384 for e in ss.EXPANSIONS] and len(r["fvu"]) == 5
  assert all(0 < v < 1 for v in r["fvu"]) and r["held_out_tokens"] > 10000
  assert 0 < r["loss_recovered"]["recovered"] <= 1
