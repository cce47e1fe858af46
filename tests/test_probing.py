"""Classifier probes: sklearn parity, vmap == per-layer, control tasks, edges, scalar mix."""

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from bertjax.analysis.representations import probing

L, C, D, N_TRAIN, N_TEST = 3, 4, 16, 600, 400
SEPARATIONS = (0.2, 0.5, 1.5)  # layer 0 barely separable ... layer 2 nearly separable


@pytest.fixture(scope="module")
def clusters():
  """Overlapping Gaussian class clusters, one separability per layer."""
  rng = np.random.default_rng(0)
  y = rng.integers(0, C, N_TRAIN + N_TEST)
  means = rng.normal(size=(C, D))
  x = np.stack([s * means[y] + rng.normal(size=(len(y), D)) for s in SEPARATIONS])
  x = x.astype(np.float32)  # (L, n, D)
  return x[:, :N_TRAIN], y[:N_TRAIN], x[:, N_TRAIN:], y[N_TRAIN:]


def test_linear_probe_matches_sklearn(clusters):
  xtr, ytr, xte, yte = clusters
  lam = 1e-2
  probe = probing.fit_probe(
    # Full-batch Adam at a constant step size hovers around the optimum at about lr / 10;
    # a small step with enough steps settles within 3e-4 of it under any matmul emitter
    # (lr 0.05 x 1000 steps left 3e-3 to 8e-3, depending on XLA's CPU options).
    xtr,
    ytr,
    config=probing.ProbeConfig(l2=lam, learning_rate=0.005, max_steps=4000, eval_every=100),
  )
  acc = probe.accuracy(xte, yte)
  assert acc.shape == (L,)
  assert acc[0] < acc[1] < acc[2]  # non-trivial: separability differs by layer
  for layer in range(L):
    clf = LogisticRegression(C=1 / (lam * N_TRAIN), max_iter=10_000, tol=1e-10)
    clf.fit(xtr[layer], ytr)
    assert abs(clf.score(xte[layer], yte) - acc[layer]) <= 0.01, layer
    # same convex objective, so the same optimum
    np.testing.assert_allclose(np.asarray(probe.params["w"][layer]), clf.coef_.T, atol=1e-3)
  preds = probe.predict(xte)
  assert preds.shape == (L, N_TEST) and preds.dtype.kind == "i"


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_vmap_equals_layer_alone(clusters, kind):
  xtr, ytr, xte, yte = clusters
  tr, va = probing.split_indices(N_TRAIN, 0.25, seed=1)
  config = probing.ProbeConfig(
    kind=kind,
    hidden_dim=32,
    l2=1e-3,
    learning_rate=2e-2,
    max_steps=300,
    batch_size=64,
    eval_every=20,
    patience=2,
  )
  both = probing.fit_probe(xtr[:, tr], ytr[tr], xtr[:, va], ytr[va], config=config)
  acc_all = both.accuracy(xte, yte)
  assert (both.fit_info.steps_run < 300).all()  # early stopping happened
  for layer in range(L):
    alone = probing.fit_probe(
      xtr[layer : layer + 1, tr],
      ytr[tr],
      xtr[layer : layer + 1, va],
      ytr[va],
      config=config,
      num_classes=C,
    )
    assert alone.fit_info.best_step[0] == both.fit_info.best_step[layer]
    assert alone.fit_info.steps_run[0] == both.fit_info.steps_run[layer]
    for name, leaf in alone.params.items():
      np.testing.assert_allclose(leaf[0], both.params[name][layer], atol=1e-4, err_msg=name)
    assert alone.accuracy(xte[layer : layer + 1], yte)[0] == pytest.approx(acc_all[layer], abs=1e-3)
  # early stopping: the best held-out score is what was recorded
  np.testing.assert_allclose(
    both.fit_info.best_score, both.accuracy(xtr[:, va], ytr[va]), atol=1e-6
  )


def test_scalar_mix_finds_informative_layer(clusters):
  xtr, ytr, xte, yte = clusters
  probe = probing.fit_probe(
    xtr,
    ytr,
    config=probing.ProbeConfig(scalar_mix=True, learning_rate=0.05, max_steps=400, eval_every=100),
  )
  weights, gamma = probe.mix_weights()
  assert weights.shape == (L,) and np.isclose(weights.sum(), 1.0)
  assert np.argmax(weights) == L - 1 and gamma > 0
  acc = probe.accuracy(xte, yte)
  assert acc.shape == (1,) and acc[0] > 0.9


def test_control_task_and_selectivity():
  rng = np.random.default_rng(0)
  vocab = [f"w{i}" for i in range(50)]
  types = [vocab[i] for i in rng.integers(0, 50, 2000)]
  labels = rng.choice(5, size=2000, p=[0.5, 0.2, 0.15, 0.1, 0.05])
  mapping = probing.control_task_mapping(types, labels, seed=3)
  control = probing.control_labels(types, mapping)
  # a function of the word type
  for t in set(types):
    assert len(set(control[np.array(types) == t])) == 1
  # reproducible from the seed, independent of example order
  perm = rng.permutation(2000)
  mapping2 = probing.control_task_mapping([types[i] for i in perm], labels[perm], seed=3)
  assert mapping == mapping2
  assert probing.control_task_mapping(types, labels, seed=4) != mapping
  # drawn from the empirical distribution: the majority label dominates
  assert np.bincount(list(mapping.values()), minlength=5).argmax() == 0
  with pytest.raises(KeyError, match="unseen"):
    probing.control_labels(["unseen"], mapping)
  sel = probing.selectivity([0.9, 0.8], [0.6, 0.7])
  np.testing.assert_allclose(sel, [0.3, 0.1])
  with pytest.raises(ValueError, match="shape"):
    probing.selectivity([0.9], [0.6, 0.7])


