"""Consistency checks of `experiments/dark_secrets.py` and `bertjax.analysis.finetuning`
(Kovaleva et al. 2019) on a tiny model.

The smoke run itself is covered by `test_experiments.py`; here the script's own pieces are
checked against independent computations: the minimal-pair split, the ablation baseline
against `finetune.evaluate` and a hand-written loss, one ablated head against a direct
masked forward pass, the pattern ratios, and the verdict rules.
"""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.tasks import acceptability

REPO = pathlib.Path(__file__).resolve().parents[1]
import bertjax
from bertjax.analysis import finetuning
from bertjax.analysis.attention import patterns
from bertjax.analysis.interventions.ablation import AblationResult
from bertjax.training import finetune as ft
from experiments import dark_secrets as ds
from experiments import dark_secrets as rules


@pytest.fixture(scope="module")
def task(data_dir, minilm_dir):
  """Held-out BLiMP sentences and a tiny random classifier with MiniLM's vocabulary."""
  tok = bertjax.Tokenizer.from_pretrained(minilm_dir)
  data, pairs, phen, names = acceptability.load_blimp_task(data_dir / "blimp", tok, max_len=64)
  _, held_idx = acceptability.split_by_pair(pairs, 8, 16, seed=3)
  held = acceptability.subset(data, held_idx)
  split = acceptability.load_pair_split(
    data_dir / "blimp", tok, max_len=64, eval_pairs=8, train_pairs=16, seed=3
  )
  tiny = bertjax.BertConfig(vocab_size=tok.vocab_size, **ds.SMOKE_MODEL)
  config, params = ft.prepare_model("classification", 2, config=tiny, seed=7)
  # Larger weights than the initialiser's, so heads differ and the classifier is not constant.
  rng = np.random.default_rng(0)
  params = jax.tree.map(
    lambda x: jnp.asarray(x + 0.3 * rng.standard_normal(x.shape).astype(np.float32)), params
  )
  return {
    "tok": tok,
    "data": data,
    "pairs": pairs,
    "phen": phen,
    "names": names,
    "held": held,
    "held_phenomenon": phen[held_idx],
    "split": split,
    "config": config,
    "params": params,
  }


def test_split_keeps_minimal_pairs_together(task):
  pairs = task["pairs"]
  train, held = acceptability.split_by_pair(pairs, 20, 50, seed=1)
  assert len(held) == 40 and len(train) == 100
  assert not set(pairs[train]) & set(pairs[held])
  labels = task["data"]["labels"]
  for idx in (train, held):
    assert np.bincount(pairs[idx]).max() == 2 and labels[idx].mean() == 0.5
  assert len(task["names"]) == len(set(task["phen"].tolist()))
  with pytest.raises(ValueError, match="eval_pairs"):
    acceptability.split_by_pair(pairs, len(np.unique(pairs)), None, seed=0)
  # load_pair_split: the same split in one call, with each held-out sentence's phenomenon.
  split = task["split"]
  assert split.phenomena == task["names"] and len(split.train["labels"]) == 32
  assert all(np.array_equal(split.held[k], task["held"][k]) for k in task["held"])
  assert np.array_equal(split.held_phenomenon, task["held_phenomenon"])


def test_ablation_matches_direct_computation(task):
  config, params, held = task["config"], task["params"], task["held"]
  sweeps = finetuning.disabling_sweeps(
    params, config, acceptability.batches(held, 8), strategy="vmap"
  )
  u, s = sweeps["uniform"], sweeps["scale"]
  assert u.baseline == pytest.approx(
    ft.evaluate(params, config, held, "classification")["accuracy"], abs=1e-7
  )
  assert s.baseline == u.baseline
  assert np.isnan(s.heads).all() and np.isfinite(u.heads).all()

  def accuracy(head_mask, mode):
    out = bertjax.forward(
      params,
      config,
      held["input_ids"],
      held["attention_mask"],
      held["token_type_ids"],
      head_mask=head_mask,
      head_ablation=mode,
    )
    logits = bertjax.classify(params, config, out.pooler_output)
    return float((np.asarray(logits).argmax(-1) == held["labels"]).mean())

  ones = jnp.ones((config.depth, config.num_attention_heads))
  assert u.heads[1, 0] == pytest.approx(accuracy(ones.at[1, 0].set(0.0), "uniform"), abs=1e-7)
  assert s.layers[0] == pytest.approx(accuracy(ones.at[0].set(0.0), "scale"), abs=1e-7)
  acc = s.improvements()
  assert "delta_heads" not in acc and acc["delta_layers"].shape == (config.depth,)


