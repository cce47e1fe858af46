"""Edge attribution patching on the encoder's graph: EAP, EAP-IG, exact edge patching.

Syed, Rager & Conmy 2023, "Attribution patching outperforms automated circuit discovery"
(EAP); Hanna, Pezzelle & Belinkov 2024, "Have faith in faithfulness: going beyond circuit
overlap when finding model mechanisms" (EAP-IG). Conventions follow EAP-IG's released code
(hannamw/EAP-IG): its node and edge names and index layout, the direction (scores and
exact values are `metric(clean run with the edge carrying the corrupted activation) -
metric(clean)`; the activation difference is corrupted - clean, the gradient is taken at
the clean run), EAP-IG's path (the `embeddings` site moved from the corrupted run's to the
clean run's in `steps` left Riemann points `corrupted + k / steps (clean - corrupted)`,
k = 0 .. steps - 1, the gradients averaged; `ig_input="tokens"` runs it over the token
embeddings instead, where the released code does), and, in `bertjax.analysis.interventions.circuits`, top-n and
greedy circuits, their pruning and circuit evaluation (an edge outside the circuit carries
the corrupted run's activation, an edge inside it the patched run's own). Where bertjax differs: the metric is already a
mean over the batch (EAP-IG divides its summed scores by the batch size instead), so a
score estimates the change of the metric itself.

**The graph** (`Graph`). Senders (nodes that write): `input` (the `embeddings` site), every
head `a{l}.h{h}` (its context times its slice of the output projection, `head_out_h W_O^h`;
the output bias is no node) and every FFN `m{l}` (`ffn_out`). Receivers (nodes that read):
each head's query, key and value inputs `a{l}.h{h}<q>`, `<k>`, `<v>`, every FFN's input
`m{l}` and `logits` (the final hidden state the metric reads). An edge runs from every
sender to every receiver that reads the stream after the sender wrote it: 'a0.h3->m0',
'input->a2.h1<k>', 'm4->logits' (EAP-IG's names). Scores are `(n_senders, n_receivers)`
matrices, NaN where there is no edge.

**Post-LN blocks.** EAP-IG's models are pre-LN: there the residual stream is the sum of
the senders' outputs, and edge u -> v carries u's output into v's input. In BERT and the
post-LN families, a LayerNorm follows every sublayer, so the stream is no sum. With each
LayerNorm's scale `1 / sigma` (a number per token) frozen at the run being patched -- the
linearisation that norm-based attribution uses for these blocks (Kobayashi et al. 2021,
GlobEnc, ALTI, DecompX) -- `LN(r) = g (r - mean r) / sigma + b` is affine, and the stream
at any point is each sender's output carried through the LayerNorms in between (centred,
times `g / sigma`), summed, plus bias terms. That carried term is what edge u -> v
transmits. Patching the edge (`edge_patching`) adds to v's input alone (the query of one
head, ...) the corrupted - clean difference of u's output, carried through the same
LayerNorms with the patched run's sigmas; EAP's score is its first-order estimate, the
carried difference against d metric / d (v's input). In a circuit
(`circuits.circuit_metric`) every edge outside the circuit is patched at once, each carried
with the sigmas of the run being evaluated, so the full circuit is the clean run and a
circuit missing one edge is that edge's exact patch (tested).

The scores come from one corrupted run, the clean run with its gradient at every
receiver's input (through zero additions to the `q`, `k`, `v` and `ffn_in` sites), and a
closed form of the carried differences (`bertjax.analysis.interventions.edge_scores`): no
pair of nodes is carried explicitly. `edge_patching` carries each edge's difference step by
step instead and runs the model, which is what the tests compare the closed form with.

Supported: the post-LN LayerNorm families without rotary positions or disentangled
attention (`SUPPORTED`); the others are refused by name (pre-LN ModernBERT and EuroBERT
read the stream through a per-receiver norm; NomicBERT rotates q and k; DeBERTa adds
position terms and a convolution to the stream).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.analysis.interventions.edge_scores import score_matrix
from bertjax.analysis.interventions.metrics import Metric, metric_rows
from bertjax.analysis.interventions.patching import (
  checked_pair,
  metric_of,
  row_values,
  sweep_forward,
)
from bertjax.model.config import BertConfig
from bertjax.model.families import FAMILIES
from bertjax.model.forward import embed, run_layers
from bertjax.model.layers import accum_dtype
from bertjax.model.sites import take_rows

Params = dict[str, Any]
METHODS = ("eap", "eap-ig")
# Where EAP-IG's path from the corrupted to the clean input runs (`edge_attribution(ig_input=)`).
IG_INPUTS = ("embeddings", "tokens")


def covered(family) -> bool:
  """Whether the graph's derivation covers a family's block (post-LN LayerNorm, no rotary
  q and k, no disentangled attention); a family added with `families.register` is judged by
  its row too."""
  return (
    family.norm == "post"
    and family.norm_kind == "layernorm"
    and family.positions != "rotary"
    and family.position_bias != "disentangled"
  )


SUPPORTED = tuple(name for name, fam in FAMILIES.items() if covered(fam))  # built-in families


def check_supported(config: BertConfig, what: str = "edge attribution") -> None:
  """Raises a ValueError naming the family when the graph's derivation does not cover it."""
  fam = config.family
  if not covered(fam):
    why = (
      "a pre-LN block reads the stream through a norm of each receiver's own"
      if fam.norm == "pre"
      else "its q and k are rotated"
      if fam.positions == "rotary"
      else "its attention adds disentangled position terms (and a convolution after block 0)"
      if fam.position_bias == "disentangled"
      else "its norms are not LayerNorms"
    )
    raise ValueError(
      f"{what} is derived for post-LN LayerNorm blocks; a {config.model_type!r} "
      f"model is not covered ({why}); supported families: {SUPPORTED}"
    )
  if config.is_pruned:
    raise ValueError(f"{what} needs every head of every layer; this config is pruned")
  if config.kv_heads != config.num_attention_heads:
    raise ValueError(
      f"{what}: grouped key/value heads ({config.kv_heads} for "
      f"{config.num_attention_heads}) are not covered"
    )


