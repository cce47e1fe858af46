"""Packed sequences (`forward(packed=True)`, `bertjax.Packing`) against the padded run.

For every block the families have (absolute, after-padding and sinusoidal positions, rotary
with sliding windows, grouped heads, MPNet's relative bias, DeBERTa's disentangled terms,
ALBERT's shared layers), tiny random models run a batch of mixed lengths padded and
packed: the outputs, every captured site, the attention maps, per-example head masks in
both ablation modes, a layer mask and array patches give the padded run's values at the
real tokens (the padded run is itself checked against transformers elsewhere), and zeros
at padding. The fused Pallas kernel (interpret mode on the CPU) runs the packed rows too.
"""

import jax
import numpy as np
import pytest

import bertjax
from bertjax.model import packing as pk

SMALL = dict(
  vocab_size=1000,
  hidden_size=32,
  num_hidden_layers=3,
  num_attention_heads=4,
  intermediate_size=64,
  max_position_embeddings=64,
)
WINDOWS = ("full_attention", "sliding_attention", "sliding_attention")
CONFIGS = {
  "bert": dict(),
  "roberta": dict(preset="roberta-base", max_position_embeddings=66),
  "distilbert": dict(preset="distilbert-base", sinusoidal_positions=True),
  "albert": dict(preset="albert-base", embedding_size=16, num_hidden_groups=1),
  "modernbert": dict(
    preset="modernbert-base", pad_token_id=0, layer_types=WINDOWS, sliding_window=6
  ),
  "eurobert": dict(preset="eurobert-210m", pad_token_id=0, num_key_value_heads=2),
  "ultrabert": dict(
    model_type="ultrabert",
    num_hidden_layers=3,
    num_key_value_heads=2,
    layer_types=WINDOWS,
    sliding_window=6,
  ),
  "gemma3_text": dict(
    model_type="gemma3_text",
    num_key_value_heads=2,
    layer_types=WINDOWS,
    sliding_window=6,
    query_pre_attn_scalar=5,
  ),
  "nomic_bert": dict(preset="nomic-bert"),
  "neobert": dict(model_type="neobert"),
  "mpnet": dict(preset="mpnet-base"),
  "deberta": dict(preset="deberta-v3-base", position_buckets=8, max_relative_positions=16),
}
LENGTHS = (5, 12, 3, 9, 16, 7)  # padded to 16: first-fit decreasing packs them in 4 rows


def _config(name: str, **extra) -> bertjax.BertConfig:
  fields = dict(CONFIGS[name])
  preset = fields.pop("preset", "tiny")
  return bertjax.BertConfig.preset(preset, **{**SMALL, **fields, **extra})


def _batch(seed: int = 0, lengths=LENGTHS, seq: int = 16):
  rng = np.random.default_rng(seed)
  mask = (np.arange(seq)[None] < np.asarray(lengths)[:, None]).astype(np.int32)
  return rng.integers(5, 1000, mask.shape).astype(np.int32) * mask, mask


def _random_norms(params, seed: int = 1):
  """Norm scales and biases away from 1 and 0, so that no norm hides a misplaced token."""
  leaves, tree = jax.tree_util.tree_flatten_with_path(params)
  rng = np.random.default_rng(seed)
  out = []
  for path, leaf in leaves:
    name = jax.tree_util.keystr(path)
    if "LayerNorm" in name or "norm" in name.lower():
      leaf = leaf + 0.3 * rng.standard_normal(leaf.shape).astype(leaf.dtype)
    out.append(leaf)
  return jax.tree_util.tree_unflatten(tree, out)


def _at_real(array, axes: str, real: np.ndarray, depth: bool):
  """The entries of a padded-layout array at real tokens: its query (first seq axis) real,
  and on (seq, seq) maps its key too (zero elsewhere; scores before the mask are defined
  at padded keys only in the padded run)."""
  a = np.asarray(array)
  names = (["depth"] if depth else []) + axes.split()
  if names.count("seq") == 2:  # (..., batch, heads, seq, seq)
    a = a * real[:, None, None, :]
  a = np.moveaxis(a, [names.index("batch"), names.index("seq")], [0, 1])
  return a[real]


