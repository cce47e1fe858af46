"""The pure API: functions of `(params, config, inputs)`, jittable with `config` static.

`forward` runs embeddings, then the stack of encoder blocks under `lax.scan`
(layer parameters stacked on a leading axis; ALBERT blocks index their shared
group), then the pooler. Interventions are data: a head mask `(depth, heads)`
or `(batch, depth, heads)`, a layer mask `(depth,)` and patches of named sites
(`capture=` / `patch=`, see `bertjax.model.sites.SITES`) make one
`bertjax.Intervention`, built at the entry and scanned with the blocks, so `jax.grad`
gives head importance and attribution patching, and `jax.vmap` gives ablation and
patching sweeps.

The lower-level pieces (`embed`, `run_layers`, `pool`) are public too: analyses
that intervene at block `l` reuse the activations below it instead of
recomputing them. There is one block (`layers.EncoderLayer`) and one loop over
blocks (`run_layers`); pruned models, attention statistics, overrides and
patches all go through them. The input checks (`check_inputs`, `value_checks`) are in
`bertjax.model.input_checks`; `checked_forward` compiles them into the program. The heads
are `bertjax.model.heads`, pruning `bertjax.model.prune`.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import flax
import jax
import jax.numpy as jnp
import numpy as np

from bertjax import kernels
from bertjax.model.config import BertConfig
from bertjax.model.heads import Pooler, head_module, pool
from bertjax.model.input_checks import check_block_sites, check_inputs, value_checks
from bertjax.model.intervention import KEYWORDS, Intervention, as_array, intervention_of
from bertjax.model.layers import (
  Embeddings,
  EncoderLayer,
  Params,
  compute_dtype,
  final_norm_module,
  relative_embeddings,
)
from bertjax.model.packing import Packing, pack, pack_site, unpack, unpack_site
from bertjax.model.prune import prune_heads
from bertjax.model.sites import ROW_AXIS, SITES, Sites, mix, put_rows

ABLATIONS = kernels.ABLATIONS  # the head_ablation values, defined once in kernels


@flax.struct.dataclass
class BertOutput:
  """What `forward` returns; field names follow Hugging Face."""

  last_hidden_state: jax.Array  # (B, T, H)
  pooler_output: jax.Array | None = None  # (B, H)
  hidden_states: jax.Array | None = None  # (depth + 1, B, T, H), embeddings first
  attentions: jax.Array | None = None  # (depth, B, N, T, T)
  cache: dict[str, jax.Array] | None = None  # captured sites, stacked over depth


class LayersOutput(NamedTuple):
  """What `run_layers` returns for blocks `start .. stop-1`."""

  last: jax.Array  # (B, T, H): the output of block stop-1
  hidden_states: jax.Array | None  # (stop-start, B, T, H) when asked
  attentions: jax.Array | None  # (stop-start, B, N, T, T) when asked
  cache: dict[str, jax.Array]  # captured sites, (stop-start, ...) each


# Initialisation -------------------------------------------------------------


def init(config: BertConfig, rng: int | jax.Array = 0, heads: tuple[str, ...] = ()) -> Params:
  """Fresh parameters for `config`, with the named task heads.

  Args:
    config: the architecture.
    rng: a seed or a JAX PRNG key.
    heads: any of the family's heads (`config.family.heads`): "mlm", "nsp"
      (BERT), "sop" (ALBERT), "rtd" (ELECTRA), "classifier" (`config.num_labels`
      outputs), "token_classifier".

  Returns:
    The parameter pytree: `embeddings`, `encoder/layers` (stacked on a leading
    axis of size `config.num_param_layers`), `pooler` when `config.has_pooler`,
    and one entry per head.
  """
  unknown = set(heads) - set(config.family.heads)
  if unknown:
    raise ValueError(
      f"heads={sorted(unknown)} are not heads of a {config.model_type} model; "
      f"expected a subset of {tuple(config.family.heads)}"
    )
  key = jax.random.key(rng) if isinstance(rng, int) else rng
  return _init(config, key, tuple(sorted(heads)))


@functools.partial(jax.jit, static_argnums=(0, 2))
def _init(config: BertConfig, key: jax.Array, heads: tuple[str, ...]) -> Params:
  if config.is_pruned:
    full = config.replace(pruned_heads=())
    return prune_heads(full, _init(full, key, heads), dict(config.pruned_heads))[1]
  k_emb, k_layers, k_pool, k_heads = jax.random.split(key, 4)
  ids = jnp.zeros((1, 2), jnp.int32)
  x = jnp.zeros((1, 2, config.hidden_size), compute_dtype(config))
  mask = jnp.ones((1, 2), bool)
  params: Params = {"embeddings": Embeddings(config).init(k_emb, ids, ids)["params"]}
  # Its own key, so that adding the table changed no other family's initial parameters.
  params["encoder"] = _init_position_table(config, jax.random.fold_in(key, 1))
  bias_table = relative_embeddings(params, config)
  # Block 1's structure (block 0 of ModernBERT skips its attention norm, so its init would
  # not create one); every block has the same parameters.
  layer_init = lambda k: EncoderLayer(config).init(
    k, x, mask, layer=min(1, config.depth - 1), bias_table=bias_table
  )["params"]
  layer_keys = jax.random.split(k_layers, config.num_param_layers)
  params["encoder"]["layers"] = jax.vmap(layer_init)(layer_keys)
  norm = final_norm_module(config)
  if norm is not None:
    params["encoder"]["LayerNorm"] = norm.init(k_pool, x)["params"]
  if config.has_pooler:
    params["pooler"] = Pooler(config).init(k_pool, x)["params"]
  for head, k in zip(heads, jax.random.split(k_heads, max(len(heads), 1))):
    if head == "mlm":
      word = params["embeddings"]["word_embeddings"]["embedding"]
      params[head] = head_module(config, head).init(k, x, word)["params"]
    else:
      params[head] = head_module(config, head).init(k, x[:, 0])["params"]
  return params


def _init_position_table(config: BertConfig, key) -> Params:
  """The encoder's tables shared by every block (its own key, so adding them changed no
  other family's initial parameters): MPNet's relative-position bias (buckets, heads);
  DeBERTa's relative embeddings (2 s, H) and their norm; nothing for other families."""
  fam = config.family
  if fam.position_bias == "relative_buckets":
    shape = (config.relative_attention_num_buckets, config.num_attention_heads)
    return {
      "relative_attention_bias": {
        "embedding": jax.random.normal(key, shape) * config.initializer_range
      }
    }
  if not config.disentangled_terms:
    return {}
  shape = (2 * config.rel_span, config.hidden_size)
  tables = {
    "rel_embeddings": {"embedding": jax.random.normal(key, shape) * config.initializer_range}
  }
  if config.norm_rel_ebd == "layer_norm":
    tables["rel_norm"] = {
      "scale": jnp.ones(config.hidden_size),
      "bias": jnp.zeros(config.hidden_size),
    }
  return tables


