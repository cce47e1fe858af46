"""Checks of `experiments/model_compression.py`: the shared-layer model, weight bytes, the table's
columns against the models they describe, the names the log gives the models, and the findings'
rules."""

import contextlib
import dataclasses
import io
import json
import os
import pathlib
import re
import sys

import jax
import numpy as np
import pytest

import bertjax
from experiments import model_compression as C

REPO = pathlib.Path(__file__).resolve().parents[1]

XLA_FLAGS = os.environ.get("XLA_FLAGS")  # this process's own (conftest's), before any run
DISABLED = jax.config.values["jax_disable_most_optimizations"]  # conftest's: True


def test_verdict_rules():
  distil = lambda kept, speed: C.DISTIL.verdict({C.RETAINED: kept, C.SPEEDUP: speed})
  assert distil(0.97, 1.8) == "yes" and distil(0.9, 1.8) == "partly" and distil(0.9, 1.1) == "no"
  sharing = lambda params, speed, kept: C.SHARING.verdict(
    {C.PARAMS: params, C.SPEEDUP: speed, C.RETAINED: kept}
  )
  assert sharing(0.6, 1.0, 0.95) == "yes" and sharing(0.6, 1.0, 0.8) == "partly"
  assert sharing(0.9, 1.0, 0.95) == "no" and sharing(0.6, 2.0, 0.95) == "no"
  assert sharing(None, None, None) == "n/a"  # a teacher without an ALBERT counterpart
  int8 = lambda kept: C.INT8.verdict({C.RETAINED: kept})
  assert int8(0.995) == "yes" and int8(0.98) == "partly" and int8(0.9) == "no"


def check_smoke(doc: dict, out: pathlib.Path) -> None:
  """The smoke run's table describes its models (run by `test_experiments.py`)."""
  assert doc["smoke"] is True and list(doc["results"]["rows"]) == list(C.ROWS)
  rows, configs = doc["results"]["rows"], doc["settings"]["configs"]
  teacher = rows["teacher"]
  for name, r in rows.items():
    config = bertjax.BertConfig(**configs[name])  # JSON's lists become tuples
    shapes = jax.eval_shape(lambda c=config: bertjax.init(c, 0, heads=("token_classifier",)))
    assert r["params"] == bertjax.count_params(shapes), name
    assert (r["depth"], r["stored_layers"]) == (config.depth, config.num_param_layers)
    assert r["retained"] == pytest.approx(r["score"] / teacher["score"])
    assert r["speedup"] == pytest.approx(teacher["forward_median_s"] / r["forward_median_s"])
    assert 0 <= r["score"] <= 1 and r["forward_median_s"] > 0
  assert teacher["speedup"] == 1.0 and teacher["retained"] == 1.0
  assert rows["distilled_3l"]["depth"] == teacher["depth"] // 2 == 2
  assert rows["shared_6l"]["stored_layers"] == 1
  assert rows["shared_6l"]["depth"] == teacher["depth"]
  # The table (logged as it is) names each model by its own layer count.
  half, depth, md = (
    rows["distilled_3l"]["depth"],
    teacher["depth"],
    doc["results"]["table_markdown"],
  )
  assert f"| DistilBERT-style {half}L | {half} ({half}) |" in md
  assert f"| {half}L, labels only | {half} ({half}) |" in md
  assert f"| ALBERT-style shared {depth}L | {depth} (1) |" in md
  assert doc["settings"]["xla_optimised"] is False and "optimisations off (--smoke)" in md
  assert rows["int8"]["params"] == teacher["params"]
  assert rows["int8"]["bytes"] < teacher["bytes"] == 4 * teacher["params"]
  quantize = lambda name: bertjax.BertConfig(**configs[name]).quantize  # as written, grouped
  assert quantize("int8") == "int8" and quantize("teacher") is None
  assert doc["results"]["cpu"]["cpu"] and "| CPU speed-up |" in doc["results"]["table_markdown"]
  assert dataclasses.asdict(C.SMOKE)["steps"] == doc["settings"]["steps"]
  # --shared-layer counts blocks from 1; its default, block 3, is what 0-based 2 named.
  assert doc["settings"]["shared_layer"] == 3
  assert "from teacher block 3," in doc["findings"][1]["measured"]
  # Each model's correct words per held-out sentence give its score again, and the rows'
  # intervals resample them (paired with the teacher's) and the timing rounds.
  words = np.asarray(doc["results"]["data"]["words_per_sentence"])
  assert words.sum() == doc["results"]["data"]["heldout_words"]
  for name, run in doc["results"]["runs"].items():
    correct = np.asarray(run["correct"])
    assert correct.shape == words.shape and (correct <= words).all(), name
    assert correct.sum() / words.sum() == pytest.approx(rows[name]["score"]), name
  judged = C.uncertainty(doc["results"], doc["settings"])
  assert [j.claim for j in judged] == [C.DISTIL, C.SHARING, C.INT8]
  assert all(C.RETAINED in j.intervals for j in judged) and C.SPEEDUP in judged[0].intervals
  assert judged[1].text.startswith("exact: parameters (") and "95% CI over the " in judged[0].text


