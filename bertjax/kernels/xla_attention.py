"""Attention in plain XLA ops with a hand-written backward pass (`impl="xla"` without maps).

`reference_attention` is written for clarity: it materialises the normalised softmax,
the uniform distribution and their mixture as `(batch, heads, q, k)` tensors and lets
autodiff differentiate all of it. That is the ground truth every implementation is
tested against, but on CPU, where each `T x T` elementwise pass costs about as much as a
matmul, its backward pass is slow: autodiff of `where`, `exp`, the division and the
mixture re-reads the `T x T` tensors several times.

This version computes the same function with the flash-attention algebra, in ordinary XLA
ops (so it runs on every backend and inside `vmap`/`scan`):

* forward: `S = q k^T * scale` (masked keys get -1e30), `P~ = exp(S - rowmax)`,
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

Grouped key/value heads (`k`, `v` with G heads, G dividing the query heads N) are never
repeated: the query heads are viewed as `(G, N / G)` and every product runs per group, so
`dK`, `dV` sum over the heads of a group. A position bias (`kernels.PositionBias`) enters
as its `(N, Tq, Tk)` values added to the scaled logits; its gradient is `P * (dP - delta)`
summed over the batch (`S` without the scale), from which autodiff reaches the bias table.
A sliding window arrives as a per-query `allowed`; `banded_attention` below computes a
window layer's band alone, in query blocks, so its cost grows with T x window.

Attention dropout multiplies the attention that mixes the values by the mask `M` of
`kernels.dropout` (`1 / (1 - rate)` where kept, else 0), after the uniform mix:
`O = (M * P) V`, `U V -> (M * U) V`. The backward recomputes `M` from the seed (it is not a
residual) and uses `dV = (M * P)^T dO'`, `dS = P * (M * dP - rowsum(dO' * O))` with the
dropped `O`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from . import dropout as drop
from .disentangled import add_bias, bias_scores, default_scale


def _drop_multiplier(seed, p, rate):
  """`(B, H, Tq, Tk)` dropout multiplier for the probabilities p, or None without dropout."""
  if rate == 0:
    return None
  batch, heads, seq_q, seq_k = p.shape
  return drop.multiplier(seed, batch, heads, seq_q, seq_k, rate, p.dtype)


# A finite "minus infinity" for masked logits: exp underflows to exactly 0 at any allowed
# row maximum, and no row max or sum can be -inf or 0, so no guard passes are needed.
_MASKED = -1e30


def _grouped(x, groups):
  """`(B, N, ...)` viewed as `(B, G, N / G, ...)`: query heads by key/value group."""
  return x.reshape(x.shape[0], groups, x.shape[1] // groups, *x.shape[2:])


def _ungrouped(x):
  return x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])


def _qk(qh, kh):
  """Scores `(B, N, Tq, Tk)` of queries `(B, N, Tq, D)` and keys `(B, G, Tk, D)`."""
  if kh.shape[1] == qh.shape[1]:
    return jnp.einsum("bhqd,bhkd->bhqk", qh, kh)
  return _ungrouped(jnp.einsum("bgrqd,bgkd->bgrqk", _grouped(qh, kh.shape[1]), kh))


def _pv(p, vh):
  """`p @ v`: `(B, N, Tq, Tk)` weights of values `(B, G, Tk, D)` -> `(B, N, Tq, D)`."""
  if vh.shape[1] == p.shape[1]:
    return jnp.einsum("bhqk,bhkd->bhqd", p, vh)
  return _ungrouped(jnp.einsum("bgrqk,bgkd->bgrqd", _grouped(p, vh.shape[1]), vh))


def _to_keys(p, x, groups):
  """`p^T @ x`: `(B, N, Tq, Tk)` and `(B, N, Tq, D)` -> `(B, G, Tk, D)`, summed per group."""
  if groups == p.shape[1]:
    return jnp.einsum("bhqk,bhqd->bhkd", p, x)
  return jnp.einsum("bgrqk,bgrqd->bgkd", _grouped(p, groups), _grouped(x, groups))


def _scores(qh, kh, allowed, scale, bias=None):
  """Unnormalised `exp(S - rowmax)` `(B, H, Tq, Tk)` and `1 / rowsum` `(B, H, Tq, 1)`.

  The mask is an additive bias (`(B, 1, 1, Tk)` for key-only masks): one fused add,
  where a select against -inf and the guards it needs cost extra T x T passes on CPU.
  `bias` is a position bias `(H, Tq, Tk)`, or `(B, H, Tq, Tk)` (DeBERTa's terms, which
  depend on the inputs), or None, added to the scaled logits.
  """
  mask_bias = jnp.where(allowed, 0.0, _MASKED).astype(qh.dtype)[:, None]
  s = add_bias(_qk(qh * scale, kh) + mask_bias, bias)
  p = jnp.exp(s - jnp.max(s, axis=-1, keepdims=True))
  return p, 1.0 / p.sum(-1, keepdims=True)


def _mix(o, vh, allowed, row_real, xi, mult, uniform, dtype):
  """The head mask and padded rows applied to O `(B, H, Tq, D)`; U V when uniform."""
  # A row is zero when it is padding or has no allowed key at all (as the reference).
  real = (row_real & allowed.any(-1))[:, None, :, None].astype(dtype)  # (B, 1, Tq, 1)
  x = xi[:, :, None, None]  # (B, H, 1, 1)
  if not uniform:
    return x * o * real, None, None, real, x
  a = jnp.broadcast_to(allowed, (allowed.shape[0], o.shape[2], allowed.shape[2])).astype(dtype)
  u_mat = a / jnp.maximum(a.sum(-1, keepdims=True), 1.0)  # (B, Tq, Tk)
  if mult is None:
    u = jnp.einsum("bqk,bgkd->bgqd", u_mat, vh)  # (B, G, Tq, D)
    u = jnp.repeat(u, o.shape[1] // vh.shape[1], axis=1)  # the mean value, per query head
  else:
    u = _pv(u_mat[:, None] * mult, vh)
  return (x * o + (1.0 - x) * u) * real, u, u_mat, real, x


def _forward(qh, kh, vh, allowed, row_real, xi, seed, bias, uniform, scale, rate):
  """Training forward: keeps the normalised map P as the backward's one T x T residual."""
  p, inv = _scores(qh, kh, allowed, scale, bias)
  p = p * inv
  mult = _drop_multiplier(seed, p, rate)
  o = _pv(p if mult is None else p * mult, vh)
  out, u, u_mat, real, x = _mix(o, vh, allowed, row_real, xi, mult, uniform, qh.dtype)
  return out, (qh, kh, vh, p, o, u, u_mat, real, x)