# Checked forward ------------------------------------------------------------


_STATIC_FORWARD_ARGS = ("output_hidden_states", "output_attentions", "deterministic")


def checked_forward(
  params: Params, config: BertConfig, input_ids, attention_mask=None, token_type_ids=None, **kwargs
) -> BertOutput:
  """A compiled `forward` whose value checks are compiled in too.

  Takes `forward`'s arguments and is itself jitted (call it directly, not inside
  your own `jit`): the checks run on the device as part of the program
  (`jax.experimental.checkify`), so a bad token id raises the ValueError eager
  `forward` raises, naming the values, instead of being clamped by the
  embedding gather. Costs one reduction over the ids.
  """
  from jax.experimental import checkify

  intervention = intervention_of(
    kwargs.pop("intervention", None), **{k: kwargs.pop(k) for k in KEYWORDS if k in kwargs}
  )
  static = tuple(sorted((k, v) for k, v in kwargs.items() if k in _STATIC_FORWARD_ARGS))
  dynamic = {k: v for k, v in kwargs.items() if k not in _STATIC_FORWARD_ARGS}
  dynamic["intervention"] = intervention  # a pytree: its static part rides in the treedef
  if "packed" in dynamic and not isinstance(dynamic["packed"], Packing):
    # The layout needs the concrete mask, outside the jit; False is no packing.
    packed = dynamic.pop("packed")
    if packed is True:
      dynamic["packed"] = Packing.of(
        np.ones(np.shape(input_ids)) if attention_mask is None else attention_mask
      )
    elif packed not in (False, None):
      raise TypeError(f"packed={type(packed).__name__} must be True, False or a Packing")
  err, out = _checked_forward(
    params,
    config,
    as_array(input_ids),
    as_array(attention_mask),
    as_array(token_type_ids),
    dynamic,
    static,
  )
  try:
    err.throw()
  except checkify.JaxRuntimeError as e:
    message = str(e).split("\n")[0]
    for tail in (" (`check` failed)", " (check failed at"):
      message = message.split(tail)[0]
    raise ValueError(message) from None
  return out


