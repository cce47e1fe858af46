"""Attribution graphs (`bertjax.analysis.circuits.graphs`) against independent references.

* Edges: a float64 NumPy post-LN BERT written here (and MPNet: the same block with its
  relative-position bias), with its FFNs replaced by the transcoder
  plus errors and its attention patterns, norm scales and head activation frozen at the
  input's values: removing one node (its scale set to 0) changes every target's input by
  exactly that node's column of the adjacency matrix, and each row plus its constant is the
  node's input.
* Pruning and scores: circuit-tracer 0.5.0's `prune_graph` and `compute_graph_scores`, run on
  a hand-made graph in `.venv/hf4` (`tests/reference_circuit_tracer.py`).
"""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from scipy.special import erf

import bertjax
from bertjax.analysis.circuits import graphs as G
from bertjax.analysis.circuits import transcoders as T

HF4 = pathlib.Path(sys.prefix) / "hf4"
H, L, HEADS, M, K = 16, 3, 2, 24, 4


def _tiny(family):
  config = bertjax.BertConfig.for_family(
    family,
    vocab_size=50,
    hidden_size=H,
    num_hidden_layers=L,
    num_attention_heads=HEADS,
    intermediate_size=32,
    max_position_embeddings=16,
  )
  params = bertjax.init(config, 0, heads=("mlm",))
  rng = np.random.default_rng(0)
  # Norms and biases away from their initial values, so that a frozen norm matters.
  params = _jitter(params, rng)
  tc_config = T.TranscoderConfig(d_model=H, layers=L, latents=M, cross_layer=True, k=K)
  x = rng.standard_normal((64, L, H)).astype(np.float32)
  tc = T.init(1, tc_config, x, x)
  ids = np.array([2, 5, 7, 9, 11, 4, 3])
  direction = tuple(float(v) for v in rng.standard_normal(H))
  targets = [G.Logit(2, 7, minus=9), G.Projection(direction)]
  graph = G.attribute(params, config, tc, tc_config, ids, targets, batch=32)
  return params, config, tc, tc_config, ids, targets, graph


@pytest.fixture(scope="module")
def tiny():
  return _tiny("bert")


@pytest.fixture(scope="module")
def tiny_mpnet():
  """MPNet: BERT's block with a relative-position bias on the scores, positions after the
  padding id, no token types (the family of the committed all-mpnet-base-v2 graphs)."""
  return _tiny("mpnet")


def _jitter(params, rng):
  import jax

  def f(path, v):
    name = jax.tree_util.keystr(path)
    if "scale" in name:
      return v * (1 + 0.3 * rng.standard_normal(v.shape)).astype(np.float32)
    if "bias" in name:
      return v + 0.1 * rng.standard_normal(v.shape).astype(np.float32)
    return v

  return jax.tree_util.tree_map_with_path(f, params)


def _np(tree):
  import jax

  return jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), tree)


def _gelu(u):
  return 0.5 * u * (1 + erf(u / np.sqrt(2)))


def _mpnet_buckets(t, buckets, max_distance=128):
  """(t, t) bucket of each query-key offset, as transformers' MPNet computes it (T5's
  bidirectional buckets: half for each sign, exact below a quarter, log-spaced above)."""
  n = np.arange(t)[:, None] - np.arange(t)[None, :]  # query - key
  half = buckets // 2
  exact = half // 2
  far = exact + (
    np.log(np.maximum(np.abs(n), 1) / exact) / np.log(max_distance / exact) * (half - exact)
  ).astype(int)
  far = np.minimum(far, half - 1)
  return (n < 0) * half + np.where(np.abs(n) < exact, np.abs(n), far)


