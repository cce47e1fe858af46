"""Checks of `bertjax.training.runs` that need no training: the smoothed curves, per-step
costs with compile time apart, the time to a target loss, the comparison of two runs and its
ABBA bookkeeping, the timed iterator and the vocabulary order."""

import numpy as np
import pytest

from bertjax import stats
from bertjax.training import runs


def test_trailing_mean_is_causal_with_short_windows_at_the_start():
  np.testing.assert_allclose(stats.trailing_mean([4, 2, 6, 0], 2), [4, 3, 4, 3])
  np.testing.assert_allclose(stats.trailing_mean([4, 2, 6, 0], 10), [4, 3, 4, 3])
  np.testing.assert_allclose(stats.trailing_mean([4, 2, 6], 1), [4, 2, 6])
  with pytest.raises(ValueError, match="window=0"):
    stats.trailing_mean([1.0], 0)


def test_time_to_reach_on_a_hand_made_curve():
  times, values = [1.0, 2.5, 3.0, 4.0], [5.0, 4.0, 3.0, 2.0]
  assert runs.time_to_reach(times, values, 3.0) == 3.0  # reaching means <=
  assert runs.time_to_reach(times, values, 3.5) == 3.0
  assert runs.time_to_reach(times, values, 9.0) == 1.0
  assert runs.time_to_reach(times, values, 1.9) is None
  assert runs.time_to_reach(times, [5.0, 2.0, 6.0, 6.0], 3.0) == 2.5  # the first time
  with pytest.raises(ValueError, match="same shape"):
    runs.time_to_reach([1.0, 2.0], [1.0], 0.5)


def test_step_costs_takes_compile_out_of_each_stage():
  out = runs.step_costs([10.0, 1.0, 1.0, 1.0, 8.0, 2.0, 2.0], [3, 3, 3, 3, 6, 6, 6])
  np.testing.assert_allclose(out["cost_s"], [1, 1, 1, 1, 2, 2, 2])
  np.testing.assert_allclose(out["compile_s"], [9.0, 6.0])
  assert out["stage_starts"] == [0, 4] and out["stage_layers"] == [3, 6]
  one = runs.step_costs([5.0, 1.0, 1.0], [6, 6, 6])
  np.testing.assert_allclose(one["compile_s"], [4.0])


def _run(losses, cost, layers, compile_s):
  split = runs.step_costs(cost, layers)
  raw = np.asarray(cost, float)
  return {
    "mlm_loss": list(losses),
    "layers": list(layers),
    "cost_s": split["cost_s"],
    "raw_cost_s": raw,
    "compile_s": compile_s,
    "stage_starts": split["stage_starts"],
  }


def test_compare_gives_the_ratio_of_a_hand_made_pair_of_runs():
  losses = np.linspace(10, 1, 10)
  # Baseline: 1 s per step at 6 layers, 5 s of compile on the first step.
  base = _run(losses, [6.0] + [1.0] * 9, [6] * 10, [5.0])
  # Stacked: the same losses, 0.5 s per step at 3 layers for 5 steps, then 1 s at 6 layers;
  # compiles of 3 s and 2 s on each stage's first step.
  stacked = _run(losses, [3.5] + [0.5] * 4 + [3.0] + [1.0] * 4, [3] * 5 + [6] * 5, [3.0, 2.0])
  out = runs.compare_runs(base, stacked, window=1)
  assert out["target_smoothed_mlm_loss"] == pytest.approx(1.0)
  assert out["reach_step"] == 10
  assert out["t_reach_s"] == pytest.approx(7.5) and out["baseline_s"] == pytest.approx(10.0)
  assert out["ratio"] == pytest.approx(0.75)
  assert out["ratio_with_compile"] == pytest.approx(12.5 / 15.0)
  priced = runs.compare_runs(base, stacked, window=1, step_price={3: 0.5, 6: 1.0})
  assert priced["ratio"] == pytest.approx(0.75)
  assert priced["ratio_with_compile"] == pytest.approx(12.5 / 15.0)
  # A stacked run whose loss stays above the target never reaches it.
  worse = dict(stacked, mlm_loss=list(losses + 0.5))
  assert runs.compare_runs(base, worse, window=1)["ratio"] is None
  # One that is better reaches it earlier: losses 1 lower reach 1.0 at step 9 (0.5 * 5 + 4 * 1).
  better = dict(stacked, mlm_loss=list(losses - 1.0))
  assert runs.compare_runs(base, better, window=1)["ratio"] == pytest.approx(0.65)


