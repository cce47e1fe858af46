"""Circuits from edge scores and how faithful they are: top-n and greedy circuits, pruning,
circuit evaluation (Hanna, Pezzelle & Belinkov 2024, following EAP-IG's released code).

A circuit is a (n_senders, n_receivers) bool mask over `edges.Graph`'s edges. `top_k_circuit`
and `greedy_circuit` pick one from `edges.EdgeScores` (EAP-IG's `apply_topn`,
`apply_greedy`) and `prune` keeps its connected part (`Graph.prune`); `circuit_metric` runs
the clean run with every edge outside the circuit carrying the corrupted run's activation
(`evaluate_graph`), with the post-LN edges of `bertjax.analysis.interventions.edges`' docstring, so the
full circuit is the clean run and a circuit missing one edge is that edge's exact patch
(`edges.edge_patching`; tested); `faithfulness` sweeps circuit sizes; `mib_curve` scores
edge scores as the Mechanistic Interpretability Benchmark's circuit track does (CPR, CMD).
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.analysis.interventions.edges import (
  EdgeScores,
  Graph,
  Params,
  add_at_layer,
  frozen_layer_norm,
  graph,
  layer_norm_scale,
  metric_baselines,
  stacked_weights,
)
from bertjax.analysis.interventions.metrics import Metric
from bertjax.analysis.interventions.patching import (
  checked_pair,
  metric_of,
  row_values,
  sweep_forward,
)
from bertjax.model.config import BertConfig
from bertjax.model.forward import embed, run_layers
from bertjax.model.layers import accum_dtype


def prune(g: Graph, in_circuit) -> np.ndarray:
  """A circuit made connected, as EAP-IG's `Graph.prune`: nodes without an incoming (the
  input excepted) or an outgoing edge leave, and so do edges whose ends left, until
  nothing changes. Returns the pruned (n_senders, n_receivers) bool mask."""
  edges = np.asarray(in_circuit, bool) & g.valid
  owner = g.sender_of_receiver
  nodes = np.zeros(g.n_senders, bool)
  while True:
    has_out = edges.any(1)
    has_in = np.zeros(g.n_senders, bool)
    fed = edges.any(0)
    np.logical_or.at(has_in, owner[(owner >= 0) & fed], True)
    has_in[0] = True
    new = has_out & has_in
    if np.array_equal(new, nodes):
      return edges
    nodes = new
    recv_ok = np.append(nodes[owner[:-1]], True)  # logits always present
    edges &= nodes[:, None] & recv_ok[None, :]


def top_k_circuit(scores: EdgeScores, k: int, *, absolute: bool = True) -> np.ndarray:
  """The k highest-scoring edges (EAP-IG's `apply_topn`), pruned: (n_s, n_r) bool."""
  g = scores.graph
  v = np.where(
    g.valid & ~np.isnan(scores.values),
    np.abs(scores.values) if absolute else scores.values,
    -np.inf,
  )
  if not 0 <= k <= int(np.isfinite(v).sum()):
    raise ValueError(f"{k=} must be in [0, {int(np.isfinite(v).sum())}] (the scored edges)")
  mask = np.zeros(v.shape, bool)
  mask.flat[np.argsort(-v, axis=None, kind="stable")[:k]] = True
  return prune(g, mask)


def greedy_circuit(scores: EdgeScores, k: int, *, absolute: bool = True) -> np.ndarray:
  """k edges grown from the logits (EAP-IG's `apply_greedy`): the best-scoring edge into a
  node already in the circuit joins, and then its sender's own incoming edges become
  candidates; pruned. Returns (n_s, n_r) bool."""
  g = scores.graph
  v = np.where(
    np.isnan(scores.values), -np.inf, np.abs(scores.values) if absolute else scores.values
  )
  receivers_of = {s: np.nonzero(g.sender_of_receiver == s)[0] for s in range(g.n_senders)}
  heap: list = []

  def push(r):
    for s in np.nonzero(g.valid[:, r])[0]:
      heapq.heappush(heap, (-v[s, r], int(s), int(r)))

  push(g.n_receivers - 1)
  mask = np.zeros(g.valid.shape, bool)
  nodes = np.zeros(g.n_senders, bool)
  while k > 0 and heap:
    _, s, r = heapq.heappop(heap)
    mask[s, r] = True
    k -= 1
    if not nodes[s]:
      nodes[s] = True
      for rr in receivers_of[s]:
        push(rr)
  return prune(g, mask)


@functools.partial(jax.jit, static_argnames=("config", "metric", "chunk", "per_row"))
def _circuits(params, config, clean, corrupted, targets, circuits, *, metric, chunk, per_row):
  """metric with every edge outside each circuit (C, n_s, n_r) patched: (C,), or each row's
  value (C, B) with `per_row`."""
  g = Graph(config.depth, config.num_attention_heads)
  w = stacked_weights(params, config)
  depth, n = config.depth, config.num_attention_heads
  cb = {**clean, **targets}
  mask = clean["attention_mask"]
  x_clean = embed(params, config, clean["input_ids"], clean["token_type_ids"])
  x_corr, corr = sweep_forward(params, config, corrupted, capture=("head_out", "ffn_out"))
  acc = accum_dtype(config)
  valid = jnp.asarray(g.valid, acc)
  eps = config.layer_norm_eps

  def one(circuit):
    out_w = valid * (1 - circuit.astype(acc))  # 1: the edge carries the corrupted run
    carried = jnp.zeros((g.n_senders,) + x_clean.shape, acc).at[0].set(x_corr - x_clean)
    x = x_clean
    for layer in range(depth):
      base = layer * (3 * n + 1)
      into = jnp.einsum("sbth,sr->rbth", carried, out_w[:, base : base + 3 * n])
      patch = {
        s: functools.partial(
          add_at_layer,
          layer=layer,
          rows=None,
          add=jnp.einsum("nbth,hnd->btnd", into[i * n : (i + 1) * n], w[s][layer]),
        )
        for i, s in enumerate("qkv")
      }
      first = run_layers(
        params,
        config,
        x,
        mask,
        start=layer,
        stop=layer + 1,
        patch=patch,
        capture=("head_out", "resid_mid"),
      )
      heads = jnp.einsum(
        "btnd,ndh->nbth",
        (corr.cache["head_out"][layer] - first.cache["head_out"][0]).astype(acc),
        w["o"][layer],
      )
      lo = 1 + layer * (n + 1)
      carried = carried.at[lo : lo + n].set(heads)
      carried = frozen_layer_norm(
        carried, w["gammas"][2 * layer], layer_norm_scale(first.cache["resid_mid"][0], eps)
      )
      ffn_add = jnp.einsum("sbth,s->bth", carried, out_w[:, base + 3 * n])
      patch = dict(
        patch, ffn_in=functools.partial(add_at_layer, layer=layer, rows=None, add=ffn_add)
      )
      second = run_layers(
        params,
        config,
        x,
        mask,
        start=layer,
        stop=layer + 1,
        patch=patch,
        capture=("ffn_out", "resid_out"),
      )
      carried = carried.at[lo + n].set(
        (corr.cache["ffn_out"][layer] - second.cache["ffn_out"][0]).astype(acc)
      )
      carried = frozen_layer_norm(
        carried, w["gammas"][2 * layer + 1], layer_norm_scale(second.cache["resid_out"][0], eps)
      )
      x = second.last
    last = x + jnp.einsum("sbth,s->bth", carried, out_w[:, -1]).astype(x.dtype)
    if per_row:
      return row_values(params, config, metric, last, cb)
    return metric_of(params, config, metric, last, cb, None)

  return jax.lax.map(one, circuits, batch_size=chunk)


def circuit_metric(
  params: Params,
  config: BertConfig,
  clean,
  corrupted,
  metric: Metric,
  circuits,
  *,
  targets: Mapping | None = None,
  chunk_size: int = 4,
  per_row: bool = False,
) -> np.ndarray:
  """The metric of the clean run with every edge outside each circuit carrying the
  corrupted run's activation (EAP-IG's `evaluate_graph`).

  Blocks run one at a time: each receiver's input gets the corrupted - current difference
  of every sender whose edge to it is outside the circuit, carried through the LayerNorms
  with the current run's sigmas; the full circuit gives the clean run's metric.

  Args:
    params, config, clean, corrupted, metric, targets: as `edge_attribution`.
    circuits: (n_senders, n_receivers) bool, or a stack (C, n_s, n_r) of them.
    chunk_size: circuits run at once.
    per_row: each row's value instead of the batch's (`patching.row_values`: `row_mean`
      metrics only; their mean over the rows is the metric).

  Returns:
    float64 (C,) (or a float for one circuit); with `per_row`, (C, B) (or (B,)).
  """
  g = graph(config)
  c = np.asarray(circuits, bool)
  single = c.ndim == 2
  c = c[None] if single else c
  if c.shape[1:] != g.valid.shape:
    raise ValueError(
      f"circuits shape {c.shape} must end in {g.valid.shape} (n_senders, n_receivers)"
    )
  src, dst, targets = checked_pair(config, clean, corrupted, targets, "denoise", params, metric)
  got = np.asarray(
    _circuits(
      params,
      config,
      src,
      dst,
      targets,
      jnp.asarray(c & g.valid),
      metric=metric,
      chunk=chunk_size,
      per_row=per_row,
    ),
    np.float64,
  )
  if single:
    return got[0] if per_row else float(got[0])
  return got


def faithfulness(
  params: Params,
  config: BertConfig,
  clean,
  corrupted,
  metric: Metric,
  scores: EdgeScores,
  sizes: Sequence[int],
  *,
  targets: Mapping | None = None,
  method: str = "topk",
  absolute: bool = True,
) -> dict:
  """Circuits of growing size from `scores` and how much of the model's behaviour each keeps.

  Returns:
    "sizes" (asked), "edges" (kept after pruning), "metric", "normalized" ((circuit -
    corrupted) / (clean - corrupted), EAP-IG's normalised faithfulness), "clean",
    "corrupted", "empty" (the metric with every edge corrupted: in a post-LN model this
    is not exactly the corrupted run, whose sigmas differ), "method", and "rows": for a
    `row_mean` metric each row's values ({"metric": (sizes, B), "clean", "corrupted",
    "empty": (B,)}, lists; the means above are their means over the rows), else None.
  """
  if method not in ("topk", "greedy"):
    raise ValueError(f"{method=!r} must be 'topk' or 'greedy'")
  pick = top_k_circuit if method == "topk" else greedy_circuit
  g = scores.graph
  masks = np.stack(
    [pick(scores, int(k), absolute=absolute) for k in sizes] + [np.zeros(g.valid.shape, bool)]
  )
  per_row = bool(getattr(metric, "row_mean", False))
  values = circuit_metric(
    params, config, clean, corrupted, metric, masks, targets=targets, per_row=per_row
  )
  src, dst, tg = checked_pair(config, clean, corrupted, targets, "denoise", params, metric)
  clean_m, corr_m = metric_baselines(params, config, src, dst, tg, metric, per_row=per_row)
  rows = None
  if per_row:
    rows = {
      "metric": values[:-1].tolist(),
      "clean": clean_m.tolist(),
      "corrupted": corr_m.tolist(),
      "empty": values[-1].tolist(),
    }
    values, clean_m, corr_m = values.mean(1), float(clean_m.mean()), float(corr_m.mean())
  span = clean_m - corr_m
  return {
    "sizes": [int(k) for k in sizes],
    "edges": [int(m.sum()) for m in masks[:-1]],
    "metric": values[:-1].tolist(),
    "normalized": ((values[:-1] - corr_m) / span if span else np.full(len(sizes), np.nan)).tolist(),
    "clean": clean_m,
    "corrupted": corr_m,
    "empty": float(values[-1]),
    "method": method,
    "rows": rows,
  }


# MIB's grid: the share of the graph's edges a circuit keeps (hannamw/MIB-circuit-track,
# MIB_circuit_track/evaluation.py, `evaluate_area_under_curve`).
MIB_PERCENTAGES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def mib_areas(percentages, faith) -> dict:
  """MIB's summaries of a faithfulness curve over `percentages` (P,): "cpr" (the area under
  it: circuit performance ratio, higher is better), "cmd" (the area between it and 1:
  circuit-model difference, lower is better), both by the trapezoid rule on the linear
  share axis as `evaluate_area_under_curve` computes them, and "average" (its mean).
  `faith` is (..., P): leading axes (bootstrap resamples) give arrays of each."""
  x = np.asarray(percentages, np.float64)
  f = np.asarray(faith, np.float64)
  if x.ndim != 1 or f.shape[-1:] != x.shape or len(x) < 2 or (np.diff(x) <= 0).any():
    raise ValueError(
      f"percentages {x.shape} must increase and faith {f.shape} end in the same length (>= 2)"
    )
  width = np.diff(x)
  trapezoid = lambda y: ((y[..., :-1] + y[..., 1:]) / 2 * width).sum(-1)
  return {"cpr": trapezoid(f), "cmd": trapezoid(np.abs(1.0 - f)), "average": f.mean(-1)}


def mib_faithfulness(metric, clean, empty):
  """MIB's normalised faithfulness: (circuit - empty) / (clean - empty), where "empty" is the
  circuit with no edge (every edge corrupted) and not the corrupted run. Arrays broadcast:
  `metric` (..., P) against `clean` and `empty` (...)."""
  clean, empty = np.asarray(clean, np.float64), np.asarray(empty, np.float64)
  return (np.asarray(metric, np.float64) - empty[..., None]) / (clean - empty)[..., None]


def mib_resampled(percentages, rows: Mapping, draws) -> dict:
  """`mib_areas` of a curve on resampled pairs: `rows` is a `row_mean` metric's per-pair
  values as `faithfulness` keeps them ({"metric": (P, B), "clean", "empty": (B,)}), `draws`
  int (R, n) the pairs of each resample. Returns arrays (R,) of "cpr", "cmd", "average"."""
  idx = np.asarray(draws)
  metric = np.asarray(rows["metric"], np.float64)[:, idx].mean(-1).T  # (R, P)
  clean, empty = (np.asarray(rows[k], np.float64)[idx].mean(-1) for k in ("clean", "empty"))
  return mib_areas(percentages, mib_faithfulness(metric, clean, empty))


def mib_curve(
  params: Params,
  config: BertConfig,
  clean,
  corrupted,
  metric: Metric,
  scores: EdgeScores,
  *,
  targets: Mapping | None = None,
  percentages: Sequence[float] = MIB_PERCENTAGES,
  method: str = "topk",
  absolute: bool = True,
) -> dict:
  """MIB's circuit-localisation score of `scores`: circuits keeping `int(p * edges)` of the
  graph's edges for each share p (top-n or greedy, pruned, as MIB's `apply_topn(prune=True)`),
  their faithfulness normalised against the empty circuit (`mib_faithfulness`), and the
  curve's CPR and CMD (`mib_areas`). MIB reports CPR from signed scores (`absolute=False`)
  and CMD from absolute ones.

  Returns:
    `mib_areas`' "cpr", "cmd", "average" (floats), "percentages", "sizes" (edges asked),
    "edges" (kept after pruning), "faithfulness" (P,), and "curve": `faithfulness`'s result
    (its "rows" hold each pair's values for a `row_mean` metric, what an interval resamples).
  """
  n = int(scores.graph.valid.sum())
  sizes = [int(p * n) for p in percentages]
  curve = faithfulness(
    params,
    config,
    clean,
    corrupted,
    metric,
    scores,
    sizes,
    targets=targets,
    method=method,
    absolute=absolute,
  )
  faith = mib_faithfulness(curve["metric"], curve["clean"], curve["empty"])
  areas = {k: float(v) for k, v in mib_areas(percentages, faith).items()}
  return {
    **areas,
    "percentages": [float(p) for p in percentages],
    "sizes": sizes,
    "edges": curve["edges"],
    "faithfulness": faith.tolist(),
    "curve": curve,
  }


SIZES = (5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)  # circuit sizes `discover` tries


def smallest_faithful(faith: dict, share: float = 0.8) -> int | None:
  """The fewest edges of a circuit in `faithfulness`'s result keeping `share` of the metric's
  clean - corrupted difference (None if none does)."""
  ok = [e for e, v in zip(faith["edges"], faith["normalized"]) if v >= share]
  return min(ok) if ok else None


def agreement(scores: np.ndarray, exact: np.ndarray) -> dict[str, float]:
  """Pearson and Spearman of edge `scores` against `exact` patching, over the edges both have."""
  from bertjax import stats

  ok = np.isfinite(scores) & np.isfinite(exact)
  x, y = scores[ok], exact[ok]
  return {
    "pearson": float(stats.pearson(x, y)),
    "spearman": float(stats.spearman(x, y)),
    "edges": int(ok.sum()),
  }


def discover(
  params: Params,
  config: BertConfig,
  clean,
  corrupted,
  metric: Metric,
  *,
  targets: Mapping | None = None,
  steps: int = 5,
  exact_edges: int | None = None,
  sizes: Sequence[int] = SIZES,
  methods: Sequence[str] = ("topk", "greedy"),
  faithful: float = 0.8,
  seed: int = 0,
  log=None,
) -> dict:
  """The whole circuit-discovery pipeline on one task: every edge scored by EAP and EAP-IG
  (`edges.edge_attribution`), a seeded sample of edges (`exact_edges`; None: every edge up to
  10,000, else 2,000) patched exactly (`edges.edge_patching`) and each score's agreement with
  it, circuits of growing size from the EAP-IG scores (`faithfulness`, each of `methods`), and
  the smallest top-k circuit keeping `faithful` of the metric.

  Returns:
    "graph" (`edges.Graph`), "eap", "eap_ig", "exact" (`EdgeScores`), "mask" (the edges
    patched exactly), "agreement" ({"eap", "eap_ig"}: `agreement`), "faithfulness" (method ->
    `faithfulness`'s result; sizes past the graph's edge count become the whole graph),
    "smallest" (method -> `smallest_faithful`), "circuit" (the smallest faithful top-k
    circuit's mask, or None).
  """
  from bertjax.analysis.interventions import edges as interventions_edges

  say = log or (lambda *_: None)
  run = (params, config, clean, corrupted, metric)
  g = interventions_edges.graph(config)
  total = int(g.valid.sum())
  eap = interventions_edges.edge_attribution(*run, targets=targets, method="eap")
  ig = interventions_edges.edge_attribution(*run, targets=targets, method="eap-ig", steps=steps)
  say(f"EAP and EAP-IG ({steps} steps) on {total:,} edges")
  wanted = exact_edges or (total if total <= 10_000 else 2_000)
  valid = np.argwhere(g.valid)
  chosen = valid[
    np.random.default_rng(seed).choice(len(valid), size=min(wanted, len(valid)), replace=False)
  ]
  mask = np.zeros(g.valid.shape, bool)
  mask[chosen[:, 0], chosen[:, 1]] = True
  exact = interventions_edges.edge_patching(*run, targets=targets, edges=mask)
  agree = {
    k: agreement(s.values[mask], exact.values[mask]) for k, s in (("eap", eap), ("eap_ig", ig))
  }
  say(
    f"exact patching of {int(mask.sum()):,} edges: EAP Pearson {agree['eap']['pearson']:.3f},"
    f" EAP-IG {agree['eap_ig']['pearson']:.3f}"
  )
  sizes = [k for k in sizes if k < total] + [total]
  faith = {m: faithfulness(*run, ig, sizes, targets=targets, method=m) for m in methods}
  smallest = {m: smallest_faithful(f, faithful) for m, f in faith.items()}
  circuit = None
  if "topk" in faith and smallest["topk"] is not None:
    top = faith["topk"]
    circuit = top_k_circuit(ig, top["sizes"][top["edges"].index(smallest["topk"])])
  return {
    "graph": g,
    "eap": eap,
    "eap_ig": ig,
    "exact": exact,
    "mask": mask,
    "agreement": agree,
    "faithfulness": faith,
    "smallest": smallest,
    "circuit": circuit,
  }
