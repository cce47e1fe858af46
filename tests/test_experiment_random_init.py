"""Checks of `experiments/random_init.py` (Kovaleva et al. 2019's random-initialisation test).

The script's pieces are checked against independent computations (splits, baselines,
accuracy against `finetune.evaluate`, early stopping), the verdict rule on synthetic
numbers, and a smoke run in process (two tasks, no data) for the JSON's structure and for
verdicts that follow its own numbers.
"""

import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.tasks import acceptability

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "experiments"))
import random_init as ri

import bertjax
from bertjax.training import finetune as ft


def test_split_groups_keeps_groups_whole_and_strata_in_proportion():
  groups = np.repeat(np.arange(50), 2)  # 50 pairs
  tr, dv, te = ri.split_groups(groups, 5, 10, 20, seed=1)
  assert (len(tr), len(dv), len(te)) == (40, 10, 20)
  sides = [set(groups[i]) for i in (tr, dv, te)]
  assert not (sides[0] & sides[1] or sides[0] & sides[2] or sides[1] & sides[2])
  for idx in (tr, dv, te):
    assert (np.bincount(groups[idx])[groups[idx]] == 2).all()
  labels = np.array([1] * 30 + [0] * 70)
  tr, dv, te = ri.split_groups(np.arange(100), 10, 20, None, seed=0, strata=labels)
  assert (labels[dv].sum(), labels[te].sum(), labels[tr].sum()) == (3, 6, 21)
  assert len(tr) + len(dv) + len(te) == 100
  again = ri.split_groups(np.arange(100), 10, 20, None, seed=0, strata=labels)
  assert all((a == b).all() for a, b in zip((tr, dv, te), again))
  with pytest.raises(ValueError, match="n_dev=60"):
    ri.split_groups(np.arange(100), 60, 50, None, seed=0)


def test_baselines_on_hand_made_data():
  train = {"labels": np.array([1, 1, 0]), "input_ids": np.zeros((3, 2), np.int32)}
  test = {"labels": np.array([1, 0, 0, 0]), "input_ids": np.zeros((4, 2), np.int32)}
  assert ri.majority_accuracy(train, test) == 0.25
  # Tokens: word 5 is tagged 2 twice and 3 once, word 6 is tagged 1; -100 marks no label.
  train = {
    "input_ids": np.array([[0, 5, 6, 5], [0, 5, 9, 0]]),
    "labels": np.array([[-100, 2, 1, 2], [-100, 3, -100, -100]]),
  }
  test = {"input_ids": np.array([[0, 5, 6, 7]]), "labels": np.array([[-100, 2, 2, 2]])}
  # 5 -> 2 (right), 6 -> 1 (wrong), 7 unseen -> the commonest tag 2 (right).
  assert ri.word_tag_accuracy(train, test) == pytest.approx(2 / 3)
  assert ri.majority_accuracy(train, test) == 1.0


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
  assert ri.bag_of_words_accuracy(train, test, [1], steps=300) == 1.0
  # Two sentences with the same subwords in another order get the same prediction.
  swapped = dict(test, input_ids=test["input_ids"][:, ::-1].copy(), labels=test["labels"])
  assert ri.bag_of_words_accuracy(train, swapped, [1], steps=300) == 1.0


@pytest.fixture(scope="module")
def tiny(minilm_dir):
  tok = bertjax.Tokenizer.from_pretrained(minilm_dir)
  data = ri.sentence_task(tok, "negated", max_len=64, limit=48)
  cfg = bertjax.BertConfig(vocab_size=tok.vocab_size, **ri.SMOKE_MODEL)
  return tok, data, cfg


def test_accuracy_matches_finetune_evaluate(tiny):
  tok, data, cfg = tiny
  config, params = ft.prepare_model("classification", 2, config=cfg, seed=3)
  rng = np.random.default_rng(1)  # larger weights, so the classifier is not constant
  params = jax.tree.map(
    lambda x: jnp.asarray(x + 0.3 * rng.standard_normal(x.shape).astype(np.float32)), params
  )
  want = ft.evaluate(params, config, data, "classification")["accuracy"]
  assert ri.accuracy(params, config, data, "classification", 16) == pytest.approx(want)
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
  assert ri.accuracy(params, config, tokens, "token_classification", 1) == pytest.approx(want)