@functools.partial(jax.jit, static_argnums=(1, 6))
def _checked_forward(params, config, input_ids, attention_mask, token_type_ids, dynamic, static):
  from jax.experimental import checkify

  def run(params, input_ids, attention_mask, token_type_ids, dynamic):
    value_checks(config, input_ids, token_type_ids, attention_mask)
    return forward(
      params, config, input_ids, attention_mask, token_type_ids, **dynamic, **dict(static)
    )

  return checkify.checkify(run)(params, input_ids, attention_mask, token_type_ids, dynamic)


# The forward pass -----------------------------------------------------------


def forward(
  params: Params,
  config: BertConfig,
  input_ids,
  attention_mask=None,
  token_type_ids=None,
  *,
  head_mask=None,
  head_ablation: str = "scale",
  layer_mask=None,
  output_hidden_states: bool = False,
  output_attentions: bool = False,
  capture=(),
  patch=None,
  deterministic: bool = True,
  rng: jax.Array | None = None,
  packed: bool | Packing = False,
  intervention: Intervention | None = None,
) -> BertOutput:
  """Runs the encoder (and pooler) on a batch.

  Args:
    params: the parameter pytree (`init` or `from_hf`).
    config: the architecture (static under `jit`).
    input_ids: int (batch, seq).
    attention_mask: (batch, seq), 1 for real tokens; None means all ones.
    token_type_ids: (batch, seq); None means all zeros.
    head_mask: float (layers, heads) or (batch, layers, heads); layers = `config.depth`.
    head_ablation: "scale" multiplies each head's output by its mask value
      (Michel et al.); "uniform" makes the attention `xi * A + (1 - xi) * U`
      with U uniform over the real tokens (Kovaleva et al.).
    layer_mask: float (layers,): a block's output becomes `m * block(x) + (1 - m) * x`,
      so 0 skips it (identity).
    output_hidden_states: also return every block's output, embeddings first.
    output_attentions: also return the attention maps (the map path computes them).
    capture: site names (`bertjax.SITES`) to return in `out.cache`, stacked over depth.
    patch: {site: (value, weight)}: each site becomes `weight * value + (1 - weight) * own`;
      value and weight broadcast to the site's stacked shape (`bertjax.site_shape`).
      Differentiable in both; vmap over them for sweeps. Applied after head masks.
      Weights are not clipped: outside [0, 1] they extrapolate (2 doubles the edit,
      -1 pushes away from `value`). Or {site: fn}: a block site becomes `fn(value, index)`,
      with `value` the site in one block (batch first, no depth axis) and `index` the
      block's 0-based index (a traced int under the layer scan; index i is layer i + 1);
      traced under jit, vmap and grad like the rest. The function is a static argument:
      define it once (not a new lambda per call) so that it compiles once.
    deterministic: False enables dropout; then `rng` is required.
    rng: PRNG key for dropout.
    packed: True removes the padding before the blocks: the sequences are laid end to end
      in rows (`bertjax.Packing.of(attention_mask)`, which needs a concrete right-padded
      mask; inside `jit` pass the `Packing` itself), every block runs on the rows with
      each query seeing its own sequence only, and every output, captured site and map
      comes back in the padded layout, equal to the padded run's at real tokens and zero
      at padding (as transformers' unpadded ModernBERT returns). Head masks, layer masks
      and array patches are given in the padded layout as usual (a `probs` patch that puts
      weight on padded keys has no packed counterpart: packed rows have no such keys);
      function patches see one block's packed rows, so they are refused here. With
      dropout the packed and padded runs draw different masks. RoBERTa's positions come
      from the mask here, from `input_ids != pad_token_id` in the padded run (the same
      unless a real token is the pad id). Not with attention_impl "cudnn" (no segments
      there). A `Packing` passed in must be of this batch's mask (checked when concrete).
    intervention: a `bertjax.Intervention` holding `head_mask`, `head_ablation`,
      `layer_mask`, `capture` and `patch` as one value, instead of those keywords (not
      with them). It is a pytree: build it once and pass it through `jit`, `vmap` a stack
      of them for a sweep, or take `grad` with respect to it.

  Returns:
    A `BertOutput`.
  """
  intervention = intervention_of(
    intervention,
    head_mask=head_mask,
    head_ablation=head_ablation,
    layer_mask=layer_mask,
    capture=capture,
    patch=patch,
  )
  input_ids, attention_mask, token_type_ids = map(
    as_array, (input_ids, attention_mask, token_type_ids)
  )
  check_inputs(config, input_ids, attention_mask, token_type_ids, intervention=intervention)
  if not deterministic and rng is None:
    raise ValueError("deterministic=False (dropout) needs an rng key")
  packing = _packing_of(config, packed, input_ids, attention_mask, intervention.functions)
  return _forward(
    params,
    config,
    input_ids,
    attention_mask,
    token_type_ids,
    intervention,
    rng,
    packing,
    output_hidden_states,
    output_attentions,
    deterministic,
  )


