"""Post-training dynamic int8 quantisation of the linear layers (Q8BERT-style).

`BertConfig(quantize="int8")` makes every `nn.Dense` / `nn.DenseGeneral` of the model
(attention projections, attention output, FFN, embedding projection, pooler, head
transforms) multiply through `int8_dot_general`:

* weights: symmetric int8 per output channel, ``s_w[j] = max_i |W[i, j]| / 127``,
  ``W_q = round(W / s_w)`` (quantised on the fly from the float32 parameters, which are
  unchanged);
* activations: symmetric int8 per token (per row of the input), ``s_x[t] = max_i |x[t,
  i]| / 127``, computed at run time (dynamic);
* ``jax.lax.dot_general`` on the int8 operands with ``preferred_element_type=int32``
  (exact integer accumulation), then dequantised: ``y = (x_q @ W_q) * s_x * s_w`` in
  float32, plus the float bias.

Embedding lookups, LayerNorm, softmax, the attention products and the tied MLM decoder
stay in floating point (the decoder is a matmul with the embedding table, not a Dense).
No maintained JAX quantisation library was installed here (AQT is published as
``aqtp`` and Qwix as ``qwix``); this is plain ``jax.lax``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp

QUANTIZE_MODES = ("int8",)


def quantize_symmetric(x: jax.Array, axes: Sequence[int]) -> tuple[jax.Array, jax.Array]:
  """Symmetric int8 quantisation with one scale per slice over `axes`.

  Args:
    x: a float array.
    axes: the axes each scale covers (reduced with max |x|).

  Returns:
    ``(q, scale)``: int8 ``q`` in [-127, 127] with ``x ~ q * scale``; float32 ``scale``
    with `axes` kept as size 1 (an all-zero slice gets scale 1).
  """
  x = x.astype(jnp.float32)
  amax = jnp.max(jnp.abs(x), axis=tuple(axes), keepdims=True)
  scale = jnp.where(amax > 0, amax * jnp.float32(1 / 127), 1.0)
  q = jnp.clip(jnp.round(x / scale), -127, 127).astype(jnp.int8)
  return q, scale


def int8_dot_general(
  lhs: jax.Array, rhs: jax.Array, dimension_numbers, precision=None, preferred_element_type=None
) -> jax.Array:
  """`jax.lax.dot_general` through int8: per-row activations, per-output-channel weights.

  A drop-in ``dot_general`` for `flax.linen.Dense` / `DenseGeneral` (lhs: the input,
  rhs: the kernel). Batch dimensions are not supported (the Dense layers have none).

  Returns:
    The dequantised product, in lhs's dtype.
  """
  del precision  # integer products are exact
  (lc, rc), (lb, rb) = dimension_numbers
  if lb or rb:
    raise ValueError(f"int8_dot_general takes no batch dimensions; got {lb=}, {rb=}")
  lq, ls = quantize_symmetric(lhs, lc)  # ls: lhs shape with contracting axes -> 1
  rq, rs = quantize_symmetric(rhs, rc)
  acc = jax.lax.dot_general(lq, rq, dimension_numbers, preferred_element_type=jnp.int32)
  # Output axes: lhs's free axes, then rhs's free axes.
  ls = jnp.squeeze(ls, axis=tuple(lc))
  rs = jnp.squeeze(rs, axis=tuple(rc))
  ls = ls.reshape(ls.shape + (1,) * rs.ndim)
  y = acc.astype(jnp.float32) * ls * rs
  out_dtype = preferred_element_type or lhs.dtype
  return y.astype(out_dtype)


def int8_matmul(x: jax.Array, w: jax.Array) -> jax.Array:
  """``x @ w`` (x: (..., K), w: (K, N)) through `int8_dot_general`."""
  return int8_dot_general(x, w, (((x.ndim - 1,), (0,)), ((), ())))


def _contracted(path: tuple[str, ...], shape: tuple[int, ...]) -> int:
  """The contracted size of a Dense kernel (its input width), the layer axis stripped."""
  if path[:2] == ("encoder", "layers"):
    shape = shape[1:]  # (layers, ...) stacked
  if len(shape) == 3 and shape[0] * shape[1] == shape[2]:
    return shape[0] * shape[1]  # attention output (heads, head_dim, hidden)
  return shape[0]  # (in, out) and q/k/v (hidden, heads, head_dim)


def weight_bytes(params, int8: bool = False) -> int:
  """Bytes of a model's weights: all float32, or (`int8`) with every Dense kernel stored as
  int8 plus a float32 scale per output channel, as `quantize="int8"` quantises them
  (embeddings, norms and biases stay float32)."""
  total = 0
  for path, a in jax.tree_util.tree_leaves_with_path(params):
    keys = tuple(str(getattr(k, "key", k)) for k in path)
    n = math.prod(a.shape)
    if int8 and keys[-1] == "kernel":
      total += n + 4 * (n // _contracted(keys, a.shape))
    else:
      total += 4 * n
  return total