def test_layout_first_fit_decreasing():
  _, mask = _batch()
  p = bertjax.Packing.of(mask)
  assert p.shape == (4, 16) and p.seq == 16
  # 16 | 12 + 3 | 9 + 7 | 5: each sequence whole in one row, longest first.
  assert np.asarray(p.row).tolist() == [3, 1, 1, 2, 0, 2]
  assert np.asarray(p.offset).tolist() == [0, 0, 12, 0, 0, 9]
  assert p.fill == pytest.approx(sum(LENGTHS) / 64)
  seg, pos = np.asarray(p.segment_ids), np.asarray(p.positions)
  assert seg[1].tolist() == [1] * 12 + [2] * 3 + [0]
  assert pos[2].tolist() == list(range(9)) + list(range(7))
  assert np.asarray(p.starts)[1, 13] == 12 and np.asarray(p.ends)[1, 13] == 15
  x = np.arange(6 * 16 * 2, dtype=np.float32).reshape(6, 16, 2) + 1
  back = np.asarray(pk.unpack(pk.pack(x, p), p))
  np.testing.assert_array_equal(back, x * mask[..., None])
  assert bertjax.Packing.of(mask, length=20, rows=5).shape == (5, 20)


@pytest.mark.parametrize(
  "bad, message",
  [
    (dict(mask=[[1, 0, 1, 0]]), "row 0 is not right padding"),
    (dict(mask=[[1, 1, 1, 0]], length=2), "length=2 must be at least the longest"),
    (dict(mask=[[1, 1, 1, 0], [1, 1, 0, 0]], rows=1), "rows=1 is too few"),
    (dict(mask=[1, 1]), r"must be \(batch, seq\)"),
  ],
)
def test_layout_refuses_what_cannot_be_packed(bad, message):
  mask = np.asarray(bad.pop("mask"))
  with pytest.raises(ValueError, match=message):
    bertjax.Packing.of(mask, **bad)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_packed_equals_padded_everywhere(name):
  config = _config(name)
  params = _random_norms(bertjax.init(config, 0))
  ids, mask = _batch()
  real = mask.astype(bool)
  sites = bertjax.model_sites(config)
  rng = np.random.default_rng(2)
  depth, heads = config.depth, config.num_attention_heads
  head_mask = rng.uniform(0, 1, (len(ids), depth, heads)).astype(np.float32)
  mid = bertjax.site_shape(config, "mid", *ids.shape)
  patch = {
    "mid": (
      rng.standard_normal(mid).astype(np.float32),
      rng.uniform(0, 1, mid[:3] + (1,)).astype(np.float32),
    ),
    "v": (0.0, np.float32(0.25)),
  }  # one that broadcasts over batch and seq
  for ablation in ("uniform", "scale"):
    kw = dict(
      capture=sites,
      output_attentions=True,
      output_hidden_states=True,
      head_mask=head_mask,
      head_ablation=ablation,
      layer_mask=np.linspace(1, 0.5, depth, dtype=np.float32),
      patch=patch,
    )
    padded = bertjax.forward(params, config, ids, mask, **kw)
    packed = bertjax.forward(params, config, ids, mask, packed=True, **kw)
    for field in ("last_hidden_state", "hidden_states", "attentions"):
      a, b = getattr(padded, field), getattr(packed, field)
      depth_axis = field != "last_hidden_state"
      axes = "batch heads seq seq" if field == "attentions" else "batch seq hidden"
      np.testing.assert_allclose(
        _at_real(b, axes, real, depth_axis),
        _at_real(a, axes, real, depth_axis),
        atol=2e-5,
        err_msg=f"{name} {ablation} {field}",
      )
      assert not np.asarray(b)[..., ~real, :].any() if field == "last_hidden_state" else True
    if padded.pooler_output is not None:
      np.testing.assert_allclose(packed.pooler_output, padded.pooler_output, atol=2e-5)
    for site in sites:
      axes = bertjax.SITES[site][0]
      np.testing.assert_allclose(
        _at_real(packed.cache[site], axes, real, site != "embeddings"),
        _at_real(padded.cache[site], axes, real, site != "embeddings"),
        atol=2e-5,
        err_msg=f"{name} {ablation} {site}",
      )


def test_pallas_kernel_runs_packed_rows():
  """ModernBERT's window and rotary layers on the fused kernel (interpreted on the CPU),
  packed, against the padded XLA run."""
  config = _config("modernbert")
  params = _random_norms(bertjax.init(config, 0))
  ids, mask = _batch(3)
  real = mask.astype(bool)
  padded = bertjax.forward(params, config, ids, mask)
  fused = config.replace(attention_impl="pallas")
  packed = bertjax.forward(
    params, fused, ids, mask, packed=True, head_mask=np.full((config.depth, 4), 0.5, np.float32)
  )
  masked = bertjax.forward(
    params, config, ids, mask, head_mask=np.full((config.depth, 4), 0.5, np.float32)
  )
  np.testing.assert_allclose(
    np.asarray(packed.last_hidden_state)[real],
    np.asarray(masked.last_hidden_state)[real],
    atol=2e-5,
  )
  assert not np.allclose(
    np.asarray(packed.last_hidden_state)[real],
    np.asarray(padded.last_hidden_state)[real],
    atol=1e-3,
  )


