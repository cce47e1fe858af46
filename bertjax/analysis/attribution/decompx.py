"""DecompX: every token's representation decomposed by input token, through whole blocks.

Modarressi, Fayyaz, Aghazadeh, Yaghoobzadeh & Pilehvar 2023 ("DecompX: Explaining
Transformers Decisions by Propagating Token Decomposition", ACL). Each token's state is kept
as a sum of one vector per input token, `x_i = sum_k x_{i<-k}`, and every operation of the
block is applied to the parts (the released code, `mohsenfayyaz/DecompX`, `src/
modeling_bert.py` with `DecompXConfig(aggregation="vector")`, is the reference: the
parts carried from block to block, as the paper describes; the released default,
`aggregation=None`, decomposes each block on its own input and carries nothing across
blocks, so its last-layer parts are not this function's; every other field at its
default):

- attention: the value projection and the heads' output projection are linear and the
  attention weights are the model's own, `a_{i<-k} = sum_h sum_j alpha_hij x_{j<-k} W_V^h W_O^h`,
  plus the residual part `x_{i<-k}`; in the first block, where the parts are the embedding
  outputs themselves (`x_{j<-k} = 0` for j != k), the value bias travels with its token
  (`alpha_hik (x_k W_V^h + b_V^h) W_O^h`) as the released code's first layer does;
- LayerNorm: `(p - mean p) * gamma / std(x)`, the statistics of the real state `x`;
- the FFN: both linear layers on the parts, the activation linearised through the origin
  per neuron (`f(z) / z`, "GeLU_ZO"), which the parts share;
- each bias (the attention output's, in later blocks with `sum_h b_V^h W_O^h`, the
  LayerNorm's beta, the FFN's two) split among the parts by `|p . b|` ("absdot"; the
  other conventions of the released code by `bias_decomp`);
- a classifier head the same way: BERT's pooler (tanh linearised through the origin) and
  linear classifier, or the two-layer heads of RoBERTa, ELECTRA, DistilBERT and MPNet.

With biases the parts sum to the real state exactly (the linearisations are exact at the
point they are taken), so per-token contributions to a logit sum to the logit. Served:
post-LayerNorm blocks with an ungated FFN (BERT, RoBERTa, XLM-R, ALBERT, ELECTRA, DistilBERT,
MPNet, DeBERTa); pre-LN and gated blocks are refused by name.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.analysis.attribution.common import analysis_dtype, captured_sites, real_tokens
from bertjax.model.config import BertConfig
from bertjax.model.heads import head_activation, head_reads
from bertjax.model.input_checks import check_inputs
from bertjax.model.layers import activation

Params = dict[str, Any]
BIAS_DECOMPOSITIONS = ("absdot", "abssim", "norm", "equal", "cls", "dot")
ZO_EPS = 1e-12  # the released code's `output / (input + 1e-12)`


class DecompX(NamedTuple):
  """What `decompx` returns.

  Attributes:
    parts: (batch, seq, seq, hidden): `[b, i, k]` is input token k's part of token i's final
      state; summed over k it is the final state (with biases). Zero at padded i or k.
    logits: (batch, seq, num_labels): each input token's part of each class logit (it sums
      over tokens to the logits), with `head="classifier"`; else None.
  """

  parts: jax.Array
  logits: jax.Array | None


def check_supported(config: BertConfig, head: str | None = None) -> None:
  """Raises ValueError for a block or head DecompX's derivation does not cover."""
  fam = config.family
  if fam.norm != "post" or fam.norm_kind != "layernorm":
    raise ValueError(
      f"decompx is derived for post-LayerNorm blocks; a {config.model_type} "
      f"block is {fam.norm}-norm with {fam.norm_kind}"
    )
  if fam.ffn == "gated":
    raise ValueError(
      f"decompx linearises one activation per neuron; a {config.model_type} "
      f"FFN is {fam.ffn} (a product of two decomposed vectors)"
    )
  if config.kv_heads != config.num_attention_heads:
    raise ValueError("decompx needs one value head per attention head")
  if config.quantize is not None:
    raise ValueError(f"decompx needs the float forward pass; got quantize={config.quantize!r}")
  if head not in (None, "classifier"):
    raise ValueError(f"head={head!r} must be None or 'classifier'")
  if head == "classifier":
    reads = head_reads(config, "classifier")
    spec = fam.heads["classifier"]
    if reads not in ("pooled", "first") or spec.has("norm"):
      raise ValueError(
        f"decompx decomposes classifiers on the pooler or the first token; "
        f"{config.model_type}'s reads {reads!r}"
      )


