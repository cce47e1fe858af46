"""Training objectives as components: each declares its heads, batch fields, terms and metrics.

An objective is a small frozen dataclass. The train step (`training.step`) sums
the terms of the configured objectives, each divided by its count over the whole
(accumulated) batch and multiplied by its weight; adding an objective is adding a
component, not editing the step.

Every objective provides:

* ``heads``: the family heads it needs on the model (`bertjax.init(..., heads=)`),
* ``fields``: the batch keys it reads,
* ``counts(batch)``: each term's denominator over the whole batch,
* ``terms(ctx)``: each term's summed loss (``loss_sum``) and summed correct predictions
  (``correct_sum``; left out by a term that predicts nothing to count, such as a
  distance), from a `Context` that runs the model's forward pass at most once,
* ``weights``: each term's weight in the total loss,
* ``init_params(config, rng)``: parameters the objective owns beyond the family's heads
  (e.g. the span boundary head), ``{}`` for most.

Metrics follow from the terms: ``<term>_loss`` (sum / count) and, where the term has a
``correct_sum``, ``<term>_accuracy`` (correct / count). The built-ins: `MaskedLM` ("mlm"), `SentencePair` ("nsp", "sop"),
`Classification` ("cls"), `TokenClassification` ("tok"); the ELECTRA, span boundary
and word-order objectives live in `training.electra` and `training.span_objectives`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from bertjax.model.config import BertConfig
from bertjax.model.heads import head_logits, nsp_logits, sop_logits, token_classify
from bertjax.training import losses, span_objectives
from bertjax.training.objective_base import Objective


@dataclasses.dataclass(frozen=True)
class MaskedLM(Objective):
  """BERT's masked-LM cross-entropy at `mlm_positions` (only those go through the decoder)."""

  name: str = "mlm"

  @property
  def heads(self):
    """The MLM head."""
    return ("mlm",)

  @property
  def fields(self):
    """The masked positions, their original ids and their weights (0 for padding)."""
    return ("mlm_positions", "mlm_ids", "mlm_weights")

  def counts(self, batch):
    """The masked tokens (the sum of `mlm_weights`)."""
    return {self.name: jnp.sum(batch["mlm_weights"].astype(jnp.float32))}

  def terms(self, ctx):
    """The weighted cross-entropy and correct predictions at the masked positions."""
    b = ctx.batch
    return {
      self.name: losses.mlm_loss_terms(
        ctx.params,
        ctx.config,
        ctx.out.last_hidden_state,
        b["mlm_positions"],
        b["mlm_ids"],
        b["mlm_weights"],
      )
    }


@dataclasses.dataclass(frozen=True)
class SentencePair(Objective):
  """NSP (BERT, label 1 = random next) or SOP (ALBERT, label 1 = swapped) on the pooler."""

  name: str = "nsp"

  def __post_init__(self):
    if self.name not in ("nsp", "sop"):
      raise ValueError(f"SentencePair name={self.name!r} must be 'nsp' or 'sop'")

  @property
  def heads(self):
    """The NSP or SOP head (the term's name)."""
    return (self.name,)

  @property
  def fields(self):
    """`next_sentence_labels` (NSP) or `sop_labels` (SOP)."""
    return ("next_sentence_labels",) if self.name == "nsp" else ("sop_labels",)

  def terms(self, ctx):
    """The two-way cross-entropy and correct predictions of the head on the pooler output
    (SOP's head applies its dropout in training)."""
    pooled = ctx.out.pooler_output
    if self.name == "nsp":
      logits = nsp_logits(ctx.params, ctx.config, pooled)
    else:
      logits = sop_logits(
        ctx.params, ctx.config, pooled, deterministic=ctx.deterministic, rng=ctx.head_rng
      )
    return {self.name: losses.sentence_loss_terms(logits, ctx.batch[self.fields[0]])}


@dataclasses.dataclass(frozen=True)
class Classification(Objective):
  """Sequence classification (cross-entropy; squared error with one output) on `labels`."""

  name: str = "cls"

  @property
  def heads(self):
    """The sequence classifier."""
    return ("classifier",)

  @property
  def fields(self):
    """The sequence labels."""
    return ("labels",)

  def terms(self, ctx):
    """The classifier's loss (cross-entropy, or squared error with one output) and correct
    predictions."""
    logits = head_logits(
      ctx.params,
      ctx.config,
      ctx.out,
      "classifier",
      deterministic=ctx.deterministic,
      rng=ctx.head_rng,
    )
    return {self.name: losses.classification_loss_terms(logits, ctx.batch["labels"])}


