"""Input checks of the pure API, so that the model never silently mishandles an input.

`check_inputs` checks shapes always and values (token ids, token types, padding side) where
the arrays are concrete, i.e. outside a user's `jit`; `value_checks` states the value checks
as `jax.experimental.checkify` checks, which `bertjax.model.forward.checked_forward` compiles
into the program. Both are importable from `bertjax.model.forward` too, and `check_inputs`
from `bertjax`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.model.config import BertConfig
from bertjax.model.intervention import Intervention, intervention_of
from bertjax.model.sites import SITES, model_sites, site_shape


def _concrete(x) -> bool:
  if x is None or isinstance(x, jax.core.Tracer):
    return False
  # Multi-process global arrays cannot be read on one host: their values go unchecked.
  return not (isinstance(x, jax.Array) and not x.is_fully_addressable)


def check_sites(config: BertConfig, intervention: Intervention, batch: int, seq_len: int) -> None:
  """Raises ValueError, naming the site, for site names the model lacks, function patches it
  cannot take and patch arrays that do not broadcast to the site's stacked shape (the
  `Intervention` itself checked that they are pairs of numbers)."""
  capture, patch = intervention.capture, intervention.patches
  named = capture + tuple(patch) + tuple(intervention.subspace)
  unknown = [s for s in named if s not in SITES]
  if unknown:
    raise ValueError(f"sites {unknown} are unknown; expected names from {tuple(SITES)}")
  absent = [s for s in named if s not in model_sites(config)]
  if absent:
    why = [
      f"its feed-forward is {config.family.ffn}"
      if s == "ffn_gate"
      else "its attention has no disentangled term of that name (pos_att_type: "
      f"{'|'.join(config.disentangled_terms) or 'none'})"
      if s.startswith("scores_")
      else "not a block site"
      for s in absent
    ]
    raise ValueError(
      f"sites {absent} do not exist on a {config.model_type} block "
      f"({'; '.join(dict.fromkeys(why))}); its sites: {model_sites(config)}"
    )
  for site, _ in intervention.functions:  # fn(value, index) -> the new value
    if config.is_pruned and site in ("q", "k", "v", "probs", "head_out"):
      raise ValueError(
        f"patch[{site!r}] is a function, which a pruned model's per-head "
        "sites do not take (their head axes differ by layer); give a "
        "(value, weight) pair"
      )
    if site == "embeddings":
      raise ValueError(
        "patch['embeddings'] is a function; the embeddings site takes a (value, weight) pair"
      )
  for site, entry in intervention.subspace.items():
    _check_subspace(config, site, entry, batch, seq_len)
  for site, entry in intervention.patch.items():
    shape = site_shape(config, site, batch, seq_len)
    for what, array in zip(("value", "weight"), entry):
      got = tuple(np.shape(array))
      if not _broadcasts(got, shape):
        raise ValueError(
          f"patch[{site!r}] {what} shape {got} does not broadcast to the site's "
          f"stacked shape {shape} ({SITES[site][0]}"
          f"{'' if site == 'embeddings' else ', after depth'})"
        )


def _broadcasts(got: tuple[int, ...], want: tuple[int, ...]) -> bool:
  """Whether an array of shape `got` broadcasts to `want` without growing it."""
  try:
    return len(got) <= len(want) and np.broadcast_shapes(got, want) == want
  except ValueError:
    return False


def _check_subspace(config: BertConfig, site: str, entry, batch: int, seq_len: int) -> None:
  # (source, basis, weight) against the site's stacked shape (depth, ..., D).
  if site == "embeddings":
    raise ValueError(
      "subspace['embeddings']: interchanges act on block sites; patch the embeddings with a "
      "(value, weight) pair, or interchange at the first block's attn_in"
    )
  shape = site_shape(config, site, batch, seq_len)
  source, basis, weight = (tuple(np.shape(a)) for a in entry)
  width = shape[-1]
  if (
    len(basis) not in (2, 3)
    or basis[-1] != width
    or len(basis) == 3
    and basis[0]
    not in (
      1,
      config.depth,
    )
  ):
    raise ValueError(
      f"subspace[{site!r}] basis shape {basis} must be (k, {width}) or (depth, k, {width}) with "
      f"depth {config.depth}: k rows over the site's last axis ({SITES[site][0].split()[-1]})"
    )
  k = basis[-2]
  for what, got, want in (("source", source, shape), ("weight", weight, shape[:-1] + (k,))):
    if not _broadcasts(got, want):
      raise ValueError(
        f"subspace[{site!r}] {what} shape {got} does not broadcast to {want} (the site's "
        f"stacked shape{', with the basis size k=' + str(k) + ' last' if what == 'weight' else ''})"
      )


def check_intervention(
  config: BertConfig, intervention: Intervention, batch: int, seq_len: int
) -> None:
  """Raises ValueError, naming the value, for an `Intervention` that does not fit a
  (batch, seq_len) input of this model: mask shapes, sites, patch shapes."""
  depth, heads = config.depth, config.num_attention_heads
  if intervention.head_mask is not None:
    shape = tuple(np.shape(intervention.head_mask))
    if shape not in ((depth, heads), (batch, depth, heads)):
      raise ValueError(
        f"head_mask shape {shape} must be (layers, heads)=({depth}, {heads}) or "
        f"(batch, layers, heads)=({batch}, {depth}, {heads})"
      )
  layer_mask = intervention.layer_mask
  if layer_mask is not None and tuple(np.shape(layer_mask)) != (depth,):
    raise ValueError(f"layer_mask shape {tuple(np.shape(layer_mask))} must be (layers,)=({depth},)")
  check_sites(config, intervention, batch, seq_len)


def check_block_sites(config: BertConfig, hidden, intervention: Intervention) -> None:
  """`run_layers`' intervention checked as `forward`'s is, against its hidden state."""
  if "embeddings" in intervention.touched:
    raise ValueError(
      "run_layers captures and patches block sites; 'embeddings' is the "
      "hidden state you pass it (forward captures and patches it)"
    )
  if jnp.ndim(hidden) != 3:
    raise ValueError(f"hidden shape {jnp.shape(hidden)} must be (batch, seq, hidden)")
  check_intervention(config, intervention, *jnp.shape(hidden)[:2])


def check_inputs(
  config: BertConfig,
  input_ids,
  attention_mask=None,
  token_type_ids=None,
  head_mask=None,
  layer_mask=None,
  head_ablation: str = "scale",
  *,
  capture=(),
  patch=None,
  intervention: Intervention | None = None,
) -> None:
  """Raises ValueError, naming the value, for inputs the model would silently mishandle.

  Shapes are always checked; values (token ids, token types, padding side) when
  the arrays are concrete, i.e. outside a user's `jit` (see `checked_forward`
  for the same checks under `jit`). The masks, captures and patches are checked as
  `forward` takes them: as keywords, or as one `intervention` (not both).
  """
  intervention = intervention_of(
    intervention,
    head_mask=head_mask,
    layer_mask=layer_mask,
    head_ablation=head_ablation,
    capture=capture,
    patch=patch,
  )
  ids_shape = tuple(np.shape(input_ids))
  if len(ids_shape) != 2:
    raise ValueError(f"input_ids must be (batch, seq); got shape {ids_shape}")
  if not jnp.issubdtype(jnp.result_type(input_ids), jnp.integer):
    raise ValueError(f"input_ids must be integers; got dtype {jnp.result_type(input_ids)}")
  batch, seq_len = ids_shape
  if seq_len > config.max_length:
    if config.position_offset:
      raise ValueError(
        f"{seq_len=} must be <= {config.max_length} (max_position_embeddings="
        f"{config.max_position_embeddings} minus the {config.position_offset} "
        f"positions {config.model_type} reserves for padding)"
      )
    raise ValueError(
      f"{seq_len=} must be <= max_position_embeddings={config.max_position_embeddings}"
    )
  if seq_len == 0:
    raise ValueError("input_ids has an empty sequence axis")
  for name, value in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
    if value is not None and tuple(np.shape(value)) != ids_shape:
      raise ValueError(
        f"{name} shape {tuple(np.shape(value))} must equal input_ids shape {ids_shape}"
      )
  check_intervention(config, intervention, batch, seq_len)
  if _concrete(input_ids):
    ids = np.asarray(input_ids)
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= config.vocab_size:
      bad = ids[(ids < 0) | (ids >= config.vocab_size)]
      raise ValueError(
        f"token ids {sorted(set(bad.tolist()))[:10]} are outside the vocabulary "
        f"[0, {config.vocab_size})"
      )
  if _concrete(token_type_ids):
    types = np.asarray(token_type_ids)
    if types.min() < 0 or types.max() >= max(config.type_vocab_size, 1):
      what = (
        f"lie in [0, {config.type_vocab_size})"
        if config.type_vocab_size
        else f"be 0 ({config.model_type} has no token types)"
      )
      raise ValueError(f"token_type_ids in [{types.min()}, {types.max()}] must {what}")
  if _concrete(attention_mask):
    values = np.unique(np.asarray(attention_mask))
    bad = values[~np.isin(values, (0, 1))]
    if bad.size:  # -1 or 0.5 would be read as real tokens; transformers masks them
      raise ValueError(
        f"attention_mask values {bad.tolist()[:10]} must be 0 (padding) or 1 "
        "(a real token), or booleans"
      )
  if _concrete(attention_mask) and config.attention_impl not in ("xla",):
    mask = np.asarray(attention_mask) > 0
    lengths = mask.sum(-1)
    if (mask != (np.arange(seq_len)[None] < lengths[:, None])).any():
      raise ValueError(
        f"attention_impl={config.attention_impl!r} takes right padding only "
        "(real tokens first); this attention_mask has padding elsewhere: use "
        "attention_impl='xla' or pad on the right"
      )


def value_checks(config: BertConfig, input_ids, token_type_ids=None, attention_mask=None) -> None:
  """The value checks of `check_inputs` as `jax.experimental.checkify` checks.

  Call inside a function transformed by `checkify.checkify` (as `checked_forward`
  does) so that out-of-range token ids raise under `jit` too, instead of being
  clamped by the embedding gather.
  """
  from jax.experimental import checkify

  ids = jnp.asarray(input_ids)
  checkify.check(
    jnp.all((ids >= 0) & (ids < config.vocab_size)),
    f"token ids in [{{lo}}, {{hi}}] are outside the vocabulary [0, {config.vocab_size})",
    lo=ids.min(),
    hi=ids.max(),
  )
  if token_type_ids is not None:
    types = jnp.asarray(token_type_ids)
    checkify.check(
      jnp.all((types >= 0) & (types < max(config.type_vocab_size, 1))),
      f"token_type_ids in [{{lo}}, {{hi}}] must lie in [0, {max(config.type_vocab_size, 1)})",
      lo=types.min(),
      hi=types.max(),
    )
  if attention_mask is not None:
    mask = jnp.asarray(attention_mask)
    checkify.check(
      jnp.all((mask == 0) | (mask == 1)),
      "attention_mask values in [{lo}, {hi}] must be 0 (padding) or 1 (a real token), or booleans",
      lo=mask.min(),
      hi=mask.max(),
    )
