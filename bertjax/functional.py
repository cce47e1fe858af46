"""The pure API: functions of `(params, config, inputs)`, jittable with `config` static.

`forward` runs embeddings, then the stack of encoder blocks under `lax.scan`
(layer parameters stacked on a leading axis; ALBERT blocks index their shared
group), then the pooler. Interventions are data: a head mask `(depth, heads)`
or `(batch, depth, heads)` and a layer mask `(depth,)` are scanned inputs, so
`jax.grad` gives head importance and `jax.vmap` gives ablation sweeps.

The lower-level pieces (`embed`, `run_layers`, `pool`) are public too: analyses
that ablate layer `l` reuse the activations below it instead of recomputing them.
"""

from __future__ import annotations

import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.config import BertConfig
from bertjax.model import Classifier, Embeddings, EncoderLayer, MLMHead, Pooler, compute_dtype

Params = dict[str, Any]
HEADS = ("mlm", "nsp", "sop", "classifier", "token_classifier")
ABLATIONS = ("scale", "uniform")


@flax.struct.dataclass
class BertOutput:
  """What `forward` returns; field names follow Hugging Face."""

  last_hidden_state: jax.Array  # (B, T, H)
  pooler_output: jax.Array | None = None  # (B, H)
  hidden_states: jax.Array | None = None  # (depth + 1, B, T, H), embeddings first
  attentions: jax.Array | None = None  # (depth, B, N, T, T)


# Initialisation -------------------------------------------------------------


def init(config: BertConfig, rng: int | jax.Array = 0, heads: tuple[str, ...] = ()) -> Params:
  """Fresh parameters for `config`, with the named task heads.

  Args:
    config: the architecture.
    rng: a seed or a JAX PRNG key.
    heads: any of "mlm", "nsp", "sop", "classifier" (`config.num_labels` outputs),
      "token_classifier".

  Returns:
    The parameter pytree: `embeddings`, `encoder/layers` (stacked on a leading
    axis of size `config.num_param_layers`), `pooler` when `config.use_pooler`,
    and one entry per head.
  """
  unknown = set(heads) - set(HEADS)
  if unknown:
    raise ValueError(f"heads={sorted(unknown)} are unknown; expected a subset of {HEADS}")
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
  lengths = jnp.full((1,), 2, jnp.int32)
  params: Params = {"embeddings": Embeddings(config).init(k_emb, ids, ids)["params"]}
  layer_init = lambda k: EncoderLayer(config).init(k, x, mask, lengths)["params"]
  layer_keys = jax.random.split(k_layers, config.num_param_layers)
  params["encoder"] = {"layers": jax.vmap(layer_init)(layer_keys)}
  if config.use_pooler:
    params["pooler"] = Pooler(config).init(k_pool, x)["params"]
  for head, k in zip(heads, jax.random.split(k_heads, max(len(heads), 1))):
    if head == "mlm":
      word = params["embeddings"]["word_embeddings"]["embedding"]
      params[head] = MLMHead(config).init(k, x, word)["params"]
    else:
      params[head] = _classifier(config, head).init(k, x[:, 0])["params"]
  return params


def _classifier(config: BertConfig, head: str) -> Classifier:
  # Hugging Face sizes ALBERT's SOP head by num_labels too (2 in every released model).
  outputs = 2 if head == "nsp" else config.num_labels
  dropout = 0.0 if head == "nsp" else config.classifier_dropout
  return Classifier(config, outputs, dropout)


# Input checks ---------------------------------------------------------------


def _concrete(x) -> bool:
  return x is not None and not isinstance(x, jax.core.Tracer)


