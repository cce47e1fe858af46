"""AttnLRP and CP-LRP (`bertjax.analysis.attribution.lrp`): the released code, conservation, sites.

The reference is `lxt` 2.1's BERT patch (`rachtibat/LRP-eXplains-Transformers`, run on
transformers 4.57 by `tests/reference_attnlrp.py`) on a random BERT with randomised norms and
biases, for a classifier logit and an MLM logit on a padded batch with token types. CP-LRP
(the attention weights constant) conserves relevance exactly, which checks every other rule
on every family; AttnLRP's softmax rule does not conserve, and the test measures by how much.
"""

import dataclasses
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax.analysis.attribution import lrp

HF4 = pathlib.Path(sys.prefix) / "hf4"
HERE = pathlib.Path(__file__).parent

SMALL = {
  "vocab_size": 300,
  "hidden_size": 32,
  "num_hidden_layers": 2,
  "num_attention_heads": 4,
  "intermediate_size": 48,
  "max_position_embeddings": 64,
}
WINDOWS = ("full_attention", "sliding_attention")
FAMILIES = {
  "bert": {},
  "roberta": {"preset": "roberta-base", "max_position_embeddings": 66},
  "distilbert": {"preset": "distilbert-base", "sinusoidal_positions": True},
  "albert": {"preset": "albert-base", "embedding_size": 16, "num_hidden_groups": 1},
  "modernbert": {
    "preset": "modernbert-base",
    "pad_token_id": 0,
    "layer_types": WINDOWS,
    "sliding_window": 4,
  },
  "eurobert": {"preset": "eurobert-210m", "pad_token_id": 0, "num_key_value_heads": 2},
  "ultrabert": {
    "model_type": "ultrabert",
    "num_key_value_heads": 2,
    "layer_types": WINDOWS,
    "sliding_window": 4,
  },
  "gemma3_text": {
    "model_type": "gemma3_text",
    "num_key_value_heads": 2,
    "layer_types": WINDOWS,
    "sliding_window": 4,
    "query_pre_attn_scalar": 5,
  },
  "neobert": {"model_type": "neobert"},
  "nomic_bert": {"preset": "nomic-bert"},
  "mpnet": {"preset": "mpnet-base"},
}


def _config(name: str, **extra) -> bertjax.BertConfig:
  fields = dict(FAMILIES[name])
  preset = fields.pop("preset", "tiny")
  return bertjax.BertConfig.preset(preset, **{**SMALL, **fields, **extra})


def _randomised(config, seed=1):
  """Random weights with norm scales and every bias away from 1 and 0."""
  heads = tuple(h for h in ("classifier",) if h in config.family.heads)  # EmbeddingGemma: none
  params = bertjax.init(config, seed, heads=heads)
  leaves, tree = jax.tree_util.tree_flatten_with_path(params)
  rng = np.random.default_rng(seed)
  out = []
  for path, leaf in leaves:
    name = jax.tree_util.keystr(path)
    if "norm" in name.lower() or name.endswith("['bias']") or "relative_attention" in name:
      leaf = leaf + 0.2 * rng.standard_normal(leaf.shape).astype(leaf.dtype)
    out.append(leaf)
  return jax.tree_util.tree_unflatten(tree, out)


def _batch(config, seed=0):
  rng = np.random.default_rng(seed)
  mask = (np.arange(10)[None] < np.array([[10], [6], [8]])).astype(np.int32)
  ids = rng.integers(5, config.vocab_size, mask.shape).astype(np.int32)
  return np.where(mask > 0, ids, config.pad_token_id).astype(np.int32), mask


