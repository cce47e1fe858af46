"""Michel et al.'s pruning study (`analysis/interventions/pruning.py`) against the model run
mask by mask, SciPy's tests, and the figures it draws."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as sps

import bertjax
from bertjax.analysis.interventions import ablation, pruning
from bertjax.plots import pruning as plots

CONFIG = bertjax.BertConfig.preset("tiny", num_hidden_layers=2, vocab_size=97, num_labels=2)
SHAPE = (CONFIG.depth, CONFIG.num_attention_heads)


@pytest.fixture(scope="module")
def params():
  p = bertjax.init(CONFIG, 3, heads=("classifier",))
  rng = np.random.default_rng(4)  # large weights: removing a head changes predictions
  return jax.tree.map(lambda x: x + 0.3 * rng.standard_normal(x.shape).astype(np.float32), p)


def _batch(seed, batch=8, seq=7):
  rng = np.random.default_rng(seed)
  ids = rng.integers(1, CONFIG.vocab_size, (batch, seq)).astype(np.int32)
  mask = np.ones((batch, seq), np.int32)
  mask[::3, 5:] = 0
  return {
    "input_ids": ids,
    "attention_mask": mask,
    "token_type_ids": np.zeros_like(ids),
    "labels": rng.integers(0, 2, batch).astype(np.int32),
  }


BATCHES = [_batch(s) for s in range(4)]  # 32 examples, one shape


def rows(params, config, batch, last_hidden_state, pooled):
  """Per-example cross-entropy and correctness of the classifier."""
  logp = jax.nn.log_softmax(bertjax.classify(params, config, pooled))
  nll = -jnp.take_along_axis(logp, batch["labels"][:, None], -1)[:, 0]
  return jnp.stack([nll, (logp.argmax(-1) == batch["labels"]).astype(nll.dtype)], -1)


@functools.partial(jax.jit, static_argnums=1)
def _reference(params, config, batch, head_mask):
  out = bertjax.forward(
    params,
    config,
    batch["input_ids"],
    batch["attention_mask"],
    batch["token_type_ids"],
    head_mask=head_mask,
  )
  logp = jax.nn.log_softmax(bertjax.classify(params, config, out.pooler_output))
  nll = -jnp.take_along_axis(logp, batch["labels"][:, None], -1)[:, 0]
  return nll, logp.argmax(-1) == batch["labels"]


def reference(params, mask, batches=BATCHES):
  """Per-example loss and correctness of `bertjax.forward` under one head mask."""
  out = [_reference(params, CONFIG, b, jnp.asarray(mask, jnp.float32)) for b in batches]
  return np.concatenate([np.asarray(o[0]) for o in out]), np.concatenate([o[1] for o in out])


def test_head_ablation_tests_are_each_mask_run_and_scipy_tests(params, tmp_path):
  got = pruning.head_ablation_tests(params, CONFIG, BATCHES, rows, alpha=0.2, chunk_size=3)
  base_loss, base_ok = reference(params, np.ones(SHAPE))
  assert got["num_test"] == 32
  np.testing.assert_allclose(got["baseline_loss"], base_loss.mean(), atol=1e-6)
  assert got["baseline_accuracy"] == base_ok.mean()
  drops = rises = 0
  for l in range(SHAPE[0]):
    keep_one_acc = []
    for h in range(SHAPE[1]):
      mask = np.ones(SHAPE)
      mask[l, h] = 0
      loss, ok = reference(params, mask)
      np.testing.assert_allclose(got["head_loss"][l, h], loss.mean(), atol=1e-6)
      assert got["head_accuracy"][l, h] == ok.mean()
      lost, gained = int((base_ok & ~ok).sum()), int((~base_ok & ok).sum())
      p = sps.binomtest(lost, lost + gained, 0.5).pvalue if lost + gained else 1.0
      assert got["head_accuracy_p_mcnemar"][l, h] == pytest.approx(p, rel=1e-9)
      d = loss - base_loss
      p_loss = sps.wilcoxon(d).pvalue if np.any(np.abs(d) > 1e-12) else 1.0
      assert got["head_loss_p_wilcoxon"][l, h] == pytest.approx(p_loss, rel=1e-4)
      drops += p < 0.2 and ok.mean() < base_ok.mean()
      rises += p_loss < 0.2 and loss.mean() > base_loss.mean()
      one = np.zeros(SHAPE)
      one[l, h] = 1
      one[1 - l] = 1
      keep_one_ok = reference(params, one)[1]
      keep_one_acc.append(keep_one_ok.mean())
      assert got["per_example"]["correct_keep_one"][l, h].tolist() == keep_one_ok.tolist()
    np.testing.assert_allclose(got["keep_one_accuracy"][l], keep_one_acc)
    layer = np.ones(SHAPE)
    layer[l] = 0
    assert got["layer_heads_accuracy"][l] == reference(params, layer)[1].mean()
  assert drops + rises > 0, "the fixture should make some head matter"
  assert got["significant_accuracy_drops"] == drops and got["significant_loss_rises"] == rises
  assert got["heads_removable_alone"] == SHAPE[0] * SHAPE[1] - drops
  assert got["per_example"]["correct_baseline"].tolist() == base_ok.tolist()
  imp = {"normalized": np.ones(SHAPE), "raw": np.arange(8.0).reshape(SHAPE)}
  assert plots.importance_and_ablation(imp, got, tmp_path / "h.png").stat().st_size > 10_000
  assert plots.layer_ablation(got, tmp_path / "l.png").stat().st_size > 10_000
  with pytest.raises(ValueError, match="alpha=1.5"):
    pruning.head_ablation_tests(params, CONFIG, BATCHES, rows, alpha=1.5)
  with pytest.raises(ValueError, match=r"\(batch, 2\) rows"):
    pruning.head_ablation_tests(params, CONFIG, BATCHES, ablation.classification_accuracy)


def test_pruning_curves_score_every_order_on_the_test_batches(params, tmp_path):
  train, test = BATCHES[:2], BATCHES[2:]
  imp_raw = ablation.head_importance(
    params, CONFIG, train, ablation.classification_batch_loss, normalize_layers=False
  )
  imp_norm = ablation.layer_normalized(imp_raw)
  np.testing.assert_allclose(imp_norm, imp_raw / np.linalg.norm(imp_raw, axis=-1, keepdims=True))
  kw = dict(step=0.25, max_fraction=0.5, random_orders=2, seed=7, chunk_size=4)
  loss_fn = ablation.classification_batch_loss
  got = pruning.pruning_curves(params, CONFIG, train, test, loss_fn, rows, imp_raw, imp_norm, **kw)
  np.testing.assert_allclose(got["fractions"], [0, 0.25, 0.5])
  assert got["heads_masked"].tolist() == [0, 2, 4]
  assert np.asarray(got["accuracy"]["random"]).shape == (2, 3)
  flat = np.argsort(imp_raw.ravel(), kind="stable")  # least important first
  for i, k in enumerate(got["heads_masked"]):
    mask = np.ones(SHAPE)
    mask.ravel()[flat[:k]] = 0
    ok = reference(params, mask, test)[1]
    assert got["accuracy"]["static_raw"][i] == ok.mean()
    assert got["per_example"]["correct"]["static_raw"][i].tolist() == ok.tolist()
    loss = reference(params, got["masks_iterative"][i], test)[0]
    np.testing.assert_allclose(got["loss"]["iterative"][i], loss.mean(), atol=1e-6)
  rng = np.random.default_rng(7)  # the random orders are the seeded permutations
  for j in range(2):
    m = ablation.order_masks(rng.permutation(8), got["heads_masked"], SHAPE)[-1]
    assert got["accuracy"]["random"][j][-1] == reference(params, m, test)[1].mean()
  for name, per in got["per_example"]["correct"].items():  # their means are the curves
    np.testing.assert_array_equal(np.mean(per, -1), got["accuracy"][name])
  acc, fractions = got["accuracy"]["iterative"], got["fractions"]
  ok = np.cumprod(acc >= acc[0] - 0.02).astype(bool)  # within the tolerance at every step so far
  assert got["max_fraction_within_tolerance"] == fractions[ok][-1]
  area = got["mean_accuracy_over_curve"]["iterative"]
  assert area == pytest.approx(np.trapezoid(acc, fractions) / 0.5)
  with pytest.raises(ValueError, match=r"importance_raw shape \(3,\)"):
    pruning.pruning_curves(params, CONFIG, train, test, loss_fn, rows, np.ones(3), imp_norm, **kw)
  path = plots.pruning_panels(got, tmp_path / "curves.png", majority=0.5)
  assert path.stat().st_size > 10_000


def test_pruned_model_equals_masked_model_even_with_a_layer_emptied():
  params = bertjax.init(CONFIG, 3)
  rng = np.random.default_rng(0)
  ids = rng.integers(1, CONFIG.vocab_size, (3, 10)).astype(np.int32)
  attn = np.ones((3, 10), np.int32)
  attn[1, 6:] = 0
  mask = np.ones(SHAPE, np.float32)
  mask[0] = 0  # every head of layer 0
  mask[1, [1, 3]] = 0
  config, pruned, diff = pruning.pruned_vs_masked(params, CONFIG, mask, ids, attn)
  assert diff < 1e-5
  assert dict(config.pruned_heads) == {0: (0, 1, 2, 3), 1: (1, 3)}
  per_head = 4 * CONFIG.hidden_size * CONFIG.head_dim + 3 * CONFIG.head_dim
  assert bertjax.count_params(params) - bertjax.count_params(pruned) == 6 * per_head


def test_pruned_speedups_time_each_model_in_turn(tmp_path):
  params = bertjax.init(CONFIG, 5)
  b = _batch(9, batch=2, seq=6)
  ids, attn = b["input_ids"], b["attention_mask"]
  order = np.random.default_rng(1).permutation(8)
  got = pruning.pruned_speedups(params, CONFIG, ids, attn, order, targets=(0.25, 0.5), repeats=3)
  assert got["heads_removed"] == [2, 4] and got["fractions"] == [0.25, 0.5]
  assert set(got["times"]) == {"unpruned", "pruned_0.2", "pruned_0.5", "masked_0.4"}
  assert all(len(v["times_s"]) == 3 for v in got["times"].values())
  t = {k: v["median_s"] for k, v in got["times"].items()}
  assert got["speedup"] == [t["unpruned"] / t["pruned_0.2"], t["unpruned"] / t["pruned_0.5"]]
  assert max(got["max_abs_diff_pruned_vs_masked"]) < 1e-5
  per_head = 4 * CONFIG.hidden_size * CONFIG.head_dim + 3 * CONFIG.head_dim
  n = got["parameters"]
  assert n["unpruned"] - n["pruned_0.5"] == 4 * per_head and n["masked_0.4"] == n["unpruned"]
  assert got["real_tokens"] == int(attn.sum())
  got.update(batch=2, length=6)
  assert plots.speedup_bars(got, tmp_path / "speed.png").stat().st_size > 10_000
  with pytest.raises(ValueError, match="permutation of the 8"):
    pruning.pruned_speedups(params, CONFIG, ids, attn, order[:4])
  with pytest.raises(ValueError, match=r"in \(0, 1\), got 1.0"):
    pruning.pruned_speedups(params, CONFIG, ids, attn, order, targets=(1.0,))
  with pytest.raises(ValueError, match="differ at one decimal"):
    pruning.pruned_speedups(params, CONFIG, ids, attn, order, targets=(0.2, 0.24))
