"""AtP* (`bertjax.analysis.interventions.atp_star`): the QK fix and GradDrop against direct computations.

On a tiny random BERT with a large init std (its attention saturates): the QK-fixed estimate of
each (layer, head) of `k` and `q` equals the metric's derivative along the exact change of the
attention maps, the maps computed here in NumPy from the captured queries and keys (and, on
EuroBERT's grouped key/value heads and rotary positions, from a patched forward); it is closer
to exact head patching than plain attribution patching; without the fixes it is
`attribution_patching`; GradDrop equals L backward passes with one block's `attn_out` and
`ffn_out` stop-gradiented through function patches, combined as `sum_d |c_{-d}| / (L - 1)`.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax.analysis.interventions import atp_star, metrics, patching

B, T, L = 3, 9, 3


def _bert():
  config = bertjax.BertConfig.preset(
    "tiny", vocab_size=97, max_position_embeddings=32, num_hidden_layers=L, initializer_range=0.5
  )
  return config, bertjax.init(config, 0, heads=("mlm",))


def _pair():
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 97, (B, T)).astype(np.int32)
  corrupted = ids.copy()
  corrupted[:, 2] = rng.integers(5, 97, B)
  corrupted[:, 5] = rng.integers(5, 97, B)
  mask = np.ones((B, T), np.int32)
  mask[1, 6:] = 0  # right padding in one sequence
  targets = {
    "position": np.array([4, 3, 7]),
    "answer": np.array([11, 12, 13]),
    "distractor": np.array([20, 21, 22]),
  }
  return (
    {"input_ids": ids, "attention_mask": mask},
    {"input_ids": corrupted, "attention_mask": mask},
    targets,
  )


METRIC = metrics.LogitDiff("mlm")


@pytest.fixture(scope="module")
def bert():
  config, params = _bert()
  clean, corrupted, targets = _pair()
  runs = {
    name: bertjax.forward(
      params, config, b["input_ids"], b["attention_mask"], capture=("q", "k", "probs")
    ).cache
    for name, b in (("clean", clean), ("corrupted", corrupted))
  }
  return config, params, clean, corrupted, targets, runs


def _cut(drop):
  """A function patch: no gradient through block `drop`'s output (forward unchanged)."""
  return lambda value, layer: jnp.where(layer == drop, jax.lax.stop_gradient(value), value)


def _along_maps(params, config, dst, targets, maps, drop=-1):
  """d metric / d w_{l,n} at w = 0 of the destination run with probs -> probs + w (maps -
  probs) at (layer l, head n): the metric linearised after the softmax, (L, N)."""
  batch = {
    **{k: jnp.asarray(v) for k, v in dst.items()},
    **{k: jnp.asarray(v) for k, v in targets.items()},
  }
  return np.asarray(_grad_along_maps(params, batch, maps, jnp.int32(drop), config=config))


@functools.partial(jax.jit, static_argnames=("config",))
def _grad_along_maps(params, batch, maps, drop, *, config):
  def f(w):
    out = bertjax.forward(
      params,
      config,
      batch["input_ids"],
      batch["attention_mask"],
      patch={"probs": (maps, w), "attn_out": _cut(drop), "ffn_out": _cut(drop)},
    )
    return METRIC(params, config, out, batch)

  n = config.num_attention_heads
  return jax.grad(f)(jnp.zeros((config.depth, 1, n, 1, 1), maps.dtype))[:, 0, :, 0, 0]


@functools.partial(jax.jit, static_argnames=("config",))
def _grad_k_weights(params, batch, k_src, drop, *, config):
  """d metric / d (each (layer, head) weight of a `k` patch to k_src), block `drop` cut."""

  def f(w):
    out = bertjax.forward(
      params,
      config,
      batch["input_ids"],
      batch["attention_mask"],
      patch={"k": (k_src, w), "attn_out": _cut(drop), "ffn_out": _cut(drop)},
    )
    return METRIC(params, config, out, batch)

  n = config.num_attention_heads
  return jax.grad(f)(jnp.zeros((config.depth, 1, 1, n, 1)))[:, 0, 0, :, 0]


def _softmax_maps(q, k, mask):
  """BERT's attention maps in NumPy from queries and keys (L, B, T, N, D): (L, B, N, T, T)."""
  q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
  logits = np.einsum("lbtnd,lbsnd->lbnts", q, k) / np.sqrt(q.shape[-1])
  logits = np.where(mask[None, :, None, None, :] > 0, logits, -np.inf)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  return p * (mask[None, :, None, :, None] > 0)  # padded query rows are zero in the model


@pytest.mark.parametrize("site", ["k", "q"])
def test_qk_fix_equals_exact_maps_linearised_after_softmax(bert, site):
  config, params, clean, corrupted, targets, runs = bert
  mask = corrupted["attention_mask"]
  dst, src = runs["corrupted"], runs["clean"]  # denoise: corrupted run, clean keys/queries
  own = _softmax_maps(dst["q"], dst["k"], mask)
  np.testing.assert_allclose(own, dst["probs"], atol=2e-5)  # the logit convention is BERT's
  assert (own.max(-1) > 0.99).mean() > 0.3  # saturated: many rows put > 99% on one key
  # Head n's maps with head n's keys (queries) all from the clean run: every key column
  # (query row) of its logits changes; other heads do not read them.
  new = _softmax_maps(
    dst["q"] if site == "k" else src["q"], src["k"] if site == "k" else dst["k"], mask
  )
  want = _along_maps(params, config, corrupted, targets, jnp.asarray(new, jnp.float32))
  got = atp_star.atp_star(
    params, config, clean, corrupted, METRIC, targets=targets, site=site, grad_drop=False
  )
  assert got.scores.shape == (L, config.num_attention_heads) and got.by_drop is None
  assert np.abs(want).max() > 0.1
  np.testing.assert_allclose(got.scores, want, rtol=1e-3, atol=1e-4)


