"""Causal variables: interchange interventions on subspaces, DAS and its variants, steering.

An interchange intervention (Geiger et al. 2021) runs a *base* input with part of one
site's activation replaced by its value on a *source* input; if a causal variable of a
high-level model lives there, the base run's output becomes what the high-level model
predicts with the variable set to the source's value (the *counterfactual label*). The part
is a subspace: `bertjax.Intervention(subspace={site: (source, basis, weight)})` moves the
coordinates of the site on the rows of `basis` (k, D) to the source's, at the layers and
positions `weight` selects, and leaves the rest. Here:

* `CounterfactualPairs`: base and source batches of one shape, the positions to interchange,
  the position whose answer is read, the candidate answers (shared, or each pair's own) and
  each pair's counterfactual label (an index into the candidates); `for_patching` gives the
  same pairs to the circuit tools (base clean, source corrupted).
* `interchange_logits`: the candidates' logits of the intervened base run (the source's site
  captured in one pass, the base run with the interchange in another); `iia`: the
  interchange-intervention accuracy, the share of pairs whose intervened prediction is the
  counterfactual label.
* `train_subspace`: the subspace learned by gradient on training pairs with bertjax's own
  interchange, cross-entropy of the counterfactual label: "das" (distributed alignment
  search, Geiger et al. 2024: the first k rows of a learned rotation, parametrised as the
  orthonormal factor of a free (D, k) matrix), "boundless" (Wu et al. 2023: a full rotation
  and a learned soft boundary `sigmoid((b - i) / t)` over its rows, the temperature annealed,
  the boundary's size penalised), "dbm" (a learned mask over a given basis, the standard one
  or a PCA's: MIB's desiderata-based masking, with an L1 penalty on the mask).
* `layer_search`: `train_subspace` at every layer, scored by IIA on held-out pairs: each
  layer trained from its block's input (a program per layer, only the blocks after it run),
  or with `truncate=False` every layer in one compiled program (the layers vmapped).
* `answers`: the model's own answers on the base and source runs (to keep the pairs it
  gets right).
* `pca_basis`: the top principal directions of a site's activations (a baseline basis).
* `steer`: add `strength * direction` to one site at one layer and positions, as a sweep
  over strengths, and read the candidates' logits.
* The readout: the MLM head's logits over the candidates at the target position, or, for a
  model without one, a linear probe on the pooled final states (`with_probe`).

Everything is one jitted program per shape; the frozen model's parameters are arguments.
`bertjax.analysis.causal.sae_features` interchanges a sparse autoencoder's features instead.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax.model.config import BertConfig
from bertjax.model.forward import forward, run_layers
from bertjax.model.heads import mlm_logits
from bertjax.model.intervention import Intervention
from bertjax.model.sites import SITES, site_shape

Params = dict[str, Any]
METHODS = ("das", "boundless", "dbm")


@dataclasses.dataclass(frozen=True)
class CounterfactualPairs:
  """Base and source inputs with their counterfactual labels.

  Attributes:
    base_ids, source_ids: int (B, T), padded alike (`attention_mask` is both inputs').
    attention_mask: int (B, T).
    positions: int (B, P): the token positions whose site is interchanged (the same in
      base and source: the pairs are aligned), P >= 1.
    target: int (B,): the position whose masked-token prediction is read.
    candidates: int (C,): the token ids the answer is chosen among, the same for every pair;
      or (B, C): each pair's own (names in an indirect-object task, antonyms in negation).
    label: int (B,): each pair's counterfactual answer, an index into its candidates.
  """

  base_ids: np.ndarray
  source_ids: np.ndarray
  attention_mask: np.ndarray
  positions: np.ndarray
  target: np.ndarray
  candidates: np.ndarray
  label: np.ndarray

  def __post_init__(self):
    b, t = np.shape(self.base_ids)
    for name, want in (
      ("source_ids", (b, t)),
      ("attention_mask", (b, t)),
      ("target", (b,)),
      ("label", (b,)),
    ):
      if np.shape(getattr(self, name)) != want:
        raise ValueError(f"{name} shape {np.shape(getattr(self, name))} must be {want}")
    pos = np.asarray(self.positions)
    if pos.ndim != 2 or pos.shape[0] != b or (pos < 0).any() or (pos >= t).any():
      raise ValueError(
        f"positions shape {pos.shape} must be (B, P)=({b}, P) with values in [0, {t})"
      )
    c = np.shape(self.candidates)
    if len(c) not in (1, 2) or (len(c) == 2 and c[0] != b):
      raise ValueError(f"candidates shape {c} must be (C,) or (B, C)=({b}, C)")
    label = np.asarray(self.label)
    if (label < 0).any() or (label >= c[-1]).any():
      raise ValueError(f"label values must index candidates {c}; got {np.unique(label)}")

  def take(self, rows) -> CounterfactualPairs:
    """The pairs at `rows` (a train / held-out split)."""
    rows = np.asarray(rows)
    pick = lambda a: np.asarray(a)[rows]
    return dataclasses.replace(
      self,
      base_ids=pick(self.base_ids),
      source_ids=pick(self.source_ids),
      attention_mask=pick(self.attention_mask),
      positions=pick(self.positions),
      target=pick(self.target),
      candidates=pick(self.candidates) if np.ndim(self.candidates) == 2 else self.candidates,
      label=pick(self.label),
    )

  def token_ids(self, index) -> np.ndarray:
    """int (B,): each pair's candidate token at `index` (B,) (labels are indices)."""
    c, index = np.asarray(self.candidates), np.asarray(index)
    return c[np.arange(len(index)), index] if c.ndim == 2 else c[index]

  def for_patching(self, base_label) -> tuple[dict, dict, dict]:
    """`(clean, corrupted, targets)` for the patching and edge tools
    (`bertjax.analysis.interventions`: `edges.edge_attribution`, `circuits.mib_curve`, ...)
    with `metrics.LogitDiff("mlm")`: the base sentences clean, the source sentences
    corrupted, the answer the base's own (`base_label` (B,)), the distractor the source's
    (the counterfactual label), read at the target position."""
    base_label = np.asarray(base_label)
    if base_label.shape != np.shape(self.label):
      raise ValueError(f"base_label shape {base_label.shape} must be {np.shape(self.label)}")
    mask = np.asarray(self.attention_mask)
    targets = {
      "answer": self.token_ids(base_label),
      "distractor": self.token_ids(self.label),
      "position": np.asarray(self.target),
    }
    clean = {"input_ids": np.asarray(self.base_ids), "attention_mask": mask}
    return clean, {"input_ids": np.asarray(self.source_ids), "attention_mask": mask}, targets


def position_weight(config: BertConfig, site: str, layer, positions, seq_len: int, k: int):
  """The interchange weight (depth, B, T, [heads,] k): 1 at `layer` (an int, or a traced
  index) and each pair's `positions` (B, P), 0 elsewhere."""
  shape = site_shape(config, site, len(positions), seq_len)
  at = jnp.zeros(shape[1:3], jnp.float32)  # (B, T)
  rows = jnp.arange(len(positions))[:, None]
  at = at.at[rows, jnp.asarray(positions)].set(1.0)
  layers = (jnp.arange(config.depth) == layer).astype(jnp.float32)
  w = layers[:, None, None] * at[None]  # (depth, B, T)
  w = w.reshape(w.shape + (1,) * (len(shape) - 4))  # (depth, B, T[, 1]): a head axis broadcasts
  return jnp.broadcast_to(w[..., None], w.shape + (k,))


def with_probe(params: Params, weight, bias) -> Params:
  """`params` with a linear probe (weight (H, C), bias (C,)) as the readout: the pairs'
  labels then index its C classes (give `candidates=np.arange(C)`), read from the masked
  mean of the final states (a sentence encoder's pooled embedding) instead of an MLM head."""
  weight, bias = np.asarray(weight, np.float32), np.asarray(bias, np.float32)
  if weight.ndim != 2 or bias.shape != weight.shape[1:]:
    raise ValueError(f"probe weight {weight.shape} and bias {bias.shape} must be (H, C), (C,)")
  return {**params, "probe": {"weight": weight, "bias": bias}}


def _readout(params, config, last, pairs_target, candidates, mask=None):
  # (B, C): the probe's logits on the pooled final states `last` (B, T, H) when params hold
  # one, else the candidates' MLM logits at each row's target position.
  if "probe" in params:
    h, p = last, params["probe"]
    m = jnp.asarray(mask, h.dtype)[..., None]
    pooled = (h * m).sum(1) / jnp.maximum(m.sum(1), 1)
    return pooled @ p["weight"] + p["bias"]
  rows = jnp.arange(last.shape[0])
  h = last[rows, jnp.asarray(pairs_target)]  # (B, H)
  logits = mlm_logits(params, config, h[:, None])[:, 0]  # (B, V)
  candidates = jnp.asarray(candidates)
  if candidates.ndim == 2:  # each pair's own candidates
    return jnp.take_along_axis(logits, candidates, axis=1)
  return logits[:, candidates]


def _check(params, config: BertConfig, site: str):
  if site not in SITES or site == "embeddings":
    raise ValueError(f"site {site!r} must be a block site; expected one of {tuple(SITES)[1:]}")
  if "mlm" not in params and "probe" not in params:
    raise ValueError(
      "the counterfactual label is read from the MLM head or a probe: params have no 'mlm' "
      "(bertjax.training.mlm_head fits one) and no 'probe' (with_probe adds one)"
    )


@functools.partial(jax.jit, static_argnames=("config", "site"))
def _source(params, config, pairs_src, mask, *, site):
  return forward(params, config, pairs_src, mask, capture=(site,)).cache[site]


@functools.partial(jax.jit, static_argnames=("config", "site"))
def _intervened(params, config, base, mask, source, basis, weight, target, candidates, *, site):
  iv = Intervention(subspace={site: (source, basis, weight)})
  out = forward(params, config, base, mask, intervention=iv)
  return _readout(params, config, out.last_hidden_state, target, candidates, mask)


def interchange_logits(params, config, pairs: CounterfactualPairs, site: str, basis, weight):
  """The candidates' logits (B, C) of the base runs with `site`'s coordinates on `basis`
  (k, D) interchanged from the source runs by `weight` (broadcasting to the site's stacked
  shape with k last; `position_weight` builds the usual one)."""
  _check(params, config, site)
  src = _source(params, config, pairs.source_ids, pairs.attention_mask, site=site)
  return _intervened(
    params,
    config,
    pairs.base_ids,
    pairs.attention_mask,
    src,
    jnp.asarray(basis, jnp.float32),
    jnp.asarray(weight, jnp.float32),
    pairs.target,
    pairs.candidates,
    site=site,
  )


@functools.partial(jax.jit, static_argnames=("config",))
def _plain(params, config, ids, mask, target, candidates):
  out = forward(params, config, ids, mask)
  return _readout(params, config, out.last_hidden_state, target, candidates, mask)


def answers(params: Params, config: BertConfig, pairs: CounterfactualPairs):
  """The model's own answers, without intervention: int (B,) indices into each pair's
  candidates for the base runs and for the source runs. An analysis of a variable keeps the
  pairs the model answers right on both (as MIB does), else a failed interchange and a
  model that cannot do the task look alike."""
  _check(params, config, "out")  # a readout is there
  got = [
    np.asarray(_plain(params, config, ids, pairs.attention_mask, pairs.target, pairs.candidates))
    for ids in (pairs.base_ids, pairs.source_ids)
  ]
  return got[0].argmax(-1), got[1].argmax(-1)


def iia(logits, label) -> float:
  """Interchange-intervention accuracy: the share of rows whose argmax is `label`."""
  return float(np.mean(np.argmax(np.asarray(logits), -1) == np.asarray(label)))


def orthonormal_rows(raw) -> jax.Array:
  """(k, D) orthonormal rows spanning the columns of `raw` (D, k): its QR factor Q, as rows."""
  q, _ = jnp.linalg.qr(raw)
  return q.T


@dataclasses.dataclass(frozen=True)
class SubspaceFit:
  """A learned subspace: `basis` (k, D) and the per-row `mask` (k,) in [0, 1] the
  interchange applies (ones for "das"), the training `losses`, and the IIA on held-out pairs
  (`heldout_iia`, None when none were given)."""

  method: str
  layer: int
  basis: np.ndarray
  mask: np.ndarray
  losses: np.ndarray
  heldout_iia: float | None


def _mask(method, theta, step, steps, k):
  # The per-row interchange mask and the penalty it adds to the loss.
  if method == "das":
    return jnp.ones((k,), jnp.float32), 0.0
  # Temperature annealed from 1 to 0.01 (Wu et al. 2023; MIB's DBM does the same).
  temp = jnp.exp(jnp.log(1.0) + (jnp.log(0.01) - jnp.log(1.0)) * step / max(steps - 1, 1))
  if method == "boundless":
    b = theta["boundary"]
    mask = jax.nn.sigmoid((b - jnp.arange(k)) / temp)
    return mask, jnp.abs(b) / k
  mask = jax.nn.sigmoid(theta["logits"] / temp)
  return mask, mask.mean()


def _init(method, key, dim, k, basis):
  # The free matrix's columns start at unit length: Adam's steps are of size `lr` per
  # coordinate whatever the scale, so entries of N(0, 1) would turn the rotation sqrt(dim)
  # times slower (MiniLM's DAS then still learns at 100 steps; here it settles by 30).
  if method == "das":
    return {"raw": jax.random.normal(key, (dim, k)) / np.sqrt(dim)}
  if method == "boundless":
    raw = jax.random.normal(key, (dim, dim)) / np.sqrt(dim)
    return {"raw": raw, "boundary": jnp.asarray(k / 2.0)}
  return {"logits": jnp.zeros((np.shape(basis)[0],))}


def _basis(method, theta, fixed):
  return fixed if method == "dbm" else orthonormal_rows(theta["raw"])


@functools.partial(
  jax.jit, static_argnames=("config", "site", "method", "steps", "lr", "penalty", "start")
)
def _train(
  params,
  config,
  base,
  mask,
  src,
  positions,
  target,
  candidates,
  label,
  fixed,
  key,
  layer,
  *,
  site,
  method,
  steps,
  lr,
  penalty,
  start=None,
):
  # `base`: the base ids (B, T), or with `start` the base run's input to block `start` (B, T,
  # H), `layer` then being `start`.
  dim = site_shape(config, site, 1, 1)[-1]
  theta = _init(method, key, dim, fixed.shape[0], fixed)  # fixed: (k, D), only its shape for DAS
  opt = optax.adam(lr)
  seq = base.shape[1]

  def loss_fn(theta, step):
    basis = _basis(method, theta, fixed)
    row_mask, extra = _mask(method, theta, step, steps, basis.shape[0])
    weight = position_weight(config, site, layer, positions, seq, basis.shape[0]) * row_mask
    iv = Intervention(subspace={site: (src, basis, weight)})
    if start is None:
      last = forward(params, config, base, mask, intervention=iv).last_hidden_state
    else:  # from block `start`'s input: the blocks before it cannot see the interchange
      last = _final_states(params, config, base, mask, target, start, intervention=iv)
    logits = _readout(params, config, last, target, candidates, mask)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, label).mean()
    return ce + penalty * extra

  def step(carry, i):
    theta, state = carry
    loss, grads = jax.value_and_grad(loss_fn)(theta, i)
    updates, state = opt.update(grads, state, theta)
    return (optax.apply_updates(theta, updates), state), loss

  (theta, _), losses = jax.lax.scan(step, (theta, opt.init(theta)), jnp.arange(steps))
  basis = _basis(method, theta, fixed)
  row_mask, _ = _mask(method, theta, steps - 1, steps, basis.shape[0])
  return basis, row_mask, losses


