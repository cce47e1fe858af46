"""Causal variables (`bertjax.analysis.causal.interchange`) on a planted variable.

A small random BERT with an MLM head; the variable is planted: each pair's counterfactual
label is the model's own prediction when the base run's residual stream at block 2, token 3
takes the source's coordinate on one direction u (the top principal direction there), and
only pairs whose prediction that swap changes are kept. Distributed alignment search with
k = 1 must find u (|cos| > 0.85) and reach a held-out IIA far above a random direction's and
the full vector's; the layer search (one program over every layer) must pick block 2 and
equal `train_subspace` there, and train each layer from its block's input as it trains the
whole model; DBM over a PCA basis must keep u's row; boundless DAS must beat
a random direction; steering must equal the same step made by a function patch; the PCA
basis must equal scikit-learn's (up to sign).
"""

import dataclasses
import types

import numpy as np
import pytest

import bertjax
from bertjax.analysis.causal import interchange as ci

CONFIG = bertjax.BertConfig.preset(
  "tiny",
  vocab_size=60,
  hidden_size=32,
  num_hidden_layers=3,
  num_attention_heads=4,
  intermediate_size=64,
  max_position_embeddings=32,
  initializer_range=0.4,  # large weights: a one-dimensional swap changes predictions
)
B, T, LAYER, STEPS = 1024, 8, 1, 300


@pytest.fixture(scope="module")
def planted():
  params = bertjax.init(CONFIG, 0, heads=("mlm",))
  rng = np.random.default_rng(0)
  base, source = rng.integers(5, 60, (B, T)), rng.integers(5, 60, (B, T))
  unlabelled = ci.CounterfactualPairs(
    base_ids=base,
    source_ids=source,
    attention_mask=np.ones((B, T), np.int32),
    positions=np.full((B, 1), 3),
    target=np.full((B,), 6),
    candidates=np.array([10, 11, 12, 13]),
    label=np.zeros(B, np.int64),
  )
  u = ci.pca_basis(params, CONFIG, unlabelled, "out", LAYER, 1)[0]
  w = ci.position_weight(CONFIG, "out", LAYER, unlabelled.positions, T, 1)
  swapped = np.asarray(ci.interchange_logits(params, CONFIG, unlabelled, "out", u[None], w))
  plain = np.asarray(ci.interchange_logits(params, CONFIG, unlabelled, "out", u[None], 0 * w))
  keep = np.flatnonzero(swapped.argmax(-1) != plain.argmax(-1))
  assert len(keep) > 80, len(keep)  # enough pairs that the swap decides
  pairs = dataclasses.replace(unlabelled, label=swapped.argmax(-1)).take(keep)
  half = len(keep) // 2
  return params, u, pairs.take(np.arange(half)), pairs.take(np.arange(half, len(keep)))


def _random_direction_iia(params, held, seed):
  r = np.random.default_rng(seed).standard_normal(CONFIG.hidden_size).astype(np.float32)
  w = ci.position_weight(CONFIG, "out", LAYER, held.positions, T, 1)
  return ci.iia(
    ci.interchange_logits(params, CONFIG, held, "out", r[None] / np.linalg.norm(r), w), held.label
  )


