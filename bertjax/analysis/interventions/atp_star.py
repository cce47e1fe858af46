"""AtP*: attribution patching with the query-key fix and GradDrop.

Kramar, Lieberum, Shah and Nanda 2024, "AtP*: An efficient and scalable method for localizing
LLM behaviour to components" (arXiv 2403.00745). Plain attribution patching
(`patching.attribution_patching`, AtP) estimates the effect of patching a node n from the
destination run's value to the source run's, `c(n) = metric(dst | do(n <- n_src)) -
metric(dst)`, by the first-order term `(n_src - n_dst) . d metric / d n` taken at the
destination run. AtP* adds two fixes; this module implements them for the (layer, head) nodes
of the head sites `q`, `k`, `v` and `head_out` (`k`, `v`: the key/value heads, fewer on a
family with grouped key/value heads), with the same pair, metric, targets and `direction`
conventions as `attribution_patching` (the paper patches in the "noise" direction; both are
offered here).

**The QK fix** (the paper's correction for attention saturation). A query or key node acts on
the metric only through its head's attention pattern; where that softmax saturates, its
gradient is near zero however large the patched change of the logits, and AtP misses the
node. AtP* therefore computes the pattern change exactly and linearises only after the
softmax. What is implemented, for the node (layer l, head h) of site `q` (or `k`), all
positions at once:

    P'  = the block-l attention probabilities with head h's queries (keys) at every position
          replaced by the source run's and everything else the destination's;
    P   = the destination's own block-l probabilities;
    c*(n) = sum_{b, heads, t, s} (P' - P)[b, head, t, s] * d metric / d probs_l[b, head, t, s]

the gradient taken at the destination run. Replacing the queries changes whole rows of
logits; replacing the keys changes columns (every query t sees the new logits q_t . k'_s for
every key s, the paper's key fix with all of the head's key positions patched together, i.e.
one node per head rather than per key position). `P'` is computed by the model's own block
(`run_layers(start=l, stop=l + 1)` with the `q`/`k` site patched, capturing `probs`), so the
logits are the family's exactly: scaling, masks, windows, rotary positions (the `q`/`k` sites
are read after rotation), position biases and DeBERTa's c2p/p2c terms (computed from the
patched q and k). For `v` and `head_out` the node lies after the softmax and the QK fix
changes nothing: the estimate is the plain AtP term `(n_src - n_dst) . d metric / d n`.
With `qk_fix=False` the `q`/`k` estimate is plain AtP too, `attribution_patching`'s value.

**GradDrop** (the paper's correction for cancellation along residual paths). For each block
d in 0..L-1 the AtP(*) estimate is recomputed with the gradient through block d's
contributions to the residual stream stopped: the sites `attn_out` and `ffn_out` of block d
are `stop_gradient`-ed in the backward pass (forward values unchanged; the skip path, and on
post-LN blocks its LayerNorms, still carries gradient). Call that estimate c_{-d}(n). Then

    c_GD(n) = 1 / (L - 1) * sum_{d=0}^{L-1} |c_{-d}(n)|

an estimate of |c(n)|, the magnitude only (the paper ranks nodes by it). For a node in block
l, c_{-d} = c for d < l, and c_{-l} = 0 (every path of a head node leaves through its own
block's `attn_out`), hence L - 1. `grad_drop=True` needs L >= 2 blocks. The backward passes
are L + 1 (without GradDrop, one); the QK fix adds one block per (layer, head) and keeps
the maps' gradients of every pass, (L + 1) x L x B x N x T x T floats.

No family is refused for its block: both fixes are written in sites every block has (`q`,
`k`, `probs`, `attn_out`, `ffn_out`) and the recomputation is the model's own. A pruned
model is refused by name (the per-head block runs need stacked layers, as `head_patching`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.analysis.interventions.metrics import Metric
from bertjax.analysis.interventions.patching import (
  checked_pair,
  clean_and_corrupted,
  metric_of,
  sweep_forward,
  sweep_weights,
)
from bertjax.model.config import BertConfig
from bertjax.model.forward import embed, run_layers
from bertjax.model.sites import site_shape

Params = dict[str, Any]
ATP_STAR_SITES = ("q", "k", "v", "head_out")
QK_SITES = ("q", "k")


@dataclasses.dataclass(frozen=True)
class AtPStarResult:
  """AtP* estimates for every (layer, head) of a head site.

  Attributes:
    site: the patched site ("q", "k", "v" or "head_out").
    axes: ("layer", "head").
    scores: float64 (layers, heads): without GradDrop the signed estimate of
      `c(n) = metric(dst | do(n <- n_src)) - metric(dst)`; with GradDrop the non-negative
      estimate `c_GD(n)` of |c(n)| (module docstring).
    by_drop: float64 (L, layers, heads) with GradDrop: `by_drop[d]` is the signed estimate with
      block d's residual contributions stop-gradiented, c_{-d}; None without GradDrop.
    clean, corrupted: the metric on the clean and corrupted runs.
    direction: "denoise" or "noise".
    qk_fix, grad_drop: which fixes were applied.
  """

  site: str
  axes: tuple[str, str]
  scores: np.ndarray
  by_drop: np.ndarray | None
  clean: float
  corrupted: float
  direction: str
  qk_fix: bool
  grad_drop: bool


def _head_sum(x):
  """(D, L, B, T, N, head_dim), a head site's per-element terms, summed per head: (D, L, N)."""
  return x.sum((2, 3, 5))


