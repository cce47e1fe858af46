"""ELECTRA pretraining (Clark et al. 2020): a generator and a discriminator trained jointly.

The generator is a small MLM model (``model_type="electra"``, head ``"mlm"``); the
discriminator a full one (head ``"rtd"``). Both live in one parameter tree,
``{"generator": ..., "discriminator": ...}``, so one `TrainState`, one optimizer and
one checkpoint hold the run (and SIGKILL resume stays bitwise). The embedding tables
(word, position, token type) are shared as in the paper: they exist once, in the
discriminator, and the generator reads them from there (`generator_params`); this
needs equal ``embedding_size``, ``vocab_size``, ``max_position_embeddings`` and
``type_vocab_size`` (the paper's small models: generator hidden size 1/4 of the
discriminator's, one embedding width). With different embedding widths nothing is
shared (as the reference implementation, which ties embeddings only when their
sizes agree). Each model keeps its own embedding LayerNorm (and the discriminator
its E -> H projection), as `ElectraForMaskedLM` / `ElectraForPreTraining` have.

In the step (`Electra.terms`): the generator reads the masked batch and is trained
with MLM; at every masked position a token is sampled from its softmax
(`jax.random.categorical`, Gumbel-max, with the step's key) under
``stop_gradient`` (no gradient flows through sampling, as in the paper); the
discriminator reads the original sequence with those samples in place and
predicts, for every real token, whether it differs from the original (a sampled
token equal to the original counts as real, as in the paper). The loss is
``mlm + rtd_weight * rtd`` with ``rtd_weight = 50``; RTD is the mean binary
cross-entropy over real tokens (what `ElectraForPreTraining` computes).

DeBERTa-v3 (He et al. 2021, "DeBERTaV3: Improving DeBERTa using ELECTRA-Style Pre-Training
with Gradient-Disentangled Embedding Sharing") trains the same objective on two
``model_type="deberta-v2"`` models (the generator: the discriminator's width, half its
depth) with gradient-disentangled embedding sharing (GDES): the generator owns the
embedding tables E_G, and the discriminator reads ``stop_gradient(E_G) + E_delta``, its own
residual table E_delta starting at zero. So the MLM loss alone trains E_G and the RTD loss
alone trains E_delta (`sharing` "gdes"; the word table, and the absolute-position table
where the model has one, as the released code's `RTDModel` shares). Its discriminator head
is `LayerNorm(h + h_0) -> dense -> act -> logit` (`heads.RTDHead`) and ``rtd_weight`` 10
(the released code's `--rtd_lambda` default). The step trains both with one joint loss and
one optimizer, the released code's non-decoupled `loss_fn`; its default
`--decoupled_training` runs the discriminator's step after the generator's, so there the
discriminator reads E_G after that step's update rather than before. The pair tree keeps
E_delta under ``discriminator/embeddings/{table}_delta``; `discriminator_params` forms the
discriminator's tables and `save_electra` writes them, ``E_G + E_delta``.
"""

from __future__ import annotations

import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import optax

from bertjax.model.config import BertConfig, config_from_json
from bertjax.model.families import FAMILIES
from bertjax.model.forward import forward, init
from bertjax.model.heads import mlm_logits, rtd_logits
from bertjax.model.layers import Params
from bertjax.training import losses
from bertjax.training.objective_base import Context, Objective

SHARED_TABLES = ("word_embeddings", "position_embeddings", "token_type_embeddings")
ROLES = ("generator", "discriminator")  # the pair tree's keys; the export's folder names


def _sharing_of(config: BertConfig) -> str | None:
  """How an RTD pair of this family shares embeddings (its row's `training["rtd"]`), or None."""
  return config.family.training.get("rtd")


def _rtd_families() -> list[str]:
  return sorted(name for name, row in FAMILIES.items() if "rtd" in row.training)


DEFAULT_RTD_WEIGHT = {"tables": 50.0, "gdes": 10.0}  # ELECTRA's lambda; DeBERTa's --rtd_lambda


def sharing(generator: BertConfig, discriminator: BertConfig) -> str:
  """How the pair shares embeddings: "tables" (ELECTRA: one copy) or "gdes" (DeBERTa-v3).

  Raises:
    ValueError: a model_type without an RTD pretraining recipe, or two different ones.
  """
  for c, role in ((generator, "generator"), (discriminator, "discriminator")):
    if _sharing_of(c) is None:
      raise ValueError(
        f"the {role} config has model_type={c.model_type!r}; replaced-token "
        f"detection is trained for {_rtd_families()}"
      )
  if generator.model_type != discriminator.model_type:
    raise ValueError(
      f"generator model_type={generator.model_type!r} differs from the "
      f"discriminator's {discriminator.model_type!r}"
    )
  return _sharing_of(discriminator)


