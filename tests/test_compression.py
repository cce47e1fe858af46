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
