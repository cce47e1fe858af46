"""bertjax's rotated interchange intervention against pyvene's (0.1.8, `RotatedSpaceIntervention`)
on the real all-MiniLM-L6-v2 and the indirect-object task's pairs (positions and lengths differ
from pair to pair): with the rotation pyvene realises, interchanging its first k coordinates
of block 3's output at each pair's repeated name gives the same final states to float32
rounding, and they differ from the plain run by far more."""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import bertjax
from bertjax.analysis.causal import interchange as ci
from bertjax.tasks import counterfactual as cf

HF4 = pathlib.Path(sys.prefix) / "hf4"
LAYER, K = 2, 16


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  if not (HF4 / "pyvene").is_dir():
    pytest.skip(f"pyvene expected at {HF4} (./run.sh setup installs it)")
  tok = bertjax.Tokenizer.from_pretrained(bertjax.minilm_path())
  pairs = cf.ioi_pairs(tok, 6, seed=4).pairs
  tmp = tmp_path_factory.mktemp("pyvene")
  np.savez(
    tmp / "in.npz",
    base_ids=pairs.base_ids,
    source_ids=pairs.source_ids,
    attention_mask=pairs.attention_mask,
    positions=pairs.positions[:, 0],
    layer=LAYER,
    k=K,
    seed=0,
  )
  env = {**os.environ, "PYTHONPATH": str(HF4), "HF_HUB_OFFLINE": "1", "USE_TF": "0"}
  script = pathlib.Path(__file__).parent / "reference_pyvene.py"
  result = subprocess.run(
    [sys.executable, str(script), str(tmp / "in.npz"), str(tmp / "out.npz"), bertjax.minilm_path()],
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  ref = dict(np.load(tmp / "out.npz"))
  assert str(ref["transformers"]).startswith("4.57")
  return pairs, ref


def test_rotated_interchange_is_pyvenes(reference):
  pairs, ref = reference
  assert len(set(pairs.positions[:, 0])) > 1 and (pairs.attention_mask == 0).any()
  rotation = ref["rotation"]
  np.testing.assert_allclose(rotation.T @ rotation, np.eye(len(rotation)), atol=1e-5)
  config, params = bertjax.from_hf(bertjax.minilm_path())
  mask = pairs.attention_mask
  source = bertjax.forward(params, config, pairs.source_ids, mask, capture=("out",)).cache["out"]
  w = ci.position_weight(config, "out", LAYER, pairs.positions, pairs.base_ids.shape[1], K)
  iv = bertjax.Intervention(subspace={"out": (source, rotation[:, :K].T, w)})
  got = np.asarray(
    bertjax.forward(params, config, pairs.base_ids, mask, intervention=iv).last_hidden_state
  )
  real = mask.astype(bool)
  np.testing.assert_allclose(got[real], ref["last_hidden_state"][real], atol=2e-5)
  plain = np.asarray(bertjax.forward(params, config, pairs.base_ids, mask).last_hidden_state)
  assert np.abs(plain - ref["last_hidden_state"])[real].max() > 0.05