def _final_states(params, config, hidden, mask, target, start, *, full_last=False, **run):
  """The final states of a base run from block `start`'s input `hidden` (B, T, H), the blocks
  unrolled (`run_layers`, with `run`'s intervention or patch): the last block computes only
  each pair's read row (`target`), unless a probe reads every row or `full_last` (a patch of
  (B, T) rows applied at that block)."""
  cut = "probe" not in params and not (full_last and start == config.depth - 1)
  rows = jnp.asarray(target)[:, None] if cut else None
  return run_layers(
    params, config, hidden, mask, start=start, final_rows=rows, unroll=True, **run
  ).last


def _fixed_basis(method, k, basis, dim):
  if method == "dbm":
    if basis is None:
      raise ValueError('method="dbm" learns a mask over a given basis: pass basis= (m, D)')
    return jnp.asarray(basis, jnp.float32)
  if method == "das" and not 1 <= k <= dim:
    raise ValueError(f"k={k} must be in [1, {dim}] (the site's width)")
  return jnp.zeros((k if method == "das" else dim, dim), jnp.float32)  # only its shape is read


@functools.partial(jax.jit, static_argnames=("config",))
def _block_inputs(params, config, ids, mask):
  # (depth + 1, B, T, H): the embeddings, then every block's output (block l's input at l).
  return forward(params, config, ids, mask, output_hidden_states=True).hidden_states