# The graph ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Graph:
  """The encoder's nodes and edges in EAP-IG's index layout.

  Senders: 0 `input`, then per layer l the heads `1 + l (N + 1) + h` and the FFN
  `1 + l (N + 1) + N`. Receivers: per layer l the query inputs `l (3N + 1) + h`, keys
  `+ N`, values `+ 2N`, the FFN `l (3N + 1) + 3N`; `logits` last. Stages count the
  LayerNorms of the stream (K = 2 depth): a sender's output first meets LayerNorm
  `sender_stage` (the input's: 0, head l: 2l, FFN l: 2l + 1); a receiver reads the stream
  after `receiver_stage` of them (head l: 2l, FFN l: 2l + 1, logits: K).
  """

  depth: int
  heads: int

  @property
  def n_senders(self) -> int:
    """How many senders: the input, then each layer's heads and its FFN."""
    return 1 + self.depth * (self.heads + 1)

  @property
  def n_receivers(self) -> int:
    """How many receivers: each head's q, k and v inputs and each FFN's input, then the logits."""
    return self.depth * (3 * self.heads + 1) + 1

  def sender(self, layer: int, head: int | None = None) -> int:
    """A head's (or, with head None, the FFN's) sender index."""
    return 1 + layer * (self.heads + 1) + (self.heads if head is None else head)

  def receiver(self, layer: int, head: int | None = None, qkv: str | None = None) -> int:
    """A head input's (`qkv` "q", "k" or "v") or, with head None, the FFN's receiver index."""
    base = layer * (3 * self.heads + 1)
    return base + 3 * self.heads if head is None else base + "qkv".index(qkv) * self.heads + head

  @functools.cached_property
  def senders(self) -> tuple[str, ...]:
    """Each sender's name, by index: "input", then per layer its heads "aL.hH" and its
    FFN "mL"."""
    names = ["input"]
    for layer in range(self.depth):
      names += [f"a{layer}.h{h}" for h in range(self.heads)] + [f"m{layer}"]
    return tuple(names)

  @functools.cached_property
  def receivers(self) -> tuple[str, ...]:
    """Each receiver's name, by index: per layer the heads' q, k and v inputs "aL.hH<q>" ...
    and the FFN "mL", then "logits"."""
    names = []
    for layer in range(self.depth):
      for letter in "qkv":
        names += [f"a{layer}.h{h}<{letter}>" for h in range(self.heads)]
      names.append(f"m{layer}")
    return tuple(names + ["logits"])

  @functools.cached_property
  def sender_stage(self) -> np.ndarray:
    """(n_senders,) when each sender writes: the input at 0, layer l's heads at 2l, its FFN
    at 2l + 1."""
    stage = [0]
    for layer in range(self.depth):
      stage += [2 * layer] * self.heads + [2 * layer + 1]
    return np.asarray(stage)

  @functools.cached_property
  def receiver_stage(self) -> np.ndarray:
    """(n_receivers,) when each receiver reads: layer l's heads at 2l, its FFN at 2l + 1, the
    logits after every layer (2L)."""
    stage = []
    for layer in range(self.depth):
      stage += [2 * layer] * (3 * self.heads) + [2 * layer + 1]
    return np.asarray(stage + [2 * self.depth])

  @functools.cached_property
  def valid(self) -> np.ndarray:
    """(n_senders, n_receivers) bool: which pairs are edges."""
    ok = self.sender_stage[:, None] < self.receiver_stage[None, :]
    ok[0] = True  # the embeddings are in the stream every receiver reads
    return ok

  @functools.cached_property
  def sender_of_receiver(self) -> np.ndarray:
    """(n_receivers,) the sender index of the node a receiver belongs to (-1: logits)."""
    out = np.full(self.n_receivers, -1)
    for layer in range(self.depth):
      for h in range(self.heads):
        for letter in "qkv":
          out[self.receiver(layer, h, letter)] = self.sender(layer, h)
      out[self.receiver(layer)] = self.sender(layer)
    return out

  def edge_name(self, s: int, r: int) -> str:
    """The edge from sender `s` to receiver `r` as EAP-IG names it, e.g. 'a0.h1->m2'."""
    return f"{self.senders[s]}->{self.receivers[r]}"

  def edge(self, name: str) -> tuple[int, int]:
    """(sender, receiver) indices of an edge named as EAP-IG names it ('a0.h1->m2')."""
    parent, _, child = name.partition("->")
    if parent not in self.senders or child not in self.receivers:
      raise ValueError(
        f"edge {name!r} is not of this graph (names like 'input->a0.h1<q>', "
        f"'a0.h1->m2', 'm{self.depth - 1}->logits')"
      )
    s, r = self.senders.index(parent), self.receivers.index(child)
    if not self.valid[s, r]:
      raise ValueError(f"edge {name!r}: {child} reads the stream before {parent} writes it")
    return s, r