def _state_target(params, config, out):
  """A readout of the first token's final state on a fixed direction."""
  d = np.random.default_rng(7).standard_normal(out.last_hidden_state.shape[-1])
  return out.last_hidden_state[:, 0] @ jnp.asarray(d, out.last_hidden_state.dtype)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  if not (HF4 / "lxt").is_dir():
    pytest.skip(f"lxt (AttnLRP's released code) expected at {HF4} (./run.sh setup installs it)")
  out = tmp_path_factory.mktemp("lxt")
  env = {**os.environ, "PYTHONPATH": str(HF4), "HF_HUB_OFFLINE": "1"}
  result = subprocess.run(
    [sys.executable, str(HERE / "reference_attnlrp.py"), str(out)],
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  ref = dict(np.load(out / "reference.npz"))
  assert str(ref["transformers"]).startswith("4.57")
  return out, ref


@pytest.mark.parametrize("kind", ["classifier", "mlm"])
def test_matches_the_released_code(reference, kind):
  out, ref = reference
  config, params = bertjax.from_hf(out / kind)
  target = (
    lrp.head_logit("classifier", int(ref["cls"]))
    if kind == "classifier"
    else lrp.token_logit(ref["positions"], ref["tokens"])
  )
  got = lrp.attnlrp(params, config, ref["ids"], ref["mask"], ref["types"], target_fn=target)
  want = ref["r_cls" if kind == "classifier" else "r_mlm"]
  np.testing.assert_allclose(
    got.target, ref["t_cls" if kind == "classifier" else "t_mlm"], atol=1e-5
  )
  scale = np.abs(want).max()
  np.testing.assert_allclose(np.asarray(got.tokens), want, atol=1e-4 * scale)
  # The rules change the answer: plain gradient x input on the word embeddings differs.
  plain = lrp.attnlrp(
    params, config, ref["ids"], ref["mask"], ref["types"], target_fn=target, rules="gradient"
  )
  assert np.abs(np.asarray(plain.tokens) - want).max() > 0.05 * scale


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_cp_lrp_conserves_exactly_and_attnlrp_leaves_softmax_part(family):
  config = _config(family)
  params = _randomised(config)
  ids, mask = _batch(config)
  got = {
    rules: lrp.attnlrp(params, config, ids, mask, target_fn=_state_target, biases=True, rules=rules)
    for rules in ("cp-lrp", "attnlrp")
  }
  cp = got["cp-lrp"]
  parts = (cp.tokens + cp.positions + cp.token_types).sum(-1) + cp.biases
  np.testing.assert_allclose(parts, cp.target, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(cp.absorbed, cp.biases, rtol=1e-4, atol=1e-4)
  assert not np.asarray(cp.tokens)[mask == 0].any()  # padding gets nothing
  attn = got["attnlrp"]
  # The forward is the model's, in another program: float32 rounding of the targets' size
  # (4.8e-7 on 2.5 on an Intel Xeon with AMX, where the rules' programs fuse differently).
  scale = float(np.abs(np.asarray(cp.target)).max())
  np.testing.assert_allclose(attn.target, cp.target, rtol=1e-6, atol=1e-6 * scale)
  assert np.abs(np.asarray(attn.tokens) - np.asarray(cp.tokens)).max() > 1e-4
  assert np.isfinite(attn.absorbed).all() and not np.asarray(attn.tokens)[mask == 0].any()
  if family in ("bert", "roberta", "albert", "distilbert", "mpnet"):
    assert np.abs(np.asarray(cp.positions)).max() > 0  # an absolute or bias table
  if family in ("modernbert", "eurobert", "nomic_bert", "ultrabert", "gemma3_text", "neobert"):
    assert not np.asarray(cp.positions).any()  # rotary: no position vectors


def test_rules_leave_the_forward_pass_unchanged():
  for family in ("bert", "eurobert", "mpnet"):
    config = _config(family)
    params = _randomised(config)
    ids, mask = _batch(config)
    want = bertjax.forward(params, config, ids, mask).last_hidden_state
    for rules in ("attnlrp", "cp-lrp"):
      rc = dataclasses.replace(config, relevance_rules=rules)
      got = bertjax.forward(params, rc, ids, mask).last_hidden_state
      np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_site_relevance_is_value_times_the_rules_gradient():
  """`sites` relevance against an independent route: the site's value times the gradient of
  the target with respect to an array patch of that one block's site (weight 1 there)."""
  config = _config("eurobert")  # gated FFN, RMSNorm, grouped heads, rotary
  params = _randomised(config)
  ids, mask = _batch(config)
  got = lrp.attnlrp(params, config, ids, mask, target_fn=_state_target, sites=("ffn_act", "v"))
  rc = dataclasses.replace(config, relevance_rules="attnlrp")
  for site in ("ffn_act", "v"):
    value = bertjax.forward(params, config, ids, mask, capture=(site,)).cache[site]
    assert got.sites[site].shape == value.shape
    for layer in range(config.depth):
      weight = np.zeros((config.depth,) + (1,) * (value.ndim - 1), np.float32)
      weight[layer] = 1

      def f(v, site=site, weight=weight):
        out = bertjax.forward(params, rc, ids, mask, patch={site: (v, weight)})
        return _state_target(params, rc, out).sum()

      want = value[layer] * jax.grad(f)(value)[layer]
      np.testing.assert_allclose(got.sites[site][layer], want, atol=1e-5)


def test_fused_kernel_gives_the_same_relevance():
  """The rules sit outside the kernel (q, k, the head outputs), so the Pallas kernel
  (interpret mode here) with MPNet's in-tile bias and ModernBERT's window agrees with xla."""
  for family in ("mpnet", "modernbert"):
    config = _config(family)
    params = _randomised(config)
    ids, mask = _batch(config)
    want = lrp.attnlrp(params, config, ids, mask, target_fn=_state_target)
    pallas = dataclasses.replace(config, attention_impl="pallas")
    got = lrp.attnlrp(params, pallas, ids, mask, target_fn=_state_target)
    np.testing.assert_allclose(got.tokens, want.tokens, atol=2e-5)


def test_cp_lrp_conserves_on_minilm(minilm_dir):
  """Real weights: CP-LRP's parts sum to the target; AttnLRP's softmax part is measured."""
  config, params = bertjax.from_hf(minilm_dir)
  tok = bertjax.Tokenizer.from_pretrained(minilm_dir)
  b = tok.encode(
    [
      "The kettle clicked off just as the phone started ringing.",
      "Nobody ever answers the door after nine.",
      "Did you not see the sign?",
    ]
  )
  got = {
    rules: lrp.attnlrp(
      params,
      config,
      b.input_ids,
      b.attention_mask,
      b.token_type_ids,
      target_fn=_state_target,
      biases=True,
      rules=rules,
    )
    for rules in ("cp-lrp", "attnlrp")
  }
  cp = got["cp-lrp"]
  parts = (cp.tokens + cp.positions + cp.token_types).sum(-1) + cp.biases
  np.testing.assert_allclose(parts, cp.target, rtol=1e-4, atol=1e-4)
  attn = got["attnlrp"]
  softmax_part = np.asarray(attn.absorbed - attn.biases)  # what the softmax rule leaves
  assert np.isfinite(softmax_part).all()
  assert (np.abs(softmax_part) > 1e-3 * np.abs(np.asarray(attn.target))).any()


def test_refusals():
  config = _config("bert")
  params = _randomised(config)
  ids, mask = _batch(config)
  with pytest.raises(ValueError, match="rules='lrp'"):
    lrp.attnlrp(params, config, ids, mask, target_fn=_state_target, rules="lrp")
  with pytest.raises(ValueError, match="site 'nope'"):
    lrp.attnlrp(params, config, ids, mask, target_fn=_state_target, sites=("nope",))
  with pytest.raises(ValueError, match="one value per sequence"):
    lrp.attnlrp(params, config, ids, mask, target_fn=lambda p, c, o: o.last_hidden_state)
  deberta = bertjax.BertConfig.preset(
    "deberta-v3-base", **SMALL, position_buckets=8, max_relative_positions=16
  )
  with pytest.raises(ValueError, match="deberta-v2"):
    lrp.attnlrp(bertjax.init(deberta), deberta, ids, mask, target_fn=_state_target)
  with pytest.raises(ValueError, match="relevance_rules='x'"):
    bertjax.BertConfig(relevance_rules="x")
  pconfig, pparams = bertjax.prune_heads(config, params, {0: [1]})
  with pytest.raises(ValueError, match="pruned model"):
    lrp.attnlrp(pparams, pconfig, ids, mask, target_fn=_state_target, sites=("head_out",))
  got = lrp.attnlrp(pparams, pconfig, ids, mask, target_fn=_state_target, sites=("ffn_act",))
  assert np.isfinite(np.asarray(got.tokens)).all()
