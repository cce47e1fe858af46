"""DeBERTa's disentangled attention: how much of each head's scores is content, how much position.

He et al. 2021 ("DeBERTa: Decoding-enhanced BERT with Disentangled Attention", ICLR 2021;
DeBERTa-v3: He et al. 2023) write the attention logit of head h, query i, key j as the sum of
three terms, each scaled by `1 / sqrt(f d)` (f = 1 + the number of position terms):

    S_ij = c2c_ij + c2p_ij + p2c_ij
    c2c_ij = q_i . k_j             content-to-content
    c2p_ij = q_i . Kr[r(i, j)]     content-to-position (the query reads the relative position)
    p2c_ij = k_j . Qr[r(j, i)]     position-to-content (the key reads it)

The model exposes them as the sites `scores_c2c`, `scores_c2p`, `scores_p2c`, each
(depth, batch, heads, seq, seq) before the mask (`bertjax.model.sites`). A term the model
does not have (`pos_att_type` lacks it, or `relative_attention=False`) counts as zero here.

`score_term_shares` measures, per (layer, head), over every real query row i and real key j
of the given batches (pooled: each (i, j) pair counts once):

* Within-row deviations. For each term x, `x~_ij = x_ij - mean_j' x_ij'` (the mean over the
  row's real keys). Softmax ignores a constant added to a row, so only this part of a term
  can move attention; the row means are left out of every variance below.
* `variance[t] = E[t~^2]`, the within-row variance of term t (t = c2c, c2p, p2c).
* `share[t] = Cov(t~, S~) / Var(S~) = E[t~ S~] / E[S~^2]`. Since `S~ = c2c~ + c2p~ + p2c~`,
  the three shares sum to 1 exactly (up to float rounding); a share can be negative (a term
  that cancels the others) or above 1.
* `positional_share = share[c2p] + share[p2c] = 1 - share[c2c]`; a head is *mostly
  positional* when its positional share exceeds `POSITIONAL_THRESHOLD` (0.5): position
  accounts for more of its score variation than content does.
* `tv_direct[r]`: the mean over real query rows of the total-variation distance
  `1/2 sum_j |A_ij - A'_ij|` between the head's attention A and `A' = softmax_j(S - removed)`
  over the real keys, for r in `REMOVALS` (c2p, p2c, both). Only that head's logits change,
  its inputs stay the intact model's: the same as a forward that zeroes the terms at that
  layer alone, read at that layer.
* `tv_total`: the same distance when c2p and p2c are zeroed in every layer at once (one
  patched forward, `patch={"scores_c2p": (0.0, 1.0), "scores_p2c": (0.0, 1.0)}`): the model
  without relative positions, which includes what the lower layers pass up.

`TermShares.by_layer` averages each over the heads of a layer, so depth trends show.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.analysis.batching import as_batch, model_token_types
from bertjax.model.config import BertConfig
from bertjax.model.forward import forward

Params = dict[str, Any]
TERMS = ("c2c", "c2p", "p2c")
REMOVALS = ("c2p", "p2c", "c2p+p2c")  # tv_direct's last axis: what is taken out of S
POSITIONAL_THRESHOLD = 0.5


@dataclasses.dataclass(frozen=True)
class TermShares:
  """What `score_term_shares` measured; layers and heads are 0-based here."""

  moments: np.ndarray  # (layers, heads, 3, 3): E[t~ u~] over the pooled pairs, t, u in TERMS
  tv_direct: np.ndarray  # (layers, heads, 3): mean TV with REMOVALS taken out of that head's S
  tv_total: np.ndarray  # (layers, heads): mean TV with c2p and p2c zeroed in every layer
  num_pairs: int  # real (query, key) pairs pooled
  num_rows: int  # real query rows averaged

  @property
  def variance(self) -> np.ndarray:
    """(layers, heads, 3) within-row variance of c2c, c2p, p2c."""
    return np.diagonal(self.moments, axis1=-2, axis2=-1).copy()

  @property
  def total_variance(self) -> np.ndarray:
    """(layers, heads) within-row variance of the logit S = c2c + c2p + p2c."""
    return self.moments.sum((-2, -1))

  @property
  def share(self) -> np.ndarray:
    """(layers, heads, 3) Cov(t~, S~) / Var(S~) for c2c, c2p, p2c (sums to 1 over terms)."""
    total = self.total_variance[..., None]
    return np.where(total > 0, self.moments.sum(-1) / np.where(total > 0, total, 1), np.nan)

  @property
  def positional_share(self) -> np.ndarray:
    """(layers, heads) share[c2p] + share[p2c] = 1 - share[c2c]."""
    return self.share[..., 1:].sum(-1)

  def mostly_positional(self, threshold: float = POSITIONAL_THRESHOLD) -> np.ndarray:
    """(layers, heads) bool: positional share > `threshold`."""
    return self.positional_share > threshold

  def positional_heads(self, threshold: float = POSITIONAL_THRESHOLD) -> list[tuple[int, int]]:
    """The mostly positional heads as 0-based (layer, head), layer-major."""
    return [(int(l), int(h)) for l, h in np.argwhere(self.mostly_positional(threshold))]

  def by_layer(self) -> dict[str, np.ndarray]:
    """Each measure averaged over the heads of a layer, (layers,) each: the shares of c2c,
    c2p, p2c and their positional sum, the fraction of mostly positional heads, tv_direct
    without c2p, p2c and both, and tv_total."""
    share = self.share
    out = {f"share_{t}": share[..., i].mean(-1) for i, t in enumerate(TERMS)}
    out["positional_share"] = self.positional_share.mean(-1)
    out["mostly_positional"] = self.mostly_positional().mean(-1)
    out.update({f"tv_direct_{r}": self.tv_direct[..., i].mean(-1) for i, r in enumerate(REMOVALS)})
    out["tv_total"] = self.tv_total.mean(-1)
    return out


def check_disentangled(config: BertConfig, what: str = "score_term_shares") -> None:
  """Refuses, naming `model_type`, a model whose scores are not DeBERTa's three terms."""
  if config.family.position_bias != "disentangled":
    raise ValueError(
      f"{what} needs DeBERTa's disentangled attention (model_type='deberta-v2'); "
      f"model_type={config.model_type!r} has no c2p/p2c score terms"
    )


