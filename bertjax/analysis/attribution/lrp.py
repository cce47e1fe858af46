"""AttnLRP: relevance of every token and every internal unit in one backward pass.

Achtibat et al. 2024 ("AttnLRP: Attention-Aware Layer-Wise Relevance Propagation for
Transformers", ICML) propagate a target logit back through the network with one rule per
operation, written as a modified gradient so that `x * grad` at any input or activation is
its relevance (the released code, `rachtibat/LRP-eXplains-Transformers`, `lxt.efficient`,
does it the same way; its BERT is the reference in `tests/test_lrp.py`):

- linear layers, the residual sums and rotary positions: the plain gradient (the epsilon
  rule with epsilon -> 0; a layer's bias absorbs its share);
- LayerNorm and RMSNorm: the identity rule, with the 1 / std (1 / rms) factor a constant in
  the backward pass (`layers.Norm(detach_scale=True)`);
- element-wise activations (GELU, SiLU, tanh of the pooler): the identity rule, the
  gradient `f(x) / x` (`layers.identity_rule`);
- the two products of attention, `q k^T` and `probs v`, and a gated FFN's `act(g) * u`: the
  uniform rule, half of the relevance to each factor (`layers.divide_gradient`);
- softmax: its plain gradient, which in gradient x input form is the paper's rule
  `R_i = x_i (R_i' - s_i sum_j R_j')`;
- dropout off.

The rules are switched on by `config.relevance_rules = "attnlrp"`: the forward values are the
model's own, only the backward pass changes, on every attention implementation (the
kernels' exact gradient of softmax is the rule). Relevance is conserved by every rule but
softmax's, and biases keep theirs: `tokens + positions + token_types` plus what the biases
absorb (`biases=True`) equals the target up to softmax's part (`Relevance.absorbed` is the
two together).

`rules="cp-lrp"` keeps every rule above but treats the attention weights as constants (q,
k and the position-bias table detached; a gated FFN's gate too), as CP-LRP (Ali et al. 2022,
"XAI for Transformers: Better Explanations through Conservative Propagation"; `lxt`'s
`cp_LRP`): no relevance flows through softmax, and inputs plus biases equal the target
exactly.

Supported: every family but DeBERTa, whose content-to-position terms are products of one
content factor with a learned table, not of two inputs (the uniform rule on `q` would halve
them wrongly); int8 forward passes are refused too (their backward pass is not the rule's).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from bertjax.analysis.attribution.common import real_tokens
from bertjax.model.config import BertConfig
from bertjax.model.forward import BertOutput, embed, forward
from bertjax.model.heads import head_logits, mlm_logits
from bertjax.model.input_checks import check_inputs
from bertjax.model.layers import accum_dtype, position_ids, word_scale
from bertjax.model.sites import HEAD_AXIS, block_sites, site_shape

Params = dict[str, Any]
RULES = ("attnlrp", "cp-lrp", "gradient")
# `(params, config, out) -> (batch,)`: `config` is the model's with the rules switched on, and
# heads must be computed with it (a head run with another config backpropagates exactly).
TargetFn = Callable[[Params, BertConfig, BertOutput], jax.Array]


class Relevance(NamedTuple):
  """What `attnlrp` returns; (batch, seq) but where said.

  Attributes:
    tokens: each token's word embedding's relevance, `sum_e w_e * grad_e` (the released
      code's readout, `inputs_embeds * inputs_embeds.grad`).
    positions: each position embedding's relevance (zeros for rotary and relative families).
    token_types: each token-type embedding's relevance (zeros without token types).
    target: (batch,) the target, `target_fn`'s value.
    absorbed: (batch,) `target - sum(tokens + positions + token_types)`: the biases' share
      and what the softmax rule does not conserve.
    biases: (batch,) the biases' share (every `bias` parameter and relative-position table,
      per example), with `biases=True`; else None.
    sites: {site: relevance} for each site asked for, `value * grad` at the site, in the
      site's stacked shape (`bertjax.site_shape`): "ffn_act" gives every FFN neuron's.
  """

  tokens: jax.Array
  positions: jax.Array
  token_types: jax.Array
  target: jax.Array
  absorbed: jax.Array
  biases: jax.Array | None
  sites: dict[str, jax.Array]


def check_supported(config: BertConfig) -> None:
  """Raises ValueError for a config AttnLRP's rules do not cover (see the module docstring)."""
  if config.disentangled_terms:
    raise ValueError(
      f"attnlrp does not support model_type={config.model_type!r}: its "
      "content-to-position scores multiply one input-dependent factor by a "
      "learned table, which the uniform rule on q k^T would halve wrongly"
    )
  if config.quantize is not None:
    raise ValueError(f"attnlrp needs the float forward pass; got quantize={config.quantize!r}")