def test_pattern_ratios_sum_to_one(task):
  config, params, held = task["config"], task["params"], task["held"]
  tok = task["tok"]
  p = patterns.pattern_types(
    params, config, acceptability.batches(held, 8), special_ids=[tok.cls_id, tok.sep_id]
  ).summary()
  np.testing.assert_allclose(p["per_layer"].sum(-1), 1.0, atol=1e-12)
  assert p["overall"].sum() == pytest.approx(1.0)
  assert p["counts"].sum() == config.depth * config.num_attention_heads * len(held["labels"])
  assert p["repeated_share"] == pytest.approx(1.0 - p["overall"][-1])
  assert p["overall"][p["types"].index("block")] == 0  # single sentences have one segment


def test_improvements_and_verdict_rules():
  res = AblationResult(
    head_ablation="uniform",
    baseline=0.8,
    heads=np.array([[0.8, 0.85], [0.7, 0.81]]),
    layers=np.array([0.79, 0.9]),
    keep_one=np.full((2, 2), np.nan),
    layer_skip=np.array([0.8, 0.6]),
  )
  acc = res.improvements(higher_is_better=True)
  assert (acc["heads_improving"], acc["layers_improving"], acc["layer_skips_improving"]) == (
    2,
    1,
    0,
  )
  assert acc["best_head_delta"] == pytest.approx(0.05)
  assert acc["layer_skips_improving"] == 0 and acc["best_layer_skip_delta"] == pytest.approx(0)
  loss = res.improvements(higher_is_better=False)
  assert loss["heads_improving"] == 1 and loss["delta_heads"][1, 0] == pytest.approx(0.1)
  disabling = lambda a, se: rules.DISABLING.verdict(rules.disabling_quantities(a, se))
  change = lambda cos: rules.CHANGE.verdict(rules.change_quantities(cos))
  patterns = lambda before, after: rules.PATTERNS.verdict(rules.pattern_quantities(before, after))
  assert disabling(acc, 0.02) == "yes"
  assert disabling(acc, 0.2) == "partly"
  assert disabling({**acc, "layers_improving": 0}, 0.02) == "partly"
  assert disabling({**acc, "heads_improving": 0, "layers_improving": 0}, 0.02) == "no"

  assert change([0.9, 0.9, 0.9, 0.9, 0.8, 0.7]) == "yes"
  assert change([0.6, 0.9, 0.9, 0.9, 0.8, 0.7]) == "partly"
  assert change([0.7, 0.9, 0.9, 0.9, 0.95, 0.95]) == "no"

  vertical = {"repeated_share": 0.6, "commonest_repeated": "vertical"}
  assert patterns(vertical, vertical) == "yes"
  assert patterns(vertical, {**vertical, "commonest_repeated": "diagonal"}) == "partly"
  few = {"repeated_share": 0.1, "commonest_repeated": "vertical"}
  assert patterns(few, few) == "no"


def test_accuracy_by_phenomenon_counts_each_phenomenon_alone(task):
  split = task["split"]
  phen = split.held_phenomenon
  correct = np.arange(len(phen)) % 3 == 0
  got = acceptability.accuracy_by_phenomenon(correct, split)
  assert list(got) == split.phenomena
  for k, name in enumerate(split.phenomena):
    mine = [c for c, p in zip(correct, phen) if p == k]
    assert got[name] == pytest.approx(sum(mine) / len(mine))


