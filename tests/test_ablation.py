"""Ablation sweeps, head importance, pruning and attention overrides, against independent references."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference_numpy as ref  # the float64 NumPy encoder block (tests/reference_numpy.py)

import bertjax
from bertjax.analysis import batching
from bertjax.analysis.attention import overrides
from bertjax.analysis.interventions import ablation
from bertjax.kernels import ABLATIONS

CONFIG = bertjax.BertConfig.preset("tiny", num_hidden_layers=3, vocab_size=101, num_labels=3)
DEPTH, HEADS = CONFIG.depth, CONFIG.num_attention_heads


@pytest.fixture(scope="module")
def params():
  p = bertjax.init(CONFIG, 3, heads=("classifier",))
  # Non-trivial weights everywhere (biases, LayerNorms), so a dropped term cannot pass.
  rng = np.random.default_rng(2)  # NumPy noise: no per-shape compilation
  return jax.tree.map(lambda x: x + 0.08 * rng.standard_normal(x.shape).astype(np.float32), p)


def _batch(seed=0, batch=3, seq=9):
  rng = np.random.default_rng(seed)
  ids = rng.integers(1, CONFIG.vocab_size, (batch, seq)).astype(np.int32)
  mask = np.ones((batch, seq), np.int32)
  mask[1, 6:] = 0
  mask[-1, 3:] = 0
  labels = rng.integers(0, CONFIG.num_labels, batch).astype(np.int32)
  return {
    "input_ids": ids,
    "attention_mask": mask,
    "token_type_ids": np.zeros_like(ids),
    "labels": labels,
  }


BATCHES = [_batch(0), _batch(1)]  # one shape: one compilation per program


@functools.partial(jax.jit, static_argnames=("config", "head_ablation"))
def _losses(params, config, batch, head_mask, layer_mask, head_ablation="scale"):
  """Per-example loss through bertjax.forward itself (the reference), one compilation per kind."""
  out = bertjax.forward(
    params,
    config,
    batch["input_ids"],
    batch["attention_mask"],
    batch["token_type_ids"],
    head_mask=head_mask,
    head_ablation=head_ablation,
    layer_mask=layer_mask,
  )
  logp = jax.nn.log_softmax(bertjax.classify(params, config, out.pooler_output))
  return -jnp.take_along_axis(logp, batch["labels"][:, None], -1)[:, 0]


def _loss_by_forward(params, config, batch, head_mask=None, layer_mask=None, head_ablation="scale"):
  dtype = jnp.float64 if config.dtype == "float64" else jnp.float32
  hm = (
    jnp.ones((config.depth, config.num_attention_heads), dtype) if head_mask is None else head_mask
  )
  lm = jnp.ones(config.depth, dtype) if layer_mask is None else layer_mask
  return np.asarray(
    _losses(
      params,
      config,
      batch,
      jnp.asarray(hm, dtype),
      jnp.asarray(lm, dtype),
      head_ablation=head_ablation,
    )
  )


def test_mask_ablation_equals_weight_surgery(params):
  """Scale 0 == zeroing the head's output-projection slice; uniform == the head's map made uniform."""
  layer, head = 1, 2
  xi = np.ones((DEPTH, HEADS), np.float32)
  xi[layer, head] = 0
  _, (scale,) = ablation.evaluate_masks(
    params, CONFIG, BATCHES, ablation.classification_batch_loss, xi[None]
  )
  surgery = jax.tree.map(lambda a: a, params)
  kernel = params["encoder"]["layers"]["attention"]["output"]["kernel"]
  surgery["encoder"]["layers"]["attention"]["output"]["kernel"] = kernel.at[layer, head].set(0)
  losses = np.concatenate([_loss_by_forward(surgery, CONFIG, b) for b in BATCHES])
  np.testing.assert_allclose(scale, losses.mean(), rtol=1e-5)
  # Uniform: replace the head's attention by a uniform map by hand (the override path).
  _, (uni,) = ablation.evaluate_masks(
    params, CONFIG, BATCHES, ablation.classification_batch_loss, xi[None], head_ablation="uniform"
  )
  by_hand = []
  for b in BATCHES:
    out = overrides.forward_with_overrides(
      params,
      CONFIG,
      b["input_ids"],
      b["attention_mask"],
      b["token_type_ids"],
      overrides={(layer, head): "uniform"},
    )
    logp = jax.nn.log_softmax(bertjax.classify(params, CONFIG, out.pooler_output))
    by_hand.append(-np.asarray(jnp.take_along_axis(logp, b["labels"][:, None], -1)).ravel())
  np.testing.assert_allclose(uni, np.concatenate(by_hand).mean(), rtol=1e-5)
  assert abs(uni - scale) > 1e-4


@pytest.mark.parametrize("kind", ABLATIONS)
def test_sweep_with_prefix_reuse_equals_naive_loop(params, kind):
  prefix = ablation.ablation_sweep(
    params,
    CONFIG,
    BATCHES,
    ablation.classification_batch_loss,
    head_ablations=(kind,),
    chunk_size=3,
  )[kind]
  loop = ablation.ablation_sweep(
    params,
    CONFIG,
    BATCHES,
    ablation.classification_batch_loss,
    head_ablations=(kind,),
    strategy="loop",
  )[kind]
  for name in ("heads", "layers", "keep_one", "layer_skip"):
    np.testing.assert_allclose(getattr(prefix, name), getattr(loop, name), rtol=1e-6, atol=1e-6)
  assert prefix.baseline == loop.baseline
  # ... and the loop agrees with bertjax.forward itself.
  xi = np.ones((DEPTH, HEADS), np.float32)
  xi[2, 1] = 0
  want = np.concatenate(
    [_loss_by_forward(params, CONFIG, b, head_mask=xi, head_ablation=kind) for b in BATCHES]
  ).mean()
  np.testing.assert_allclose(prefix.heads[2, 1], want, rtol=1e-5)
  lm = np.ones(DEPTH, np.float32)
  lm[0] = 0
  want = np.concatenate(
    [_loss_by_forward(params, CONFIG, b, layer_mask=lm) for b in BATCHES]
  ).mean()
  np.testing.assert_allclose(prefix.layer_skip[0], want, rtol=1e-5)
  # Keep-one with only head h of layer l left == mask of ones but that row.
  xi = np.ones((DEPTH, HEADS), np.float32)
  xi[1] = 0
  xi[1, 3] = 1
  want = np.concatenate(
    [_loss_by_forward(params, CONFIG, b, head_mask=xi, head_ablation=kind) for b in BATCHES]
  ).mean()
  np.testing.assert_allclose(prefix.keep_one[1, 3], want, rtol=1e-5)
  assert np.ptp(prefix.heads) > 1e-4


def test_arbitrary_masks_and_strategies_agree(params):
  rng = np.random.default_rng(0)
  masks = (rng.uniform(size=(5, DEPTH, HEADS)) > 0.3).astype(np.float32)
  masks[0] = 1
  masks[1, :2] = 1  # first modified block is 2
  # Chunks of 2 (a remainder of 1 for 5 masks), and the backend's default (1 on CPU).
  assert batching.default_chunk_size() == 1
  results = [
    ablation.evaluate_masks(
      params,
      CONFIG,
      iter(BATCHES),
      ablation.classification_batch_loss,
      masks,
      strategy=s,
      chunk_size=None if s == "vmap" else 2,
    )
    for s in ablation.STRATEGIES
  ]
  for base, values in results[1:]:
    assert base == results[0][0]
    np.testing.assert_allclose(values, results[0][1], atol=1e-6)
  assert results[0][1][0] == results[0][0]  # the all-ones mask is the baseline
  assert batching.first_modified_layer(masks)[0] == DEPTH
  with pytest.raises(ValueError, match=r"head_masks shape \(3, 4\)"):
    ablation.evaluate_masks(
      params, CONFIG, BATCHES, ablation.classification_batch_loss, np.ones((3, 4))
    )
  with pytest.raises(ValueError, match="chunk_size=0 must be a positive int"):
    ablation.evaluate_masks(
      params, CONFIG, BATCHES, ablation.classification_batch_loss, masks, chunk_size=0
    )
  with pytest.raises(ValueError, match="strategy='fast'"):
    ablation.evaluate_masks(
      params, CONFIG, BATCHES, ablation.classification_batch_loss, masks, strategy="fast"
    )


def _row_losses(params, config, batch, last_hidden_state, pooled):
  """Per-row cross-entropy of the classifier: the rows `classification_batch_loss` sums."""
  logp = jax.nn.log_softmax(bertjax.classify(params, config, pooled))
  return -jnp.take_along_axis(logp, batch["labels"][:, None], -1)[:, 0]


def test_per_row_values_are_what_the_sums_add_up(params):
  """`evaluate_masks_per_row` keeps each sentence's value under each mask (the report's
  confidence intervals resample them): every strategy gives the per-example losses of
  `bertjax.forward` with that mask, and their means are `evaluate_masks`' values."""
  rng = np.random.default_rng(1)
  masks = (rng.uniform(size=(4, DEPTH, HEADS)) > 0.3).astype(np.float32)
  masks[1, :2] = 1  # first modified block is 2
  layer_masks = np.ones((4, DEPTH), np.float32)
  layer_masks[3, 1] = 0  # a block skipped
  _, want = ablation.evaluate_masks(
    params, CONFIG, BATCHES, ablation.classification_batch_loss, masks, layer_masks
  )
  for strategy in ablation.STRATEGIES:
    base, rows = ablation.evaluate_masks_per_row(
      params, CONFIG, BATCHES, _row_losses, masks, layer_masks, strategy=strategy, chunk_size=2
    )
    assert base.shape == (6,) and rows.shape == (4, 6)
    np.testing.assert_allclose(rows.mean(1), want, atol=1e-6)
    for m in range(4):
      got = np.concatenate(
        [_loss_by_forward(params, CONFIG, b, masks[m], layer_masks[m]) for b in BATCHES]
      )
      np.testing.assert_allclose(rows[m], got, atol=1e-5)
    np.testing.assert_allclose(
      base, np.concatenate([_loss_by_forward(params, CONFIG, b) for b in BATCHES]), atol=1e-5
    )
  with pytest.raises(ValueError, match="strategy='fast'"):
    ablation.evaluate_masks_per_row(params, CONFIG, BATCHES, _row_losses, masks, strategy="fast")
  with pytest.raises(ValueError, match="batches is empty"):
    ablation.evaluate_masks_per_row(params, CONFIG, [], _row_losses, masks)