def _packing_of(config, packed, input_ids, attention_mask, functions) -> Packing | None:
  """`forward`'s `packed=` as a `Packing` (or None), checked against what packing allows."""
  if packed is False or packed is None:
    return None
  if functions:
    raise ValueError(
      f"packed=True takes array patches; the function patches of "
      f"{[site for site, _ in functions]} would see packed rows, not the batch"
    )
  if kernels.attention_impl(config.attention_impl) == "cudnn":
    raise ValueError(
      "packed=True needs segment ids in the attention kernel: use "
      "attention_impl 'pallas' or 'xla', not 'cudnn'"
    )
  if packed is True:
    mask = np.ones(np.shape(input_ids), bool) if attention_mask is None else attention_mask
    return Packing.of(mask)
  if not isinstance(packed, Packing):
    raise TypeError(f"packed={type(packed).__name__} must be True, False or a Packing")
  if tuple(packed.row.shape) != (np.shape(input_ids)[0],) or packed.seq != np.shape(input_ids)[1]:
    raise ValueError(
      f"the Packing is of a ({packed.row.shape[0]}, {packed.seq}) batch; "
      f"input_ids is {tuple(np.shape(input_ids))}"
    )
  concrete = not any(isinstance(a, jax.core.Tracer) for a in (attention_mask, packed.lengths))
  if attention_mask is not None and concrete:
    lengths = np.asarray(attention_mask).astype(bool).sum(1)
    if not np.array_equal(lengths, np.asarray(packed.lengths)):
      raise ValueError(
        f"the Packing holds sequences of {np.asarray(packed.lengths).tolist()} "
        f"tokens; attention_mask has {lengths.tolist()} (a layout of another "
        "batch)"
      )
  return packed


@functools.partial(jax.jit, static_argnums=(1, 8, 9, 10))
def _forward(
  params,
  config,
  input_ids,
  attention_mask,
  token_type_ids,
  intervention: Intervention,
  rng,
  packing,
  output_hidden_states,
  output_attentions,
  deterministic,
):
  rng_embed, rng_layers = (None, None) if rng is None else jax.random.split(rng)
  if packing is not None:
    return _packed_forward(
      params,
      config,
      packing,
      input_ids,
      token_type_ids,
      intervention,
      (rng_embed, rng_layers),
      output_hidden_states,
      output_attentions,
      deterministic,
    )
  x = embed(
    params,
    config,
    input_ids,
    token_type_ids,
    deterministic=deterministic,
    rng=rng_embed,
    patch=intervention.patch.get("embeddings"),
  )
  layers = _run_blocks(
    params,
    config,
    x,
    attention_mask,
    intervention.without("embeddings"),
    output_hidden_states=output_hidden_states,
    output_attentions=output_attentions,
    deterministic=deterministic,
    rng=rng_layers,
  )
  capture = intervention.capture
  cache = dict(layers.cache)
  if "embeddings" in capture:
    cache["embeddings"] = x
  return BertOutput(
    last_hidden_state=layers.last,
    pooler_output=pool(params, config, layers.last),
    hidden_states=(
      None if layers.hidden_states is None else jnp.concatenate([x[None], layers.hidden_states])
    ),
    attentions=layers.attentions,
    cache=cache if capture else None,
  )


