"""Checks of `experiments/tuned_lens.py`: its verdict rule, its smoke run (`check_smoke`, run
by `test_experiments.py`) and the committed results (their rows are what the rule gives for
their numbers); the lens itself is checked in test_tuned_lens.py."""

import json
import pathlib

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
from experiments import findings_pages
from experiments import tuned_lens as rules

RESULTS = REPO / "experiments" / "results"


def test_rule():
  lens = lambda tuned, logit: rules.LENS.verdict({rules.CLOSER: rules.closer(tuned, logit)})
  assert lens([0.1, 0.2, 0.3], [1.0, 0.5, 0.4]) == "yes"
  assert lens([0.1, 0.6, 0.3], [1.0, 0.5, 0.4]) == "partly"  # 2 of 3 layers
  assert lens([1.1, 0.6, 0.3], [1.0, 0.5, 0.4]) == "no"


def check_smoke(doc: dict, out: pathlib.Path) -> None:
  """This script's own checks of its `--smoke` run: a head is fitted to the tiny model, one
  KL per lens layer (the embeddings and every block below the last), finite, and the
  uncertainty resamples the held-out batches."""
  r = doc["results"]
  assert r["head"]["source"] == "fitted to the frozen body"
  assert len(r["tuned"]) == len(r["logit"]) == doc["settings"]["depth"]
  assert np.isfinite(r["tuned"]).all() and min(r["tuned"]) >= 0
  assert len(r["train_loss"]) == doc["settings"]["steps"] == 10
  assert sum(r["per_batch"]["tokens"]) == r["tokens"] > 100
  u = findings_pages.uncertainty(doc)[0]
  assert u.text.startswith("95% CI over the") and u.span
  assert (out / "tuned_lens_kl.png").stat().st_size > 10_000


@pytest.mark.parametrize("stem", ["tuned_lens", "tuned_lens_all-mpnet-base-v2"])
def test_committed_rows_follow_the_rule(stem):
  path = RESULTS / f"{stem}.json"
  if not path.exists():
    pytest.skip(f"{path.name} is not committed")
  doc = json.loads(path.read_text())
  assert not doc["smoke"] and doc["findings"] == rules.findings(doc["results"], doc["settings"])
  r = doc["results"]
  assert len(r["tuned"]) == doc["settings"]["depth"] and r["tokens"] > 10_000
  n = np.asarray(r["per_batch"]["tokens"], float)
  np.testing.assert_allclose(n @ np.asarray(r["per_batch"]["tuned"]) / n.sum(), r["tuned"])


def test_a_fitted_head_is_cached_by_weights_and_read_back(tmp_path, monkeypatch):
  """`study.with_mlm_head`: a full run fits the head once and keeps it in the user cache
  under the model's weights' hash; the next run reads the same head, another model's weights
  fit their own, and a checkpoint with a head keeps it."""
  import types

  import jax

  from bertjax import study

  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  config, params, tok, _ = study.tiny_model(0)
  args = types.SimpleNamespace(smoke=False, model=None, seed=0)
  data = study.smoke_data_dir()
  fit = lambda p, t: study.with_mlm_head(args, p, config, tok, data, t, windows=8, steps=3)
  timings = {}
  first, info = fit(params, timings)
  assert "MLM head fit" in timings and info["source"] == "fitted to the frozen body"
  # One of the eight windows is held out for early stopping, checked at every step here.
  assert info["fit_predictions"] > 3 * info["stop_predictions"] > 0 and 1 <= info["best_step"] <= 3
  (cached,) = (tmp_path / "bertjax" / "mlm_heads").glob("all-MiniLM-L6-v2-*-w8-s3-seed0-v2.npz")
  again = {}
  second, info2 = fit(params, again)
  assert "MLM head fit" not in again and info2 == info
  jax.tree.map(np.testing.assert_array_equal, first["mlm"], second["mlm"])
  other = study.tiny_model(1)[1]
  fit(other, {})
  assert len(list(cached.parent.glob("*.npz"))) == 2
  kept, info3 = fit(first, {})
  assert kept is first and info3 == {"source": "the checkpoint's"}
