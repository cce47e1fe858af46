"""Token attribution: how much each input token contributes to each representation.

Every method is a function of `(params, config, input_ids, attention_mask=None,
token_type_ids=None, ...)` that reads the model through its named sites
(`bertjax.forward(..., capture=...)`, `patch=...`, `run_layers`); none of them
re-implements the encoder block beyond the decomposition the method itself
defines. All are jitted with `config` static except `attention_flow` (NumPy/SciPy
max-flow). Each follows its paper's released code; where the code and the paper
or two codes differ, the docstring says which convention is kept.

* `attention_rollout`, `attention_flow`: Abnar & Zuidema 2020 (samiraabnar/attention_flow).
* `norm_analysis`: Kobayashi et al. 2020, 2021 (gorokoba560/norm-analysis-of-transformer):
  ||alpha f(x)|| per head and summed, and through the residual and LayerNorm.
* `alti`: Ferrando et al. 2022 (mt-upc/transformer-contributions).
* `globenc`: Modarressi et al. 2022 (mohsenfayyaz/GlobEnc).
* `value_zeroing`: Mohebbi et al. 2023 (hmohebbi/ValueZeroing).
* `gradient_x_input`, `integrated_gradients`: gradient baselines on the `embeddings`
  site (Shrikumar et al. 2017; Sundararajan et al. 2017, Captum's quadrature).
* `logit_lens`: every block's output through the MLM head (nostalgebraist 2020).

This module holds the methods that decompose the encoder blocks; the gradient methods and
the logit lens live in `bertjax.analysis.attribution.gradients`, and the pieces both share in
`bertjax.analysis.attribution.common`.

Conventions shared by all: a contribution matrix `M[l, b, i, j]` says how much
token j of block l's *input* contributes to token i of block l's *output*;
aggregated ("rollout") matrices say how much *input token* j (the embeddings)
contributes to token i after block l: `R[0] = M[0]`, `R[l] = M[l] @ R[l-1]`.
The released codes run one unpadded sentence at a time; here batches may be
right- (or, for RoBERTa, left-) padded, and every entry whose query or key is
padding is 0, so the real block of each sequence equals the single-sentence
computation. Analyses run in float32 (float64 for a float64 config) whatever the
compute dtype.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.analysis.attribution.common import Params, captured_sites, real_tokens
from bertjax.model.config import BertConfig
from bertjax.model.forward import run_layers
from bertjax.model.input_checks import check_inputs
from bertjax.model.layers import compute_dtype

# attention_flow: SciPy's max-flow takes integer capacities; these are in units of 2^-30.
FLOW_SCALE = 2**30


class Contributions(NamedTuple):
  """Per-block contribution matrices and their aggregation over depth.

  Attributes:
    layer: (depth, batch, seq, seq): `[l, b, i, j]`, the share of block l's input
      token j in block l's output token i.
    rollout: (depth, batch, seq, seq): `[l, b, i, j]`, the share of input token j
      (the embeddings) in token i after block l.
  """

  layer: jax.Array
  rollout: jax.Array


# Shared pieces ----------------------------------------------------------------


def _pairs(mask, dtype):
  """(B, T, T) 1 where both the query i and the key j are real tokens."""
  m = mask.astype(dtype)
  return m[:, :, None] * m[:, None, :]


def _safe_normalize(x, axis=-1):
  total = x.sum(axis, keepdims=True)
  return jnp.where(total > 0, x / jnp.where(total > 0, total, 1), 0)


def rollout(matrices, *, residual: bool = False) -> jax.Array:
  """Aggregates per-block matrices over depth: `R[0] = M[0]`, `R[l] = M[l] @ R[l-1]`.

  Abnar & Zuidema's `compute_joint_attention` (attention_graph_util.py), also
  used by ALTI, GlobEnc and value zeroing on their own matrices.

  Args:
    matrices: (depth, ..., seq, seq), rows are the receiving tokens.
    residual: add the identity and renormalise each row first (`(M + I) / rowsum`,
      i.e. `0.5 M + 0.5 I` for row-stochastic M), as Abnar & Zuidema do for attention.

  Returns:
    (depth, ..., seq, seq), `R[l]`.
  """
  m = jnp.asarray(matrices)
  if m.ndim < 3 or m.shape[-1] != m.shape[-2]:
    raise ValueError(f"matrices shape {m.shape} must be (depth, ..., seq, seq)")
  if residual:
    m = m + jnp.eye(m.shape[-1], dtype=m.dtype)
    m = m / m.sum(-1, keepdims=True)

  def step(prev, cur):
    new = jnp.matmul(cur, prev)
    return new, new

  _, rest = jax.lax.scan(step, m[0], m[1:])
  return jnp.concatenate([m[:1], rest], axis=0)


def _block_params(config: BertConfig, params: Params, dtype) -> dict[str, jax.Array]:
  """Each block's attention output projection and LayerNorms, stacked over depth.

  ALBERT blocks take their group's weights (`config.layer_param_index`); a pruned
  block's output kernel is scattered back to all heads (zeros for removed heads,
  whose captured values are zeros too).
  """
  layers = params["encoder"]["layers"]
  n, d, h = config.num_attention_heads, config.head_dim, config.hidden_size
  zeros = jnp.zeros((h,), dtype)  # a bias the family or config does not have

  def pick(p, block):
    a = p["attention"]
    wo = jnp.asarray(a["output"]["kernel"], dtype)  # (N_kept, D, H)
    if config.is_pruned:
      kept = np.asarray(config.kept_heads(block), np.int32)
      wo = jnp.zeros((n, d, h), dtype).at[kept].set(wo)
    return {
      "wo": wo,
      "bo": a["output"].get("bias", zeros),
      "ln1_scale": a["LayerNorm"]["scale"],
      "ln1_bias": a["LayerNorm"].get("bias", zeros),
      "ln2_scale": p["LayerNorm"]["scale"],
      "ln2_bias": p["LayerNorm"].get("bias", zeros),
    }

  if isinstance(layers, list):  # pruned: one dict per layer
    per_block = [pick(layers[b], b) for b in range(config.depth)]
  else:
    index = config.layer_param_index
    per_block = [pick(jax.tree.map(lambda a, i=i: a[i], layers), b) for b, i in enumerate(index)]
  return jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x, dtype) for x in xs]), *per_block)


def _head_mean(config: BertConfig, probs):
  """Mean over each block's heads (its kept heads when pruned): (L, B, N, T, T) -> (L, B, T, T)."""
  counts = np.asarray([max(len(config.kept_heads(b)), 1) for b in range(config.depth)])
  return probs.sum(2) / jnp.asarray(counts, probs.dtype)[:, None, None, None]