def _packed_forward(
  params,
  config,
  packing: Packing,
  input_ids,
  token_type_ids,
  intervention: Intervention,
  rngs,
  output_hidden_states,
  output_attentions,
  deterministic,
) -> BertOutput:
  """`_forward` on packed rows: inputs, head masks and patches packed, every block run on
  the rows, every output unpacked (`forward(packed=)`)."""
  batch, seq = input_ids.shape
  ids = pack(input_ids, packing)
  types = None if token_type_ids is None else pack(token_type_ids, packing)
  patch = {
    site: tuple(pack_site(a, SITES[site][0], packing, depth=site != "embeddings") for a in entry)
    for site, entry in intervention.patch.items()
  }
  head_mask = intervention.head_mask
  if head_mask is not None and head_mask.ndim == 3:  # (B, L, N): per token, (R, P, L, N)
    head_mask = pack(
      jnp.broadcast_to(head_mask[:, None], (batch, seq) + head_mask.shape[1:]), packing
    )
  subspace = {  # source and weight per token, the basis as it is
    site: (
      pack_site(source, SITES[site][0], packing),
      basis,
      pack_site(weight, SITES[site][0], packing),
    )
    for site, (source, basis, weight) in intervention.subspace.items()
  }
  intervention = intervention.replace(patch=patch, head_mask=head_mask, subspace=subspace)
  x = embed(
    params,
    config,
    ids,
    types,
    deterministic=deterministic,
    rng=rngs[0],
    patch=patch.get("embeddings"),
    positions=packing.positions,
  )
  layers = _run_blocks(
    params,
    config,
    x,
    packing.key_mask,
    intervention.without("embeddings"),
    output_hidden_states=output_hidden_states,
    output_attentions=output_attentions,
    deterministic=deterministic,
    rng=rngs[1],
    packing=packing,
  )
  capture = intervention.capture
  cache = {site: unpack_site(v, SITES[site][0], packing) for site, v in layers.cache.items()}
  if "embeddings" in capture:
    cache["embeddings"] = unpack(x, packing)
  last = unpack(layers.last, packing)
  states = None
  if layers.hidden_states is not None:
    states = unpack_site(jnp.concatenate([x[None], layers.hidden_states]), "batch seq", packing)
  maps = (
    None
    if layers.attentions is None
    else unpack_site(layers.attentions, "batch heads seq seq", packing)
  )
  return BertOutput(
    last_hidden_state=last,
    pooler_output=pool(params, config, last),
    hidden_states=states,
    attentions=maps,
    cache=cache if capture else None,
  )


def embed(
  params: Params,
  config: BertConfig,
  input_ids,
  token_type_ids=None,
  *,
  deterministic: bool = True,
  rng: jax.Array | None = None,
  patch=None,
  positions=None,
  offset=None,
) -> jax.Array:
  """The embedding block's output (batch, seq, hidden): the input of block 0.

  `patch` is the `embeddings` site's `(value, weight)`, if any; `positions` (batch, seq)
  each token's position in its sequence when that is not its column (packed rows);
  `offset` (batch, seq, embed_dim) is added to the sum of the word, type and position
  embeddings (zeros: a handle for the gradient there).
  """
  if token_type_ids is None:
    token_type_ids = jnp.zeros_like(input_ids)
  rngs = None if deterministic else {"dropout": rng}
  x = Embeddings(config).apply(
    {"params": params["embeddings"]},
    input_ids,
    token_type_ids,
    deterministic=deterministic,
    positions=positions,
    offset=offset,
    rngs=rngs,
  )
  return x if patch is None else mix(x, *patch)


def run_layers(
  params: Params,
  config: BertConfig,
  hidden,
  attention_mask=None,
  *,
  start: int = 0,
  stop: int | None = None,
  head_mask=None,
  head_ablation: str = "scale",
  layer_mask=None,
  output_hidden_states: bool = False,
  output_attentions: bool = False,
  capture=(),
  patch=None,
  deterministic: bool = True,
  rng: jax.Array | None = None,
  final_rows=None,
  unroll: bool = False,
  intervention: Intervention | None = None,
) -> LayersOutput:
  """Runs encoder blocks `start .. stop-1` on `hidden` (the input of block `start`).

  `head_mask`, `layer_mask` and `patch` cover all `config.depth` blocks (as in
  `forward`); only the slice for the blocks run is used. `capture` and `patch`
  take block sites (every site but "embeddings"). `intervention` (a
  `bertjax.Intervention`) holds them as one value instead, as in `forward`.

  `final_rows` int (B, R): the positions a caller reads from the model's last block
  (block `config.depth - 1`). When that block is run, it computes its queries and
  everything after them at those rows only (`model.EncoderLayer`; keys and values at
  every position), and its outputs, maps and captured sites are zero at the other
  rows. With the fused kernels, which need equal query and key lengths, it runs in
  full and is then zeroed the same way. Patching metrics read one or a few positions
  (`patching.LogitDiff`), so their sweeps skip most of the last block.

  `unroll=True` runs the blocks as a Python loop over the same block instead of
  `lax.scan`: each block's activations are then separate arrays, not slices of
  stacked buffers. A plain forward pass is faster scanned; a gradient through every
  block is faster unrolled on the CPU (`patching.attribution_patching` uses it:
  no zero-filled stacked residuals, and no gradient for the first block's input).

  Returns:
    A `LayersOutput` `(last, hidden_states, attentions, cache)`: the output of
    block `stop-1`; when asked, every block's output `(stop-start, B, T, H)` and
    attention maps `(stop-start, B, N, T, T)`, else None; the captured sites.
  """
  intervention = intervention_of(
    intervention,
    head_mask=head_mask,
    head_ablation=head_ablation,
    layer_mask=layer_mask,
    capture=capture,
    patch=patch,
  )
  check_block_sites(config, hidden, intervention)
  return _run_blocks(
    params,
    config,
    hidden,
    attention_mask,
    intervention,
    start=start,
    stop=stop,
    output_hidden_states=output_hidden_states,
    output_attentions=output_attentions,
    deterministic=deterministic,
    rng=rng,
    final_rows=final_rows,
    unroll=unroll,
  )