@dataclasses.dataclass(frozen=True)
class TokenClassification(Objective):
  """Token classification over labels != -100."""

  name: str = "tok"

  @property
  def heads(self):
    """The token classifier."""
    return ("token_classifier",)

  @property
  def fields(self):
    """The per-token labels (-100 where a token has none)."""
    return ("labels",)

  def counts(self, batch):
    """The labelled tokens (labels != -100)."""
    return {self.name: jnp.sum((batch["labels"] != losses.IGNORE_INDEX).astype(jnp.float32))}

  def terms(self, ctx):
    """The token classifier's cross-entropy and correct predictions over the labelled tokens."""
    logits = token_classify(
      ctx.params,
      ctx.config,
      ctx.out.last_hidden_state,
      deterministic=ctx.deterministic,
      rng=ctx.head_rng,
    )
    return {self.name: losses.token_classification_loss_terms(logits, ctx.batch["labels"])}


def _registry() -> dict[str, Any]:
  return {
    "mlm": MaskedLM,
    "nsp": lambda: SentencePair("nsp"),
    "sop": lambda: SentencePair("sop"),
    "sbo": span_objectives.SpanBoundary,
    "word_order": span_objectives.WordOrder,
  }


def names() -> tuple[str, ...]:
  """The objective names `resolve` accepts (besides "none")."""
  return tuple(_registry())


def resolve(objective, *, task: str = "pretrain") -> tuple[Objective, ...]:
  """Objectives from a spec.

  Args:
    objective: for pretraining, "nsp" / "sop" / "none" (MLM plus that sentence objective,
      as before components), a "+"-joined list of names ("mlm+sbo", "mlm+word_order"),
      an `Objective`, or a sequence of `Objective`s (used as given).
    task: "pretrain", "classification" or "token_classification" (fine-tuning tasks
      have one objective each and ignore a string `objective`; components are used
      as given for any task, e.g. `distill.TaskDistillation`).

  Returns:
    A tuple of objectives with distinct term names.
  """
  components = isinstance(objective, Objective) or (
    isinstance(objective, (tuple, list)) and len(objective) > 0
  )
  if task == "classification" and not components:
    return (Classification(),)
  if task == "token_classification" and not components:
    return (TokenClassification(),)
  if isinstance(objective, Objective):
    objs = (objective,)
  elif isinstance(objective, (tuple, list)):
    objs = tuple(objective)
    bad = [o for o in objs if not isinstance(o, Objective)]
    if bad:
      raise TypeError(f"objective entries {bad!r} are not Objective components")
  elif isinstance(objective, str):
    if objective in ("nsp", "sop"):
      objs = (MaskedLM(), SentencePair(objective))
    elif objective == "none":
      objs = (MaskedLM(),)
    else:
      registry = _registry()
      parts = [p.strip() for p in objective.split("+") if p.strip()]
      unknown = [p for p in parts if p not in registry]
      if not parts or unknown:
        raise ValueError(
          f"objective={objective!r}: unknown names {unknown}; expected 'nsp', "
          f"'sop', 'none' or '+'-joined names of {tuple(registry)}"
        )
      objs = tuple(registry[p]() for p in parts)
  else:
    raise TypeError(f"objective={objective!r} must be a string, an Objective or a sequence of them")
  seen: dict[str, str] = {}
  for o in objs:
    for term in o.weights:
      if term in seen:
        raise ValueError(
          f"term {term!r} comes from two objectives ({seen[term]} and "
          f"{type(o).__name__}); give one a different name"
        )
      seen[term] = type(o).__name__
  return objs


def heads_of(objectives) -> tuple[str, ...]:
  """The family heads the objectives need, in first-use order."""
  out: list[str] = []
  for o in objectives:
    out += [h for h in o.heads if h not in out]
  return tuple(out)


def init_objective_params(objectives, config: BertConfig, rng: int | jax.Array = 0) -> dict:
  """The parameters the objectives own (beyond the family heads), keyed as in params."""
  key = jax.random.key(rng) if isinstance(rng, int) else rng
  out: dict = {}
  for i, o in enumerate(objectives):
    out.update(o.init_params(config, jax.random.fold_in(key, i)))
  return out
