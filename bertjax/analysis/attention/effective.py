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
from bertjax.model.forward import forward

Params = dict[str, Any]
KINDS = ("raw", "effective")  # the attention maps `head_analysis` measures


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


def expected_null_dim(length: int, head_dim: int) -> int:
  """Brunner et al.'s rule: rank(T) = min(n, d_head) for generic inputs, so dim = max(0, n - d)."""
  return max(0, length - head_dim)


def block_outputs_with_maps(params, config, ids: np.ndarray, maps: np.ndarray) -> np.ndarray:
  """Every block's output (L + 1, P, n, H) with `maps` (L, P, N, n, n) in place of each
  block's attention, through the model's own `probs` site (no rebuilt block)."""
  out = forward(
    params,
    config,
    ids,
    np.ones_like(ids),
    np.zeros_like(ids),
    output_hidden_states=True,
    patch={"probs": (np.asarray(maps, np.float32), 1.0)},
  )
  return np.asarray(out.hidden_states)


def head_analysis(
  params,
  config,
  ids: np.ndarray,
  *,
  cls_id: int,
  sep_id: int,
  punct_ids: np.ndarray,
  rebuild: int | None = None,
  null_space: bool = True,
) -> dict[str, np.ndarray]:
  """Per (passage, layer, head): null-space dimension, checks, correlations and token masses.

  Args:
    params, config: the model.
    ids: (P, n) passages of one length, no padding.
    cls_id, sep_id, punct_ids: the token classes whose attention mass is measured.
    rebuild: check the block outputs for only the first this many passages (None: all).
    null_space: compute each head's left null space (the costliest part; the length sweep
      needs it, the token-mass statistics do not).

  Returns:
    name -> (P, layers, heads) arrays: with `null_space`, "rank", "null_dim",
    "null_residual" (max |U^T T| / max |T| over the null basis U); "output_error" (max |A_eff T - A T| / max |A T|),
    "corr" (Pearson of the raw and effective map), "{raw,effective}_{cls,sep,punct}"
    (mean mass a query puts on them); and (P, layers): "block_error_{raw,effective}" (max
    abs difference of each block's output, with every block's maps set to the raw or
    effective ones through the `probs` site, from the model's own; 0 for passages past
    `rebuild`).
  """
  ids = np.asarray(ids, np.int32)
  out = forward(
    params,
    config,
    ids,
    np.ones_like(ids),
    np.zeros_like(ids),
    output_attentions=True,
    output_hidden_states=True,
    capture=("v",),
  )
  maps, hidden = np.asarray(out.attentions), np.asarray(out.hidden_states)
  values = np.asarray(out.cache["v"])
  p_count, n = ids.shape
  shape = (p_count, config.depth, config.num_attention_heads)
  names = ("rank", "null_dim", "null_residual") if null_space else ()
  r = {k: np.zeros(shape) for k in (*names, "output_error", "corr")}
  classes = {"cls": ids == cls_id, "sep": ids == sep_id, "punct": np.isin(ids, punct_ids)}
  for kind in KINDS:
    for c in classes:
      r[f"{kind}_{c}"] = np.zeros(shape)
  for kind in KINDS:
    r[f"block_error_{kind}"] = np.zeros(shape[:2])
  effective = np.zeros_like(maps, np.float64)
  for i in range(p_count):
    for d in range(config.depth):
      raw = maps[d, i].astype(np.float64)  # (N, n, n)
      t = head_value_outputs(params, config, d, values[d, i])  # (N, n, H)
      eff = effective[d, i] = effective_attention(raw, t)
      for h in range(config.num_attention_heads):
        if null_space:
          null = left_null_space(t[h])  # (n, n - rank)
          r["null_dim"][i, d, h] = null.shape[-1]
          r["rank"][i, d, h] = n - null.shape[-1]
          residual = np.abs(null.T @ t[h]).max() / np.abs(t[h]).max() if null.size else 0.0
          r["null_residual"][i, d, h] = residual
        head_out = raw[h] @ t[h]
        r["output_error"][i, d, h] = np.abs(eff[h] @ t[h] - head_out).max() / np.abs(head_out).max()
        r["corr"][i, d, h] = stats.pearson(raw[h], eff[h])
      for kind, a in (("raw", raw), ("effective", eff)):
        for c, m in classes.items():
          r[f"{kind}_{c}"][i, d] = a[..., m[i]].sum(-1).mean(-1)
  checked = p_count if rebuild is None else min(rebuild, p_count)
  if checked:
    for kind, a in (("raw", maps), ("effective", effective)):
      got = block_outputs_with_maps(params, config, ids[:checked], a[:, :checked])
      r[f"block_error_{kind}"][:checked] = np.abs(got - hidden[:, :checked])[1:].max((-1, -2)).T
  return r


