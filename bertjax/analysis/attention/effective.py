"""Effective attention (Brunner et al. 2020): attention with its component in the left null
space of the head's value-output map removed, which leaves the head's output unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from bertjax import stats
from bertjax.analysis.batching import as_batch
from bertjax.analysis.sharded import maps_runner
from bertjax.model.config import BertConfig

Params = dict[str, Any]


def head_value_outputs(params: Params, config: BertConfig, block: int, v) -> np.ndarray:
  """Each head's value-output map of one sequence: `T_h = v_h W_O^h`, (N, n, H).

  `v` (n, G, D) is the block's `v` site on the real tokens (the value projection of what
  the attention reads: the block input, or its norm on pre-LN blocks; grouped value heads
  serve their query heads); the head's contribution to the attention output (before the
  output bias) is `A_h @ T_h`. Computed in float64.
  """
  layers = params["encoder"]["layers"]
  if isinstance(layers, list):
    raise ValueError("head_value_outputs needs stacked (unpruned) layers")  # noqa: TRY004
  i = config.layer_param_index[block]
  wo = np.asarray(layers["attention"]["output"]["kernel"][i], np.float64)  # (N, D, H)
  v = np.asarray(v, np.float64)
  v = np.repeat(v, wo.shape[0] // v.shape[1], axis=1)  # (n, N, D)
  return np.einsum("tnd,ndh->nth", v, wo)  # (N, n, H)


def left_null_space(t, rtol: float = 1e-10) -> np.ndarray:
  """Orthonormal bases of {u : u @ T = 0} for (..., n, H) maps: (..., n, n - rank) via SVD.

  The rank is common to the stacked maps only if their ranks agree; pass one map
  (n, H) when they may differ.
  """
  u, s, _ = np.linalg.svd(np.asarray(t, np.float64), full_matrices=True)
  rank = int((s > rtol * s[..., :1]).sum(-1).max())
  return u[..., rank:]


def effective_attention(attn, t, rtol: float = 1e-10) -> np.ndarray:
  """Brunner et al.'s effective attention: each row's component in the left null space removed.

  Only `A @ T` reaches the output, so any part of a row of A in `{u : u T = 0}`
  is invisible; `A_eff = A - A P_null = A P_col`, with `P_col` the projector onto
  the column space of T (by SVD, singular values above `rtol * max`).

  Args:
    attn: (N, n, n) one sequence's maps on its real tokens.
    t: (N, n, H) from `head_value_outputs`.
    rtol: relative singular-value cut-off for the rank.

  Returns:
    (N, n, n) float64 with `A_eff @ T == A @ T` and rows orthogonal to the null space.
  """
  attn = np.asarray(attn, np.float64)
  t = np.asarray(t, np.float64)
  if attn.shape[:-1] != t.shape[:-1] or attn.shape[-1] != attn.shape[-2]:
    raise ValueError(f"attn shape {attn.shape} must be (N, n, n) matching t shape {t.shape}")
  u, s, _ = np.linalg.svd(t, full_matrices=False)  # u (N, n, k)
  keep = s > rtol * s[..., :1]  # (N, k)
  u = u * keep[:, None, :]
  # (A U) U^T: two matmuls; the three-operand einsum is ~100x slower unoptimised.
  return (attn @ u) @ np.swapaxes(u, -1, -2)


def effective_attention_statistics(
  params: Params, config: BertConfig, batches: Iterable, *, cls_id: int, sep_id: int, mesh=None
) -> dict[str, dict[str, np.ndarray]]:
  """Raw vs effective attention, side by side (Brunner et al. 2020, Sec. 4).

  Per head, over all real tokens of the data set (streamed sums):
  * "cls", "sep": mean mass a query row puts on [CLS] / [SEP] keys.
  * "position_corr": Pearson correlation between the attention a token receives
    (its column's mean over the sequence's queries) and its position.
  * "raw_corr" (effective only): Pearson correlation between the raw and the
    effective attention weights.

  Args:
    params, config, batches: the model (stacked layers) and data.
    cls_id, sep_id: the [CLS] and [SEP] ids.
    mesh: a device mesh (see `pattern_types`): the forward passes split their rows over its
      devices; the per-sequence SVDs (float64, on the host: most of the time on small
      models) do not. None: one device.

  Returns:
    {"raw": {name: (layers, heads)}, "effective": {...}}.
  """
  shape = (config.depth, config.num_attention_heads)
  acc = {kind: {k: np.zeros(shape) for k in ("cls", "sep")} for kind in ("raw", "effective")}
  pos = {kind: [np.zeros(shape) for _ in range(5)] for kind in ("raw", "effective")}
  pair = [np.zeros(shape) for _ in range(5)]
  rows = 0
  cols = 0
  weights = 0
  run = maps_runner(params, config, mesh)
  for batch in batches:
    b = as_batch(batch)
    maps, values = run(b, "v")
    ids, mask = np.asarray(b["input_ids"]), np.asarray(b["attention_mask"], bool)
    for i in range(ids.shape[0]):
      n = int(mask[i].sum())
      is_cls, is_sep = ids[i, :n] == cls_id, ids[i, :n] == sep_id
      position = np.arange(n, dtype=np.float64)
      for d in range(config.depth):
        raw = maps[d, i, :, :n, :n].astype(np.float64)  # (N, n, n)
        eff = effective_attention(raw, head_value_outputs(params, config, d, values[d, i, :n]))
        for kind, a in (("raw", raw), ("effective", eff)):
          acc[kind]["cls"][d] += a[..., is_cls].sum((-1, -2))
          acc[kind]["sep"][d] += a[..., is_sep].sum((-1, -2))
          received = a.mean(1)  # (N, n)
          s = pos[kind]
          s[0][d] += position.sum()
          s[1][d] += received.sum(-1)
          s[2][d] += (position**2).sum()
          s[3][d] += (received**2).sum(-1)
          s[4][d] += (received * position).sum(-1)
        pair[0][d] += raw.sum((-1, -2))
        pair[1][d] += eff.sum((-1, -2))
        pair[2][d] += (raw**2).sum((-1, -2))
        pair[3][d] += (eff**2).sum((-1, -2))
        pair[4][d] += (raw * eff).sum((-1, -2))
      rows += n
      cols += n
      weights += n * n
  if rows == 0:
    raise ValueError("batches is empty")
  result = {}
  for kind in ("raw", "effective"):
    result[kind] = {k: v / rows for k, v in acc[kind].items()}
    result[kind]["position_corr"] = stats.pearson_from_sums(*pos[kind], cols)
  result["effective"]["raw_corr"] = stats.pearson_from_sums(*pair, weights)
  return result
