"""Direct logit attribution with frozen LayerNorm scales, for post-LN encoders.

Direct logit attribution (DLA; Elhage et al. 2021, "A mathematical framework for transformer
circuits"; TransformerLens's `decompose_resid` with `apply_ln`) splits a readout of the final
hidden state, `d . h_L[t]` for a direction d (a probe's weight, a classifier's row, the
difference of two unembedding rows), into what each component wrote: the embeddings, every
head (its context times its slice of the output projection, `head_out_h W_O^h`), every FFN
(`ffn_out`) and the biases. In a pre-LN decoder the stream is the sum of those outputs and
only the final norm's scale is frozen. In BERT and the post-LN families a LayerNorm follows
every sublayer, so the stream is no sum; with each LayerNorm's per-token scale `1 / sigma`
frozen at the run's own values, `LN(r) = g (r - mean r) / sigma + b` is affine, and `h_L`
is exactly the sum of every component carried through the LayerNorms after it (centred,
times `g / sigma`) plus the carried LayerNorm biases -- the linearisation of norm-based
attribution for these blocks (Kobayashi et al. 2021; `edges`, whose module docstring has
it too). So the parts sum to the readout exactly (`total`), up to float rounding.

The scores are computed backwards: the direction is pulled back through each frozen
LayerNorm, `u_k = (g_k u_{k+1} - mean(g_k u_{k+1})) / sigma_k` (the adjoint of the
centred scaling, per token), and each component scores `u . c` at the stage where it
enters the stream: one pass over the stages, never a carried copy per component.

Supported: the post-LN LayerNorm families (BERT, ALBERT, RoBERTa, XLM-R, ELECTRA, DistilBERT,
MPNet, NomicBERT, DeBERTa); pre-LN blocks (ModernBERT, EuroBERT) are refused by name.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.analysis.batching import as_batch
from bertjax.model.config import BertConfig
from bertjax.model.forward import embed, run_layers
from bertjax.model.layers import accum_dtype

Params = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class DLA:
  """Each component's share of `d . h_L` at the read positions, (B, P) each but where said.

  Attributes:
    embeddings: the embedding output's share.
    heads: (L, N, B, P): head h of block l (its context through its slice of W_O).
    ffn: (L, B, P): block l's FFN output (its output bias included).
    bias: every bias outside those: the attention output biases and the LayerNorm biases.
    total: `d . h_L` at the read positions; the sum of all the above.
  """

  embeddings: jax.Array
  heads: jax.Array
  ffn: jax.Array
  bias: jax.Array
  total: jax.Array

  def parts_sum(self) -> jax.Array:
    """The sum of every component's share, (B, P): `total` up to rounding."""
    return self.embeddings + self.heads.sum((0, 1)) + self.ffn.sum(0) + self.bias


def check_supported(config: BertConfig) -> None:
  """Raises a ValueError naming the family unless its blocks are post-LN LayerNorm."""
  fam = config.family
  if fam.norm != "post" or fam.norm_kind != "layernorm":
    raise ValueError(
      f"direct_logit_attribution with frozen LayerNorms is written for post-LN "
      f"LayerNorm blocks; a {config.model_type} block is {fam.norm}-norm "
      f"({fam.norm_kind})"
    )
  if config.is_pruned:
    raise ValueError(
      f"this {config.model_type} config is pruned; attribute the unpruned "
      "model with a head mask instead"
    )


def direct_logit_attribution(
  params: Params, config: BertConfig, batch, direction, *, positions=None
) -> DLA:
  """Each component's direct share of `direction . h_L` at `positions`, LayerNorms frozen.

  Args:
    params, config: a post-LN model (`check_supported`).
    batch: `input_ids`, `attention_mask` (and `token_type_ids`), (B, T).
    direction: (hidden,) the readout of the final hidden state, or (B, P, hidden) one per
      read position.
    positions: int (B, P) positions to read; None reads every position (P = T).

  Returns:
    A `DLA` whose parts sum to `total` = `direction . last_hidden_state[positions]`.
  """
  check_supported(config)
  b = as_batch(batch)
  batch_size, seq = b["input_ids"].shape
  if positions is None:
    positions = np.broadcast_to(np.arange(seq), (batch_size, seq))
  positions = np.asarray(positions)
  if positions.ndim != 2 or positions.shape[0] != batch_size:
    raise ValueError(
      f"positions shape {positions.shape} must be (batch, P) with batch={batch_size}"
    )
  if positions.size and (positions.min() < 0 or positions.max() >= seq):
    raise ValueError(f"positions must be in [0, {seq}); got {positions.min()}..{positions.max()}")
  direction = jnp.asarray(direction, accum_dtype(config))
  want = [(config.hidden_size,), positions.shape + (config.hidden_size,)]
  if direction.shape not in want:
    raise ValueError(
      f"direction shape {direction.shape} must be (hidden,) = {want[0]} or "
      f"(batch, P, hidden) = {want[1]}"
    )
  return _dla(params, config, b, direction, jnp.asarray(positions))