def test_early_stopping_follows_its_rule(tiny):
  _, data, cfg = tiny
  config, params = ft.prepare_model("classification", 2, config=cfg, seed=0)
  size = {**ri.SIZES["smoke"], "max_steps": 40, "min_steps": 4, "eval_every": 2, "patience": 2}
  tr, dv, te = ri.split_groups(np.arange(48), 8, 12, None, seed=0, strata=data["labels"])
  train, dev, test = (acceptability.subset(data, i) for i in (tr, dv, te))
  run = ri.train_early_stopping(
    config, params, train, dev, test, kind="classification", size=size, seed=0
  )
  dev_scores = [p["dev"] for p in run["curve"]]
  assert [p["step"] for p in run["curve"]] == list(range(2, run["steps"] + 1, 2))
  assert run["dev"] == max(dev_scores)
  assert run["best_step"] == run["curve"][int(np.argmax(dev_scores))]["step"]
  if run["converged"]:  # stopped: the last `patience` evaluations did not beat the best
    assert run["steps"] < 40 and run["steps"] >= size["min_steps"]
    assert max(dev_scores[-2:]) <= max(dev_scores[:-2])
  else:
    assert run["steps"] == 40
  assert 0.0 <= run["test"] <= 1.0 and all(np.isfinite(p["train_loss"]) for p in run["curve"])


def test_verdict_rule_on_synthetic_numbers():
  assert ri.random_init_verdict(0.92, 0.98, 0.66) == ("yes", pytest.approx(0.8125))
  assert ri.random_init_verdict(0.88, 0.98, 0.66)[0] == "partly"  # r = 0.69
  assert ri.random_init_verdict(0.80, 0.98, 0.66)[0] == "partly"  # r = 0.44
  assert ri.random_init_verdict(0.78, 0.98, 0.66)[0] == "no"  # r = 0.375
  assert ri.random_init_verdict(0.50, 0.92, 0.50) == ("no", 0.0)
  assert ri.random_init_verdict(0.60, 0.50, 0.50) == ("n/a", None)

  def run(pre, rnd):
    curve = lambda s: {"test": s, "converged": True, "steps": 100}
    return {"pretrained": curve(pre), "random": curve(rnd)}

  runs = [run(0.98, 0.95), run(0.96, 0.90), run(0.97, 0.91)]
  s = ri.summarise(runs, [{"majority": 0.7, "lexical": 0.9}] * 3)
  assert s["pretrained"] == pytest.approx(0.97) and s["random"] == pytest.approx(0.92)
  assert s["gap"] == pytest.approx(0.05) and s["gap_sd"] == pytest.approx(
    np.std([0.03, 0.06, 0.06], ddof=1)
  )
  assert (s["gap_min"], s["gap_max"]) == (pytest.approx(0.03), pytest.approx(0.06))
  assert s["gain_ratio"] == pytest.approx(0.22 / 0.27) and s["holds"] == "yes"
  assert s["converged"] == {"pretrained": 3, "random": 3}
  low = ri.summarise([run(0.97, 0.75)], [{"majority": 0.7, "lexical": 0.9}])
  assert low["holds"] == "no" and low["random_sd"] == 0.0


def test_smoke_run_json_and_verdicts_follow_the_numbers(tmp_path, monkeypatch):
  empty = tmp_path / "no-data"
  empty.mkdir()
  monkeypatch.setenv("BERTJAX_DATA_DIR", str(empty))
  monkeypatch.setenv("BERTJAX_NO_SHARED_DATA", "1")
  ri.main(["--smoke", "--out", str(tmp_path), "--tasks", "negation,upos"])
  doc = json.loads((tmp_path / "random_init.json").read_text())
  assert doc["smoke"] is True and doc["experiment"] == "random_init"
  assert doc["settings"]["rule"] == ri.RULE
  tasks = doc["results"]["tasks"]
  assert list(tasks) == ["negation", "upos"] and len(doc["findings"]) == 2
  for (name, res), f in zip(tasks.items(), doc["findings"]):
    s = res["summary"]
    assert len(res["runs"]) == doc["settings"]["seeds"] == len(res["splits"])
    for run in res["runs"]:
      for init in ("pretrained", "random"):
        r = run[init]
        assert r["steps"] <= doc["settings"]["max_steps"] and 0 <= r["test"] <= 1
        assert r["dev"] == max(p["dev"] for p in r["curve"])
    assert s["pretrained"] == pytest.approx(np.mean([r["pretrained"]["test"] for r in res["runs"]]))
    holds, ratio = ri.random_init_verdict(s["random"], s["pretrained"], s["majority"])
    assert f["holds"] == s["holds"] == holds and s["gain_ratio"] == ratio
    assert f["measured"].startswith(f"{name}: ") and f["paper"] == ri.PAPER
  for fig in doc["figures"]:
    assert (tmp_path / fig).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