def graph(config: BertConfig) -> Graph:
  """The graph of a model of `config` (refusing the families it does not cover)."""
  check_supported(config)
  return Graph(config.depth, config.num_attention_heads)


@dataclasses.dataclass(frozen=True)
class EdgeScores:
  """Scores of a graph's edges: `values` (n_senders, n_receivers), NaN where no edge (or
  none computed), beside the clean and corrupted runs' metric."""

  graph: Graph
  values: np.ndarray
  clean: float
  corrupted: float
  method: str

  def top(self, k: int, absolute: bool = True) -> list[tuple[str, float]]:
    """The k highest-scoring edges (by absolute value unless `absolute=False`), named."""
    v = np.where(np.isnan(self.values), -np.inf, np.abs(self.values) if absolute else self.values)
    order = np.argsort(-v, axis=None)[:k]
    return [
      (self.graph.edge_name(*np.unravel_index(i, v.shape)), float(self.values.flat[i]))
      for i in order
      if np.isfinite(v.flat[i])
    ]


# Pieces shared by the scores, the exact patches and circuits ----------------------


def stacked_weights(params, config: BertConfig) -> dict:
  """Per-depth projection kernels and LayerNorm scales (ALBERT's shared layers indexed)."""
  idx = np.asarray(config.layer_param_index)
  layers = params["encoder"]["layers"]
  att = layers["attention"]
  f32 = lambda a: jnp.asarray(a, accum_dtype(config))[idx]
  return dict(
    q=f32(att["query"]["kernel"]),
    k=f32(att["key"]["kernel"]),
    v=f32(att["value"]["kernel"]),
    o=f32(att["output"]["kernel"]),
    gammas=jnp.stack(
      [f32(att["LayerNorm"]["scale"]), f32(layers["LayerNorm"]["scale"])], 1
    ).reshape(2 * config.depth, -1),
  )  # LN 2l: attention's, 2l+1: FFN's


