"""Anisotropy, self-similarity, intra-sentence similarity and CKA vs plain NumPy."""

import numpy as np
import pytest
import scipy.stats
from scipy.stats import ortho_group

from bertjax import stats
from bertjax.analysis.representations import geometry

L, N, D = 3, 120, 24


def np_cos(a, b):
  return np.sum(a * b, -1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def np_cka(x, y):
  """Kornblith et al. eq. (3) with explicit centring matrices (float64)."""
  n = len(x)
  h = np.eye(n) - np.ones((n, n)) / n
  k, l_ = x @ x.T, y @ y.T
  hsic = lambda a, b: np.trace(a @ h @ b @ h)
  return hsic(k, l_) / np.sqrt(hsic(k, k) * hsic(l_, l_))


@pytest.fixture(scope="module")
def reps():
  rng = np.random.default_rng(0)
  common = rng.normal(size=D) * np.array([0.0, 1.0, 4.0])[:, None]  # growing shared direction
  x = rng.normal(size=(L, N, D)) + common[:, None, :]
  words = rng.integers(0, 15, N)
  x[1:] += 2.0 * rng.normal(size=(15, D))[words]  # word identity in upper layers
  sents = np.repeat(np.arange(12), 10)
  return x.astype(np.float32), words, sents


def test_anisotropy_matches_numpy(reps):
  x, _, _ = reps
  i, j = geometry.random_pairs(N, 500, seed=7)
  assert np.all(i != j)
  got = geometry.anisotropy(x, num_pairs=500, seed=7)
  np.testing.assert_allclose(got, [np_cos(x[l, i], x[l, j]).mean() for l in range(L)], atol=1e-5)
  assert got[2] > got[1] > got[0]  # the shared direction makes it anisotropic
  full = geometry.anisotropy(x, num_pairs=None)
  want = []
  for l in range(L):
    u = x[l] / np.linalg.norm(x[l], axis=-1, keepdims=True)
    c = u @ u.T
    want.append(c[~np.eye(N, dtype=bool)].mean())
  np.testing.assert_allclose(full, want, atol=1e-5)
  xc = x - x.mean(1, keepdims=True)
  np.testing.assert_allclose(
    geometry.anisotropy(x, 500, seed=7, centered=True),
    [np_cos(xc[l, i], xc[l, j]).mean() for l in range(L)],
    atol=1e-5,
  )
  # same seed, same pairs; different seed, different pairs
  np.testing.assert_array_equal(geometry.anisotropy(x, 500, seed=7), got)
  assert not np.array_equal(geometry.anisotropy(x, 500, seed=8), got)


def test_anisotropy_of_resampled_sentences(reps):
  """`anisotropy_of_groups` (the report's bootstrap over sentences): once per group it is the
  all-pairs mean; a resample's repeated sentences are their tokens copied, and a token is never
  paired with its own copies (those pairs, cosine 1, biased the interval upwards)."""
  x, _, sents = reps
  sums, squares, counts = geometry.unit_sums(x, sents)
  assert sums.shape == (12, L, D) and counts.tolist() == [10] * 12
  np.testing.assert_allclose(
    geometry.anisotropy_of_groups(sums, squares, counts),
    geometry.anisotropy(x, num_pairs=None),
    atol=1e-5,
  )
  take = np.array([0, 0, 3, 5, 5, 5, 7])  # a resample: sentence 0 twice, 5 three times
  weights = np.bincount(take, minlength=12)
  tokens = np.concatenate([np.flatnonzero(sents == g) for g in take])
  want = []
  for l in range(L):
    u = x[l, tokens] / np.linalg.norm(x[l, tokens], axis=-1, keepdims=True)
    own = tokens[:, None] == tokens[None, :]  # a token and its copies (itself included)
    want.append((u @ u.T)[~own].mean())
  np.testing.assert_allclose(
    geometry.anisotropy_of_groups(sums, squares, counts, weights), want, atol=1e-5
  )
  both = geometry.anisotropy_of_groups(sums, squares, counts, np.stack([weights, np.ones(12)]))
  np.testing.assert_allclose(both[0], want, atol=1e-5)


def test_sentence_resamples_copy_the_drawn_sentences(reps):
  """`sentence_resamples` (the anisotropy experiment's interval): each resample is its drawn
  sentences' tokens copied, no token paired with its own copies, self-similarity over the types
  counted in all the sentences (the measured ones) that are drawn at least twice."""
  x, words, sents = reps
  measured = np.arange(x.shape[1]) % 7 != 0  # some tokens are not measured (punctuation)
  got = geometry.sentence_resamples(x, words, sents, measured=measured, min_count=3, resamples=4)
  idx = np.random.default_rng(0).integers(0, 12, (4, 12))  # the resamples bootstrap_ci draws
  for r, take in enumerate(idx):
    tokens = np.concatenate([np.flatnonzero(sents == g) for g in take])
    counted = [w for w in np.unique(words) if (words[measured] == w).sum() >= 3]
    for l in range(L):
      u = x[l, tokens] / np.linalg.norm(x[l, tokens], axis=-1, keepdims=True)
      cos, own = u @ u.T, tokens[:, None] == tokens[None, :]
      np.testing.assert_allclose(got["anisotropy"][r, l], cos[~own].mean(), atol=1e-5)
      per_type = []
      for w in counted:
        of = (words[tokens] == w) & measured[tokens]
        pairs = (of[:, None] & of[None, :]) & ~own
        if pairs.any():
          per_type.append(cos[pairs].mean())
      np.testing.assert_allclose(got["self_similarity"][r, l], np.mean(per_type), atol=1e-5)


def test_self_and_intra_sentence_similarity_match_numpy(reps):
  x, words, sents = reps
  for centered in (False, True):
    xx = x - x.mean(1, keepdims=True) if centered else x
    want_self, want_intra = [], []
    for l in range(L):
      per_type = []
      for w in np.unique(words):
        occ = xx[l, words == w]
        if len(occ) < 3:
          continue
        u = occ / np.linalg.norm(occ, axis=-1, keepdims=True)
        c = u @ u.T
        per_type.append(c[~np.eye(len(occ), dtype=bool)].mean())
      want_self.append(np.mean(per_type))
      want_intra.append(
        np.mean(
          [np_cos(xx[l, sents == s], xx[l, sents == s].mean(0)).mean() for s in np.unique(sents)]
        )
      )
    got_self = geometry.self_similarity(x, words, min_count=3, centered=centered)
    np.testing.assert_allclose(got_self, want_self, atol=1e-5)
    got_intra = geometry.intra_sentence_similarity(x, sents, centered=centered)
    np.testing.assert_allclose(got_intra, want_intra, atol=1e-5)
  # string word types work the same as ints
  names = np.array([f"w{w}" for w in words])
  np.testing.assert_allclose(
    geometry.self_similarity(x, names), geometry.self_similarity(x, words), atol=1e-6
  )
  summary = geometry.contextuality(x, words, sents, num_pairs=300)
  np.testing.assert_allclose(
    summary["self_similarity_adjusted"],
    summary["self_similarity"] - summary["anisotropy"],
    atol=1e-7,
  )
  np.testing.assert_allclose(
    summary["intra_sentence_adjusted_centered"],
    summary["intra_sentence_centered"] - summary["anisotropy_centered"],
    atol=1e-7,
  )
  assert summary["self_similarity"][1] > summary["self_similarity"][0]
  with pytest.raises(ValueError, match=r"word_ids shape \(5,\)"):
    geometry.self_similarity(x, words[:5])


@pytest.mark.parametrize("n", [40, 300])  # Gram form and feature form
def test_linear_cka(n):
  rng = np.random.default_rng(1)
  x = rng.normal(size=(n, 20))
  y = x @ rng.normal(size=(20, 12)) + 0.5 * rng.normal(size=(n, 12))
  assert stats.linear_cka(x, y) == pytest.approx(np_cka(x, y), abs=1e-5)
  assert stats.linear_cka(x, x) == pytest.approx(1.0, abs=1e-6)
  q = ortho_group.rvs(20, random_state=2)
  assert stats.linear_cka(x @ q * 3.7, y) == pytest.approx(np_cka(x, y), abs=1e-5)
  assert stats.linear_cka(x, y * 0.01) == pytest.approx(np_cka(x, y), abs=1e-5)
  assert stats.linear_cka(x, rng.normal(size=(n, 12))) < np_cka(x, y) - 0.2


def test_cka_matrix_and_same_layers(reps):
  x, _, _ = reps
  mat = stats.cka_matrix(x)
  assert mat.shape == (L, L)
  want = np.array(
    [[np_cka(x[a].astype(float), x[b].astype(float)) for b in range(L)] for a in range(L)]
  )
  np.testing.assert_allclose(mat, want, atol=1e-5)
  np.testing.assert_allclose(np.diag(mat), 1.0, atol=1e-5)
  np.testing.assert_allclose(mat, mat.T, atol=1e-6)
  rng = np.random.default_rng(3)
  q = ortho_group.rvs(D, random_state=4)
  other = (x @ q * 2.0 + 0.3 * rng.normal(size=x.shape)).astype(np.float32)
  other = other[:, :, :16]  # a narrower second model
  same = stats.cka_same_layers(x, other)
  np.testing.assert_allclose(
    same, [np_cka(x[l].astype(float), other[l].astype(float)) for l in range(L)], atol=1e-5
  )
  cross = stats.cka_matrix(x, other)
  np.testing.assert_allclose(np.diag(cross), same, atol=1e-5)
  with pytest.raises(ValueError, match="n_tokens"):
    stats.cka_matrix(x, other[:, :10])


# Maximum explainable variance ------------------------------------------------------------


def _occurrences(seed, n, d=40, shift=3.0):
  """Anisotropic occurrences: a shared offset plus noise, as contextual representations."""
  rng = np.random.default_rng(seed)
  return rng.normal(size=(n, d)) + shift * rng.normal(size=d)


@pytest.mark.parametrize("n", [2, 5, 37, 150])  # fewer and more occurrences than dimensions
def test_mev_definitions_match_sklearn(n):
  from sklearn.decomposition import PCA, TruncatedSVD

  x = _occurrences(n, n)
  # The paper's first released code: TruncatedSVD(n_components=100) (here at most min(n, d) - 1).
  k = min(100, x.shape[1] - 1)
  svd = TruncatedSVD(n_components=k, n_iter=10, random_state=0).fit(x)
  assert geometry.mev(x) == pytest.approx(svd.explained_variance_ratio_[0], rel=1e-9, abs=1e-12)
  assert geometry.mev(x, "truncated_svd") == geometry.mev(x)
  pca = PCA(n_components=1).fit(x)
  assert geometry.mev(x, "pca") == pytest.approx(pca.explained_variance_ratio_[0], rel=1e-9)
  s = np.linalg.svd(x, compute_uv=False)
  assert geometry.mev(x, "uncentred") == pytest.approx(s[0] ** 2 / np.sum(s**2), rel=1e-12)
  # Anisotropic occurrences: the uncentred share is large, TruncatedSVD's small.
  assert geometry.mev(x, "uncentred") > 0.7
  assert geometry.mev(x) < 0.1


def test_mev_batched_and_edge_cases():
  from sklearn.decomposition import PCA, TruncatedSVD

  x = np.stack([_occurrences(s, 9) for s in range(4)]).reshape(2, 2, 9, 40)
  for d in geometry.MEV_DEFINITIONS:
    got = geometry.mev(x, d)
    assert got.shape == (2, 2)
    np.testing.assert_allclose(got[1, 0], geometry.mev(x[1, 0], d), rtol=1e-12)
  want = [TruncatedSVD(8, random_state=0).fit(m).explained_variance_ratio_[0] for m in x[0]]
  np.testing.assert_allclose(geometry.mev(x[0]), want, rtol=1e-9)
  want = [PCA(1).fit(m).explained_variance_ratio_[0] for m in x[0]]
  np.testing.assert_allclose(geometry.mev(x[0], "pca"), want, rtol=1e-9)
  line = np.outer([1.0, 2.0, -3.0], np.arange(1.0, 7.0)) + 5.0  # variance along one direction
  assert geometry.mev(line, "pca") == pytest.approx(1.0)
  assert geometry.mev(np.eye(4, 6), "uncentred") == pytest.approx(0.25)  # orthonormal: 1 / n
  same = np.ones((3, 4))  # no variance: undefined for the centred definitions
  assert np.isnan(geometry.mev(same)) and np.isnan(geometry.mev(same, "pca"))
  assert geometry.mev(same, "uncentred") == pytest.approx(1.0)
  with pytest.raises(ValueError, match="occurrences"):
    geometry.mev(np.ones((1, 4)))
  with pytest.raises(ValueError, match="definition='svd'"):
    geometry.mev(x, "svd")


def test_max_explainable_variance_types_and_baseline_counts(monkeypatch):
  rng = np.random.default_rng(5)
  layers, d = 2, 12
  counts = {"a": 6, "b": 9, "c": 3, "p": 7}  # "c" is below min_count, "p" is unmeasured
  ids = np.array([w for w, c in counts.items() for _ in range(c)] + [f"x{i}" for i in range(40)])
  rng.shuffle(ids)
  reps = rng.normal(size=(layers, len(ids), d)) + rng.normal(size=d)
  measured = ids != "p"
  for definition in geometry.MEV_DEFINITIONS:
    got = geometry.max_explainable_variance(
      reps, ids, min_count=5, seed=3, definition=definition, measured=measured
    )
    assert got["types"] == 2 and got["occurrences"] == 15 and got["definition"] == definition
    want = np.mean([geometry.mev(reps[:, ids == w], definition) for w in ("a", "b")], 0)
    np.testing.assert_allclose(got["mev"], want, rtol=1e-12)
    # The baseline: for each measured type in order, as many random tokens (same seed, same
    # draws) as it has occurrences.
    draw = np.random.default_rng(3)
    base = [
      geometry.mev(reps[:, np.sort(draw.choice(len(ids), counts[w], replace=False))], definition)
      for w in ("a", "b")
    ]
    np.testing.assert_allclose(got["baseline"], np.mean(base, 0), rtol=1e-12)
    np.testing.assert_allclose(got["adjusted"], got["mev"] - got["baseline"])
    # Kept per type too (what an interval over the types resamples): their means are the above.
    for key in ("mev", "baseline"):
      assert got["per_type"][key].shape == (2, layers)
      np.testing.assert_allclose(got["per_type"][key].mean(0), got[key], rtol=1e-12)
  capped = geometry.max_explainable_variance(reps, ids, min_count=5, max_occurrences=6)
  assert capped["occurrences"] == 6 + 6 + 6  # "p" measured now; "b" and "p" sampled down to 6
  empty = geometry.max_explainable_variance(reps, ids, min_count=50)
  assert empty["types"] == 0 and np.isnan(empty["mev"]).all()
  sizes = []  # every MEV call's number of occurrences: type, then its baseline, in turn
  real_mev = geometry.mev
  monkeypatch.setattr(geometry, "mev", lambda x, d: sizes.append(x.shape[-2]) or real_mev(x, d))
  geometry.max_explainable_variance(reps, ids, min_count=5, measured=measured)
  assert sizes == [6, 6, 9, 9]
  monkeypatch.undo()
  with pytest.raises(ValueError, match="definition='pca '"):
    geometry.max_explainable_variance(reps, ids, definition="pca ")
  with pytest.raises(ValueError, match="measured shape"):
    geometry.max_explainable_variance(reps, ids, measured=measured[:-1])
  with pytest.raises(ValueError, match="min_count=1"):
    geometry.max_explainable_variance(reps, ids, min_count=1)


def test_random_words_mev_draws_one_word_from_each_of_distinct_sentences(monkeypatch):
  rng = np.random.default_rng(6)
  sents = np.repeat(np.arange(30), rng.integers(1, 6, 30))
  reps = rng.normal(size=(2, len(sents), 8)) + rng.normal(size=8)
  picked = []
  real_mev = geometry.mev
  monkeypatch.setattr(geometry, "mev", lambda x, d: picked.append(x) or real_mev(x, d))
  got = geometry.random_words_mev(reps, sents, num_samples=20, seed=1, definition="pca")
  (x,) = picked
  rows = [np.flatnonzero((reps[0] == v).all(-1))[0] for v in x[0]]
  assert len(set(sents[rows])) == 20  # 20 words from 20 different sentences
  np.testing.assert_allclose(got, real_mev(reps[:, rows], "pca"))
  monkeypatch.undo()
  again = geometry.random_words_mev(reps, sents, num_samples=20, seed=1)
  np.testing.assert_allclose(again, geometry.mev(reps[:, rows]))  # same seed, same words
  with pytest.raises(ValueError, match="num_samples=31"):
    geometry.random_words_mev(reps, sents, num_samples=31)


def test_ethayarajh_measures_count_only_measured_types():
  """`ethayarajh_measures` is `contextuality` with unmeasured tokens in no word type, and every
  MEV definition with both baselines on the same samples."""
  rng = np.random.default_rng(5)
  reps = rng.normal(size=(2, 30, 6)) + 0.4
  words = np.array(list("aabbbcacbdde") * 2 + list("aabcdd"))
  sentences = np.repeat(np.arange(6), 5)
  measured = words != "c"  # say "c" is punctuation
  m, mevs = geometry.ethayarajh_measures(
    reps, words, sentences, measured=measured, num_pairs=None, min_count=2, paper_samples=4
  )
  unit = reps / np.linalg.norm(reps, axis=-1, keepdims=True)
  want = []
  for layer in unit:
    sims = []
    for w in "abde":
      idx = np.flatnonzero(words == w)
      c = layer[idx] @ layer[idx].T
      sims.append(c[~np.eye(len(idx), dtype=bool)].mean())
    want.append(np.mean(sims))
  np.testing.assert_allclose(m["self_similarity"], want, rtol=1e-5)
  np.testing.assert_allclose(m["self_similarity_adjusted"], m["self_similarity"] - m["anisotropy"])
  for d in geometry.MEV_DEFINITIONS:
    alone = geometry.max_explainable_variance(reps, words, 2, None, 0, d, measured)
    np.testing.assert_allclose(m[f"mev_{d}"], alone["mev"])
    np.testing.assert_allclose(m[f"mev_{d}_adjusted"], alone["adjusted"])
    assert mevs[d]["types"] == 4  # a, b, d, e: "c" is not measured
    paper = geometry.random_words_mev(reps, sentences, 4, 0, d)
    np.testing.assert_allclose(m[f"mev_{d}_adjusted_paper"], m[f"mev_{d}"] - paper)
  with pytest.raises(ValueError, match=r"measured shape \(3,\)"):
    geometry.ethayarajh_measures(reps, words, sentences, measured=np.ones(3, bool))


def test_layer_statistics_per_resample_equal_each_curve_alone():
  """`layer_statistics` on (resamples, layers) is each row's own, and `depth_trend` its
  Spearman with depth (SciPy)."""
  rng = np.random.default_rng(3)
  curves = rng.normal(size=(5, 7))
  both = geometry.layer_statistics(curves)
  for i, c in enumerate(curves):
    one = geometry.layer_statistics(c)
    assert one["trend"] == pytest.approx(scipy.stats.spearmanr(np.arange(7), c)[0])
    assert one["rising"] == pytest.approx(np.mean(np.diff(c) > 0))
    assert one["fall"] == pytest.approx(c[0] - c[-1]) and one["highest"] == c.max()
    for k, v in one.items():
      assert both[k][i] == pytest.approx(v), k
