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
  # Each held-out sentence's pair, numbered from 0: the two sentences of a pair share it.
  _, held_idx = acceptability.split_by_pair(pairs, 8, 16, seed=3)
  same = pairs[held_idx][:, None] == pairs[held_idx][None]
  assert np.array_equal(split.held_pair[:, None] == split.held_pair[None], same)
  assert sorted(np.bincount(split.held_pair)) == [2] * 8


def test_ablation_matches_direct_computation(task):
  config, params, held = task["config"], task["params"], task["held"]
  sweeps, correct = finetuning.disabling_sweeps(
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
    return np.asarray(logits).argmax(-1) == held["labels"]

  ones = jnp.ones((config.depth, config.num_attention_heads))
  assert u.heads[1, 0] == pytest.approx(accuracy(ones.at[1, 0].set(0.0), "uniform").mean())
  assert s.layers[0] == pytest.approx(accuracy(ones.at[0].set(0.0), "scale").mean())
  # Each sentence's correctness under each mask, and the accuracies as their means.
  n, heads = len(held["labels"]), config.num_attention_heads
  np.testing.assert_array_equal(correct["baseline"], accuracy(ones, "uniform"))
  np.testing.assert_array_equal(
    correct["uniform"]["heads"][heads + 0], accuracy(ones.at[1, 0].set(0.0), "uniform")
  )
  np.testing.assert_array_equal(
    correct["scale"]["layers"][0], accuracy(ones.at[0].set(0.0), "scale")
  )
  assert correct["uniform"]["heads"].shape == (config.depth * heads, n)
  assert set(correct["scale"]) == {"layers"} and correct["baseline"].dtype == np.uint8
  np.testing.assert_allclose(u.heads.reshape(-1), correct["uniform"]["heads"].mean(1))
  np.testing.assert_allclose(u.layer_skip, correct["uniform"]["layer_skip"].mean(1))
  assert u.baseline == correct["baseline"].mean()
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
  # With the sweeps' correctness: one string of 0s and 1s per mask, read back as it was.
  rng = np.random.default_rng(0)
  c = lambda *shape: rng.integers(0, 2, shape).astype(np.uint8)
  correct = {"baseline": c(5), "uniform": {"heads": c(4, 5), "layers": c(2, 5)}}
  m["correct"] = {**correct, "scale": {"layers": c(2, 5)}}
  m["acc"]["uniform"]["delta_heads"] = np.zeros((2, 2))
  ex = effects_record(m)["ablation"]["per_example"]
  assert len(ex["correct_uniform_heads"]) == 2 and len(ex["correct_uniform_heads"][0][1]) == 5
  assert ex["correct_baseline"] == "".join(str(x) for x in correct["baseline"])
  got = finetuning.disabling_correct({"per_example": ex})
  np.testing.assert_array_equal(got["baseline"], correct["baseline"])
  np.testing.assert_array_equal(got["heads"], correct["uniform"]["heads"].T.reshape(5, 2, 2))
  np.testing.assert_array_equal(got["layers"], correct["uniform"]["layers"].T)
  np.testing.assert_array_equal(
    finetuning.from_bits(ex["correct_scale_layers"]), m["correct"]["scale"]["layers"]
  )
  assert finetuning.disabling_correct({}) is None


def test_by_group_gathers_each_group():
  group = np.array([3, 0, 3, 1, 0, 1])
  x = np.arange(12).reshape(6, 2)
  got = finetuning.by_group(x, group)
  assert got.shape == (3, 2, 2)
  for k, g in enumerate(np.unique(group)):
    np.testing.assert_array_equal(got[k], x[group == g])
  with pytest.raises(ValueError, match="groups of one size"):
    finetuning.by_group(x, [0, 0, 0, 1, 1, 2])


def _disabling_record(rng, pairs=60, depth=2, heads=2):
  """An "ablation" record as `effects_record` writes it, planted: head (0, 1) disabled fixes
  some errors, the other masks flip a few sentences at random; sentences in shuffled order."""
  n = 2 * pairs
  base = (rng.uniform(size=n) < 0.8).astype(np.uint8)
  flip = lambda p: np.where(rng.uniform(size=n) < p, 1 - base, base).astype(np.uint8)
  h = np.stack([flip(0.03) for _ in range(depth * heads)])
  h[1] = np.maximum(base, rng.uniform(size=n) < 0.3)
  lay = np.stack([flip(0.05) for _ in range(depth)])
  result = AblationResult(
    "uniform",
    base.mean(),
    h.mean(1).reshape(depth, heads),
    lay.mean(1),
    np.full((depth, heads), np.nan),
    np.full(depth, np.nan),
  )
  pair = rng.permutation(np.repeat(np.arange(pairs), 2))
  acc = result.improvements()
  ex = {
    "correct_baseline": finetuning.bits(base),
    "correct_uniform_heads": finetuning.bits(h.reshape(depth, heads, n)),
    "correct_uniform_layers": finetuning.bits(lay),
    "pair": pair,
  }
  se = float(np.sqrt(base.mean() * (1 - base.mean()) / n))
  return {"uniform": acc, "accuracy_standard_error": se, "per_example": ex}, (base, h, lay, pair)


def test_disabling_interval_recounts_every_resample_of_the_pairs():
  """The disabling row's interval, against an independent loop: each bootstrap resample of the
  minimal pairs (the indices `bertjax.stats.bootstrap_ci` draws) gathered sentence by
  sentence, its accuracies counted by `AblationResult.improvements` and read by the rule."""
  rng = np.random.default_rng(4)
  ab, (base, h, lay, pair) = _disabling_record(rng)
  judged = rules._disabling(ab)
  assert judged.values == rules.disabling_quantities(ab["uniform"], ab["accuracy_standard_error"])
  assert judged.text.startswith("95% CI over the 60 held-out minimal pairs (120 sentences): ")
  n, depth, heads = len(base), 2, 2
  values = []
  for idx in np.random.default_rng(0).integers(0, 60, (2000, 60)):
    rows = np.concatenate([np.flatnonzero(pair == p) for p in idx])
    b = base[rows].mean()
    res = AblationResult(
      "uniform",
      b,
      h[:, rows].mean(1).reshape(depth, heads),
      lay[:, rows].mean(1),
      np.full((depth, heads), np.nan),
      np.full(depth, np.nan),
    )
    q = rules.disabling_quantities(res.improvements(), np.sqrt(b * (1 - b) / n))
    values.append([q[k] for k in (rules.HEADS, rules.LAYERS, rules.OVER_SE)])
  low, high = np.quantile(np.asarray(values, float), [0.025, 0.975], axis=0)
  for k, name in enumerate((rules.HEADS, rules.LAYERS, rules.OVER_SE)):
    assert judged.intervals[name] == pytest.approx((low[k], high[k]), abs=1e-12)
  levels = [
    rules.DISABLING.levels(dict(zip((rules.HEADS, rules.LAYERS, rules.OVER_SE), v))) for v in values
  ]
  ends = np.quantile(np.asarray(levels, float), [0.025, 0.975])
  point = {"no": 0, "partly": 1, "yes": 2}[judged.verdict]
  lo, hi = min(int(np.floor(ends[0])), point), max(int(np.ceil(ends[1])), point)
  assert judged.span == (["no", "partly", "yes"][lo], ["no", "partly", "yes"][hi])
  assert judged.values[rules.HEADS] >= 1 and judged.intervals[rules.HEADS][0] >= 1  # planted


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
    "ablation": {},  # an older JSON's: no per-sentence correctness
  }
  kinds, disabled, change = rules.uncertainty(r, {})
  share = types[..., :4].sum((0, 2)) / types.sum((0, 2))  # each model's repeated share
  assert kinds.values[rules.FEWEST] == pytest.approx(share.min())
  assert kinds.values[rules.VERTICAL] == 2 and kinds.verdict == "yes" and kinds.conclusive
  assert kinds.text.startswith("95% CI over the 50 analysed sentences: ")
  assert disabled.text.startswith("CI: rerun needed")
  assert change.values[rules.LAST_GAP] == pytest.approx(cos[:, 2].mean() - cos[:, :2].mean())
  assert change.verdict == "yes" and change.span == ("yes", "yes")
  old = {"patterns": {"before": {}, "after": {}}, "attention_change": {}, "ablation": {}}
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
  for j in judged:
    assert j.text.startswith("95% CI over the") and j.span is not None
  # The disabling row: each held-out sentence's correctness under each mask averages to the
  # accuracies the row counts, and its statistics on all the pairs are the row's own.
  ab, n = r["ablation"], r["task"]["eval_sentences"]
  c = finetuning.disabling_correct(ab)
  assert c["baseline"].shape == (n,) and sorted(np.bincount(c["pair"])) == [2] * (n // 2)
  u = ab["uniform"]
  np.testing.assert_allclose(
    c["heads"].mean(0) - c["baseline"].mean(), u["delta_heads"], atol=1e-12
  )
  np.testing.assert_allclose(
    c["layers"].mean(0) - c["baseline"].mean(), u["delta_layers"], atol=1e-12
  )
  skips = finetuning.from_bits(ab["per_example"]["correct_uniform_layer_skip"]).mean(1)
  np.testing.assert_allclose(skips - u["baseline"], u["delta_layer_skips"], atol=1e-12)
  scale = finetuning.from_bits(ab["per_example"]["correct_scale_layers"]).mean(1)
  np.testing.assert_allclose(
    scale - ab["scale"]["baseline"], ab["scale"]["delta_layers"], atol=1e-12
  )
  g = finetuning.disabling_gains(
    c["baseline"].mean()[None], c["heads"].mean(0)[None], c["layers"].mean(0)[None], n=n
  )
  on_all = rules.disabling_quantities(g, g["standard_error"])
  assert {k: float(v[0]) for k, v in on_all.items()} == pytest.approx(judged[1].values)