class _Sent:
  def __init__(self, heads):
    self.heads = heads


def test_edge_features_and_dependency_edges():
  sents = [_Sent((2, 0, 2)), _Sent((0, 1))]
  rels = [np.array([5, 0, 6]), np.array([0, 7])]
  head, dep, lab = probing.dependency_edges(sents, rels)
  np.testing.assert_array_equal(head, [1, 1, 3])
  np.testing.assert_array_equal(dep, [0, 2, 4])
  np.testing.assert_array_equal(lab, [5, 6, 7])
  feats = np.arange(2 * 5 * 3, dtype=np.float32).reshape(2, 5, 3)
  pair = np.asarray(probing.edge_features(feats, head, dep))
  assert pair.shape == (2, 3, 6)
  np.testing.assert_array_equal(pair[1, 2], np.concatenate([feats[1, 3], feats[1, 4]]))
  with pytest.raises(ValueError, match="dep_index spans"):
    probing.edge_features(feats, head, dep + 10)


def test_bad_input_is_named():
  x = np.zeros((2, 10, 4), np.float32)
  with pytest.raises(ValueError, match=r"labels shape \(9,\)"):
    probing.fit_probe(x, np.zeros(9, int))
  with pytest.raises(ValueError, match="self.kind='svm'"):
    probing.ProbeConfig(kind="svm") and probing.Probe(probing.ProbeConfig(kind="svm"), 3).model
  with pytest.raises(ValueError, match="labels span"):
    probing.fit_probe(x, np.full(10, 3), num_classes=3)
  with pytest.raises(ValueError, match="learning_rate"):
    probing.FitConfig(learning_rate=0.0)


def test_pool_subwords():
  rng = np.random.default_rng(0)
  h = rng.normal(size=(2, 2, 6, 3)).astype(np.float32)  # (layers, batch, seq, hidden)
  word_ids = np.array([[-1, 0, 0, 1, 2, -1], [-1, 0, 1, 1, 1, -1]])
  first, mask = probing.pool_subwords(h, word_ids, "first")
  mean, _ = probing.pool_subwords(h, word_ids, "mean")
  last, _ = probing.pool_subwords(h, word_ids, "last")
  np.testing.assert_array_equal(mask, [[True, True, True], [True, True, False]])
  np.testing.assert_allclose(first[:, 0, 0], h[:, 0, 1])
  np.testing.assert_allclose(last[:, 0, 0], h[:, 0, 2])
  np.testing.assert_allclose(mean[:, 1, 1], h[:, 1, 2:5].mean(1), rtol=1e-6)
  assert not np.asarray(first[:, 1, 2]).any()
  flat = probing.flatten_words(first, mask)
  assert flat.shape == (2, 5, 3)
  np.testing.assert_allclose(flat[:, 3], h[:, 1, 1])
  with pytest.raises(ValueError, match="reduce='max'"):
    probing.pool_subwords(h, word_ids, "max")


def test_pos_probe_and_control_task_on_ewt(data_dir):
  """UPOS and control-task probes on real EWT words with synthetic word-type features."""
  from bertjax.data import conllu

  sents = conllu.read_conllu(
    data_dir / "ud_english_ewt" / "en_ewt-ud-dev.conllu", max_sentences=300
  )
  vocab = conllu.build_vocab(sents, "upos")
  labels = conllu.encode_field(sents, vocab, "upos")
  types = [f.lower() for s in sents for f in s.forms]
  sent_of_word = np.repeat(np.arange(len(sents)), [s.num_words for s in sents])
  rng = np.random.default_rng(0)
  uniq = sorted(set(types))
  table = dict(zip(uniq, rng.normal(size=(len(uniq), 32))))
  type_emb = np.stack([table[t] for t in types])
  feats = np.stack([type_emb, rng.normal(size=type_emb.shape)]).astype(np.float32)  # (2, n, 32)
  tr, te = probing.split_indices(len(labels), 0.2, seed=0, groups=sent_of_word)
  assert not set(sent_of_word[tr]) & set(sent_of_word[te])
  cfg = probing.ProbeConfig(l2=1e-4, learning_rate=0.05, max_steps=300, eval_every=100)
  task = probing.fit_probe(feats[:, tr], labels[tr], config=cfg, num_classes=len(vocab))
  mapping = probing.control_task_mapping(types, labels, num_classes=len(vocab), seed=0)
  control_y = probing.control_labels(types, mapping)
  control = probing.fit_probe(feats[:, tr], control_y[tr], config=cfg, num_classes=len(vocab))
  task_acc = task.accuracy(feats[:, te], labels[te])
  control_acc = control.accuracy(feats[:, te], control_y[te])
  sel = probing.selectivity(task_acc, control_acc)
  np.testing.assert_allclose(sel, task_acc - control_acc)
  # word identity predicts POS far better than noise does
  assert task_acc[0] > task_acc[1] + 0.2, task_acc
  assert task_acc[1] < 0.3, task_acc