def test_abba_runs_in_order_and_estimates_every_ratio(monkeypatch):
  """The comparison's bookkeeping on hand-made runs (the training itself runs in the stacking
  experiment's smoke test): ABBA order and schedules, then each estimate's ratio."""
  import dataclasses
  from types import SimpleNamespace

  losses = np.linspace(10, 1, 10)
  made = {
    "baseline": _run(losses, [6.0] + [1.0] * 9, [6] * 10, [5.0]),
    "stacked": _run(losses, [3.5] + [0.5] * 4 + [3.0] + [1.0] * 4, [3] * 5 + [6] * 5, [3.0, 2.0]),
  }
  calls = []

  def train_run(label, config, data, train, eval_batches, log=None):
    calls.append((label, train.stacking))
    return {"label": label, **made[label.split("#")[0]]}

  @dataclasses.dataclass
  class Train:
    stacking: str | None = None

  monkeypatch.setattr(runs, "train_run", train_run)
  data = SimpleNamespace(eval_batches=[])
  done = runs.abba_runs(None, data, Train(), "3:5,6", repeats=2)
  assert calls == [
    ("baseline#1", None),
    ("stacked#1", "3:5,6"),
    ("stacked#2", "3:5,6"),
    ("baseline#2", None),
  ]
  with pytest.raises(ValueError, match="repeats=3"):
    runs.abba_runs(None, data, Train(), "3:5,6", repeats=3)
  turns = {3: [0.25, 0.25], 6: [1.0, 1.0]}
  monkeypatch.setattr(runs, "interleaved_step_times", lambda *a: turns)
  est = runs.time_ratio_estimates(done, None, data, Train(), window=1, depths=(3, 6), rounds=2)
  # Measured per repeat 0.75 (see the test above); at the turns' prices (0.25 s at 3 layers)
  # the stacked run reaches the target in 5 * 0.25 + 5 * 1 = 6.25 s of the baseline's 10.
  assert est["ratios"][:3] == pytest.approx([0.75, 0.75, 0.75])
  assert est["ratios"][3] == pytest.approx(0.625) and est["turn_price"] == {3: 0.25, 6: 1.0}
  assert est["determinism"] == 0.0
  timed = [{**r, "heldout": {"mlm_loss": 2.0}, "compile_s": 0.5} for r in done]
  record = runs.estimates_record(timed, est, window=1)
  assert record["approach"].startswith(
    "one process; runs in the order baseline#1, stacked#1, stacked#2, baseline#2; per-step"
  )
  assert "trailing 1-step mean" in record["approach"]
  assert record["ratio_interleaved"]["ratio"] == est["ratios"][3]
  assert record["median_step_s_by_depth"] == runs.median_step_prices(done)
  assert list(record["compile_s"]) == [r["label"] for r in done]
  assert record["heldout_mlm_loss"]["stacked#2"] == {"mlm_loss": 2.0}
  # Every step of a depth takes the same time here, so every resample prices them alike.
  again = runs.resampled_estimates({**record, "runs": timed}, window=1, resamples=50)
  assert len(again) == 1 and again[0]["measured"] == [c["ratio"] for c in est["per_repeat"]]
  assert again[0]["priced"] == {"priced": est["ratios"][2], "interleaved": est["ratios"][3]}
  np.testing.assert_allclose(again[0]["resampled"]["priced"], [est["ratios"][2]] * 50)
  np.testing.assert_allclose(again[0]["resampled"]["interleaved"], [0.625] * 50)

  # A stacked run that reached the target too late is tried with a longer shallow stage (70%
  # of 10 steps), one that never reached it with a shorter one (30%).
  config = SimpleNamespace(num_hidden_layers=6)
  train = Train()
  train.steps = 10
  made["variation"] = made["stacked"]
  late = runs.stage_variation(done, est["per_repeat"], config, data, train, shallow=3, window=1)
  assert calls[-1] == ("variation#1", "3:7,6") and done[-1]["label"] == "variation#1"
  assert late["schedule"] == "3:7,6" and late["why"].startswith("reached it too late")
  assert [c["ratio"] for c in late["vs_each_baseline"]] == pytest.approx([0.75, 0.75])
  never = [{**c, "ratio": None} for c in est["per_repeat"]]
  short = runs.stage_variation(done[:4], never, config, data, train, shallow=3, window=1)
  assert short["schedule"] == "3:3,6" and short["shallow_fraction"] == 0.3

  # The whole comparison: a verdict short of "yes" adds the variation, judged the same way.
  judged = []

  def judge(ratios):
    judged.append(list(ratios))
    return "partly"

  kw = dict(shallow=3, shallow_steps=5, repeats=2, window=1, rounds=2)
  c = runs.stacking_comparison(config, data, train, **kw, judge=judge)
  assert c["schedule"] == "3:5,6" and c["verdict"] == c["variation"]["verdict"] == "partly"
  labels = ["baseline#1", "stacked#1", "stacked#2", "baseline#2", "variation#1"]
  assert [r["label"] for r in c["runs"]] == labels
  assert judged[0] == pytest.approx(est["ratios"]) and judged[1] == pytest.approx([0.75] * 3)
  quick = runs.stacking_comparison(config, data, train, **kw, judge=lambda ratios: "yes")
  assert quick["variation"] is None and len(quick["runs"]) == 4


