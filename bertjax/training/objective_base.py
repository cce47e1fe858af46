"""The base of every training objective: `Objective` and the `Context` its terms read.

What an objective provides is described in `training.objectives`, which holds the
built-ins and resolves names; `training.span_objectives`, `training.electra` and
`training.distill` add their own on this base.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from bertjax.model.config import BertConfig
from bertjax.model.forward import BertOutput, forward


class Context:
  """What an objective's `terms` sees for one micro-batch.

  The main forward pass (`out`) runs once, on first use, and is shared by every
  objective that reads it. Keys: `forward_rng` drives the forward's dropout,
  `head_rng` the heads' dropout (the split of the step's key, as before components),
  and `key(i)` derives independent keys for anything else an objective samples.
  """

  def __init__(self, params, config: BertConfig, batch: dict, rng: jax.Array, deterministic: bool):
    self.params, self.config, self.batch = params, config, batch
    self.deterministic = deterministic
    self.rng = rng
    self.forward_rng, self.head_rng = jax.random.split(rng)
    self._out: BertOutput | None = None

  @property
  def out(self) -> BertOutput:
    """`forward` of the main model on the batch (computed once)."""
    if self._out is None:
      b = self.batch
      self._out = forward(
        self.params,
        self.config,
        b["input_ids"],
        b["attention_mask"],
        b["token_type_ids"],
        deterministic=self.deterministic,
        rng=self.forward_rng,
      )
    return self._out

  def key(self, i: int) -> jax.Array:
    """An independent key for an objective's own sampling (i: a small tag)."""
    return jax.random.fold_in(self.head_rng, 1000 + i)


@dataclasses.dataclass(frozen=True)
class Objective:
  """Base class: one or more loss terms. Subclasses override what differs.

  Attributes:
    name: the term's name (metrics ``<name>_loss`` and, where its terms count correct
      predictions, ``<name>_accuracy``).
    weight: its weight in the total loss (keyword-only).
  """

  name: str = "objective"
  weight: float = dataclasses.field(default=1.0, kw_only=True)

  @property
  def heads(self) -> tuple[str, ...]:
    """The family heads the objective reads (`bertjax.init(..., heads=)`); none by default."""
    return ()

  @property
  def fields(self) -> tuple[str, ...]:
    """The batch keys the objective reads (`check_batch` names any missing); none by default."""
    return ()

  @property
  def weights(self) -> dict[str, float]:
    """Each term's weight in the total loss: `{name: weight}` for a one-term objective."""
    return {self.name: self.weight}

  def counts(self, batch: dict) -> dict[str, jax.Array]:
    """Each term's denominator over the whole (accumulated) batch: by default, its sequences."""
    return {self.name: jnp.asarray(batch["input_ids"].shape[0], jnp.float32)}

  def terms(self, ctx: Context) -> dict[str, dict[str, jax.Array]]:
    """Each term's `loss_sum` (and `correct_sum` where it predicts something countable) for
    one micro-batch, from `ctx`; every subclass defines it."""
    raise NotImplementedError

  def init_params(self, config: BertConfig, rng: jax.Array) -> dict[str, Any]:
    """Parameters the objective owns beyond the family's heads (merged into the model's);
    none by default."""
    return {}

  def check_batch(self, batch: dict) -> None:
    """Raises naming the missing fields, before any compute."""
    missing = [f for f in self.fields if f not in batch]
    if missing:
      raise ValueError(
        f"objective {self.name!r} needs batch fields {list(self.fields)}; "
        f"missing {missing} (batch has {sorted(batch)})"
      )