def decompx(
  params: Params,
  config: BertConfig,
  input_ids,
  attention_mask=None,
  token_type_ids=None,
  *,
  head: str | None = None,
  include_biases: bool = True,
  bias_decomp: str = "absdot",
) -> DecompX:
  """DecompX (Modarressi et al. 2023): final states and logits decomposed by input token.

  Args:
    params, config: the model (post-LN, ungated FFN; see the module docstring).
    input_ids, attention_mask, token_type_ids: (batch, seq) as for `bertjax.forward`.
    head: None, or "classifier" to carry the decomposition through the sequence
      classifier (`params` must have it) to each class logit.
    include_biases: split every bias among the parts (False leaves biases out, so the
      parts no longer sum to the states).
    bias_decomp: how a bias is split: "absdot" (by `|p . b|`, the paper's), "abssim"
      (|cosine|), "norm" (`||p||`), "equal" (among non-zero parts), "cls" (all to the first
      token) or "dot" (signed `p . b`).

  Returns:
    A `DecompX`.
  """
  check_supported(config, head)
  check_inputs(config, input_ids, attention_mask, token_type_ids)
  if bias_decomp not in BIAS_DECOMPOSITIONS:
    raise ValueError(f"bias_decomp={bias_decomp!r} must be one of {BIAS_DECOMPOSITIONS}")
  if head == "classifier" and "classifier" not in params:
    raise ValueError("head='classifier' needs params with a classifier head")
  return _decompx(
    params,
    config,
    input_ids,
    real_tokens(input_ids, attention_mask),
    token_type_ids,
    head,
    include_biases,
    bias_decomp,
  )


def _split_bias(parts, bias, kind: str, include: bool):
  """`parts` (..., K, F) plus `bias` (F,) or (..., F) split among the K parts."""
  if not include:
    return parts
  bias = jnp.broadcast_to(bias, parts.shape[:-2] + parts.shape[-1:])
  b = bias[..., None, :]
  if kind == "absdot":
    w = jnp.abs((parts * b).sum(-1))
  elif kind == "dot":
    w = (parts * b).sum(-1)
  elif kind == "abssim":
    norms = jnp.linalg.norm(parts, axis=-1)
    cos = (parts * b).sum(-1) / jnp.maximum(norms * jnp.linalg.norm(b, axis=-1), 1e-8)
    w = jnp.abs(cos) * (norms != 0)
  elif kind == "norm":
    w = jnp.linalg.norm(parts, axis=-1)
  elif kind == "equal":
    w = (jnp.linalg.norm(parts, axis=-1) != 0).astype(parts.dtype)
  else:  # "cls"
    w = jnp.zeros(parts.shape[:-1], parts.dtype).at[..., 0].set(1)
  w = w / (w.sum(-1, keepdims=True) + 1e-12)
  return parts + w[..., None] * b


def _layer_norm_parts(parts, state, scale, bias, eps, kind, include):
  """LayerNorm of a decomposed state: each part centred and scaled by the real state's std."""
  var = jnp.square(state - state.mean(-1, keepdims=True)).mean(-1, keepdims=True)
  normed = (parts - parts.mean(-1, keepdims=True)) / jnp.sqrt(var + eps)[..., None, :] * scale
  return _split_bias(normed, bias, kind, include)


def _zo(parts, pre, post):
  """An activation linearised through the origin: the parts times `f(z) / z` per unit."""
  return parts * (post / (pre + ZO_EPS))[..., None, :]


def _stacked(config: BertConfig, params: Params, dtype) -> dict[str, jax.Array]:
  """Each block's value, output, LayerNorm and FFN weights, stacked over depth (pruned heads
  scattered back as zeros; ALBERT blocks take their group's)."""
  layers = params["encoder"]["layers"]
  n, d, h = config.num_attention_heads, config.head_dim, config.hidden_size
  zeros = lambda *shape: jnp.zeros(shape, dtype)

  def pick(p, block):
    a = p["attention"]
    wv, wo = a["value"]["kernel"], a["output"]["kernel"]  # (H, N', D), (N', D, H)
    bv = a["value"].get("bias", zeros(wv.shape[1], d))
    if config.is_pruned:
      kept = np.asarray(config.kept_heads(block), np.int32)
      wv = zeros(h, n, d).at[:, kept].set(wv)
      bv = zeros(n, d).at[kept].set(bv)
      wo = zeros(n, d, h).at[kept].set(wo)
    return {
      "wv": wv,
      "bv": bv,
      "wo": wo,
      "bo": a["output"].get("bias", zeros(h)),
      "ln1_scale": a["LayerNorm"]["scale"],
      "ln1_bias": a["LayerNorm"].get("bias", zeros(h)),
      "w1": p["intermediate"]["kernel"],
      "b1": p["intermediate"].get("bias", zeros(config.intermediate_size)),
      "w2": p["output"]["kernel"],
      "b2": p["output"].get("bias", zeros(h)),
      "ln2_scale": p["LayerNorm"]["scale"],
      "ln2_bias": p["LayerNorm"].get("bias", zeros(h)),
    }

  if isinstance(layers, list):
    per_block = [pick(layers[b], b) for b in range(config.depth)]
  else:
    per_block = [
      pick(jax.tree.map(lambda a, i=i: a[i], layers), b)
      for b, i in enumerate(config.layer_param_index)
    ]
  return jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x, dtype) for x in xs]), *per_block)