def layer_norm_scale(r, eps: float):
  """(B, T) LayerNorm scale sqrt(var + eps) of (B, T, H), as the model's Norm computes it."""
  r = r.astype(jnp.promote_types(r.dtype, jnp.float32))
  c = r - r.mean(-1, keepdims=True)
  return jnp.sqrt((c * c).mean(-1) + eps)


def _sigmas(config: BertConfig, resid_mid, resid_out):
  """(K, B, T): every LayerNorm's sigma in stream order (1 where a block ran at some rows)."""
  eps = config.layer_norm_eps
  sig = jnp.stack(
    [layer_norm_scale(resid_mid, eps), layer_norm_scale(resid_out, eps)], 1
  )  # (L, 2, B, T)
  sig = sig.reshape((-1,) + sig.shape[2:])
  # Rows a final block did not compute are zeros there: their sigma is sqrt(eps); any finite
  # value serves, since nothing there reaches the metric.
  return jnp.where(sig <= np.sqrt(eps) * 1.0001, 1.0, sig)


def frozen_layer_norm(x, gamma, sigma):
  """The frozen-sigma LayerNorm without its bias, `gamma (x - mean x) / sigma`, on (..., B, T, H)."""
  return gamma * (x - x.mean(-1, keepdims=True)) / sigma[..., None]


def _head_outputs(delta_head_out, wo):
  """(L, N, B, T, H): each head's context difference through its slice of W_O."""
  return jnp.einsum("lbtnd,lndh->lnbth", delta_head_out.astype(wo.dtype), wo)


def _sender_deltas(config, d_emb, d_head_out, d_ffn, wo):
  """(n_senders, B, T, H): corrupted - clean output of every sender, in sender order."""
  heads = _head_outputs(d_head_out, wo)  # (L, N, B, T, H)
  per_layer = jnp.concatenate([heads, d_ffn.astype(wo.dtype)[:, None]], 1)  # (L, N+1, ...)
  return jnp.concatenate(
    [d_emb.astype(wo.dtype)[None], per_layer.reshape((-1,) + per_layer.shape[2:])]
  )


def _adder(deltas, rows):
  """A function patch adding `deltas[layer]` (full length; read at `rows` where a block runs
  at some rows only) to a site, in an unrolled run (`layer` a Python int)."""

  def fn(value, layer):
    d = deltas[layer]
    if d.shape[1] != value.shape[1]:
      d = take_rows(d, rows)
    return value + d.astype(value.dtype)

  return fn


# Scores ----------------------------------------------------------------------------