# On CPU a score tensor larger than the last-level cache is computed a few heads of one
# sequence at a time, each block about the size of a core's L2: every T x T elementwise pass
# then reads cache, not memory. Measured on the 2-core AVX-512 CPU (BERT-base attention,
# batch 8 x 512, 12 heads; PyTorch's fused CPU sdpa 47-64 ms): plain softmax(QK^T)V 124-132 ms
# at once vs 46-50 ms in blocks of 2-4 heads; this function (masks, head mask) 75 vs 71 ms.
# Below the threshold one pass is as fast or faster.
_WHOLE_MAX_BYTES = 32 << 20
_BLOCK_BYTES = 4 << 20


def _heads_per_block(batch, heads, seq_q, seq_k, itemsize):
  """Heads per block for the blocked CPU path, or None to compute all scores at once."""
  if jax.default_backend() != "cpu" or batch * heads * seq_q * seq_k * itemsize <= _WHOLE_MAX_BYTES:
    return None
  fits = [
    n
    for n in range(1, heads + 1)
    if heads % n == 0 and n * seq_q * seq_k * itemsize <= _BLOCK_BYTES
  ]
  return max(fits, default=1)


def _attend(qh, kh, vh, allowed, scale):
  """Inference `softmax(S) V` `(B, H, Tq, D)`: the (q, d) output is normalised, not the map."""
  p, inv = _scores(qh, kh, allowed, scale)
  return _pv(p, vh) * inv