class Reference:
  """The tiny BERT in float64 NumPy. Run live once (recording attention patterns, norm scales,
  the head's activation ratio, latents and errors); then `frozen` replays it with those
  frozen: each node scaled (`scales`), or, with `clamp` ({feature: factor}), the latents
  recomputed from their frozen inputs except the clamped ones; `steered` runs it live with
  `delta` (L, T, H) added to the FFN outputs."""

  def __init__(self, params, tc, ids, targets, eps=1e-12, family="bert"):
    self.p, self.tc, self.ids, self.targets, self.eps = _np(params), _np(tc), ids, targets, eps
    self.family = family
    self.frozen = None
    self.live = self._run()
    self.live_record = dict(self.record)

  def frozen_run(self, s_emb, s_feat, s_err):
    self.frozen = self.live_record
    return self._run(s_emb, s_feat, s_err)

  def clamped(self, clamp):
    self.frozen = self.live_record
    return self._run(clamp=clamp)[len(self.features) :]

  def steered(self, delta):
    self.frozen = None
    return self._run(delta=delta)[len(self.features) :]

  def _norm(self, x, scale, bias, key):
    mu = x.mean(-1, keepdims=True)
    if self.frozen is None:
      self.record[key] = np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + self.eps)
    return (x - mu) / (self.frozen or self.record)[key] * scale + bias

  def _latents(self, pre):
    z = np.zeros_like(pre)
    top = np.argsort(-pre, -1)[:, :K]
    np.put_along_axis(z, top, np.maximum(np.take_along_axis(pre, top, -1), 0), -1)
    return z

  def _run(self, s_emb=None, s_feat=None, s_err=None, *, clamp=None, delta=None):
    p, tc, n_pos = self.p, self.tc, len(self.ids)
    e, lay = p["embeddings"], p["encoder"]["layers"]
    first = not hasattr(self, "features")
    self.record = {}
    start = 2 if self.family == "mpnet" else 0  # MPNet's positions start after padding id 1
    positions = e["position_embeddings"]["embedding"][start : start + n_pos]
    raw = e["word_embeddings"]["embedding"][self.ids] + positions
    if self.family == "bert":
      raw = raw + e["token_type_embeddings"]["embedding"][0]
    h = self._norm(raw, e["LayerNorm"]["scale"], e["LayerNorm"]["bias"], "emb")
    h = h if s_emb is None else h * s_emb[:, None]
    latents, pre_all, xs = [], [], []
    written = np.zeros((L, n_pos, H)) + tc["b_dec"][:, None]
    if self.frozen is not None:
      written += self.errors * (1 if s_err is None else s_err[..., None])
    if self.frozen is not None and clamp is None:  # the graph's features, scaled
      for i, (layer, pos, f) in enumerate(self.features):
        w = tc["W_dec"][layer][f]  # (R, H)
        written[layer : layer + len(w), pos] += self.acts[i] * s_feat[i] * w
    for l in range(L):
      a = lay["attention"]
      q = np.einsum("th,hnd->tnd", h, a["query"]["kernel"][l]) + a["query"]["bias"][l]
      k = np.einsum("th,hnd->tnd", h, a["key"]["kernel"][l]) + a["key"]["bias"][l]
      v = np.einsum("th,hnd->tnd", h, a["value"]["kernel"][l]) + a["value"]["bias"][l]
      if self.frozen is None:
        s = np.einsum("tnd,snd->nts", q, k) / np.sqrt(q.shape[-1])
        if self.family == "mpnet":
          table = p["encoder"]["relative_attention_bias"]["embedding"]  # (buckets, N)
          s = s + table[_mpnet_buckets(n_pos, len(table))].transpose(2, 0, 1)
        s = np.exp(s - s.max(-1, keepdims=True))
        self.record[f"probs{l}"] = s / s.sum(-1, keepdims=True)
      probs = (self.frozen or self.record)[f"probs{l}"]
      ctx = np.einsum("nts,snd->tnd", probs, v)
      attn = np.einsum("tnd,ndh->th", ctx, a["output"]["kernel"][l]) + a["output"]["bias"][l]
      x = self._norm(h + attn, a["LayerNorm"]["scale"][l], a["LayerNorm"]["bias"][l], f"n1{l}")
      xs.append(x)
      pre = (x - tc["b_in"][l]) @ tc["W_enc"][l] + tc["b_enc"][l]  # (T, M)
      pre_all.append(pre)
      if self.frozen is None:  # the model's own FFN (the error makes up the difference)
        latents.append(self._latents(pre))
        written[l] = self._ffn(x, l) + (0 if delta is None else delta[l])
      elif clamp is not None:  # the local replacement model: latents recomputed
        z = self._latents(pre)
        for i, factor in clamp.items():
          layer, pos, f = self.features[i]
          if layer == l:
            z[pos, f] = factor * self.acts[i]
        write = np.einsum("tm,mrh->rth", z, tc["W_dec"][l])
        written[l : l + len(write)] += write
      h = self._norm(
        x + written[l], lay["LayerNorm"]["scale"][l], lay["LayerNorm"]["bias"][l], f"n2{l}"
      )
    if first:
      self.latents = np.stack(latents)
      layer, pos, f = np.nonzero(self.latents)
      self.features = list(zip(layer, pos, f))
      self.acts = self.latents[layer, pos, f]
      pred = np.zeros((L, n_pos, H)) + tc["b_dec"][:, None]
      for l in range(L):
        write = np.einsum("tm,mrh->rth", self.latents[l], tc["W_dec"][l])
        pred[l : l + write.shape[0]] += write
      self.errors = np.stack([self._ffn(xs[l], l) for l in range(L)]) - pred
    pre = np.array([pre_all[layer][pos, f] for layer, pos, f in self.features])
    return np.concatenate([pre, self._targets(h)])

  def _ffn(self, x, l):
    lay = self.p["encoder"]["layers"]
    y = _gelu(x @ lay["intermediate"]["kernel"][l] + lay["intermediate"]["bias"][l])
    return y @ lay["output"]["kernel"][l] + lay["output"]["bias"][l]

  def _targets(self, h):
    m = self.p["mlm"]
    out = []
    for t in self.targets:
      if isinstance(t, G.Logit):
        u = h[t.position] @ m["dense"]["kernel"] + m["dense"]["bias"]
        if self.frozen is None:
          self.record["ratio"] = _gelu(u) / u
        u = u * (self.frozen or self.record)["ratio"]
        u = self._norm(u, m["LayerNorm"]["scale"], m["LayerNorm"]["bias"], "head")
        logits = u @ self.p["embeddings"]["word_embeddings"]["embedding"].T + m["bias"]
        out.append(logits[t.token] - logits[t.minus])
      else:
        out.append(h.mean(0) @ np.asarray(t.direction))
    return np.array(out)