def check_inputs(config: BertConfig, input_ids, attention_mask=None, token_type_ids=None,
                 head_mask=None, layer_mask=None, head_ablation: str = "scale") -> None:
  """Raises ValueError, naming the value, for inputs the model would silently mishandle.

  Shapes are always checked; values (token ids, token types) when the arrays are
  concrete, i.e. outside a user's `jit`.
  """
  ids_shape = tuple(np.shape(input_ids))
  if len(ids_shape) != 2:
    raise ValueError(f"input_ids must be (batch, seq); got shape {ids_shape}")
  if not jnp.issubdtype(jnp.result_type(input_ids), jnp.integer):
    raise ValueError(f"input_ids must be integers; got dtype {jnp.result_type(input_ids)}")
  batch, seq_len = ids_shape
  if seq_len > config.max_position_embeddings:
    raise ValueError(f"{seq_len=} must be <= max_position_embeddings="
                     f"{config.max_position_embeddings}")
  if seq_len == 0:
    raise ValueError("input_ids has an empty sequence axis")
  for name, value in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
    if value is not None and tuple(np.shape(value)) != ids_shape:
      raise ValueError(f"{name} shape {tuple(np.shape(value))} must equal input_ids shape "
                       f"{ids_shape}")
  if head_ablation not in ABLATIONS:
    raise ValueError(f"{head_ablation=!r} must be one of {ABLATIONS}")
  depth, heads = config.depth, config.num_attention_heads
  if head_mask is not None:
    shape = tuple(np.shape(head_mask))
    if shape not in ((depth, heads), (batch, depth, heads)):
      raise ValueError(f"head_mask shape {shape} must be (layers, heads)=({depth}, {heads}) or "
                       f"(batch, layers, heads)=({batch}, {depth}, {heads})")
  if layer_mask is not None and tuple(np.shape(layer_mask)) != (depth,):
    raise ValueError(f"layer_mask shape {tuple(np.shape(layer_mask))} must be (layers,)=({depth},)")
  if _concrete(input_ids):
    ids = np.asarray(input_ids)
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= config.vocab_size:
      bad = ids[(ids < 0) | (ids >= config.vocab_size)]
      raise ValueError(f"token ids {sorted(set(bad.tolist()))[:10]} are outside the vocabulary "
                       f"[0, {config.vocab_size})")
  if _concrete(token_type_ids):
    types = np.asarray(token_type_ids)
    if types.min() < 0 or types.max() >= config.type_vocab_size:
      raise ValueError(f"token_type_ids in [{types.min()}, {types.max()}] must lie in "
                       f"[0, {config.type_vocab_size})")


# The forward pass -----------------------------------------------------------


def forward(params: Params, config: BertConfig, input_ids, attention_mask=None,
            token_type_ids=None, *, head_mask=None, head_ablation: str = "scale",
            layer_mask=None, output_hidden_states: bool = False,
            output_attentions: bool = False, deterministic: bool = True,
            rng: jax.Array | None = None) -> BertOutput:
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
    output_attentions: also return the attention maps (the reference path computes them).
    deterministic: False enables dropout; then `rng` is required.
    rng: PRNG key for dropout.

  Returns:
    A `BertOutput`.
  """
  check_inputs(config, input_ids, attention_mask, token_type_ids, head_mask, layer_mask,
               head_ablation)
  if not deterministic and rng is None:
    raise ValueError("deterministic=False (dropout) needs an rng key")
  return _forward(params, config, input_ids, attention_mask, token_type_ids, head_mask,
                  layer_mask, rng, head_ablation, output_hidden_states, output_attentions,
                  deterministic)


@functools.partial(jax.jit, static_argnums=(1, 8, 9, 10, 11))
def _forward(params, config, input_ids, attention_mask, token_type_ids, head_mask, layer_mask,
             rng, head_ablation, output_hidden_states, output_attentions, deterministic):
  rng_embed, rng_layers = (None, None) if rng is None else jax.random.split(rng)
  x = embed(params, config, input_ids, token_type_ids, deterministic=deterministic, rng=rng_embed)
  last, hidden, attentions = run_layers(
      params, config, x, attention_mask, head_mask=head_mask, head_ablation=head_ablation,
      layer_mask=layer_mask, output_hidden_states=output_hidden_states,
      output_attentions=output_attentions, deterministic=deterministic, rng=rng_layers)
  return BertOutput(
      last_hidden_state=last,
      pooler_output=pool(params, config, last),
      hidden_states=None if hidden is None else jnp.concatenate([x[None], hidden]),
      attentions=attentions)


def embed(params: Params, config: BertConfig, input_ids, token_type_ids=None, *,
          deterministic: bool = True, rng: jax.Array | None = None) -> jax.Array:
  """The embedding block's output (batch, seq, hidden): the input of block 0."""
  if token_type_ids is None:
    token_type_ids = jnp.zeros_like(input_ids)
  rngs = None if deterministic else {"dropout": rng}
  return Embeddings(config).apply({"params": params["embeddings"]}, input_ids, token_type_ids,
                                  deterministic=deterministic, rngs=rngs)


