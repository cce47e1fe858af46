"""Compressing a fine-tuned model four ways, the columns of the Primer's Table 1 (Rogers et al.
2020): a student of half the depth distilled from the teacher (DistilBERT), the same student on
the labels alone, one layer's parameters shared by every depth (ALBERT), and dynamic int8 linear
layers (Q8BERT); each scored on held-out data and timed side by side with the teacher.

`compress` trains the models and scores each on the held-out data (`score_held_out`: the
metrics and each example's correct count, so that a score can be recomputed on a resample of
examples), `time_logits` times their forwards, `compression_rows` turns both into one row per
model (parameters, weight bytes, depth, score, retained score, speed-up), and
`compression_table` writes the rows as Markdown under each row's `row_labels` label.
`joint_bootstrap` and `judge_joint` give a claim's interval where its statistics come from
independent samples of different units (held-out sentences for the scores, interleaved timing
rounds for the speed-ups).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from bertjax import claims, timing
from bertjax.model.config import BertConfig
from bertjax.model.forward import count_params, forward
from bertjax.model.heads import head_logits
from bertjax.quantize import weight_bytes
from bertjax.training import distill
from bertjax.training import finetune as F

# The models `compress` makes, in the table's order (without "shared_6l" for a teacher that
# `can_share` refuses).
ROLES = ("teacher", "distilled_3l", "labels_3l", "shared_6l", "int8")


# Each role's label for an all-MiniLM-L6-v2 teacher (`row_labels` for another).
LABELS = {
  "teacher": "teacher (MiniLM-L6, fine-tuned)",
  "distilled_3l": "DistilBERT-style 3L",
  "labels_3l": "3L, labels only",
  "shared_6l": "ALBERT-style shared 6L",
  "int8": "Q8BERT-style int8",
}


def can_share(config: BertConfig) -> bool:
  """Whether `distill.shared_student_from_teacher` can make the ALBERT-style model: a family
  whose row names a shared-layer counterpart (`Family.training["shared_student"]`: BERT's is
  ALBERT; MPNet's relative-position bias has none), without shared layers itself."""
  return "shared_student" in config.family.training and config.num_param_layers == config.depth


def retained(score: float, teacher_score: float) -> float:
  """The score as a fraction of the teacher's."""
  if not teacher_score > 0:
    raise ValueError(f"teacher_score={teacher_score} must be > 0 to compute a retained score")
  return score / teacher_score


def score_held_out(
  params, config: BertConfig, data: dict, task: str, *, batch_size: int = 64
) -> tuple[dict[str, float], np.ndarray]:
  """`finetune.evaluate`'s metrics on `data`, from the same predictions, and how many of each
  example's labels the model gets right, so that the accuracy can be recomputed on a resample
  of examples (sentences for a token task).

  Args:
    params, config: the model with its task head.
    data: the held-out data (`input_ids`, `attention_mask`, `token_type_ids`, `labels`).
    task: "classification" or "token_classification" (labels `finetune.IGNORE_INDEX` are
      not scored); a single-logit (regression) head has no correct count and is refused.
    batch_size: the prediction batches, as `finetune.evaluate`'s.

  Returns:
    `(metrics, correct)`: `finetune.classification_metrics` of the scored labels; int32
    `(N,)`, the correctly labelled count of each example (0 or 1 for "classification").
  """
  logits = F.predict(params, config, data, task, batch_size=batch_size).astype(np.float32)
  if logits.shape[-1] == 1:
    raise ValueError("a single-logit (regression) head has no correct count: no accuracy")
  labels, preds = np.asarray(data["labels"]), logits.argmax(-1)
  keep = labels != F.IGNORE_INDEX
  metrics = F.classification_metrics(preds[keep], labels[keep], logits.shape[-1])
  hits = (preds == labels) & keep
  correct = hits.reshape(len(hits), -1).sum(1).astype(np.int32)
  return metrics, correct


def joint_bootstrap(
  samples: Sequence[np.ndarray],
  statistic: Callable[..., np.ndarray],
  *,
  n_resamples: int = claims.RESAMPLES,
  confidence: float = 0.95,
  seed: int = claims.SEED,
) -> tuple[np.ndarray, np.ndarray]:
  """Percentile bootstrap interval of a statistic of independent samples of different units
  (held-out sentences and timing rounds): each sample is resampled on its own (its items, the
  first axis, with replacement, from its own random stream), and resample r of every sample
  goes into the statistic's value r.

  Args:
    samples: the arrays, items first; their numbers of items may differ.
    statistic: `statistic(*resampled)`, each `(R, n_i, ...)`, -> `(R,)` or `(R, k)` values.
    n_resamples, confidence, seed: as `stats.bootstrap_ci`'s (the streams are
      `np.random.SeedSequence(seed).spawn(len(samples))`).

  Returns:
    `(low, high)`: the `(1 - confidence) / 2` and `(1 + confidence) / 2` quantiles (linear
    interpolation) of the values, NaN values left out; arrays shaped as one value.
  """
  if not samples or any(np.ndim(a) == 0 or len(a) == 0 for a in samples):
    raise ValueError(
      f"samples must be arrays with >= 1 items; got {[np.shape(a) for a in samples]}"
    )
  streams = np.random.SeedSequence(seed).spawn(len(samples))
  resampled = [
    np.asarray(a)[np.random.default_rng(s).integers(0, len(a), (n_resamples, len(a)))]
    for a, s in zip(samples, streams)
  ]
  values = np.asarray(statistic(*resampled), np.float64)
  tail = (1 - confidence) / 2
  low, high = np.nanquantile(values, [tail, 1 - tail], axis=0)
  return low, high


def judge_joint(
  claim: claims.Claim,
  samples: Sequence[np.ndarray],
  statistics: Callable[..., Mapping[str, np.ndarray]],
  *,
  point: Mapping[str, float],
  over: str,
  shown: Mapping[str, str],
  fixed: Mapping[str, float] | None = None,
  before: str = "",
  n_resamples: int = claims.RESAMPLES,
) -> claims.Judgement:
  """`claim` judged as `Claim.judge` judges it, where its statistics come from independent
  samples of different units (`joint_bootstrap`): the 95% interval of each statistic and the
  rule's verdicts at the two ends of the interval of its level on each joint resample (a
  resample where a statistic is NaN has no verdict and is left out).

  Args:
    claim: the claim.
    samples: the independent samples.
    statistics: `statistics(*resampled)` -> {name: `(R,)` values} of the statistics that vary.
    point: the statistics' values on all the items (the row's), `fixed` ones included or not.
    over: what was resampled, for the text ("the 397 sentences and the 9 rounds, ...").
    shown: `{name: format}` of the intervals the text states, in order (those of statistics
      that `statistics` does not give left out).
    fixed: statistics the rule reads that nothing samples (exact counts), the same on every
      resample; they have no interval.
    before: text put before the interval's ("exact: ...; ").
    n_resamples: the bootstrap's.

  Returns:
    The `claims.Judgement`; the verdict is the rule's on `point`, and the span reaches it.
  """
  fixed = dict(fixed or {})
  names: list[str] = []

  def columns(*resampled):
    s = dict(statistics(*resampled))
    names[:] = list(s)
    rows = len(next(iter(s.values())))
    level = claim.levels({**{k: np.full(rows, v) for k, v in fixed.items()}, **s})
    cols = np.stack([np.asarray(s[k], np.float64) for k in names], -1)
    level = np.where(np.isnan(cols).any(-1), np.nan, level)  # no verdict without a value
    return np.concatenate([cols, level[:, None]], -1)

  low, high = joint_bootstrap(samples, columns, n_resamples=n_resamples)
  point = {**fixed, **point}
  verdict = claim.verdict(point)
  lo, hi = int(np.floor(low[-1])), int(np.ceil(high[-1]))
  if verdict in claims.LEVEL:  # the point's own verdict lies within the span, as in `judge`
    lo, hi = min(lo, claims.LEVEL[verdict]), max(hi, claims.LEVEL[verdict])
  intervals = {k: (float(low[i]), float(high[i])) for i, k in enumerate(names)}
  text = f"{before}95% CI over {over}: " + ", ".join(
    f"{k} [{fmt.format(intervals[k][0])}, {fmt.format(intervals[k][1])}]"
    for k, fmt in shown.items()
    if k in intervals
  )
  level_names = {-1: "n/a", 0: "no", 1: "partly", 2: "yes"}
  return claims.Judgement(
    claim, point, verdict, (level_names[lo], level_names[hi]), intervals, text
  )


def compress(
  teacher_config: BertConfig,
  teacher_params,
  train: dict,
  held: dict,
  *,
  task: str,
  hp: F.FinetuneConfig,
  temperature: float = 2.0,
  alpha: float = 0.5,
  shared_layer: int = 0,
  log: Callable[[str], None] | None = None,
) -> tuple[dict[str, dict], dict[str, tuple[BertConfig, Any]]]:
  """Fine-tunes the teacher, then makes each compressed model of `ROLES` from it.

  * `teacher`: the model as given, fine-tuned on `train` (`finetune.finetune`);
  * `distilled_3l`: a student of half the depth started from every other teacher layer
    (`distill.student_from_teacher`), trained on the labels and the teacher's soft targets
    (`distill.TaskDistillation` at `temperature`, weight `alpha`);
  * `labels_3l`: the same start trained on the labels alone;
  * `shared_6l` (only where `can_share`): every depth runs one shared layer seeded with the
    teacher's layer `shared_layer` (0-based), distilled as `distilled_3l`;
  * `int8`: the fine-tuned teacher with `quantize="int8"`, evaluated without retraining.

  Every trained model uses `hp` (steps, batch, learning rate, seed) and is scored on `held`
  by `score_held_out` (batches of `hp.eval_batch_size`, as `finetune.evaluate`).

  Returns:
    `(runs, models)`: role -> `{"metrics", "correct", "final_loss", "wall_time_s", "loss"}`
    (`int8`: `{"metrics", "correct"}`; `correct`: each held-out example's correctly labelled
    count, a list of ints); role -> `(config, params)`, both in `ROLES`' order.
  """
  runs: dict[str, dict] = {}
  models: dict[str, tuple[BertConfig, Any]] = {}

  def scored(name, config, params, **more):
    metrics, correct = score_held_out(params, config, held, task, batch_size=hp.eval_batch_size)
    runs[name] = {"metrics": metrics, "correct": correct.tolist(), **more}
    models[name] = (config, params)
    if log:
      log(f"{name}: {', '.join(f'{k} {v:.4f}' for k, v in metrics.items())}")

  def run(name, config, params, objective=None):
    r = F.finetune(config, params, train, None, task=task, hp=hp, objective=objective)
    more = {k: r[k] for k in ("final_loss", "wall_time_s")}
    scored(name, r["config"], r["params"], **more, loss=[h["loss"] for h in r["history"]])

  run("teacher", teacher_config, teacher_params)
  t_config, t_params = models["teacher"]
  soft = distill.TaskDistillation(
    t_config, t_params, task=task, temperature=temperature, alpha=alpha
  )
  s_config, s_params = distill.student_from_teacher(t_config, t_params)
  run("distilled_3l", s_config, s_params, (soft,))
  run("labels_3l", s_config, s_params)
  if can_share(t_config):
    run(
      "shared_6l", *distill.shared_student_from_teacher(t_config, t_params, shared_layer), (soft,)
    )
  scored("int8", t_config.replace(quantize="int8"), t_params)
  order = [k for k in ROLES if k in models]
  return {k: runs[k] for k in order}, {k: models[k] for k in order}


def time_logits(
  models: Mapping[str, tuple[BertConfig, Any]],
  batch: Mapping[str, Any],
  *,
  head: str = "token_classifier",
  rounds: int,
  warmup: int = 1,
) -> dict[str, dict[str, Any]]:
  """Each model's forward to its `head`'s logits on one batch, compiled ahead of time and then
  timed side by side (`timing.compiled_side_by_side`).

  Args:
    models: name -> (config, params).
    batch: `input_ids`, `attention_mask`, `token_type_ids`, the same for every model.
    rounds: timed rounds; `warmup`: untimed calls before them (the first is the compiled
      program's first call).

  Returns:
    name -> `{"compile_s", "median_s", "min_s", "rounds_s"}`.
  """
  args = tuple(jnp.asarray(batch[k]) for k in ("input_ids", "attention_mask", "token_type_ids"))

  def logits(config):
    return lambda p, ids, mask, types: head_logits(
      p, config, forward(p, config, ids, mask, types), head
    )

  times = timing.compiled_side_by_side(
    {name: (logits(config), (params, *args)) for name, (config, params) in models.items()},
    rounds,
    warmup=max(warmup - 1, 0),
  )
  return {
    name: {k: t[k] for k in ("compile_s", "median_s", "min_s")} | {"rounds_s": t["times_s"]}
    for name, t in times.items()
  }


def compression_rows(
  models: Mapping[str, tuple[BertConfig, Any]],
  runs: Mapping[str, dict],
  speed: Mapping[str, dict],
  *,
  metric: str = "accuracy",
) -> dict[str, dict]:
  """One row per model, against the one named "teacher": `params` (`count_params`, heads
  included), `param_ratio`, `bytes` and `mb` (`quantize.weight_bytes`; int8 for "int8"),
  `compression` (the teacher's bytes over the model's), `depth`, `stored_layers`, `score`
  (`runs[name]["metrics"][metric]`), `retained`, `speedup` (the teacher's median forward time
  over the model's), `forward_median_s` and `compile_s` (from `time_logits`)."""
  teacher_score = runs["teacher"]["metrics"][metric]
  teacher_params = count_params(models["teacher"][1])
  teacher_bytes = weight_bytes(models["teacher"][1])
  rows: dict[str, dict] = {}
  for name, (config, params) in models.items():
    count, score = count_params(params), runs[name]["metrics"][metric]
    size = weight_bytes(params, int8=name == "int8")
    rows[name] = {
      "params": count,
      "param_ratio": count / teacher_params,
      "bytes": size,
      "depth": config.depth,
      "stored_layers": config.num_param_layers,
      "score": score,
      "retained": retained(score, teacher_score),
      "speedup": speed["teacher"]["median_s"] / speed[name]["median_s"],
      "forward_median_s": speed[name]["median_s"],
      "compile_s": speed[name]["compile_s"],
      "mb": size / 1e6,
      "compression": teacher_bytes / size,
    }
  return rows


def row_labels(rows: Mapping[str, Mapping], teacher: str, short: str) -> dict[str, str]:
  """Each role's label: `LABELS` for the all-MiniLM-L6-v2 `teacher`, else with the teacher's
  `short` name and the students' depth from `rows` (`compression_rows`)."""
  if teacher == "all-MiniLM-L6-v2":
    return dict(LABELS)
  half = rows["distilled_3l"]["depth"]
  return {
    **LABELS,
    "teacher": f"teacher ({short}, fine-tuned)",
    "distilled_3l": f"DistilBERT-style {half}L",
    "labels_3l": f"{half}L, labels only",
  }


def model_labels(config: BertConfig, teacher: str, short: str) -> dict[str, str]:
  """Each role's label in the log and the table, with the layer counts of the models `compress`
  makes from the teacher's `config` (the role keys are all-MiniLM-L6-v2's: `distilled_3l`,
  `shared_6l`); `teacher` and `short` name the teacher as `row_labels` takes them."""
  half = len(distill.default_student_layers(config))
  labels = row_labels({"distilled_3l": {"depth": half}}, teacher, short)
  if can_share(config):
    labels["shared_6l"] = f"ALBERT-style shared {config.depth}L"
  return labels


def relabelled(labels: Mapping[str, str], line: str) -> str:
  """A progress line of `compress` ("distilled_3l: accuracy ...") with the role that starts it
  replaced by its label (`model_labels`)."""
  role, sep, rest = line.partition(": ")
  return f"{labels[role]}{sep}{rest}" if sep and role in labels else line


def timing_caption(
  cpu: Mapping[str, Any], *, batch: int, length: int, rounds: int, load: tuple[float, float]
) -> str:
  """The line under `compression_table`: the machine (`utils.cpu_info`: model, cores, ISA),
  the timed batch (`batch` x `length` tokens), the interleaved `rounds` and the 1-minute load
  average before and after the timing."""
  isa = ", ".join(cpu["isa_flags"]) or "no AVX2+"
  return (
    f"{cpu['cpu']}, {cpu['cpus']} cores ({isa}), batch {batch} x {length}, float32 unless int8, "
    f"median of {rounds} interleaved rounds, load {load[0]:.1f}->{load[1]:.1f}"
  )


def compression_table(
  rows: Mapping[str, Mapping], cpu: str, labels: Mapping[str, str] = LABELS
) -> str:
  """The rows of `compression_rows` as a Markdown table, one line per model, and the line
  `cpu` (the machine and how the speed-ups were timed) below it."""
  lines = [
    "| model | layers (stored) | parameters | weights (MB) | UPOS accuracy | retained | CPU speed-up |",
    "|---|---|---|---|---|---|---|",
  ]
  for name, r in rows.items():
    lines.append(
      f"| {labels[name]} | {r['depth']} ({r['stored_layers']}) | "
      f"{r['params'] / 1e6:.2f}M | {r['mb']:.1f} | {r['score']:.2%} | "
      f"{r['retained']:.1%} | {r['speedup']:.2f}x |"
    )
  lines.append(f"\nCPU: {cpu}.")
  return "\n".join(lines)