def _layer_norm_vectors(vectors, pre_ln, scale, eps):
  """LayerNorm applied to each summand of a sum: `scale * (v - mean v) / std(sum)`.

  The statistics are the real pre-LayerNorm sum's (Kobayashi et al. 2021); the
  bias is left out (it belongs to no token). vectors (B, T, T, H), pre_ln (B, T, H).
  """
  mean = pre_ln.mean(-1, keepdims=True)
  var = jnp.square(pre_ln - mean).mean(-1, keepdims=True)  # (B, T, 1)
  centred = vectors - vectors.mean(-1, keepdims=True)
  return scale * centred / jnp.sqrt(var + eps)[:, :, None, :], jnp.sqrt(var + eps)


def _decompose(probs, v, x, attn_out, wo, ln_scale, eps, post_ln=True):
  """Kobayashi et al.'s decomposition of one attention block by source token.

  probs (B, N, T, T), v (B, T, G, D) with bias (G key/value heads, repeated to N),
  x (B, T, H) the block input, attn_out (B, T, H). Returns f (B, N, T, H) = v W_O per
  head and source, attn (B, T, T, H) = sum_h alpha_hij f_h(x_j), res = attn + delta_ij x_i,
  ln (B, T, T, H) = res through LayerNorm 1 (no bias; post-LN only, else None), and the std
  (B, T, 1) used (None for pre-LN). On a pre-LN block v is read from the normed input
  `LN(x_j)`, a function of token j alone, so f_h(x_j) is still token j's.
  """
  v = jnp.repeat(v, probs.shape[1] // v.shape[2], axis=2) if v.shape[2] != probs.shape[1] else v
  f = jnp.einsum("bjnd,ndh->bnjh", v, wo)  # (B, N, T, H): f_h(x_j) = (x_j W_V + b_V) W_O^h
  attn = jnp.einsum("bnij,bnjh->bijh", probs, f)  # (B, T, T, H)
  eye = jnp.eye(x.shape[1], dtype=x.dtype)
  res = attn + eye[None, :, :, None] * x[:, :, None, :]
  if not post_ln:
    return f, attn, res, None, None
  ln, std = _layer_norm_vectors(res, x + attn_out, ln_scale, eps)
  return f, attn, res, ln, std


def _post_ln(config: BertConfig) -> bool:
  return config.family.norm == "post"


def _require_post_ln(config: BertConfig, method: str) -> None:
  """Refuses, by family, a method whose derivation needs post-LN LayerNorm blocks."""
  fam = config.family
  if fam.norm != "post" or fam.norm_kind != "layernorm":
    raise ValueError(
      f"{method} is derived for post-LayerNorm blocks (LayerNorm after each residual); a "
      f"{config.model_type} block is {fam.norm}-norm with {fam.norm_kind}, for which its "
      "authors define no decomposition. norm_analysis and alti decompose pre-norm blocks."
    )


def _refuse_sandwich(config: BertConfig, method: str) -> None:
  """Refuses a block that norms the attention output before the residual (Gemma 3's
  sandwich norms): the method splits that output by source token, and its authors define
  no split through a norm of the sum there."""
  if config.family.norm == "sandwich":
    raise ValueError(
      f"{method} decomposes the attention output by source token before the residual; a "
      f"{config.model_type} block norms that output first (sandwich norms), for which its "
      "authors define no decomposition"
    )


# Abnar & Zuidema 2020: attention rollout and attention flow ---------------------


def attention_rollout(
  params: Params,
  config: BertConfig,
  input_ids,
  attention_mask=None,
  token_type_ids=None,
  *,
  residual: bool = True,
) -> jax.Array:
  """Attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers").

  As `compute_joint_attention` in samiraabnar/attention_flow (attention_graph_util.py,
  bert_example.ipynb): heads averaged (`sum / num_heads`), the residual added as
  `(A + I) / rowsum` (= `0.5 A + 0.5 I`), then multiplied up through the layers.
  A pruned block averages over the heads it still has.

  Args:
    params, config: the model.
    input_ids, attention_mask, token_type_ids: (batch, seq) as for `bertjax.forward`.
    residual: False gives the paper's rollout of raw attention (`add_residual=False`).

  Returns:
    (depth, batch, seq, seq): `[l, b, i, j]`, the share of input token j in token i
    after block l; rows of real tokens sum to 1, padded rows and columns are 0.
  """
  check_inputs(config, input_ids, attention_mask, token_type_ids)
  return _attention_rollout(
    params, config, input_ids, real_tokens(input_ids, attention_mask), token_type_ids, residual
  )


@functools.partial(jax.jit, static_argnums=(1, 5))
def _attention_rollout(params, config, input_ids, mask, token_type_ids, residual):
  probs = captured_sites(params, config, input_ids, mask, token_type_ids, ("probs",))["probs"]
  pairs = _pairs(mask, probs.dtype)
  joint = rollout(_head_mean(config, probs) * pairs, residual=residual)
  return joint * pairs


def _attention_matrices(params, config, input_ids, mask, token_type_ids):
  probs = captured_sites(params, config, input_ids, mask, token_type_ids, ("probs",))["probs"]
  a = _head_mean(config, probs) * _pairs(mask, probs.dtype)
  a = a + jnp.eye(a.shape[-1], dtype=a.dtype)
  return a / a.sum(-1, keepdims=True)  # (L, B, T, T)


_attention_matrices_jit = jax.jit(_attention_matrices, static_argnums=(1,))


def attention_flow(
  params: Params,
  config: BertConfig,
  input_ids,
  attention_mask=None,
  token_type_ids=None,
  *,
  layers=None,
) -> np.ndarray:
  """Attention flow (Abnar & Zuidema 2020): max-flow from each token to each input token.

  As `compute_flows` in samiraabnar/attention_flow: the layered graph has one node
  per (layer, token), edges from token i of layer l+1 to token j of layer l with
  capacity `0.5 A_l[i, j] + 0.5 [i == j]` (heads averaged, as in rollout); the flow
  value from node (l+1, i) to input node (0, j) is computed for every j and each
  row is divided by its sum. The released code uses networkx's Edmonds-Karp on
  float capacities; here SciPy's Dinic (`scipy.sparse.csgraph.maximum_flow`) on
  capacities rounded to multiples of 2^-30 (flows agree to ~1e-8).

  Not jittable and slow: `depth * n^2` max-flow problems per sequence of n real
  tokens, each on a graph of `depth * n^2` edges, so time grows like
  `depth^2 n^4`: all-MiniLM-L6-v2 on one sentence of 15 tokens takes 0.3 s for all
  six blocks and 0.06 s for the last one (`layers=[5]`) on a 2-core CPU (after the
  first call compiles); each doubling of the tokens multiplies it by about 16 (by
  that rule, 128 tokens take about half an hour). Pass `layers` to compute only some
  blocks.

  Args:
    params, config: the model.
    input_ids, attention_mask, token_type_ids: (batch, seq) as for `bertjax.forward`.
    layers: block indices whose outputs are the flow sources (default: all).

  Returns:
    float64 (len(layers), batch, seq, seq): `[k, b, i, j]`, the normalised flow from
    token i after block `layers[k]` to input token j; padded rows and columns are 0.
  """
  from scipy.sparse import csr_array  # pylint: disable=import-outside-toplevel
  from scipy.sparse.csgraph import maximum_flow  # pylint: disable=import-outside-toplevel

  check_inputs(config, input_ids, attention_mask, token_type_ids)
  layers = list(range(config.depth)) if layers is None else [int(l_) for l_ in layers]
  if not layers:
    raise ValueError("layers=[] selects no block; give block indices, or None for all")
  bad = [l_ for l_ in layers if not 0 <= l_ < config.depth]
  if bad:
    raise ValueError(f"layers {bad} are outside [0, {config.depth})")
  mask = np.asarray(real_tokens(input_ids, attention_mask))
  mats = np.asarray(
    _attention_matrices_jit(params, config, input_ids, jnp.asarray(mask), token_type_ids),
    np.float64,
  )
  batch, seq = mats.shape[1:3]
  flows = np.zeros((len(layers), batch, seq, seq))
  top = max(layers) + 1
  for b in range(batch):
    real = np.flatnonzero(mask[b])
    n = len(real)
    if n == 0:
      continue
    a = mats[:top, b][:, real][:, :, real]  # (top, n, n)
    # Node (m, i) is m * n + i; block m-1 maps layer m's tokens onto layer m-1's.
    rows, cols, caps = [], [], []
    for m in range(1, top + 1):
      i, j = np.nonzero(a[m - 1] > 0)
      rows.append(m * n + i)
      cols.append((m - 1) * n + j)
      caps.append(np.round(a[m - 1][i, j] * FLOW_SCALE))
    nodes = (top + 1) * n
    graph = csr_array(
      (np.concatenate(caps).astype(np.int32), (np.concatenate(rows), np.concatenate(cols))),
      shape=(nodes, nodes),
    )
    for k, layer in enumerate(layers):
      for i in range(n):
        values = np.array(
          [maximum_flow(graph, (layer + 1) * n + i, j).flow_value for j in range(n)], np.float64
        )
        flows[k, b, real[i], real] = values / values.sum()
  return flows


# Kobayashi et al. 2020, 2021: norm-based analysis --------------------------------


def norm_analysis(
  params: Params, config: BertConfig, input_ids, attention_mask=None, token_type_ids=None
) -> dict[str, jax.Array]:
  """Norm-based analysis of attention (Kobayashi et al. 2020, 2021).

  Kobayashi et al. 2020, "Attention is Not Only a Weight: Analyzing Transformers
  with Vector Norms"; 2021, "Incorporating Residual and Normalization Layers into
  Analysis of Masked Language Models" (gorokoba560/norm-analysis-of-transformer,
  `BertNormOutput` in emnlp2020/ and emnlp2021/ transformers/modeling_bert.py).
  With f_h(x) = (x W_V^h + b_V^h) W_O^h (the output bias b_O left out, as there):

  * "f": ||f_h(x_j)||; "head": ||alpha_hij f_h(x_j)|| (2020, per head);
  * "attn": ||sum_h alpha_hij f_h(x_j)|| (2020 layer level; 2021 Attn-N);
  * "attnres": ||sum_h alpha_hij f_h(x_j) + [i == j] x_i|| (AttnRes-N, the residual);
  * "attnresln": the same vector through LayerNorm 1 without its bias,
    ||gamma * (v - mean v) / sqrt(var(p_i) + eps)|| with p_i the real pre-LayerNorm
    state of token i (AttnResLn-N, the paper's proposal);
  * "mixing_attn", "mixing_attnres", "mixing_attnresln": the code's mixing ratios
    ||sum_{j != i} v_ij|| / (||sum_{j != i} v_ij|| + ||v_ii||).

  Pre-norm blocks (ModernBERT, EuroBERT: `x + attn(LN(x))`) have no LayerNorm after the
  residual: f_h reads the normed token `LN(x_j)`, "attnres" is the residual stream itself,
  and "attnresln" / "mixing_attnresln" are absent (there is nothing to pass through).

  The vectors of one block are (batch, seq, seq, hidden); blocks run one at a time
  (`lax.map`), so memory grows like `batch * seq^2 * hidden`, not times depth.

  Args:
    params, config: the model.
    input_ids, attention_mask, token_type_ids: (batch, seq) as for `bertjax.forward`.

  Returns:
    A dict: "f" (depth, batch, heads, seq), "head" (depth, batch, heads, seq, seq),
    "attn", "attnres", "attnresln" (depth, batch, seq, seq) indexed [query i, source j],
    and the mixing ratios (depth, batch, seq). Padded queries and sources are 0.
  """
  _refuse_sandwich(config, "norm_analysis")
  check_inputs(config, input_ids, attention_mask, token_type_ids)
  return _norm_analysis(
    params, config, input_ids, real_tokens(input_ids, attention_mask), token_type_ids
  )


def _mixing_ratio(vectors):
  diag = jnp.diagonal(vectors, axis1=1, axis2=2)  # (B, H, T)
  diag = jnp.swapaxes(diag, 1, 2)  # (B, T, H)
  mixing = jnp.linalg.norm(vectors.sum(2) - diag, axis=-1)
  preserving = jnp.linalg.norm(diag, axis=-1)
  total = mixing + preserving
  return jnp.where(total > 0, mixing / jnp.where(total > 0, total, 1), 0)


@functools.partial(jax.jit, static_argnums=(1,))
def _norm_analysis(params, config, input_ids, mask, token_type_ids):
  cache = captured_sites(
    params, config, input_ids, mask, token_type_ids, ("embeddings", "out", "probs", "v", "attn_out")
  )
  dtype = cache["x"].dtype
  bp = _block_params(config, params, dtype)
  m = mask.astype(dtype)
  pairs = _pairs(mask, dtype)

  post_ln = _post_ln(config)

  def block(xs):
    probs, v, x, attn_out, wo, scale = xs
    f, attn, res, ln, _ = _decompose(
      probs, v, x, attn_out, wo, scale, config.layer_norm_eps, post_ln
    )
    f_norm = jnp.linalg.norm(f, axis=-1) * m[:, None, :]  # (B, N, T)
    out = {
      "f": f_norm,
      "head": probs * f_norm[:, :, None, :] * pairs[:, None],
      "attn": jnp.linalg.norm(attn, axis=-1) * pairs,
      "attnres": jnp.linalg.norm(res, axis=-1) * pairs,
      "mixing_attn": _mixing_ratio(attn) * m,
      "mixing_attnres": _mixing_ratio(res) * m,
    }
    if post_ln:
      out.update(
        attnresln=jnp.linalg.norm(ln, axis=-1) * pairs, mixing_attnresln=_mixing_ratio(ln) * m
      )
    return out

  return jax.lax.map(
    block, (cache["probs"], cache["v"], cache["x"], cache["attn_out"], bp["wo"], bp["ln1_scale"])
  )


# Ferrando et al. 2022 (ALTI) and Modarressi et al. 2022 (GlobEnc) ---------------

# torch.nn.functional.pairwise_distance's default eps, which ALTI's released code keeps.
ALTI_EPS = 1e-6


def alti(
  params: Params, config: BertConfig, input_ids, attention_mask=None, token_type_ids=None
) -> Contributions:
  """ALTI: Aggregation of Layer-wise Token-to-token Interactions (Ferrando et al. 2022).

  Ferrando, Gallego & Costa-jussa 2022, "Measuring the Mixing of Contextual
  Information in the Transformer"; as mt-upc/transformer-contributions
  (`ModelWrapper.get_contributions`, `normalize_contributions(scaling="min_sum")`,
  `compute_joint_attention`). The attention block's output (after LayerNorm 1) is
  `y_i = sum_j T_i(x_j) + L(b_O) / sigma_i + beta`, with
  `T_i(x_j) = L(sum_h alpha_hij f_h(x_j) + [i == j] x_i) / sigma_i` and
  `L(v) = gamma * (v - mean v)`; token j's contribution to i is
  `max(0, ||y_i||_1 - ||T_i(x_j) - y_i + eps||_1)` with `eps = ALTI_EPS = 1e-6`, as the
  released code's `F.pairwise_distance(T, y, p=1)` computes it (its default eps sits inside
  the norm; on all-MiniLM-L6-v2 it moves contributions by up to ~1.4e-4), normalised over j;
  the feed-forward network is not decomposed (the paper's choice); contributions roll out
  without an added residual (it is inside T). One difference: the released code takes
  `sigma_i = std(p_i + eps)`, i.e. without eps under the root; here
  `sigma_i = sqrt(var(p_i) + eps)`, the model's own LayerNorm, so `y` is exactly the
  `mid` site (the two differ by ~eps / var, 1e-12 relative for BERT).

  Pre-norm blocks (ModernBERT, EuroBERT) follow ALTI+ (Ferrando et al. 2022, "Towards
  Opening the Black Box of Neural Machine Translation", mt-upc/transformer-contributions-nmt,
  pre-LayerNorm fairseq models): with no LayerNorm after the residual,
  `T_i(x_j) = sum_h alpha_hij f_h(LN(x_j)) + [i == j] x_i` and `y_i = sum_j T_i(x_j) + b_O`,
  the `mid` site; the distance and normalisation are as above.

  Args:
    params, config: the model.
    input_ids, attention_mask, token_type_ids: (batch, seq) as for `bertjax.forward`.

  Returns:
    `Contributions(layer, rollout)`, each (depth, batch, seq, seq); rows of real
    tokens sum to 1 in `layer`.
  """
  _refuse_sandwich(config, "alti")
  check_inputs(config, input_ids, attention_mask, token_type_ids)
  return _alti(params, config, input_ids, real_tokens(input_ids, attention_mask), token_type_ids)


@functools.partial(jax.jit, static_argnums=(1,))
def _alti(params, config, input_ids, mask, token_type_ids):
  cache = captured_sites(
    params, config, input_ids, mask, token_type_ids, ("embeddings", "out", "probs", "v", "attn_out")
  )
  dtype = cache["x"].dtype
  bp = _block_params(config, params, dtype)
  pairs = _pairs(mask, dtype)

  post_ln = _post_ln(config)

  def block(xs):
    probs, v, x, attn_out, wo, bo, scale, bias = xs
    _, _, res, t, std = _decompose(probs, v, x, attn_out, wo, scale, config.layer_norm_eps, post_ln)
    if post_ln:
      bias_term = scale * (bo - bo.mean()) / std  # (B, T, H): L(b_O) / sigma_i
      y = t.sum(2) + bias_term + bias  # (B, T, H), = the mid site
    else:  # ALTI+: no LayerNorm after the residual
      t = res
      y = t.sum(2) + bo  # = the mid site
    # (B, T, T) ||T_i(x_j) - y_i + eps||_1: the released code's F.pairwise_distance(p=1),
    # whose default eps = 1e-6 is added inside the norm (up to ~1.4e-4 on MiniLM's contributions)
    distance = jnp.abs(t - y[:, :, None, :] + ALTI_EPS).sum(-1)
    c = jnp.maximum(jnp.abs(y).sum(-1)[:, :, None] - distance, 0) * pairs
    return _safe_normalize(c)

  layer = jax.lax.map(
    block,
    (
      cache["probs"],
      cache["v"],
      cache["x"],
      cache["attn_out"],
      bp["wo"],
      bp["bo"],
      bp["ln1_scale"],
      bp["ln1_bias"],
    ),
  )
  return Contributions(layer, rollout(layer) * pairs)


def globenc(
  params: Params, config: BertConfig, input_ids, attention_mask=None, token_type_ids=None
) -> Contributions:
  """GlobEnc (Modarressi et al. 2022): norms through the whole encoder layer, rolled out.

  Modarressi, Fayyaz, Yaghoobzadeh & Pilehvar 2022, "GlobEnc: Quantifying Global
  Token Attribution by Incorporating the Whole Encoder Layer in Transformers"; as
  mohsenfayyaz/GlobEnc (src/modeling/modeling_bert.py, `BertLayer.forward` with
  `output_globenc`, and `AttentionRollout`). N_ENC[i, j] is the norm of Kobayashi
  et al.'s AttnResLn-N vector (see `norm_analysis`) passed through LayerNorm 2
  without its bias, with the statistics of the real pre-LayerNorm-2 state
  `mid_i + ffn_out_i` (the feed-forward network is bypassed, the paper's choice).
  The aggregation is the released code's: a plain product of the raw N_ENC
  matrices, no residual, no normalisation (the demo divides by the row maximum
  for display; normalise `rollout` rows yourself for shares).

  Args:
    params, config: the model.
    input_ids, attention_mask, token_type_ids: (batch, seq) as for `bertjax.forward`.

  Returns:
    `Contributions(layer, rollout)`, each (depth, batch, seq, seq), unnormalised.
  """
  check_inputs(config, input_ids, attention_mask, token_type_ids)
  _require_post_ln(config, "globenc")
  return _globenc(params, config, input_ids, real_tokens(input_ids, attention_mask), token_type_ids)


@functools.partial(jax.jit, static_argnums=(1,))
def _globenc(params, config, input_ids, mask, token_type_ids):
  cache = captured_sites(
    params,
    config,
    input_ids,
    mask,
    token_type_ids,
    ("embeddings", "out", "probs", "v", "attn_out", "mid", "ffn_out"),
  )
  dtype = cache["x"].dtype
  bp = _block_params(config, params, dtype)
  pairs = _pairs(mask, dtype)

  def block(xs):
    probs, v, x, attn_out, mid, ffn_out, wo, scale1, scale2 = xs
    *_, ln1, _ = _decompose(probs, v, x, attn_out, wo, scale1, config.layer_norm_eps)
    ln2, _ = _layer_norm_vectors(ln1, mid + ffn_out, scale2, config.layer_norm_eps)
    return jnp.linalg.norm(ln2, axis=-1) * pairs

  layer = jax.lax.map(
    block,
    (
      cache["probs"],
      cache["v"],
      cache["x"],
      cache["attn_out"],
      cache["mid"],
      cache["ffn_out"],
      bp["wo"],
      bp["ln1_scale"],
      bp["ln2_scale"],
    ),
  )
  return Contributions(layer, rollout(layer) * pairs)


# Mohebbi et al. 2023: value zeroing -----------------------------------------------


def value_zeroing(
  params: Params,
  config: BertConfig,
  input_ids,
  attention_mask=None,
  token_type_ids=None,
  *,
  chunk_size: int | None = None,
) -> Contributions:
  """Value zeroing (Mohebbi et al. 2023).

  Mohebbi, Zuidema, Chrupala & Alishahi 2023, "Quantifying Context Mixing in
  Transformers"; as hmohebbi/ValueZeroing (scoring/value_zeroing.py, demo.py): for
  each block l and token j, block l is run again on its original input with token
  j's value vectors zeroed in every head (a `v` patch, weight 1 at position j), and
  token i's score is the cosine distance between its new and original block
  output; each row is divided by its sum over j, and the rows roll out without an
  added residual (`compute_joint_attention(..., res=False)`). The re-runs are one
  `run_layers(start=l, stop=l+1)` per block, vmapped over j. The distance is
  computed as `|a/|a| - b/|b||^2 / 2`, equal to sklearn's `1 - cos` but without its
  cancellation (distances are often ~1e-4, where `1 - cos` in float32 keeps two digits).

  Args:
    params, config: the model.
    input_ids, attention_mask, token_type_ids: (batch, seq) as for `bertjax.forward`.
    chunk_size: zeroed positions run together per block (default: all `seq`); lower it
      to bound memory (`chunk_size` copies of one block's activations).

  Returns:
    `Contributions(layer, rollout)`, each (depth, batch, seq, seq); rows of real
    tokens sum to 1 in `layer`.
  """
  check_inputs(config, input_ids, attention_mask, token_type_ids)
  if chunk_size is not None and chunk_size < 1:
    raise ValueError(f"{chunk_size=} must be a positive int or None")
  return _value_zeroing(
    params, config, input_ids, real_tokens(input_ids, attention_mask), token_type_ids, chunk_size
  )


def _cosine_distance(a, b):
  # 1 - <a/|a|, b/|b|> (sklearn's cosine_distances), as |a/|a| - b/|b||^2 / 2: the same number
  # without the cancellation of 1 - cos, which in float32 costs ~1e-7 absolute on distances
  # that are often 1e-4.
  a = a / jnp.maximum(jnp.linalg.norm(a, axis=-1, keepdims=True), 1e-30)
  b = b / jnp.maximum(jnp.linalg.norm(b, axis=-1, keepdims=True), 1e-30)
  return jnp.clip(0.5 * jnp.square(a - b).sum(-1), 0, 2)


@functools.partial(jax.jit, static_argnums=(1, 5))
def _value_zeroing(params, config, input_ids, mask, token_type_ids, chunk_size):
  cache = captured_sites(params, config, input_ids, mask, token_type_ids, ("embeddings", "out"))
  dtype = cache["x"].dtype
  seq = input_ids.shape[1]
  pairs = _pairs(mask, dtype)
  zero = jnp.zeros((), compute_dtype(config))
  scores = []
  for layer in range(config.depth):
    x = cache["x"][layer].astype(compute_dtype(config))

    def zeroed(j, x=x, layer=layer):
      w = (jnp.arange(seq) == j).astype(compute_dtype(config))[None, None, :, None, None]
      return run_layers(
        params, config, x, mask, start=layer, stop=layer + 1, patch={"v": (zero, w)}
      ).last  # (B, T, H)

    outs = jax.lax.map(zeroed, jnp.arange(seq), batch_size=chunk_size)  # (T_j, B, T_i, H)
    d = _cosine_distance(outs.astype(dtype), cache["out"][layer][None])  # (T_j, B, T_i)
    scores.append(jnp.transpose(d, (1, 2, 0)) * pairs)  # (B, T_i, T_j)
  layer_scores = _safe_normalize(jnp.stack(scores))
  return Contributions(layer_scores, rollout(layer_scores) * pairs)