def _run_blocks(
  params,
  config,
  hidden,
  attention_mask,
  intervention: Intervention,
  *,
  start=0,
  stop=None,
  output_hidden_states=False,
  output_attentions=False,
  deterministic=True,
  rng=None,
  stats=False,
  special_mask=None,
  final_rows=None,
  unroll=False,
  packing=None,
) -> LayersOutput:
  """The one loop over blocks: a scan over stacked layers, unrolled for pruned ones (and
  with `unroll`). Each block reads its slice of `intervention` through `Sites`.

  With `stats`, each block returns per-head attention statistics (the
  `attentions` field holds their dict) instead of maps. With `final_rows`, the
  model's last block runs at those rows (`run_layers`). With `packing` (`Packing`) the
  hidden state is packed rows and `attention_mask` their real tokens; a head mask is
  (L, N) or per token (R, P, L, N).
  """
  stop = config.depth if stop is None else stop
  if not 0 <= start <= stop <= config.depth:
    raise ValueError(f"{start=}, {stop=} must satisfy 0 <= start <= stop <= {config.depth}")
  if packing is not None and (final_rows is not None or stats):
    raise ValueError("packed rows do not combine with final_rows or attention statistics")
  if final_rows is not None:
    if stats:
      raise ValueError("final_rows does not combine with attention statistics")
    final_rows = jnp.asarray(final_rows, jnp.int32)
    if final_rows.ndim != 2 or final_rows.shape[0] != hidden.shape[0]:
      raise ValueError(f"final_rows shape {final_rows.shape} must be (batch={hidden.shape[0]}, R)")
    if stop != config.depth or stop == start:  # the last block is not run
      final_rows = None
  batch, seq_len = hidden.shape[:2]
  if attention_mask is None:
    key_mask = jnp.ones((batch, seq_len), bool)
  else:
    key_mask = attention_mask.astype(bool)
  scanned, constant = intervention.blocks(config, start, stop)
  keys = None if deterministic else jax.random.split(rng, stop - start)
  want_maps = output_attentions or stats
  rows_ok = _rows_attention(config, output_attentions, intervention)

  bias_table = relative_embeddings(params, config)  # computed once, read by every block

  def block(layer, layer_params, h, block_slice, key, kept=None, rows=None):
    fused = rows is not None and not rows_ok
    sites = Sites(
      block_slice.join(constant),
      kept=kept,
      num_heads=config.num_attention_heads,
      rows=None if fused else rows,
      index=layer,
      packing=packing,
    )
    n = None if kept is None else len(kept)
    y, maps = EncoderLayer(config, n).apply(
      {"params": layer_params},
      h,
      key_mask,
      sites,
      output_attentions,
      deterministic,
      special_mask,
      stats,
      layer,
      bias_table,
      rngs=None if key is None else {"dropout": key},
    )
    if rows is not None:  # zeros at the rows not asked for (`run_layers`)
      y, maps, captured = _at_final_rows(y, maps, sites.captured, rows, h.shape[1], fused)
      sites.captured = captured
    return y, (y if output_hidden_states else None, maps if want_maps else None, sites.captured)

  if config.is_pruned or unroll:
    if stats:
      raise ValueError("attention statistics do not support pruned models; use head masks")
    out = _run_unrolled(params, config, hidden, start, stop, scanned, keys, block, final_rows)
  else:
    out = _run_scanned(params, config, hidden, start, stop, (scanned, keys), block, final_rows)
  if stop == config.depth and stop > start and config.family.final_norm:
    out = _final_norm(params, config, out, final_rows)
  return out