def run_layers(params: Params, config: BertConfig, hidden, attention_mask=None, *,
               start: int = 0, stop: int | None = None, head_mask=None,
               head_ablation: str = "scale", layer_mask=None,
               output_hidden_states: bool = False, output_attentions: bool = False,
               deterministic: bool = True, rng: jax.Array | None = None):
  """Runs encoder blocks `start .. stop-1` on `hidden` (the input of block `start`).

  `head_mask` and `layer_mask` cover all `config.depth` blocks (as in `forward`);
  only the slice for the blocks run is used.

  Returns:
    `(last, hidden_states, attentions)`: the output of block `stop-1`; when
    asked, every block's output `(stop-start, B, T, H)` and attention maps
    `(stop-start, B, N, T, T)`, else None.
  """
  stop = config.depth if stop is None else stop
  if not 0 <= start <= stop <= config.depth:
    raise ValueError(f"{start=}, {stop=} must satisfy 0 <= start <= stop <= {config.depth}")
  batch, seq_len = hidden.shape[:2]
  if attention_mask is None:
    key_mask = jnp.ones((batch, seq_len), bool)
  else:
    key_mask = attention_mask.astype(bool)
  kv_lengths = key_mask.sum(-1).astype(jnp.int32)
  blocks = jnp.arange(start, stop)
  if head_mask is not None:
    # Blocks lead the scanned axis: (L, N) or (L, B, N).
    head_mask = head_mask if head_mask.ndim == 2 else jnp.swapaxes(head_mask, 0, 1)
    head_mask = head_mask[start:stop]
  if layer_mask is not None:
    layer_mask = layer_mask[start:stop]
  keys = None if deterministic else jax.random.split(rng, stop - start)

  if config.is_pruned:
    return _run_pruned_layers(params, config, hidden, key_mask, kv_lengths, start, stop,
                              head_mask, head_ablation, layer_mask, output_hidden_states,
                              output_attentions, deterministic, keys)
  stacked = params["encoder"]["layers"]
  index = np.asarray(config.layer_param_index)
  shared = not np.array_equal(index, np.arange(config.num_param_layers))
  layer = EncoderLayer(config)

  def body(h, xs):
    block, layer_params, hm, lm, key = xs
    if shared:  # ALBERT: the block indexes its group's weights.
      layer_params = jax.tree.map(lambda a: a[jnp.asarray(index)[block]], stacked)
    y, probs = layer.apply(
        {"params": layer_params}, h, key_mask, kv_lengths, hm, head_ablation,
        output_attentions, deterministic, rngs=None if key is None else {"dropout": key})
    y = _mix(y, h, lm)
    outs = (y if output_hidden_states else None, probs if output_attentions else None)
    return y, outs

  layer_xs = None if shared else jax.tree.map(lambda a: a[start:stop], stacked)
  last, (hidden_states, attentions) = jax.lax.scan(
      body, hidden, (blocks, layer_xs, head_mask, layer_mask, keys),
      unroll=min(config.scan_unroll, max(stop - start, 1)))
  return last, hidden_states, attentions


