"""Transcoders for an encoder's feed-forward blocks: per-layer (PLT) and cross-layer (CLT).

A transcoder stands in for the FFNs. The features of layer l read that block's FFN input
(site `ffn_in`: the attention sublayer's normed output on post-LN blocks, the normed residual
on pre-LN ones) and write to FFN outputs (site `ffn_out`, what the residual adds). A per-layer
transcoder (Dunefsky et al. 2024) writes to layer l only; a cross-layer one (Ameisen et al.
2025, "Circuit Tracing") writes to the FFN outputs of l and of every later layer, so output j
is `b_dec[j] + sum_{l <= j} z_l W_dec[l][:, j - l]`.

* encoder: `pre_l = (x_l - b_in[l]) W_enc[l] + b_enc[l]`, then `z_l = ReLU(TopK_k(pre_l))`
  (Gao et al. 2024) or `JumpReLU(pre_l) = pre_l H(pre_l - theta_l)` (Rajamanoharan et al.
  2024: `theta = exp(log_threshold)`, trained through their straight-through estimators with
  a rectangle kernel of width `bandwidth`);
* decoder: each latent's row over every layer it writes to has unit norm (as the top-k SAE of
  `bertjax.analysis.representations.sae`: the gradient's component along the row removed,
  the row renormalised after each step), so a latent's value is its size;
* loss: each layer's MSE scaled by 1 / its target's variance, averaged over layers; top-k adds
  AuxK (each layer's `auxk` largest dead pre-activations reconstruct the residual, weight
  `auxk_coef`), JumpReLU adds `l0_coef` times the expected L0 per token summed over layers;
* init: `b_in` each layer's geometric median of a sample of inputs, `b_dec` its targets'
  mean, W_enc uniform in +-1/sqrt(d), W_dec random unit rows, then W_enc scaled per layer so
  that the sample's write to its own layer matches the size of that layer's target.

`activations` captures (inputs, targets) at every real token; `train` streams them through
one jitted Adam step; `evaluate` gives per layer the fraction of variance unexplained, L0,
dead and dense latents; `save` and `load` keep a transcoder as safetensors beside its config.
The replacement model is `bertjax.analysis.circuits.replacement`'s.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
from collections.abc import Iterable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax import timing
from bertjax.analysis.batching import as_batch
from bertjax.analysis.representations.sae import dense_latents, geometric_median
from bertjax.model.config import BertConfig
from bertjax.model.forward import forward

Params = dict[str, Any]
ACTIVATIONS = ("topk", "jumprelu")
FORMAT = 1  # the saved files' version


@dataclasses.dataclass(frozen=True)
class TranscoderConfig:
  """A transcoder's shape and training constants.

  Attributes:
    d_model: the model's hidden size (FFN input and output width).
    layers: the model's depth: one set of latents per block.
    latents: latents per layer.
    cross_layer: a CLT (layer l's latents write to every layer from l on) or a PLT.
    activation: "topk" or "jumprelu".
    k: latents kept per token and layer (top-k).
    auxk, auxk_coef, dead_tokens: the AuxK term (top-k; None: none) and when a latent is dead.
    l0_coef, bandwidth, threshold: JumpReLU's sparsity weight, the straight-through
      estimators' kernel width and the initial threshold.
    lr, eps: Adam's.
  """

  d_model: int
  layers: int
  latents: int
  cross_layer: bool = False
  activation: str = "topk"
  k: int = 32
  auxk: int | None = 256
  auxk_coef: float = 1 / 32
  dead_tokens: int = 10_000_000
  l0_coef: float = 2e-3
  bandwidth: float = 1e-3
  threshold: float = 1e-3
  lr: float = 1e-4
  eps: float = 6.25e-10

  def __post_init__(self):
    for name in ("d_model", "layers", "latents", "k", "dead_tokens"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive int")
    if self.activation not in ACTIVATIONS:
      raise ValueError(f"activation={self.activation!r} must be one of {ACTIVATIONS}")
    if self.k > self.latents:
      raise ValueError(f"k={self.k} must be at most latents={self.latents}")
    if self.auxk is not None and (isinstance(self.auxk, bool) or self.auxk < 1):
      raise ValueError(f"auxk={self.auxk!r} must be a positive int or None")
    for name in ("l0_coef", "bandwidth", "threshold", "lr"):
      if not getattr(self, name) > 0:
        raise ValueError(f"{name}={getattr(self, name)!r} must be > 0")

  @property
  def kind(self) -> str:
    """ "CLT" or "PLT"."""
    return "CLT" if self.cross_layer else "PLT"

  def reach(self, layer: int) -> int:
    """How many layers layer `layer`'s latents write to (from their own on)."""
    return self.layers - layer if self.cross_layer else 1


class TrainState(NamedTuple):
  """Parameters, Adam's state, tokens since each latent (L, m) last fired, the step count."""

  params: Params
  opt_state: Any
  tokens_since: jax.Array
  step: jax.Array


# The JumpReLU and its straight-through estimators ------------------------------------------


def _kernel(pre, theta, bandwidth):
  """The rectangle kernel K((pre - theta) / bandwidth) / bandwidth."""
  return (jnp.abs((pre - theta) / bandwidth) < 0.5).astype(pre.dtype) / bandwidth


def _reduce_to(g, theta):
  return jnp.sum(g, axis=tuple(range(g.ndim - theta.ndim)))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def jumprelu(pre, theta, bandwidth: float):
  """`pre * H(pre - theta)`; d/dtheta is the estimator `-(theta / eps) K((pre - theta) / eps)`
  (`theta` broadcasts against `pre`'s trailing axes)."""
  return pre * (pre > theta)


def _jumprelu_fwd(pre, theta, bandwidth):
  return jumprelu(pre, theta, bandwidth), (pre, theta)


def _jumprelu_bwd(bandwidth, res, g):
  pre, theta = res
  d_theta = -theta * _kernel(pre, theta, bandwidth) * g
  return g * (pre > theta), _reduce_to(d_theta, theta)


jumprelu.defvjp(_jumprelu_fwd, _jumprelu_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def heaviside(pre, theta, bandwidth: float):
  """`H(pre - theta)` (the L0 count); d/dpre is 0 and d/dtheta `-(1/eps) K((pre - theta)/eps)`."""
  return (pre > theta).astype(pre.dtype)


def _heaviside_fwd(pre, theta, bandwidth):
  return heaviside(pre, theta, bandwidth), (pre, theta)


def _heaviside_bwd(bandwidth, res, g):
  pre, theta = res
  return jnp.zeros_like(pre), _reduce_to(-_kernel(pre, theta, bandwidth) * g, theta)


heaviside.defvjp(_heaviside_fwd, _heaviside_bwd)


# Encoding and decoding ---------------------------------------------------------------------


def layer_pre(params: Params, layer: int, x):
  """(n, m) `(x - b_in[l]) W_enc[l] + b_enc[l]` for layer `layer`'s FFN inputs `x` (n, d).

  `b_in`'s gradient is taken through a term that is exactly zero in value, `-(b_in -
  stop_gradient(b_in)) W_enc`: the sum over tokens of the pre-activations' cotangent, times
  W_enc^T, instead of that cotangent times W_enc^T at every token and then summed (a product
  as large as the encoder's own). A per-layer top-k step at all-MiniLM-L6-v2's shape took
  392 ms against 421 ms before (2-core Xeon)."""
  b_in, w = params["b_in"][layer], params["W_enc"][layer]
  fixed = jax.lax.stop_gradient(b_in)
  pre = (jnp.asarray(x, jnp.float32) - fixed) @ w + params["b_enc"][layer]
  return pre - (b_in - fixed) @ w


def _activate(params: Params, config: TranscoderConfig, layer: int, pre):
  # One layer's latents: top-k's (values, indices), each (n, k), or JumpReLU's dense (n, m).
  if config.activation == "topk":
    values, indices = jax.lax.top_k(pre, config.k)
    return jax.nn.relu(values), indices
  return jumprelu(pre, jnp.exp(params["log_threshold"][layer]), config.bandwidth)


def latents_at(params: Params, config: TranscoderConfig, layer: int, x):
  """Layer `layer`'s latents, dense (n, m), for its FFN inputs `x` (n, d)."""
  acts = _activate(params, config, layer, layer_pre(params, layer, x))
  return _dense(config, acts)


def _dense(config: TranscoderConfig, acts):
  if config.activation != "topk":
    return acts
  return dense_latents(*acts, config.latents)


def _encode_layers(params: Params, config: TranscoderConfig, x) -> list:
  # Each layer's latents for inputs x (N, L, d): a layer at a time (cheaper on XLA:CPU than
  # one batched product over the layer axis: the operands need no transposes).
  return [
    _activate(params, config, layer, layer_pre(params, layer, x[:, layer]))
    for layer in range(config.layers)
  ]


@jax.custom_vjp
def sparse_write(values, indices, w):
  """`sum_k values[n, k] w[indices[n, k]]`: the (n, R, d) writes of top-k latents, `values`
  and `indices` (n, k), through decoder rows `w` (m, R, d), one kept latent at a time.

  The same values as gathering every kept row at once, `einsum("nk,nkrd->nrd", values,
  w[indices])`, without its (n, k, R, d) temporary (and its gradient's), which killed a
  cross-layer transcoder at all-mpnet-base-v2's shape for memory at 24 GiB; one latent's
  gather fused with its multiply-add also runs far faster on XLA:CPU than the batched
  product (1,024 tokens, k = 32, 3,072 x 384 rows: 1.7 ms against 71 ms, 2-core Xeon).
  The gradient: the values' by the same loop, the rows' a scatter-add per kept latent."""
  values, indices, w = jnp.asarray(values), jnp.asarray(indices), jnp.asarray(w)
  n, k = values.shape

  def add(j, acc):
    return acc + values[:, j, None, None] * w[indices[:, j]]

  return jax.lax.fori_loop(0, k, add, jnp.zeros((n, *w.shape[1:]), w.dtype))


def _sparse_write_fwd(values, indices, w):
  values, indices, w = jnp.asarray(values), jnp.asarray(indices), jnp.asarray(w)
  return sparse_write(values, indices, w), (values, indices, w)


def _sparse_write_bwd(res, g):
  values, indices, w = res

  def one(j, carry):
    d_values, d_w = carry
    d_values = d_values.at[:, j].set(jnp.sum(g * w[indices[:, j]], axis=(1, 2)))
    return d_values, d_w.at[indices[:, j]].add(values[:, j, None, None] * g)

  start = (jnp.zeros(values.shape, g.dtype), jnp.zeros(w.shape, g.dtype))
  d_values, d_w = jax.lax.fori_loop(0, values.shape[1], one, start)
  return d_values, np.zeros(indices.shape, jax.dtypes.float0), d_w


sparse_write.defvjp(_sparse_write_fwd, _sparse_write_bwd)


def _decode_layers(params: Params, config: TranscoderConfig, acts: list, *, bias=True) -> list:
  """Each layer's predicted FFN output (N, d) from every layer's latents `acts`.

  A top-k layer with few kept latents (64 k <= m) gathers its k decoder rows per token
  (`sparse_write`); otherwise the latents multiply the decoder densely. The latents pass an
  optimisation barrier first: fused with the top-k that made them, XLA:CPU's gathers ran 9x
  slower (all-MiniLM-L6-v2's shape, 1,024 tokens: 7.96 s against 0.90 s on a 2-core Xeon)."""
  acts = jax.lax.optimization_barrier(acts)
  sparse = config.activation == "topk"
  outs: list = [None] * config.layers
  for layer, (a, w) in enumerate(zip(acts, params["W_dec"])):  # w (m, R, d)
    m, reach, d = w.shape
    if sparse and 64 * a[0].shape[-1] <= m:
      write = sparse_write(a[0], a[1], w)
    else:
      z = dense_latents(*a, m) if sparse else a
      write = (z @ w.reshape(m, reach * d)).reshape(-1, reach, d)
    for r in range(reach):
      j = layer + r
      outs[j] = write[:, r] if outs[j] is None else outs[j] + write[:, r]
  if bias:
    outs = [o + params["b_dec"][j] for j, o in enumerate(outs)]
  return outs


def encode(params: Params, config: TranscoderConfig, x):
  """The latents of FFN inputs `x` (N, L, d): top-k's `(values, indices)`, each (N, L, k), or
  JumpReLU's dense (N, L, m)."""
  acts = _encode_layers(params, config, x)
  if config.activation == "topk":
    return tuple(jnp.stack([a[i] for a in acts], 1) for i in (0, 1))
  return jnp.stack(acts, 1)


def dense(config: TranscoderConfig, acts):
  """`encode`'s latents as a dense (N, L, m) array."""
  if config.activation != "topk":
    return acts
  return jnp.stack(
    [_dense(config, (acts[0][:, i], acts[1][:, i])) for i in range(config.layers)], 1
  )


def decode(params: Params, config: TranscoderConfig, acts, *, bias: bool = True):
  """The predicted FFN outputs (N, L, d) of latents `acts` (as `encode` gives them)."""
  if config.activation == "topk":
    acts = [(acts[0][:, i], acts[1][:, i]) for i in range(config.layers)]
  else:
    acts = [acts[:, i] for i in range(config.layers)]
  return jnp.stack(_decode_layers(params, config, acts, bias=bias), 1)


def predict(params: Params, config: TranscoderConfig, x):
  """The transcoder's FFN outputs (N, L, d) for FFN inputs `x` (N, L, d)."""
  acts = _encode_layers(params, config, x)
  return jnp.stack(_decode_layers(params, config, acts), 1)


def unit_rows(w):
  """A decoder `w` (m, R, d) with every latent's row (R, d) scaled to unit norm."""
  return w / jnp.maximum(jnp.linalg.norm(w.reshape(w.shape[0], -1), axis=-1), 1e-12)[:, None, None]


def init(key, config: TranscoderConfig, x, y) -> Params:
  """Fresh parameters, scaled on a sample of inputs `x` and targets `y` (n, L, d).

  Each layer's encoder is scaled so that its latents' write to their own layer matches that
  layer's mean output size (an output's mean distance from the outputs' mean). A cross-layer
  transcoder's latents also write to every later layer: a decoder row's block for a later
  layer t is drawn at t's own output size over sqrt(t), so that the t earlier layers' writes
  into t start near t's size in all. Drawn alike, a large early layer's writes swamp a small
  later one (all-mpnet-base-v2: a first loss of 134 against the per-layer transcoder's 1.5,
  and an FVU of 0.67-1.65 at layers 9-12 after 400 steps)."""
  x, y = (np.asarray(a, np.float32) for a in (x, y))
  want = (config.layers, config.d_model)
  if x.ndim != 3 or x.shape[1:] != want or y.shape != x.shape:
    raise ValueError(f"samples {x.shape} and {y.shape} must both be (n, {want[0]}, {want[1]})")
  key = jax.random.key(key) if isinstance(key, int) else key
  k_enc, k_dec = jax.random.split(key)
  d, m, layers = config.d_model, config.latents, config.layers
  bound = 1 / np.sqrt(d)
  dec_keys = jax.random.split(k_dec, layers)
  b_dec = jnp.asarray(y.mean(0))
  size = jnp.linalg.norm(y[:2048] - b_dec, axis=-1).mean(0)  # (L,) each output's size

  def rows(layer):  # (m, reach, d): unit rows whose block norms follow the targets' sizes
    w = jax.random.normal(dec_keys[layer], (m, config.reach(layer), d))
    if config.cross_layer:
      t = np.arange(layer, layers)
      block = jnp.where(t == layer, size[layer], size[t] / np.sqrt(np.maximum(t, 1)))
      w = w * block[None, :, None]
    return unit_rows(w)

  params = {
    "b_in": jnp.stack([geometric_median(x[:8192, layer]) for layer in range(layers)]),
    "W_enc": jax.random.uniform(k_enc, (layers, d, m), jnp.float32, -bound, bound),
    "b_enc": jnp.zeros((layers, m), jnp.float32),
    "W_dec": [rows(layer) for layer in range(layers)],
    "b_dec": b_dec,
  }
  if config.activation == "jumprelu":
    params["log_threshold"] = jnp.full((layers, m), np.log(config.threshold), jnp.float32)
  sample = x[:2048]
  z = dense(config, encode(params, config, sample))  # (n, L, m)
  own = jnp.einsum("nlm,lmd->nld", z, jnp.stack([w[:, 0] for w in params["W_dec"]]))
  wrote = jnp.linalg.norm(own, axis=-1).mean(0)  # (L,)
  scale = jnp.where(wrote > 0, size / jnp.maximum(wrote, 1e-12), 1.0)
  return {**params, "W_enc": params["W_enc"] * scale[:, None, None]}


# Training ----------------------------------------------------------------------------------


def target_scale(y) -> np.ndarray:
  """(L,) 1 / the per-layer variance of targets `y` (n, L, d) (mean over the width)."""
  y = np.asarray(y, np.float64)
  return (1 / np.mean((y - y.mean(0)) ** 2, axis=(0, 2))).astype(np.float32)


_STACKED = ("b_in", "W_enc", "b_enc", "b_dec", "log_threshold")


def _by_layer(params: Params) -> Params:
  # `params` with each stacked (L, ...) array as the list of its layers, for code that is
  # differentiated: a layer of a list is free under autodiff, where a layer indexed out of a
  # stacked array transposes to a pad to the whole stack, summed over the layers (twelve pads
  # of 226 MB for W_enc each step at all-mpnet-base-v2's shape); a split transposes to one
  # concatenation.
  return {
    key: [jnp.squeeze(a, 0) for a in jnp.split(v, v.shape[0])] if key in _STACKED else v
    for key, v in params.items()
  }


def loss_terms(params: Params, config: TranscoderConfig, x, y, scale, tokens_since):
  """The loss and its parts for a batch of inputs `x` and targets `y` (N, L, d).

  Args:
    scale: (L,) `target_scale` of the targets.
    tokens_since: int (L, m): tokens since each latent last fired (a kept value over 1e-3);
      this batch updates it first, and a latent is dead past `config.dead_tokens`.

  Returns:
    "loss", "mse" (the scaled MSE averaged over layers), "mse_layers" (L,), "penalty" (AuxK
    before `auxk_coef`, or the expected L0 per token), "l0" (per token, summed over layers),
    "dead" (L, m) and the updated "tokens_since".
  """
  n = x.shape[0]
  params = _by_layer(params)
  pres = [layer_pre(params, layer, x[:, layer]) for layer in range(config.layers)]
  acts = [_activate(params, config, layer, pre) for layer, pre in enumerate(pres)]
  if config.activation == "topk":
    on = [values > 1e-3 for values, _ in acts]
    fired = jnp.stack(
      [jnp.zeros(config.latents, jnp.int32).at[i].add(o) > 0 for (_, i), o in zip(acts, on)]
    )
    l0 = sum(jnp.sum(o) for o in on) / n
  else:
    fired = jnp.stack([jnp.any(z > 1e-3, axis=0) for z in acts])
  since = jnp.where(fired, 0, tokens_since) + n
  dead = since > config.dead_tokens
  recon = _decode_layers(params, config, acts)
  mse_layers = jnp.stack([jnp.mean((r - y[:, j]) ** 2) for j, r in enumerate(recon)]) * scale
  mse = jnp.mean(mse_layers)
  if config.activation == "topk":
    penalty = jnp.zeros((), jnp.float32)
    if config.auxk is not None:
      resid = [jax.lax.stop_gradient(y[:, j] - r) for j, r in enumerate(recon)]
      aux_k = min(config.auxk, config.latents)
      aux_cfg = dataclasses.replace(config, k=aux_k)

      def aux_term(p, pres):
        aux = [
          jax.lax.top_k(pre * dead[layer].astype(pre.dtype), aux_k)
          for layer, pre in enumerate(pres)
        ]
        aux = _decode_layers(p, aux_cfg, [(jax.nn.relu(v), i) for v, i in aux], bias=False)
        err = sum(jnp.sum((a - r) ** 2) for a, r in zip(aux, resid))
        var = sum(jnp.sum((r - r.mean(0)) ** 2) for r in resid)
        return jnp.nan_to_num(err / var, nan=0.0, posinf=0.0)

      penalty = jax.lax.cond(
        jnp.any(dead), aux_term, lambda p, pres: jnp.zeros((), jnp.float32), params, pres
      )
    loss = mse + config.auxk_coef * penalty
  else:
    theta = [jnp.exp(t) for t in params["log_threshold"]]
    penalty = sum(jnp.sum(heaviside(pre, theta[i], config.bandwidth)) for i, pre in enumerate(pres))
    penalty = penalty / n
    l0 = penalty
    loss = mse + config.l0_coef * penalty
  since = jnp.minimum(since, config.dead_tokens + n)
  return dict(
    loss=loss,
    mse=mse,
    mse_layers=mse_layers,
    penalty=penalty,
    l0=l0,
    dead=dead,
    tokens_since=since,
  )


def start(params: Params, config: TranscoderConfig) -> TrainState:
  """The training state of fresh (or loaded) parameters."""
  return TrainState(
    params,
    optax.adam(config.lr, eps=config.eps).init(params),
    jnp.zeros((config.layers, config.latents), jnp.int32),
    jnp.zeros((), jnp.int32),
  )


def apply_gradients(config: TranscoderConfig, params: Params, opt_state, grads):
  """One Adam update of `params` by `grads`: each decoder row's gradient is first projected
  off the row (its norm is fixed), and every row is scaled back to unit norm after. Returns
  (params, opt_state)."""
  along = lambda g, w: g - jnp.sum(g * w, axis=(1, 2), keepdims=True) * w
  grads = {**grads, "W_dec": [along(g, w) for g, w in zip(grads["W_dec"], params["W_dec"])]}
  updates, opt_state = optax.adam(config.lr, eps=config.eps).update(grads, opt_state, params)
  params = optax.apply_updates(params, updates)
  params["W_dec"] = [unit_rows(w) for w in params["W_dec"]]
  return params, opt_state


def make_step(config: TranscoderConfig):
  """One compiled step: `step(state, x, y, scale) -> (state, metrics)` on a batch of inputs
  and targets (N, L, d). The state is donated."""

  @functools.partial(jax.jit, donate_argnums=0)
  def step(state: TrainState, x, y, scale):
    def loss(p):
      terms = loss_terms(p, config, x, y, scale, state.tokens_since)
      return terms["loss"], terms

    (_, terms), grads = jax.value_and_grad(loss, has_aux=True)(state.params)
    params, opt_state = apply_gradients(config, state.params, state.opt_state, grads)
    metrics = {key: terms[key] for key in ("loss", "mse", "penalty", "l0")}
    metrics["dead"] = jnp.mean(terms["dead"])
    state = TrainState(params, opt_state, terms["tokens_since"], state.step + 1)
    return state, metrics

  return step


def activations(
  params: Params, config: BertConfig, batches: Iterable, *, max_tokens: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
  """Every block's FFN input and output at the real tokens of `batches`: `(x, y)`, each
  (n_tokens, depth, hidden) float32, the tokens row-major over each batch's real positions.

  The real tokens are counted from the attention masks first and each batch's activations
  written straight into the two arrays, so memory holds one copy of them (all-mpnet-base-v2's
  WikiText-2 validation set: 7.4 GB) and never a list of parts beside it.

  Args:
    batches: `Tokenizer` batches (or dicts with input_ids, attention_mask).
    max_tokens: stop after this many tokens.
  """
  batches = [as_batch(b) for b in batches]
  if not batches:
    raise ValueError("activations needs at least one batch")
  real = [np.asarray(b["attention_mask"]) > 0 for b in batches]
  n = sum(int(r.sum()) for r in real)
  n = n if max_tokens is None else min(n, max_tokens)
  x, y = (np.empty((n, config.depth, config.hidden_size), np.float32) for _ in range(2))
  at = 0
  for b, r in zip(batches, real):
    if at >= n:
      break
    out = forward(
      params,
      config,
      b["input_ids"],
      b["attention_mask"],
      b["token_type_ids"],
      capture=("ffn_in", "ffn_out"),
    )
    for site, into in (("ffn_in", x), ("ffn_out", y)):
      part = np.moveaxis(np.asarray(out.cache[site], np.float32), 0, 2)[r][: n - at]
      into[at : at + len(part)] = part
    at += min(int(r.sum()), n - at)
  return x, y


def train(
  x,
  y,
  config: TranscoderConfig,
  *,
  steps: int,
  batch_tokens: int = 1024,
  seed: int = 0,
  progress: bool = True,
  log_every: int = 0,
) -> tuple[TrainState, list]:
  """Trains a transcoder on FFN inputs `x` and outputs `y` (n, L, d) (`activations`):
  `steps` steps of `batch_tokens` tokens, drawn in shuffled epochs.

  Returns:
    (the final `TrainState`, a list of (step, metrics as floats): every `log_every` steps,
    or the last step's only when 0).
  """
  x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
  want = (config.layers, config.d_model)
  if x.ndim != 3 or x.shape[1:] != want or y.shape != x.shape:
    raise ValueError(f"inputs {x.shape} and targets {y.shape} must both be (n, {want})")
  if len(x) < batch_tokens:
    raise ValueError(f"{len(x)} tokens are fewer than batch_tokens={batch_tokens}")
  rng = np.random.default_rng(seed)
  sample = rng.permutation(len(x))[:8192]
  state = start(init(seed, config, x[sample], y[sample]), config)
  scale = jnp.asarray(target_scale(y[sample]))
  step = make_step(config)
  order, cursor, log = rng.permutation(len(x)), 0, []
  for i in timing.steps(steps, f"{config.kind} transcoder", show=progress, leave=False):
    if cursor + batch_tokens > len(order):
      order, cursor = rng.permutation(len(x)), 0
    rows = order[cursor : cursor + batch_tokens]
    cursor += batch_tokens
    state, metrics = step(state, x[rows], y[rows], scale)
    if (log_every and i % log_every == 0) or i == steps - 1:
      log.append((i, {key: float(v) for key, v in metrics.items()}))
      if not np.isfinite(log[-1][1]["loss"]):
        raise FloatingPointError(f"the transcoder's loss is {log[-1][1]['loss']} at step {i}")
  return state, log


# Evaluation --------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnums=1)
def _predict_dense(params, config, x):
  acts = encode(params, config, x)
  return decode(params, config, acts), dense(config, acts)


def evaluate(
  params: Params,
  config: TranscoderConfig,
  x,
  y,
  *,
  dense_above: float = 0.1,
  chunk: int = 2048,
  groups=None,
) -> dict[str, Any]:
  """How well the transcoder predicts held-out FFN outputs `y` from inputs `x` (n, L, d).

  Args:
    groups: optional `(n,)` group of each token (its passage, 0..G-1): the FVU's sums are
      kept per group and layer too, the items of an interval over the groups.

  Returns, per layer (arrays of length L): "fvu" (sum |y - y_hat|^2 / sum |y - mean y|^2),
  "l0" (active latents per token), "dead" (the share of the layer's latents active on no
  token), "dense" (the share active on more than `dense_above` of the tokens); "frequency"
  (L, m): the share of tokens each latent is active on; "tokens"; with `groups`,
  "per_group": {"error", "variance"}, (G, L) each, whose sums' ratio is the FVU.
  """
  x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
  token_err = np.zeros((len(x), config.layers))
  counts = np.zeros((config.layers, config.latents), np.int64)
  for i in range(0, len(x), chunk):
    recon, z = _predict_dense(params, config, x[i : i + chunk])
    token_err[i : i + chunk] = np.sum((np.asarray(recon, np.float64) - y[i : i + chunk]) ** 2, 2)
    counts += np.sum(np.asarray(z) > 0, axis=0)
  y64 = y.astype(np.float64)
  token_var = np.sum((y64 - y64.mean(0)) ** 2, axis=2)
  err, var = token_err.sum(0), token_var.sum(0)
  freq = counts / max(len(x), 1)
  out = {}
  if groups is not None:
    groups = np.asarray(groups)
    if groups.shape != (len(x),):
      raise ValueError(f"groups shape {groups.shape} must be ({len(x)},), one per token")
    per = lambda a: np.stack([np.bincount(groups, a[:, i]) for i in range(config.layers)], 1)
    out["per_group"] = {"error": per(token_err), "variance": per(token_var)}
  return {
    **out,
    "fvu": err / var,
    "l0": counts.sum(1) / max(len(x), 1),
    "dead": np.mean(counts == 0, axis=1),
    "dense": np.mean(freq > dense_above, axis=1),
    "frequency": freq,
    "tokens": len(x),
  }


# Files -------------------------------------------------------------------------------------


def _names(config: TranscoderConfig) -> dict[str, tuple[int, ...]]:
  layers, d, m = config.layers, config.d_model, config.latents
  shapes = {
    "b_in": (layers, d),
    "W_enc": (layers, d, m),
    "b_enc": (layers, m),
    "b_dec": (layers, d),
  }
  shapes.update({f"W_dec.{i}": (m, config.reach(i), d) for i in range(layers)})
  if config.activation == "jumprelu":
    shapes["log_threshold"] = (layers, m)
  return shapes


def save(path, tc: Params, config: TranscoderConfig) -> pathlib.Path:
  """Writes `transcoder.safetensors` and `transcoder.json` (the config) into folder `path`,
  each through a temporary file, so a crash leaves the previous pair or none."""
  from safetensors.numpy import save_file

  path = pathlib.Path(path)
  path.mkdir(parents=True, exist_ok=True)
  tensors = {k: np.asarray(v, np.float32) for k, v in tc.items() if k != "W_dec"}
  tensors.update({f"W_dec.{i}": np.asarray(w, np.float32) for i, w in enumerate(tc["W_dec"])})
  bad = {k: v.shape for k, v in tensors.items() if _names(config).get(k) != v.shape}
  if bad or set(tensors) != set(_names(config)):
    raise ValueError(f"parameters {bad or sorted(tensors)} do not match {_names(config)}")
  for name, write in (
    ("transcoder.safetensors", lambda f: save_file(tensors, f)),
    ("transcoder.json", lambda f: pathlib.Path(f).write_text(_config_json(config))),
  ):
    part = path / f"{name}.part"
    write(str(part))
    os.replace(part, path / name)
  return path


def _config_json(config: TranscoderConfig) -> str:
  return json.dumps({"format": FORMAT, **dataclasses.asdict(config)}, indent=1) + "\n"


def load(path) -> tuple[Params, TranscoderConfig]:
  """A transcoder saved by `save`: (parameters, config). Missing, unexpected or wrongly
  shaped tensors are all named in one error."""
  from safetensors.numpy import load_file

  path = pathlib.Path(path)
  files = [path / "transcoder.json", path / "transcoder.safetensors"]
  missing = [str(f) for f in files if not f.exists()]
  if missing:
    raise FileNotFoundError(f"no saved transcoder in {path}: {missing} do not exist")
  raw = json.loads(files[0].read_text())
  if raw.pop("format", None) != FORMAT:
    raise ValueError(f"{files[0]} is not a format-{FORMAT} transcoder config")
  known = {f.name for f in dataclasses.fields(TranscoderConfig)}
  if set(raw) - known:
    raise ValueError(f"{files[0]} has unknown keys {sorted(set(raw) - known)}")
  config = TranscoderConfig(**raw)
  tensors = load_file(str(files[1]))
  want = _names(config)
  problems = [f"missing {k}" for k in want if k not in tensors]
  problems += [f"unexpected {k}" for k in tensors if k not in want]
  problems += [
    f"{k} is {tensors[k].shape}, expected {s}"
    for k, s in want.items()
    if k in tensors and tensors[k].shape != s
  ]
  if problems:
    raise ValueError(f"{files[1]} does not match its config: " + "; ".join(problems))
  params = {k: jnp.asarray(v) for k, v in tensors.items() if not k.startswith("W_dec.")}
  params["W_dec"] = [jnp.asarray(tensors[f"W_dec.{i}"]) for i in range(config.layers)]
  return params, config