def test_das_finds_the_planted_direction(planted):
  params, u, train, held = planted
  fit = ci.train_subspace(
    params, CONFIG, train, "out", LAYER, k=1, steps=STEPS, lr=0.05, heldout=held
  )
  assert abs(float(fit.basis[0] @ u)) > 0.85
  assert fit.losses[-1] < 0.6 * fit.losses[0]
  chance = max(_random_direction_iia(params, held, s) for s in range(3))
  full = ci.iia(
    ci.interchange_logits(
      params,
      CONFIG,
      held,
      "out",
      np.eye(32, dtype=np.float32),
      ci.position_weight(CONFIG, "out", LAYER, held.positions, T, 32),
    ),
    held.label,
  )
  assert fit.heldout_iia > 0.75 and fit.heldout_iia > chance + 0.5 and fit.heldout_iia > full + 0.2
  # The layer search: one program over the layers, the planted block on top, the same fit.
  fits = ci.layer_search(
    params, CONFIG, train, held, "out", k=1, steps=STEPS, lr=0.05, truncate=False
  )
  assert [f.layer for f in fits] == [0, 1, 2]
  # Each layer trained from its block's input (a program per layer): the same training.
  cut = ci.layer_search(params, CONFIG, train, held, "out", k=1, steps=STEPS, lr=0.05)
  for a, b in zip(fits, cut):
    np.testing.assert_allclose(b.losses[:50], a.losses[:50], rtol=1e-4, err_msg=f"{a.layer}")
    assert abs(float(a.basis[0] @ b.basis[0])) > 0.99 and abs(a.heldout_iia - b.heldout_iia) <= 0.02
  assert max(fits, key=lambda f: f.heldout_iia).layer == LAYER
  assert abs(float(fits[LAYER].basis[0] @ u)) > 0.85
  assert abs(fits[LAYER].heldout_iia - fit.heldout_iia) <= 0.05


def test_dbm_and_boundless_das(planted):
  params, u, train, held = planted
  pcs = ci.pca_basis(params, CONFIG, train, "out", LAYER, 8)
  dbm = ci.train_subspace(
    params, CONFIG, train, "out", LAYER, method="dbm", basis=pcs, steps=STEPS, lr=0.05, heldout=held
  )
  top = int(np.argmax(np.abs(pcs @ u)))  # the PCA row closest to u
  assert dbm.mask[top] > 0.9 and dbm.mask.sum() < 4
  boundless = ci.train_subspace(
    params, CONFIG, train, "out", LAYER, method="boundless", steps=STEPS, lr=0.05, heldout=held
  )
  assert boundless.basis.shape == (32, 32) and 0 < boundless.mask.sum() < 32
  assert boundless.heldout_iia > _random_direction_iia(params, held, 0) + 0.3


def test_steering_adds_the_step(planted):
  params, u, _, held = planted
  few = held.take(np.arange(6))
  got = np.asarray(ci.steer(params, CONFIG, few, "out", LAYER, 3 * u, [0.0, 0.5, -1.0]))

  def stepped(strength):
    def fn(value, index):
      at = np.zeros((6, T, 1), np.float32)
      at[:, 3] = 1.0
      return value + (index == LAYER) * strength * 3 * at * u

    out = bertjax.forward(params, CONFIG, few.base_ids, few.attention_mask, patch={"out": fn})
    h = np.asarray(out.last_hidden_state)[np.arange(6), few.target]
    return np.asarray(bertjax.mlm_logits(params, CONFIG, h[:, None]))[:, 0][:, few.candidates]

  for i, s in enumerate((0.0, 0.5, -1.0)):
    np.testing.assert_allclose(got[i], stepped(s), atol=2e-4)
  assert np.abs(got[2] - got[0]).max() > 1e-2