def shared_tables(generator: BertConfig, discriminator: BertConfig) -> tuple[str, ...]:
  """The embedding tables the two models share: ELECTRA all three when their shapes agree,
  else none; DeBERTa-v3 (GDES) the word table and the position table where there is one."""
  mode = sharing(generator, discriminator)
  keys = ("embed_dim", "vocab_size", "max_position_embeddings", "type_vocab_size")
  if any(getattr(generator, k) != getattr(discriminator, k) for k in keys[1:]):
    raise ValueError(
      "generator and discriminator must agree on vocab_size, "
      "max_position_embeddings and type_vocab_size; got "
      f"{[getattr(generator, k) for k in keys[1:]]} vs "
      f"{[getattr(discriminator, k) for k in keys[1:]]}"
    )
  if mode == "gdes":
    if (generator.embed_dim, generator.position_table) != (
      discriminator.embed_dim,
      discriminator.position_table,
    ):
      raise ValueError(
        "GDES shares the embedding tables: generator and discriminator must "
        "agree on embedding_size and their position table (position_biased_input); got "
        f"{(generator.embed_dim, generator.position_table)} vs "
        f"{(discriminator.embed_dim, discriminator.position_table)}"
      )
    return ("word_embeddings",) + (
      ("position_embeddings",) if discriminator.position_table is not None else ()
    )
  if generator.embed_dim != discriminator.embed_dim:
    return ()
  return tuple(
    t for t in SHARED_TABLES if t != "token_type_embeddings" or generator.type_vocab_size
  )


def init_electra(
  generator: BertConfig, discriminator: BertConfig, rng: int | jax.Array = 0
) -> Params:
  """Fresh ``{"generator", "discriminator"}`` parameters: ELECTRA's shared tables only in the
  discriminator; with GDES the tables in the generator and zero residuals
  (``{table}_delta``) in the discriminator."""
  key = jax.random.key(rng) if isinstance(rng, int) else rng
  k_gen, k_disc = jax.random.split(key)
  gen = init(generator, k_gen, heads=("mlm",))
  disc = init(discriminator, k_disc, heads=("rtd",))
  shared = shared_tables(generator, discriminator)
  if sharing(generator, discriminator) == "gdes":
    emb = {k: v for k, v in disc["embeddings"].items() if k not in shared}
    emb.update({f"{t}_delta": jax.tree.map(jnp.zeros_like, disc["embeddings"][t]) for t in shared})
    return {"generator": gen, "discriminator": {**disc, "embeddings": emb}}
  gen["embeddings"] = {k: v for k, v in gen["embeddings"].items() if k not in shared}
  return {"generator": gen, "discriminator": disc}


def generator_params(params: Params, generator: BertConfig, discriminator: BertConfig) -> Params:
  """The generator's full parameter tree (ELECTRA: the shared tables read from the
  discriminator; GDES: the generator owns them)."""
  gen = params["generator"]
  if sharing(generator, discriminator) == "gdes":
    return gen
  shared = shared_tables(generator, discriminator)
  emb = dict(gen["embeddings"])
  for t in shared:
    emb[t] = params["discriminator"]["embeddings"][t]
  return {**gen, "embeddings": emb}


def discriminator_params(
  params: Params, generator: BertConfig, discriminator: BertConfig
) -> Params:
  """The discriminator's full parameter tree: as stored (ELECTRA), or with GDES each shared
  table ``stop_gradient(E_G) + E_delta``."""
  disc = params["discriminator"]
  if sharing(generator, discriminator) != "gdes":
    return disc
  emb = {k: v for k, v in disc["embeddings"].items() if not k.endswith("_delta")}
  for t in shared_tables(generator, discriminator):
    emb[t] = jax.tree.map(
      lambda g, d: jax.lax.stop_gradient(g) + d,
      params["generator"]["embeddings"][t],
      disc["embeddings"][f"{t}_delta"],
    )
  return {**disc, "embeddings": emb}


def replace_tokens(
  input_ids: jax.Array, positions: jax.Array, values: jax.Array, weights: jax.Array
) -> jax.Array:
  """`input_ids` with ``values`` written at ``positions`` where ``weights > 0``.

  Args:
    input_ids: int (B, T).
    positions: int (B, P); slots with weight 0 are ignored (may repeat).
    values: int (B, P).
    weights: (B, P).
  """
  b = input_ids.shape[0]
  rows = jnp.arange(b)[:, None]
  live = weights > 0
  sel = jnp.zeros(input_ids.shape, bool).at[rows, positions].max(live)
  vals = (
    jnp.zeros(input_ids.shape, input_ids.dtype)
    .at[rows, positions]
    .add(jnp.where(live, values, 0).astype(input_ids.dtype))
  )
  return jnp.where(sel, vals, input_ids)


