"""Checks of `experiments/sae_scaling.py`: its verdict rules, its smoke run (`check_smoke`, run
by `test_experiments.py`) and the committed results (their rows are what the rules give for
their numbers); its fit is `stats.power_law_fit`."""

import json
import os
import pathlib

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
from bertjax import study
from experiments import sae_scaling as rules
from experiments import sae_scaling as ss

RESULTS = REPO / "experiments" / "results" / "sae_scaling.json"


def test_rules():
  scaling = lambda fvu, r2: rules.SCALING.verdict(rules.scaling_quantities(fvu, r2))
  assert scaling([0.4, 0.35, 0.3], 0.99) == "yes"
  assert scaling([0.4, 0.35, 0.3], 0.90) == "partly"  # falls, but not a power law
  assert scaling([0.4, 0.41, 0.3], 0.99) == "partly"  # one doubling did not help
  assert scaling([0.3, 0.35, 0.4], 0.99) == "no"
  dead = lambda d: rules.DEAD.verdict(rules.dead_quantities(d))
  assert dead([0.0, 0.05, 0.1]) == "yes"
  assert dead([0.0, 0.2]) == "partly"
  assert dead([0.3, 0.2]) == "no"


def check_smoke(doc: dict, out: pathlib.Path) -> None:
  """The smoke run's sizes, and its programs compiled unoptimised (`study.quick_compiles`)."""
  assert doc["settings"]["expansions"] == [2, 4] and doc["settings"]["steps"] == 20
  assert doc["settings"]["xla_optimised"] is False
  _check_paragraphs(doc["results"], doc["settings"])


def _check_paragraphs(r: dict, s: dict) -> None:
  """The per-paragraph sums give each size's FVU back, and the statistics on all the
  paragraphs are the row's: the FVU by size, and the power law's R^2 (`stats.power_law_fit`)."""
  per = r["per_group"]
  error, variance = np.asarray(per["error"], float), np.asarray(per["variance"], float)
  assert error.shape == (len(r["latents"]), len(variance))
  np.testing.assert_allclose(error.sum(1) / variance.sum(), r["fvu"], rtol=1e-9)
  scaling, _ = rules.uncertainty(r, s)
  assert scaling.text.startswith(f"95% CI over the {len(variance)} held-out paragraphs"), scaling
  lo, hi = scaling.intervals[rules.R2]
  assert 0 <= lo <= hi <= 1 + 1e-12
  want = rules.scaling_quantities(r["fvu"], r["fit"]["r2"])
  got = rules.scaling_quantities(error.sum(1) / variance.sum(), r["fit"]["r2"])
  assert got == pytest.approx(want)


def test_quick_compiles_sets_then_gives_the_settings_back(monkeypatch):
  """`study.quick_compiles`, which the smoke runs of sae_scaling and others compile under."""
  import jax

  # The suite compiles with most optimisations off (conftest): start from XLA's default.
  before = jax.config.values["jax_disable_most_optimizations"]
  jax.config.update("jax_disable_most_optimizations", False)
  try:
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    with study.quick_compiles(True):
      assert jax.config.values["jax_disable_most_optimizations"] is True
      assert os.environ["XLA_FLAGS"] == study.SMOKE_XLA_FLAG
    assert jax.config.values["jax_disable_most_optimizations"] is False
    assert "XLA_FLAGS" not in os.environ
    mine = "--xla_cpu_use_fusion_emitters=true --xla_cpu_enable_fast_math=false"
    monkeypatch.setenv("XLA_FLAGS", mine)
    with study.quick_compiles(True):  # the user's own setting of the flag wins
      assert os.environ["XLA_FLAGS"] == mine
    assert os.environ["XLA_FLAGS"] == mine
    with study.quick_compiles(False):
      assert jax.config.values["jax_disable_most_optimizations"] is False
  finally:
    jax.config.update("jax_disable_most_optimizations", before)


def test_committed_rows_follow_the_rules():
  if not RESULTS.exists():
    pytest.skip("sae_scaling.json is not committed")
  doc = json.loads(RESULTS.read_text())
  assert not doc["smoke"] and doc["findings"] == rules.findings(doc["results"], doc["settings"])
  r = doc["results"]
  assert r["latents"] == [e * 384 for e in ss.EXPANSIONS] and len(r["fvu"]) == 5
  assert all(0 < v < 1 for v in r["fvu"]) and r["held_out_tokens"] > 10000
  assert 0 < r["loss_recovered"]["recovered"] <= 1
  _check_paragraphs(r, doc["settings"])
