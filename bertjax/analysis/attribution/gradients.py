"""Token attribution from the model's output end: gradients on the embeddings, the logit lens.

The gradient baselines (gradient x input, Shrikumar et al. 2017; integrated gradients,
Sundararajan et al. 2017, with Captum's quadrature) differentiate a target, e.g. the MLM
log-probability of a token (`mlm_target`), with respect to the `embeddings` site; the logit
lens (nostalgebraist 2020) reads every block's output through the MLM head. The conventions
(inputs, padding, targets) are those of `bertjax.analysis.attribution.propagation`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.analysis.attribution.common import (
  Params,
  analysis_dtype,
  captured_sites,
  real_tokens,
)
from bertjax.model.config import BertConfig
from bertjax.model.forward import BertOutput, forward
from bertjax.model.heads import mlm_logits
from bertjax.model.input_checks import check_inputs
from bertjax.model.layers import compute_dtype

TargetFn = Callable[[Params, BertOutput], jax.Array]
IG_METHODS = ("gausslegendre", "riemann_trapezoid")
REDUCTIONS = ("sum", "l2", None)


class IntegratedGradients(NamedTuple):
  """What `integrated_gradients` returns.

  Attributes:
    attributions: (batch, seq) with `reduce="sum"` or `"l2"`, (batch, seq, hidden) with None.
    delta: (batch,): `sum(attributions) - (f(x) - f(baseline))`, summed over every
      token and hidden unit (Captum's convergence delta); 0 for exact integration.
  """

  attributions: jax.Array
  delta: jax.Array


class LogitLens(NamedTuple):
  """What `logit_lens` returns; layer 0 is the embedding output, layer l the output of block l-1.

  Attributes:
    top_ids: int (depth + 1, batch, positions, k), the k most probable tokens.
    top_log_probs: (depth + 1, batch, positions, k), their log-probabilities.
    target_log_probs: (depth + 1, batch, positions), the log-probability of the
      given targets, or None when no targets were given.
  """

  top_ids: jax.Array
  top_log_probs: jax.Array
  target_log_probs: jax.Array | None


# Gradient baselines on the embeddings -------------------------------------------


def mlm_target(config: BertConfig, positions, token_ids) -> TargetFn:
  """A target for the gradient methods: the MLM log-probability of `token_ids` at `positions`.

  Args:
    config: the model's config (it needs an "mlm" head).
    positions: int (batch,), one position per sequence.
    token_ids: int (batch,), the token whose log-probability is the target.

  Returns:
    `target_fn(params, out) -> (batch,)`.
  """
  if jnp.ndim(positions) != 1 or jnp.shape(token_ids) != jnp.shape(positions):
    raise ValueError(
      f"positions shape {jnp.shape(positions)} and token_ids shape "
      f"{jnp.shape(token_ids)} must both be (batch,)"
    )
  for name, v in (("positions", positions), ("token_ids", token_ids)):
    dtype = v.dtype if hasattr(v, "dtype") else np.asarray(v).dtype
    if not jnp.issubdtype(dtype, jnp.integer):
      raise ValueError(f"{name} must be integers; got dtype {dtype}")
  # Values are checked when concrete (built outside a jit; under one, as the model's inputs).
  concrete = not any(isinstance(v, jax.core.Tracer) for v in (positions, token_ids))
  pos = np.asarray(positions) if concrete else None
  if concrete:
    ids = np.asarray(token_ids)
    bad = np.flatnonzero(pos < 0)
    if bad.size:
      raise ValueError(f"positions[{bad[0]}] = {pos[bad[0]]} must be >= 0")
    bad = np.flatnonzero((ids < 0) | (ids >= config.vocab_size))
    if bad.size:
      raise ValueError(
        f"token_ids[{bad[0]}] = {ids[bad[0]]} is outside the vocabulary [0, {config.vocab_size})"
      )
  positions, token_ids = jnp.asarray(positions, jnp.int32), jnp.asarray(token_ids, jnp.int32)

  def target_fn(params, out):
    batch, seq = out.last_hidden_state.shape[:2]
    if batch != positions.shape[0] or (pos is not None and pos.size and pos.max() >= seq):
      top = "" if pos is None or not pos.size else f" with positions up to {pos.max()}"
      raise ValueError(
        f"mlm_target was built for {positions.shape[0]} sequences{top}; the "
        f"batch has {batch} sequences of {seq} tokens"
      )
    b = jnp.arange(batch)
    logits = mlm_logits(params, config, out.last_hidden_state[b, positions])  # (B, V)
    return jax.nn.log_softmax(logits, -1)[b, token_ids]

  return target_fn


def _target_on_embeddings(params, config, input_ids, mask, token_type_ids, target_fn, e):
  out = forward(
    params,
    config,
    input_ids,
    mask,
    token_type_ids,
    patch={"embeddings": (e, jnp.ones((), e.dtype))},
  )
  value = target_fn(params, out)
  if value.shape != (input_ids.shape[0],):
    raise ValueError(
      f"target_fn must return one scalar per sequence, shape "
      f"({input_ids.shape[0]},); got shape {value.shape}"
    )
  return value


def _reduce(attr, reduce):
  if reduce == "sum":
    return attr.sum(-1)
  if reduce == "l2":
    return jnp.linalg.norm(attr, axis=-1)
  return attr


def gradient_x_input(
  params: Params,
  config: BertConfig,
  input_ids,
  attention_mask=None,
  token_type_ids=None,
  *,
  target_fn: TargetFn,
  reduce: str | None = "sum",
) -> jax.Array:
  """Gradient x input on the embedding output (Shrikumar et al. 2017; Kindermans et al. 2016).

  The input is the `embeddings` site (word + position + type embeddings after
  LayerNorm, and ALBERT/ELECTRA's projection), replaced by a differentiable patch;
  `attr = e * d target / d e`. mt-upc/transformer-contributions (Captum's
  `InputXGradient` on the same embedding output) reports the L2 norm of each
  token's vector (`reduce="l2"`) and its sum (`reduce="sum"`).

  Args:
    params, config: the model.
    input_ids, attention_mask, token_type_ids: (batch, seq) as for `bertjax.forward`.
    target_fn: `(params, out: BertOutput) -> (batch,)`, e.g. `mlm_target(...)`; a new
      function object compiles anew, so define it once.
    reduce: "sum" (signed, over hidden units), "l2", or None for (batch, seq, hidden).

  Returns:
    (batch, seq) or (batch, seq, hidden).
  """
  check_inputs(config, input_ids, attention_mask, token_type_ids)
  if reduce not in REDUCTIONS:
    raise ValueError(f"{reduce=!r} must be one of {REDUCTIONS}")
  return _gradient_x_input(
    params,
    config,
    input_ids,
    real_tokens(input_ids, attention_mask),
    token_type_ids,
    target_fn,
    reduce,
  )


@functools.partial(jax.jit, static_argnums=(1, 5, 6))
def _gradient_x_input(params, config, input_ids, mask, token_type_ids, target_fn, reduce):
  e = captured_sites(params, config, input_ids, mask, token_type_ids, ("embeddings",))["embeddings"]
  e = e.astype(compute_dtype(config))
  f = lambda e: _target_on_embeddings(
    params, config, input_ids, mask, token_type_ids, target_fn, e
  ).sum()
  grad = jax.grad(f)(e)
  return _reduce((e * grad).astype(analysis_dtype(config)), reduce)


def _quadrature(method: str, steps: int) -> tuple[np.ndarray, np.ndarray]:
  """Points in [0, 1] and weights, as Captum's approximation_methods."""
  if method == "gausslegendre":
    x, w = np.polynomial.legendre.leggauss(steps)
    return 0.5 * x + 0.5, 0.5 * w
  alphas = np.linspace(0, 1, steps)
  w = np.full(steps, 1 / (steps - 1))
  w[[0, -1]] /= 2
  return alphas, w


def integrated_gradients(
  params: Params,
  config: BertConfig,
  input_ids,
  attention_mask=None,
  token_type_ids=None,
  *,
  target_fn: TargetFn,
  baseline=None,
  steps: int = 50,
  method: str = "gausslegendre",
  reduce: str | None = "sum",
  chunk_size: int | None = None,
) -> IntegratedGradients:
  """Integrated gradients on the embedding output (Sundararajan et al. 2017).

  `attr = (e - e') * integral_0^1 d target(e' + a (e - e')) / d e da`, with Captum's
  quadrature (Gauss-Legendre by default, as `IntegratedGradients.attribute`), on
  the `embeddings` site (see `gradient_x_input`). Completeness: the attributions
  sum to `target(e) - target(e')` up to the quadrature error, returned as `delta`.

  Args:
    params, config: the model.
    input_ids, attention_mask, token_type_ids: (batch, seq) as for `bertjax.forward`.
    target_fn: `(params, out: BertOutput) -> (batch,)`; define it once (it is static).
    baseline: (batch, seq, hidden) or broadcastable embedding output to start from;
      None means zeros. mt-upc/transformer-contributions uses the embeddings of
      `[CLS] [MASK] ... [MASK] [SEP]`: `bertjax.embed(params, config, baseline_ids)`.
    steps: quadrature points.
    method: "gausslegendre" or "riemann_trapezoid".
    reduce: "sum", "l2" or None, as in `gradient_x_input`.
    chunk_size: quadrature points evaluated together (default: all `steps`).

  Returns:
    `IntegratedGradients(attributions, delta)`.
  """
  check_inputs(config, input_ids, attention_mask, token_type_ids)
  if method not in IG_METHODS:
    raise ValueError(f"{method=!r} must be one of {IG_METHODS}")
  if reduce not in REDUCTIONS:
    raise ValueError(f"{reduce=!r} must be one of {REDUCTIONS}")
  if steps < 2:
    raise ValueError(f"{steps=} must be >= 2")
  if chunk_size is not None and chunk_size < 1:
    raise ValueError(f"{chunk_size=} must be a positive int or None")
  shape = (*np.shape(input_ids), config.hidden_size)
  if baseline is not None:
    try:
      ok = np.broadcast_shapes(np.shape(baseline), shape) == shape
    except ValueError:
      ok = False
    if not ok:
      raise ValueError(
        f"baseline shape {np.shape(baseline)} does not broadcast to (batch, seq, hidden)={shape}"
      )
  alphas, weights = _quadrature(method, steps)
  return _integrated_gradients(
    params,
    config,
    input_ids,
    real_tokens(input_ids, attention_mask),
    token_type_ids,
    baseline,
    jnp.asarray(alphas),
    jnp.asarray(weights),
    target_fn,
    reduce,
    chunk_size,
  )


@functools.partial(jax.jit, static_argnums=(1, 8, 9, 10))
def _integrated_gradients(
  params,
  config,
  input_ids,
  mask,
  token_type_ids,
  baseline,
  alphas,
  weights,
  target_fn,
  reduce,
  chunk_size,
):
  dtype = compute_dtype(config)
  e = captured_sites(params, config, input_ids, mask, token_type_ids, ("embeddings",))["embeddings"]
  e = e.astype(dtype)
  base = (
    jnp.zeros_like(e) if baseline is None else jnp.broadcast_to(baseline, e.shape).astype(dtype)
  )
  f = lambda x: _target_on_embeddings(params, config, input_ids, mask, token_type_ids, target_fn, x)
  grad = jax.grad(lambda x: f(x).sum())
  grads = jax.lax.map(
    lambda a: grad(base + a.astype(dtype) * (e - base)), alphas, batch_size=chunk_size
  )  # (steps, B, T, H)
  acc = analysis_dtype(config)
  total = jnp.tensordot(weights.astype(acc), grads.astype(acc), axes=1)
  attr = (e - base).astype(acc) * total
  delta = attr.sum((1, 2)) - (f(e) - f(base)).astype(acc)
  return IntegratedGradients(_reduce(attr, reduce), delta)


# The logit lens --------------------------------------------------------------------


def logit_lens(
  params: Params,
  config: BertConfig,
  input_ids,
  attention_mask=None,
  token_type_ids=None,
  *,
  positions=None,
  targets=None,
  k: int = 5,
) -> LogitLens:
  """The logit lens for masked LMs: every block's output read by the MLM head.

  nostalgebraist 2020, "interpreting GPT: the logit lens" (LessWrong): the final
  unembedding applied to intermediate states. In these post-LN encoders every
  block output is already LayerNorm-ed, so each goes straight through the
  family's MLM head (`bertjax.mlm_logits`: transform, LayerNorm, tied decoder),
  the embedding output included as layer 0.

  Args:
    params, config: a model with an "mlm" head.
    input_ids, attention_mask, token_type_ids: (batch, seq) as for `bertjax.forward`.
    positions: int (batch, P) positions to read (default: every position, P = seq).
    targets: int (batch, P) token ids whose log-probabilities to return, or None.
    k: how many top tokens per layer and position.

  Returns:
    `LogitLens(top_ids, top_log_probs, target_log_probs)`, each (depth + 1, batch, P, ...).
  """
  check_inputs(config, input_ids, attention_mask, token_type_ids)
  if "mlm" not in params:
    raise ValueError(
      "logit_lens needs an MLM head; these parameters have none (load a "
      "*ForMaskedLM / *ForPreTraining checkpoint or init(..., heads=('mlm',)))"
    )
  if "mlm" not in config.family.heads:
    raise ValueError(f"a {config.model_type} model has no 'mlm' head")
  batch, seq = np.shape(input_ids)
  if positions is None:
    positions = np.broadcast_to(np.arange(seq), (batch, seq))
  positions = jnp.asarray(positions)
  if positions.ndim != 2 or positions.shape[0] != batch:
    raise ValueError(f"positions shape {positions.shape} must be (batch, P) with batch={batch}")
  if not jnp.issubdtype(positions.dtype, jnp.integer):
    raise ValueError(f"positions must be integers; got dtype {positions.dtype}")
  if not isinstance(positions, jax.core.Tracer):
    bad = np.asarray(positions)[(np.asarray(positions) < 0) | (np.asarray(positions) >= seq)]
    if bad.size:
      raise ValueError(f"positions {sorted(set(bad.tolist()))[:10]} are outside [0, {seq})")
  if targets is not None:
    targets = jnp.asarray(targets)
    if targets.shape != positions.shape:
      raise ValueError(
        f"targets shape {targets.shape} must equal positions shape {positions.shape}"
      )
    if not isinstance(targets, jax.core.Tracer):
      t = np.asarray(targets)
      bad = t[(t < 0) | (t >= config.vocab_size)]
      if bad.size:
        raise ValueError(
          f"targets {sorted(set(bad.tolist()))[:10]} are outside the vocabulary "
          f"[0, {config.vocab_size})"
        )
  if not 1 <= k <= config.vocab_size:
    raise ValueError(f"{k=} must lie in [1, vocab_size={config.vocab_size}]")
  return _logit_lens(
    params,
    config,
    input_ids,
    attention_mask,
    token_type_ids,
    positions.astype(jnp.int32),
    None if targets is None else targets.astype(jnp.int32),
    k,
  )


@functools.partial(jax.jit, static_argnums=(1, 7))
def _logit_lens(params, config, input_ids, attention_mask, token_type_ids, positions, targets, k):
  cache = captured_sites(
    params, config, input_ids, attention_mask, token_type_ids, ("embeddings", "out")
  )
  states = jnp.concatenate([cache["embeddings"][None], cache["out"]])  # (L+1, B, T, H)
  states = jnp.take_along_axis(states, positions[None, :, :, None], axis=2)  # (L+1, B, P, H)
  states = states.astype(compute_dtype(config))

  def read(h):
    log_probs = jax.nn.log_softmax(
      mlm_logits(params, config, h).astype(analysis_dtype(config)), -1
    )  # (B, P, V)
    top, ids = jax.lax.top_k(log_probs, k)
    target = (
      None if targets is None else jnp.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
    )
    return ids, top, target

  ids, top, target = jax.lax.map(read, states)
  return LogitLens(ids, top, target)
