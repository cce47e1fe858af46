"""Training pieces: losses, optimizer, schedules, train step, accumulation, stacking, checkpoints."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import bertjax
from bertjax.training import checkpoint as ck
from bertjax.training import losses, optim, stacking
from bertjax.training import state as ts
from bertjax.training import step as tstep

CFG = bertjax.BertConfig.preset("tiny", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _batch(rng, b=8, t=16, p=4, vocab=1000, objective="nsp"):
  ids = rng.integers(5, vocab, (b, t)).astype(np.int32)
  lengths = rng.integers(t // 2, t + 1, b)
  mask = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)
  positions = np.stack([rng.choice(np.arange(1, t // 2), p, replace=False) for _ in range(b)])
  weights = (rng.random((b, p)) < 0.8).astype(np.float32)
  weights[:, 0] = 1.0
  out = dict(
    input_ids=ids,
    attention_mask=mask,
    token_type_ids=np.zeros((b, t), np.int32),
    mlm_positions=positions.astype(np.int32),
    mlm_ids=rng.integers(5, vocab, (b, p)).astype(np.int32),
    mlm_weights=weights,
  )
  if objective == "nsp":
    out["next_sentence_labels"] = rng.integers(0, 2, b).astype(np.int32)
  return out


# Losses ----------------------------------------------------------------------


def test_mlm_loss_matches_full_vocabulary_reference():
  params = bertjax.init(CFG, 0, heads=("mlm",))
  batch = _batch(np.random.default_rng(0))
  out = bertjax.forward(params, CFG, batch["input_ids"], batch["attention_mask"])
  hidden = out.last_hidden_state
  loss, acc = losses.mlm_loss(
    params, CFG, hidden, batch["mlm_positions"], batch["mlm_ids"], batch["mlm_weights"]
  )
  full = np.asarray(jax.nn.log_softmax(bertjax.mlm_logits(params, CFG, hidden), -1))  # (B, T, V)
  at_pos = np.take_along_axis(full, batch["mlm_positions"][..., None], 1)  # (B, P, V)
  nll = -np.take_along_axis(at_pos, batch["mlm_ids"][..., None], -1)[..., 0]  # (B, P)
  w = batch["mlm_weights"]
  np.testing.assert_allclose(loss, (nll * w).sum() / w.sum(), rtol=1e-5)
  assert 0.0 <= float(acc) <= 1.0


def test_mlm_sequence_terms_are_each_sequences_share_of_the_sums():
  params = bertjax.init(CFG, 0, heads=("mlm",))
  batch = _batch(np.random.default_rng(1))
  hidden = bertjax.forward(params, CFG, batch["input_ids"], batch["attention_mask"])
  hidden = hidden.last_hidden_state
  args = (batch["mlm_positions"], batch["mlm_ids"], batch["mlm_weights"])
  per = losses.mlm_sequence_terms(params, CFG, hidden, *args)
  whole = losses.mlm_loss_terms(params, CFG, hidden, *args)
  full = np.asarray(jax.nn.log_softmax(bertjax.mlm_logits(params, CFG, hidden), -1), np.float64)
  at_pos = np.take_along_axis(full, batch["mlm_positions"][..., None], 1)  # (B, P, V)
  nll = -np.take_along_axis(at_pos, batch["mlm_ids"][..., None], -1)[..., 0]  # (B, P)
  w = batch["mlm_weights"]
  assert per["loss_sum"].shape == (8,)
  np.testing.assert_allclose(per["loss_sum"], (nll * w).sum(-1), rtol=1e-5)
  np.testing.assert_allclose(per["count"], w.sum(-1))
  for k in ("loss_sum", "correct_sum", "count"):
    np.testing.assert_allclose(np.sum(per[k]), whole[k], rtol=1e-5)


def test_classification_and_token_losses():
  logits = jnp.array([[2.0, 0.0], [0.0, 3.0], [1.0, 1.0]])
  labels = jnp.array([0, 1, 1])
  loss, acc = losses.classification_loss(logits, labels)
  ref = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
  np.testing.assert_allclose(loss, ref, rtol=1e-6)
  assert float(acc) == pytest.approx(2 / 3)  # argmax of the tie is 0
  mse, _ = losses.classification_loss(jnp.array([[1.0], [3.0]]), jnp.array([0.0, 1.0]))
  assert float(mse) == pytest.approx((1 + 4) / 2)
  tok_logits = jnp.zeros((1, 3, 4)).at[0, 0, 2].set(5.0)
  tok_labels = jnp.array([[2, -100, -100]])
  loss, acc = losses.token_classification_loss(tok_logits, tok_labels)
  np.testing.assert_allclose(loss, -jax.nn.log_softmax(tok_logits[0, 0])[2], rtol=1e-4)
  assert float(acc) == 1.0
  nsp, _ = losses.sentence_loss(jnp.zeros((4, 2)), jnp.array([0, 1, 0, 1]))
  assert float(nsp) == pytest.approx(np.log(2), rel=1e-6)


# Optimizer -------------------------------------------------------------------


def test_decay_mask_excludes_biases_and_layernorm():
  params = bertjax.init(CFG, 0, heads=("mlm", "nsp"))
  mask = optim.decay_mask(params)
  flat = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(mask)}
  for name, decays in flat.items():
    if "bias" in name or "LayerNorm" in name:
      assert decays is False, name
    else:
      assert decays is True, name
  assert flat["['encoder']['layers']['attention']['query']['kernel']"] is True
  assert flat["['embeddings']['word_embeddings']['embedding']"] is True
  assert flat["['encoder']['layers']['LayerNorm']['scale']"] is False
  # With zero gradients only decay moves parameters: LayerNorm and biases stay, kernels shrink.
  small = {
    "dense": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones(2)},
    "LayerNorm": {"scale": jnp.ones(2), "bias": jnp.ones(2)},
  }
  for name in optim.OPTIMIZERS:
    tx = optim.make_optimizer(name, 0.1, weight_decay=0.5, clip_norm=None)
    updates, _ = tx.update(jax.tree.map(jnp.zeros_like, small), tx.init(small), small)
    assert float(jnp.abs(updates["LayerNorm"]["scale"]).max()) == 0.0, name
    assert float(jnp.abs(updates["dense"]["bias"]).max()) == 0.0, name
    assert float(updates["dense"]["kernel"].max()) < 0.0, name
  tx = optim.make_optimizer("adamw", 0.1, weight_decay=0.5, clip_norm=None)
  updates, _ = tx.update(jax.tree.map(jnp.zeros_like, small), tx.init(small), small)
  np.testing.assert_allclose(updates["dense"]["kernel"], -0.1 * 0.5, rtol=1e-6)


def test_learning_rate_schedules():
  lin = optim.learning_rate_schedule(1e-3, 100, 10, "linear")
  for s, v in [(0, 0.0), (5, 5e-4), (10, 1e-3), (55, 5e-4), (100, 0.0), (200, 0.0)]:
    assert float(lin(s)) == pytest.approx(v, abs=1e-9), s
  cos = optim.learning_rate_schedule(1e-3, 110, 10, "cosine", end_ratio=0.1)
  assert float(cos(10)) == pytest.approx(1e-3)
  assert float(cos(60)) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5), rel=1e-5)
  assert float(cos(110)) == pytest.approx(1e-4, rel=1e-5)
  with pytest.raises(ValueError, match="decay='exp'"):
    optim.learning_rate_schedule(1e-3, 10, 0, "exp")
  with pytest.raises(ValueError, match="warmup_steps=20"):
    optim.learning_rate_schedule(1e-3, 10, 20)
  with pytest.raises(ValueError, match="name='sgd'"):
    optim.make_optimizer("sgd")


def test_lamb_and_clipping_match_a_numpy_reference():
  """Two LAMB steps after global-norm clipping, against You et al.'s update written in NumPy."""
  rng = np.random.default_rng(0)
  params = {"w": jnp.asarray(rng.standard_normal((3, 4))), "bias": jnp.asarray(rng.normal(size=4))}
  lr, wd, clip, b1, b2, eps = 1e-2, 0.01, 1.0, 0.9, 0.999, 1e-6
  tx = optim.make_optimizer("lamb", lr, weight_decay=wd, clip_norm=clip, b1=b1, b2=b2, eps=eps)
  state = tx.init(params)
  p = {k: np.asarray(v, np.float64) for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in p.items()}
  v = {k: np.zeros_like(x) for k, x in p.items()}
  for t in (1, 2):
    grads = {"w": rng.normal(scale=50.0, size=(3, 4)), "bias": rng.normal(scale=50.0, size=4)}
    updates, state = tx.update(jax.tree.map(jnp.asarray, grads), state, params)
    params = optax.apply_updates(params, updates)
    norm = np.sqrt(sum((g**2).sum() for g in grads.values()))
    for k, g in grads.items():
      g = g * min(1.0, clip / norm)
      m[k] = b1 * m[k] + (1 - b1) * g
      v[k] = b2 * v[k] + (1 - b2) * g * g
      r = (m[k] / (1 - b1**t)) / (np.sqrt(v[k] / (1 - b2**t)) + eps)
      if k == "w":  # no weight decay on biases
        r = r + wd * p[k]
      trust = np.linalg.norm(p[k]) / np.linalg.norm(r)
      p[k] = p[k] - lr * trust * r
    for k, want in p.items():
      np.testing.assert_allclose(np.asarray(params[k]), want, rtol=2e-5, atol=1e-6)
  # The clipping acted: a raw gradient of norm ~50 per entry was scaled down to norm 1.
  assert norm > 100 * clip


