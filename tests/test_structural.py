"""Structural probes: tree metrics vs NetworkX/SciPy, and probes that learn (or cannot)."""

import collections

import networkx as nx
import numpy as np
import pytest
from scipy.stats import rankdata, spearmanr

from bertjax import stats
from bertjax.analysis.representations import structural


def random_heads(rng, n):
  """A random dependency tree: 1-based heads, 0 for the root."""
  order = rng.permutation(n)
  heads = np.zeros(n, np.int64)
  for k in range(1, n):
    heads[order[k]] = order[rng.integers(0, k)] + 1
  return heads


def nx_tree(heads):
  g = nx.Graph()
  g.add_nodes_from(range(len(heads)))
  g.add_edges_from((i, h - 1) for i, h in enumerate(heads) if h > 0)
  return g


def test_tree_distances_and_depths_match_networkx():
  rng = np.random.default_rng(0)
  for n in (1, 2, 7, 23):
    heads = random_heads(rng, n)
    g = nx_tree(heads)
    sp = dict(nx.all_pairs_shortest_path_length(g))
    expected = np.array([[sp[i][j] for j in range(n)] for i in range(n)])
    np.testing.assert_array_equal(structural.tree_distances(heads), expected)
    root = int(np.flatnonzero(heads == 0)[0])
    np.testing.assert_array_equal(structural.tree_depths(heads), expected[root])
  with pytest.raises(ValueError, match="cycle"):
    structural.tree_depths([2, 1, 0])
  with pytest.raises(ValueError, match=r"heads \[0, 5\]"):
    structural.tree_distances([0, 5])


def nx_uuas(pred, heads_list, punct=None):
  correct = total = 0
  for i, heads in enumerate(heads_list):
    n = len(heads)
    keep = [w for w in range(n) if punct is None or not punct[i][w]]
    g = nx.Graph()
    g.add_weighted_edges_from((a, b, pred[i][a, b]) for a in keep for b in keep if a < b)
    g.add_nodes_from(keep)
    mst = {tuple(sorted(e)) for e in nx.minimum_spanning_tree(g).edges()}
    gold = {
      tuple(sorted((w, h - 1)))
      for w, h in enumerate(heads)
      if h > 0 and w in keep and h - 1 in keep
    }
    correct += len(mst & gold)
    total += len(gold)
  return correct / total


def test_uuas_matches_networkx_mst():
  rng = np.random.default_rng(1)
  heads_list, punct = [], []
  t = 12
  pred = rng.random((6, t, t))
  pred = pred + pred.transpose(0, 2, 1)
  for _ in range(6):
    n = int(rng.integers(3, t + 1))
    heads = random_heads(rng, n)
    heads_list.append(heads)
    is_leaf = ~np.isin(np.arange(1, n + 1), heads)
    punct.append(is_leaf & (rng.random(n) < 0.4) & (heads != 0))  # punctuation leaves
  for p in (None, punct):
    assert structural.uuas(pred, heads_list, p) == pytest.approx(nx_uuas(pred, heads_list, p))
  # gold distances give a perfect score
  gold = np.zeros((6, t, t))
  for i, h in enumerate(heads_list):
    gold[i, : len(h), : len(h)] = structural.tree_distances(h)
  assert structural.uuas(gold, heads_list) == 1.0


def test_bootstrap_ci_is_scipy_s_percentile_interval():
  """`stats.bootstrap_ci` draws scipy.stats.bootstrap's resamples from the same seed, so the
  percentile intervals are the same numbers: a mean (vectorized) and a paired Spearman (one
  call per resample)."""
  scipy_stats = pytest.importorskip("scipy.stats")
  rng = np.random.default_rng(5)
  x, y = rng.normal(size=40), rng.normal(size=40)
  y = y + 0.5 * x
  ours = stats.bootstrap_ci(x, lambda a: a.mean(-1), n_resamples=999, seed=3, vectorized=True)
  theirs = scipy_stats.bootstrap(
    (x,),
    np.mean,
    method="percentile",
    n_resamples=999,
    rng=np.random.default_rng(3),
    vectorized=True,
  )
  np.testing.assert_allclose(ours, tuple(theirs.confidence_interval), rtol=1e-12)
  # Evaluated in chunks of resamples where they would gather too much: the same draws.
  with pytest.MonkeyPatch.context() as m:
    m.setattr(stats, "_GATHERED", 40 * 7)  # 7 resamples of 40 at a time
    seen = []
    mean = lambda a: seen.append(len(a)) or a.mean(-1)
    chunked = stats.bootstrap_ci(x, mean, n_resamples=999, seed=3, vectorized=True)
  assert max(seen) == 7 and sum(seen) == 999
  assert chunked == ours
  ours = stats.bootstrap_ci((x, y), stats.spearman, n_resamples=300, seed=1, confidence=0.9)
  theirs = scipy_stats.bootstrap(
    (x, y),
    stats.spearman,
    paired=True,
    vectorized=False,
    method="percentile",
    n_resamples=300,
    confidence_level=0.9,
    rng=np.random.default_rng(1),
  )
  np.testing.assert_allclose(ours, tuple(theirs.confidence_interval), rtol=1e-12)
  # Seeded; a statistic with several values gets an interval for each; NaN resamples left out.
  assert stats.bootstrap_ci(x, np.mean, seed=4) == stats.bootstrap_ci(x, np.mean, seed=4)
  low, high = stats.bootstrap_ci(np.stack([x, 2 * x], 1), lambda a: a.mean(0), n_resamples=200)
  np.testing.assert_allclose([low[1], high[1]], [2 * low[0], 2 * high[0]])
  mean_if_varied = lambda a: a.mean() if a.std() > 0 else np.nan  # NaN on [1, 1, 1]
  assert np.isfinite(stats.bootstrap_ci(np.r_[1.0, 1.0, 2.0], mean_if_varied, n_resamples=50)).all()
  with pytest.raises(ValueError, match="the same"):
    stats.bootstrap_ci((x, y[:3]), stats.spearman)
  with pytest.raises(ValueError, match="confidence=1.5"):
    stats.bootstrap_ci(x, np.mean, confidence=1.5)