def test_sweep_per_row_keeps_the_rows_of_ablation_sweep(params):
  """`sweep_per_row` with `classification_correct`: each sentence's correctness under every
  mask of the sweep is the argmax of `bertjax.forward`'s logits with that mask, and the
  rows' means are `ablation_sweep`'s `classification_accuracy` values."""
  include = ("heads", "layers", "layer_skip")
  want = ablation.ablation_sweep(
    params,
    CONFIG,
    BATCHES,
    ablation.classification_accuracy,
    head_ablations=("uniform",),
    include=include,
    chunk_size=2,
  )["uniform"]
  base, rows = ablation.sweep_per_row(
    params,
    CONFIG,
    BATCHES,
    ablation.classification_correct,
    head_ablation="uniform",
    include=include,
    chunk_size=2,
  )
  assert list(rows) == list(include) and base.shape == (6,)
  assert rows["heads"].shape == (DEPTH * HEADS, 6) and rows["layer_skip"].shape == (DEPTH, 6)
  assert base.mean() == pytest.approx(want.baseline)
  np.testing.assert_allclose(rows["heads"].mean(1), want.heads.reshape(-1))
  np.testing.assert_allclose(rows["layers"].mean(1), want.layers)
  np.testing.assert_allclose(rows["layer_skip"].mean(1), want.layer_skip)

  def correct(head_mask, layer_mask):  # through bertjax.forward itself
    got = []
    for b in BATCHES:
      out = bertjax.forward(
        params,
        CONFIG,
        b["input_ids"],
        b["attention_mask"],
        b["token_type_ids"],
        head_mask=head_mask,
        head_ablation="uniform",
        layer_mask=layer_mask,
      )
      logits = np.asarray(bertjax.classify(params, CONFIG, out.pooler_output))
      got.append(logits.argmax(-1) == b["labels"])
    return np.concatenate(got).astype(np.float64)

  ones, lay = np.ones((DEPTH, HEADS), np.float32), np.ones(DEPTH, np.float32)
  np.testing.assert_array_equal(base, correct(ones, lay))
  head = ones.copy()
  head[1, 2] = 0
  np.testing.assert_array_equal(rows["heads"][1 * HEADS + 2], correct(head, lay))
  skip = lay.copy()
  skip[2] = 0
  np.testing.assert_array_equal(rows["layer_skip"][2], correct(ones, skip))