def _trainer(params, config, pairs, site, *, method, k, basis, steps, lr, penalty, truncate):
  """The checks both entry points make, then `fit(key, layer) -> (basis, mask, losses)` on
  `pairs` (the source's site captured once). Vmappable over keys and layers; with `truncate`,
  `layer` is an int and the fit runs from that block's input (the base run's, computed once):
  a program per layer, each running only the blocks the interchange reaches."""
  _check(params, config, site)
  if method not in METHODS:
    raise ValueError(f"method={method!r} must be one of {METHODS}")
  fixed = _fixed_basis(method, k, basis, site_shape(config, site, 1, 1)[-1])
  src = _source(params, config, pairs.source_ids, pairs.attention_mask, site=site)
  inputs = _block_inputs(params, config, pairs.base_ids, pairs.attention_mask) if truncate else None

  def fit(key, layer):
    return _train(
      params,
      config,
      pairs.base_ids if inputs is None else inputs[layer],
      pairs.attention_mask,
      src,
      pairs.positions,
      pairs.target,
      pairs.candidates,
      pairs.label,
      fixed,
      key,
      layer,
      site=site,
      method=method,
      steps=steps,
      lr=lr,
      penalty=penalty,
      start=None if inputs is None else int(layer),
    )

  return fit


def train_subspace(
  params: Params,
  config: BertConfig,
  pairs: CounterfactualPairs,
  site: str,
  layer: int,
  *,
  method: str = "das",
  k: int = 1,
  basis=None,
  steps: int = 200,
  lr: float = 1e-2,
  penalty: float = 1e-2,
  seed: int = 0,
  heldout: CounterfactualPairs | None = None,
  truncate: bool = True,
) -> SubspaceFit:
  """Learns where a causal variable lives at one site and layer (see the module docstring).

  Args:
    params, config: a model with an MLM head.
    pairs: training pairs; `heldout`: pairs to score the fit on (IIA).
    site: a block site (the residual stream `out`, `attn_out`, `head_out`, ...).
    layer: the block, in [0, depth).
    method: "das", "boundless" or "dbm".
    k: the subspace's size for "das".
    basis: (m, D) rows for "dbm" (e.g. `np.eye(D)` or `pca_basis`).
    steps, lr: full-batch Adam steps and rate; penalty: the weight of the boundary's or
      mask's size in the loss ("boundless", "dbm").
    seed: the initial rotation's key.
    truncate: train from block `layer`'s input (the base run's), running only the blocks
      the interchange reaches; False: the whole forward each step (the same fit to float32
      rounding).

  Returns:
    A `SubspaceFit`.
  """
  if not 0 <= layer < config.depth:
    raise ValueError(f"layer={layer} must be in [0, {config.depth})")
  fit = _trainer(
    params,
    config,
    pairs,
    site,
    method=method,
    k=k,
    basis=basis,
    steps=steps,
    lr=lr,
    penalty=penalty,
    truncate=truncate,
  )
  got_basis, mask, losses = fit(jax.random.key(seed), layer)
  score = None
  if heldout is not None:
    w = position_weight(
      config, site, layer, heldout.positions, heldout.base_ids.shape[1], len(mask)
    )
    score = iia(
      interchange_logits(params, config, heldout, site, got_basis, w * mask), heldout.label
    )
  return SubspaceFit(
    method, layer, np.asarray(got_basis), np.asarray(mask), np.asarray(losses), score
  )