@functools.partial(jax.jit, static_argnames=("config", "site", "metric"))
def _runs(params, config, src, dst, targets, *, site, metric):
  """The source and destination runs: (source site, own site, block inputs (L, B, T, H),
  src_m, dst_m)."""
  _, src_run = sweep_forward(params, config, src, capture=(site,))
  x, dst_run = sweep_forward(params, config, dst, capture=(site,), output_hidden_states=True)
  inputs = jnp.concatenate([x[None], dst_run.hidden_states[:-1]])  # inputs[l]: block l's input
  src_m = metric_of(params, config, metric, src_run.last, {**src, **targets}, None)
  dst_m = metric_of(params, config, metric, dst_run.last, {**dst, **targets}, None)
  return src_run.cache[site], dst_run.cache[site], inputs, src_m, dst_m


@functools.partial(jax.jit, static_argnames=("config", "grad_site", "metric"))
def _gradient(params, config, dst, targets, drop, *, grad_site, metric):
  """d metric / d (an offset added to `grad_site`) at the destination run, every block (L, ...),
  with block `drop`'s `attn_out` and `ffn_out` stop-gradiented (drop = -1: none)."""
  x = embed(params, config, dst["input_ids"], dst["token_type_ids"])
  batch, seq = dst["input_ids"].shape

  def cut(value, layer):  # forward unchanged; no gradient through block `drop`'s contribution
    return jnp.where(layer == drop, jax.lax.stop_gradient(value), value)

  def f(delta):
    patch = {grad_site: lambda value, layer: value + delta[layer], "attn_out": cut, "ffn_out": cut}
    run = run_layers(params, config, x, dst["attention_mask"], patch=patch, unroll=True)
    return metric_of(params, config, metric, run.last, {**dst, **targets}, None)

  return jax.grad(f)(jnp.zeros(site_shape(config, grad_site, batch, seq), x.dtype))