def _softmax_real(logits, keys):
  """Softmax over the real keys (B, 1, 1, T) of logits (B, N, T, T); 0 at padded keys."""
  logits = jnp.where(keys, logits, -jnp.inf)
  top = jnp.max(logits, -1, keepdims=True)
  e = jnp.where(keys, jnp.exp(logits - jnp.where(jnp.isfinite(top), top, 0)), 0)
  return e / jnp.maximum(e.sum(-1, keepdims=True), jnp.finfo(e.dtype).tiny)


@jax.jit
def _layer_sums(terms, probs, patched, mask):
  """One layer's sums: terms (3, B, N, T, T) c2c, c2p, p2c; probs, patched (B, N, T, T);
  mask (B, T) bool. Returns moments (N, 3, 3), tv_direct (N, 3), tv_total (N,), as sums
  over real pairs / real query rows."""
  terms = terms.astype(jnp.float32)
  keys = mask[:, None, None, :]  # (B, 1, 1, T)
  rows = mask[:, None, :]  # (B, 1, T)
  pair = keys & mask[:, None, :, None]  # (B, 1, T, T)
  count = jnp.maximum(mask.sum(-1), 1)[:, None, None, None]  # (B, 1, 1, 1)
  t = jnp.where(keys, terms, 0)  # padded keys' values are whatever the block computed there
  dev = jnp.where(pair, t - t.sum(-1, keepdims=True) / count, 0)  # (3, B, N, T, T)
  moments = jnp.einsum("sbnqk,ubnqk->nsu", dev, dev)

  def tv(a, b):  # (B, N, T, T) twice -> (N,): summed over the real query rows
    return jnp.where(rows, 0.5 * jnp.abs(a - b).sum(-1), 0).sum((0, 2))

  c2c, c2p, p2c = terms
  without = (c2c + p2c, c2c + c2p, c2c)  # REMOVALS, summed in the block's order
  direct = jnp.stack([tv(probs, _softmax_real(s, keys)) for s in without], -1)
  return moments, direct, tv(probs, patched)


def score_term_shares(params: Params, config: BertConfig, batches: Iterable) -> TermShares:
  """Each head's score variance split into content and position, and its attention change
  without the position terms (DeBERTa; the definitions are in this module's docstring).

  Args:
    params, config: a DeBERTa-v2/v3 model (`model_type="deberta-v2"`).
    batches: iterable of batches (mappings or `bertjax.Batch`) with `input_ids` and
      optionally `attention_mask`, `token_type_ids`; padding is left out.

  Returns:
    A `TermShares`, pooled over every real (query, key) pair of every batch.

  Raises:
    ValueError: the model has no disentangled attention (names its `model_type`), or
      `batches` is empty.
  """
  check_disentangled(config)
  present = config.disentangled_terms  # the position terms this model has
  capture = ("scores_c2c", *(f"scores_{t}" for t in present), "probs")
  removed = {f"scores_{t}": (0.0, 1.0) for t in present}
  layers, heads = config.depth, config.num_attention_heads
  moments = np.zeros((layers, heads, 3, 3))
  direct = np.zeros((layers, heads, 3))
  total = np.zeros((layers, heads))
  pairs = rows = 0
  for batch in batches:
    b = as_batch(batch)
    ids, mask = b["input_ids"], b["attention_mask"]
    types = model_token_types(config, b["token_type_ids"])
    cache = forward(params, config, ids, mask, types, capture=capture).cache
    probs = cache["probs"]  # (L, B, N, T, T)
    patched = (
      forward(params, config, ids, mask, types, capture=("probs",), patch=removed).cache["probs"]
      if removed
      else probs
    )
    zeros = jnp.zeros_like(cache["scores_c2c"])
    terms = jnp.stack([cache.get(f"scores_{t}", zeros) for t in TERMS], 1)  # (L, 3, B, N, T, T)
    real = jnp.asarray(mask) != 0
    for layer in range(layers):
      m, d, t = _layer_sums(terms[layer], probs[layer], patched[layer], real)
      moments[layer] += np.asarray(m, np.float64)
      direct[layer] += np.asarray(d, np.float64)
      total[layer] += np.asarray(t, np.float64)
    lengths = np.asarray(real).sum(-1)
    pairs += int((lengths**2).sum())
    rows += int(lengths.sum())
  if rows == 0:
    raise ValueError("batches is empty (no real tokens): nothing to measure")
  return TermShares(
    moments=moments / pairs,
    tv_direct=direct / rows,
    tv_total=total / rows,
    num_pairs=pairs,
    num_rows=rows,
  )