# Train step ------------------------------------------------------------------


@functools.cache
def _adamw_step():
  """One compiled AdamW step on CFG, shared by the tests below (compiling is the slow part)."""
  tx = optim.make_optimizer("adamw", 1e-3)
  return tx, tstep.make_train_step(CFG, tx)


def test_gradient_accumulation_equals_large_batch():
  cfg = CFG.replace(num_hidden_layers=1)
  params = bertjax.init(cfg, 1, heads=("mlm", "nsp"))
  batch = _batch(np.random.default_rng(1), b=8)  # uneven mlm_weights across micro-batches
  one = jax.jit(tstep.make_loss_and_grad(cfg, accumulation_steps=1))
  four = jax.jit(tstep.make_loss_and_grad(cfg, accumulation_steps=4))
  l1, m1, g1 = one(params, batch, jax.random.key(0))
  l4, m4, g4 = four(params, batch, jax.random.key(0))
  np.testing.assert_allclose(l1, l4, rtol=1e-5)
  np.testing.assert_allclose(m1["mlm_loss"], m4["mlm_loss"], rtol=1e-5)
  np.testing.assert_allclose(m1["nsp_accuracy"], m4["nsp_accuracy"], rtol=1e-6)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g4)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_overfit_one_batch_mlm_bfloat16():
  """MLM loss on one fixed batch goes near zero; compute in bfloat16, weights float32."""
  cfg = CFG.replace(dtype="bfloat16")
  params = bertjax.init(CFG, 0, heads=("mlm",))
  batch = _batch(np.random.default_rng(2), b=8, t=16, p=4, objective="none")
  sched = optim.learning_rate_schedule(2e-3, 300, 10)
  tx = optim.make_optimizer("adamw", sched, weight_decay=0.0)
  state = ts.create_train_state(params, tx, 0)
  step = tstep.make_train_step(cfg, tx, sched, objective="none")
  first = None
  for _ in range(300):
    state, m = step(state, batch)
    first = float(m["mlm_loss"]) if first is None else first
  assert first > 5.0
  assert float(m["mlm_loss"]) < 0.1, float(m["mlm_loss"])
  assert float(m["mlm_accuracy"]) == 1.0
  assert jax.tree.leaves(state.params)[0].dtype == jnp.float32
  assert int(state.step) == 300
  assert float(m["learning_rate"]) == pytest.approx(float(sched(299)), rel=1e-4)
  assert set(m) >= {"loss", "mlm_loss", "mlm_accuracy", "grad_norm", "learning_rate", "finite"}