def attnlrp(
  params: Params,
  config: BertConfig,
  input_ids,
  attention_mask=None,
  token_type_ids=None,
  *,
  target_fn: TargetFn,
  sites=(),
  biases: bool = False,
  rules: str = "attnlrp",
) -> Relevance:
  """AttnLRP relevance of a target for every token (and every unit of `sites`).

  Args:
    params, config: the model (any family but DeBERTa; see the module docstring).
    input_ids, attention_mask, token_type_ids: (batch, seq) as for `bertjax.forward`.
    target_fn: `(params, config, out: BertOutput) -> (batch,)`: the explained value of
      each sequence, e.g. `head_logit("classifier", 1)` or `token_logit(positions, ids)`
      (the paper explains logits). Compute any head with the `config` it is given: that
      one has the rules on. A new function object compiles anew: define it once.
    sites: block site names (`bertjax.SITES`) whose relevance to return as well.
    biases: also return the biases' share per example; this costs one backward pass per
      sequence (the parameters are shared by the batch).
    rules: "attnlrp" (the paper's), "cp-lrp" (attention weights held constant) or
      "gradient" (no rules: plain gradient x input on the same inputs, for comparison).

  Returns:
    A `Relevance`.
  """
  check_supported(config)
  if rules not in RULES:
    raise ValueError(f"rules={rules!r} must be one of {RULES}")
  check_inputs(config, input_ids, attention_mask, token_type_ids)
  sites = tuple(sites)
  for site in sites:
    if site not in block_sites(config):
      raise ValueError(
        f"site {site!r} is not a block site of {config.model_type}; expected "
        f"some of {block_sites(config)}"
      )
    if config.is_pruned and site in HEAD_AXIS:
      raise ValueError(
        f"site {site!r} has a head axis, which a pruned model's blocks do not "
        "keep whole; ask for it on the unpruned model with a head mask"
      )
  if token_type_ids is None:
    token_type_ids = jnp.zeros_like(jnp.asarray(input_ids))
  rules_config = dataclasses.replace(config, relevance_rules=None if rules == "gradient" else rules)
  return _attnlrp(
    params,
    rules_config,
    jnp.asarray(input_ids),
    real_tokens(input_ids, attention_mask),
    jnp.asarray(token_type_ids),
    target_fn,
    sites,
    biases,
  )


def _is_bias(path) -> bool:
  """A bias parameter: every `bias` leaf and the relative-position bias table (MPNet)."""
  names = [str(getattr(k, "key", k)) for k in path]
  return names[-1] == "bias" or "relative_attention_bias" in names


def _split_biases(params):
  """(bias leaves by path, a function that puts them back into `params`)."""
  leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  picked = tuple(i for i, (path, _) in enumerate(leaves) if _is_bias(path))
  values = [leaf for _, leaf in leaves]

  def merge(bias_values):
    new = list(values)
    for i, v in zip(picked, bias_values):
      new[i] = v
    return jax.tree_util.tree_unflatten(treedef, new)

  return [values[i] for i in picked], merge


