"""Checks of `experiments/stacking.py` that need no training: its rule and its method as
docs/experiments.md states it (the library pieces it runs are checked in
`test_training_runs.py`)."""

import json
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


def test_uncertainty_of_a_run_that_predates_per_sequence_losses():
  """The GPU run keeps the interleaved rounds and every step's time, not the held-out losses of
  each sequence: the time row gets its interval, the quality row says why it has none."""
  doc = json.loads((REPO / "experiments" / "results" / "stacking_gpu.json").read_text())
  doc["results"]["data"].pop("heldout_sequence_unigram_loss_sum", None)
  time, quality = rules.uncertainty(doc["results"], doc["settings"])
  assert time.span is not None and time.text.startswith("95% CI over the 20 interleaved rounds")
  assert time.intervals[rules.SLOWEST][0] <= time.values[rules.SLOWEST]
  assert quality.span is None and "rerun needed" in quality.text


def check_smoke(doc: dict, out: pathlib.Path) -> None:
  """The smoke run keeps the per-sequence held-out losses, paired: the quality row has its
  interval (run by `test_experiments.py` on its smoke run)."""
  rows = rules.uncertainty(doc["results"], doc["settings"])
  assert len(rows) == len(doc["findings"]) and rows[1].span is not None
  assert (
    rows[1].text.startswith("95% CI over the") and "held-out sequences (paired)" in rows[1].text
  )