def test_embedding_cosine_metric_needs_no_head(params):
  result = ablation.ablation_sweep(
    params,
    CONFIG,
    BATCHES,
    ablation.mean_embedding_cosine,
    head_ablations=("scale",),
    include=("heads",),
  )["scale"]
  np.testing.assert_allclose(result.baseline, 1.0, atol=1e-6)
  assert (result.heads < 1).all() and (result.heads > 0).all()
  assert np.isnan(result.layers).all()


@pytest.mark.parametrize("per_example", [True, False])
def test_importance_matches_finite_differences(params, per_example):
  """|dL/dxi| by jax.grad at xi = 1 vs central differences, in float64."""
  batch = BATCHES[0]
  with jax.enable_x64(True):
    config = CONFIG.replace(dtype="float64")
    p64 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), params)
    got = ablation.head_importance(
      p64,
      config,
      [batch],
      ablation.classification_batch_loss,
      per_example=per_example,
      normalize_layers=False,
    )
    eps = 1e-5
    # All 2 * L * N perturbed masks at once: d loss_b / d xi by central differences.
    steps = eps * np.eye(DEPTH * HEADS).reshape(-1, DEPTH, HEADS)
    masks = jnp.asarray(np.concatenate([1 + steps, 1 - steps]))
    ones = jnp.ones(DEPTH, jnp.float64)
    losses = jax.vmap(lambda xi: _losses(p64, config, batch, xi, ones))(masks)  # (2LN, B)
    grads = np.asarray((losses[: DEPTH * HEADS] - losses[DEPTH * HEADS :]) / (2 * eps))
    grads = grads.reshape(DEPTH, HEADS, -1)
    want = np.abs(grads).mean(-1) if per_example else np.abs(grads.mean(-1))
  assert want.max() > 1e-3
  np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-9)
  normed = ablation.head_importance(
    params, CONFIG, [batch], ablation.classification_batch_loss, per_example=per_example
  )
  np.testing.assert_allclose(np.linalg.norm(normed, axis=-1), 1.0, rtol=1e-5)
  np.testing.assert_allclose(normed, want / np.linalg.norm(want, axis=-1, keepdims=True), rtol=2e-3)


