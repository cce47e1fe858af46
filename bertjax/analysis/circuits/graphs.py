"""Attribution graphs over transcoders (Ameisen et al. 2025, "Circuit Tracing"), for encoders.

For one input and its targets, the *local replacement model* puts a transcoder
(`bertjax.analysis.circuits.transcoders`) in place of every FFN and freezes, at this input's
values, everything else that is not linear: the attention patterns, every norm's 1/std and
the masked-LM head's activation (as its ratio act(u)/u). Each FFN output is then the sum of
its latents' decoder rows, `b_dec` and an *error* (the model's FFN output less the
transcoder's), so the replacement reproduces the model exactly at this input, and every
target is an affine function of the nodes:

* features: each active latent at (layer, position), its value its activation;
* errors: one per (layer, position);
* embeddings: the embedding block's output at each position (what block 0 reads);
* targets: a masked-token logit (or a difference of two) through the model's MLM head, or
  the mean-pooled last hidden state projected on a direction.

An edge s -> t is s's *direct effect* on t: the change in t's input (a feature's
pre-activation, a target's value) when s is removed while every other feature, error and
embedding stays fixed. The model is affine in the nodes, so this is exact: `a_s dt/da_s`,
computed for all sources of a batch of targets by one backward pass of the frozen model
(`config.relevance_rules = "cp-lrp"` makes the backward pass exactly that of the frozen
model; every FFN output is patched, so no FFN is differentiated).

Attention is bidirectional: a source may feed a target at any position, earlier or later.
Edges still only rise in layer (a feature of layer l reads the FFN input of block l, which
only earlier layers' features write to), so the graph is acyclic and influence sums over at
most depth + 1 steps. The pruning is circuit-tracer's (0.5.0) unchanged: it never assumes an
order of positions.

The nodes are in circuit-tracer's order: features, errors (layer-major), embeddings,
targets; `adjacency[t, s]` is the edge s -> t. `influence`, `prune` and `scores` follow
circuit-tracer's `compute_influence`, `prune_graph` and `compute_graph_scores`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import timing
from bertjax.analysis.circuits.transcoders import Params, TranscoderConfig, latents_at
from bertjax.analysis.circuits.transcoders import predict as predict_ffn
from bertjax.model.config import BertConfig
from bertjax.model.forward import forward, run_layers
from bertjax.model.heads import mlm_logits


@dataclasses.dataclass(frozen=True)
class Logit:
  """A target: the MLM head's logit of `token` at `position` (less that of `minus`)."""

  position: int
  token: int
  minus: int | None = None
  label: str = ""


@dataclasses.dataclass(frozen=True)
class Projection:
  """A target: the mean-pooled last hidden state (real tokens) dotted with `direction` (H,),
  e.g. a probe's weight vector."""

  direction: tuple[float, ...]
  label: str = ""


