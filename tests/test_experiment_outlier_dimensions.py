"""Checks of `experiments/outlier_dimensions.py`: its token counts and frequency correlation
against direct loops, its verdict rules, and the committed results (the census follows from the
committed z-scores, and each row is what the rules give for its numbers)."""

import json
import pathlib
import sys
import types

import numpy as np
import pytest
from scipy import stats

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "experiments"))
import outlier_dimensions as od

RESULTS = REPO / "experiments" / "results"


def test_token_counts_against_the_tokenizer(tmp_path):
  import bertjax

  tok = bertjax.Tokenizer.from_pretrained(bertjax.minilm_path())
  lines = ["the cat sat on the mat .", "", "the dog , the cat and the bird ."]
  path = tmp_path / "t.txt"
  path.write_text("\n".join(lines) + "\n")
  counts = od.token_counts(tok, [path, path])
  want = np.zeros(tok.vocab_size, np.int64)
  for line in lines:
    if line:
      for i in tok.tokenizer.encode(line).ids:
        want[i] += 2
  for special in tok.special_ids:
    want[special] = 0
  np.testing.assert_array_equal(counts, want)
  assert counts[tok.tokenizer.token_to_id("the")] == 2 * 5


def test_frequency_correlation_against_a_loop():
  rng = np.random.default_rng(0)
  layers, n, hidden = 4, 300, 10
  ids = rng.integers(5, 40, n)
  acts = rng.normal(size=(layers, n, 2))
  z = rng.normal(size=(layers, hidden))
  z[:, 3], z[:, 7] = [4, 5, 0, 0], [-3.5, 0, -4, -6]  # dimension 7 outlies downwards
  census = types.SimpleNamespace(z=z, is_outlier=np.abs(z) >= 3)
  counts = rng.integers(0, 1000, 50)
  got = od.frequency_correlation(acts, ids, counts, census, [3, 7])
  uniq = np.unique(ids)
  for j, (d, sign, flagged) in enumerate([(3, 1, [0, 1]), (7, -1, [0, 2, 3])]):
    per_type = [sign * acts[flagged][:, ids == t, j].mean() for t in uniq]
    want = stats.spearmanr(per_type, np.log1p(counts[uniq])).statistic
    assert got["rho"][j] == pytest.approx(want, abs=1e-12), d
  assert got["types"] == len(uniq)


def test_rules():
  ablation = lambda drop, randoms: od.ABLATION.verdict(
    {od.MARGIN: od.ablation_margin(drop, randoms)}
  )
  assert od.ABLATION.verdict({od.MARGIN: None}) == "no"  # no outlier dimensions
  assert ablation(0.08, [0.01, 0.02]) == "yes"
  assert ablation(0.04, [0.01, 0.02]) == "partly"
  assert ablation(0.01, [0.01, 0.02]) == "no"
  frequency = lambda rho, fall: od.FREQUENCY.verdict({od.RHO: rho, od.SINK_FALL: fall})
  assert frequency(None, None) == "n/a"
  assert frequency(0.35, 0.1) == "yes"
  assert frequency(0.35, -0.1) == "partly"
  assert frequency(0.0, 0.1) == "partly"
  assert frequency(0.0, -0.1) == "no"
  massive = lambda share: od.MASSIVE.verdict({od.MASSIVE_SHARE: share})
  assert [massive(v) for v in (2 / 3, 1 / 3, 0.0)] == ["yes", "partly", "no"]
  assert [od.INT8.verdict({od.INT8_RHO: v}) for v in (0.6, 0.3, 0.1)] == ["yes", "partly", "no"]


@pytest.mark.parametrize("stem", ["outlier_dimensions", "outlier_dimensions_all-mpnet-base-v2"])
def test_committed_results_are_consistent(stem):
  path = RESULTS / f"{stem}.json"
  if not path.exists():
    pytest.skip(f"{path.name} is not committed")
  doc = json.loads(path.read_text())
  r, s = doc["results"], doc["settings"]
  assert not doc["smoke"] and doc["findings"] == od.findings(r, s)
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
