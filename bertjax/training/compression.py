"""Compressing a fine-tuned model four ways, the columns of the Primer's Table 1 (Rogers et al.
2020): a student of half the depth distilled from the teacher (DistilBERT), the same student on
the labels alone, one layer's parameters shared by every depth (ALBERT), and dynamic int8 linear
layers (Q8BERT); each scored on held-out data and timed side by side with the teacher.

`compress` trains the models, `time_logits` times their forwards, `compression_rows` turns
both into one row per model (parameters, weight bytes, depth, score, retained score, speed-up),
and `compression_table` writes the rows as Markdown under each row's `row_labels` label.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax.numpy as jnp

from bertjax import timing
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

  Every trained model uses `hp` (steps, batch, learning rate, seed).

  Returns:
    `(runs, models)`: role -> `{"metrics", "final_loss", "wall_time_s", "loss"}` (`int8`:
    `{"metrics"}`); role -> `(config, params)`, both in `ROLES`' order.
  """
  runs: dict[str, dict] = {}
  models: dict[str, tuple[BertConfig, Any]] = {}

  def run(name, config, params, objective=None):
    r = F.finetune(config, params, train, held, task=task, hp=hp, objective=objective)
    runs[name] = {
      "metrics": r["metrics"],
      "final_loss": r["final_loss"],
      "wall_time_s": r["wall_time_s"],
      "loss": [h["loss"] for h in r["history"]],
    }
    models[name] = (r["config"], r["params"])
    if log:
      log(f"{name}: {', '.join(f'{k} {v:.4f}' for k, v in r['metrics'].items())}")

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
  q_config = t_config.replace(quantize="int8")
  runs["int8"] = {"metrics": F.evaluate(t_params, q_config, held, task)}
  models["int8"] = (q_config, t_params)
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
