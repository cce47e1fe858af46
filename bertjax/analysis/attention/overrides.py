"""Attention overrides (Raganato et al. 2020): chosen heads' attention replaced by fixed
positional patterns, as a patch of the `probs` site (used by the ablation sweeps of
`bertjax.analysis.interventions.ablation`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.model.config import BertConfig
from bertjax.model.forward import BertOutput, forward

Params = dict[str, Any]

PATTERNS = ("prev", "next", "first", "self", "left", "right", "uniform")


def override_codes(config: BertConfig, overrides: Mapping[tuple[int, int], str]) -> np.ndarray:
  """int32 (layers, heads): the index into `PATTERNS` of each overridden head, -1 elsewhere."""
  codes = np.full((config.depth, config.num_attention_heads), -1, np.int32)
  for key, pattern in overrides.items():
    layer, head = key
    if not (0 <= layer < config.depth and 0 <= head < config.num_attention_heads):
      raise ValueError(
        f"override (layer, head)={key} is outside ({config.depth}, {config.num_attention_heads})"
      )
    if pattern not in PATTERNS:
      raise ValueError(f"override pattern {pattern!r} for {key} must be one of {PATTERNS}")
    codes[layer, head] = PATTERNS.index(pattern)
  return codes


def positional_patterns(lengths, seq_len: int) -> jax.Array:
  """The fixed maps of `PATTERNS` for right-padded sequences: (P, B, T, T), rows sum to 1.

  For a sequence of n real tokens: "prev" i -> max(i-1, 0), "next" i -> min(i+1, n-1),
  "first" i -> 0, "self" i -> i, "left" uniform over 0..i, "right" uniform over
  i..n-1, "uniform" over 0..n-1. Padded query rows are zero.
  """
  n = jnp.asarray(lengths)[:, None, None]  # (B, 1, 1)
  i = jnp.arange(seq_len)[None, :, None]
  j = jnp.arange(seq_len)[None, None, :]
  real_k = j < n
  maps = [
    j == jnp.maximum(i - 1, 0),
    j == jnp.minimum(i + 1, n - 1),
    j == 0,
    j == i,
    (j <= i) & real_k,
    (j >= i) & real_k,
    real_k & (i >= 0),
  ]
  maps = jnp.stack([jnp.broadcast_to(m, (n.shape[0], seq_len, seq_len)) for m in maps])
  maps = maps.astype(jnp.float32)
  maps = maps / jnp.maximum(maps.sum(-1, keepdims=True), 1.0)
  return maps * (i < n)[None]


def override_patch(codes, lengths, seq_len: int):
  """The `probs` patch that replaces each overridden head's attention by its pattern.

  Args:
    codes: int (layers, heads) from `override_codes` (-1: keep the model's attention).
    lengths: int (batch,) real lengths (right padding).
    seq_len: the padded length.

  Returns:
    `{"probs": (value, weight)}` for `bertjax.forward(..., patch=...)`: value
    (layers, batch, heads, T, T), weight (layers, 1, heads, 1, 1) in {0, 1}.
  """
  codes = jnp.asarray(codes)
  patterns = positional_patterns(lengths, seq_len)  # (P, B, T, T)
  value = jnp.moveaxis(patterns[jnp.maximum(codes, 0)], 2, 1)  # (L, B, N, T, T)
  weight = (codes >= 0).astype(jnp.float32)[:, None, :, None, None]
  return {"probs": (value, weight)}


def forward_with_overrides(
  params: Params,
  config: BertConfig,
  input_ids,
  attention_mask=None,
  token_type_ids=None,
  *,
  overrides=None,
  output_hidden_states: bool = False,
  output_attentions: bool = False,
) -> BertOutput:
  """`forward` with chosen heads' attention replaced by fixed positional patterns.

  A patch of the `probs` site (`override_patch`), so it runs the model's own
  layer, pruned models included.

  Args:
    params, config, input_ids, attention_mask, token_type_ids: as `bertjax.forward`
      (right padding).
    overrides: {(layer, head): pattern name} (see `PATTERNS`) or an int
      (layers, heads) array from `override_codes` (data, so one compilation serves
      every override set); None overrides nothing.
    output_hidden_states, output_attentions: as `forward`.

  Returns:
    A `BertOutput`; with no override it equals `forward` to float rounding.
  """
  ids = jnp.asarray(input_ids)
  mask = jnp.ones(ids.shape, jnp.int32) if attention_mask is None else jnp.asarray(attention_mask)
  if overrides is None:
    codes = np.full((config.depth, config.num_attention_heads), -1, np.int32)
  elif isinstance(overrides, Mapping):
    codes = override_codes(config, overrides)
  else:
    codes = np.asarray(overrides, np.int32)
    if codes.shape != (config.depth, config.num_attention_heads):
      raise ValueError(
        f"overrides shape {codes.shape} must be (layers, heads)="
        f"({config.depth}, {config.num_attention_heads})"
      )
  patch = override_patch(codes, mask.sum(-1), ids.shape[1])
  return forward(
    params,
    config,
    ids,
    mask,
    token_type_ids,
    patch=patch,
    output_hidden_states=output_hidden_states,
    output_attentions=output_attentions,
  )