def attention_statistics(params: Params, config: BertConfig, input_ids, attention_mask=None,
                         token_type_ids=None, *, special_mask=None, head_mask=None,
                         head_ablation: str = "scale") -> dict[str, jax.Array]:
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
    raise ValueError(f"special_mask shape {tuple(np.shape(special_mask))} must equal input_ids "
                     f"shape {tuple(np.shape(input_ids))}")
  return _attention_statistics(params, config, input_ids, attention_mask, token_type_ids,
                               special_mask, head_mask, head_ablation)


@functools.partial(jax.jit, static_argnums=(1, 7))
def _attention_statistics(params, config, input_ids, attention_mask, token_type_ids,
                          special_mask, head_mask, head_ablation):
  x = embed(params, config, input_ids, token_type_ids)
  key_mask = (jnp.ones(input_ids.shape, bool) if attention_mask is None
              else attention_mask.astype(bool))
  kv_lengths = key_mask.sum(-1).astype(jnp.int32)
  if head_mask is not None and head_mask.ndim == 3:
    head_mask = jnp.swapaxes(head_mask, 0, 1)
  stacked = params["encoder"]["layers"]
  index = jnp.asarray(config.layer_param_index)
  layer = EncoderLayer(config)

  def body(h, xs):
    block, hm = xs
    layer_params = jax.tree.map(lambda a: a[index[block]], stacked)
    y, stats = layer.apply({"params": layer_params}, h, key_mask, kv_lengths, hm, head_ablation,
                           False, True, True, special_mask)
    return y, stats

  _, stats = jax.lax.scan(body, x, (jnp.arange(config.depth), head_mask))
  return stats


def _mix(y, h, lm):
  return y if lm is None else (lm * y + (1 - lm) * h).astype(y.dtype)


def _run_pruned_layers(params, config, hidden, key_mask, kv_lengths, start, stop, head_mask,
                       head_ablation, layer_mask, output_hidden_states, output_attentions,
                       deterministic, keys):
  """Layers with different head counts cannot share a scan: an unrolled loop."""
  layers = params["encoder"]["layers"]
  h, states, maps = hidden, [], []
  for i, d in enumerate(range(start, stop)):
    kept = np.asarray(config.kept_heads(d), np.int32)
    hm = None if head_mask is None else head_mask[i][..., kept]
    y, probs = EncoderLayer(config, len(kept)).apply(
        {"params": layers[d]}, h, key_mask, kv_lengths, hm, head_ablation, output_attentions,
        deterministic, rngs=None if keys is None else {"dropout": keys[i]})
    h = _mix(y, h, None if layer_mask is None else layer_mask[i])
    states.append(h)
    if output_attentions:  # pruned heads show as all-zero maps
      batch, _, seq, _ = probs.shape
      full = jnp.zeros((batch, config.num_attention_heads, seq, seq), probs.dtype)
      maps.append(full.at[:, kept].set(probs))
  stack = lambda xs: jnp.stack(xs) if xs else None
  return h, stack(states) if output_hidden_states else None, stack(maps)