def _final_norm(params, config, out: LayersOutput, final_rows) -> LayersOutput:
  """A pre-LN model's norm after its last block, on `last` and (as transformers reports
  them) on the last hidden state; zero again outside `final_rows`."""
  last = final_norm(params, config, out.last)
  if final_rows is not None:
    keep = (
      jnp.zeros(last.shape[:2], bool).at[jnp.arange(last.shape[0])[:, None], final_rows].set(True)
    )
    last = jnp.where(keep[:, :, None], last, 0)
  states = out.hidden_states
  if states is not None:
    states = states.at[-1].set(last)
  return out._replace(last=last, hidden_states=states)


def final_norm(params: Params, config: BertConfig, hidden) -> jax.Array:
  """The norm after the last block of a pre-LN family (ModernBERT, EuroBERT); identity for
  post-LN families. `run_layers` and `forward` apply it when they run the last block."""
  module = final_norm_module(config)
  if module is None:
    return hidden
  return module.apply({"params": params["encoder"]["LayerNorm"]}, hidden)


def _run_scanned(params, config, hidden, start, stop, per_block, block, final_rows):
  """The blocks under `lax.scan` (`per_block`: the intervention's scanned part and the dropout
  keys, each leading with the blocks run); with `final_rows`, the last block after it."""
  stacked = params["encoder"]["layers"]
  index = np.asarray(config.layer_param_index)
  shared = not np.array_equal(index, np.arange(config.num_param_layers))

  def body(h, xs):
    block_index, layer_params, block_slice, key = xs
    if layer_params is None:  # ALBERT (or a part of the stack): index the weights.
      layer_params = jax.tree.map(lambda a: a[jnp.asarray(index)[block_index]], stacked)
    return block(block_index, layer_params, h, block_slice, key)

  scan_stop = stop if final_rows is None else stop - 1
  at = lambda tree, i: None if tree is None else jax.tree.map(lambda a: a[i], tree)
  # The whole stack is scanned as it is; a part of it is indexed in the body (slicing it
  # outside would copy those layers' weights on every call).
  whole = not shared and (start, scan_stop) == (0, config.depth)
  layer_xs = stacked if whole else None
  scanned = per_block if final_rows is None else tuple(at(t, slice(0, -1)) for t in per_block)
  last, ys = jax.lax.scan(
    body,
    hidden,
    (jnp.arange(start, scan_stop), layer_xs, *scanned),
    unroll=min(config.scan_unroll, max(scan_stop - start, 1)),
  )
  if final_rows is None:
    return LayersOutput(last, *ys)
  # The last block on its own, at the rows read; its outputs join the scanned ones.
  last_params = jax.tree.map(lambda a: a[index[stop - 1]], stacked)
  last, y = block(stop - 1, last_params, last, *(at(t, -1) for t in per_block), rows=final_rows)
  join = lambda a, b: None if b is None else jnp.concatenate([a, b[None]])
  return LayersOutput(last, *jax.tree.map(join, ys, y, is_leaf=lambda a: a is None))


def _rows_attention(config, output_attentions, intervention: Intervention) -> bool:
  """Whether a block can run at chosen rows: the attention it uses takes q and k of different
  lengths (the XLA implementation; the map path always is), and nothing in it depends on the
  query's position (rotary q, a relative-position bias, a sliding window: those blocks run
  in full and are masked)."""
  fam = config.family
  if fam.positions == "rotary" or fam.position_bias or any(config.layer_windows):
    return False
  probs = "probs" in intervention.capture or "probs" in intervention.patch
  if output_attentions or probs or "probs" in intervention.subspace:
    return True
  return kernels.attention_impl(config.attention_impl) == "xla"


def _at_final_rows(y, maps, captured, rows, seq_len, full: bool):
  """A final block's outputs at full length, zero outside `rows` (B, R): placed from the
  rows it computed, or (`full`: the block ran at every row) masked."""
  if full:
    keep = jnp.zeros(y.shape[:2], bool).at[jnp.arange(y.shape[0])[:, None], rows].set(True)
    y = jnp.where(keep[:, :, None], y, 0)
    maps = None if maps is None else jnp.where(keep[:, None, :, None], maps, 0)
    captured = {
      name: jnp.where(
        jnp.expand_dims(keep, [a for a in range(2, v.ndim)])
        if ROW_AXIS[name] == 1
        else keep[:, None, :, None],
        v,
        0,
      )
      if name in ROW_AXIS
      else v
      for name, v in captured.items()
    }
    return y, maps, captured
  y = put_rows(y, rows, seq_len)
  maps = None if maps is None else put_rows(maps, rows, seq_len, axis=2)
  return y, maps, captured  # captures were placed by `Sites.visit`


