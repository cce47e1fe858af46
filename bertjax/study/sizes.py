"""A study's sizes: its runs' tables in a TOML file, and the training budgets built from them."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import tomllib

from bertjax.study.command import UsageError


def sizes(path: str | os.PathLike, name: str) -> dict[str, dict[str, Any]]:
  """The sizes of study `name`'s runs, by scale ("full", "smoke", maybe "gpu"), read from the
  TOML file `path`, whose tables are `[NAME.SCALE]`. A table with `like = "other"` takes
  every size it leaves out from that scale's table; a size that another of its scales gives
  and this one leaves out is None (TOML has no null).

  Raises:
    KeyError: the file has no table for `name`, or a `like` names no scale of it.
  """
  with open(path, "rb") as f:
    tables = tomllib.load(f)[name]
  tables = {
    scale: {**tables[table["like"]], **table} if "like" in table else table
    for scale, table in tables.items()
  }
  tables = {scale: {k: v for k, v in t.items() if k != "like"} for scale, t in tables.items()}
  keys = dict.fromkeys(k for table in tables.values() for k in table)
  return {scale: {k: table.get(k) for k in keys} for scale, table in tables.items()}


@dataclasses.dataclass(frozen=True)
class Scale:
  """The training budget of an experiment that trains models; each one's sizes subclass it.

  Attributes:
    steps: optimizer steps of each trained model.
    batch: examples per step.
    lr: peak learning rate.
    warmup: linear warm-up steps.
  """

  steps: int
  batch: int
  lr: float
  warmup: int

  def with_steps(self, steps: int | None, *, minimum: int, min_warmup: int = 1) -> Scale:
    """This scale (of the same class) with `--steps` applied: `steps` steps and 10% of them
    (at least `min_warmup`) of warm-up; unchanged when `steps` is None.

    Raises:
      UsageError: `steps` is below `minimum`.
    """
    if steps is None:
      return self
    if steps < minimum:
      raise UsageError(f"--steps={steps} must be >= {minimum}")
    return dataclasses.replace(self, steps=steps, warmup=max(min_warmup, steps // 10))

  def finetune_config(self, seed: int, **fields: Any):
    """The `finetune.FinetuneConfig` of this budget; `fields` set its other fields."""
    from bertjax.training import finetune

    return finetune.FinetuneConfig(
      steps=self.steps,
      batch_size=self.batch,
      learning_rate=self.lr,
      warmup_steps=self.warmup,
      seed=seed,
      **fields,
    )


@dataclasses.dataclass(frozen=True)
class PretrainScale(Scale):
  """A BERT pre-trained from scratch (MLM only) on WikiText-2: the model, the data, the budget.

  Attributes:
    layers, hidden, heads, ffn: the model's depth, width, heads and feed-forward width.
    vocab: the WordPiece vocabulary trained on the training text.
    seq_len: tokens per segment.
    max_lines: read only the first lines of each file (None: all).
    eval_batches: fixed held-out batches of `batch` segments.
    window: trailing-mean window of the training loss curves.
  """

  layers: int
  hidden: int
  heads: int
  ffn: int
  vocab: int
  seq_len: int
  max_lines: int | None
  eval_batches: int
  window: int

  def bert_config(self, vocab_size: int, **fields: Any):
    """The `BertConfig` of this model over `vocab_size` tokens (its positions: `seq_len`);
    `fields` set the `BertConfig` fields that the scale does not."""
    import bertjax

    return bertjax.BertConfig(
      vocab_size=vocab_size,
      hidden_size=self.hidden,
      num_hidden_layers=self.layers,
      num_attention_heads=self.heads,
      intermediate_size=self.ffn,
      max_position_embeddings=self.seq_len,
      **fields,
    )

  def train_config(self, seed: int):
    """The `loop.TrainConfig` of this budget: AdamW, linear decay after the warm-up."""
    from bertjax.training import loop

    return loop.TrainConfig(
      steps=self.steps,
      batch_size=self.batch,
      learning_rate=self.lr,
      warmup_steps=self.warmup,
      decay="linear",
      seed=seed,
    )