@dataclasses.dataclass
class Graph:
  """An attribution graph (see the module's docstring for its nodes and edges).

  Attributes:
    adjacency: (n, n) float32; `adjacency[t, s]` is the direct effect of node s on node t.
    features: (N, 3) int (layer, position, latent) of the active features, layer-major.
    activations: (N,) their activations; `preactivations` (N,) their encoders' outputs.
    input_ids: (T,) the tokens; `layers`: the model's depth.
    targets: the `Logit`/`Projection` targets; `target_values` (K,); `target_weights` (K,)
      each target's weight in influence (default 1/K).
    constants: (N + K,) each feature's pre-activation and each target's value less the sum
      of its edges from every active feature, error and embedding: what the biases (b_dec,
      the attention and norm biases, the head's) contribute, which no node carries. With
      `max_features`, a row of `adjacency` lacks the edges from the features left out, so
      it and its constant fall short of the input by theirs.
  """

  adjacency: np.ndarray
  features: np.ndarray
  activations: np.ndarray
  preactivations: np.ndarray
  input_ids: np.ndarray
  layers: int
  targets: tuple
  target_values: np.ndarray
  target_weights: np.ndarray
  constants: np.ndarray

  @property
  def n_features(self) -> int:
    """N, the graph's active features."""
    return len(self.features)

  @property
  def n_pos(self) -> int:
    """T, the sequence's positions."""
    return len(self.input_ids)

  def slices(self) -> dict[str, slice]:
    """Where each kind of node sits in the node order."""
    n, e = self.n_features, self.layers * self.n_pos
    return {
      "features": slice(0, n),
      "errors": slice(n, n + e),
      "embeddings": slice(n + e, n + e + self.n_pos),
      "targets": slice(n + e + self.n_pos, n + e + self.n_pos + len(self.targets)),
    }

  def node(self, i: int) -> dict[str, Any]:
    """Node `i` as {"kind", "layer", "position", ...}."""
    s = self.slices()
    if i < s["features"].stop:
      layer, pos, latent = (int(v) for v in self.features[i])
      return {"kind": "feature", "layer": layer, "position": pos, "latent": latent}
    if i < s["errors"].stop:
      layer, pos = divmod(i - s["errors"].start, self.n_pos)
      return {"kind": "error", "layer": layer, "position": pos}
    if i < s["embeddings"].stop:
      return {"kind": "embedding", "layer": -1, "position": i - s["embeddings"].start}
    k = i - s["targets"].start
    return {"kind": "target", "layer": self.layers, "index": k}

  def save(self, path) -> pathlib.Path:
    """Writes the graph as one .npz (the targets as JSON inside)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {
      f.name: getattr(self, f.name)
      for f in dataclasses.fields(self)
      if isinstance(getattr(self, f.name), np.ndarray)
    }
    targets = [{"kind": type(t).__name__, **dataclasses.asdict(t)} for t in self.targets]
    np.savez_compressed(path, layers=self.layers, targets=json.dumps(targets), **arrays)
    return path

  @classmethod
  def load(cls, path) -> Graph:
    """A graph `save` wrote."""
    with np.load(path) as f:
      data = {k: f[k] for k in f.files}
    kinds = {"Logit": Logit, "Projection": Projection}
    targets = []
    for t in json.loads(str(data.pop("targets"))):
      kind = kinds[t.pop("kind")]
      if kind is Projection:
        t["direction"] = tuple(t["direction"])
      targets.append(kind(**t))
    return cls(layers=int(data.pop("layers")), targets=tuple(targets), **data)


# The frozen local replacement model ----------------------------------------------------------


def _check(config: BertConfig, tc_config: TranscoderConfig, input_ids, targets, params):
  if tc_config.layers != config.depth or tc_config.d_model != config.hidden_size:
    raise ValueError(
      f"a transcoder of {tc_config.layers} layers x {tc_config.d_model} does not fit a model "
      f"of depth {config.depth} and hidden size {config.hidden_size}"
    )
  ids = np.asarray(input_ids)
  if ids.ndim != 1 or not len(ids):
    raise ValueError(f"input_ids must be one sequence (T,) of token ids, got shape {ids.shape}")
  if not targets:
    raise ValueError("an attribution graph needs at least one target (Logit or Projection)")
  for t in targets:
    if isinstance(t, Logit):
      if "mlm" not in params:
        raise ValueError("a Logit target needs a masked-LM head in params (fit one: bertjax.fit)")
      if not 0 <= t.position < len(ids):
        raise ValueError(f"Logit position {t.position} is outside the {len(ids)} tokens")
      for tok in (t.token, t.minus):
        if tok is not None and not 0 <= tok < config.vocab_size:
          raise ValueError(f"Logit token {tok} is outside [0, {config.vocab_size})")
    elif isinstance(t, Projection):
      if len(t.direction) != config.hidden_size:
        raise ValueError(
          f"a Projection direction has {len(t.direction)} entries; the model's hidden size "
          f"is {config.hidden_size}"
        )
    else:
      raise TypeError(f"targets must be Logit or Projection, got {type(t).__name__}")
  return ids


def _target_values(params, config, targets, last):
  # (K,) each target's value from the last hidden state (T, H).
  values = []
  for t in targets:
    if isinstance(t, Logit):
      logits = mlm_logits(params, config, last[t.position][None, None])[0, 0]
      v = logits[t.token] - (0.0 if t.minus is None else logits[t.minus])
    else:
      v = last.mean(0) @ jnp.asarray(t.direction, jnp.float32)
    values.append(v.astype(jnp.float32))
  return jnp.stack(values)


def _groups(features, acts, depth: int, t: int, width: int):
  """The active features by layer and position, `width` slots each: (slot (L, T, width) into
  the feature list, -1 for an empty one; latent; activation, 0 for an empty one). The decoder
  then writes by batched products, with no scatter or gather of the residual."""
  slot = np.full((depth, t, width), -1, np.int32)
  cell = features[:, 0] * t + features[:, 1]  # features are sorted by layer, then position
  rank = np.arange(len(features)) - np.searchsorted(cell, cell)
  slot[features[:, 0], features[:, 1], rank] = np.arange(len(features))
  latent = np.where(slot >= 0, features[np.maximum(slot, 0), 2], 0)
  return slot, latent, np.where(slot >= 0, acts[np.maximum(slot, 0)], 0.0).astype(np.float32)


def _local_model(params, config, tc, emb, groups, errors, targets, stop: int):
  """The frozen local replacement model as a function of the nodes' scales (1 = as is):
  `(s_embed (T,), s_features (N,), s_errors (L, T)) -> (FFN inputs (stop, T, H), targets
  (K,))`, run through blocks 0 .. stop - 1 only (the targets, zeros below full depth, need
  all). Under cp-lrp its gradient is that of the model with attention patterns and norm
  scales frozen; its value at all-ones is the model's."""
  frozen_cfg = dataclasses.replace(config, relevance_rules="cp-lrp")
  slot, latent, act = groups
  t = emb.shape[0]

  def run(s_embed, s_features, s_errors):
    # Each block's FFN output as its own array: a stacked one updated in place would make
    # the backward pass copy a (rows, L, T, H) cotangent at every block.
    written = [tc["b_dec"][j] + errors[j] * s_errors[j][:, None] for j in range(stop)]
    scale = jnp.concatenate([s_features, jnp.zeros(1)])  # slot -1: the empty one
    for layer, w in enumerate(tc["W_dec"][:stop]):
      rows = w[latent[layer]]  # (T, c, R, H)
      a = act[layer] * scale[slot[layer]]
      for r in range(min(w.shape[1], stop - layer)):  # one product per layer written
        written[layer + r] = written[layer + r] + jnp.einsum("tc,tch->th", a, rows[:, :, r])
    out = run_layers(
      params,
      frozen_cfg,
      (emb * s_embed[:, None])[None],
      jnp.ones((1, t), jnp.int32),
      stop=stop,
      capture=("ffn_in",),
      patch={"ffn_out": lambda v, i: written[i][None].astype(v.dtype)},
      unroll=True,  # so that i is the block's index as an int
    )
    if stop < config.depth:
      return out.cache["ffn_in"][:, 0], jnp.zeros(len(targets))
    return out.cache["ffn_in"][:, 0], _target_values(params, frozen_cfg, targets, out.last[0])

  return run