def test_qk_fix_on_grouped_rotary_heads():
  """EuroBERT: rotary q/k, grouped key/value heads (a k node is one kv head, read by its
  group's query heads), pre-LN with RMSNorm; maps from forwards with one block's keys patched."""
  config = bertjax.BertConfig.for_family(
    "eurobert",
    vocab_size=97,
    hidden_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=48,
    initializer_range=0.5,
    max_position_embeddings=32,
  )
  params = bertjax.init(config, 3, heads=("mlm",))
  clean, corrupted, targets = _pair()
  k_src = bertjax.forward(
    params, config, clean["input_ids"], clean["attention_mask"], capture=("k",)
  ).cache["k"]
  # Block l's maps with block l's keys all from the clean run (and nothing else patched).
  maps = jnp.stack(
    [
      bertjax.forward(
        params,
        config,
        corrupted["input_ids"],
        corrupted["attention_mask"],
        patch={"k": (k_src, patching.patch_weight(config, "k", T, layers=[l]))},
        capture=("probs",),
      ).cache["probs"][l]
      for l in range(2)
    ]
  )
  per_query_head = _along_maps(params, config, corrupted, targets, maps)
  want = per_query_head.reshape(2, 2, 2).sum(-1)  # query heads 2g, 2g+1 read kv head g
  got = atp_star.atp_star(
    params, config, clean, corrupted, METRIC, targets=targets, site="k", grad_drop=False
  )
  assert got.scores.shape == (2, 2) and np.abs(want).max() > 1e-2
  np.testing.assert_allclose(got.scores, want, rtol=1e-3, atol=1e-4)


def test_qk_fix_is_closer_to_exact_patching_than_attribution(bert):
  config, params, clean, corrupted, targets, _ = bert
  site = "k"  # (the q fix is checked against its definition above)
  exact = patching.head_patching(
    params, config, clean, corrupted, METRIC, targets=targets, site=site
  )
  effect = exact.values - exact.corrupted
  plain = patching.attribution_patching(
    params, config, clean, corrupted, METRIC, targets=targets, site=site
  )
  fixed = atp_star.atp_star(
    params, config, clean, corrupted, METRIC, targets=targets, site=site, grad_drop=False
  )
  unfixed = atp_star.atp_star(
    params,
    config,
    clean,
    corrupted,
    METRIC,
    targets=targets,
    site=site,
    qk_fix=False,
    grad_drop=False,
  )
  # Without the fixes AtP* is attribution patching.
  np.testing.assert_allclose(unfixed.scores, plain.values - plain.corrupted, atol=1e-4)
  err_plain = np.abs(plain.values - plain.corrupted - effect).mean()
  err_fixed = np.abs(fixed.scores - effect).mean()
  assert err_fixed < 0.7 * err_plain, (site, err_fixed, err_plain)


def test_grad_drop_is_its_definition(bert):
  config, params, clean, corrupted, targets, runs = bert
  batch = {
    **{k: jnp.asarray(v) for k, v in corrupted.items()},
    **{k: jnp.asarray(v) for k, v in targets.items()},
  }

  def per_head(drop):  # d metric / d (head weight of the k patch), block `drop` cut
    return np.asarray(
      _grad_k_weights(params, batch, runs["clean"]["k"], jnp.int32(drop), config=config)
    )

  want = np.stack([per_head(d) for d in range(L)])  # c_{-d}, (L, L, N)
  got = atp_star.atp_star(
    params, config, clean, corrupted, METRIC, targets=targets, site="k", qk_fix=False
  )
  np.testing.assert_allclose(got.by_drop, want, rtol=1e-3, atol=1e-5)
  np.testing.assert_allclose(got.scores, np.abs(want).sum(0) / (L - 1), rtol=1e-3, atol=1e-5)
  # Cutting a node's own block leaves it nothing; cutting a block below it changes nothing.
  plain = per_head(-1)
  for d in range(L):
    np.testing.assert_allclose(got.by_drop[d, d], 0.0, atol=1e-7)
    np.testing.assert_allclose(got.by_drop[d, d + 1 :], plain[d + 1 :], rtol=1e-4, atol=1e-6)
  assert np.abs(got.by_drop[L - 1, : L - 1] - plain[: L - 1]).max() > 1e-3  # a cut above acts
  # With the QK fix, each c_{-d} is the maps' change against the cut gradient.
  mask = corrupted["attention_mask"]
  new = jnp.asarray(_softmax_maps(runs["corrupted"]["q"], runs["clean"]["k"], mask), jnp.float32)
  both = atp_star.atp_star(params, config, clean, corrupted, METRIC, targets=targets, site="k")
  for d in range(L):
    np.testing.assert_allclose(
      both.by_drop[d],
      _along_maps(params, config, corrupted, targets, new, drop=d),
      rtol=1e-3,
      atol=1e-4,
    )


def test_refusals_name_what_is_wrong(bert):
  config, params, clean, corrupted, targets, _ = bert
  with pytest.raises(ValueError, match="'probs' is not one atp_star"):
    atp_star.atp_star(params, config, clean, corrupted, METRIC, targets=targets, site="probs")
  pconfig, pparams = bertjax.prune_heads(config, params, {0: [1]})
  with pytest.raises(ValueError, match="this bert config is pruned"):
    atp_star.atp_star(pparams, pconfig, clean, corrupted, METRIC, targets=targets)
  one = config.replace(num_hidden_layers=1)
  with pytest.raises(ValueError, match="bert model has depth=1"):
    atp_star.atp_star(params, one, clean, corrupted, METRIC, targets=targets)  # before any compute