def test_pruned_longer_rows_probs_patches_and_fused_bias():
  """The cases the main test leaves out: a pruned model (blocks unrolled, heads removed);
  rows longer than the batch (`length=`); a probability patch that broadcasts over every
  token (it must stay inside each sequence); MPNet's bias on the fused kernel with
  per-example "uniform" head masks."""
  ids, mask = _batch(5)
  real = mask.astype(bool)
  config = _config("bert")
  params = _random_norms(bertjax.init(config, 0))
  pruned_config, pruned = bertjax.prune_heads(config, params, {0: [1, 3], 2: [0]})
  for cfg, prm, kw in (
    (pruned_config, pruned, dict(head_mask=np.full((3, 4), 0.7, np.float32))),
    (config, params, dict(packed_layout=dict(length=20))),
    # Weight on real keys only: weight on a padded key mixes in the padding's values,
    # which the packed rows do not have (documented).
    (
      config,
      params,
      dict(
        patch={"probs": (np.float32(0.01), 0.5 * mask[:, None, None, :].astype(np.float32))},
        capture=("probs",),
      ),
    ),
  ):
    layout = kw.pop("packed_layout", None)
    packed = bertjax.Packing.of(mask, **layout) if layout else True
    a = bertjax.forward(prm, cfg, ids, mask, **kw)
    b = bertjax.forward(prm, cfg, ids, mask, packed=packed, **kw)
    np.testing.assert_allclose(
      np.asarray(b.last_hidden_state)[real], np.asarray(a.last_hidden_state)[real], atol=2e-5
    )
  assert bertjax.Packing.of(mask, length=20).shape == (3, 20)
  config = _config("mpnet")
  params = _random_norms(bertjax.init(config, 0))
  xi = np.random.default_rng(6).uniform(0, 1, (len(ids), 3, 4)).astype(np.float32)
  a = bertjax.forward(params, config, ids, mask, head_mask=xi, head_ablation="uniform")
  b = bertjax.forward(
    params,
    config.replace(attention_impl="pallas"),
    ids,
    mask,
    packed=True,
    head_mask=xi,
    head_ablation="uniform",
  )
  np.testing.assert_allclose(
    np.asarray(b.last_hidden_state)[real], np.asarray(a.last_hidden_state)[real], atol=2e-5
  )


def test_packing_inside_jit_and_checked_forward():
  config = _config("eurobert")
  params = bertjax.init(config, 0)
  ids, mask = _batch(4)
  real = mask.astype(bool)
  padded = bertjax.forward(params, config, ids, mask).last_hidden_state
  layout = bertjax.Packing.of(mask, rows=5)  # a fixed row count: one program across batches
  run = jax.jit(lambda p, i, m, lay: bertjax.forward(p, config, i, m, packed=lay).last_hidden_state)
  np.testing.assert_allclose(
    np.asarray(run(params, ids, mask, layout))[real], np.asarray(padded)[real], atol=2e-5
  )
  checked = bertjax.checked_forward(params, config, ids, mask, packed=True)
  np.testing.assert_allclose(
    np.asarray(checked.last_hidden_state)[real], np.asarray(padded)[real], atol=2e-5
  )
  unpacked = bertjax.checked_forward(params, config, ids, mask, packed=False)
  np.testing.assert_array_equal(unpacked.last_hidden_state, padded)
  with pytest.raises(TypeError, match="concrete attention_mask"):
    jax.jit(lambda i, m: bertjax.forward(params, config, i, m, packed=True))(ids, mask)


def test_packing_refusals():
  config = _config("bert")
  params = bertjax.init(config, 0)
  ids, mask = _batch()
  with pytest.raises(ValueError, match="function patches"):
    bertjax.forward(
      params, config, ids, mask, packed=True, patch={"out": lambda value, layer: value}
    )
  with pytest.raises(ValueError, match="not 'cudnn'"):
    bertjax.forward(params, config.replace(attention_impl="cudnn"), ids, mask, packed=True)
  with pytest.raises(ValueError, match="not right padding"):
    bertjax.forward(params, config, ids, mask[:, ::-1], packed=True)
  with pytest.raises(ValueError, match=r"Packing is of a \(2, 16\) batch"):
    bertjax.forward(params, config, ids, mask, packed=bertjax.Packing.of(mask[:2]))
  with pytest.raises(ValueError, match="a layout of another batch"):
    bertjax.forward(params, config, ids, mask, packed=bertjax.Packing.of(mask[::-1]))
