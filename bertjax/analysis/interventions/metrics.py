"""What a patched run is scored by, and what a patching sweep returns.

Metrics are pure functions `metric(params, config, out, batch) -> scalar` of a run's
`BertOutput` and its batch (the `bertjax.analysis.interventions.patching` docstring says what
they read):
`LogitDiff`, `AnswerLogProb` and `ProbeLogitDiff`, each a mean over the batch's rows
(`row_mean = True`). A sweep's values come back as a `PatchingResult`, normalised with
`normalize`; `agreement` compares attribution patching with the exact sweep.

A metric may say which positions of the final hidden state it reads, with a method
`rows(config, batch) -> int (B, R)` (the three here do, except a probe on mean-pooled
states): the sweeps then run the model's last block at those rows only
(`bertjax.run_layers(final_rows=...)`), which gives the same values for a fraction of
that block's work. A metric without the method is given every row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import stats
from bertjax.model.forward import BertOutput
from bertjax.model.heads import head_logits, mlm_logits, token_classify

Metric = Callable[..., jax.Array]


# Metrics --------------------------------------------------------------------


def _head_logits_at(params, config, out: BertOutput, batch, head: str) -> jax.Array:
  """(B, C) logits of `head`: token heads read `batch["position"]`, sequence heads their input."""
  if head in ("mlm", "token_classifier"):
    if "position" not in batch:
      raise ValueError(
        f"the {head!r} head reads one token per sequence: targets need "
        f"'position' (batch,); got keys {sorted(batch)}"
      )
    b = jnp.arange(out.last_hidden_state.shape[0])
    hidden = out.last_hidden_state[b, batch["position"].astype(jnp.int32)]  # (B, H)
    fn = mlm_logits if head == "mlm" else token_classify
    return fn(params, config, hidden)
  if head in ("nsp", "sop", "classifier"):
    return head_logits(params, config, out, head)
  raise ValueError(
    f"{head=!r} must be one of 'mlm', 'token_classifier', 'nsp', 'sop', 'classifier'"
  )


def _token_rows(config, batch, head: str):
  """(B, 1) rows a head's logits at `batch["position"]` (token heads) or the first token read."""
  if head in ("mlm", "token_classifier"):
    if "position" not in batch:  # the metric itself raises the error that names it
      return None
    return jnp.asarray(batch["position"], jnp.int32)[:, None]
  # Sequence heads read the first token: the pooler ([CLS]) or the first token's state.
  return jnp.zeros((batch["input_ids"].shape[0], 1), jnp.int32)


def check_targets(params, config, metric, batch) -> None:
  """Checks a sweep's concrete targets against what `metric` reads, before any program runs.

  Inside a compiled program an out-of-range index is clamped, wrapped or read as NaN, so
  a wrong `position` or class id would come back as a plausible-looking number. Metrics
  with a method `check(params, config, batch)` (the three here) are asked; others pass.

  Raises:
    ValueError: naming the target, its bad value and the valid range.
  """
  check = getattr(metric, "check", None)
  if check is not None:
    check(params, config, {k: np.asarray(v) for k, v in batch.items()})


def _check_index(batch, key: str, size: int, what: str) -> np.ndarray:
  """`batch[key]` (B,) as int, every entry in [0, size); else a ValueError naming it."""
  if key not in batch:
    raise ValueError(f"targets need {key!r} (batch,): {what}; got keys {sorted(batch)}")
  v = np.asarray(batch[key])
  if v.ndim != 1 or not np.issubdtype(v.dtype, np.integer):
    raise ValueError(
      f"targets[{key!r}] must be (batch,) integers ({what}); got shape {v.shape}, dtype {v.dtype}"
    )
  bad = np.flatnonzero((v < 0) | (v >= size))
  if bad.size:
    raise ValueError(
      f"targets[{key!r}] = {v[bad[0]]} at row {bad[0]} is out of range: "
      f"{what} must be in [0, {size})"
    )
  return v.astype(np.int64)