def test_timed_iterator_passes_the_iterator_through():
  class Fake:
    config, batch_size, step = "cfg", 2, 0

    def state(self):
      return {"step": self.step}

    def set_state(self, s):
      self.step = s["step"]

    def __next__(self):
      self.step += 1
      return {"attention_mask": np.ones((2, 3), np.int32)}

  it = runs.TimedIterator(Fake())
  assert (it.config, it.batch_size, it.step) == ("cfg", 2, 0)
  next(it), next(it)
  assert it.step == 2 and it.tokens == [6, 6] and it.state() == {"step": 2}
  assert len(it.enter) == len(it.exit) == 2 and all(a <= b for a, b in zip(it.enter, it.exit))
  it.set_state({"step": 0})
  assert it.step == 0


def test_sorted_ids_fixes_the_vocabulary_order_and_keeps_the_tokenisation():
  from bertjax.data import corpus as C

  text = ["the cat sat on the mat", "a dog sat on a log", "the dogs and cats sat"] * 20
  trained = C.train_wordpiece(text, 60)
  fixed = runs.sorted_vocabulary(trained)
  tokens = [t for t, _ in sorted(fixed.get_vocab().items(), key=lambda kv: kv[1])]
  assert tokens[:5] == list(C.SPECIAL_TOKENS) and tokens[5:] == sorted(tokens[5:])
  assert set(tokens) == set(trained.get_vocab())
  for s in ("the cats sat on a mat", "dogs log"):
    assert fixed.encode(s).tokens == trained.encode(s).tokens


def test_heldout_sequence_losses_split_the_heldout_loss_by_sequence():
  import bertjax

  config = bertjax.BertConfig.preset("tiny", hidden_dropout_prob=0.0)
  params = bertjax.init(config, 0, heads=("mlm",))
  rng = np.random.default_rng(0)

  def batch(b=4, t=16, p=3):
    weights = (rng.random((b, p)) < 0.7).astype(np.float32)
    weights[0] = 0.0  # a sequence without masked tokens counts 0 of each
    return {
      "input_ids": rng.integers(5, 500, (b, t)).astype(np.int32),
      "attention_mask": np.ones((b, t), np.int32),
      "token_type_ids": np.zeros((b, t), np.int32),
      "mlm_positions": np.stack([rng.permutation(t)[:p] for _ in range(b)]).astype(np.int32),
      "mlm_ids": rng.integers(5, 500, (b, p)).astype(np.int32),
      "mlm_weights": weights,
    }

  batches = [batch(), batch()]
  seq = runs.heldout_sequence_losses(params, config, batches)
  whole = runs.heldout_mlm_loss(params, config, batches)
  assert seq["loss_sum"].shape == seq["masked"].shape == (8,)
  assert seq["masked"].tolist() == [int(w.sum()) for b in batches for w in b["mlm_weights"]]
  assert seq["loss_sum"][0] == seq["loss_sum"][4] == 0.0
  assert seq["loss_sum"].sum() / seq["masked"].sum() == pytest.approx(whole["mlm_loss"], abs=1e-4)