def _gradients(params, config, batch, metric, x, rows):
  """The metric at embeddings `x` and its gradient at every receiver's input site: (value,
  {"q", "k", "v", "ffn_in": per-layer lists, "out": (B, T, H)}, captures)."""
  b, t = batch["input_ids"].shape
  n, d, h = config.num_attention_heads, config.head_dim, config.hidden_size
  acc = accum_dtype(config)
  zeros = lambda *shape: [jnp.zeros((b, t) + shape, acc) for _ in range(config.depth)]
  eps = {
    "q": zeros(n, d),
    "k": zeros(n, d),
    "v": zeros(n, d),
    "ffn_in": zeros(h),
    "out": jnp.zeros((b, t, h), acc),
  }

  def f(eps):
    fns = {s: _adder(eps[s], rows) for s in ("q", "k", "v", "ffn_in")}
    run = run_layers(
      params,
      config,
      x,
      batch["attention_mask"],
      patch=fns,
      final_rows=rows,
      unroll=True,
      capture=("head_out", "ffn_out", "resid_mid", "resid_out"),
    )
    last = run.last + eps["out"].astype(run.last.dtype)
    return metric_of(params, config, metric, last, batch, None), run.cache

  value, backward, cache = jax.vjp(f, eps, has_aux=True)
  (grads,) = backward(jnp.ones_like(value))
  return value, grads, cache


def _corrupted_run(params, config, x_corr, corrupted, xb, metric):
  """The corrupted run's metric and its senders' outputs."""
  corr = run_layers(
    params,
    config,
    x_corr,
    corrupted["attention_mask"],
    capture=("head_out", "ffn_out"),
    final_rows=metric_rows(metric, config, xb),
  )
  return metric_of(params, config, metric, corr.last, xb, None), corr.cache


def _passes(params, config, clean, corrupted, targets, *, metric, method, steps, ig_input):
  """`_attribute`'s model runs without its scores (`benchmarks/bench_edges.py` times them)."""
  cb, xb = {**clean, **targets}, {**corrupted, **targets}
  rows = metric_rows(metric, config, cb)
  x_clean = embed(params, config, clean["input_ids"], clean["token_type_ids"])
  x_corr = embed(params, config, corrupted["input_ids"], corrupted["token_type_ids"])
  if method == "eap":
    corr_m, corr_cache = _corrupted_run(params, config, x_corr, corrupted, xb, metric)
    clean_m, grads, cache = _gradients(params, config, cb, metric, x_clean, rows)
    return x_clean, x_corr, clean_m, corr_m, grads, cache, corr_cache
  if ig_input == "embeddings":  # step 0 is the corrupted run itself
    point = lambda alpha: x_corr + alpha * (x_clean - x_corr)
    corr_m, grads, corr_cache = _gradients(params, config, cb, metric, x_corr, rows)
  else:  # the token embeddings move; the clean run's positions, types and norm follow
    words = params["embeddings"]["word_embeddings"]["embedding"]
    shift = words[corrupted["input_ids"]] - words[clean["input_ids"]]  # (B, T, E)
    point = lambda alpha: embed(
      params, config, clean["input_ids"], clean["token_type_ids"], offset=(1 - alpha) * shift
    )
    corr_m, corr_cache = _corrupted_run(params, config, x_corr, corrupted, xb, metric)
    _, grads, _ = _gradients(params, config, cb, metric, point(0.0), rows)

  def step(acc, k):
    x = point(k / steps)
    _, gk, _ = _gradients(params, config, cb, metric, x, rows)
    return jax.tree.map(jnp.add, acc, gk), None

  grads, _ = jax.lax.scan(step, grads, jnp.arange(1, steps, dtype=x_clean.dtype))
  grads = jax.tree.map(lambda a: a / steps, grads)
  run = run_layers(
    params,
    config,
    x_clean,
    clean["attention_mask"],
    final_rows=rows,
    capture=("head_out", "ffn_out", "resid_mid", "resid_out"),
  )
  clean_m = metric_of(params, config, metric, run.last, cb, None)
  return x_clean, x_corr, clean_m, corr_m, grads, run.cache, corr_cache


@functools.partial(jax.jit, static_argnames=("config", "metric", "method", "steps", "ig_input"))
def _attribute(params, config, clean, corrupted, targets, *, metric, method, steps, ig_input):
  g = Graph(config.depth, config.num_attention_heads)
  w = stacked_weights(params, config)
  x_clean, x_corr, clean_m, corr_m, grads, cache, corr_cache = _passes(
    params,
    config,
    clean,
    corrupted,
    targets,
    metric=metric,
    method=method,
    steps=steps,
    ig_input=ig_input,
  )
  deltas = _sender_deltas(
    config,
    x_corr - x_clean,
    corr_cache["head_out"] - cache["head_out"],
    corr_cache["ffn_out"] - cache["ffn_out"],
    w["o"],
  )
  sigma = _sigmas(config, cache["resid_mid"], cache["resid_out"])
  return score_matrix(config, g, w, deltas, sigma, grads), clean_m, corr_m


