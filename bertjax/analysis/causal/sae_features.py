"""Interchange interventions on a sparse autoencoder's features (MIB's SAE baseline).

A top-k SAE (`bertjax.analysis.representations.sae`) reads a site as latents z(h); an
interchange on a set of its features moves the base run's latents on that set to the source
run's and decodes the difference, keeping the base's reconstruction error:

  h' = h + W_dec^T (m * (z(s) - z(h)))

at one layer and each pair's positions, with m (m,) in [0, 1] over the latents. Here:

* `sae_interchange_logits`: the candidates' logits of the base runs with that interchange
  for a given mask (by default every latent).
* `train_sae_mask`: the mask learned by gradient on training pairs as DBM learns one over a
  basis (`interchange.train_subspace(method="dbm")`: sigmoid logits, the temperature annealed
  from 1 to 0.01, an L1 penalty on the mask's mean), scored by IIA on held-out pairs.

Unlike a subspace of a basis, the latents are a nonlinear function of the site (top-k, ReLU),
so a feature set that carries the variable in one run may be inactive in another.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax.analysis.causal.interchange import (
  CounterfactualPairs,
  Params,
  SubspaceFit,
  _block_inputs,
  _check,
  _final_states,
  _readout,
  _source,
  iia,
)
from bertjax.analysis.representations import sae as sae_lib
from bertjax.model.config import BertConfig
from bertjax.model.forward import forward
from bertjax.model.sites import site_shape


def _latents(sae: Params, x, k: int):
  # Dense (..., m) top-k latents of x (..., d).
  flat = x.reshape(-1, x.shape[-1]).astype(jnp.float32)
  dense = sae_lib.dense_latents(*sae_lib.encode(sae, flat, k), sae["W_dec"].shape[0])
  return dense.reshape(x.shape[:-1] + dense.shape[-1:])


def _patch(sae, k, layer, at, z_source, mask):
  # A function patch of the site: at block `layer`, the features' move at the rows `at`
  # (B, T) marks.
  def edit(value):
    v = value.astype(jnp.float32)
    delta = ((z_source - _latents(sae, v, k)) * mask) @ sae["W_dec"]
    return (v + at[..., None] * delta).astype(value.dtype)

  def apply(value, block):
    if isinstance(block, int) and isinstance(layer, int):  # unrolled blocks: known here
      return edit(value) if block == layer else value
    return jax.lax.cond(block == layer, edit, lambda v: v, value)

  return apply


def _positions(pairs: CounterfactualPairs):
  b, t = np.shape(pairs.base_ids)
  at = np.zeros((b, t), np.float32)
  at[np.arange(b)[:, None], np.asarray(pairs.positions)] = 1.0
  return jnp.asarray(at)


@functools.partial(jax.jit, static_argnames=("config", "site", "k"))
def _logits(
  params, config, base, mask, sae, z_source, at, layer, latent_mask, target, cands, *, site, k
):
  patch = {site: _patch(sae, k, layer, at, z_source, latent_mask)}
  out = forward(params, config, base, mask, patch=patch)
  return _readout(params, config, out.last_hidden_state, target, cands, mask)


def _prepare(params, config, pairs, site, layer, sae, k):
  _check(params, config, site)
  if not 0 <= layer < config.depth:
    raise ValueError(f"layer={layer} must be in [0, {config.depth})")
  shape = site_shape(config, site, 1, 1)
  if len(shape) != 4 or shape[-1] != np.shape(sae["W_enc"])[0]:
    raise ValueError(
      f"site {site!r} has shape {shape} (depth, B, T, D); the SAE reads {np.shape(sae['W_enc'])[0]} "
      "wide vectors: a whole-width site (out, attn_out, ffn_out, ...) of that width is needed"
    )
  if not 1 <= k <= np.shape(sae["W_dec"])[0]:
    raise ValueError(f"k={k} must be in [1, {np.shape(sae['W_dec'])[0]}] (the SAE's latents)")
  sae = {name: jnp.asarray(v, jnp.float32) for name, v in sae.items()}
  src = _source(params, config, pairs.source_ids, pairs.attention_mask, site=site)[layer]
  return sae, _latents(sae, src, k), _positions(pairs)


def sae_interchange_logits(
  params: Params,
  config: BertConfig,
  pairs: CounterfactualPairs,
  site: str,
  layer: int,
  sae: Params,
  k: int,
  mask=None,
):
  """The candidates' logits (B, C) of the base runs with the SAE's latents (`mask` (m,), 1
  where a latent moves; None: every latent) at `site`, `layer` and the pairs' positions
  interchanged from the source runs (see the module docstring). `sae`: a top-k SAE's
  parameters (`sae.train`), `k` its number of kept latents."""
  sae, z_source, at = _prepare(params, config, pairs, site, layer, sae, k)
  m = sae["W_dec"].shape[0]
  mask = jnp.ones((m,), jnp.float32) if mask is None else jnp.asarray(mask, jnp.float32)
  if mask.shape != (m,):
    raise ValueError(f"mask shape {mask.shape} must be ({m},), one weight per latent")
  return _logits(
    params,
    config,
    pairs.base_ids,
    pairs.attention_mask,
    sae,
    z_source,
    at,
    layer,
    mask,
    pairs.target,
    pairs.candidates,
    site=site,
    k=k,
  )


@functools.partial(
  jax.jit, static_argnames=("config", "site", "k", "steps", "lr", "penalty", "start")
)
def _train(
  params, config, pairs_arrays, sae, z_source, at, layer, *, site, k, steps, lr, penalty, start
):
  # `base`: the base ids (B, T), or with `start` the base run's input to block `start` (B, T,
  # H), `layer` then being `start`.
  base, mask, target, cands, label = pairs_arrays
  layer = layer if start is None else start
  opt = optax.adam(lr)

  def latent_mask(theta, step):
    temp = jnp.exp(jnp.log(0.01) * step / max(steps - 1, 1))  # 1 -> 0.01
    return jax.nn.sigmoid(theta / temp)

  def loss_fn(theta, step):
    lm = latent_mask(theta, step)
    patch = {site: _patch(sae, k, layer, at, z_source, lm)}
    if start is None:
      last = forward(params, config, base, mask, patch=patch).last_hidden_state
    else:  # from block `start`'s input: the blocks before it cannot see the interchange
      last = _final_states(params, config, base, mask, target, start, full_last=True, patch=patch)
    logits = _readout(params, config, last, target, cands, mask)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, label).mean()
    return ce + penalty * lm.mean()

  def step(carry, i):
    theta, state = carry
    loss, grads = jax.value_and_grad(loss_fn)(theta, i)
    updates, state = opt.update(grads, state, theta)
    return (optax.apply_updates(theta, updates), state), loss

  theta = jnp.zeros((sae["W_dec"].shape[0],), jnp.float32)
  (theta, _), losses = jax.lax.scan(step, (theta, opt.init(theta)), jnp.arange(steps))
  return latent_mask(theta, steps - 1), losses


def train_sae_mask(
  params: Params,
  config: BertConfig,
  pairs: CounterfactualPairs,
  site: str,
  layer: int,
  sae: Params,
  k: int,
  *,
  steps: int = 200,
  lr: float = 1e-2,
  penalty: float = 1e-2,
  heldout: CounterfactualPairs | None = None,
  truncate: bool = True,
) -> SubspaceFit:
  """Learns which of the SAE's latents carry the variable (see the module docstring).
  `truncate`: train from block `layer`'s input (the base run's), running only the blocks the
  interchange reaches; False: the whole forward each step (the same fit to float32 rounding).

  Returns:
    A `SubspaceFit` with method "sae", `basis` the SAE's decoder rows (m, D), `mask` the
    learned weight per latent, the training losses, and the IIA on `heldout` (None without).
  """
  sae_j, z_source, at = _prepare(params, config, pairs, site, layer, sae, k)
  base = pairs.base_ids
  if truncate:  # the base run's input to block `layer`: only the blocks after it train
    base = _block_inputs(params, config, pairs.base_ids, pairs.attention_mask)[layer]
  arrays = (base, pairs.attention_mask, pairs.target, pairs.candidates, pairs.label)
  mask, losses = _train(
    params,
    config,
    arrays,
    sae_j,
    z_source,
    at,
    layer,
    site=site,
    k=k,
    steps=steps,
    lr=lr,
    penalty=penalty,
    start=int(layer) if truncate else None,
  )
  score = None
  if heldout is not None:
    logits = sae_interchange_logits(params, config, heldout, site, layer, sae, k, mask)
    score = iia(logits, heldout.label)
  return SubspaceFit(
    "sae", layer, np.asarray(sae["W_dec"]), np.asarray(mask), np.asarray(losses), score
  )
