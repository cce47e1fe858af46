"""`probing_run.layer_curves` and `layer_summary` on hand-made suite results: the peak, the
expected layer (Tenney et al.'s, by hand), the fall to the last layer and the selectivities."""

import pytest

from bertjax.analysis.representations import probing_run


def _results(mlp: bool) -> dict:
  upos = [0.2, 0.9, 0.8, 0.7]
  r = {
    "upos": {"accuracy": upos, "selectivity": [0.0, 0.3, 0.2, 0.1], "best_layer": 1},
    "deprel": {
      "accuracy": [0.1, 0.4, 0.6, 0.5],
      "selectivity": [0.0, 0.1, 0.4, 0.3],
      "best_layer": 2,
    },
    "structural": {
      "distance": {"uuas": [0.1, 0.2, 0.5, 0.3], "spearman": [0.1, 0.2, 0.3, 0.4]},
      "depth": {"root_accuracy": [0.0, 0.6, 0.6, 0.1], "spearman": [0.2, 0.2, 0.2, 0.2]},
    },
  }
  if mlp:
    r["upos_mlp"] = {"selectivity": [0.0, 0.05, 0.1, 0.0], "best_layer": 2}
  return r


@pytest.mark.parametrize("mlp", [False, True])
def test_summary_reads_every_measure_by_layer(mlp):
  r = _results(mlp)
  curves = probing_run.layer_curves(r)
  assert list(curves) == ["upos", "deprel", "uuas", "dspr", "root_acc", "nspr"]
  got = probing_run.layer_summary(r, curves)
  assert got["peak_layer"] == {
    "upos": 1,
    "deprel": 2,
    "uuas": 2,
    "dspr": 3,
    "root_acc": 1,
    "nspr": 0,
  }
  # Tenney et al.'s expected layer over the best-so-far scores: UPOS gains only at layer 1;
  # UUAS 0.1 -> 0.2 -> 0.5 (-> 0.5): (1 * 0.1 + 2 * 0.3) / 0.4.
  assert got["expected_layer"]["upos"] == pytest.approx(1.0)
  assert got["expected_layer"]["uuas"] == pytest.approx(0.7 / 0.4)
  assert got["drop_from_peak_to_last"]["upos"] == pytest.approx(0.2)
  assert got["drop_from_peak_to_last"]["dspr"] == 0.0
  assert got["selectivity_at_best_layer"] == {"upos": 0.3, "deprel": 0.4}
  assert got["max_selectivity"] == {"upos": 0.3, "deprel": 0.4}
  assert got["max_selectivity_layer"] == {"upos": 1, "deprel": 2}
  assert got["middle_layers"] == [1, 2]  # 3 blocks: the middle third is 1-2
  assert ("mlp_selectivity_at_best_layer" in got) == mlp
  if mlp:
    assert got["mlp_selectivity_at_best_layer"] == 0.1