def test_iterative_pruning(params):
  result = ablation.iterative_pruning(
    params,
    CONFIG,
    BATCHES,
    ablation.classification_batch_loss,
    ablation.classification_accuracy,
    step=0.25,
    max_fraction=0.5,
  )
  np.testing.assert_allclose(result.fractions, [0, 0.25, 0.5])
  pruned = (result.masks == 0).sum((1, 2))
  assert pruned.tolist() == [0, 3, 6]
  assert (result.masks[2] <= result.masks[1]).all()  # masks only shrink
  # The first step removes the heads least important at the full mask.
  imp = ablation.head_importance(
    params, CONFIG, BATCHES, ablation.classification_batch_loss
  ).ravel()
  assert set(np.flatnonzero(result.masks[1].ravel() == 0)) == set(np.argsort(imp)[:3])
  _, (acc,) = ablation.evaluate_masks(
    params, CONFIG, BATCHES, ablation.classification_accuracy, result.masks[2][None]
  )
  assert result.metrics[2] == acc


def test_no_override_equals_forward(params):
  b = BATCHES[0]
  want = bertjax.forward(
    params,
    CONFIG,
    b["input_ids"],
    b["attention_mask"],
    b["token_type_ids"],
    output_hidden_states=True,
    output_attentions=True,
  )
  got = overrides.forward_with_overrides(
    params,
    CONFIG,
    b["input_ids"],
    b["attention_mask"],
    b["token_type_ids"],
    output_hidden_states=True,
    output_attentions=True,
  )
  m = b["attention_mask"].astype(bool)
  np.testing.assert_allclose(
    np.asarray(got.hidden_states)[:, m], np.asarray(want.hidden_states)[:, m], atol=1e-5
  )
  np.testing.assert_allclose(np.asarray(got.attentions), np.asarray(want.attentions), atol=1e-6)
  np.testing.assert_allclose(
    np.asarray(got.pooler_output), np.asarray(want.pooler_output), atol=1e-5
  )


