"""experiments/attribution.py: the cue finder, the twins, the ranks and the probe-as-metric."""

import pathlib
import sys

import numpy as np
import pytest

import bertjax

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "experiments"))
import attribution  # noqa: E402


@pytest.fixture(scope="module")
def tok(minilm_dir):
  return bertjax.Tokenizer.from_pretrained(minilm_dir)


def test_cue_twin_and_rank(tok):
  batch = tok.encode(["She did not like it.", "He didn't go.", "No, never, not."])
  pos = attribution.cue_position(tok, batch, 0)
  assert tok.convert_ids_to_tokens([batch.input_ids[0, pos]]) == ["not"]
  twin = attribution.twin_ids(tok, batch, 0, pos)
  assert tok.decode(twin[batch.attention_mask[0] > 0][1:-1]) == "she did also like it."
  pos = attribution.cue_position(tok, batch, 1)  # the "t" of "n't"
  assert tok.convert_ids_to_tokens(batch.input_ids[1, pos - 2:pos + 1]) == ["didn", "'", "t"]
  assert attribution.cue_position(tok, batch, 2) is None  # three cues: ambiguous
  real = np.array([False, True, True, True, False])
  assert attribution.ranks(np.array([9.0, 0.5, 0.7, 0.1, 9.0]), 2, real) == 1
  assert attribution.ranks(np.array([9.0, 0.5, 0.7, 0.7, 9.0]), 2, real) == 2  # ties pessimistic


def test_probe_fit_and_two_class_metric_equal_the_logistic_logit():
  from bertjax.analysis import patching

  rng = np.random.default_rng(0)
  x = rng.normal(size=(200, 6))
  y = (x[:, 0] - 0.5 * x[:, 3] > 0).astype(int)
  w, b, mu, sd = attribution.fit_probe(x, y)
  from sklearn.linear_model import LogisticRegression

  ref = LogisticRegression(C=1 / (2 * 1e-2 * 200), max_iter=1000).fit((x - mu) / sd, y)
  np.testing.assert_allclose(w, ref.coef_[0], rtol=2e-3, atol=2e-3)
  np.testing.assert_allclose(b, ref.intercept_[0], rtol=2e-3, atol=2e-3)
  # The experiment's metric: the binary probe as two classes on mean-pooled states.
  weight = np.stack([np.zeros_like(w), w / sd], 1)
  metric = patching.ProbeLogitDiff(weight, np.asarray([0.0, b - (mu / sd) @ w]), "mean")
  hidden = rng.normal(size=(3, 4, 6)).astype(np.float32)
  mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
  out = bertjax.BertOutput(last_hidden_state=hidden)
  batch = {"attention_mask": mask, "answer": np.ones(3, np.int32),
           "distractor": np.zeros(3, np.int32)}
  pooled = attribution.mean_pool(hidden.astype(np.float64), mask)
  want = (((pooled - mu) / sd) @ w + b).mean()
  np.testing.assert_allclose(float(metric(None, None, out, batch)), want, rtol=1e-5)