def test_effects_record_keeps_the_summaries_and_counts_changed_heads():
  from types import SimpleNamespace

  from bertjax.analysis.finetuning import effects_record

  dominant = np.array([[0, 1], [2, 3]])
  before = {"overall": np.ones(5) / 5, "counts": np.ones(5), "dominant": dominant}
  after = {**before, "dominant": np.array([[0, 2], [2, 0]])}
  cos = np.array([[1.0, 0.5], [0.2, 0.4]])
  m = {
    "before": before,
    "after": after,
    "change": SimpleNamespace(cosine=cos, cka=cos * 0, per_sequence=cos.T),
    "acc": {"uniform": {"baseline": 0.8}},
    "se": 0.01,
  }
  r = effects_record(m)
  assert (
    set(r["patterns"]["before"]) == {"overall"} and r["patterns"]["dominant_changed_heads"] == 2
  )
  assert r["ablation"] == {
    "metric": "held-out accuracy",
    "uniform": {"baseline": 0.8},
    "accuracy_standard_error": 0.01,
  }
  np.testing.assert_allclose(r["attention_change"]["layer_cosine"], [0.75, 0.3])
  assert r["attention_change"]["per_sentence_layer_cosine"] is m["change"].per_sequence


def test_pattern_and_change_intervals_resample_the_sentences():
  """The pattern row's interval resamples each sentence's maps per type, before and after
  together; the change row's, each sentence's cosine by layer. Planted: every sentence has
  mostly vertical maps before and after, and layer 3 of 3 changes most."""
  rng = np.random.default_rng(0)
  n = 50
  types = rng.multinomial(12, [0.5, 0.1, 0.1, 0.1, 0.2], size=(n, 2))
  cos = np.stack([rng.normal(0.9, 0.02, n), rng.normal(0.85, 0.02, n), rng.normal(0.4, 0.1, n)], 1)
  r = {
    "patterns": {"before": {"per_sequence": types[:, 0]}, "after": {"per_sequence": types[:, 1]}},
    "attention_change": {"per_sentence_layer_cosine": cos},
  }
  kinds, disabled, change = rules.uncertainty(r, {})
  share = types[..., :4].sum((0, 2)) / types.sum((0, 2))  # each model's repeated share
  assert kinds.values[rules.FEWEST] == pytest.approx(share.min())
  assert kinds.values[rules.VERTICAL] == 2 and kinds.verdict == "yes" and kinds.conclusive
  assert kinds.text.startswith("95% CI over the 50 analysed sentences: ")
  assert disabled.text.startswith("CI: rerun needed")
  assert change.values[rules.LAST_GAP] == pytest.approx(cos[:, 2].mean() - cos[:, :2].mean())
  assert change.verdict == "yes" and change.span == ("yes", "yes")
  old = {"patterns": {"before": {}, "after": {}}, "attention_change": {}}  # an older JSON
  assert [j.text.split(" (")[0] for j in rules.uncertainty(old, {})] == ["CI: rerun needed"] * 3


def check_smoke(doc: dict, out: pathlib.Path) -> None:
  """The smoke run keeps each analysed sentence's pattern types and cosines: they add up to
  the counts and average to the layer cosines the rows read."""
  r = doc["results"]
  for k in ("before", "after"):
    per = np.asarray(r["patterns"][k]["per_sequence"])
    np.testing.assert_allclose(per.sum(0) / per.sum(), r["patterns"][k]["overall"], atol=1e-12)
  change = r["attention_change"]
  np.testing.assert_allclose(
    np.mean(change["per_sentence_layer_cosine"], 0), change["layer_cosine"], atol=1e-9
  )
  judged = rules.uncertainty(r, doc["settings"])
  for j in (judged[0], judged[2]):
    assert j.text.startswith("95% CI over the") and j.span is not None