def test_spearman_metrics_match_scipy():
  rng = np.random.default_rng(2)
  x, y = rng.integers(0, 5, 30), rng.random(30)  # ties in x
  assert structural.spearman(x, y) == pytest.approx(spearmanr(x, y).statistic)
  np.testing.assert_allclose(stats.rankdata(x), rankdata(x))
  rows = rng.integers(0, 4, (6, 9))
  np.testing.assert_allclose(stats.rankdata(rows), rankdata(rows, axis=-1))
  assert np.isnan(structural.spearman(np.ones(5), y[:5]))
  heads_list = [random_heads(rng, int(n)) for n in rng.integers(3, 12, 25)]
  t = 11
  pd_, pdep = rng.random((25, t, t)), rng.random((25, t))
  pd_ = pd_ + pd_.transpose(0, 2, 1)
  by_len_d, by_len_n = collections.defaultdict(list), collections.defaultdict(list)
  for i, h in enumerate(heads_list):
    n = len(h)
    if n < 5:
      continue
    g = structural.tree_distances(h)
    by_len_d[n] += [spearmanr(pd_[i, w, :n], g[w]).statistic for w in range(n)]
    by_len_n[n].append(spearmanr(pdep[i, :n], structural.tree_depths(h)).statistic)
  want_d = np.mean([np.mean(v) for v in by_len_d.values()])
  want_n = np.mean([np.mean(v) for v in by_len_n.values()])
  assert structural.distance_spearman(pd_, heads_list) == pytest.approx(want_d)
  assert structural.depth_spearman(pdep, heads_list) == pytest.approx(want_n)
  roots = [int(np.flatnonzero(h == 0)[0]) for h in heads_list]
  want_root = np.mean([np.argmin(pdep[i, : len(h)]) == roots[i] for i, h in enumerate(heads_list)])
  assert structural.root_accuracy(pdep, heads_list) == pytest.approx(want_root)


def synthetic_sentences(rng, num, mix):
  """Layer 1 linearly encodes a tree embedding (||z_i - z_j||^2 = tree distance); layer 0 is noise.

  ``mix (dim, code)`` is the linear map from the tree embedding z to the features.
  """
  dim, code = mix.shape
  feats, heads_list = [], []
  for _ in range(num):
    n = int(rng.integers(5, 15))
    heads = random_heads(rng, n)
    basis = np.linalg.qr(rng.normal(size=(code, code)))[0]  # orthonormal edge vectors
    z = np.zeros((n, code))
    depth_order = np.argsort(structural.tree_depths(heads), kind="stable")
    for w in depth_order:  # parents before children
      if heads[w] > 0:
        z[w] = z[heads[w] - 1] + basis[:, w]
    structured = z @ mix.T + 0.01 * rng.normal(size=(n, dim))
    noise = rng.normal(size=(n, dim))
    feats.append(np.stack([noise, structured]))  # (2, n, dim)
    heads_list.append(heads)
  return structural.pad_sentences(feats, heads_list)


@pytest.fixture(scope="module")
def synthetic():
  rng = np.random.default_rng(3)
  mix = rng.normal(size=(40, 16))
  return synthetic_sentences(rng, 160, mix), synthetic_sentences(rng, 40, mix)


def test_pad_sentences(synthetic):
  train, _ = synthetic
  assert train.features.shape[:2] == (2, 160) and train.features.shape[3] == 40
  assert train.mask.sum() == train.lengths.sum()
  i = 0
  n = train.lengths[i]
  np.testing.assert_array_equal(
    train.distances[i, :n, :n], structural.tree_distances(train.heads[i])
  )
  assert not np.asarray(train.features)[:, i, n:].any()