@functools.partial(jax.jit, static_argnames=("config", "site"))
def _qk_fixed(params, config, inputs, mask, value, weights, grads, *, site):
  """sum (P' - P) * d metric / d probs for every patch of every block: (D, L, P).

  `weights` (P, 1, *site axes): one head each; `grads` (D, L, B, N, T, T): one per drop."""
  rows = []
  for l in range(config.depth):

    def probs(w, l=l):  # block l alone, its site mixed with the source's by w: (B, N, T, T)
      return run_layers(
        params,
        config,
        inputs[l],
        mask,
        start=l,
        stop=l + 1,
        patch={site: (value[l : l + 1], w)},
        capture=("probs",),
      ).cache["probs"][0]

    own = probs(jnp.zeros_like(weights[0]))  # the same program's unpatched maps

    def one(w, l=l, own=own):
      return jnp.einsum("bnts,dbnts->d", probs(w) - own, grads[:, l])

    rows.append(jax.lax.map(one, weights))  # (P, D)
  return jnp.moveaxis(jnp.stack(rows), -1, 0)  # (D, L, P)


def atp_star(
  params: Params,
  config: BertConfig,
  clean,
  corrupted,
  metric: Metric,
  *,
  targets: Mapping | None = None,
  site: str = "k",
  direction: str = "denoise",
  qk_fix: bool = True,
  grad_drop: bool = True,
) -> AtPStarResult:
  """AtP* estimates of patching each (layer, head) of a head site (module docstring).

  Args:
    params, config: the model (stacked layers; a pruned one is refused).
    clean, corrupted: the pair, batches of the same shape and attention mask.
    metric: `metric(params, config, out, batch) -> scalar` (`patching` module docstring).
    targets: extra (batch, ...) arrays the metric reads (`position`, `answer`, ...).
    site: "q", "k" (where the QK fix applies), "v" or "head_out".
    direction: "denoise" (the corrupted run, nodes from the clean one) or "noise".
    qk_fix: for q/k, the exact change of the attention pattern, linearised after the softmax.
    grad_drop: combine the L estimates with one block's residual contributions
      stop-gradiented, `1/(L-1) sum_d |c_{-d}|` (needs depth >= 2).

  Returns:
    An `AtPStarResult` with scores (layers, heads): signed effect estimates without
    GradDrop, magnitude estimates with it.
  """
  if site not in ATP_STAR_SITES:
    raise ValueError(
      f"site {site!r} is not one atp_star estimates; expected one of {ATP_STAR_SITES}"
    )
  if config.is_pruned:
    raise ValueError(
      f"atp_star needs stacked layers; this {config.model_type} config is "
      "pruned (the QK fix reruns single blocks of the stacked model)"
    )
  if grad_drop and config.depth < 2:
    raise ValueError(
      f"grad_drop=True averages over the L - 1 other blocks; this "
      f"{config.model_type} model has depth={config.depth}; pass grad_drop=False"
    )
  src, dst, targets = checked_pair(config, clean, corrupted, targets, direction, params, metric)
  src_value, own, inputs, src_m, dst_m = _runs(
    params, config, src, dst, targets, site=site, metric=metric
  )
  fix = qk_fix and site in QK_SITES
  grad_site = "probs" if fix else site
  drops = [-1] + (list(range(config.depth)) if grad_drop else [])
  grads = jnp.stack(
    [
      _gradient(params, config, dst, targets, jnp.int32(d), grad_site=grad_site, metric=metric)
      for d in drops
    ]
  )  # (D, L, ...)
  if fix:
    seq = dst["input_ids"].shape[1]
    weights = jnp.asarray(sweep_weights(config, site, seq, "heads", None), src_value.dtype)
    deltas = _qk_fixed(
      params, config, inputs, dst["attention_mask"], src_value, weights, grads, site=site
    )
  else:
    deltas = _head_sum(grads * (src_value - own)[None])  # (D, L, N)
  deltas = np.asarray(deltas, np.float64)
  by_drop = deltas[1:] if grad_drop else None
  scores = np.abs(by_drop).sum(0) / (config.depth - 1) if grad_drop else deltas[0]
  clean_m, corrupted_m = clean_and_corrupted(src_m, dst_m, direction)
  return AtPStarResult(
    site, ("layer", "head"), scores, by_drop, clean_m, corrupted_m, direction, qk_fix, grad_drop
  )