@jax.jit
def _take(x, positions):
  """x (..., B, T, H) at positions (B, P): (..., B, P, H)."""
  idx = jnp.broadcast_to(positions[..., None], x.shape[:-3] + positions.shape + (1,))
  return jnp.take_along_axis(x, idx, axis=-2)


def _dla(params, config, b, direction, positions) -> DLA:
  acc = accum_dtype(config)
  x = embed(params, config, b["input_ids"], b["token_type_ids"])
  run = run_layers(
    params,
    config,
    x,
    b["attention_mask"],
    capture=("head_out", "ffn_out", "resid_mid", "resid_out"),
  )
  c = run.cache
  idx = np.asarray(config.layer_param_index)
  layers = params["encoder"]["layers"]
  att = layers["attention"]
  f = lambda a: jnp.asarray(a, acc)[idx]
  gammas = jnp.stack([f(att["LayerNorm"]["scale"]), f(layers["LayerNorm"]["scale"])], 1)
  zeros = jnp.zeros((config.depth, config.hidden_size), acc)
  betas = jnp.stack(
    [
      f(att["LayerNorm"]["bias"]) if "bias" in att["LayerNorm"] else zeros,
      f(layers["LayerNorm"]["bias"]) if "bias" in layers["LayerNorm"] else zeros,
    ],
    1,
  )
  out_bias = f(att["output"]["bias"]) if "bias" in att["output"] else zeros
  wo = f(att["output"]["kernel"])  # (L, N, D, H)
  # Every LayerNorm's frozen scale at the read positions, in stream order: (L, 2, B, P).
  resid = _take(jnp.stack([c["resid_mid"], c["resid_out"]], 1).astype(acc), positions)
  centred = resid - resid.mean(-1, keepdims=True)
  sigma = jnp.sqrt((centred * centred).mean(-1) + config.layer_norm_eps)
  u = jnp.broadcast_to(direction, positions.shape + (config.hidden_size,))
  heads, ffn, bias = [], [], jnp.zeros(positions.shape, acc)
  head_out = _take(
    c["head_out"].reshape(c["head_out"].shape[:3] + (-1,)).astype(acc), positions
  )  # (L, B, P, N D)
  head_out = head_out.reshape(head_out.shape[:3] + (config.num_attention_heads, -1))
  ffn_out = _take(c["ffn_out"].astype(acc), positions)
  for layer in reversed(range(config.depth)):
    bias = bias + (u * betas[layer, 1]).sum(-1)  # the FFN LayerNorm's bias enters after it
    u = _pull_back(u, gammas[layer, 1], sigma[layer, 1])  # before the FFN LayerNorm
    ffn.append((u * ffn_out[layer]).sum(-1))
    bias = bias + (u * betas[layer, 0]).sum(-1)
    u = _pull_back(u, gammas[layer, 0], sigma[layer, 0])  # before the attention LayerNorm
    per_head = jnp.einsum("bpnd,ndh->nbph", head_out[layer], wo[layer])
    heads.append((u[None] * per_head).sum(-1))
    bias = bias + (u * out_bias[layer]).sum(-1)
  emb = (u * _take(x.astype(acc), positions)).sum(-1)
  total = (jnp.broadcast_to(direction, u.shape) * _take(run.last.astype(acc), positions)).sum(-1)
  return DLA(emb, jnp.stack(heads[::-1]), jnp.stack(ffn[::-1]), bias, total)


def _pull_back(u, gamma, sigma):
  """The adjoint of `r -> gamma (r - mean r) / sigma` per token: (B, P, H)."""
  gu = gamma * u
  return (gu - gu.mean(-1, keepdims=True)) / sigma[..., None]