@functools.partial(jax.jit, static_argnums=(1, 5, 6, 7))
def _decompx(params, config, input_ids, mask, token_type_ids, head, include, kind):
  cache = captured_sites(
    params,
    config,
    input_ids,
    mask,
    token_type_ids,
    ("embeddings", "probs", "resid_mid", "mid", "ffn_act", "resid_out", "out"),
  )
  dtype = analysis_dtype(config)
  w = _stacked(config, params, dtype)
  eps = config.layer_norm_eps
  seq = input_ids.shape[1]
  real = mask.astype(dtype)
  keep = real[:, :, None, None] * real[:, None, :, None]  # real (i, k) pairs

  def block(parts, xs, first: bool):
    p, probs, resid_mid, mid, ffn_act, resid_out = xs
    if first:  # parts = diag(x): the value bias travels with its token (released layer 1)
      x = jnp.einsum("bikh->bih", parts)
      f = jnp.einsum("bjh,hnd->bnjd", x, p["wv"]) + p["bv"][None, :, None, :]
      f = jnp.einsum("bnjd,ndh->bnjh", f, p["wo"])
      attn = jnp.einsum("bnij,bnjh->bijh", probs, f)
      bias = p["bo"]
    else:
      v = jnp.einsum("bjkh,hnd->bjknd", parts, p["wv"])
      mixed = jnp.einsum("bnij,bjknd->biknd", probs, v)
      attn = jnp.einsum("biknd,ndh->bikh", mixed, p["wo"])
      bias = jnp.einsum("nd,ndh->h", p["bv"], p["wo"]) + p["bo"]
    res = _split_bias(attn + parts, bias, kind, include)
    ln1 = _layer_norm_parts(res, resid_mid, p["ln1_scale"], p["ln1_bias"], eps, kind, include)
    pre = mid @ p["w1"] + p["b1"]  # the FFN's pre-activation (B, T, I)
    z = _split_bias(jnp.einsum("bikh,hf->bikf", ln1, p["w1"]), p["b1"], kind, include)
    ffn = _split_bias(
      jnp.einsum("bikf,fh->bikh", _zo(z, pre, ffn_act), p["w2"]), p["b2"], kind, include
    )
    out = _layer_norm_parts(ln1 + ffn, resid_out, p["ln2_scale"], p["ln2_bias"], eps, kind, include)
    return out * keep

  xs = (
    w,
    cache["probs"].astype(dtype),
    cache["resid_mid"].astype(dtype),
    cache["mid"].astype(dtype),
    cache["ffn_act"].astype(dtype),
    cache["resid_out"].astype(dtype),
  )
  emb = cache["embeddings"].astype(dtype)
  parts = jnp.eye(seq, dtype=dtype)[None, :, :, None] * emb[:, :, None, :] * keep
  parts = block(parts, jax.tree.map(lambda a: a[0], xs), True)
  if config.depth > 1:
    parts, _ = jax.lax.scan(
      lambda c, x: (block(c, x, False), None), parts, jax.tree.map(lambda a: a[1:], xs)
    )
  logits = None
  if head == "classifier":
    logits = (
      _classifier_parts(params, config, parts, cache["out"][-1].astype(dtype), kind, include)
      * real[:, :, None]
    )
  return DecompX(parts, logits)


def _classifier_parts(params, config, parts, last, kind, include):
  """The first token's parts through the sequence classifier: (B, K, num_labels)."""
  dtype = parts.dtype
  x, h0 = parts[:, 0], last[:, 0]  # (B, K, H), (B, H)

  def dense(p, x, h):
    kernel = jnp.asarray(p["kernel"], dtype)
    b = jnp.asarray(p.get("bias", jnp.zeros(kernel.shape[-1])), dtype)
    return _split_bias(x @ kernel, b, kind, include), h @ kernel + b

  if head_reads(config, "classifier") == "pooled":
    x, pre = dense(params["pooler"]["dense"], x, h0)
    x, h0 = _zo(x, pre, jnp.tanh(pre)), jnp.tanh(pre)
  spec = config.family.heads["classifier"]
  c = params["classifier"]
  if spec.has("pre"):
    x, pre = dense(c["pre"], x, h0)
    post = activation(head_activation(config, spec.act))(pre)
    x, h0 = _zo(x, pre, post), post
  x, _ = dense(c["dense"], x, h0)
  return x