def test_distance_probe_learns_tree_from_structured_layer_only(synthetic):
  train, test = synthetic
  cfg = structural.StructuralConfig(
    rank=16, learning_rate=2e-2, max_steps=600, eval_every=100, batch_size=32
  )
  probe = structural.fit_structural_probe("distance", train, test, cfg)
  assert probe.B.shape == (2, 16, 40)
  metrics = structural.evaluate(probe, test)
  assert metrics["uuas"][1] > 0.97, metrics
  assert metrics["uuas"][0] < 0.5, metrics
  assert metrics["spearman"][1] > 0.9 and metrics["spearman"][1] > metrics["spearman"][0] + 0.3
  check_per_sentence(probe, test)


def test_depth_probe_learns_depth(synthetic):
  train, test = synthetic
  cfg = structural.StructuralConfig(rank=16, learning_rate=2e-2, max_steps=600, eval_every=100)
  probe = structural.fit_structural_probe("depth", train, None, cfg)
  metrics = structural.evaluate(probe, test)
  assert metrics["root_accuracy"][1] > 0.95 and metrics["spearman"][1] > 0.9, metrics
  assert metrics["root_accuracy"][0] < 0.5, metrics
  check_per_sentence(probe, test)


def check_per_sentence(probe, batch):
  """`per_sentence` gives `evaluate`'s numbers back through `from_per_sentence`, with and
  without punctuation left out and with sentences outside the Spearman's lengths; with a
  resample axis in front, each resample's numbers are the metrics of its sentences."""
  rng = np.random.default_rng(0)
  punct = [rng.random(len(h)) < 0.2 for h in batch.heads]
  pred = np.asarray(probe.predict(batch.features))
  for kw in ({}, {"punct": punct, "min_len": 8, "max_len": 12}):
    lengths = {k: v for k, v in kw.items() if k != "punct"}
    want = structural.evaluate(probe, batch, **kw)
    per = structural.per_sentence(probe, batch, **kw)
    got = structural.from_per_sentence(per, **lengths)
    assert set(got) == set(want)
    for k in want:
      np.testing.assert_allclose(got[k], want[k], rtol=1e-12)
    picks = rng.integers(0, len(batch.heads), size=(2, len(batch.heads)))
    resampled = structural.from_per_sentence({k: v[picks] for k, v in per.items()}, **lengths)
    for r, idx in enumerate(picks):
      heads = [batch.heads[i] for i in idx]
      marks = None if "punct" not in kw else [punct[i] for i in idx]
      if probe.kind == "distance":
        want = [structural.uuas(p[idx], heads, marks) for p in pred]
        rho = [structural.distance_spearman(p[idx], heads, **lengths) for p in pred]
      else:
        want = [structural.root_accuracy(p[idx], heads, marks) for p in pred]
        rho = [structural.depth_spearman(p[idx], heads, **lengths) for p in pred]
      first = "uuas" if probe.kind == "distance" else "root_accuracy"
      np.testing.assert_allclose(resampled[first][r], want, rtol=1e-12)
      np.testing.assert_allclose(resampled["spearman"][r], rho, rtol=1e-12)


def test_bad_input_is_named(synthetic):
  train, _ = synthetic
  with pytest.raises(ValueError, match="kind='tree'"):
    structural.fit_structural_probe("tree", train)
  with pytest.raises(ValueError, match="rank=0"):
    structural.StructuralConfig(rank=0)
  with pytest.raises(ValueError, match=r"features\[0\] shape \(2, 3, 4\)"):
    structural.pad_sentences([np.zeros((2, 3, 4))], [[0, 1]])


def test_ewt_trees_gold_and_linear_baseline(data_dir):
  """On real EWT trees: gold distances score 1; the right-branching chain scores ~0.5."""
  from bertjax.data import conllu

  sents = conllu.read_conllu(
    data_dir / "ud_english_ewt" / "en_ewt-ud-dev.conllu", max_sentences=400
  )
  heads = [s.heads_array() for s in sents]
  punct = structural.punctuation_masks(sents)
  t = max(len(h) for h in heads)
  gold, chain = np.zeros((len(heads), t, t)), np.zeros((len(heads), t, t))
  for i, h in enumerate(heads):
    n = len(h)
    gold[i, :n, :n] = structural.tree_distances(h)
    chain[i, :n, :n] = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :])
    root = int(np.flatnonzero(h == 0)[0])
    np.testing.assert_array_equal(gold[i, root, :n], structural.tree_depths(h))
  for p in (None, punct):
    assert structural.uuas(gold, heads, p) == 1.0
  base = structural.uuas(chain, heads, punct)
  assert 0.35 < base < 0.65, base  # Hewitt & Manning report 48.9 for this baseline on PTB
  assert structural.distance_spearman(gold, heads) == pytest.approx(1.0)
