"""A float64 NumPy reference of one post-LN encoder block, written from the BERT paper.

Independent of the Flax modules; the tests that check the model, its head masks, attention
overrides and effective attention against a hand computation share it. Parameters are one
layer's slice of `params["encoder"]["layers"]` (`layer_params`).
"""

from collections.abc import Callable

import jax
import numpy as np


def float64(tree):
  """Every leaf of a pytree as a float64 NumPy array."""
  return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


def layer_params(params, layer: int):
  """Block `layer`'s parameters (the stacked `encoder/layers` sliced), float64."""
  return jax.tree.map(lambda a: np.asarray(a[layer], np.float64), params["encoder"]["layers"])


def layer_norm(x, p, eps: float):
  """LayerNorm over the last axis with `p["scale"]`, `p["bias"]`."""
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def gelu(x):
  """The exact (erf) GELU."""
  from scipy.special import erf

  return 0.5 * x * (1 + erf(x / np.sqrt(2)))


def attention_probs(p, x, mask):
  """Self-attention maps (B, N, T, T) and values (B, T, N, D) of block params `p` on x (B, T, H)."""
  a = p["attention"]
  q = np.einsum("bth,hnd->btnd", x, a["query"]["kernel"]) + a["query"]["bias"]
  k = np.einsum("bth,hnd->btnd", x, a["key"]["kernel"]) + a["key"]["bias"]
  v = np.einsum("bth,hnd->btnd", x, a["value"]["kernel"]) + a["value"]["bias"]
  s = np.einsum("bqnd,bknd->bnqk", q, k) / np.sqrt(q.shape[-1])
  s = np.where(mask[:, None, None, :] > 0, s, -np.inf)
  probs = np.exp(s - s.max(-1, keepdims=True))
  return probs / probs.sum(-1, keepdims=True), v


def after_attention(p, x, attention_output, eps: float):
  """The rest of the block from the attention output (B, T, H), output bias included:
  residual + LayerNorm, the GELU feed-forward, residual + LayerNorm."""
  h = layer_norm(x + attention_output, p["attention"]["LayerNorm"], eps)
  y = gelu(h @ p["intermediate"]["kernel"] + p["intermediate"]["bias"])
  y = y @ p["output"]["kernel"] + p["output"]["bias"]
  return layer_norm(h + y, p["LayerNorm"], eps)


def encoder_layer(
  p, x, mask, eps: float, xi=None, head_ablation: str = "scale", edit_probs: Callable | None = None
):
  """One block: `(output (B, T, H), probs (B, N, T, T))`.

  Args:
    p: the block's parameters (`layer_params`).
    x: its input (B, T, H).
    mask: (B, T), 1 at real tokens.
    eps: the LayerNorm epsilon.
    xi: (heads,) head mask or None; "scale" multiplies head h's map by xi_h, "uniform"
      mixes it with the uniform map over real keys, `xi A + (1 - xi) U`.
    head_ablation: "scale" or "uniform".
    edit_probs: a function of the maps returning new maps (an attention override).
  """
  probs, v = attention_probs(p, x, mask)
  if xi is not None:
    xi = xi[None, :, None, None]
    if head_ablation == "scale":
      probs = xi * probs
    else:
      uniform = np.broadcast_to(
        mask[:, None, None, :] / mask.sum(-1)[:, None, None, None], probs.shape
      )
      probs = xi * probs + (1 - xi) * uniform
  if edit_probs is not None:
    probs = edit_probs(probs)
  a = p["attention"]
  ctx = np.einsum("bnqk,bknd->bqnd", probs, v)
  h = np.einsum("bqnd,ndh->bqh", ctx, a["output"]["kernel"]) + a["output"]["bias"]
  return after_attention(p, x, h, eps), probs