def test_priced_ratio_is_compare_runs_ratio_at_each_price():
  losses = np.linspace(10, 1, 10)
  base = _run(losses, [6.0] + [1.0] * 9, [6] * 10, [5.0])
  stacked = _run(losses, [3.5] + [0.5] * 4 + [3.0] + [1.0] * 4, [3] * 5 + [6] * 5, [3.0, 2.0])
  prices = {3: np.array([0.25, 0.5, 0.1]), 6: np.array([1.0, 2.0, 0.3])}
  got = runs.priced_ratio(base, stacked, 1, prices)
  for i in range(3):
    price = {n: float(p[i]) for n, p in prices.items()}
    assert got[i] == pytest.approx(runs.compare_runs(base, stacked, 1, step_price=price)["ratio"])
  assert runs.priced_ratio(base, stacked, 1, {3: 0.25, 6: 1.0}) == pytest.approx(0.625)
  never = _run(losses + 5, [1.0] * 10, [3] * 5 + [6] * 5, [0.0, 0.0])
  assert runs.priced_ratio(base, never, 1, prices) is None


@pytest.mark.parametrize("paired", [False, True])
def test_resampled_medians_give_scipys_percentile_bootstrap(paired):
  """Each depth's steps resampled on their own (or the rounds together, `paired`): the
  percentile interval of the ratio of medians is `scipy.stats.bootstrap`'s."""
  scipy_stats = pytest.importorskip("scipy.stats")
  rng = np.random.default_rng(5)
  shallow, full = rng.gamma(5, 0.02, 30), rng.gamma(5, 0.04, 30 if paired else 12)
  m = runs.resampled_medians({3: shallow, 6: full}, paired=paired, resamples=500, seed=2)
  assert m[3].shape == m[6].shape == (500,)

  def ratio(a, b, axis=-1):
    return np.median(a, axis=axis) / np.median(b, axis=axis)

  ci = scipy_stats.bootstrap(
    (shallow, full),
    ratio,
    paired=paired,
    vectorized=True,
    n_resamples=500,
    method="percentile",
    random_state=np.random.default_rng(2),
  ).confidence_interval
  np.testing.assert_allclose(np.percentile(m[3] / m[6], [2.5, 97.5]), [ci.low, ci.high])
  with pytest.raises(ValueError, match="one size per depth"):
    runs.resampled_medians({3: shallow, 6: full[:5]}, paired=True)


def test_heldout_sequence_items_pair_the_runs_losses_by_sequence():
  def run(loss_sum, masked=(2, 3, 1)):
    return {"heldout_sequences": {"loss_sum": loss_sum, "masked": list(masked)}}

  stats_ = {"heldout_sequence_unigram_loss_sum": [14.0, 21.0, 7.0]}
  a, b = run([12.0, 15.0, 6.0]), run([10.0, 18.0, 3.0])
  items = runs.heldout_sequence_items([a, b], stats_)
  assert items.shape == (3, 4)
  np.testing.assert_allclose(runs.heldout_losses(items), [33 / 6, 31 / 6, 7.0])
  resampled = items[np.array([[0, 0, 2], [1, 2, 2]])]  # (2 resamples, 3, 4)
  np.testing.assert_allclose(runs.heldout_losses(resampled)[1], [23 / 5, 24 / 5])
  assert runs.heldout_sequence_items([a, {}], stats_) is None
  assert runs.heldout_sequence_items([a, b], {}) is None
  with pytest.raises(ValueError, match="different held-out sequences"):
    runs.heldout_sequence_items([a, run([1.0, 1.0, 1.0], (2, 3, 2))], stats_)