def layer_search(
  params: Params,
  config: BertConfig,
  pairs: CounterfactualPairs,
  heldout: CounterfactualPairs,
  site: str,
  *,
  method: str = "das",
  k: int = 1,
  basis=None,
  steps: int = 200,
  lr: float = 1e-2,
  penalty: float = 1e-2,
  seed: int = 0,
  truncate: bool = True,
) -> list[SubspaceFit]:
  """`train_subspace` at every layer, each fit scored by IIA on `heldout`. Returns one
  `SubspaceFit` per layer.

  By default each layer trains from its block's input (the base run's), a program per layer
  that runs only the blocks the interchange reaches: about (depth + 1) / (2 depth) of the
  work, and `depth` compilations. `truncate=False` trains every layer in one program (the
  layers vmapped, each running the whole model): the same fits to float32 rounding, one
  compilation, about 1.8x the time a step on all-MiniLM-L6-v2 (`docs/manual.md`)."""
  fit = _trainer(
    params,
    config,
    pairs,
    site,
    method=method,
    k=k,
    basis=basis,
    steps=steps,
    lr=lr,
    penalty=penalty,
    truncate=truncate,
  )
  keys = jax.random.split(jax.random.key(seed), config.depth)
  if truncate:
    each = [fit(key, layer) for layer, key in enumerate(keys)]
    bases, masks, losses = (jnp.stack(parts) for parts in zip(*each))
  else:
    bases, masks, losses = jax.vmap(fit)(keys, jnp.arange(config.depth))
  hsrc = _source(params, config, heldout.source_ids, heldout.attention_mask, site=site)
  seq = heldout.base_ids.shape[1]
  logits = jax.vmap(
    lambda layer, b, m: _intervened(
      params,
      config,
      heldout.base_ids,
      heldout.attention_mask,
      hsrc,
      b,
      position_weight(config, site, layer, heldout.positions, seq, b.shape[0]) * m,
      heldout.target,
      heldout.candidates,
      site=site,
    )
  )(jnp.arange(config.depth), bases, masks)
  return [
    SubspaceFit(
      method,
      layer,
      np.asarray(bases[layer]),
      np.asarray(masks[layer]),
      np.asarray(losses[layer]),
      iia(logits[layer], heldout.label),
    )
    for layer in range(config.depth)
  ]