def test_each_pair_has_its_own_candidates(planted):
  """Candidates (B, C): each pair's logits are the shared candidates' in its own order, `take`
  keeps each row's, and `answers` is the unintervened argmax of base and source runs."""
  params, u, _, held = planted
  few = held.take(np.arange(6))
  order = np.stack([np.roll(np.arange(4), i) for i in range(6)])  # row i's candidate order
  own = dataclasses.replace(
    few, candidates=few.candidates[order], label=np.argmax(order == few.label[:, None], 1)
  )
  w = ci.position_weight(CONFIG, "out", LAYER, few.positions, T, 1)
  shared = np.asarray(ci.interchange_logits(params, CONFIG, few, "out", u[None], w))
  got = np.asarray(ci.interchange_logits(params, CONFIG, own, "out", u[None], w))
  np.testing.assert_allclose(got, np.take_along_axis(shared, order, 1), atol=1e-5)
  assert ci.iia(got, own.label) == ci.iia(shared, few.label)
  np.testing.assert_array_equal(own.take([4, 1]).candidates, few.candidates[order[[4, 1]]])
  base, source = ci.answers(params, CONFIG, own)
  plain = np.asarray(ci.interchange_logits(params, CONFIG, own, "out", u[None], 0 * w))
  np.testing.assert_array_equal(base, plain.argmax(-1))
  src = dataclasses.replace(own, base_ids=own.source_ids)
  full = np.asarray(ci.interchange_logits(params, CONFIG, src, "out", u[None], 0 * w))
  np.testing.assert_array_equal(source, full.argmax(-1))
  # `counterfactual.solved`: the rows answered right on both runs (here every base run is).
  from bertjax.tasks import counterfactual

  rows, acc = counterfactual.solved(
    params, CONFIG, types.SimpleNamespace(pairs=own, base_label=base)
  )
  np.testing.assert_array_equal(rows, np.flatnonzero(source == own.label))
  assert acc == {"base": 1.0, "source": float(np.mean(source == own.label))}
  with pytest.raises(ValueError, match=r"candidates shape \(5, 4\) must be"):
    dataclasses.replace(own, candidates=own.candidates[:5])


def test_a_probe_reads_out_where_there_is_no_mlm_head(planted):
  """`with_probe`: the logits are the probe's on the masked mean of the intervened final
  states, and DAS trains through it (the loss falls)."""
  params, u, train, _ = planted
  rng = np.random.default_rng(4)
  weight, bias = rng.standard_normal((32, 3)).astype(np.float32), np.zeros(3, np.float32)
  body = {k: v for k, v in params.items() if k != "mlm"}
  probed = ci.with_probe(body, weight, bias)
  few = dataclasses.replace(
    train.take(np.arange(16)), candidates=np.arange(3), label=np.arange(16) % 3
  )
  w = ci.position_weight(CONFIG, "out", LAYER, few.positions, T, 1)
  got = np.asarray(ci.interchange_logits(probed, CONFIG, few, "out", u[None], w))
  src = bertjax.forward(params, CONFIG, few.source_ids, few.attention_mask, capture=("out",))
  iv = bertjax.Intervention(subspace={"out": (src.cache["out"], u[None], w)})
  h = np.asarray(
    bertjax.forward(
      params, CONFIG, few.base_ids, few.attention_mask, intervention=iv
    ).last_hidden_state
  )
  np.testing.assert_allclose(got, h.mean(1) @ weight + bias, atol=1e-4)  # no padding here
  fit = ci.train_subspace(probed, CONFIG, few, "out", LAYER, k=2, steps=30, lr=0.05)
  assert fit.losses[-1] < fit.losses[0]
  with pytest.raises(ValueError, match=r"probe weight \(32,\) and bias"):
    ci.with_probe(body, weight[:, 0], bias)


def test_pca_basis_is_scikit_learns(planted):
  sklearn = pytest.importorskip("sklearn.decomposition")
  params, _, train, _ = planted
  pcs = ci.pca_basis(params, CONFIG, train, "out", LAYER, 4)
  acts = []
  for ids in (train.base_ids, train.source_ids):
    out = bertjax.forward(params, CONFIG, ids, train.attention_mask, capture=("out",))
    acts.append(np.asarray(out.cache["out"])[LAYER][np.arange(len(ids)), 3])
  theirs = sklearn.PCA(4).fit(np.concatenate(acts)).components_
  np.testing.assert_allclose(np.abs((pcs * theirs).sum(-1)), 1.0, atol=1e-4)