def test_nonfinite_step_is_flagged_and_skipped():
  params = bertjax.init(CFG, 0, heads=("mlm", "nsp"))
  batch = _batch(np.random.default_rng(3))
  batch["mlm_weights"] = batch["mlm_weights"] * np.float32("nan")
  tx, step = _adamw_step()
  state = ts.create_train_state(params, tx, 0)
  new, m = step(state, batch)
  assert not bool(m["finite"])
  assert int(new.step) == 0
  for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(state.params)):
    np.testing.assert_array_equal(a, b)


# Stacking --------------------------------------------------------------------


def test_parse_schedule():
  assert stacking.parse_schedule("3:50000,6:70000,12") == [
    stacking.Stage(3, 50000),
    stacking.Stage(6, 70000),
    stacking.Stage(12, None),
  ]
  assert stacking.stage_boundaries(stacking.parse_schedule("3:5,6:7,12")) == [5, 12]
  assert [
    stacking.stage_at(stacking.parse_schedule("3:5,6:7,12"), s) for s in (0, 4, 5, 11, 12)
  ] == [0, 0, 1, 1, 2]
  for bad, match in [
    ("", "empty"),
    ("3:50,6:x,12", "'6:x' must hold integers"),
    ("3:50,6", None),
    ("3:50,12:10", "last stage '12:10'"),
    ("3,6", "stage 0 '3' needs a step count"),
    ("6:10,3", "layers must increase"),
    ("0:10,3", "layers=0"),
    ("3:0,6", "steps=0"),
    ("3:1:2,6", "'3:1:2'"),
  ]:
    if match is None:
      stacking.parse_schedule(bad)
      continue
    with pytest.raises(ValueError, match=match):
      stacking.parse_schedule(bad)


