"""The replacement model: a model with some or all of its FFNs replaced by a transcoder
(`bertjax.analysis.circuits.transcoders`), every other computation its own.

`replace` runs it; `replacement_effect` compares it with the model: the mean-pooled
embedding's cosine and the KL of the masked-LM head's predictions, beside the same layers'
FFN outputs mean-ablated.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import stats
from bertjax.analysis.batching import as_batch
from bertjax.analysis.circuits.transcoders import Params, TranscoderConfig, latents_at
from bertjax.model.config import BertConfig
from bertjax.model.forward import BertOutput, embed, forward, pool, run_layers
from bertjax.model.heads import head_logits


def _check_layers(tc_config: TranscoderConfig, config: BertConfig, layers) -> tuple[int, ...]:
  if tc_config.layers != config.depth or tc_config.d_model != config.hidden_size:
    raise ValueError(
      f"a transcoder of {tc_config.layers} layers x {tc_config.d_model} does not fit a model "
      f"of depth {config.depth} and hidden size {config.hidden_size}"
    )
  layers = tuple(range(config.depth)) if layers is None else tuple(int(i) for i in layers)
  bad = [i for i in layers if not 0 <= i < config.depth]
  if bad or len(set(layers)) != len(layers):
    raise ValueError(f"layers={layers} must be distinct block indices in [0, {config.depth})")
  return tuple(sorted(layers))


@functools.partial(jax.jit, static_argnames=("config", "tc_config", "layers", "mode"))
def _replace(
  params, config, tc, tc_config, input_ids, attention_mask, token_type_ids, layers, mode
):
  hidden = embed(params, config, input_ids, token_type_ids)
  written = jnp.zeros(input_ids.shape + (config.depth, config.hidden_size), jnp.float32)
  for block in range(config.depth):
    run = functools.partial(run_layers, params, config, start=block, stop=block + 1)
    first = run(hidden, attention_mask, capture=("ffn_in",))
    if block not in layers or mode != "features":
      out = first.last
    if mode == "features":  # this block's latents, written to the layers they reach
      x = first.cache["ffn_in"][-1]  # (B, T, H)
      z = latents_at(tc, tc_config, block, x.reshape(-1, x.shape[-1]))  # (B T, m)
      w = tc["W_dec"][block]  # (m, R, H)
      write = (z @ w.reshape(w.shape[0], -1)).reshape(input_ids.shape + w.shape[1:])
      written = written.at[:, :, block : block + w.shape[1]].add(write)
    if block in layers:
      value = (written[:, :, block] if mode == "features" else 0.0) + tc["b_dec"][block]
      value = jnp.broadcast_to(value, hidden.shape).astype(hidden.dtype)
      out = run(hidden, attention_mask, patch={"ffn_out": lambda v, i, value=value: value}).last
    hidden = out
  return BertOutput(
    last_hidden_state=hidden,
    pooler_output=pool(params, config, hidden),
    hidden_states=None,
    attentions=None,
    cache=None,
  )


def replace(
  params: Params,
  config: BertConfig,
  tc: Params,
  tc_config: TranscoderConfig,
  input_ids,
  attention_mask=None,
  token_type_ids=None,
  *,
  layers=None,
  mean_ablate: bool = False,
) -> BertOutput:
  """The replacement model's forward pass: the FFN output of each of `layers` (default all)
  replaced by the transcoder's prediction from that run's own FFN inputs (a CLT's latents
  of every earlier layer included, whether or not that layer is replaced); everything else
  is the model's. `mean_ablate` puts the transcoder's `b_dec` there instead (every latent
  off): the baseline a replacement is measured against."""
  layers = _check_layers(tc_config, config, layers)
  input_ids = jnp.asarray(input_ids)
  mask = jnp.ones_like(input_ids) if attention_mask is None else jnp.asarray(attention_mask)
  types = jnp.zeros_like(input_ids) if token_type_ids is None else jnp.asarray(token_type_ids)
  mode = "mean" if mean_ablate else "features"
  return _replace(params, config, tc, tc_config, input_ids, mask, types, layers, mode)


def _kl(clean_logits, logits):
  p = jax.nn.log_softmax(clean_logits.astype(jnp.float32), -1)
  q = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
  return jnp.sum(jnp.exp(p) * (p - q), -1)


def replacement_effect(
  params: Params,
  config: BertConfig,
  tc: Params,
  tc_config: TranscoderConfig,
  batches: Iterable,
  *,
  layers=None,
) -> dict[str, Any]:
  """The replacement model (`replace`) against the model on `batches`, beside the same
  layers' FFN outputs mean-ablated.

  Returns:
    "cosine" and "ablated_cosine": the mean over sentences of the cosine between the model's
    mean-pooled last hidden state and the replacement's (and the ablation's); with the
    masked-LM head in `params` (a checkpoint's, or one fitted to the frozen body),
    "kl" and "ablated_kl": KL(model || replacement) of the head's predictions, in nats, the
    mean over real tokens, and "agreement" and "ablated_agreement": the share of real tokens
    whose top prediction is the model's; "sentences", "tokens"; per sentence "cosines" (and
    "ablated_cosines"), per token "kls" and "agreements" (and their "ablated_" ones) with
    "token_sentence", each token's sentence (0..sentences-1, in batch order): the items of
    an interval.
  """
  layers = _check_layers(tc_config, config, layers)
  mlm = "mlm" in params
  rows: dict[str, list] = {
    f"{prefix}{name}": []
    for prefix in ("", "ablated_")
    for name in ("cosines", "kls", "agreements")
  }
  rows["token_sentence"] = []
  seen = 0
  for batch in batches:
    b = as_batch(batch)
    args = (b["input_ids"], b["attention_mask"], b["token_type_ids"])
    clean = forward(params, config, *args)
    real = np.asarray(b["attention_mask"]) > 0
    pooled = stats.mean_pool(clean.last_hidden_state, b["attention_mask"])
    rows["token_sentence"].append(np.nonzero(real)[0] + seen)
    seen += len(real)
    clean_logits = head_logits(params, config, clean, "mlm") if mlm else None
    for prefix, ablate in (("", False), ("ablated_", True)):
      out = replace(params, config, tc, tc_config, *args, layers=layers, mean_ablate=ablate)
      other = stats.mean_pool(out.last_hidden_state, b["attention_mask"])
      cos = jnp.sum(pooled * other, -1) / (
        jnp.linalg.norm(pooled, axis=-1) * jnp.linalg.norm(other, axis=-1)
      )
      rows[f"{prefix}cosines"].append(np.asarray(cos, np.float64))
      if mlm:
        logits = head_logits(params, config, out, "mlm")
        rows[f"{prefix}kls"].append(np.asarray(_kl(clean_logits, logits), np.float64)[real])
        same = jnp.argmax(logits, -1) == jnp.argmax(clean_logits, -1)
        rows[f"{prefix}agreements"].append(np.asarray(same, np.float64)[real])
  if not rows["cosines"]:
    raise ValueError("replacement_effect needs at least one batch")
  result: dict[str, Any] = {k: np.concatenate(v) for k, v in rows.items() if v}
  result["cosine"] = float(result["cosines"].mean())
  result["ablated_cosine"] = float(result["ablated_cosines"].mean())
  result["sentences"] = len(result["cosines"])
  if mlm:
    for prefix in ("", "ablated_"):
      result[f"{prefix}kl"] = float(result[f"{prefix}kls"].mean())
      result[f"{prefix}agreement"] = float(result[f"{prefix}agreements"].mean())
    result["tokens"] = len(result["kls"])
  return result
