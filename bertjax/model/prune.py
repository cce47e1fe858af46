"""Physical head pruning: a smaller model with the same outputs as the masked one.

`prune_heads` removes heads (their query, key, value and output weights), recording them
in `config.pruned_heads`; pruned layers are a list, not a stack. `unprune_heads` is its
inverse at full size, with the removed heads' weights zero: what `to_hf` writes by default,
since transformers 5 has no head pruning.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.model.config import BertConfig
from bertjax.model.layers import Params

# The per-head input projections (DeBERTa adds its position keys and queries).
_HEAD_PROJECTIONS = {"query", "key", "value", "pos_key", "pos_query"}


def heads_of_mask(mask) -> dict[int, list[int]]:
  """`prune_heads`' argument for the zeros of a (layers, heads) head mask: layer -> heads."""
  return {
    int(layer): [int(h) for h in np.flatnonzero(row == 0)]
    for layer, row in enumerate(np.asarray(mask))
    if (row == 0).any()
  }


def prune_heads(
  config: BertConfig, params: Params, heads_to_prune: dict[int, list[int]]
) -> tuple[BertConfig, Params]:
  """Physically removes attention heads, so the model gets smaller and faster.

  Args:
    config: a config of a family without shared layers (ALBERT layers share
      weights; use head masks there).
    params: its parameters (stacked, or already pruned).
    heads_to_prune: layer -> original indices of heads to remove (adds to any
      already removed).

  Returns:
    `(config, params)` where `config.pruned_heads` records every removed head
    (exported as Hugging Face `pruned_heads`) and `params["encoder"]["layers"]`
    is a list of per-layer parameter dicts when head counts differ. Head masks,
    attention maps and captured sites keep the original `(layers, heads)` indexing.
  """
  if config.family.shared_layers:
    raise ValueError(
      f"prune_heads does not support model_type={config.model_type!r}: its "
      "layers share weights; use head masks"
    )
  removed = {layer: set(heads) for layer, heads in config.pruned_heads}
  for layer, heads in heads_to_prune.items():
    heads = [int(h) for h in heads]
    if not 0 <= layer < config.num_hidden_layers or any(
      not 0 <= h < config.num_attention_heads for h in heads
    ):
      raise ValueError(
        f"heads_to_prune[{layer}]={heads} is out of range for "
        f"{config.num_hidden_layers} layers x {config.num_attention_heads} heads"
      )
    removed.setdefault(int(layer), set()).update(heads)
  new_config = config.replace(
    pruned_heads=tuple(
      (layer, tuple(sorted(heads))) for layer, heads in sorted(removed.items()) if heads
    )
  )
  layers = params["encoder"]["layers"]
  if not isinstance(layers, list):
    layers = [jax.tree.map(lambda a, i=i: a[i], layers) for i in range(config.num_hidden_layers)]
  pruned = []
  for layer, p in enumerate(layers):
    old = config.kept_heads(layer)
    local = np.asarray([old.index(h) for h in new_config.kept_heads(layer)], np.int32)
    a = dict(p["attention"])
    for name in _HEAD_PROJECTIONS & a.keys():  # biases where the block has them
      a[name] = {k: v[:, local] if k == "kernel" else v[local] for k, v in a[name].items()}
    a["output"] = {**a["output"], "kernel": a["output"]["kernel"][local]}
    pruned.append({**p, "attention": a})
  return new_config, {**params, "encoder": {**params["encoder"], "layers": pruned}}


def unprune_heads(config: BertConfig, params: Params) -> tuple[BertConfig, Params]:
  """A pruned model at full size: each removed head's query, key, value and output weights
  (and q/k/v biases) zero, so it contributes exactly nothing; layers stacked again.

  The same function as the pruned model (a removed head's values are zero, and so is its
  output projection), in the layout every library reads: what `to_hf` writes by default,
  since transformers 5 has no head pruning.
  """
  if not config.is_pruned:
    return config, params
  n = config.num_attention_heads
  layers = []
  for layer, p in enumerate(params["encoder"]["layers"]):
    kept = np.asarray(config.kept_heads(layer), np.int32)
    full = lambda a, axis, kept=kept: (
      jnp.zeros(a.shape[:axis] + (n,) + a.shape[axis + 1 :], a.dtype)
      .at[(slice(None),) * axis + (kept,)]
      .set(a)
    )
    a = dict(p["attention"])
    for name in _HEAD_PROJECTIONS & a.keys():
      a[name] = {k: full(v, 1 if k == "kernel" else 0) for k, v in a[name].items()}
    a["output"] = {**a["output"], "kernel": full(a["output"]["kernel"], 0)}
    layers.append({**p, "attention": a})
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *layers)
  return (
    config.replace(pruned_heads=()),
    {**params, "encoder": {**params["encoder"], "layers": stacked}},
  )
