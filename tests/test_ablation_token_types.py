"""Ablation's one-device and mesh paths feed the model the same token types.

DistilBERT has no token-type embeddings (`type_vocab_size == 0`), yet its tokenizers number a
pair's segments 0 and 1 and a batch keeps them; the model must get none
(`batching.model_token_types`). The mesh path did that; the one-device path handed the segment
ids straight to the embeddings (which skip them without token-type weights, so the numbers
agreed all the same: the first test records what the embeddings get). Both paths now start at
`batching.embed_batch`. The mesh runs need two CPU devices
(`--xla_force_host_platform_device_count`), set before JAX starts, so they run in a
subprocess, as in tests/test_sharded_analyses.py.
"""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from conftest import FAST_COMPILE

import bertjax
from bertjax.analysis.interventions import ablation

REPO = pathlib.Path(__file__).resolve().parents[1]


def _model(model_type):
  """A tiny model with an MLM head: "distilbert" (no token types) or "bert" (two)."""
  extra = dict(type_vocab_size=0) if model_type == "distilbert" else {}
  cfg = bertjax.BertConfig(
    model_type=model_type,
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=64,
    **extra,
  )
  return cfg, bertjax.init(cfg, 0, ("mlm",))


def _pairs():
  """One batch of five sentence pairs (segment ids 0, then 1), MLM labels; three head masks."""
  rs = np.random.default_rng(0)
  ids = rs.integers(5, 99, (5, 12)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[1, 9:] = 0
  types = np.zeros_like(ids)
  types[:, 6:] = 1  # the second sentence of each pair
  labels = np.where(rs.random(ids.shape) < 0.3, ids, -100).astype(np.int32)
  batch = dict(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels)
  head_masks = np.ones((3, 2, 4), np.float32)
  head_masks[1, 0, 1] = 0
  head_masks[2, 1, 3] = 0
  return [batch], head_masks


MESH = textwrap.dedent("""
    import json, os, sys
    os.environ["XLA_FLAGS"] = ("--xla_force_host_platform_device_count=2 "
                               + os.environ.get("XLA_FLAGS", ""))
    import jax
    assert jax.device_count() == 2
    sys.path.insert(0, sys.argv[1])
    import numpy as np
    from test_ablation_token_types import _model, _pairs
    from bertjax import mesh as mesh_lib
    from bertjax.analysis.interventions import ablation

    batches, head_masks = _pairs()

    def values(cfg, params, batches, mesh):
      base, masked = ablation.evaluate_masks(params, cfg, batches, ablation.mlm_batch_loss,
                                             head_masks, mesh=mesh)
      importance = ablation.head_importance(params, cfg, batches, ablation.mlm_batch_loss,
                                            mesh=mesh)
      return [base, *masked.tolist(), *importance.ravel().tolist()]

    one_type = [dict(batches[0], token_type_ids=np.zeros_like(batches[0]["token_type_ids"]))]
    out = {}
    for model_type in ("distilbert", "bert"):
      cfg, params = _model(model_type)
      out[model_type] = {
        "one device": values(cfg, params, batches, None),
        "one type": values(cfg, params, one_type, None),
      }
      for shape in ((2, 1), (1, 2)):
        out[model_type][f"mesh {shape}"] = values(cfg, params, batches,
                                                  mesh_lib.make_mesh(*shape))
    print("RESULT " + json.dumps(out))
""")


def test_the_model_gets_no_token_types_without_token_type_embeddings(monkeypatch):
  """On one device (the prefix and loop strategies, head importance) the embeddings of a
  DistilBERT model get all-zero token types for a pair batch, as on the mesh: recorded as the
  compiled programs run (this file's model is compiled nowhere else, so none is cached)."""
  from bertjax.model import forward as forward_lib

  cfg, params = _model("distilbert")
  batches, head_masks = _pairs()
  seen = []
  real = forward_lib.Embeddings

  class Recording:
    """`Embeddings(config)` that records the token types it is applied to."""

    def __init__(self, config):
      self.module = real(config)

    def apply(self, variables, input_ids, token_type_ids, **kwargs):
      jax.debug.callback(lambda t: seen.append(np.asarray(t)), token_type_ids)
      return self.module.apply(variables, input_ids, token_type_ids, **kwargs)

  monkeypatch.setattr(forward_lib, "Embeddings", Recording)
  for strategy in ("prefix", "loop"):
    ablation.evaluate_masks(
      params, cfg, batches, ablation.mlm_batch_loss, head_masks, strategy=strategy
    )
  ablation.head_importance(params, cfg, batches, ablation.mlm_batch_loss)
  assert len(seen) >= 3
  assert all(not t.any() for t in seen), [np.unique(t).tolist() for t in seen]


@pytest.mark.slow
def test_pair_inputs_give_the_same_ablation_on_one_device_and_on_a_mesh():
  """DistilBERT (no token types) and BERT (token types) pair batches: the masked losses and
  head importance on one device equal those on 2x1 and 1x2 meshes; BERT's depend on the
  segment ids (they reach the model), DistilBERT's do not."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=FAST_COMPILE)
  env.pop("JAX_COORDINATOR_ADDRESS", None)
  proc = subprocess.run(
    [sys.executable, "-c", MESH, str(REPO / "tests")],
    env=env,
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
  got = json.loads(line.removeprefix("RESULT "))
  for model_type, runs in got.items():
    want = np.asarray(runs["one device"])
    for name in ("mesh (2, 1)", "mesh (1, 2)"):
      np.testing.assert_allclose(runs[name], want, rtol=2e-5, err_msg=f"{model_type}: {name}")
  np.testing.assert_allclose(got["distilbert"]["one type"], got["distilbert"]["one device"])
  assert np.abs(np.subtract(got["bert"]["one type"], got["bert"]["one device"])).max() > 1e-3
