"""Checks of the fine-tuning protocol of Kovaleva et al.'s random-initialisation test, each
against an independent computation: group splits, the surface-cue baselines, batched
accuracy against `finetune.evaluate`, and the early-stopping rule."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax.tasks import acceptability, baselines
from bertjax.tasks.acceptability import split_groups
from bertjax.tasks.sentences import labelled_sentences
from bertjax.training import finetune as ft
from bertjax.training.early_stopping import (
  EarlyStopping,
  padded_accuracy,
  padded_correct,
  train_early_stopping,
)

SMALL = dict(
  hidden_size=32,
  num_hidden_layers=2,
  num_attention_heads=2,
  intermediate_size=64,
  max_position_embeddings=64,
)


def test_split_groups_keeps_groups_whole_and_strata_in_proportion():
  groups = np.repeat(np.arange(50), 2)  # 50 pairs
  tr, dv, te = split_groups(groups, 5, 10, 20, seed=1)
  assert (len(tr), len(dv), len(te)) == (40, 10, 20)
  sides = [set(groups[i]) for i in (tr, dv, te)]
  assert not (sides[0] & sides[1] or sides[0] & sides[2] or sides[1] & sides[2])
  for idx in (tr, dv, te):
    assert (np.bincount(groups[idx])[groups[idx]] == 2).all()
  labels = np.array([1] * 30 + [0] * 70)
  tr, dv, te = split_groups(np.arange(100), 10, 20, None, seed=0, strata=labels)
  assert (labels[dv].sum(), labels[te].sum(), labels[tr].sum()) == (3, 6, 21)
  assert len(tr) + len(dv) + len(te) == 100
  again = split_groups(np.arange(100), 10, 20, None, seed=0, strata=labels)
  assert all((a == b).all() for a, b in zip((tr, dv, te), again))
  with pytest.raises(ValueError, match="n_dev=60"):
    split_groups(np.arange(100), 60, 50, None, seed=0)


def test_baselines_on_hand_made_data():
  train = {"labels": np.array([1, 1, 0]), "input_ids": np.zeros((3, 2), np.int32)}
  test = {"labels": np.array([1, 0, 0, 0]), "input_ids": np.zeros((4, 2), np.int32)}
  assert baselines.majority_accuracy(train, test) == 0.25
  # Tokens: word 5 is tagged 2 twice and 3 once, word 6 is tagged 1; -100 marks no label.
  train = {
    "input_ids": np.array([[0, 5, 6, 5], [0, 5, 9, 0]]),
    "labels": np.array([[-100, 2, 1, 2], [-100, 3, -100, -100]]),
  }
  test = {"input_ids": np.array([[0, 5, 6, 7]]), "labels": np.array([[-100, 2, 2, 2]])}
  # 5 -> 2 (right), 6 -> 1 (wrong), 7 unseen -> the commonest tag 2 (right).
  assert baselines.word_tag_accuracy(train, test) == pytest.approx(2 / 3)
  assert baselines.majority_accuracy(train, test) == 1.0


def test_bag_of_words_learns_a_lexical_cue_and_ignores_order():
  rng = np.random.default_rng(0)
  ids = rng.integers(10, 30, size=(80, 6))
  labels = rng.integers(0, 2, 80)
  ids[labels == 1, rng.integers(1, 5)] = 7  # the cue: subword 7 occurs
  ids[:, 0] = 1  # a "[CLS]" in every row, which the baseline must ignore
  data = {"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": labels}
  train, test = (
    acceptability.subset(data, np.arange(60)),
    acceptability.subset(data, np.arange(60, 80)),
  )
  assert baselines.bag_of_words_accuracy(train, test, [1], steps=300) == 1.0
  # Two sentences with the same subwords in another order get the same prediction.
  swapped = dict(test, input_ids=test["input_ids"][:, ::-1].copy(), labels=test["labels"])
  assert baselines.bag_of_words_accuracy(train, swapped, [1], steps=300) == 1.0


@pytest.fixture(scope="module")
def tiny(minilm_dir):
  tok = bertjax.Tokenizer.from_pretrained(minilm_dir)
  data = labelled_sentences(tok, "negated", max_len=64, limit=48)
  cfg = bertjax.BertConfig(vocab_size=tok.vocab_size, **SMALL)
  return tok, data, cfg


def test_accuracy_matches_finetune_evaluate(tiny):
  tok, data, cfg = tiny
  config, params = ft.prepare_model("classification", 2, config=cfg, seed=3)
  rng = np.random.default_rng(1)  # larger weights, so the classifier is not constant
  params = jax.tree.map(
    lambda x: jnp.asarray(x + 0.3 * rng.standard_normal(x.shape).astype(np.float32)), params
  )
  want = ft.evaluate(params, config, data, "classification")["accuracy"]
  assert padded_accuracy(params, config, data, "classification", 16) == pytest.approx(want)
  pred = ft.predict(params, config, data, "classification").argmax(-1)
  got = padded_correct(params, config, data, "classification", 16)  # 48 rows: the last wraps
  assert got.tolist() == (pred == data["labels"]).tolist()
  words = [["Dogs", "bark", "."], ["It", "is", "n't", "raining", "today", "."]]
  enc = tok.encode_words(words, max_length=16)
  labels = np.full(enc.input_ids.shape, -100)
  first = enc.first_subword()
  for row, w in enumerate(words):
    labels[row, first[row, : len(w)]] = np.arange(len(w)) % 3
  tokens = {
    "input_ids": enc.input_ids,
    "attention_mask": enc.attention_mask,
    "token_type_ids": enc.token_type_ids,
    "labels": labels,
  }
  config, params = ft.prepare_model("token_classification", 3, config=cfg, seed=4)
  params = jax.tree.map(
    lambda x: jnp.asarray(x + 0.3 * rng.standard_normal(x.shape).astype(np.float32)), params
  )
  want = ft.evaluate(params, config, tokens, "token_classification")["accuracy"]
  assert padded_accuracy(params, config, tokens, "token_classification", 1) == pytest.approx(want)
  # Each labelled token's correctness, row by row, as `finetune.predict`'s argmax gives it.
  pred = ft.predict(params, config, tokens, "token_classification").argmax(-1)
  keep = labels != -100
  got = padded_correct(params, config, tokens, "token_classification", 1)
  assert got.tolist() == (pred == labels)[keep].tolist()


def test_early_stopping_follows_its_rule(tiny):
  _, data, cfg = tiny
  config, params = ft.prepare_model("classification", 2, config=cfg, seed=0)
  rule = EarlyStopping(
    8, 1e-3, 0, max_steps=40, min_steps=4, eval_every=2, patience=2, eval_batch=16
  )
  tr, dv, te = split_groups(np.arange(48), 8, 12, None, seed=0, strata=data["labels"])
  train, dev, test = (acceptability.subset(data, i) for i in (tr, dv, te))
  run = train_early_stopping(
    config, params, train, dev, test, kind="classification", rule=rule, seed=0
  )
  dev_scores = [p["dev"] for p in run["curve"]]
  assert [p["step"] for p in run["curve"]] == list(range(2, run["steps"] + 1, 2))
  assert run["dev"] == max(dev_scores)
  assert run["best_step"] == run["curve"][int(np.argmax(dev_scores))]["step"]
  if run["converged"]:  # stopped: the last `patience` evaluations did not beat the best
    assert run["steps"] < 40 and run["steps"] >= rule.min_steps
    assert max(dev_scores[-2:]) <= max(dev_scores[:-2])
  else:
    assert run["steps"] == 40
  assert 0.0 <= run["test"] <= 1.0 and all(np.isfinite(p["train_loss"]) for p in run["curve"])
  assert len(run["test_correct"]) == len(te) and run["test"] == run["test_correct"].mean()


def test_bad_settings_are_refused_by_name(tiny):
  tok, data, cfg = tiny
  settings = dict(batch_size=8, learning_rate=1e-3, warmup_steps=0, max_steps=4, min_steps=2)
  settings |= dict(eval_every=2, patience=1, eval_batch=8, seeds=3)  # extra keys are ignored
  rule = EarlyStopping.pick(settings)
  assert rule.max_steps == 4 and not hasattr(rule, "seeds")
  with pytest.raises(ValueError, match="patience"):
    EarlyStopping.pick(settings | {"patience": 0})
  with pytest.raises(ValueError, match=r"max_steps=4\.0 not understood: expected an int"):
    EarlyStopping.pick(settings | {"max_steps": 4.0})
  config, params = ft.prepare_model("classification", 2, config=cfg, seed=0)
  with pytest.raises(ValueError, match="kind='regression' not understood"):
    padded_accuracy(params, config, data, "regression", 8)
  small = acceptability.subset(data, np.arange(4))
  with pytest.raises(ValueError, match="batch_size=8 exceeds the 4 training examples"):
    train_early_stopping(
      config, params, small, small, small, kind="classification", rule=rule, seed=0
    )
  with pytest.raises(ValueError, match="field='negation' not understood"):
    labelled_sentences(tok, "negation", max_len=16)