def edge_attribution(
  params: Params,
  config: BertConfig,
  clean,
  corrupted,
  metric: Metric,
  *,
  targets: Mapping | None = None,
  method: str = "eap",
  steps: int = 5,
  ig_input: str = "embeddings",
) -> EdgeScores:
  """Every edge's attribution score: EAP, or EAP-IG along the embeddings path.

  `score(u -> v) ~= metric(clean run with edge u -> v carrying the corrupted run's
  activation) - metric(clean)` to first order (EAP: the gradient at the clean run;
  EAP-IG: averaged over `steps` points between the corrupted and clean embeddings). See
  the module docstring for the graph and the post-LN edges.

  Args:
    params, config: the model (a family in `SUPPORTED`).
    clean, corrupted: batches of the same shape and padding (as `patching.head_patching`).
    metric: `metric(params, config, out, batch) -> scalar` (`patching.LogitDiff`, ...).
    targets: the metric's targets (each (batch,)).
    method: "eap" or "eap-ig".
    steps: EAP-IG's points (at least 1; "eap" ignores it).
    ig_input: where EAP-IG's path runs. "embeddings" (default): the embedding block's
      output, after its LayerNorm (the `input` node's own activation, the `embeddings`
      site). "tokens": the token embeddings before the positions, token types, the
      embedding LayerNorm and ALBERT's projection, as the released EAP-IG code
      interpolates (TransformerLens's `hook_embed`; its models have no embedding
      LayerNorm): point k is the embedding block applied to `W[corrupted] + k / steps
      (W[clean] - W[corrupted])` with the clean run's positions and token types. The two
      paths differ on BERT-like models; the input node's difference and the corrupted run
      are the same for both.

  Returns:
    `EdgeScores` with values (n_senders, n_receivers), NaN off the graph.
  """
  if method not in METHODS:
    raise ValueError(f"{method=!r} must be one of {METHODS}")
  if not isinstance(steps, int) or steps < 1:
    raise ValueError(f"{steps=!r} must be a positive int")
  if ig_input not in IG_INPUTS:
    raise ValueError(f"{ig_input=!r} must be one of {IG_INPUTS}")
  g = graph(config)
  src, dst, targets = checked_pair(config, clean, corrupted, targets, "denoise", params, metric)
  values, clean_m, corr_m = _attribute(
    params,
    config,
    src,
    dst,
    targets,
    metric=metric,
    method=method,
    steps=steps if method == "eap-ig" else 1,
    ig_input=ig_input if method == "eap-ig" else "embeddings",
  )
  values = np.asarray(values, np.float64)
  if not np.isfinite(values[g.valid]).all():
    raise ValueError(
      "edge scores are not finite: the LayerNorm chain's products left float32 "
      "range (a LayerNorm scale of zero, or sigmas far from 1 over many layers)"
    )
  return EdgeScores(g, np.where(g.valid, values, np.nan), float(clean_m), float(corr_m), method)


# Exact edge patching ------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("config",))
def _edge_inputs(params, config, clean, corrupted):
  """What every edge's patched run starts from: the clean run's input to each block
  `(L + 1, B, T, H)` (the embeddings, then every block's output), the senders' corrupted -
  clean differences and the clean run's sigmas."""
  w = stacked_weights(params, config)
  x_clean, run = sweep_forward(
    params,
    config,
    clean,
    capture=("head_out", "ffn_out", "resid_mid", "resid_out"),
    output_hidden_states=True,
  )
  x_corr, corr = sweep_forward(params, config, corrupted, capture=("head_out", "ffn_out"))
  deltas = _sender_deltas(
    config,
    x_corr - x_clean,
    corr.cache["head_out"] - run.cache["head_out"],
    corr.cache["ffn_out"] - run.cache["ffn_out"],
    w["o"],
  )
  sigma = _sigmas(config, run.cache["resid_mid"], run.cache["resid_out"])
  states = jnp.concatenate([x_clean[None].astype(run.hidden_states.dtype), run.hidden_states])
  return states, deltas, sigma