def _head_classes(params, config, head: str) -> int:
  """How many classes (logits) `head` gives, read from the parameters' shapes."""
  if head == "mlm":  # the decoder is tied to the word embeddings: one logit per row
    return int(np.shape(params["embeddings"]["word_embeddings"]["embedding"])[0])

  def logits(p):  # traced for shapes only (a few ms: the task heads are small)
    h = config.hidden_size
    out = BertOutput(last_hidden_state=jnp.zeros((1, 1, h)), pooler_output=jnp.zeros((1, h)))
    return _head_logits_at(p, config, out, {"position": jnp.zeros((1,), jnp.int32)}, head)

  return int(jax.eval_shape(logits, params).shape[-1])


def _check_head_targets(params, config, batch, head: str) -> None:
  if head in ("mlm", "token_classifier"):
    seq = np.asarray(batch["input_ids"]).shape[1]
    position = _check_index(batch, "position", seq, "the token each row's head reads")
    mask = np.asarray(batch["attention_mask"])
    padded = np.flatnonzero(mask[np.arange(len(position)), position] == 0)
    if padded.size:
      raise ValueError(
        f"targets['position'] = {position[padded[0]]} at row {padded[0]} is "
        "a padding position (attention_mask 0); point it at a real token"
      )
  classes = _head_classes(params, config, head)
  for key in ("answer", "distractor"):
    if key in batch:
      _check_index(batch, key, classes, f"a class or token id of the {head!r} head")


def metric_rows(metric, config, batch):
  """The (B, R) positions `metric` reads from the final hidden state, or None (all of them)."""
  rows = getattr(metric, "rows", None)
  return None if rows is None else rows(config, batch)


def at_least_f32(x):
  """At least float32 (float64 stays float64)."""
  return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _pick(logits, ids):
  return jnp.take_along_axis(logits, ids.astype(jnp.int32)[:, None], -1)[:, 0]


@dataclasses.dataclass(frozen=True)
class LogitDiff:
  """Mean over the batch of `logit[answer] - logit[distractor]` of a task head.

  The standard patching metric (Wang et al. 2023; Heimersheim & Nanda 2024).
  Token heads ("mlm", "token_classifier") read the final state at
  `targets["position"]` (only those rows go through the head); sequence heads
  ("nsp", "sop", "classifier") read what their Hugging Face class reads.
  Targets: `answer`, `distractor` (batch,) class or token ids; `position` (batch,)
  for token heads.
  """

  head: str = "mlm"
  row_mean: ClassVar[bool] = True  # a mean of per-row values: a mesh may pad rows

  def __call__(self, params, config, out, batch):
    logits = at_least_f32(_head_logits_at(params, config, out, batch, self.head))
    return jnp.mean(_pick(logits, batch["answer"]) - _pick(logits, batch["distractor"]))

  def rows(self, config, batch):
    """The one position per sequence the head reads (`metric_rows`)."""
    return _token_rows(config, batch, self.head)

  def check(self, params, config, batch):
    """`position`, `answer` and `distractor` in range (`check_targets`)."""
    for key in ("answer", "distractor"):
      if key not in batch:
        raise ValueError(f"LogitDiff needs targets[{key!r}] (batch,); got keys {sorted(batch)}")
    _check_head_targets(params, config, batch, self.head)


@dataclasses.dataclass(frozen=True)
class AnswerLogProb:
  """Mean over the batch of `log p(answer)` under a task head (targets as `LogitDiff`)."""

  head: str = "mlm"
  row_mean: ClassVar[bool] = True  # a mean of per-row values: a mesh may pad rows

  def __call__(self, params, config, out, batch):
    logits = at_least_f32(_head_logits_at(params, config, out, batch, self.head))
    return jnp.mean(_pick(jax.nn.log_softmax(logits, -1), batch["answer"]))

  def rows(self, config, batch):
    """The one position per sequence the head reads (`metric_rows`)."""
    return _token_rows(config, batch, self.head)

  def check(self, params, config, batch):
    """`position` and `answer` in range (`check_targets`)."""
    if "answer" not in batch:
      raise ValueError(f"AnswerLogProb needs targets['answer'] (batch,); got keys {sorted(batch)}")
    _check_head_targets(params, config, batch, self.head)