def _embedding_parts(params, config: BertConfig, input_ids, token_type_ids):
  """The word, position and token-type vectors each token's embedding sums, (B, T, E) each
  (zeros for a part the family does not have)."""
  emb = params["embeddings"]
  dtype = accum_dtype(config)
  word = emb["word_embeddings"]["embedding"][input_ids].astype(dtype) * word_scale(config)
  zeros = jnp.zeros_like(word)
  types = (
    emb["token_type_embeddings"]["embedding"][token_type_ids].astype(dtype)
    if config.type_vocab_size
    else zeros
  )
  positions = zeros
  if "position_embeddings" in emb and config.position_table is not None:
    positions = emb["position_embeddings"]["embedding"][position_ids(config, input_ids)].astype(
      dtype
    )
  return word, positions, types


@functools.partial(jax.jit, static_argnums=(1, 5, 6, 7))
def _attnlrp(params, config, input_ids, mask, token_type_ids, target_fn, sites, biases):
  batch, seq = input_ids.shape
  bias_values, merge = _split_biases(params)
  word, positions, types = _embedding_parts(params, config, input_ids, token_type_ids)

  def explained(offset, site_offsets, bias_values):
    p = merge(bias_values)
    x = embed(p, config, input_ids, token_type_ids, offset=offset)
    patch = {"embeddings": (x, jnp.ones((), x.dtype))}
    for site in sites:
      patch[site] = functools.partial(_plus, site_offsets[site])
    out = forward(p, config, input_ids, mask, token_type_ids, patch=patch, capture=sites)
    value = target_fn(p, config, out)
    if value.shape != (batch,):
      raise ValueError(
        f"target_fn must return one value per sequence, shape ({batch},); got shape {value.shape}"
      )
    return value, out.cache or {}

  site_offsets = {
    s: jnp.zeros(site_shape(config, s, batch, seq), accum_dtype(config)) for s in sites
  }
  value, backward, cache = jax.vjp(
    explained, jnp.zeros_like(word), site_offsets, bias_values, has_aux=True
  )
  g_offset, g_sites, _ = backward(jnp.ones_like(value))
  per_token = lambda part: (part * g_offset).sum(-1)
  tokens, pos, typ = per_token(word), per_token(positions), per_token(types)
  bias_share = None
  if biases:

    def share(seed):
      g = backward(seed)[2]
      return sum(
        (b.astype(value.dtype) * gb.astype(value.dtype)).sum() for b, gb in zip(bias_values, g)
      )

    bias_share = jax.lax.map(share, jnp.eye(batch, dtype=value.dtype))
  relevance = {s: cache[s].astype(g_sites[s].dtype) * g_sites[s] for s in sites}
  return Relevance(
    tokens=tokens,
    positions=pos,
    token_types=typ,
    target=value,
    absorbed=value - (tokens + pos + typ).sum(-1),
    biases=bias_share,
    sites=relevance,
  )


def _plus(offsets, value, layer):
  """A function patch: the site plus this layer's zero offset (its gradient is the site's)."""
  return value + offsets[layer].astype(value.dtype)


def head_logit(head: str, index, attention_mask=None) -> TargetFn:
  """A target: logit `index` (an int, or (batch,) ints) of a sequence head ("classifier",
  "nsp", "sop"); a head that pools over the tokens (ModernBERT's and EuroBERT's "mean" and
  "late") needs the batch's `attention_mask`."""

  def target(params, config, out):
    logits = head_logits(params, config, out, head, attention_mask=attention_mask)
    return logits[jnp.arange(logits.shape[0]), jnp.broadcast_to(index, logits.shape[:1])]

  return target


def token_logit(positions, token_ids) -> TargetFn:
  """A target: the MLM logit of `token_ids[b]` at `positions[b]`, (batch,) ints each."""
  positions, token_ids = jnp.asarray(positions), jnp.asarray(token_ids)

  def target(params, config, out):
    b = jnp.arange(positions.shape[0])
    return mlm_logits(params, config, out.last_hidden_state[b, positions])[b, token_ids]

  return target