def test_grow_copies_layers_and_moments():
  cfg = CFG
  params = bertjax.init(cfg, 0, heads=("mlm", "nsp"))
  tx, step = _adamw_step()
  state = ts.create_train_state(params, tx, 0)
  state, _ = step(state, _batch(np.random.default_rng(4)))
  new_cfg, p, o = stacking.grow(cfg, state.params, state.opt_state, 5)
  assert new_cfg.num_hidden_layers == 5 and new_cfg == cfg.replace(num_hidden_layers=5)
  q = state.params["encoder"]["layers"]["attention"]["query"]["kernel"]
  q5 = p["encoder"]["layers"]["attention"]["query"]["kernel"]
  assert q5.shape[0] == 5
  for i in range(5):
    np.testing.assert_array_equal(q5[i], q[i % 2])
  np.testing.assert_array_equal(
    p["embeddings"]["word_embeddings"]["embedding"],
    state.params["embeddings"]["word_embeddings"]["embedding"],
  )
  adam = o[1][0]  # chain(clip, adamw) -> adamw = chain(scale_by_adam, ...)
  old_adam = state.opt_state[1][0]
  mu = adam.mu["encoder"]["layers"]["intermediate"]["kernel"]
  old_mu = old_adam.mu["encoder"]["layers"]["intermediate"]["kernel"]
  assert float(jnp.abs(old_mu).max()) > 0
  for i in range(5):
    np.testing.assert_array_equal(mu[i], old_mu[i % 2])
    np.testing.assert_array_equal(
      adam.nu["encoder"]["layers"]["intermediate"]["kernel"][i],
      old_adam.nu["encoder"]["layers"]["intermediate"]["kernel"][i % 2],
    )
  assert int(adam.count) == int(old_adam.count) == 1
  # Training continues with the grown state and the same schedule step.
  grown = state.replace(params=p, opt_state=o)
  grown, m = tstep.make_train_step(new_cfg, tx)(grown, _batch(np.random.default_rng(5)))
  assert bool(m["finite"]) and int(grown.step) == 2 and int(grown.opt_state[1][0].count) == 2
  # Reset: zero moments, counts kept.
  _, _, o0 = stacking.grow(cfg, state.params, state.opt_state, 4, reset_moments=True)
  assert all(float(jnp.abs(x).max()) == 0 for x in jax.tree.leaves(o0[1][0].mu))
  assert int(o0[1][0].count) == 1