def test_previous_token_override_by_hand(params):
  """Head 1 of block 0 attends to the previous token: recompute block 0 with NumPy."""
  b = BATCHES[0]
  ids, mask = b["input_ids"], b["attention_mask"]
  got = overrides.forward_with_overrides(
    params,
    CONFIG,
    ids,
    mask,
    overrides={(0, 1): "prev"},
    output_hidden_states=True,
    output_attentions=True,
  )
  x = np.asarray(bertjax.embed(params, CONFIG, ids), np.float64)
  T = ids.shape[1]
  prev = np.zeros((T, T))
  prev[0, 0] = 1
  prev[np.arange(1, T), np.arange(T - 1)] = 1

  def override(probs):
    probs = probs.copy()
    probs[:, 1] = prev
    return probs

  y, _ = ref.encoder_layer(
    ref.layer_params(params, 0), x, mask, CONFIG.layer_norm_eps, edit_probs=override
  )
  m = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(got.hidden_states[1])[m], y[m], atol=2e-5)
  np.testing.assert_allclose(np.asarray(got.attentions[0, 0, 1]), prev, atol=0)
  # Padded rows are zero; the previous token of a short sequence stays inside it.
  assert np.asarray(got.attentions[0, 2, 1])[3:].sum() == 0
  plain = bertjax.forward(params, CONFIG, ids, mask).last_hidden_state
  assert np.abs(np.asarray(plain)[m] - np.asarray(got.last_hidden_state)[m]).max() > 1e-3


def test_patterns_and_bad_overrides():
  maps = np.asarray(overrides.positional_patterns(np.array([4]), 6))[:, 0]  # (P, T, T)
  np.testing.assert_allclose(maps[:, :4].sum(-1), 1.0)
  assert maps[:, 4:].sum() == 0 and maps[:, :, 4:].sum() == 0
  by = dict(zip(overrides.PATTERNS, maps))
  assert by["next"][3, 3] == 1 and by["next"][1, 2] == 1 and by["first"][2, 0] == 1
  np.testing.assert_allclose(by["left"][2, :3], 1 / 3)
  np.testing.assert_allclose(by["right"][1, 1:4], 1 / 3)
  with pytest.raises(ValueError, match="'diagonal'"):
    overrides.override_codes(CONFIG, {(0, 0): "diagonal"})
  with pytest.raises(ValueError, match=r"\(5, 0\)"):
    overrides.override_codes(CONFIG, {(5, 0): "prev"})


def test_pruning_orders_extend_the_iterative_masks():
  rng = np.random.default_rng(1)
  shape = (3, 4)
  importance = rng.random(shape)
  steps = np.ones((4, *shape), np.float32)
  first, second = [5, 0, 9], [2, 11, 7]
  for i, heads in ((1, first), (2, first + second), (3, first + second + [1, 4])):
    steps[i].ravel()[heads] = 0
  order = ablation.pruning_order(steps, importance)
  assert sorted(order.tolist()) == list(range(12))
  # Each step's heads come before the next step's, so every step's mask is a prefix.
  masks = ablation.order_masks(order, [0, 3, 6, 8], shape)
  np.testing.assert_array_equal(masks, steps)
  # Within a step, least important first; never-pruned heads last, by importance.
  assert list(order[:3]) == sorted(first, key=lambda h: importance.ravel()[h])
  rest = [h for h in range(12) if h not in first + second + [1, 4]]
  assert list(order[8:]) == sorted(rest, key=lambda h: importance.ravel()[h])