def example_head(params, config, ids, layer: int, head: int) -> dict[str, np.ndarray]:
  """One head's raw and effective (n, n) maps on one passage `ids` (1, n), float64."""
  ids = np.asarray(ids, np.int32)
  if ids.ndim != 2 or ids.shape[0] != 1:
    raise ValueError(f"ids shape {ids.shape} must be (1, n): one passage")
  if not (0 <= layer < config.depth and 0 <= head < config.num_attention_heads):
    raise ValueError(
      f"layer={layer}, head={head} must be within (layers, heads)="
      f"({config.depth}, {config.num_attention_heads})"
    )
  o = forward(params, config, ids, output_attentions=True, capture=("v",))
  raw = np.asarray(o.attentions)[layer, 0].astype(np.float64)
  t = head_value_outputs(params, config, layer, np.asarray(o.cache["v"])[layer, 0])
  return {"raw": raw[head], "effective": effective_attention(raw, t)[head]}


def sweep_means(sweep: dict[int, dict[str, np.ndarray]]) -> dict[int, dict[str, np.ndarray]]:
  """A length sweep's `head_analysis` per length, as (L, H) means over its passages: the
  left null space's dimension ("null_dim"), T's "rank", the raw-effective correlation
  ("corr"), and the [CLS] + [SEP] mass of raw and of effective attention ("special_raw",
  "special_effective")."""
  out = {}
  for n, r in sweep.items():
    out[n] = {k: r[k].mean(0) for k in ("null_dim", "rank", "corr")}
    out[n]["special_raw"] = (r["raw_cls"] + r["raw_sep"]).mean(0)
    out[n]["special_effective"] = (r["effective_cls"] + r["effective_sep"]).mean(0)
  return out


def summarise(
  sweep: dict[int, dict], analysis: dict, statistics: dict, head_dim: int
) -> dict[str, Any]:
  """What a length sweep and a main set of passages show, in numbers.

  Args:
    sweep: length -> `head_analysis` (with the null space) of passages of that length.
    analysis: `head_analysis` of the main set.
    statistics: `effective_attention_statistics` of the same main set.
    head_dim: the heads' dimension.

  Returns:
    By length: `rank_min_max`, `null_dim_mean`, `null_dim_expected` (`expected_null_dim`),
    `null_dim_matches` (the share of heads x passages that match it) and
    `corr_raw_effective_by_length`; the checks' largest errors
    (`max_null_residual`, `max_relative_head_output_error`, `max_block_output_error` by
    kind); the main set's `special_mass` ([CLS] + [SEP]; `special_mass_per_passage`, each
    passage's mean over the heads) and `mass` per kind and class,
    `heads_with_lower_effective_special`, `position_corr_mean`, `raw_effective_corr_mean`; and
    `library_vs_direct_max_difference`: `statistics` (the batched, jitted pass) against
    `analysis` (per head, float64) on the [CLS] and [SEP] masses, two paths to one quantity.
  """
  lengths = sorted(sweep)
  runs = [sweep[n] for n in lengths] + [analysis]
  special = {k: analysis[f"{k}_cls"] + analysis[f"{k}_sep"] for k in KINDS}
  return {
    "head_dim": head_dim,
    "lengths": lengths,
    "rank_min_max": {
      n: (int(sweep[n]["rank"].min()), int(sweep[n]["rank"].max())) for n in lengths
    },
    "null_dim_mean": {n: float(sweep[n]["null_dim"].mean()) for n in lengths},
    "null_dim_expected": {n: expected_null_dim(n, head_dim) for n in lengths},
    "null_dim_matches": {
      n: float(np.mean(sweep[n]["null_dim"] == expected_null_dim(n, head_dim))) for n in lengths
    },
    "max_null_residual": max(float(sweep[n]["null_residual"].max()) for n in lengths),
    "max_relative_head_output_error": max(float(r["output_error"].max()) for r in runs),
    "max_block_output_error": {
      k: max(float(r[f"block_error_{k}"].max()) for r in runs) for k in KINDS
    },
    "corr_raw_effective_by_length": {n: float(sweep[n]["corr"].mean()) for n in lengths},
    "special_mass": {k: float(special[k].mean()) for k in KINDS},
    "special_mass_per_passage": {
      k: special[k].reshape(len(special[k]), -1).mean(-1) for k in KINDS
    },  # each passage's mean over heads: what an interval over the passages resamples
    "mass": {
      f"{k}_{c}": float(analysis[f"{k}_{c}"].mean()) for k in KINDS for c in ("cls", "sep", "punct")
    },
    "heads_with_lower_effective_special": float(
      np.mean(special["effective"].mean(0) < special["raw"].mean(0))
    ),
    "library_vs_direct_max_difference": max(
      float(np.abs(statistics[k][c] - analysis[f"{k}_{c}"].mean(0)).max())
      for k in KINDS
      for c in ("cls", "sep")
    ),
    "position_corr_mean": {k: float(np.nanmean(statistics[k]["position_corr"])) for k in KINDS},
    "raw_effective_corr_mean": float(np.nanmean(statistics["effective"]["raw_corr"])),
  }
