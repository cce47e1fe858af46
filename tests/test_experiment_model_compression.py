"""Checks of `experiments/model_compression.py`: the shared-layer model, weight bytes, the table's
columns against the models they describe, and the findings' rules."""

import dataclasses
import pathlib
import sys

import jax
import numpy as np
import pytest

import bertjax

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "experiments"))
import model_compression as C


def _teacher(layers=4):
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
  t_config, t_params = _teacher()
  config, params = C.shared_from_teacher(t_config, t_params, block=3)
  assert (config.model_type, config.depth, config.num_param_layers) == ("albert", 4, 1)
  # The same computation as BERT with the teacher's block 3 (index 2) in all four places.
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
  for block in (0, 5):  # blocks count from 1, as everywhere in the project
    with pytest.raises(ValueError, match=rf"--shared-layer {block} must be in 1\.\.4"):
      C.shared_from_teacher(t_config, t_params, block=block)


def test_weight_bytes_count_int8_kernels_and_their_scales():
  _, params = _teacher(layers=2)
  h, f, n = 32, 48, bertjax.count_params(params)
  assert C.weight_bytes(params) == 4 * n
  # Per layer: q, k, v, out (h x h, h scales each), FFN in (h x f, f scales), out (f x h, h);
  # the token classifier (h x 5, 5 scales). All else stays float32.
  kernels = 2 * (4 * h * h + 2 * h * f) + h * 5
  scales = 2 * (4 * h + f + h) + 5
  assert C.weight_bytes(params, int8=True) == 4 * (n - kernels) + kernels + 4 * scales


def test_verdict_rules_and_retained():
  assert C.retained(0.9, 0.96) == pytest.approx(0.9375)
  with pytest.raises(ValueError, match="teacher_score=0"):
    C.retained(0.5, 0)
  assert C.distil_verdict(0.97, 1.8) == "yes" and C.distil_verdict(0.9, 1.8) == "partly"
  assert C.distil_verdict(0.9, 1.1) == "no"
  assert C.sharing_verdict(0.6, 1.0, 0.95) == "yes"
  assert C.sharing_verdict(0.6, 1.0, 0.8) == "partly"
  assert C.sharing_verdict(0.9, 1.0, 0.95) == "no" and C.sharing_verdict(0.6, 2.0, 0.95) == "no"
  assert C.int8_verdict(0.995) == "yes" and C.int8_verdict(0.98) == "partly"
  assert C.int8_verdict(0.9) == "no"


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