@functools.partial(jax.jit, static_argnames=("config", "targets", "stop"))
def _rows(params, config, tc, emb, groups, errors, features, targets, which, stop):
  """(B,) row indices (features, then targets) -> each row's gradients w.r.t. every node
  scale. A feature's row is its encoder column put on its FFN input (the only place its
  pre-activation reads), so one backward pass serves any mix of rows; it runs blocks
  0 .. stop - 1, which must hold every asked feature's layer (all of them for a target).
  `features` (N, 3) may be padded (a padded row is never asked for)."""
  n, k, t = features.shape[0], len(targets), emb.shape[0]
  run = _local_model(params, config, tc, emb, groups, errors, targets, stop)
  ones = (jnp.ones(t), jnp.ones(n), jnp.ones((config.depth, t)))
  (x, values), vjp = jax.vjp(run, *ones)
  layer, pos, latent = features[:, 0], features[:, 1], features[:, 2]

  def one(i):
    f, is_feature = jnp.minimum(i, n - 1), (i < n).astype(x.dtype)
    column = tc["W_enc"][layer[f], :, latent[f]] * is_feature  # (masked, not selected:
    cot_x = jnp.zeros_like(x).at[layer[f], pos[f]].set(column)  # no pass over the zeros)
    cot_t = jax.nn.one_hot(i - n, k, dtype=values.dtype) * (1 - is_feature)
    return vjp((cot_x, cot_t))

  return jax.vmap(one)(which)


def _preactivations(tc, features, x):
  # (N,) each feature's encoder output from the FFN inputs x (L, T, H).
  layer, pos, latent = (features[:, i] for i in range(3))
  pre = jnp.sum((x[layer, pos] - tc["b_in"][layer]) * tc["W_enc"][layer, :, latent], -1)
  return pre + tc["b_enc"][layer, latent]