def prune_heads(config: BertConfig, params: Params,
                heads_to_prune: dict[int, list[int]]) -> tuple[BertConfig, Params]:
  """Physically removes attention heads, so the model gets smaller and faster.

  Args:
    config: a BERT config (ALBERT layers share weights; use head masks there).
    params: its parameters (stacked, or already pruned).
    heads_to_prune: layer -> original indices of heads to remove (adds to any
      already removed).

  Returns:
    `(config, params)` where `config.pruned_heads` records every removed head
    (exported as Hugging Face `pruned_heads`) and `params["encoder"]["layers"]`
    is a list of per-layer parameter dicts when head counts differ. Head masks
    and attention maps keep the original `(layers, heads)` indexing.
  """
  if config.model_type != "bert":
    raise ValueError("prune_heads supports model_type='bert' only; ALBERT layers share weights")
  removed = {layer: set(heads) for layer, heads in config.pruned_heads}
  for layer, heads in heads_to_prune.items():
    heads = [int(h) for h in heads]
    if not 0 <= layer < config.num_hidden_layers or any(
        not 0 <= h < config.num_attention_heads for h in heads):
      raise ValueError(f"heads_to_prune[{layer}]={heads} is out of range for "
                       f"{config.num_hidden_layers} layers x {config.num_attention_heads} heads")
    removed.setdefault(int(layer), set()).update(heads)
  new_config = config.replace(pruned_heads=tuple(
      (layer, tuple(sorted(heads))) for layer, heads in sorted(removed.items()) if heads))
  layers = params["encoder"]["layers"]
  if not isinstance(layers, list):
    layers = [jax.tree.map(lambda a, i=i: a[i], layers) for i in range(config.num_hidden_layers)]
  pruned = []
  for layer, p in enumerate(layers):
    old = config.kept_heads(layer)
    local = np.asarray([old.index(h) for h in new_config.kept_heads(layer)], np.int32)
    a = dict(p["attention"])
    for name in ("query", "key", "value"):
      a[name] = {"kernel": a[name]["kernel"][:, local], "bias": a[name]["bias"][local]}
    a["output"] = {"kernel": a["output"]["kernel"][local], "bias": a["output"]["bias"]}
    pruned.append({**p, "attention": a})
  return new_config, {**params, "encoder": {**params["encoder"], "layers": pruned}}


def pool(params: Params, config: BertConfig, last_hidden_state) -> jax.Array | None:
  """The pooler output (batch, hidden), or None for a model without a pooler."""
  if "pooler" not in params:
    return None
  return Pooler(config).apply({"params": params["pooler"]}, last_hidden_state)


# Heads ----------------------------------------------------------------------


def _head_params(params: Params, head: str) -> Params:
  if head not in params:
    present = [h for h in HEADS if h in params]
    raise ValueError(f"these parameters have no {head!r} head; heads present: {present}")
  return params[head]


def mlm_logits(params: Params, config: BertConfig, hidden) -> jax.Array:
  """Masked-LM logits (..., vocab) from hidden states (..., hidden); decoder tied to embeddings.

  Pass only the gathered masked positions (batch, predictions, hidden) to avoid
  a full-vocabulary projection of every token.
  """
  head = _head_params(params, "mlm")
  word = params["embeddings"]["word_embeddings"]["embedding"]
  return MLMHead(config).apply({"params": head}, hidden, word)


def _classify(head: str, params: Params, config: BertConfig, x, deterministic: bool,
              rng: jax.Array | None) -> jax.Array:
  rngs = None if deterministic else {"dropout": rng}
  return _classifier(config, head).apply({"params": _head_params(params, head)}, x,
                                         deterministic=deterministic, rngs=rngs)


def nsp_logits(params: Params, config: BertConfig, pooled) -> jax.Array:
  """Next-sentence-prediction logits (batch, 2) from the pooler output; 0 = is next."""
  return _classify("nsp", params, config, pooled, True, None)


def sop_logits(params: Params, config: BertConfig, pooled, *, deterministic: bool = True,
               rng: jax.Array | None = None) -> jax.Array:
  """ALBERT sentence-order-prediction logits (batch, 2) from the pooler output."""
  return _classify("sop", params, config, pooled, deterministic, rng)


def classify(params: Params, config: BertConfig, pooled, *, deterministic: bool = True,
             rng: jax.Array | None = None) -> jax.Array:
  """Sequence-classification logits (batch, num_labels) from the pooler output."""
  return _classify("classifier", params, config, pooled, deterministic, rng)


def token_classify(params: Params, config: BertConfig, hidden, *, deterministic: bool = True,
                   rng: jax.Array | None = None) -> jax.Array:
  """Token-classification logits (batch, seq, num_labels) from the last hidden state."""
  return _classify("token_classifier", params, config, hidden, deterministic, rng)


def count_params(params: Params) -> int:
  """Number of scalars in a parameter pytree."""
  return sum(int(np.prod(a.shape)) for a in jax.tree.leaves(params))