@pytest.mark.parametrize("family", ["bert", "mpnet"])
def test_edges_are_the_frozen_models_exact_differences(family, request):
  params, _, tc, _, ids, targets, graph = request.getfixturevalue(
    "tiny" if family == "bert" else "tiny_mpnet"
  )
  ref = Reference(params, tc, ids, targets, family=family)
  assert [tuple(f) for f in graph.features] == [tuple(int(v) for v in f) for f in ref.features]
  np.testing.assert_allclose(graph.activations, ref.acts, rtol=1e-5, atol=1e-6)
  n, t = graph.n_features, len(ids)
  ones = (np.ones(t), np.ones(n), np.ones((L, t)))
  base = ref.frozen_run(*ones)
  # The frozen replay at all-ones is the live model (the errors close the gap).
  np.testing.assert_allclose(base, ref.live, rtol=1e-9, atol=1e-9)
  np.testing.assert_allclose(base[:n], graph.preactivations, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(base[n:], graph.target_values, rtol=1e-4, atol=1e-4)
  s = graph.slices()
  rows = np.r_[0:n, s["targets"]]
  a = graph.adjacency
  # Each row plus its constant is the node's input.
  np.testing.assert_allclose(a[rows].sum(1) + graph.constants, base, rtol=1e-4, atol=1e-4)
  rng = np.random.default_rng(1)
  columns = np.concatenate(
    [
      rng.choice(n, 12, replace=False),
      rng.choice(np.arange(s["errors"].start, s["errors"].stop), 6, replace=False),
      np.arange(s["embeddings"].start, s["embeddings"].stop),
    ]
  )
  checked = 0
  for col in columns:
    s_emb, s_feat, s_err = (o.copy() for o in ones)
    node = graph.node(col)
    if node["kind"] == "feature":
      s_feat[col] = 0
    elif node["kind"] == "error":
      s_err[node["layer"], node["position"]] = 0
    else:
      s_emb[node["position"]] = 0
    effect = base - ref.frozen_run(s_emb, s_feat, s_err)
    np.testing.assert_allclose(a[rows, col], effect, rtol=2e-4, atol=2e-5)
    checked += np.abs(effect).max() > 1e-3
  assert checked >= len(columns) - 2  # the removals moved something
  # Edges only rise in layer; errors and embeddings have no inputs.
  layer_of = np.array([graph.node(i)["layer"] for i in range(len(a))])
  src, dst = np.nonzero(a.T)
  assert (layer_of[src] < layer_of[dst]).all()
  assert not a[s["errors"].start : s["embeddings"].stop].any()


def test_edges_cross_positions_both_ways(tiny):
  *_, graph = tiny
  f = graph.features
  a = graph.adjacency[: graph.n_features, : graph.n_features]
  dst, src = np.nonzero(a)
  assert (f[src, 1] < f[dst, 1]).any() and (f[src, 1] > f[dst, 1]).any()


def test_graph_round_trips(tiny, tmp_path):
  *_, graph = tiny
  back = G.Graph.load(graph.save(tmp_path / "g.npz"))
  np.testing.assert_array_equal(back.adjacency, graph.adjacency)
  assert back.targets == graph.targets and back.layers == graph.layers


def test_bad_input_is_named(tiny):
  params, config, tc, tc_config, ids, targets, _ = tiny
  with pytest.raises(ValueError, match="position 9 is outside the 7 tokens"):
    G.attribute(params, config, tc, tc_config, ids, [G.Logit(9, 3)])
  with pytest.raises(ValueError, match="hidden size is 16"):
    G.attribute(params, config, tc, tc_config, ids, [G.Projection((1.0, 2.0))])
  with pytest.raises(ValueError, match="one sequence"):
    G.attribute(params, config, tc, tc_config, ids[None], targets)
  with pytest.raises(ValueError, match=r"node_threshold=1.5 must be in \[0, 1\]"):
    G.prune(tiny[-1], node_threshold=1.5)


def _hand_made(rng, n_features=40, n_pos=5, layers=3, n_targets=2):
  # A random layered graph in circuit-tracer's node order, with its nodes' layers.
  layer = np.sort(rng.integers(0, layers, n_features))
  g = G.Graph(
    adjacency=np.zeros(1, np.float32),
    features=np.stack([layer, rng.integers(0, n_pos, n_features), np.arange(n_features)], 1),
    activations=np.ones(n_features, np.float32),
    preactivations=np.ones(n_features, np.float32),
    input_ids=np.arange(n_pos),
    layers=layers,
    targets=tuple(G.Logit(0, i) for i in range(n_targets)),
    target_values=np.zeros(n_targets, np.float32),
    target_weights=np.array([0.7, 0.3], np.float32),
    constants=np.zeros(n_features + n_targets, np.float32),
  )
  n = n_features + layers * n_pos + n_pos + n_targets
  node_layer = np.array([g.node(i)["layer"] for i in range(n)])
  rises = node_layer[None, :] < node_layer[:, None]
  rises[g.slices()["errors"].start : g.slices()["targets"].start] = False
  weights = rng.standard_normal((n, n)) * (rng.random((n, n)) < 0.35)
  g.adjacency = np.where(rises, weights, 0).astype(np.float32)
  return g


def test_pruning_and_scores_are_circuit_tracers(tmp_path):
  if not (HF4 / "circuit_tracer").is_dir():
    pytest.skip(f"circuit-tracer expected at {HF4} (./run.sh setup installs it)")
  rng = np.random.default_rng(3)
  graphs = [_hand_made(rng) for _ in range(3)]
  # (Not 1.0: there circuit-tracer keeps or drops zero-influence nodes by float32 rounding.)
  thresholds = [(0.8, 0.98), (0.5, 0.9), (0.95, 0.999)]
  np.savez(
    tmp_path / "in.npz",
    **{f"adjacency{i}": g.adjacency for i, g in enumerate(graphs)},
    weights=graphs[0].target_weights,
    thresholds=np.array(thresholds),
    n_features=graphs[0].n_features,
    n_pos=graphs[0].n_pos,
    layers=graphs[0].layers,
  )
  env = {**os.environ, "PYTHONPATH": str(HF4), "HF_HUB_OFFLINE": "1", "USE_TF": "0"}
  script = pathlib.Path(__file__).parent / "reference_circuit_tracer.py"
  result = subprocess.run(
    [sys.executable, str(script), str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  ref = dict(np.load(tmp_path / "out.npz"))
  assert str(ref["version"]) == "0.5.0"
  for i, g in enumerate(graphs):
    got = G.scores(g)
    assert got["replacement"] == pytest.approx(float(ref[f"replacement{i}"]), rel=1e-5)
    assert got["completeness"] == pytest.approx(float(ref[f"completeness{i}"]), rel=1e-5)
    for j, (node_t, edge_t) in enumerate(thresholds):
      pruned = G.prune(g, node_t, edge_t)
      np.testing.assert_array_equal(pruned.node_mask, ref[f"nodes{i}_{j}"], err_msg=f"{i} {j}")
      np.testing.assert_array_equal(pruned.edge_mask, ref[f"edges{i}_{j}"])
      np.testing.assert_allclose(pruned.cumulative, ref[f"cumulative{i}_{j}"], rtol=1e-5)
    kept = G.prune(g)
    assert 0 < kept.node_mask[: g.n_features].sum() < g.n_features


def test_graph_predicts_the_local_replacement_models_response(tiny):
  """Steering features by a little in the local replacement model (latents recomputed from
  their frozen inputs, NumPy) moves the targets by what `predict` reads off the graph; the
  model itself (`steer`, against the NumPy model run live with the same FFN-output change)
  moves them by something else, as attention and norms respond."""
  params, config, tc, _, ids, targets, graph = tiny
  ref = Reference(params, tc, ids, targets)
  live = ref.live[graph.n_features :]
  top = np.argsort(-G.node_influence(graph)[: graph.n_features])[:4]
  differs = 0
  for nodes in ([int(top[0])], [int(top[1])], [int(i) for i in top]):
    for factor in (1.002, 0.997):
      want = ref.clamped(dict.fromkeys(nodes, factor)) - live
      got = G.predict(graph, nodes, factor)
      np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-6)
    delta = np.zeros((L, len(ids), H))
    for i in nodes:
      layer, pos, latent = graph.features[i]
      rows = np.asarray(tc["W_dec"][layer][latent], np.float64)
      delta[layer : layer + len(rows), pos] -= graph.activations[i] * rows
    model = G.steer(params, config, tc, graph, nodes, 0.0)
    np.testing.assert_allclose(model, ref.steered(delta) - live, rtol=1e-3, atol=2e-5)
    differs += np.abs(model - G.predict(graph, nodes, 0.0)).max() > 1e-3
  assert differs  # the frozen linearisation is not the model
  np.testing.assert_allclose(G.steer(params, config, tc, graph, top[:1], 1.0), 0, atol=1e-5)


def test_view_holds_the_pruned_graph(tiny):
  *_, graph = tiny
  pruned = G.prune(graph, 0.5, 0.9)
  view = G.view(graph, pruned)
  assert len(view["nodes"]) == pruned.node_mask.sum()
  kept = np.nonzero(pruned.node_mask)[0]
  for s, t, w in view["edges"]:
    assert pruned.edge_mask[kept[t], kept[s]]
    assert w == pytest.approx(float(graph.adjacency[kept[t], kept[s]]), rel=1e-3)
  assert view["scores"] == G.scores(graph)
  logit, projection = view["nodes"][-2:]
  assert logit["kind"] == projection["kind"] == "target"
  assert logit["position"] == 2 and projection["position"] is None  # a Logit's, the pooled


def test_a_capped_view_keeps_the_edges_pruning_scores_highest(tiny):
  *_, graph = tiny
  pruned = G.prune(graph, 0.5, 0.9)
  full = G.view(graph, pruned)
  m = len(full["edges"]) // 3
  view = G.view(graph, pruned, max_edges=m)
  assert len(view["edges"]) == m and view["kept_edges"] == len(full["edges"]) > m
  assert view["kept_nodes"] == len(full["nodes"]) > len(view["nodes"])
  nodes = pruned.node_mask  # the reference score: circuit-tracer's, within the pruned graph
  norm = G.normalized(np.where(nodes[:, None] & nodes[None], graph.adjacency, 0.0))
  weights = np.zeros(len(nodes))
  weights[graph.slices()["targets"]] = graph.target_weights
  score = norm * (G.influence(norm, weights) + weights)[:, None]
  kept = np.nonzero(pruned.edge_mask & nodes[:, None] & nodes[None])
  cut = np.sort(score[kept])[::-1][m - 1]

  def key(n):  # a node's identity, the same in both views
    return n["kind"], n.get("layer"), n.get("position"), n.get("latent"), n.get("index")

  index = {key(n): i for i, n in enumerate(view["nodes"])}
  where = [index.get(key(n)) for n in full["nodes"]]  # None: not in the capped view
  chosen = set()
  for (s, t, w), src, dst in zip(full["edges"], *reversed(kept)):
    if score[dst, src] > cut:
      chosen.add((where[s], where[t]))
      assert w == pytest.approx(graph.adjacency[dst, src], rel=1e-3)
  assert chosen <= {(s, t) for s, t, _ in view["edges"]}
  joined = {i for s, t, _ in view["edges"] for i in (s, t)}
  assert joined | {i for i, n in enumerate(view["nodes"]) if n["kind"] == "target"} == set(
    range(len(view["nodes"]))
  )
  assert G.view(graph, pruned, max_edges=len(full["edges"])) == full
  with pytest.raises(ValueError, match="max_edges=0"):
    G.view(graph, pruned, max_edges=0)


def test_max_features_keeps_the_full_graphs_rows_of_the_chosen(tiny):
  """`max_features` chooses features as circuit-tracer does and keeps their rows as the full
  graph has them; the first batch is the features of most direct influence on the targets."""
  params, config, tc, tc_config, ids, targets, full = tiny
  part = G.attribute(params, config, tc, tc_config, ids, targets, max_features=20, batch=8)
  index = {tuple(f): i for i, f in enumerate(full.features.tolist())}
  chosen = np.array([index[tuple(f)] for f in part.features.tolist()])
  assert len(chosen) == 20 and (np.diff(chosen) > 0).all()
  n = full.n_features
  a = full.adjacency
  cols = np.concatenate([chosen, np.arange(n, a.shape[0])])
  rows = np.concatenate([chosen, np.arange(a.shape[0] - len(targets), a.shape[0])])
  np.testing.assert_allclose(part.adjacency[:20], a[chosen][:, cols], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(part.adjacency[-2:], a[rows[-2:]][:, cols], rtol=1e-5, atol=1e-6)
  assert not part.adjacency[20 : -len(targets)].any()  # errors and embeddings: no inputs
  direct = G.normalized(a[a.shape[0] - 2 :])[:, :n].T @ full.target_weights  # (n,)
  assert set(np.argsort(-direct, kind="stable")[:8]) <= set(chosen)
  const = full.constants[np.concatenate([chosen, n + np.arange(len(targets))])]
  np.testing.assert_allclose(part.constants, const, rtol=1e-4, atol=1e-4)