def test_bad_requests_are_refused(planted):
  params, u, train, _ = planted
  with pytest.raises(ValueError, match="method='pca' must be one of"):
    ci.train_subspace(params, CONFIG, train, "out", LAYER, method="pca")
  with pytest.raises(ValueError, match="layer=3 must be in"):
    ci.train_subspace(params, CONFIG, train, "out", 3)
  with pytest.raises(ValueError, match="k=40 must be in"):
    ci.train_subspace(params, CONFIG, train, "out", LAYER, k=40)
  with pytest.raises(ValueError, match="pass basis="):
    ci.train_subspace(params, CONFIG, train, "out", LAYER, method="dbm")
  with pytest.raises(ValueError, match="params have no 'mlm'.*and no 'probe'"):
    ci.train_subspace({k: v for k, v in params.items() if k != "mlm"}, CONFIG, train, "out", 1)
  with pytest.raises(ValueError, match="direction shape"):
    ci.steer(params, CONFIG, train, "out", LAYER, u[:5], [1.0])
  with pytest.raises(ValueError, match="positions shape"):
    ci.CounterfactualPairs(
      train.base_ids,
      train.source_ids,
      train.attention_mask,
      train.positions[:, 0],
      train.target,
      train.candidates,
      train.label,
    )


def _planted_sae(u):
  """A top-k SAE (k = m = 8, so every latent is kept) whose first two latents read +u and -u
  and whose other six read random directions: moving those two is the swap on u."""
  rng = np.random.default_rng(5)
  rows = rng.standard_normal((8, 32)).astype(np.float32)
  rows[0], rows[1] = u, -u
  rows /= np.linalg.norm(rows, axis=1, keepdims=True)
  zeros = lambda n: np.zeros(n, np.float32)
  return {"W_enc": rows.T.copy(), "W_dec": rows, "pre_bias": zeros(32), "latent_bias": zeros(8)}


def test_sae_feature_interchange(planted):
  """SAE features (`sae_features`): the +u and -u latents together are the swap on u; no
  latent is the plain run; any mask equals the same edit written as a value patch in NumPy;
  and the learned mask keeps the two latents and reaches the swap's held-out IIA."""
  from bertjax.analysis.causal import sae_features as sf

  params, u, train, held = planted
  sae = _planted_sae(u)
  few = held.take(np.arange(6))
  w = ci.position_weight(CONFIG, "out", LAYER, few.positions, T, 1)
  swap = np.asarray(ci.interchange_logits(params, CONFIG, few, "out", u[None], w))
  pair = np.zeros(8, np.float32)
  pair[:2] = 1
  got = np.asarray(sf.sae_interchange_logits(params, CONFIG, few, "out", LAYER, sae, 8, pair))
  np.testing.assert_allclose(got, swap, atol=1e-4)
  plain = np.asarray(ci.interchange_logits(params, CONFIG, few, "out", u[None], 0 * w))
  none = sf.sae_interchange_logits(params, CONFIG, few, "out", LAYER, sae, 8, np.zeros(8))
  np.testing.assert_allclose(np.asarray(none), plain, atol=1e-5)
  # Any mask, against the edit computed in NumPy and patched in as a value.
  mask = np.random.default_rng(6).uniform(size=8).astype(np.float32)
  run = lambda ids: np.asarray(
    bertjax.forward(params, CONFIG, ids, few.attention_mask, capture=("out",)).cache["out"]
  )
  h, s = run(few.base_ids), run(few.source_ids)
  z = lambda x: np.maximum(x @ sae["W_enc"], 0)
  value = h.copy()
  rows = np.arange(6)
  at = few.positions[:, 0]
  value[LAYER, rows, at] += (mask * (z(s[LAYER, rows, at]) - z(h[LAYER, rows, at]))) @ sae["W_dec"]
  weight = np.zeros(value.shape[:3] + (1,), np.float32)
  weight[LAYER, rows, at] = 1
  out = bertjax.forward(
    params, CONFIG, few.base_ids, few.attention_mask, patch={"out": (value, weight)}
  )
  hid = np.asarray(out.last_hidden_state)[rows, few.target]
  want = np.asarray(bertjax.mlm_logits(params, CONFIG, hid[:, None]))[:, 0][:, few.candidates]
  got = np.asarray(sf.sae_interchange_logits(params, CONFIG, few, "out", LAYER, sae, 8, mask))
  np.testing.assert_allclose(got, want, atol=1e-4)
  fit = sf.train_sae_mask(
    params, CONFIG, train, "out", LAYER, sae, 8, steps=150, lr=0.05, penalty=0.3, heldout=held
  )
  assert fit.mask[:2].min() > 0.9 and fit.mask[2:].max() < 0.1, fit.mask
  assert fit.heldout_iia > 0.95 and fit.losses[-1] < fit.losses[0]
  with pytest.raises(ValueError, match="k=9 must be in"):
    sf.sae_interchange_logits(params, CONFIG, few, "out", LAYER, sae, 9)
  with pytest.raises(ValueError, match="site 'head_out' has shape"):
    sf.sae_interchange_logits(params, CONFIG, few, "head_out", LAYER, sae, 8)


