"""Distillation objective: DistilBERT's and TinyBERT's losses by hand, student initialisation."""

import jax
import numpy as np
import pytest

import bertjax
from bertjax.training import distill as D
from bertjax.training import step as St
from bertjax.training.objectives import init_objective_params


def _teacher(max_positions=24):
  cfg = bertjax.BertConfig(
    vocab_size=61,
    hidden_size=32,
    num_hidden_layers=4,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=max_positions,
  )
  return cfg, bertjax.init(cfg, 0, ("mlm",))


def _batch(b=3, t=12, p=3):
  r = np.random.default_rng(0)
  mask = np.ones((b, t), np.int32)
  mask[1, 9:] = 0
  w = np.ones((b, p), np.float32)
  w[2, 2] = 0
  return {
    "input_ids": r.integers(5, 61, (b, t)).astype(np.int32),
    "attention_mask": mask,
    "token_type_ids": np.zeros((b, t), np.int32),
    "mlm_positions": np.sort(r.choice(np.arange(1, 9), (b, p)), 1).astype(np.int32),
    "mlm_ids": r.integers(5, 61, (b, p)).astype(np.int32),
    "mlm_weights": w,
  }


def test_student_takes_every_other_teacher_layer():
  t_cfg, t_params = _teacher()
  s_cfg, s_params = D.student_from_teacher(t_cfg, t_params)
  assert s_cfg.num_hidden_layers == 2
  for s, t in zip(
    jax.tree.leaves(s_params["encoder"]["layers"]),
    jax.tree.leaves(t_params["encoder"]["layers"]),
    strict=True,
  ):
    np.testing.assert_array_equal(s, t[np.array([0, 2])])
  np.testing.assert_array_equal(s_params["mlm"]["bias"], t_params["mlm"]["bias"])
  with pytest.raises(ValueError, match="layers=\\(0, 7\\)"):
    D.student_from_teacher(t_cfg, t_params, (0, 7))
  albert = bertjax.BertConfig.preset(
    "albert-base", num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=48
  )
  with pytest.raises(ValueError, match="shared layers"):
    D.student_from_teacher(albert, bertjax.init(albert, 0, ("mlm",)))


def _log_softmax(z):
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_distillation_losses_match_numpy():
  t_cfg, t_params = _teacher()
  s_cfg, s_params = D.student_from_teacher(t_cfg, t_params)
  s_params = jax.tree.map(
    lambda a: a + 0.05 * jax.random.normal(jax.random.key(1), a.shape), s_params
  )
  obj = D.Distillation(t_cfg, t_params, tinybert=True)
  params = {**s_params, **init_objective_params((obj,), s_cfg, 3)}
  assert set(params) - set(s_params) == {"distill_proj"}
  batch = _batch()
  f = jax.jit(St.make_loss_and_grad(s_cfg, objective=(obj,), deterministic=True))
  loss, m, grads = f(params, batch, jax.random.key(0))
  assert float(np.abs(grads["distill_proj"]["kernel"]).sum()) > 0

  run = lambda p, c: bertjax.forward(
    p,
    c,
    batch["input_ids"],
    batch["attention_mask"],
    output_hidden_states=True,
    output_attentions=True,
  )
  so, to = run(s_params, s_cfg), run(t_params, t_cfg)
  rows = np.arange(3)[:, None]
  pos, w = batch["mlm_positions"], batch["mlm_weights"]
  zs = np.asarray(bertjax.mlm_logits(s_params, s_cfg, so.last_hidden_state[rows, pos]), np.float64)
  zt = np.asarray(bertjax.mlm_logits(t_params, t_cfg, to.last_hidden_state[rows, pos]), np.float64)
  T = 2.0
  soft = np.exp(_log_softmax(zt / T))
  want_ce = (-(soft * _log_softmax(zs / T)).sum(-1) * T**2 * w).sum() / w.sum()
  want_mlm = (
    -np.take_along_axis(_log_softmax(zs), batch["mlm_ids"][..., None], -1)[..., 0] * w
  ).sum() / w.sum()
  real = batch["attention_mask"].astype(bool)
  hs, ht = (np.asarray(o.last_hidden_state, np.float64)[real] for o in (so, to))
  want_cos = np.mean(
    1 - (hs * ht).sum(-1) / np.linalg.norm(hs, axis=-1) / np.linalg.norm(ht, axis=-1)
  )
  proj = jax.tree.map(lambda a: np.asarray(a, np.float64), params["distill_proj"])
  sh = np.asarray(so.hidden_states, np.float64) @ proj["kernel"] + proj["bias"]  # (3, B, T, H)
  th = np.asarray(to.hidden_states, np.float64)[[0, 2, 4]]
  want_hidden = ((sh - th) ** 2).mean(-1).sum(0)[real].mean()
  sa = np.asarray(so.attentions, np.float64)
  ta = np.asarray(to.attentions, np.float64)[[1, 3]]  # teacher layers 2 and 4
  keys = real[None, :, None, None, :]  # TinyBERT's l x l maps: real keys, mean over heads
  per_row = ((sa - ta) ** 2 * keys).sum(-1) / real.sum(-1)[None, :, None, None]
  want_attn = per_row.mean(2).sum(0)[real].mean()
  for name, want in [
    ("distill_ce", want_ce),
    ("mlm", want_mlm),
    ("cos", want_cos),
    ("hidden", want_hidden),
    ("attn", want_attn),
  ]:
    np.testing.assert_allclose(m[f"{name}_loss"], want, rtol=2e-5, atol=1e-7, err_msg=name)
  total = 5 * want_ce + 2 * want_mlm + want_cos + want_hidden + want_attn
  np.testing.assert_allclose(loss, total, rtol=2e-5)
  # The teacher is frozen: no gradient reaches it (its parameters are not in the tree).
  assert set(grads) == set(params)
  # Only what is measured has an accuracy (the distances had a constant 0 before).
  assert {k for k in m if k.endswith("_accuracy")} == {"mlm_accuracy", "distill_ce_accuracy"}