def pca_basis(params, config, pairs: CounterfactualPairs, site: str, layer: int, k: int):
  """(k, D): the top-k principal directions of `site` at `layer` over the pairs' base and
  source runs at their interchanged positions (centred; a baseline basis for "dbm" and for
  interchange with weight 1)."""
  _check(params, config, site)
  rows = []
  for ids in (pairs.base_ids, pairs.source_ids):
    acts = np.asarray(_source(params, config, ids, pairs.attention_mask, site=site))[layer]
    at = acts[np.arange(len(ids))[:, None], np.asarray(pairs.positions)]  # (B, P, ..., D)
    rows.append(at.reshape(-1, acts.shape[-1]))
  x = np.concatenate(rows).astype(np.float64)
  x -= x.mean(0)
  _, _, vt = np.linalg.svd(x, full_matrices=False)
  if not 1 <= k <= vt.shape[0]:
    raise ValueError(f"k={k} must be in [1, {vt.shape[0]}]")
  return vt[:k].astype(np.float32)


def steer(
  params: Params,
  config: BertConfig,
  pairs: CounterfactualPairs,
  site: str,
  layer: int,
  direction,
  strengths: Sequence[float],
):
  """The candidates' logits (S, B, C) of the base runs with `strength * direction` added to
  `site` at `layer` and each pair's positions, for each strength: the site's own value plus
  the step, as a one-row interchange whose source is the unsteered value moved along the
  unit direction (exact at one layer, whose value the steering cannot reach back to)."""
  _check(params, config, site)
  if not 0 <= layer < config.depth:
    raise ValueError(f"layer={layer} must be in [0, {config.depth})")
  direction = jnp.asarray(direction, jnp.float32)
  dim = site_shape(config, site, 1, 1)[-1]
  if direction.shape != (dim,) or not float(jnp.linalg.norm(direction)) > 0:
    raise ValueError(f"direction shape {direction.shape} must be ({dim},) and nonzero")
  norm = jnp.linalg.norm(direction)
  unit = (direction / norm)[None]  # (1, D)
  own = _source(params, config, pairs.base_ids, pairs.attention_mask, site=site)
  w = position_weight(config, site, layer, pairs.positions, pairs.base_ids.shape[1], 1)
  return jax.vmap(
    lambda s: _intervened(
      params,
      config,
      pairs.base_ids,
      pairs.attention_mask,
      own + s * norm * unit[0],
      unit,
      w,
      pairs.target,
      pairs.candidates,
      site=site,
    )
  )(jnp.asarray(strengths, jnp.float32))