def test_localisation_scores_every_method_pair_by_pair(planted):
  """`localisation.correctness`: per method a (layers, pairs) table of 0/1 whose rows are the
  IIA its building block reports (DAS through `layer_search`, the SAE mask through
  `train_sae_mask`); SAEs from `layer_saes` reconstruct their layer's activations; bad
  requests are refused by name."""
  from bertjax.analysis.causal import localisation as loc
  from bertjax.analysis.causal import sae_features as sf
  from bertjax.analysis.representations import sae as sae_lib

  params, _, train, held = planted
  train, held = train.take(np.arange(16)), held.take(np.arange(24))
  ids = np.random.default_rng(3).integers(5, 60, (64, T))
  batches = [{"input_ids": ids, "attention_mask": np.ones_like(ids)}]
  saes = loc.layer_saes(
    params, CONFIG, batches, "out", expansion=2, k=8, steps=60, batch_tokens=256
  )
  assert len(saes) == CONFIG.depth and saes[0]["W_dec"].shape == (64, 32)
  acts = sae_lib.activations(params, CONFIG, batches, "out", LAYER)
  err = np.asarray(sae_lib.reconstruct(saes[LAYER], acts, 8)) - acts
  assert (err**2).sum() < 0.5 * ((acts - acts.mean(0)) ** 2).sum()  # FVU under 0.5
  got = loc.correctness(params, CONFIG, train, held, "out", steps=5, saes=saes, sae_k=8)
  assert set(got) == set(loc.METHODS)
  for table in got.values():
    assert table.shape == (CONFIG.depth, 24) and set(np.unique(table)) <= {0, 1}
  fits = ci.layer_search(params, CONFIG, train, held, "out", k=1, steps=5)
  np.testing.assert_allclose(got["das"].mean(1), [f.heldout_iia for f in fits], atol=1e-6)
  fit = sf.train_sae_mask(
    params, CONFIG, train, "out", LAYER, saes[LAYER], 8, steps=5, heldout=held
  )
  assert got["sae"][LAYER].mean() == pytest.approx(fit.heldout_iia)
  whole = sf.train_sae_mask(
    params, CONFIG, train, "out", LAYER, saes[LAYER], 8, steps=5, truncate=False
  )  # every block each step: the same fit as from the block's input (the last step's
  # temperature, 0.01, scales the logits' float32 rounding by 100 in the mask)
  np.testing.assert_allclose(whole.mask, fit.mask, atol=1e-4)
  np.testing.assert_allclose(whole.losses, fit.losses, rtol=1e-5)
  with pytest.raises(ValueError, match=r"methods \['lda'\] are not among"):
    loc.correctness(params, CONFIG, train, held, "out", methods=("das", "lda"))
  with pytest.raises(ValueError, match='"sae" needs one SAE per layer \\(3\\); got none'):
    loc.correctness(params, CONFIG, train, held, "out", methods=("sae",))