def rtd_loss_terms(
  logits: jax.Array, labels: jax.Array, attention_mask: jax.Array
) -> dict[str, jax.Array]:
  """Summed binary cross-entropy of RTD logits over real tokens, and correct predictions.

  Args:
    logits: (B, T), > 0 = replaced.
    labels: (B, T), 1 where the token was replaced.
    attention_mask: (B, T), 1 at real tokens.
  """
  logits = logits.astype(jnp.float32)
  valid = attention_mask.astype(jnp.float32)
  labels = labels.astype(jnp.float32)
  bce = optax.sigmoid_binary_cross_entropy(logits, labels)
  correct = ((logits > 0).astype(jnp.float32) == labels).astype(jnp.float32)
  return {"loss_sum": jnp.sum(bce * valid), "correct_sum": jnp.sum(correct * valid)}


@dataclasses.dataclass(frozen=True)
class Electra(Objective):
  """ELECTRA's joint objective; terms "mlm" (generator) and "rtd" (discriminator).

  The step's ``config`` is the discriminator's and its params the pair tree of
  `init_electra`.

  Attributes:
    generator: the generator's config (its family's row picks the sharing,
      `Family.training["rtd"]`).
    rtd_weight: lambda, the weight of the RTD term; None: 50 for ELECTRA (the paper), 10
      for DeBERTa-v3 (`DEFAULT_RTD_WEIGHT`).
    mlm_weight: the weight of the generator's MLM term.
    temperature: the sampling temperature (1: the generator's softmax).
  """

  generator: BertConfig | None = None
  name: str = dataclasses.field(default="electra", kw_only=True)
  rtd_weight: float | None = None
  mlm_weight: float = 1.0
  temperature: float = 1.0

  def __post_init__(self):
    if not isinstance(self.generator, BertConfig):
      raise TypeError(f"Electra needs the generator's BertConfig, got {self.generator!r}")
    if not self.temperature > 0:
      raise ValueError(f"{self.temperature=} must be > 0")
    if _sharing_of(self.generator) is None:
      raise ValueError(
        f"generator model_type={self.generator.model_type!r}: replaced-token "
        f"detection is trained for {_rtd_families()}"
      )
    if self.rtd_weight is None:
      object.__setattr__(self, "rtd_weight", DEFAULT_RTD_WEIGHT[_sharing_of(self.generator)])

  @property
  def fields(self):
    """The generator's MLM fields: masked positions, original ids, weights."""
    return ("mlm_positions", "mlm_ids", "mlm_weights")

  @property
  def weights(self):
    """`mlm_weight` for the generator's MLM, `rtd_weight` for replaced-token detection."""
    return {"mlm": self.mlm_weight, "rtd": self.rtd_weight}

  def counts(self, batch):
    """Masked tokens for the generator's MLM, real tokens for replaced-token detection."""
    return {
      "mlm": jnp.sum(batch["mlm_weights"].astype(jnp.float32)),
      "rtd": jnp.sum(batch["attention_mask"].astype(jnp.float32)),
    }

  def checkpoint_meta(self) -> dict:
    """What a training checkpoint records beside the pair (the generator's config), so
    `bertjax export` can rebuild both models from the checkpoint alone."""
    return {
      "electra": {
        "generator": dataclasses.asdict(self.generator),
        "sharing": _sharing_of(self.generator),
        "rtd_weight": self.rtd_weight,
        "mlm_weight": self.mlm_weight,
        "temperature": self.temperature,
      }
    }

  def init_model(self, config: BertConfig, rng) -> Params:
    """The pair tree for discriminator ``config`` (see `init_electra`)."""
    return init_electra(self.generator, config, rng)

  def terms(self, ctx: Context):
    """The generator's MLM terms and the discriminator's replaced-token detection terms
    over the real tokens, from one `run`."""
    run = self.run(ctx.params, ctx.config, ctx.batch, ctx.rng, ctx.deterministic)
    return {
      "mlm": run["mlm"],
      "rtd": rtd_loss_terms(run["rtd_logits"], run["labels"], ctx.batch["attention_mask"]),
    }

  def run(
    self,
    params: Params,
    config: BertConfig,
    batch: dict,
    rng: jax.Array,
    deterministic: bool = True,
  ) -> dict:
    """One ELECTRA forward: generator MLM, sampling, discriminator.

    Args:
      params: the pair tree.
      config: the discriminator's config.
      batch: a masked batch (`input_ids`, `attention_mask`, `token_type_ids`, `mlm_*`).
      rng: the key (split into generator dropout, discriminator dropout, sampling).
      deterministic: disable dropout.

    Returns:
      Dict: "mlm" (the generator's summed terms), "sampled" (B, P), "original" and
      "corrupted" (B, T) ids, "labels" (B, T) int32 (1 = replaced), "rtd_logits" (B, T).
    """
    b = batch
    if set(params) != {"generator", "discriminator"}:
      raise ValueError(
        f"ELECTRA params must be {{'generator', 'discriminator'}}; got {sorted(params)}"
      )
    k_gen, k_disc, k_sample = jax.random.split(rng, 3)
    gen = generator_params(params, self.generator, config)
    gen_cfg = self.generator.replace(dtype=config.dtype)
    g_out = forward(
      gen,
      gen_cfg,
      b["input_ids"],
      b["attention_mask"],
      b["token_type_ids"],
      deterministic=deterministic,
      rng=k_gen,
    )
    hidden = losses.gather_positions(g_out.last_hidden_state, b["mlm_positions"])
    logits = mlm_logits(gen, gen_cfg, hidden).astype(jnp.float32)  # (B, P, V)
    weights = b["mlm_weights"].astype(jnp.float32)
    ids = b["mlm_ids"].astype(jnp.int32)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, ids)
    correct = (jnp.argmax(logits, -1) == ids).astype(jnp.float32)
    mlm = {"loss_sum": jnp.sum(ce * weights), "correct_sum": jnp.sum(correct * weights)}
    # Sampling is not differentiated (the paper's stop-gradient): the generator learns by MLM.
    sampled = jax.random.categorical(k_sample, jax.lax.stop_gradient(logits) / self.temperature)
    original = replace_tokens(b["input_ids"], b["mlm_positions"], ids, weights)
    corrupted = replace_tokens(original, b["mlm_positions"], sampled, weights)
    labels = (corrupted != original).astype(jnp.int32)
    disc = discriminator_params(params, self.generator, config)
    d_out = forward(
      disc,
      config,
      corrupted,
      b["attention_mask"],
      b["token_type_ids"],
      deterministic=deterministic,
      rng=k_disc,
    )
    d_logits = rtd_logits(disc, config, d_out.last_hidden_state)
    return {
      "mlm": mlm,
      "sampled": sampled,
      "original": original,
      "corrupted": corrupted,
      "labels": labels,
      "rtd_logits": d_logits,
    }


