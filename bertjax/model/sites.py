"""Named sites: every internal of a block, captured, patched or masked through `Sites`.

Every internal of a block is a named *site* (`SITES`): the block passes each through
`Sites.visit`, which records it when captured and replaces it when patched (`weight *
value + (1 - weight) * own`). Head masks and layer masks are edits of the same sites
(`head_out` and `out`), so analyses never re-implement the layer. Each site keeps its meaning
on every block: on pre-LN blocks `attn_in` and `ffn_in` are the normed inputs and `mid` the
residual stream between attention and FFN; `q`/`k` are read after rotation on rotary
families; gated FFNs add `ffn_gate`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bertjax import kernels
from bertjax.model.config import BertConfig

# Site name -> (axes after depth, what it is). "embeddings" has no depth axis. In block order.
SITES = {
  "embeddings": ("batch seq hidden", "the embedding output (after LayerNorm, projection)"),
  "attn_in": (
    "batch seq hidden",
    "what the attention reads: the block input x (post-LN), or the attention norm of x (pre-LN)",
  ),
  "q": (
    "batch seq heads head_dim",
    "query projection with bias, before scaling; after rotation on rotary families",
  ),
  "k": (
    "batch seq kv_heads head_dim",
    (
      "key projection with bias; after rotation on rotary "
      "families; kv_heads < heads with grouped key/value heads"
    ),
  ),
  "v": ("batch seq kv_heads head_dim", "value projection with bias"),
  "scores_c2c": (
    "batch heads seq seq",
    "DeBERTa: the content-to-content logit q.k / sqrt(f d), before the mask (needs the map path)",
  ),
  "scores_c2p": (
    "batch heads seq seq",
    "DeBERTa: the content-to-position term q_i.Kr[r(i,j)] / sqrt(f d) (with c2p in pos_att_type)",
  ),
  "scores_p2c": (
    "batch heads seq seq",
    "DeBERTa: the position-to-content term k_j.Qr[r(i,j)] / sqrt(f d) (with p2c in pos_att_type)",
  ),
  "probs": ("batch heads seq seq", "attention probabilities (needs the map path)"),
  "head_out": (
    "batch seq heads head_dim",
    "each head's context sum_j probs_ij v_j after any head mask",
  ),
  "attn_out": (
    "batch seq hidden",
    "attention output projection (with bias), before residual (normed first in sandwich blocks)",
  ),
  "resid_mid": (
    "batch seq hidden",
    (
      "the residual sum x + attn_out, before any norm (post-LN: "
      "the LayerNorm's input; pre-LN: equal to mid)"
    ),
  ),
  "mid": (
    "batch seq hidden",
    (
      "the residual stream between attention and FFN: "
      "LayerNorm(x + attn_out) (post-LN), x + attn_out (pre-LN)"
    ),
  ),
  "ffn_in": ("batch seq hidden", "what the FFN reads: mid (post-LN), or its FFN norm (pre-LN)"),
  "ffn_gate": ("batch seq intermediate", "gated FFNs: the activated gate act(ffn_in Wg)"),
  "ffn_act": (
    "batch seq intermediate",
    "the FFN's hidden activation (gated: ffn_gate * ffn_in W1), as the output projection reads it",
  ),
  "ffn_out": (
    "batch seq hidden",
    "the FFN's output projection, before residual (normed first in sandwich blocks)",
  ),
  "resid_out": (
    "batch seq hidden",
    (
      "the residual sum mid + ffn_out, before any norm (post-LN: "
      "the block's LayerNorm input; pre-LN: equal to out)"
    ),
  ),
  "out": (
    "batch seq hidden",
    (
      "the block's output (= hidden_states[1:], except a pre-LN "
      "model's last entry, which is after the final norm as in transformers)"
    ),
  ),
}
BLOCK_SITES = tuple(s for s in SITES if s != "embeddings")
# Sites with a head axis, and where it sits in one block's array.
HEAD_AXIS = {
  "q": 2,
  "k": 2,
  "v": 2,
  "head_out": 2,
  "probs": 1,
  "scores_c2c": 1,
  "scores_c2p": 1,
  "scores_p2c": 1,
}
# DeBERTa's score terms: the logits are their sum (`bertjax.kernels.DisentangledBias`).
SCORE_SITES = ("scores_c2c", "scores_c2p", "scores_p2c")
# Sites with a query-position axis, and where it sits in one block's array: a block run at
# chosen rows only (`Sites.rows`, `run_layers(final_rows=)`) computes them there. Keys and
# values keep every position.
ROW_AXIS = {
  "q": 1,
  "probs": 2,
  "head_out": 1,
  "attn_out": 1,
  "resid_mid": 1,
  "mid": 1,
  "ffn_in": 1,
  "ffn_gate": 1,
  "ffn_act": 1,
  "ffn_out": 1,
  "resid_out": 1,
  "out": 1,
}


def block_sites(config: BertConfig) -> tuple[str, ...]:
  """The block sites a model of `config` has (`ffn_gate` only with a gated FFN; DeBERTa's
  score terms only on DeBERTa, each position term where `pos_att_type` has it)."""
  fam = config.family
  terms = ("scores_c2c",) + tuple(f"scores_{t}" for t in config.disentangled_terms)
  return tuple(
    s
    for s in BLOCK_SITES
    if (s != "ffn_gate" or fam.ffn == "gated")
    and (s not in SCORE_SITES or (fam.position_bias == "disentangled" and s in terms))
  )


def model_sites(config: BertConfig) -> tuple[str, ...]:
  """Every site a model of `config` has: "embeddings", then its block sites in block order."""
  return ("embeddings",) + block_sites(config)


def site_shape(config: BertConfig, site: str, batch: int, seq: int) -> tuple[int, ...]:
  """The stacked shape of `site` for a (batch, seq) input: depth first, except embeddings."""
  if site not in SITES:
    raise ValueError(f"site {site!r} is unknown; expected one of {tuple(SITES)}")
  if site != "embeddings" and site not in block_sites(config):
    why = (
      f"its feed-forward is {config.family.ffn}"
      if site == "ffn_gate"
      else "it has no disentangled attention term of that name"
    )
    raise ValueError(
      f"site {site!r} does not exist on a {config.model_type} block ({why}); "
      f"its sites: {block_sites(config)}"
    )
  sizes = dict(
    batch=batch,
    seq=seq,
    hidden=config.hidden_size,
    heads=config.num_attention_heads,
    kv_heads=config.kv_heads,
    head_dim=config.head_dim,
    intermediate=config.ffn_size,
  )
  shape = tuple(sizes[a] for a in SITES[site][0].split())
  return shape if site == "embeddings" else (config.depth,) + shape


def interchange(own, source, basis, weight):
  """`own + (((source - own) @ basis.T) * weight) @ basis` in `own`'s dtype (at least float32
  inside): `own`'s coordinates on the basis rows (k, D) moved to `source`'s by `weight`
  (..., k), the rest of `own` kept (`Intervention.subspace`)."""
  acc = jnp.promote_types(own.dtype, jnp.float32)
  basis = jnp.asarray(basis).astype(acc)
  delta = (jnp.asarray(source).astype(acc) - own.astype(acc)) @ basis.T  # (..., k)
  moved = (delta * jnp.asarray(weight).astype(acc)) @ basis
  return (own.astype(acc) + moved).astype(own.dtype)


def mix(own, value, weight):
  """`weight * value + (1 - weight) * own` in `own`'s dtype."""
  dtype = own.dtype
  weight = jnp.asarray(weight)
  return (weight * jnp.asarray(value) + (1 - weight) * own).astype(dtype)