def _run_unrolled(params, config, hidden, start, stop, scanned, keys, block, final_rows=None):
  """The same block in a Python loop: a pruned model's blocks (different head counts cannot
  share a scan), or any model's on request (`run_layers(unroll=True)`)."""
  layers = params["encoder"]["layers"]
  index = config.layer_param_index
  h, outs = hidden, []
  for i, d in enumerate(range(start, stop)):
    kept = config.kept_heads(d) if config.is_pruned else None
    block_slice = jax.tree.map(lambda a, i=i: a[i], scanned)
    if kept is None:  # stacked parameters: this block's (its group's, for ALBERT) slice
      layer_params = jax.tree.map(lambda a, i=index[d]: a[i], layers)
    else:
      layer_params, hm = layers[d], block_slice.head_mask
      if hm is not None:
        block_slice = block_slice.replace(head_mask=hm[..., np.asarray(kept, np.int32)])
    rows = final_rows if d == stop - 1 else None
    key = None if keys is None else keys[i]
    h, out = block(d, layer_params, h, block_slice, key, kept=kept, rows=rows)
    states, maps, cache = out
    if maps is not None and kept is not None:  # pruned heads show as all-zero maps
      full = jnp.zeros(maps.shape[:1] + (config.num_attention_heads,) + maps.shape[2:], maps.dtype)
      maps = full.at[:, np.asarray(kept, np.int32)].set(maps)
    outs.append((states, maps, cache))
  stack = lambda xs: None if not xs or xs[0] is None else jnp.stack(xs)
  states, maps, caches = zip(*outs) if outs else ((), (), ())
  cache = {k: jnp.stack([c[k] for c in caches]) for k in (caches[0] if caches else {})}
  return LayersOutput(h, stack(list(states)), stack(list(maps)), cache)


def attention_statistics(
  params: Params,
  config: BertConfig,
  input_ids,
  attention_mask=None,
  token_type_ids=None,
  *,
  special_mask=None,
  head_mask=None,
  head_ablation: str = "scale",
) -> dict[str, jax.Array]:
  """Per-layer, per-head attention statistics without materialising attention maps.

  With `config.attention_impl` "pallas" (or "auto" on GPU/TPU) they are
  accumulated inside the fused kernel; with "xla" they come from the maps of
  one layer at a time. Each is averaged over the real query tokens of a
  sequence, for the distribution that mixes the values (see
  `kernels.attention_with_stats`).

  Args:
    special_mask: bool (batch, seq): keys whose received mass is reported as
      "special" (e.g. [SEP] positions).

  Returns:
    A dict of float32 `(depth, batch, heads)` arrays: "entropy" (nats),
    "first" (mass on the first token, [CLS]), "special", "self", "prev", "next".
  """
  check_inputs(config, input_ids, attention_mask, token_type_ids, head_mask, None, head_ablation)
  if config.is_pruned:
    raise ValueError("attention_statistics does not support pruned models; use head masks")
  if special_mask is not None and tuple(np.shape(special_mask)) != tuple(np.shape(input_ids)):
    raise ValueError(
      f"special_mask shape {tuple(np.shape(special_mask))} must equal input_ids "
      f"shape {tuple(np.shape(input_ids))}"
    )
  intervention = Intervention(head_mask=head_mask, head_ablation=head_ablation)
  return _attention_statistics(
    params, config, input_ids, attention_mask, token_type_ids, special_mask, intervention
  )


@functools.partial(jax.jit, static_argnums=(1,))
def _attention_statistics(
  params, config, input_ids, attention_mask, token_type_ids, special_mask, intervention
):
  x = embed(params, config, input_ids, token_type_ids)
  return _run_blocks(
    params, config, x, attention_mask, intervention, stats=True, special_mask=special_mask
  ).attentions


def count_params(params: Params) -> int:
  """Number of scalars in a parameter pytree."""
  return sum(int(np.prod(a.shape)) for a in jax.tree.leaves(params))


def param_counts(config: BertConfig, heads: tuple[str, ...] = ()) -> dict[str, int]:
  """The parameters of `init(config, 0, heads)` by part, without allocating them.

  Returns:
    one count per top-level part (`embeddings`, with ALBERT's E -> H projection; `encoder`,
    the stored layers, shared ones once; `pooler` where the family has one; each head), plus
    `model` (embeddings + encoder + pooler: what Hugging Face's base models count) and
    `total` (every part).
  """
  shapes = jax.eval_shape(lambda: init(config, 0, heads))
  out = {k: count_params(v) for k, v in shapes.items()}
  out["model"] = out["embeddings"] + out["encoder"] + out.get("pooler", 0)
  out["total"] = sum(v for k, v in out.items() if k != "model")
  return out