def test_distillation_losses_do_not_depend_on_padding():
  # The same three sentences padded to 12, 20 and 40 tokens: TinyBERT's attention term
  # averaged over every key column, padding included (0.242, 0.145, 0.0726 in the issue).
  t_cfg, t_params = _teacher(max_positions=40)
  s_cfg, s_params = D.student_from_teacher(t_cfg, t_params)
  s_params = jax.tree.map(
    lambda a: a + 0.05 * jax.random.normal(jax.random.key(1), a.shape), s_params
  )
  obj = D.Distillation(t_cfg, t_params, tinybert=True)
  params = {**s_params, **init_objective_params((obj,), s_cfg, 3)}
  f = jax.jit(St.make_loss_and_grad(s_cfg, objective=(obj,), deterministic=True))
  short = _batch()
  lengths = short["attention_mask"].sum(1)
  metrics = []
  for t in (12, 20, 40):
    batch = dict(short)
    for key in ("input_ids", "attention_mask", "token_type_ids"):
      batch[key] = np.zeros((3, t), np.int32)
      for r, n in enumerate(lengths):
        batch[key][r, :n] = short[key][r, :n]
    metrics.append(f(params, batch, jax.random.key(0))[1])
  for name in ("attn", "hidden", "cos", "distill_ce", "mlm"):
    got = [float(m[f"{name}_loss"]) for m in metrics]
    np.testing.assert_allclose(got, got[0], rtol=1e-5, err_msg=name)
  assert float(metrics[0]["attn_loss"]) > 0


def test_task_distillation_matches_numpy():
  t_cfg = bertjax.BertConfig(
    vocab_size=61,
    hidden_size=32,
    num_hidden_layers=4,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=24,
    num_labels=3,
  )
  t_params = bertjax.init(t_cfg, 0, ("classifier",))
  s_cfg, s_params = D.student_from_teacher(t_cfg, t_params)
  s_params = jax.tree.map(
    lambda a: a + 0.05 * jax.random.normal(jax.random.key(1), a.shape), s_params
  )
  batch = _batch()
  batch["labels"] = np.array([0, 2, 1], np.int32)
  obj = D.TaskDistillation(t_cfg, t_params, temperature=3.0, alpha=0.7)
  f = jax.jit(
    St.make_loss_and_grad(s_cfg, task="classification", objective=(obj,), deterministic=True)
  )
  loss, m, _ = f(s_params, batch, jax.random.key(0))
  logits = lambda p, c: np.asarray(
    bertjax.head_logits(
      p, c, bertjax.forward(p, c, batch["input_ids"], batch["attention_mask"]), "classifier"
    ),
    np.float64,
  )
  zs, zt = logits(s_params, s_cfg), logits(t_params, t_cfg)
  hard = -_log_softmax(zs)[np.arange(3), batch["labels"]].mean()
  soft = -(np.exp(_log_softmax(zt / 3)) * _log_softmax(zs / 3)).sum(-1).mean() * 9
  np.testing.assert_allclose(m["cls_loss"], hard, rtol=1e-5)
  np.testing.assert_allclose(m["distill_ce_loss"], soft, rtol=1e-5)
  np.testing.assert_allclose(loss, 0.3 * hard + 0.7 * soft, rtol=1e-5)
  with pytest.raises(ValueError, match="no 'token_classifier' head"):
    D.TaskDistillation(t_cfg, t_params, task="token_classification")


def _classifier_teacher(layers=4):
  config = bertjax.BertConfig(
    vocab_size=120,
    hidden_size=32,
    num_hidden_layers=layers,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=16,
    num_labels=5,
    use_pooler=False,
  )
  params = bertjax.init(config, 3, heads=("token_classifier",))
  return config, jax.tree.map(
    lambda a: a + 0.05 * jax.random.normal(jax.random.key(1), a.shape), params
  )


def test_shared_model_runs_the_chosen_teacher_layer_at_every_depth():
  t_config, t_params = _classifier_teacher()
  config, params = D.shared_student_from_teacher(t_config, t_params, 2)
  assert (config.model_type, config.depth, config.num_param_layers) == ("albert", 4, 1)
  # The same computation as BERT with the teacher's layer 2 in all four places.
  tiled = {
    **t_params,
    "encoder": {
      **t_params["encoder"],
      "layers": jax.tree.map(lambda a: np.repeat(a[2:3], 4, axis=0), t_params["encoder"]["layers"]),
    },
  }
  ids = np.random.default_rng(0).integers(0, 120, (2, 9))
  mask = np.ones_like(ids)
  mask[1, 6:] = 0
  ours = bertjax.forward(params, config, ids, mask).last_hidden_state
  want = bertjax.forward(tiled, t_config, ids, mask).last_hidden_state
  np.testing.assert_allclose(ours, want, atol=1e-5)
  stored = bertjax.count_params(params) - bertjax.count_params(t_params)
  layer = bertjax.count_params(t_params["encoder"]["layers"]) // 4
  assert stored == 32 * 32 + 32 - 3 * layer  # + the E -> H map, - three layers
  for layer in (-1, 4):
    with pytest.raises(ValueError, match=rf"layer={layer} must be a teacher layer in \[0, 4\)"):
      D.shared_student_from_teacher(t_config, t_params, layer)
  with pytest.raises(ValueError, match="model_type='albert'"):
    D.shared_student_from_teacher(config, params, 0)
