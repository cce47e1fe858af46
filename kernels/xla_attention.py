"""Attention in plain XLA ops with a hand-written backward pass (`impl="xla"` without maps).

`reference_attention` is written for clarity: it materialises the normalised softmax,
the uniform distribution and their mixture as `(batch, heads, q, k)` tensors and lets
autodiff differentiate all of it. That is the ground truth every implementation is
tested against, but on CPU, where each `T x T` elementwise pass costs about as much as a
matmul, its backward pass is slow: autodiff of `where`, `exp`, the division and the
mixture re-reads the `T x T` tensors several times.

This version computes the same function with the flash-attention algebra, in ordinary XLA
ops (so it runs on every backend and inside `vmap`/`scan`):

* forward: `S = q k^T * scale` (masked keys get -inf), `P~ = exp(S - rowmax)`,
  `l = rowsum P~`, `O = (P~ V) / l`: the normalisation is applied to the `(q, d)` output,
  not to the `(q, k)` map;
* the head mask acts on `O` (`out = xi O` in "scale" mode; `xi O + (1 - xi) U V` in
  "uniform" mode, where `U V` is the mean of the allowed values), so `d xi` is a
  reduction over `(q, d)`, not over `(q, k)`;
* backward (custom VJP), with `dO' = xi dO`: `dV = P^T dO'`, `dP = dO' V^T`,
  `dS = P * (dP - rowsum(dO' * O))`, `dQ = dS K * scale`, `dK = dS^T Q * scale`;
  `P = P~ / l` is kept from the forward pass as the one `T x T` residual.

Padded query rows (index >= kv_length, or key_mask False when q and k have equal
lengths) give zero outputs and zero gradients, as in every implementation.

Attention dropout multiplies the attention that mixes the values by the mask `M` of
`kernels.dropout` (`1 / (1 - rate)` where kept, else 0), after the uniform mix:
`O = (M * P) V`, `U V -> (M * U) V`. The backward recomputes `M` from the seed (it is not a
residual) and uses `dV = (M * P)^T dO'`, `dS = P * (M * dP - rowsum(dO' * O))` with the
dropped `O`.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from kernels import dropout as drop


def _drop_multiplier(seed, p, rate):
  """`(B, H, Tq, Tk)` dropout multiplier for the probabilities p, or None without dropout."""
  if rate == 0:
    return None
  batch, heads, seq_q, seq_k = p.shape
  return drop.multiplier(seed, batch, heads, seq_q, seq_k, rate, p.dtype)


def _forward(qf, kf, vf, allowed, row_real, xi, seed, uniform, scale, rate):
  dtype = qf.dtype
  s = jnp.einsum("bqhd,bkhd->bhqk", qf, kf) * scale
  s = jnp.where(allowed[:, None], s, -jnp.inf)
  m = jnp.max(s, axis=-1, keepdims=True)
  m = jnp.where(jnp.isfinite(m), m, 0.0)
  p = jnp.exp(s - m)  # exactly 0 where not allowed
  denom = p.sum(-1)  # (B, H, Tq)
  inv = jnp.where(denom > 0, 1.0 / jnp.where(denom > 0, denom, 1.0), 0.0)
  p = p * inv[..., None]  # normalised; rows with no allowed key are all zero
  mult = _drop_multiplier(seed, p, rate)
  o = jnp.einsum("bhqk,bkhd->bqhd", p if mult is None else p * mult, vf)
  real = row_real[:, :, None, None].astype(dtype)  # (B, Tq, 1, 1)
  x = xi[:, None, :, None]  # (B, 1, H, 1)
  if uniform:
    a = allowed.astype(dtype)
    count = a.sum(-1, keepdims=True)
    u_mat = a / jnp.maximum(count, 1.0)  # (B, Tq, Tk)
    if mult is None:
      u = jnp.einsum("bqk,bkhd->bqhd", u_mat, vf)
    else:
      u = jnp.einsum("bhqk,bkhd->bqhd", u_mat[:, None] * mult, vf)
    out = (x * o + (1.0 - x) * u) * real
  else:
    u_mat, u = None, None
    out = x * o * real
  return out, (qf, kf, vf, p, o, u, u_mat, real, x)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9))
def _attention(q, k, v, allowed, row_real, xi, seed, uniform, scale, rate):
  return _forward(q, k, v, allowed, row_real, xi, seed, uniform, scale, rate)[0]


def _fwd(q, k, v, allowed, row_real, xi, seed, uniform, scale, rate):
  out, res = _forward(q, k, v, allowed, row_real, xi, seed, uniform, scale, rate)
  return out, (res, allowed, row_real, seed)


def _bwd(uniform, scale, rate, saved, dout):
  (qf, kf, vf, p, o, u, u_mat, real, x), allowed, row_real, seed = saved
  mult = _drop_multiplier(seed, p, rate)  # recomputed from the seed, not stored
  g = dout * real  # (B, Tq, H, D)
  if uniform:
    dxi = (g * (o - u)).sum((1, 3))
    du = (1.0 - x) * g
  else:
    dxi = (g * o).sum((1, 3))
  do = x * g
  dv = jnp.einsum("bhqk,bqhd->bkhd", p if mult is None else p * mult, do)
  if uniform and mult is None:
    dv = dv + jnp.einsum("bqk,bqhd->bkhd", u_mat, du)
  elif uniform:
    dv = dv + jnp.einsum("bhqk,bqhd->bkhd", u_mat[:, None] * mult, du)
  dp = jnp.einsum("bqhd,bkhd->bhqk", do, vf)
  if mult is not None:
    dp = dp * mult
  delta = (do * o).sum(-1).transpose(0, 2, 1)  # (B, H, Tq)
  ds = p * (dp - delta[..., None]) * scale
  dq = jnp.einsum("bhqk,bkhd->bqhd", ds, kf)
  dk = jnp.einsum("bhqk,bqhd->bkhd", ds, qf)
  zero = lambda a: None if a is None else jnp.zeros(a.shape, jax.dtypes.float0)
  return dq, dk, dv, zero(allowed), zero(row_real), dxi, zero(seed)


_attention.defvjp(_fwd, _bwd)


def xla_attention(
  q,
  k,
  v,
  *,
  allowed,
  row_real,
  head_mask=None,
  ablation="scale",
  scale=None,
  dropout_rate=0.0,
  dropout_seed=None,
):
  """Attention of `(batch, seq, heads, head_dim)` inputs with a lean custom backward.

  Args:
    q, k, v: `(batch, seq_q|seq_k, heads, head_dim)`.
    allowed: bool `(batch, seq_q, seq_k)`: which keys each query may attend to.
    row_real: bool `(batch, seq_q)`: real query rows (others give zeros).
    head_mask: float `(batch, heads)` (already broadcast) or None; differentiable.
    ablation: "scale" or "uniform".
    scale: logit scale; None means `1 / sqrt(head_dim)`.
    dropout_rate: static attention dropout rate in [0, 1) (validated by the caller).
    dropout_seed: int32 scalar seed (`kernels.dropout.seed_to_int32`) when dropout_rate > 0.

  Returns:
    `(batch, seq_q, heads, head_dim)` in q's dtype; equal to `reference_attention`.
  """
  batch, _, heads, head_dim = q.shape
  scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
  dtype = jnp.promote_types(q.dtype, jnp.float32)
  xi = jnp.ones((batch, heads), dtype) if head_mask is None else head_mask.astype(dtype)
  # Casts outside the custom VJP, so autodiff casts the cotangents back.
  rate = float(dropout_rate)
  seed = None if rate == 0 else drop.seed_to_int32(dropout_seed)
  out = _attention(
    q.astype(dtype),
    k.astype(dtype),
    v.astype(dtype),
    allowed,
    row_real,
    xi,
    seed,
    ablation == "uniform",
    scale,
    rate,
  )
  return out.astype(q.dtype)
