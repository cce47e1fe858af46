"""Physical head pruning: equals masking, exports Hugging Face `pruned_heads`, loads in transformers 4.57."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import bertjax

CONFIG = bertjax.BertConfig.preset("tiny", num_hidden_layers=3, vocab_size=101)
PRUNE = {0: [1], 2: [0, 2, 3]}
HF4 = pathlib.Path(sys.prefix) / "hf4"


def _inputs():
  rng = np.random.default_rng(0)
  ids = rng.integers(1, CONFIG.vocab_size, (2, 9)).astype(np.int32)
  mask = np.ones((2, 9), np.int32)
  mask[1, 5:] = 0
  return ids, mask


def _masked_and_pruned():
  params = bertjax.init(CONFIG, 0, heads=("classifier",))
  xi = np.ones((CONFIG.depth, CONFIG.num_attention_heads), np.float32)
  for layer, heads in PRUNE.items():
    xi[layer, heads] = 0
  config, pruned = bertjax.prune_heads(CONFIG, params, PRUNE)
  return params, xi, config, pruned


def test_pruned_equals_masked_and_is_smaller():
  params, xi, config, pruned = _masked_and_pruned()
  ids, mask = _inputs()
  masked = bertjax.forward(params, CONFIG, ids, mask, head_mask=xi, output_attentions=True)
  out = bertjax.forward(pruned, config, ids, mask, output_attentions=True)
  m = mask.astype(bool)
  np.testing.assert_allclose(
    np.asarray(out.last_hidden_state)[m], np.asarray(masked.last_hidden_state)[m], atol=1e-5
  )
  np.testing.assert_allclose(
    np.asarray(out.pooler_output), np.asarray(masked.pooler_output), atol=1e-5
  )
  # Maps keep the original head indexing; removed heads are all zero.
  assert out.attentions.shape == masked.attentions.shape
  assert not np.asarray(out.attentions[2, :, [0, 2, 3]]).any()
  removed = 4 * (CONFIG.hidden_size * CONFIG.head_dim * 4 + 3 * CONFIG.head_dim)
  assert bertjax.count_params(params) - bertjax.count_params(pruned) == removed
  assert config.kept_heads(2) == (1,) and config.kept_heads(1) == (0, 1, 2, 3)
  # Pruning again composes, in original head indices; a bad index is named.
  config2, pruned2 = bertjax.prune_heads(config, pruned, {2: [1], 1: [3]})
  assert dict(config2.pruned_heads) == {0: (1,), 1: (3,), 2: (0, 1, 2, 3)}
  # ... and equals masking all those heads on the original model.
  xi2 = np.array(xi, np.float32)
  xi2[2, 1] = 0
  xi2[1, 3] = 0
  want = bertjax.forward(params, CONFIG, ids, mask, head_mask=xi2).last_hidden_state
  got = bertjax.forward(pruned2, config2, ids, mask).last_hidden_state
  np.testing.assert_allclose(np.asarray(got)[m], np.asarray(want)[m], atol=1e-5)
  assert not np.allclose(np.asarray(got)[m], np.asarray(out.last_hidden_state)[m], atol=1e-3)
  with pytest.raises(ValueError, match=r"heads_to_prune\[1\]=\[7\]"):
    bertjax.prune_heads(config, pruned, {1: [7]})


def test_pruned_round_trip(tmp_path):
  _, _, config, pruned = _masked_and_pruned()
  bertjax.to_hf(config, pruned, tmp_path, pruned="remove")
  assert json.loads((tmp_path / "config.json").read_text())["pruned_heads"] == {
    "0": [1],
    "2": [0, 2, 3],
  }
  config2, pruned2 = bertjax.from_hf(tmp_path)
  assert config2 == config
  ids, mask = _inputs()
  a = bertjax.forward(pruned, config, ids, mask).last_hidden_state
  b = bertjax.forward(pruned2, config2, ids, mask).last_hidden_state
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


_LOAD_IN_HF4 = """
import json, sys, numpy as np, torch, transformers
model, info = transformers.BertForSequenceClassification.from_pretrained(
    sys.argv[1], output_loading_info=True, attn_implementation="eager")
ids, mask = np.load(sys.argv[2])["ids"], np.load(sys.argv[2])["mask"]
with torch.no_grad():
  out = model.eval()(input_ids=torch.tensor(ids).long(), attention_mask=torch.tensor(mask).long())
print(json.dumps({"version": transformers.__version__, "info": {k: list(v) for k, v in info.items()},
                  "pruned": {str(k): sorted(v) for k, v in model.config.pruned_heads.items()},
                  "logits": out.logits.tolist()}))
"""


@pytest.mark.slow
@pytest.mark.hf
def test_pruned_checkpoint_loads_in_transformers_4(tmp_path):
  if not (HF4 / "transformers").is_dir():
    pytest.skip(f"transformers 4.57 expected at {HF4} (./run.sh setup installs it)")
  params, xi, config, pruned = _masked_and_pruned()
  bertjax.to_hf(config, pruned, tmp_path / "model", pruned="remove")
  ids, mask = _inputs()
  np.savez(tmp_path / "inputs.npz", ids=ids, mask=mask)
  env = {**os.environ, "PYTHONPATH": str(HF4), "HF_HUB_OFFLINE": "1"}
  result = subprocess.run(
    [sys.executable, "-c", _LOAD_IN_HF4, str(tmp_path / "model"), str(tmp_path / "inputs.npz")],
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  got = json.loads(result.stdout.strip().splitlines()[-1])
  assert got["version"].startswith("4.57")
  assert not any(got["info"].values()), got["info"]
  assert got["pruned"] == {"0": [1], "2": [0, 2, 3]}
  ours = bertjax.classify(pruned, config, bertjax.forward(pruned, config, ids, mask).pooler_output)
  np.testing.assert_allclose(np.asarray(ours), np.asarray(got["logits"]), atol=1e-4)
  masked = bertjax.forward(params, CONFIG, ids, mask, head_mask=xi).pooler_output
  np.testing.assert_allclose(
    np.asarray(bertjax.classify(params, CONFIG, masked)), np.asarray(got["logits"]), atol=1e-4
  )


@pytest.mark.hf
def test_default_export_of_a_pruned_model_loads_in_installed_transformers(tmp_path):
  """transformers 5 has no head pruning: the default export writes the removed heads as
  zeros at full size, which it loads strictly and runs to the same logits."""
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  _, _, config, pruned = _masked_and_pruned()
  bertjax.to_hf(config, pruned, tmp_path)
  hf = json.loads((tmp_path / "config.json").read_text())
  assert "pruned_heads" not in hf
  model, info = transformers.BertForSequenceClassification.from_pretrained(
    str(tmp_path), output_loading_info=True, attn_implementation="eager"
  )
  assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
  ids, mask = _inputs()
  with torch.no_grad():
    theirs = model.eval()(
      input_ids=torch.tensor(ids).long(), attention_mask=torch.tensor(mask).long()
    ).logits.numpy()
  ours = bertjax.classify(pruned, config, bertjax.forward(pruned, config, ids, mask).pooler_output)
  np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-5)
  config2, params2 = bertjax.from_hf(tmp_path)  # unpruned, with zero heads: same outputs
  assert not config2.is_pruned
  got = bertjax.classify(
    params2, config2, bertjax.forward(params2, config2, ids, mask).pooler_output
  )
  np.testing.assert_allclose(np.asarray(got), np.asarray(ours), atol=1e-5)
  with pytest.raises(ValueError, match="pruned='drop' must be one of"):
    bertjax.to_hf(config, pruned, tmp_path / "x", pruned="drop")