def take_rows(x, rows, axis: int = 1):
  """`x` at positions `rows` (B, R) along `axis` (an axis of size 1 broadcasts and stays)."""
  x = jnp.asarray(x)
  if x.shape[axis] == 1:
    return x
  x = jnp.broadcast_to(x, (rows.shape[0],) + x.shape[1:])
  index = rows.reshape(rows.shape + (1,) * (x.ndim - 2))
  index = jnp.moveaxis(index, 1, axis) if axis != 1 else index
  return jnp.take_along_axis(x, index, axis=axis)


def put_rows(x, rows, seq_len: int, axis: int = 1):
  """The inverse of `take_rows`: `x` (R along `axis`) placed at `rows` in zeros of `seq_len`."""
  x = jnp.moveaxis(x, axis, 1)  # (B, R, ...)
  full = jnp.zeros((x.shape[0], seq_len) + x.shape[2:], x.dtype)
  full = full.at[jnp.arange(x.shape[0])[:, None], rows].set(x)
  return jnp.moveaxis(full, 1, axis)


class Sites:
  """One block's view of the pass's `Intervention`: what to capture, patch and mask.

  Built fresh for each traced block (inside the layer scan) from the block's slice of the
  intervention (`Intervention.blocks`); `visit` returns the site's (possibly replaced)
  value and records it when captured.

  Args:
    intervention: this block's `bertjax.Intervention` (None: nothing): its patch arrays,
      head mask (N,), (B, N) or per packed token (R, P, N), and layer mask (a scalar) are
      this block's slices.
    kept: original indices of this block's heads when it is pruned, else None.
    num_heads: the unpruned head count (captures are scattered back to it).
    rows: int (B, R) when the block runs at these query positions only (`ROW_AXIS`
      sites: patches are read there, captures are zero elsewhere), else None.
    index: the block's 0-based index in [0, depth) (index i is layer i + 1), the `index`
      a function patch receives.
    packing: a `packing.Packing` when the block runs on packed rows (its segments bound
      the attention and the "uniform" ablation), else None.

  Attributes:
    capture, patch, functions, head_mask, head_ablation, layer_mask: the intervention's,
      as `capture` (a frozenset), `patch` {site: (value, weight)} and `functions`
      {site: fn(value, index)} (applied before any (value, weight) patch of the site).
  """

  def __init__(
    self, intervention=None, *, kept=None, num_heads=None, rows=None, index=None, packing=None
  ):
    if intervention is not None:
      self.capture = frozenset(intervention.capture)
      self.patch = intervention.patch
      self.subspace = intervention.subspace
      self.functions = dict(intervention.functions)
      self.head_mask = intervention.head_mask
      self.head_ablation = intervention.head_ablation
      self.layer_mask = intervention.layer_mask
    else:
      self.capture, self.patch, self.functions, self.subspace = frozenset(), {}, {}, {}
      self.head_mask, self.head_ablation, self.layer_mask = None, "scale", None
    self.index = index  # the block's 0-based index (traced under the layer scan)
    self.kept = kept
    self.num_heads = num_heads
    self.rows = rows
    self.packing = packing
    self.seq_len = None  # set by the block when rows is given
    self.captured: dict[str, jax.Array] = {}

  def needs(self, name: str) -> bool:
    """Whether site `name` is captured, patched, edited by a function or interchanged."""
    return (
      name in self.capture or name in self.patch or name in self.functions or name in self.subspace
    )

  def visit(self, name: str, value):
    """Site `name`'s value after this pass's edits: a function patch, a subspace interchange,
    then a (value, weight) patch (read at the block's rows when it runs on some); records it
    when captured (a pruned block's removed heads as zeros)."""
    restricted = self.rows is not None and name in ROW_AXIS
    if name in self.functions:
      new = self.functions[name](value, self.index)
      if jnp.shape(new) != value.shape:
        raise ValueError(
          f"patch[{name!r}] function returned shape {jnp.shape(new)}; the site "
          f"is {value.shape} in each block (it must return the same shape)"
        )
      value = jnp.asarray(new).astype(value.dtype)
    if name in self.subspace:
      source, basis, weight = self.subspace[name]
      if self.kept is not None and name in HEAD_AXIS:
        source, weight = self._kept_heads(name, source), self._kept_heads(name, weight)
      if restricted:
        source, weight = (self._at_rows(name, a, value.ndim) for a in (source, weight))
      value = interchange(value, source, basis, weight)
    if name in self.patch:
      target, weight = self.patch[name]
      if self.kept is not None and name in HEAD_AXIS:
        target, weight = self._kept_heads(name, target), self._kept_heads(name, weight)
      if restricted:
        target, weight = (self._at_rows(name, a, value.ndim) for a in (target, weight))
      value = mix(value, target, weight)
    if name in self.capture:
      captured = self._all_heads(name, value)
      if restricted:
        captured = put_rows(captured, self.rows, self.seq_len, ROW_AXIS[name])
      self.captured[name] = captured
    return value

  def _at_rows(self, name, x, ndim):
    # A patch array (broadcasting to the block's full site) read at the block's rows.
    x = jnp.asarray(x)
    x = x.reshape((1,) * (ndim - x.ndim) + x.shape)
    return take_rows(x, self.rows, ROW_AXIS[name])

  def _kept_heads(self, name, x):
    # Patch arrays are indexed by original heads; a pruned block keeps some of them.
    x = jnp.asarray(x)
    axis = HEAD_AXIS[name] - (4 - x.ndim)
    if axis < 0 or x.shape[axis] == 1:
      return x
    return jnp.take(x, jnp.asarray(self.kept, jnp.int32), axis=axis)

  def _all_heads(self, name, x):
    # Captures of a pruned block show removed heads as zeros.
    if self.kept is None or name not in HEAD_AXIS:
      return x
    axis = HEAD_AXIS[name]
    shape = list(x.shape)
    shape[axis] = self.num_heads
    full = jnp.zeros(shape, x.dtype)
    index = [slice(None)] * x.ndim
    index[axis] = jnp.asarray(self.kept, jnp.int32)
    return full.at[tuple(index)].set(x)

  def mask_heads(self, head_out, v, key_mask, window=None, rows=None):
    """Applies the head mask to head_out (B, T | R, N, D), the context of each head.

    "uniform" mixes in the mean value of the keys the attention may see: the real keys,
    within `window` (`|q - k| <= window // 2`) on a sliding-window layer. `rows` (B, R):
    the query positions of head_out's rows (None: 0 .. T-1).
    """
    xi = self.head_mask
    if xi is None:
      return head_out
    xi = jnp.asarray(xi)
    xi = {
      1: lambda: xi[None, None, :, None],
      2: lambda: xi[:, None, :, None],
      3: lambda: xi[..., None],
    }[xi.ndim]().astype(head_out.dtype)  # (B?, T?, N, 1)
    if self.head_ablation == "scale":
      return head_out * xi
    bounds = None if self.packing is None else (self.packing.starts, self.packing.ends)
    mean_v = uniform_values(v, key_mask, window, head_out.shape[2], rows, bounds)
    return (xi * head_out + (1 - xi) * mean_v.astype(head_out.dtype)).astype(head_out.dtype)

  def mask_maps(self, probs, key_mask, window=None):
    """The attention Hugging Face returns under this head mask: xi A, or xi A + (1 - xi) U."""
    xi = self.head_mask
    if xi is None:
      return probs
    xi = jnp.asarray(xi)
    xi = {
      1: lambda: xi[None, :, None, None],
      2: lambda: xi[:, :, None, None],
      3: lambda: jnp.moveaxis(xi, 2, 1)[..., None],
    }[xi.ndim]().astype(probs.dtype)
    if self.head_ablation == "scale":
      return xi * probs
    seq_q, seq_k = probs.shape[-2:]
    allowed, _ = self.attention_mask(key_mask, window).allowed(probs.shape[0], seq_q, seq_k)
    real = allowed.astype(probs.dtype)[:, None]  # (B, 1, Tq, Tk)
    uniform = real / jnp.maximum(real.sum(-1, keepdims=True), 1)
    return xi * probs + (1 - xi) * uniform

  def attention_mask(self, key_mask, window=None) -> kernels.Mask:
    """The block's `kernels.Mask`: its real keys, its window, and on packed rows the
    segments (a query sees its own sequence only)."""
    seg = None if self.packing is None else self.packing.segment_ids
    return kernels.Mask(key_mask=key_mask, segment_ids=seg, window=window)