@dataclasses.dataclass(frozen=True, eq=False)
class ProbeLogitDiff:
  """A linear probe on the final states: mean of `logit[answer] - logit[distractor]`.

  Compared by identity (it holds arrays): build it once and pass the same object.

  Attributes:
    weight: (hidden, classes).
    bias: (classes,).
    pooling: "first" (the first token's final state, [CLS]) or "mean" (over real tokens).
  """

  weight: Any
  bias: Any
  pooling: str = "first"
  row_mean: ClassVar[bool] = True

  def __post_init__(self):
    if self.pooling not in ("first", "mean"):
      raise ValueError(f"pooling={self.pooling!r} must be 'first' or 'mean'")
    w, b = np.shape(self.weight), np.shape(self.bias)
    if len(w) != 2 or b != w[1:]:
      raise ValueError(f"weight shape {w} and bias shape {b} must be (hidden, C) and (C,)")

  def __call__(self, params, config, out, batch):
    h = at_least_f32(out.last_hidden_state)
    if self.pooling == "first":
      x = h[:, 0]
    else:
      m = batch["attention_mask"].astype(h.dtype)[..., None]
      x = (h * m).sum(1) / jnp.maximum(m.sum(1), 1)
    logits = x @ jnp.asarray(self.weight, h.dtype) + jnp.asarray(self.bias, h.dtype)
    return jnp.mean(_pick(logits, batch["answer"]) - _pick(logits, batch["distractor"]))

  def check(self, params, config, batch):
    """`answer` and `distractor` among the probe's classes (`check_targets`)."""
    classes = np.shape(self.weight)[1]
    for key in ("answer", "distractor"):
      _check_index(batch, key, classes, "a class of the probe")

  def rows(self, config, batch):
    """The first token with pooling "first"; every row (None) with "mean" (`metric_rows`)."""
    return _token_rows(config, batch, "classifier") if self.pooling == "first" else None


# Results --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PatchingResult:
  """A patching sweep: the metric with each patch, beside the clean and corrupted runs.

  Attributes:
    site: the patched site.
    axes: names of the two axes of `values`, e.g. ("layer", "head").
    values: float64 (layers, heads | positions): the metric of each patched run (for
      attribution patching, its first-order estimate); NaN where a patch does not apply.
    clean: the metric on the clean run.
    corrupted: the metric on the corrupted run.
    direction: "denoise" or "noise".
    method: "exact", "attribution" or "path".
  """

  site: str
  axes: tuple[str, str]
  values: np.ndarray
  clean: float
  corrupted: float
  direction: str = "denoise"
  method: str = "exact"

  @property
  def normalized(self) -> np.ndarray:
    """`(values - corrupted) / (clean - corrupted)`: 1 = the clean metric, 0 = the corrupted."""
    return normalize(self.values, self.clean, self.corrupted)


def normalize(values, clean: float, corrupted: float) -> np.ndarray:
  """`(values - corrupted) / (clean - corrupted)`, the conventional patching normalisation.

  Raises:
    ValueError: when the clean and corrupted metrics are equal (nothing to restore).
  """
  if not np.isfinite(clean - corrupted) or clean == corrupted:
    raise ValueError(
      f"clean={clean} and corrupted={corrupted} metrics must differ (and be "
      "finite) to normalise; compare the raw values instead"
    )
  return (np.asarray(values, np.float64) - corrupted) / (clean - corrupted)


def agreement(exact: PatchingResult, approx: PatchingResult) -> dict[str, float]:
  """How well `approx` (attribution patching) ranks and scales like `exact`.

  Returns:
    "pearson" and "spearman" correlations of the normalised values over the
    entries finite in both (Spearman with tied values given their average rank, as
    `scipy.stats.spearmanr`; NaN where a side is constant), "max_abs_diff" between
    them, and "n" entries.
  """
  a, b = np.asarray(exact.normalized).ravel(), np.asarray(approx.normalized).ravel()
  if a.shape != b.shape:
    raise ValueError(f"exact values shape {exact.values.shape} != approx {approx.values.shape}")
  keep = np.isfinite(a) & np.isfinite(b)
  a, b = a[keep], b[keep]
  few = a.size < 2
  return {
    "pearson": float("nan") if few else stats.pearson(a, b),
    "spearman": float("nan") if few else stats.spearman(a, b),
    "max_abs_diff": float(np.abs(a - b).max()) if a.size else float("nan"),
    "n": int(a.size),
  }
