"""Checks of `experiments/model_compression.py`: the shared-layer model, weight bytes, the table's
columns against the models they describe, and the findings' rules."""

import dataclasses
import pathlib
import sys

import jax
import pytest

import bertjax

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "experiments"))
import model_compression as C
from rules import model_compression as rules


def test_verdict_rules():
  distil = lambda kept, speed: rules.DISTIL.verdict({rules.RETAINED: kept, rules.SPEEDUP: speed})
  assert distil(0.97, 1.8) == "yes" and distil(0.9, 1.8) == "partly" and distil(0.9, 1.1) == "no"
  sharing = lambda params, speed, kept: rules.SHARING.verdict(
    {rules.PARAMS: params, rules.SPEEDUP: speed, rules.RETAINED: kept}
  )
  assert sharing(0.6, 1.0, 0.95) == "yes" and sharing(0.6, 1.0, 0.8) == "partly"
  assert sharing(0.9, 1.0, 0.95) == "no" and sharing(0.6, 2.0, 0.95) == "no"
  assert sharing(None, None, None) == "n/a"  # a teacher without an ALBERT counterpart
  int8 = lambda kept: rules.INT8.verdict({rules.RETAINED: kept})
  assert int8(0.995) == "yes" and int8(0.98) == "partly" and int8(0.9) == "no"


def check_smoke(doc: dict, out: pathlib.Path) -> None:
  """The smoke run's table describes its models (run by `test_experiments.py`)."""
  assert doc["smoke"] is True and list(doc["results"]["rows"]) == list(C.ROWS)
  rows, configs = doc["results"]["rows"], doc["settings"]["configs"]
  teacher = rows["teacher"]
  for name, r in rows.items():
    config = bertjax.BertConfig(
      **{k: tuple(v) if isinstance(v, list) else v for k, v in configs[name].items()}
    )
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
  assert rows["int8"]["params"] == teacher["params"]
  assert rows["int8"]["bytes"] < teacher["bytes"] == 4 * teacher["params"]
  assert configs["int8"]["quantize"] == "int8" and configs["teacher"]["quantize"] is None
  assert doc["results"]["cpu"]["cpu"] and "| CPU speed-up |" in doc["results"]["table_markdown"]
  assert dataclasses.asdict(C.SMOKE)["steps"] == doc["settings"]["steps"]
  # --shared-layer counts blocks from 1; its default, block 3, is what 0-based 2 named.
  assert doc["settings"]["shared_layer"] == 3
  assert "from teacher block 3," in doc["findings"][1]["measured"]


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
      str(REPO / "experiments" / "model_compression.py"),
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
    check=False,
  )
  assert run.returncode == 1, run.stderr[-2000:]
  assert "Traceback" not in run.stderr
  assert run.stderr.strip().splitlines()[-1] == (
    "error: --shared-layer 9 must be in 1..4 (the teacher's blocks, counted from 1)"
  )
