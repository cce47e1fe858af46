"""The pieces every token-attribution method shares.

Inputs checked, the padding mask, and the model's named sites captured in the analysis
dtype (float32, or float64 for a float64 config). Used by `bertjax.analysis.attribution.propagation`
(the methods that decompose the encoder blocks) and `bertjax.analysis.attribution.gradients`
(gradients and the logit lens).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from bertjax.model.config import BertConfig
from bertjax.model.forward import forward
from bertjax.model.layers import compute_dtype

Params = dict[str, Any]


def analysis_dtype(config: BertConfig):
  """The dtype the attribution methods compute in: the model's compute dtype, at least float32."""
  return jnp.promote_types(compute_dtype(config), jnp.float32)


def real_tokens(input_ids, attention_mask):
  """(B, T) bool: the real tokens of a batch (all of them when `attention_mask` is None)."""
  if attention_mask is None:
    return jnp.ones(np.shape(input_ids), bool)
  return jnp.asarray(attention_mask) > 0


def captured_sites(params, config, input_ids, attention_mask, token_type_ids, sites):
  """The named `sites` of one forward pass (`forward(..., capture=sites)`), each (L, ...) in
  `analysis_dtype`; with "embeddings" and "out" captured, "x" too: each block's input."""
  out = forward(params, config, input_ids, attention_mask, token_type_ids, capture=sites)
  dtype = analysis_dtype(config)
  cache = {k: v.astype(dtype) for k, v in out.cache.items()}
  if "embeddings" in cache and "out" in cache:
    # Each block's input: the embeddings, then the previous block's output.
    cache["x"] = jnp.concatenate([cache["embeddings"][None], cache["out"][:-1]])  # (L, B, T, H)
  return cache
