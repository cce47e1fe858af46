"""`bertjax.training.compression`: the retained score, the table's rows against the models they
describe, and side-by-side timing (the whole study runs in the model_compression smoke test,
`test_experiments.py`, whose rows `test_experiment_model_compression.check_smoke` checks)."""

import numpy as np
import pytest

import bertjax
from bertjax.quantize import weight_bytes
from bertjax.training import compression


def test_retained_refuses_a_teacher_without_a_score():
  assert compression.retained(0.9, 0.96) == pytest.approx(0.9375)
  with pytest.raises(ValueError, match="teacher_score=0"):
    compression.retained(0.5, 0)


def test_can_share_only_an_unshared_bert():
  bert = bertjax.BertConfig(
    vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32
  )
  assert compression.can_share(bert)
  assert not compression.can_share(bert.replace(model_type="albert", num_hidden_groups=1))


def test_rows_and_timing_describe_the_models():
  config = bertjax.BertConfig(
    vocab_size=50,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=32,
    max_position_embeddings=16,
    num_labels=3,
  )
  params = bertjax.init(config, 0, heads=("token_classifier",))
  small = config.replace(num_hidden_layers=1)
  s_params = bertjax.init(small, 1, heads=("token_classifier",))
  models = {
    "teacher": (config, params),
    "student": (small, s_params),
    "int8": (config.replace(quantize="int8"), params),
  }
  rng = np.random.default_rng(0)
  batch = {
    "input_ids": rng.integers(0, 50, (2, 8)),
    "attention_mask": np.ones((2, 8), np.int32),
    "token_type_ids": np.zeros((2, 8), np.int32),
  }
  speed = compression.time_logits(models, batch, rounds=3)
  for t in speed.values():
    assert len(t["rounds_s"]) == 3 and t["min_s"] <= t["median_s"] and t["compile_s"] > 0
  runs = {"teacher": {"metrics": {"accuracy": 0.8}}, "student": {"metrics": {"accuracy": 0.6}}}
  runs["int8"] = {"metrics": {"accuracy": 0.8}}
  rows = compression.compression_rows(models, runs, speed)
  assert list(rows) == list(models)
  assert rows["student"]["retained"] == pytest.approx(0.75)
  assert rows["student"]["depth"] == 1 and rows["teacher"]["stored_layers"] == 2
  count = bertjax.count_params(params)
  assert rows["teacher"]["params"] == count == rows["int8"]["params"]
  assert rows["student"]["param_ratio"] == pytest.approx(bertjax.count_params(s_params) / count)
  assert rows["teacher"]["bytes"] == 4 * count
  assert rows["int8"]["bytes"] == weight_bytes(params, int8=True) < rows["teacher"]["bytes"]
  assert rows["int8"]["compression"] == pytest.approx(4 * count / rows["int8"]["bytes"])
  want = speed["teacher"]["median_s"] / speed["student"]["median_s"]
  assert rows["student"]["speedup"] == pytest.approx(want) and rows["teacher"]["speedup"] == 1


def test_table_and_labels_follow_the_rows():
  """One Markdown line per row under its label, and labels that name another teacher and its
  students' depth."""
  row = {"depth": 6, "stored_layers": 1, "params": 2.5e6, "mb": 9.96, "score": 0.9,
         "retained": 0.95, "speedup": 1.234}  # fmt: skip
  rows = {r: dict(row) for r in compression.ROLES}
  rows["distilled_3l"]["depth"] = 6
  assert compression.row_labels(rows, "all-MiniLM-L6-v2", "x") == compression.LABELS
  labels = compression.row_labels(rows, "/models/mpnet", "mpnet")
  assert labels["teacher"] == "teacher (mpnet, fine-tuned)"
  assert (
    labels["distilled_3l"] == "DistilBERT-style 6L" and labels["labels_3l"] == "6L, labels only"
  )
  md = compression.compression_table(rows, "a 2-core CPU", labels).splitlines()
  assert len(md) == 2 + len(rows) + 2 and md[-1] == "CPU: a 2-core CPU."
  assert md[2] == "| teacher (mpnet, fine-tuned) | 6 (1) | 2.50M | 10.0 | 90.00% | 95.0% | 1.23x |"
  cpu = {"cpu": "Intel Xeon", "cpus": 2, "isa_flags": ["avx2", "amx"]}
  caption = compression.timing_caption(cpu, batch=32, length=64, rounds=9, load=(1.04, 2.0))
  assert caption == (
    "Intel Xeon, 2 cores (avx2, amx), batch 32 x 64, float32 unless int8, median of 9 "
    "interleaved rounds, load 1.0->2.0"
  )
  assert "(no AVX2+)" in compression.timing_caption(
    {**cpu, "isa_flags": []}, batch=1, length=8, rounds=1, load=(0, 0)
  )