def uniform_values(v, key_mask, window, heads: int, rows=None, bounds=None):
  """The mean value each query sees under uniform attention: (B, T | R, N, D).

  Over the real keys; on a window layer over the real keys with `|q - k| <= window // 2`;
  with `bounds` (starts, ends), each (B, T), over the keys in columns [start, end) of the
  query's packed sequence (and its window). Bands are sums of prefix sums (O(T D)).
  Grouped values (G < N heads) serve their query heads.
  """
  acc = jnp.promote_types(v.dtype, jnp.float32)
  m = key_mask.astype(acc)[:, :, None, None]  # (B, T, 1, 1)
  vm = v.astype(acc) * m
  if window is None and bounds is None:
    mean_v = vm.sum(1, keepdims=True) / jnp.maximum(m.sum(1, keepdims=True), 1)
  else:
    seq = v.shape[1]
    q_idx = jnp.arange(seq)[None, :] if rows is None else rows  # (1 | B, T | R)
    zero = lambda x: jnp.zeros_like(x[:, :1])
    sums, counts = (jnp.concatenate([zero(x), jnp.cumsum(x, 1)], 1) for x in (vm, m))
    lo, hi = (jnp.zeros_like(q_idx), jnp.full_like(q_idx, seq)) if bounds is None else bounds
    if window is not None:
      hi = jnp.minimum(q_idx + window // 2 + 1, hi)
      lo = jnp.maximum(q_idx - window // 2, lo)
    hi = jnp.maximum(hi, lo)
    band = lambda c: (
      jnp.take_along_axis(c, _index(hi, c), 1) - jnp.take_along_axis(c, _index(lo, c), 1)
    )
    mean_v = band(sums) / jnp.maximum(band(counts), 1)
  return jnp.repeat(mean_v, heads // v.shape[2], axis=2) if v.shape[2] != heads else mean_v


def _index(idx, c):
  """(1 | B, T) positions as a take_along_axis index for (B, T + 1, G, D) prefix sums."""
  return jnp.broadcast_to(idx[:, :, None, None], (c.shape[0], idx.shape[1], 1, 1))
