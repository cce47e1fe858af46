"""Checks of `experiments/stacking.py` that need no training: its rule and its method as
docs/experiments.md states it (the library pieces it runs are checked in
`test_training_runs.py`)."""

import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]
from experiments import stacking
from experiments import stacking as rules


def test_holds_rule():
  holds = lambda ratios: rules.TIME.verdict(rules.time_quantities(ratios))
  assert holds([0.7, 0.75, 0.8]) == "yes"
  assert holds([0.7, 0.85, 0.9]) == "partly"
  assert holds([0.9, 0.95, 0.99]) == "partly"
  assert holds([1.1, 1.2, 0.95]) == "no"
  assert holds([None, 0.5, 0.5]) == "no"


def test_the_method_page_states_the_full_scale():
  sc = stacking.FULL
  schedule = f"{sc.shallow}:{round(sc.steps * sc.shallow_fraction)},{sc.layers}"
  page = (REPO / "docs" / "experiments.md").read_text()
  doc = page.split("## `stacking`")[1].split("\n## ")[0]
  assert schedule in doc and f"{sc.steps} steps" in doc
  assert f"{sc.layers}-layer, {sc.hidden}-wide" in doc and f"batch {sc.batch}" in doc


def test_quality_rule():
  quality = lambda gap, lead: rules.QUALITY.verdict({rules.GAP: gap, rules.LEAD: lead})
  assert quality(0.03, 0.5) == "yes"
  assert quality(0.03, 0.05) == "partly"  # still at the unigram stage: a weak test
  assert quality(0.1, 0.5) == "partly" and quality(0.2, 0.5) == "no"
