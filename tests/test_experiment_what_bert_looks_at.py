"""Script-specific checks of `experiments/what_bert_looks_at.py` (Clark et al.'s probe)."""

import pathlib

import numpy as np

from experiments import what_bert_looks_at as wbl


def test_committed_results_record_clark_s_definition():
  import json

  path = (
    pathlib.Path(__file__).resolve().parents[1] / "experiments" / "results" / f"{wbl.NAME}.json"
  )
  if not path.exists():
    return
  doc = json.loads(path.read_text())
  definition = doc["settings"]["clark_statistics"]
  assert (definition["weighting"], definition["punctuation"]) == ("document", "clark")
  assert definition["entropy_smoothing"] == 1e-4
  clark, variant = doc["results"]["clark"], doc["results"]["clark_token_all_punct"]
  assert clark["definition"]["punctuation_ids"] == 2
  assert variant["definition"] == {
    "weighting": "token",
    "punctuation": "all",
    "punctuation_ids": variant["definition"]["punctuation_ids"],
    "entropy_smoothing": 0.0,
  }
  for name in ("cls", "sep", "punct", "entropy"):
    np.testing.assert_allclose(clark["by_layer"][name], np.mean(clark[name], -1), atol=1e-12)
  sep = np.asarray(clark["by_layer"]["sep"])
  assert f"{sep.argmax() + 1} ({sep.max():.2f})" in doc["findings"][0]["measured"]


def check_smoke(doc: dict, out: pathlib.Path) -> None:
  """The smoke run keeps what every row's interval resamples, and each row's point value is
  the statistic on all the items (the per-sentence masses average to the by-layer ones)."""
  r = doc["results"]
  for name in ("cls", "sep", "punct", "entropy"):
    np.testing.assert_allclose(
      np.mean(r["per_sentence"][name], 0), r["clark"]["by_layer"][name], atol=2e-5
    )
  held = r["probe"]["held_out"]
  for rel in r["probe"]["frequent"]:  # (the smoke's few sentences leave some relation none)
    accuracy = r["probe"]["accuracy_chosen_direction"][rel]
    assert (np.mean(held[rel]["head"]) if held[rel]["head"] else None) == accuracy
  judged = wbl.uncertainty(r, doc["settings"])
  assert len(judged) == len(doc["findings"]) == 4
  for j, row in zip(judged, doc["findings"]):
    assert j.text.startswith("95% CI over the") and j.verdict == row["holds"], (j.text, row)