def is_pair(params: Params) -> bool:
  """Whether `params` is an ELECTRA ``{"generator", "discriminator"}`` pair tree."""
  return isinstance(params, dict) and set(params) == set(ROLES)


def generator_from_meta(meta: dict) -> BertConfig:
  """The generator's config recorded in a training checkpoint's metadata (`checkpoint_meta`).

  Raises:
    ValueError: the metadata has no ELECTRA record (a checkpoint written before runs
      recorded the generator's config, or not an ELECTRA run).
  """
  record = (meta.get("extra") or {}).get("electra")
  if not record or "generator" not in record:
    raise ValueError(
      f"checkpoint step {meta.get('step')} holds an ELECTRA pair but its "
      f"metadata records no generator config (extra keys: "
      f"{sorted(meta.get('extra') or {})}); export it with "
      "bertjax.training.electra.save_electra and the generator's BertConfig"
    )
  return config_from_json(record["generator"])


def save_electra(
  params: Params, generator: BertConfig, discriminator: BertConfig, directory: str | pathlib.Path
) -> tuple[pathlib.Path, pathlib.Path]:
  """Writes ``directory/generator`` (`ElectraForMaskedLM`) and ``directory/discriminator``.

  The discriminator is `ElectraForPreTraining`; the generator carries the shared tables
  (copied from the discriminator), so each loads on its own with strict keys. With GDES the
  generator is a `DebertaV2ForMaskedLM` and the discriminator's tables are written as
  ``E_G + E_delta`` (its RTD head as the released checkpoints' `mask_predictions.*`).

  Returns:
    The two directories.
  """
  from bertjax.model.hf import to_hf

  out = pathlib.Path(directory)
  gen_dir, disc_dir = out / "generator", out / "discriminator"
  to_hf(generator, generator_params(params, generator, discriminator), gen_dir)
  to_hf(discriminator, discriminator_params(params, generator, discriminator), disc_dir)
  return gen_dir, disc_dir