def _attend_blocked(qh, kh, vh, allowed, scale, per_block):
  """`_attend` looped over sequences and blocks of `per_block` heads (same values)."""
  batch, heads, seq_q, head_dim = qh.shape
  split = lambda a: a.reshape(batch, heads // per_block, per_block, *a.shape[2:])

  def one_sequence(xs):
    q, k, v, a = xs  # (H / n, n, T, D) and the sequence's (Tq | 1, Tk) mask
    block = lambda qkv: _attend(*(x[None] for x in qkv), a[None], scale)[0]
    return jax.lax.map(block, (q, k, v))

  out = jax.lax.map(one_sequence, (split(qh), split(kh), split(vh), allowed))
  return out.reshape(batch, heads, seq_q, head_dim)


@functools.partial(jax.custom_vjp, nondiff_argnums=(8, 9, 10))
def _attention(qh, kh, vh, allowed, row_real, xi, seed, bias, uniform, scale, rate):
  # Inference (no gradient taken): one T x T pass fewer than the training forward, and in
  # cache-sized blocks on CPU when the scores are large (dropout keeps the whole tensor).
  per_block = _heads_per_block(*qh.shape[:3], kh.shape[2], qh.dtype.itemsize)
  plain = rate == 0 and bias is None and kh.shape[1] == qh.shape[1]
  if plain and per_block is not None:
    o = _attend_blocked(qh, kh, vh, allowed, scale, per_block)
    return _mix(o, vh, allowed, row_real, xi, None, uniform, qh.dtype)[0]
  p, inv = _scores(qh, kh, allowed, scale, bias)
  mult = _drop_multiplier(seed, p, rate)
  o = _pv(p if mult is None else p * mult, vh) * inv
  return _mix(o, vh, allowed, row_real, xi, mult, uniform, qh.dtype)[0]


def _fwd(qh, kh, vh, allowed, row_real, xi, seed, bias, uniform, scale, rate):
  out, res = _forward(qh, kh, vh, allowed, row_real, xi, seed, bias, uniform, scale, rate)
  return out, (res, allowed, row_real, seed, bias)


def _bwd(uniform, scale, rate, saved, dout):
  (qh, kh, vh, p, o, u, u_mat, real, x), allowed, row_real, seed, bias = saved
  groups = kh.shape[1]
  mult = _drop_multiplier(seed, p, rate)  # recomputed from the seed, not stored
  g = dout * real  # (B, H, Tq, D)
  if uniform:
    dxi = (g * (o - u)).sum((2, 3))
    du = (1.0 - x) * g
  else:
    dxi = (g * o).sum((2, 3))
  do = x * g
  dv = _to_keys(p if mult is None else p * mult, do, groups)
  if uniform and mult is None:
    dv = dv + jnp.einsum("bqk,bgrqd->bgkd", u_mat, _grouped(du, groups))
  elif uniform:
    dv = dv + _to_keys(u_mat[:, None] * mult, du, groups)
  if groups == qh.shape[1]:
    dp = jnp.einsum("bhqd,bhkd->bhqk", do, vh)
  else:
    dp = _ungrouped(jnp.einsum("bgrqd,bgkd->bgrqk", _grouped(do, groups), vh))
  if mult is not None:
    dp = dp * mult
  delta = (do * o).sum(-1, keepdims=True)  # (B, H, Tq, 1)
  ds_raw = p * (dp - delta)  # dL/dS for S = scale * q.k + bias
  ds = ds_raw * scale
  if groups == qh.shape[1]:
    dq = jnp.einsum("bhqk,bhkd->bhqd", ds, kh)
  else:
    dq = _ungrouped(jnp.einsum("bgrqk,bgkd->bgrqd", _grouped(ds, groups), kh))
  dk = _to_keys(ds, qh, groups)
  dbias = None if bias is None else (ds_raw.sum(0) if bias.ndim == 3 else ds_raw)
  zero = lambda a: None if a is None else jnp.zeros(a.shape, jax.dtypes.float0)
  return dq, dk, dv, zero(allowed), zero(row_real), dxi, zero(seed), dbias


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
  bias=None,
):
  """Attention of `(batch, seq, heads, head_dim)` inputs with a lean custom backward.

  Args:
    q: `(batch, seq_q, heads, head_dim)`.
    k, v: `(batch, seq_k, kv_heads, head_dim)`, kv_heads dividing heads.
    allowed: bool `(batch, seq_q, seq_k)`: which keys each query may attend to, or
      `(batch, 1, seq_k)` when that depends on the key alone.
    row_real: bool `(batch, seq_q)`: real query rows (others give zeros).
    head_mask: float `(batch, heads)` (already broadcast) or None; differentiable.
    ablation: "scale" or "uniform".
    scale: logit scale; None means `1 / sqrt(head_dim)`.
    dropout_rate: static attention dropout rate in [0, 1) (validated by the caller).
    dropout_seed: int32 scalar seed (`kernels.dropout.seed_to_int32`) when dropout_rate > 0.
    bias: a `PositionBias`, a `DisentangledBias` (which also sets the default scale) or None.

  Returns:
    `(batch, seq_q, heads, head_dim)` in q's dtype; equal to `reference_attention`.
  """
  batch, _, heads, head_dim = q.shape
  scale = default_scale(bias, head_dim, scale)
  dtype = jnp.promote_types(q.dtype, jnp.float32)
  xi = jnp.ones((batch, heads), dtype) if head_mask is None else head_mask.astype(dtype)
  # Casts outside the custom VJP, so autodiff casts the cotangents back.
  rate = float(dropout_rate)
  seed = None if rate == 0 else drop.seed_to_int32(dropout_seed)
  # Heads lead the batch axes inside: XLA:CPU's batched matmuls want (B, H, T, D), and
  # the transposes here cost far less than strided dots (measured: 58 -> 20 ms for
  # batch 32 x 128, 12 heads of 32, on the 2-core AVX-512 CPU).
  heads_first = lambda a: jnp.swapaxes(a.astype(dtype), 1, 2)
  # Outside the custom VJP: autodiff takes the bias' gradient on to q, k and its tables.
  bias_values = bias_scores(bias, q, k, dtype)
  out = _attention(
    heads_first(q),
    heads_first(k),
    heads_first(v),
    allowed,
    row_real,
    xi,
    seed,
    bias_values,
    ablation == "uniform",
    scale,
    rate,
  )
  return jnp.swapaxes(out, 1, 2).astype(q.dtype)


def attention_probs(q, k, *, allowed, row_real, scale=None, bias=None):
  """The attention probabilities `(batch, heads, seq_q, seq_k)`, computed as the forward does.

  Same values as `reference_attention(..., return_probs=True)` without a head mask
  (padded rows are zero), through the heads-first, additive-bias formulation above;
  plain jnp ops, so autodiff differentiates it.

  Args:
    q: `(batch, seq_q, heads, head_dim)`.
    k: `(batch, seq_k, heads, head_dim)`.
    allowed: bool `(batch, seq_q | 1, seq_k)`.
    row_real: bool `(batch, seq_q)`.
    scale: logit scale; None means `1 / sqrt(head_dim)`.
    bias: a `PositionBias`, a `DisentangledBias` (which also sets the default scale) or None.
  """
  dtype = jnp.promote_types(q.dtype, jnp.float32)
  scale = default_scale(bias, q.shape[-1], scale)
  qh, kh = (jnp.swapaxes(a.astype(dtype), 1, 2) for a in (q, k))
  bias_values = bias_scores(bias, q, k, dtype)
  p, inv = _scores(qh, kh, allowed, scale, bias_values)
  real = (row_real & allowed.any(-1))[:, None, :, None].astype(dtype)
  return p * (inv * real)