@functools.partial(jax.jit, static_argnames=("config", "tc_config", "targets"))
def _clean(params, config, tc, tc_config, ids, targets):
  # The model's own run: every block's FFN input and output, the latents, the targets and
  # the embedding block's output.
  out = forward(params, config, ids[None], capture=("embeddings", "ffn_in", "ffn_out"))
  x, y = out.cache["ffn_in"][:, 0], out.cache["ffn_out"][:, 0]  # (L, T, H)
  z = jnp.stack([latents_at(tc, tc_config, layer, x[layer]) for layer in range(config.depth)])
  values = _target_values(params, config, targets, out.last_hidden_state[0])
  return x, y, z, values, out.cache["embeddings"][0]


def attribute(
  params: Params,
  config: BertConfig,
  tc: Params,
  tc_config: TranscoderConfig,
  input_ids,
  targets,
  *,
  target_weights=None,
  max_features: int | None = None,
  batch: int = 128,
  progress: bool = False,
) -> Graph:
  """The attribution graph of `input_ids` (one sequence, no padding) for `targets` (a list of
  `Logit` and `Projection`).

  Args:
    target_weights: (K,) each target's weight in influence and pruning (default 1/K).
    max_features: keep at most this many features, chosen as circuit-tracer does: the
      targets' rows first, then, a batch at a time, the rows of the not yet chosen features of
      most influence on the targets through the rows computed so far. The graph then holds
      the chosen features only (their edges from the others dropped). Default: every active
      feature.
    batch: rows per backward pass (one compiled program).
    progress: a progress bar over the batches.
  """
  targets = tuple(targets)
  ids = jnp.asarray(_check(config, tc_config, input_ids, targets, params), jnp.int32)
  k = len(targets)
  weights = np.full(k, 1 / k) if target_weights is None else np.asarray(target_weights)
  if weights.shape != (k,):
    raise ValueError(f"target_weights must be ({k},), one per target, got {weights.shape}")
  if max_features is not None and max_features < 1:
    raise ValueError(f"max_features={max_features} must be at least 1 (or None: all)")
  x, y, z, values, emb = _clean(params, config, tc, tc_config, ids, targets)
  errors = y - jnp.swapaxes(predict_ffn(tc, tc_config, jnp.swapaxes(x, 0, 1)), 0, 1)
  z = np.asarray(z)
  layer, pos, latent = np.nonzero(z)  # layer-major
  features = np.stack([layer, pos, latent], 1).astype(np.int32)
  acts = z[layer, pos, latent].astype(np.float32)
  depth, t, n = config.depth, len(ids), len(features)
  # Shapes padded so that sentences of one length share compiled programs: the features to
  # a multiple of 256, the slots per (layer, position) to k (top-k) or a multiple of 8.
  counts = np.bincount(features[:, 0] * t + features[:, 1], minlength=depth * t)
  width = tc_config.k if tc_config.activation == "topk" else -(-max(counts.max(), 1) // 8) * 8
  groups = tuple(jnp.asarray(a) for a in _groups(features, acts, depth, t, width))
  padded = jnp.asarray(np.pad(features, ((0, max(256, -(-n // 256) * 256) - n), (0, 0))))
  n_pad = padded.shape[0]

  def compute(which):  # rows (features, then targets) -> (len, sources) edges
    which = np.where(which < n, which, which - n + n_pad)  # targets after the padded features
    asked = np.pad(which, (0, batch - len(which)), mode="edge")
    # Only the blocks up to the batch's highest feature: a batch of layer-l features needs
    # blocks 0 .. l (one compiled program per depth used; about half the FLOPs of a graph).
    stop = depth if (which >= n_pad).any() else int(features[which, 0].max()) + 1
    got = _rows(params, config, tc, emb, groups, errors, padded, targets, jnp.asarray(asked), stop)
    g_emb, g_feat, g_err = (np.asarray(a) for a in got)
    return np.concatenate([g_feat[:, :n], g_err.reshape(batch, -1), g_emb], 1)[: len(which)]

  limit = n if max_features is None else min(max_features, n)
  bar = timing.steps(1 + -(-limit // batch), "graph rows", show=progress)
  next(bar, None)
  target_rows = compute(n + np.arange(k))
  chosen: list[np.ndarray] = []
  feature_rows: list[np.ndarray] = []
  # For the selection: the rows so far, normalised, and which feature each row is (-1: a
  # target), filled a batch at a time.
  ranking = limit < n
  norm = np.zeros((k + limit, target_rows.shape[1]) if ranking else (0, 0), np.float32)
  row_node = np.full(k + limit, -1, np.int64)
  filled = _normalise_into(norm, 0, target_rows) if ranking else 0
  done = 0
  while done < limit:
    if not ranking:  # every feature: no ranking needed
      which = np.arange(done, min(done + batch, n))
    else:
      ranked = _partial_influence(norm[:filled], row_node[:filled], weights, n)
      ranked[row_node[k:filled]] = -np.inf
      which = np.sort(np.argsort(-ranked, kind="stable")[: min(batch, limit - done)])
    chosen.append(which)
    feature_rows.append(compute(which))
    if ranking:
      row_node[filled : filled + len(which)] = which
      filled = _normalise_into(norm, filled, feature_rows[-1])
    done += len(which)
    next(bar, None)
  for _ in bar:
    pass
  keep = np.concatenate(chosen) if chosen else np.zeros(0, np.int64)
  order = np.argsort(keep, kind="stable")
  keep, edges = keep[order], np.concatenate(feature_rows or [target_rows[:0]])[order]
  pre = np.asarray(_preactivations(tc, features, x))
  node_in = np.concatenate([pre[keep], np.asarray(values)])
  all_rows = np.concatenate([edges, target_rows])
  constants = node_in - all_rows.sum(1)  # the biases' share: no node's edge
  columns = np.concatenate([keep, np.arange(n, all_rows.shape[1])])
  m = len(keep) + depth * t + t + k
  adjacency = np.zeros((m, m), np.float32)
  adjacency[: len(keep), : len(columns)] = edges[:, columns]
  adjacency[m - k :, : len(columns)] = target_rows[:, columns]
  return Graph(
    adjacency=adjacency,
    features=features[keep],
    activations=acts[keep],
    preactivations=pre[keep],
    input_ids=np.asarray(ids),
    layers=depth,
    targets=targets,
    target_values=np.asarray(values),
    target_weights=weights.astype(np.float32),
    constants=constants.astype(np.float32),
  )


def _normalise_into(norm, start: int, rows) -> int:
  """Writes |rows| / their sums into `norm[start:]`; returns the next free row."""
  a = np.abs(rows)
  norm[start : start + len(rows)] = a / np.maximum(a.sum(1, keepdims=True), 1e-8)
  return start + len(rows)


def _partial_influence(norm, row_node, weights, n, max_iter=1000):
  """(n,) each feature's influence on the targets through the normalised rows computed so
  far, `norm`, whose nodes are `row_node` (-1: a target) (circuit-tracer's
  `compute_partial_influences`)."""
  k = len(weights)
  prod = np.zeros(len(norm), np.float32)
  prod[:k] = weights
  total = np.zeros(norm.shape[1], np.float64)
  for _ in range(max_iter):
    flow = prod @ norm  # (sources,)
    if not flow.any():
      return total[:n]
    total += flow
    prod = np.where(row_node >= 0, flow[np.maximum(row_node, 0)], 0).astype(np.float32)
  raise RuntimeError("influence did not converge: the graph has a cycle")


# Influence, pruning and scores (circuit-tracer 0.5.0's definitions) --------------------------


def normalized(adjacency) -> np.ndarray:
  """|A| with each row scaled to sum to 1 (rows of zeros stay zero)."""
  a = np.abs(np.asarray(adjacency, np.float64))
  return a / np.maximum(a.sum(1, keepdims=True), 1e-10)


def influence(matrix, weights, max_iter: int = 1000) -> np.ndarray:
  """`weights @ (A + A^2 + ...)`: each node's total influence on the weighted targets through
  the (normalised) graph `matrix`."""
  current = np.asarray(weights, np.float64) @ matrix
  total = current.copy()
  for _ in range(max_iter):
    if not current.any():
      return total
    current = current @ matrix
    total += current
  raise RuntimeError(f"influence did not converge in {max_iter} steps: the graph has a cycle")


def node_influence(graph: Graph) -> np.ndarray:
  """(n,) each node's total influence on the weighted targets (circuit-tracer's ranking)."""
  return influence(normalized(graph.adjacency), _weights(graph))


def _weights(graph: Graph) -> np.ndarray:
  w = np.zeros(graph.adjacency.shape[0])
  w[graph.slices()["targets"]] = graph.target_weights
  return w


def _threshold(scores, keep: float):
  ordered = np.sort(np.ravel(scores))[::-1]
  cumulative = np.cumsum(ordered) / ordered.sum()
  return ordered[min(int(np.searchsorted(cumulative, keep)), len(ordered) - 1)]


def _edge_scores(graph: Graph, nodes, weights) -> np.ndarray:
  """(n, n) each edge's score among `nodes`: its share of its target's input times the
  target's influence plus the target's weight (circuit-tracer's edge ranking)."""
  kept = np.where(nodes[:, None] & nodes[None, :], graph.adjacency, 0.0)
  norm = normalized(kept)
  return norm * (influence(norm, weights) + weights)[:, None]


class Pruned(NamedTuple):
  """What `prune` keeps: node and edge masks, and each node's cumulative influence share."""

  node_mask: np.ndarray  # (n,) bool: nodes kept
  edge_mask: np.ndarray  # (n, n) bool: edges kept
  cumulative: np.ndarray  # (n,) each node's cumulative share of influence, in rank order


def prune(graph: Graph, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> Pruned:
  """Keeps the nodes that carry `node_threshold` of the total influence on the targets, then
  the edges that carry `edge_threshold` of the kept graph's, then drops features and errors
  left without an outgoing edge and features without an incoming one (circuit-tracer's
  `prune_graph`). Embeddings and targets are always kept."""
  for name, v in (("node_threshold", node_threshold), ("edge_threshold", edge_threshold)):
    if not 0.0 <= v <= 1.0:
      raise ValueError(f"{name}={v} must be in [0, 1]")
  weights = _weights(graph)
  s = graph.slices()
  fixed = s["embeddings"].start  # features and errors come before it
  ranking = influence(normalized(graph.adjacency), weights)
  nodes = ranking >= _threshold(ranking, node_threshold)
  nodes[fixed:] = True
  edge_scores = _edge_scores(graph, nodes, weights)
  edges = edge_scores >= _threshold(edge_scores, edge_threshold)
  n = graph.n_features

  def drop_loose():  # features and errors need an outgoing edge; features an incoming one
    nodes[:fixed] &= edges[:, :fixed].any(0)
    nodes[:n] &= edges[:n].any(1)

  before = nodes.copy()
  drop_loose()
  while (nodes != before).any():  # each pass may strand more (at most depth + 1 passes)
    before = nodes.copy()
    edges &= nodes[:, None] & nodes[None, :]
    drop_loose()
  order = np.argsort(-ranking, kind="stable")
  cumulative = np.zeros_like(ranking)
  cumulative[order] = np.cumsum(ranking[order]) / ranking.sum()
  return Pruned(nodes, edges, cumulative)


def scores(graph: Graph) -> dict[str, float]:
  """circuit-tracer's graph scores: "replacement", the share of the embeddings' and errors'
  influence on the targets that is the embeddings'; "completeness", the influence-weighted
  share of every node's input that comes from non-error nodes."""
  weights = _weights(graph)
  s = graph.slices()
  norm = normalized(graph.adjacency)
  ranking = influence(norm, weights)
  token = ranking[s["embeddings"]].sum()
  error = ranking[s["errors"]].sum()
  non_error = 1 - norm[:, s["errors"]].sum(1)
  out = ranking + weights
  return {
    "replacement": float(token / (token + error)),
    "completeness": float((non_error * out).sum() / out.sum()),
  }


def view(graph: Graph, pruned: Pruned, tokens=None, max_edges: int | None = None) -> dict:
  """The pruned graph as plain data (JSON-ready): "tokens", "targets", "scores" and the kept
  "nodes" (kind, layer, position, latent, activation, influence) and "edges", each
  `[source, target, weight]` with source and target indices into "nodes"; "kept_nodes" and
  "kept_edges" count the pruned graph's.

  Args:
    max_edges: at most this many edges: of the kept ones, those `prune` scores highest
      within the pruned graph, with the nodes they join and every target (a page stays
      readable, and small, where the pruning keeps hundreds of thousands).
  """
  if max_edges is not None and max_edges < 1:
    raise ValueError(f"max_edges={max_edges} must be >= 1 (None: every kept edge)")
  ranking = node_influence(graph)
  mask = pruned.edge_mask & pruned.node_mask[:, None] & pruned.node_mask[None]
  total = (int(pruned.node_mask.sum()), int(mask.sum()))
  shown = pruned.node_mask.copy()
  if max_edges is not None and total[1] > max_edges:  # the nodes they join, and the targets
    score = np.where(mask, _edge_scores(graph, pruned.node_mask, _weights(graph)), -np.inf)
    best = np.argsort(-score, axis=None, kind="stable")[:max_edges]
    mask = np.zeros_like(mask)
    mask.flat[best] = True
    shown &= mask.any(0) | mask.any(1)
    shown[graph.slices()["targets"]] = True
  keep = np.nonzero(shown)[0]
  index = {int(n): i for i, n in enumerate(keep)}
  nodes = []
  for n in keep:
    node = {**graph.node(int(n)), "influence": float(ranking[n])}
    if node["kind"] == "feature":
      node["activation"] = float(graph.activations[n])
    if node["kind"] == "target":
      node["value"] = float(graph.target_values[node["index"]])
      node["position"] = getattr(graph.targets[node["index"]], "position", None)
    nodes.append(node)
  dst, src = np.nonzero(mask)
  edges = [
    [index[int(s)], index[int(t)], float(f"{graph.adjacency[t, s]:.4g}")] for t, s in zip(dst, src)
  ]
  ids = graph.input_ids.tolist()
  return {
    "tokens": list(tokens) if tokens is not None else ids,
    "targets": [getattr(t, "label", "") or type(t).__name__ for t in graph.targets],
    "scores": scores(graph),
    "nodes": nodes,
    "edges": edges,
    "kept_nodes": total[0],
    "kept_edges": total[1],
  }


# Interventions: what the graph predicts, what the model does ---------------------------------


def predict(graph: Graph, nodes, factor: float) -> np.ndarray:
  """(K,) the change in each target that the graph predicts when features `nodes` (indices
  into `graph.features`) have their activations multiplied by `factor` (0: ablated): the
  change flows along the graph's edges, each other feature passing on the change in its
  pre-activation as its own (the linearisation at this input: a feature stays active)."""
  nodes = np.asarray(nodes, np.int64).ravel()
  n = graph.n_features
  if not len(nodes) or nodes.min() < 0 or nodes.max() >= n:
    raise ValueError(f"nodes must index the graph's {n} features, got {nodes.tolist()}")
  acts = graph.activations.astype(np.float64)
  # J[t, s] = d pre_t / d a_s: the edges per unit of activation.
  jac = graph.adjacency[:n, :n].astype(np.float64) / np.where(acts == 0, 1, acts)[None]
  fixed = np.zeros(n)
  fixed[nodes] = (factor - 1) * acts[nodes]
  clamped = np.zeros(n, bool)
  clamped[nodes] = True
  delta = fixed.copy()
  for _ in range(graph.layers):  # edges rise in layer: depth passes reach every feature
    delta = np.where(clamped, fixed, jac @ delta)
  to_target = graph.adjacency[graph.slices()["targets"], :n].astype(np.float64)
  return (to_target / np.where(acts == 0, 1, acts)[None]) @ delta


def steer(
  params: Params,
  config: BertConfig,
  tc: Params,
  graph: Graph,
  nodes,
  factor: float,
) -> np.ndarray:
  """(K,) the change in each target when the model itself runs with features `nodes` of
  `graph` multiplied by `factor`: each feature's decoder rows times (factor - 1) times its
  activation are added to the FFN outputs it writes to (at its position), and everything
  else, attention, norms and the model's own FFNs, responds as it will."""
  nodes = np.asarray(nodes, np.int64).ravel()
  if not len(nodes) or nodes.min() < 0 or nodes.max() >= graph.n_features:
    raise ValueError(f"nodes must index the graph's {graph.n_features} features")
  delta = np.zeros((graph.layers, graph.n_pos, tc["b_dec"].shape[-1]), np.float32)
  for i in nodes:
    layer, pos, latent = (int(v) for v in graph.features[i])
    rows = np.asarray(tc["W_dec"][layer][latent])  # (R, H)
    delta[layer : layer + len(rows), pos] += (factor - 1) * graph.activations[i] * rows
  got = _steered(params, config, jnp.asarray(graph.input_ids), jnp.asarray(delta), graph.targets)
  return np.asarray(got) - graph.target_values


@functools.partial(jax.jit, static_argnames=("config", "targets"))
def _steered(params, config, ids, delta, targets):
  patch = {"ffn_out": lambda v, i: v + delta[i][None].astype(v.dtype)}
  out = forward(params, config, ids[None], patch=patch)
  return _target_values(params, config, targets, out.last_hidden_state[0])