@pytest.fixture(scope="module")
def quick_smoke(tmp_path_factory):
  """The --smoke run in this process with training and timing stubbed out (its log, the
  tokenizer loads, its JSON): the log's names, not the numbers, are under test."""
  from bertjax.training import compression
  from bertjax.training import finetune as F

  def finetune(config, params, train, held, **kw):
    done = {"final_loss": 1.0, "wall_time_s": 0.0, "history": [{"loss": 1.0}]}
    return {**done, "metrics": {"accuracy": 0.5}, "config": config, "params": params}

  def score_held_out(params, config, data, task, **kw):
    return {"accuracy": 0.5}, np.zeros(len(data["labels"]), np.int32)

  def time_logits(models, batch, **kw):
    return {k: {"compile_s": 0.1, "median_s": 0.01, "min_s": 0.01, "rounds_s": []} for k in models}

  loads = []
  load = bertjax.Tokenizer.from_pretrained.__func__
  out, err = tmp_path_factory.mktemp("smoke"), io.StringIO()
  with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stderr(err):
    mp.setattr(F, "finetune", finetune)
    mp.setattr(F, "evaluate", lambda *a, **kw: {"accuracy": 0.5})
    mp.setattr(compression, "score_held_out", score_held_out)
    mp.setattr(compression, "time_logits", time_logits)
    mp.setattr(
      bertjax.Tokenizer,
      "from_pretrained",
      classmethod(lambda *a, **kw: loads.append(a) or load(*a, **kw)),
    )
    # The suite compiles with most optimisations off (conftest): start from XLA's default to
    # see the smoke run turn them off and give the setting back.
    jax.config.update("jax_disable_most_optimizations", False)
    try:
      assert C.main(["--smoke", "--out", str(out)]) == 0
      optimised_after = jax.config.values["jax_disable_most_optimizations"] is False
    finally:
      jax.config.update("jax_disable_most_optimizations", DISABLED)
  doc = json.loads((out / "model_compression.json").read_text())
  return err.getvalue(), loads, doc, optimised_after


def test_the_smoke_log_names_models_by_their_layer_counts(quick_smoke):
  log, _, doc, _ = quick_smoke
  rows = doc["results"]["rows"]
  half, depth = rows["distilled_3l"]["depth"], rows["teacher"]["depth"]
  assert (half, depth) == (2, 4)  # not all-MiniLM-L6-v2's 3 and 6, which the role keys name
  for name in (
    f"DistilBERT-style {half}L",
    f"{half}L, labels only",
    f"ALBERT-style shared {depth}L",
  ):
    assert f"] {name}: accuracy 0.5000" in log, log
    assert f"| {name} |" in log
  assert not re.search(r"_3l|_6l|\b[36]L\b", log), log


def test_the_smoke_run_loads_its_tokenizer_once(quick_smoke):
  assert len(quick_smoke[1]) == 1


def test_smoke_compiles_quickly_and_gives_the_settings_back(quick_smoke):
  log, _, doc, _ = quick_smoke
  assert "XLA compiles with most optimisations off" in log and not doc["settings"]["xla_optimised"]
  assert quick_smoke[3]  # XLA's optimisations back on after the run
  assert os.environ.get("XLA_FLAGS") == XLA_FLAGS


def test_shared_layer_out_of_range_fails_before_training(tmp_path):
  with pytest.raises(ValueError, match=r"--shared-layer 0 must be in 1\.\.4"):
    C.main(["--smoke", "--out", str(tmp_path), "--shared-layer", "0"])
  assert not (tmp_path / "model_compression.json").exists()


@pytest.mark.slow
def test_a_bad_shared_layer_is_one_line_without_a_traceback(tmp_path):
  import subprocess

  run = subprocess.run(
    [
      sys.executable,
      "-m",
      "experiments.model_compression",
      "--smoke",
      "--out",
      str(tmp_path),
      "--shared-layer",
      "9",
    ],
    capture_output=True,
    text=True,
    timeout=600,
    cwd=tmp_path,
    env={**os.environ, "PYTHONPATH": str(REPO)},
    check=False,
  )
  assert run.returncode == 1, run.stderr[-2000:]
  assert "Traceback" not in run.stderr
  assert run.stderr.strip().splitlines()[-1] == (
    "error: --shared-layer 9 must be in 1..4 (the teacher's blocks, counted from 1)"
  )
