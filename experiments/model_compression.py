"""Compressing a fine-tuned 6-layer model: distillation, layer sharing and int8 (the slides' table).

    ./run.sh experiment model_compression
    .venv/bin/python experiments/model_compression.py [--smoke] [--out DIR] [--data-dir DIR]
        [--model DIR_OR_HUB_ID]

The method, the data and what differs from the paper: docs/experiments.md, section
`model_compression` (the site's Experiments page).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import sys
import time
from collections.abc import Sequence

import common
import numpy as np

from bertjax.plots import training as plots
from bertjax.training import compression, distill

NAME = "model_compression"
ROWS = compression.ROLES


@dataclasses.dataclass(frozen=True)
class Scale(common.Scale):
  """Data, training and timing sizes of one run (the budget: `common.Scale`)."""

  max_len: int
  eval_fraction: float
  temperature: float
  alpha: float
  time_batch: int
  rounds: int
  warmup_rounds: int
  max_sentences: int | None = None  # None: every sentence of UD EWT dev


FULL, SMOKE = (Scale(**common.sizes(NAME)[k]) for k in ("full", "smoke"))
# The tiny random teacher of --smoke: 4 layers of 4 heads, 32 wide.
SMOKE_TEACHER = {**common.SMOKE_MODEL, "num_hidden_layers": 4, "num_attention_heads": 4}
SMOKE_TEACHER["max_position_embeddings"] = 64


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  """The shared experiment options, `--steps` and `--shared-layer`."""
  parser = common.parser(__doc__, steps=FULL.steps)
  parser.add_argument(
    "--shared-layer",
    type=int,
    default=3,
    help="the teacher block (1..L) that initialises the shared layer (default: 3)",
  )
  return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  with common.quick_compiles(args.smoke):
    return run_experiment(args)


def model_labels(t_config, teacher: str) -> dict[str, str]:
  """Each role's label in the log and the table, with the layer counts of the models
  `compression.compress` makes from `t_config` (the role keys are all-MiniLM-L6-v2's:
  `distilled_3l`, `shared_6l`)."""
  half = len(distill.default_student_layers(t_config))
  short = common.model_tag(teacher) or teacher
  labels = compression.row_labels({"distilled_3l": {"depth": half}}, teacher, short)
  if compression.can_share(t_config):
    labels["shared_6l"] = f"ALBERT-style shared {t_config.depth}L"
  return labels


def labelled_log(labels: dict[str, str]):
  """`common.log` with the role that starts `compression.compress`'s progress lines
  ("distilled_3l: accuracy ...") replaced by its label."""

  def log(line: str) -> None:
    role, sep, rest = line.partition(": ")
    common.log(f"{labels[role]}{sep}{rest}" if sep and role in labels else line)

  return log


@common.smoke_cached
def run_experiment(args) -> int:
  """The experiment on parsed arguments."""
  t_start = time.perf_counter()
  import bertjax
  from bertjax.training import finetune as F
  from bertjax.utils import cpu_info

  sc = (SMOKE if args.smoke else FULL).with_steps(args.steps, minimum=1, min_warmup=0)
  timings: dict[str, float] = {}
  tok = bertjax.Tokenizer.from_pretrained(args.model or bertjax.minilm_path())
  with common.timed(timings, "data"):
    ud = common.ud_file(common.data_dir(args.data_dir, "ud_english_ewt"), "dev")
    train, held, tags = F.load_ud_pos(
      ud,
      tok,
      field="upos",
      seed=args.seed,
      **{k: getattr(sc, k) for k in ("max_len", "eval_fraction", "max_sentences")},
    )
  common.log(f"UPOS: {len(train['labels'])} train / {len(held['labels'])} held-out sentences")
  hp = sc.finetune_config(args.seed)
  t_config, t_params, _, teacher = common.finetune_model(
    args,
    "token_classification",
    len(tags),
    smoke=SMOKE_TEACHER,
    seed=args.seed,
    label_names=tags,
    tok=tok,
  )
  if not 1 <= args.shared_layer <= t_config.depth:  # before any training
    raise common.UsageError(
      f"--shared-layer {args.shared_layer} must be in 1..{t_config.depth} "
      "(the teacher's blocks, counted from 1)"
    )
  labels = model_labels(t_config, teacher)
  with common.timed(timings, "train"):
    runs, models = compression.compress(
      t_config,
      t_params,
      train,
      held,
      task="token_classification",
      hp=hp,
      **{k: getattr(sc, k) for k in ("temperature", "alpha")},
      shared_layer=args.shared_layer - 1,
      log=labelled_log(labels),
    )

  timed_batch = {k: v[: sc.time_batch] for k, v in held.items()}
  load_start = os.getloadavg()
  with common.timed(timings, "forward timing"):
    speed = compression.time_logits(models, timed_batch, rounds=sc.rounds, warmup=sc.warmup_rounds)
  load_end = os.getloadavg()
  threads = {k: os.environ.get(k, "") for k in ("XLA_FLAGS", "OMP_NUM_THREADS")}
  rows = compression.compression_rows(models, runs, speed)
  tag_counts = np.bincount(held["labels"][held["labels"] >= 0])
  cpu, load = cpu_info(), (load_start[0], load_end[0])
  caption = compression.timing_caption(
    cpu, batch=sc.time_batch, length=sc.max_len, rounds=sc.rounds, load=load
  )
  if args.smoke:
    caption += ", XLA's optimisations off (--smoke)"
  md = compression.compression_table(rows, caption, labels)
  common.log("\n" + md)
  stem = common.results_stem(NAME, args.model)
  figures = [
    plots.compression_bars(rows, labels, pathlib.Path(args.out) / f"{stem}_table.png").name
  ]
  results = {
    "rows": rows,
    "table_markdown": md,
    "teacher_score": rows["teacher"]["score"],
    "majority_tag_accuracy": float(tag_counts.max() / tag_counts.sum()),
    "runs": runs,
    "speed": speed,
    "cpu": cpu,
    "threads": threads,
    "loadavg": {"start": load_start, "end": load_end},
    "data": {
      "train_sentences": len(train["labels"]),
      "heldout_sentences": len(held["labels"]),
      "heldout_words": int((held["labels"] >= 0).sum()),
      "tags": tags,
      "file": str(ud.name),
    },
    "timings_s": timings,
  }
  settings = {
    **dataclasses.asdict(sc),
    "seed": args.seed,
    "shared_layer": args.shared_layer,
    "xla_optimised": not args.smoke,  # --smoke: `common.quick_compiles`
    "teacher": teacher,
    "finetune": dataclasses.asdict(hp),
    "configs": {k: dataclasses.asdict(models[k][0]) for k in models},
  }
  common.finish(NAME, args, results, settings, started=t_start, figures=figures)
  return 0


if __name__ == "__main__":
  sys.exit(main())