def test_grow_rejects_albert_and_shrinking():
  albert = bertjax.BertConfig.preset(
    "tiny", model_type="albert", num_hidden_groups=1, embedding_size=32
  )
  with pytest.raises(ValueError, match="ALBERT shares its layers"):
    stacking.grow(albert, {}, None, 4)
  with pytest.raises(ValueError, match="new_layers=2"):
    stacking.grow(CFG, {}, None, 2)
  with pytest.raises(TypeError, match=r"grow takes \(config, params, opt_state, new_layers\)"):
    stacking.grow({}, None, CFG, 4)  # the order before (params, opt_state, config)


# Checkpoints -----------------------------------------------------------------


def _state(seed):
  params = bertjax.init(CFG.replace(num_hidden_layers=1), seed, heads=("mlm",))
  tx = optim.make_optimizer("adamw", 1e-3)
  return ts.create_train_state(params, tx, seed)


@pytest.mark.parametrize("damage", ["delete", "truncate"])
def test_corrupt_checkpoint_falls_back(tmp_path, damage):
  cfg = CFG.replace(num_hidden_layers=1)
  mgr = ck.Checkpointer(tmp_path, max_to_keep=3, save_every=1)
  states = {}
  for s in (1, 2):
    states[s] = _state(s).replace(step=jnp.int32(s))
    assert mgr.save(s, states[s], config=cfg, data_state={"step": s}, stage=0)
  mgr.close()
  files = sorted(
    p
    for p in (tmp_path / "2" / "state").rglob("*")
    if p.is_file() and p.stat().st_size > 1000 and "ocdbt.process_0" in str(p)
  )
  victim = max(files, key=lambda p: p.stat().st_size)
  if damage == "delete":
    victim.unlink()
  else:
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
  mgr = ck.Checkpointer(tmp_path, max_to_keep=3)
  with pytest.warns(RuntimeWarning, match="checkpoint step 2 .*falling back"):
    state, meta = mgr.restore_latest(_state(0))
  assert meta["step"] == 1 and meta["data_state"] == {"step": 1}
  assert int(state.step) == 1
  for a, b in zip(
    jax.tree.leaves(ts.state_to_tree(state)), jax.tree.leaves(ts.state_to_tree(states[1]))
  ):
    np.testing.assert_array_equal(a, b)
  assert ck.config_from_json(meta["config"]) == cfg
  mgr.close()


def test_export_checkpoint_to_hf(tmp_path):
  cfg = CFG.replace(num_hidden_layers=1)
  st = _state(7)
  mgr = ck.Checkpointer(tmp_path / "ck", save_every=1, async_save=False)
  mgr.save(3, st, config=cfg)
  mgr.close()
  out_cfg = ck.export_hf(tmp_path / "ck", tmp_path / "hf")
  assert json.loads((tmp_path / "hf" / "config.json").read_text())["num_hidden_layers"] == 1
  cfg2, params = bertjax.from_hf(tmp_path / "hf")
  assert cfg2.num_hidden_layers == out_cfg.num_hidden_layers == 1
  np.testing.assert_array_equal(
    params["embeddings"]["word_embeddings"]["embedding"],
    st.params["embeddings"]["word_embeddings"]["embedding"],
  )