@functools.partial(jax.jit, static_argnames=("config", "metric", "start", "chunk"))
def _patch_edges(
  params, config, clean, targets, inputs, senders, receivers, weight, *, metric, start, chunk
):
  """metric(clean run with each edge (senders[e] -> receivers[e]) patched): (E,), for edges
  whose receiver reads block `start`'s input (`config.depth`: the final state).

  One program per receiving block: the blocks before it run as in the clean run, so each
  edge's run starts from the clean input of block `start` (`_edge_inputs`); within it, each
  patch is gated by the receiver's kind."""
  g = Graph(config.depth, config.num_attention_heads)
  w = stacked_weights(params, config)
  cb = {**clean, **targets}
  rows = metric_rows(metric, config, cb)
  states, deltas, sigma = inputs
  stage, t_of = jnp.asarray(g.sender_stage), jnp.asarray(g.receiver_stage)
  n = config.num_attention_heads
  w_qkv = jnp.stack([w["q"], w["k"], w["v"]], 1)  # (L, 3, H, N, D)
  mask = clean["attention_mask"]

  def one(edge):
    s, r = edge
    t = t_of[r]
    delta = deltas[s] * weight
    for k in range(2 * config.depth):  # LayerNorm k acts between the sender and the receiver
      delta = jnp.where(
        (k >= stage[s]) & (k < t), frozen_layer_norm(delta, w["gammas"][k], sigma[k]), delta
      )
    if start == config.depth:  # the final state, read by the metric
      out = states[start] + delta.astype(states.dtype)
      return metric_of(params, config, metric, out, cb, None)
    j = r % (3 * n + 1)
    which = jnp.where(j == 3 * n, 3, j // n)
    onehot = (jnp.arange(n) == j % n)[None, None, :, None]
    proj = jnp.einsum("bth,hnd->btnd", delta, w_qkv[start, jnp.minimum(which, 2)]) * onehot
    patch = {
      site: functools.partial(add_at_layer, add=proj * (which == i), layer=start, rows=rows)
      for i, site in enumerate("qkv")
    }
    patch["ffn_in"] = functools.partial(
      add_at_layer, add=delta * (which == 3), layer=start, rows=rows
    )
    out = run_layers(
      params, config, states[start], mask, start=start, patch=patch, final_rows=rows
    ).last
    return metric_of(params, config, metric, out, cb, None)

  return jax.lax.map(one, (senders, receivers), batch_size=chunk)


def _rows_like(delta, value, rows):
  return delta if delta.shape[1] == value.shape[1] else take_rows(delta, rows)


def add_at_layer(value, lyr, *, add, layer, rows):
  """A function patch: `value` plus `add` in block `layer` only (`lyr` is the block being
  run), `add` read at the block's `rows` when the block runs on some."""
  return value + jnp.where(lyr == layer, _rows_like(add, value, rows), 0).astype(value.dtype)


def _edge_mask(g: Graph, edges) -> np.ndarray:
  """Edges as a (n_senders, n_receivers) bool mask: None (all), a mask, names or index pairs."""
  if edges is None:
    return g.valid.copy()
  arr = np.asarray(edges) if not isinstance(edges, (list, tuple)) else None
  if arr is not None and arr.dtype == bool:
    if arr.shape != g.valid.shape:
      raise ValueError(f"an edge mask has shape {arr.shape}; the graph's is {g.valid.shape}")
    if (arr & ~g.valid).any():
      s, r = np.argwhere(arr & ~g.valid)[0]
      raise ValueError(
        f"the edge mask selects ({s}, {r}), {g.senders[s]} -> {g.receivers[r]}, "
        "which is no edge of the graph"
      )
    return arr.copy()
  mask = np.zeros(g.valid.shape, bool)
  for e in edges:
    s, r = g.edge(e) if isinstance(e, str) else (int(e[0]), int(e[1]))
    if not (0 <= s < g.n_senders and 0 <= r < g.n_receivers and g.valid[s, r]):
      raise ValueError(f"edge {e!r} is no edge of the graph")
    mask[s, r] = True
  return mask


def edge_patching(
  params: Params,
  config: BertConfig,
  clean,
  corrupted,
  metric: Metric,
  *,
  targets: Mapping | None = None,
  edges=None,
  weight: float = 1.0,
  chunk_size: int = 16,
) -> EdgeScores:
  """Exact edge patching: each edge alone carries the corrupted run's activation.

  For edge u -> v the clean run is rerun with v's input (the query, key or value input of
  one head, an FFN's input, or the final state) plus u's corrupted - clean output difference
  carried through the LayerNorms between them (module docstring), one LayerNorm at a time;
  the value is `metric(patched) - metric(clean)`, the quantity `edge_attribution`
  estimates. Every patch is a function patch of a site (`q`, `k`, `v` through the
  receiver's slice of the projection, which is linear in its input; `ffn_in`). The blocks
  before the receiver's are the clean run's, so each edge's run starts at the receiver's
  block from the clean run's input to it: one compiled program per receiving block, with
  the patch gated by the receiver's kind (on all-MiniLM-L6-v2 this takes 60% of the time
  a full run per edge took).

  Args:
    params, config, clean, corrupted, metric, targets: as `edge_attribution`.
    edges: None (every edge), a (n_senders, n_receivers) bool mask, edge names
      ('a0.h1->m2') or (sender, receiver) index pairs.
    weight: the difference carried is `weight` times corrupted - clean (1: the patch; small
      weights give the derivative that EAP's score is, by finite differences).
    chunk_size: edges run at once (`jax.lax.map(batch_size=)`).

  Returns:
    `EdgeScores` (method "exact"): NaN where no edge was patched.
  """
  g = graph(config)
  mask = _edge_mask(g, edges)
  src, dst, targets = checked_pair(config, clean, corrupted, targets, "denoise", params, metric)
  values = np.full(mask.shape, np.nan)
  s, r = np.nonzero(mask)
  clean_m, corr_m = metric_baselines(params, config, src, dst, targets, metric)
  if s.size:
    inputs = _edge_inputs(params, config, src, dst)
    block = np.minimum(r // (3 * config.num_attention_heads + 1), config.depth)
    for start in np.unique(block):  # the receiver's block: the ones before it run clean
      e = block == start
      got = _patch_edges(
        params,
        config,
        src,
        targets,
        inputs,
        jnp.asarray(s[e]),
        jnp.asarray(r[e]),
        jnp.asarray(weight),
        metric=metric,
        start=int(start),
        chunk=chunk_size,
      )
      values[s[e], r[e]] = np.asarray(got, np.float64) - clean_m
  return EdgeScores(g, values, clean_m, corr_m, "exact")


@functools.partial(jax.jit, static_argnames=("config", "metric", "per_row"))
def _baseline_metrics(params, config, clean, corrupted, targets, *, metric, per_row):
  out = []
  for batch in (clean, corrupted):
    b = {**batch, **targets}
    _, run = sweep_forward(params, config, batch, final_rows=metric_rows(metric, config, b))
    value = row_values if per_row else functools.partial(metric_of, row_weight=None)
    out.append(value(params, config, metric, run.last, b))
  return out


def metric_baselines(params, config, clean, corrupted, targets, metric, *, per_row=False):
  """The metric on the clean and on the corrupted batch (each with `targets`), as floats;
  with `per_row`, each row's value (`patching.row_values`) as float64 `(B,)` arrays."""
  c, x = _baseline_metrics(
    params, config, clean, corrupted, targets, metric=metric, per_row=per_row
  )
  if per_row:
    return np.asarray(c, np.float64), np.asarray(x, np.float64)
  return float(c), float(x)
