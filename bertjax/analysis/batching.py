"""Batches and mask bookkeeping shared by the analyses and their mesh path.

The analyses (`ablation`, `attention`, `patching`) and their mesh path (`sharded`) both read
batches the same way; these helpers live here so that the dependencies run one way:
`ablation`, `attention` and `patching` import `sharded`, and `sharded` imports only this
module (and `bertjax.model`), never an analysis.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.model.config import BertConfig
from bertjax.model.forward import embed

BASELINE_KEY = "baseline_last_hidden_state"


def as_batch(batch) -> dict[str, jax.Array]:
  """A batch as a dict of arrays with `input_ids`, `attention_mask` and `token_type_ids`."""
  if dataclasses.is_dataclass(batch):
    batch = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
  if not isinstance(batch, Mapping):
    raise TypeError(f"a batch must be a mapping or a dataclass, got {type(batch).__name__}")
  if "input_ids" not in batch:
    raise ValueError(f"a batch needs 'input_ids'; got keys {sorted(batch)}")
  ids = np.asarray(batch["input_ids"])
  if ids.ndim != 2:
    raise ValueError(f"input_ids must be (batch, seq); got shape {ids.shape}")
  out = {
    k: jnp.asarray(v)
    for k, v in batch.items()
    if v is not None and k != BASELINE_KEY and isinstance(v, (np.ndarray, jax.Array))
  }
  if batch.get("attention_mask") is None:
    out["attention_mask"] = jnp.ones(ids.shape, jnp.int32)
  if batch.get("token_type_ids") is None:
    out["token_type_ids"] = jnp.zeros(ids.shape, jnp.int32)
  return out


def check_same_padding(clean_mask, corrupted_mask) -> None:
  """Refuses a pair whose attention masks differ (which real tokens a row has).

  A site captured where the source run has padding holds what the model computes at padding
  (zeros for `head_out`, a padded query's state for `out`), not a token's activation; patched
  into a real token of the destination it would be a silent, meaningless edit. So every
  patching function needs the two masks equal: pad the clean and corrupted inputs alike
  (token-for-token counterparts of the same lengths, padded to one width).

  Raises:
    ValueError: the masks differ; the message names the first row and its positions.
  """
  a = np.asarray(clean_mask) != 0
  b = np.asarray(corrupted_mask) != 0
  if a.shape != b.shape:
    raise ValueError(f"clean attention_mask shape {a.shape} must equal corrupted shape {b.shape}")
  rows = np.flatnonzero((a != b).any(-1))
  if rows.size:
    row = int(rows[0])
    positions = np.flatnonzero(a[row] != b[row])
    shown = positions[:8].tolist() + (["..."] if positions.size > 8 else [])
    first = int(positions[0])
    raise ValueError(
      f"clean and corrupted attention masks differ in {rows.size} row(s), first row {row} at "
      f"positions {shown} (at position {first} clean mask {int(a[row, first])}, corrupted "
      f"{int(b[row, first])}): patching would carry values computed at padding into real "
      "tokens (or the reverse); give both runs the same padding (token-for-token "
      "counterparts, padded to the same lengths)"
    )


def model_token_types(config: BertConfig, token_type_ids):
  """A batch's token types as the model takes them: None for a family without them.

  DistilBERT's tokenizers still number a pair's segments 0 and 1 (`type_vocab_size`
  is 0); a batch keeps them (Kovaleva's "block" pattern reads them), the model gets none.
  """
  return token_type_ids if config.type_vocab_size else None


def embed_batch(params, config: BertConfig, batch) -> jax.Array:
  """The embedding output (B, T, H) of a batch (`as_batch`): the input of block 0, with the
  token types as the model takes them (`model_token_types`). The one-device and the mesh
  paths of the analyses both start here, so they feed the model the same inputs."""
  types = model_token_types(config, batch["token_type_ids"])
  return embed(params, config, batch["input_ids"], types)


def first_modified_layer(head_masks, layer_masks=None) -> np.ndarray:
  """(M,) index of the first block a mask changes (`depth` for an all-ones mask)."""
  head_masks = np.asarray(head_masks)
  changed = (head_masks != 1).any(-1)  # (M, depth)
  if layer_masks is not None:
    changed |= np.asarray(layer_masks) != 1
  depth = head_masks.shape[1]
  return np.where(changed.any(-1), changed.argmax(-1), depth)


def default_chunk_size() -> int:
  """Masks per vmap chunk when none is given: 1 on CPU, 16 on accelerators.

  Measured: on the 2-core CPU a chunk of 1 swept MiniLM's 73 masks in 57 s against 95 s
  for 12 (wide vmaps lose there); on an H100 a chunk of 12 ran the 145-mask BERT-base
  sweep at the prefix-reuse floor (80 forward passes for 79 of work).
  """
  return 1 if jax.default_backend() == "cpu" else 16