def test_score_held_out_gives_evaluate_s_metrics_and_each_sentence_s_correct_words():
  """The metrics are `finetune.evaluate`'s; the per-sentence counts, summed, give its accuracy
  (and recompute it on any subset of sentences)."""
  from bertjax.training import finetune as F

  config = bertjax.BertConfig(
    vocab_size=50,
    hidden_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=32,
    max_position_embeddings=16,
    num_labels=3,
  )
  params = bertjax.init(config, 0, heads=("token_classifier",))
  rng = np.random.default_rng(1)
  labels = rng.integers(0, 3, (7, 8))
  labels[rng.random((7, 8)) < 0.3] = F.IGNORE_INDEX
  labels[2] = F.IGNORE_INDEX  # a sentence with no scored word
  data = {
    "input_ids": rng.integers(1, 50, (7, 8)),
    "attention_mask": np.ones((7, 8), np.int32),
    "token_type_ids": np.zeros((7, 8), np.int32),
    "labels": labels,
  }
  metrics, correct = compression.score_held_out(
    params, config, data, "token_classification", batch_size=4
  )
  assert metrics == F.evaluate(params, config, data, "token_classification", batch_size=4)
  preds = F.predict(params, config, data, "token_classification").argmax(-1)
  for i in range(7):  # each sentence on its own, word by word
    want = sum(p == y for p, y in zip(preds[i], labels[i]) if y != F.IGNORE_INDEX)
    assert correct[i] == want
  words = (labels != F.IGNORE_INDEX).sum(1)
  assert correct[2] == 0 and correct.sum() / words.sum() == pytest.approx(metrics["accuracy"])


def test_joint_bootstrap_resamples_each_sample_on_its_own():
  """Each sample's interval is the percentile interval of its own resamples (as a plain loop
  computes it); the samples' resamples are independent of each other."""
  rng = np.random.default_rng(0)
  a, b = rng.normal(size=40), rng.exponential(size=(9, 2))
  low, high = compression.joint_bootstrap(
    (a, b), lambda x, y: np.stack([x.mean(1), np.median(y[..., 0], 1)], -1), n_resamples=500
  )
  seeds = np.random.SeedSequence(0).spawn(2)
  ia = np.random.default_rng(seeds[0]).integers(0, 40, (500, 40))
  ib = np.random.default_rng(seeds[1]).integers(0, 9, (500, 9))
  means = [a[i].mean() for i in ia]
  medians = [np.median(b[i, 0]) for i in ib]
  assert low == pytest.approx([np.percentile(means, 2.5), np.percentile(medians, 2.5)])
  assert high == pytest.approx([np.percentile(means, 97.5), np.percentile(medians, 97.5)])
  # The resamples of the two samples do not move together.
  assert abs(np.corrcoef(ia.mean(1), ib.mean(1))[0, 1]) < 0.15
  with pytest.raises(ValueError, match="items"):
    compression.joint_bootstrap((a, np.zeros(0)), lambda x, y: x.mean(1))


def test_judge_joint_states_a_verdict_across_both_samples():
  """A rule on a paired ratio (sentences) and a speed-up (rounds): the verdict at the two ends
  of the joint interval, a constant held as given, and the same text as `Claim.judge`'s."""
  from bertjax import claims

  claim = claims.Claim(
    "P 2020",
    "kept and fast",
    yes=(claims.Test("kept", ">=", 0.95), claims.Test("speed", ">=", 1.3)),
    partly=(claims.Test("kept", ">=", 0.9),),
    applies=(claims.Test("size", "<=", 0.7),),
  )
  rng = np.random.default_rng(0)
  correct = rng.integers(5, 10, (300, 2))  # (sentences, [teacher, student])
  rounds = np.stack([rng.normal(2.0, 0.05, 9), rng.normal(1.0, 0.05, 9)], 1)

  def stats(c, t):
    kept = c[..., 1].sum(-1) / c[..., 0].sum(-1)
    return {"kept": kept, "speed": np.median(t[..., 0], -1) / np.median(t[..., 1], -1)}

  point = {k: float(v[0]) for k, v in stats(correct[None], rounds[None]).items()}
  shown = {"kept": "{:.3f}", "speed": "{:.2f}x", "size": "{}"}
  j = compression.judge_joint(
    claim, (correct, rounds), stats, point=point, over="both", shown=shown, fixed={"size": 0.5}
  )
  lo, hi = compression.joint_bootstrap((correct, rounds), lambda c, t: stats(c, t)["kept"])
  assert j.intervals["kept"] == pytest.approx((lo, hi)) and "size" not in j.intervals
  assert j.text == f"95% CI over both: kept [{lo:.3f}, {hi:.3f}], speed " + (
    f"[{j.intervals['speed'][0]:.2f}x, {j.intervals['speed'][1]:.2f}x]"
  )
  assert j.verdict == claim.verdict({**point, "size": 0.5}) and j.values["size"] == 0.5
  # The student keeps about as many words as the teacher: kept straddles 0.95 and 1.
  ratio = correct[:, 1].sum() / correct[:, 0].sum()
  want = ("yes",) * 2 if lo >= 0.95 else ("partly", "yes") if lo >= 0.9 else None
  assert 0.9 < ratio < 1.1 and (want is None or j.span == want), (ratio, lo, j.span)
  # A constant outside `applies`: n/a on every resample.
  na = compression.judge_joint(
    claim, (correct, rounds), stats, point=point, over="x", shown={}, fixed={"size": 0.9}
  )
  assert na.verdict == "n/a" and na.span == ("n/a", "n/a") and na.text == "95% CI over x: "


def test_model_labels_name_the_models_compress_makes():
  config = bertjax.BertConfig(
    vocab_size=50, hidden_size=16, num_hidden_layers=4, num_attention_heads=2, intermediate_size=32
  )
  labels = compression.model_labels(config, "/models/x", "x")
  assert labels["distilled_3l"] == "DistilBERT-style 2L"
  assert labels["shared_6l"] == "ALBERT-style shared 4L"
  assert (
    compression.relabelled(labels, "labels_3l: accuracy 0.5") == "2L, labels only: accuracy 0.5"
  )
  assert compression.relabelled(labels, "step 3: loss 1") == "step 3: loss 1"
