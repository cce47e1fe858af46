"""Compressing a fine-tuned 6-layer model: distillation, layer sharing and int8 (the slides' table).

    ./run.sh experiment model_compression
    .venv/bin/python -m experiments.model_compression [--smoke] [--out DIR] [--data-dir DIR]
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

import numpy as np

from bertjax import claims, study
from bertjax.claims import Claim, Test
from bertjax.plots import training as plots
from bertjax.training import compression
from experiments import common

NAME = "model_compression"
ROWS = compression.ROLES
TASK = "token_classification"  # UPOS: one tag per word, for the teacher and every student


@dataclasses.dataclass(frozen=True)
class Scale(study.Scale):
  """Data, training and timing sizes of one run (the budget: `study.Scale`)."""

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
SMOKE_TEACHER = {**study.SMOKE_MODEL, "num_hidden_layers": 4, "num_attention_heads": 4}
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
  with study.quick_compiles(args.smoke):
    return run_experiment(args)


@study.smoke_cached
def run_experiment(args) -> int:
  """The experiment on parsed arguments."""
  t_start = time.perf_counter()
  import bertjax
  from bertjax.training import finetune as F
  from bertjax.utils import cpu_info

  sc = (SMOKE if args.smoke else FULL).with_steps(args.steps, minimum=1, min_warmup=0)
  timings: dict[str, float] = {}
  tok = bertjax.Tokenizer.from_pretrained(args.model or bertjax.minilm_path())
  with study.timed(timings, "data"):
    ud = study.ud_file(study.data_dir(args.data_dir, "ud_english_ewt"), "dev")
    train, held, tags = F.load_ud_pos(
      ud,
      tok,
      field="upos",
      seed=args.seed,
      **{k: getattr(sc, k) for k in ("max_len", "eval_fraction", "max_sentences")},
    )
  study.log(f"UPOS: {len(train['labels'])} train / {len(held['labels'])} held-out sentences")
  hp = sc.finetune_config(args.seed)
  t_config, t_params, _, teacher = study.finetune_model(
    args, TASK, len(tags), smoke=SMOKE_TEACHER, seed=args.seed, label_names=tags, tok=tok
  )
  if not 1 <= args.shared_layer <= t_config.depth:  # before any training
    raise study.UsageError(
      f"--shared-layer {args.shared_layer} must be in 1..{t_config.depth} "
      "(the teacher's blocks, counted from 1)"
    )
  labels = compression.model_labels(t_config, teacher, study.model_tag(teacher) or teacher)
  with study.timed(timings, "train"):
    runs, models = compression.compress(
      t_config,
      t_params,
      train,
      held,
      task=TASK,
      hp=hp,
      **{k: getattr(sc, k) for k in ("temperature", "alpha")},
      shared_layer=args.shared_layer - 1,
      log=lambda line: study.log(compression.relabelled(labels, line)),
    )

  timed_batch = {k: v[: sc.time_batch] for k, v in held.items()}
  load_start = os.getloadavg()
  with study.timed(timings, "forward timing"):
    speed = compression.time_logits(models, timed_batch, rounds=sc.rounds, warmup=sc.warmup_rounds)
  load_end = os.getloadavg()
  rows = compression.compression_rows(models, runs, speed)
  tag_counts = np.bincount(held["labels"][held["labels"] >= 0])
  cpu, load = cpu_info(), (load_start[0], load_end[0])
  caption = compression.timing_caption(
    cpu, batch=sc.time_batch, length=sc.max_len, rounds=sc.rounds, load=load
  )
  if args.smoke:
    caption += ", XLA's optimisations off (--smoke)"
  md = compression.compression_table(rows, caption, labels)
  study.log("\n" + md)
  png = pathlib.Path(args.out) / f"{study.results_stem(NAME, args.model)}_table.png"
  figures = [plots.compression_bars(rows, labels, png).name]
  results = {
    "rows": rows,
    "table_markdown": md,
    "teacher_score": rows["teacher"]["score"],
    "majority_tag_accuracy": float(tag_counts.max() / tag_counts.sum()),
    "runs": runs,
    "speed": speed,
    "cpu": cpu,
    "threads": {k: os.environ.get(k, "") for k in ("XLA_FLAGS", "OMP_NUM_THREADS")},
    "loadavg": {"start": load_start, "end": load_end},
    "data": {
      "train_sentences": len(train["labels"]),
      "heldout_sentences": len(held["labels"]),
      "heldout_words": int((held["labels"] >= 0).sum()),
      "words_per_sentence": (held["labels"] >= 0).sum(1).tolist(),  # runs' "correct": of these
      "tags": tags,
      "file": str(ud.name),
    },
    "timings_s": timings,
  }
  settings = {
    **dataclasses.asdict(sc),
    "seed": args.seed,
    "shared_layer": args.shared_layer,
    "xla_optimised": not args.smoke,  # --smoke: `study.quick_compiles`
    "teacher": teacher,
    "finetune": dataclasses.asdict(hp),
    "configs": {k: dataclasses.asdict(models[k][0]) for k in models},
  }
  study.finish(NAME, args, results, settings, findings=findings, started=t_start, figures=figures)
  return 0


# The claims ---------------------------------------------------------------------------------------
# `findings(results, settings)`: the Findings rows, made from the numbers as the JSON holds
# them; `uncertainty(results, settings)`: each claim's interval and verdict.

RETAINED = "the score retained"
SPEEDUP = "the forward speed-up"
PARAMS = "the parameters over the teacher's"
DISTIL = Claim(
  "Sanh et al. 2019",
  "A student with half the teacher's layers, initialised from every other layer and "
  "distilled, keeps ~97% of the score and runs ~1.6x faster (DistilBERT).",
  yes=(Test(RETAINED, ">=", 0.95), Test(SPEEDUP, ">=", 1.3)),
  short="A half-depth distilled student keeps ~97% of the score and runs ~1.6x faster (DistilBERT).",
)
SHARING = Claim(
  "Lan et al. 2020",
  "Sharing one layer's parameters across all layers divides the parameter count (ALBERT) "
  "but not the compute, at some cost in score.",
  yes=(Test(PARAMS, "<=", 0.7), Test(SPEEDUP, "<", 1.25), Test(RETAINED, ">=", 0.9)),
  partly=(Test(PARAMS, "<=", 0.7), Test(SPEEDUP, "<", 1.25)),
  partly_if="all",
  missing="n/a",
  missing_when="the teacher has no ALBERT counterpart",
  short="Sharing one layer's parameters across all layers divides parameters but not compute, at some cost.",
)
INT8 = Claim(
  "Zafrir et al. 2019",
  "Int8 linear layers (Q8BERT) keep ~99% of the score with 4x smaller linear weights.",
  yes=(Test(RETAINED, ">=", 0.99),),
  partly=(Test(RETAINED, ">=", 0.97),),
)
# Each quantity the claims test: its column in a row of `compression.compression_rows`.
COLUMNS = {RETAINED: "retained", SPEEDUP: "speedup", PARAMS: "param_ratio"}
SHOWN = {RETAINED: "{:.3f}", SPEEDUP: "{:.2f}x"}  # the intervals a row's text states
SHOWN_Q8 = {RETAINED: SHOWN[RETAINED]}


def measured(claim: Claim, row: dict | None) -> dict[str, float | None]:
  """The quantities `claim` reads, from a table row (None: not measured, every one None)."""
  return {q: None if row is None else row[COLUMNS[q]] for q in claim.reads}


def findings(r: dict, s: dict) -> list[dict]:
  """The Findings rows (DistilBERT, ALBERT, Q8BERT) from the results and settings as written to
  JSON (`python -m experiments.findings --refresh`)."""
  rows, majority, cpu = r["rows"], r["majority_tag_accuracy"], r["cpu"]["cpu"]
  teacher = rows["teacher"]
  d, sh, q = rows["distilled_3l"], rows.get("shared_6l"), rows["int8"]
  lab = rows["labels_3l"]
  if sh is None:
    sharing = (
      "not measured: the teacher is not a BERT, and only BERT's family row has an ALBERT "
      "counterpart with shared layers (this family's block, e.g. MPNet's relative-position "
      "bias, has none); the row for sharing is the all-MiniLM-L6-v2 run's."
    )
  else:
    sharing = (
      f"{sh['depth']} layers sharing one set (from teacher block {s['shared_layer']}, distilled): "
      f"{sh['params'] / 1e6:.2f}M vs {teacher['params'] / 1e6:.2f}M parameters "
      f"({sh['param_ratio']:.0%}; the embeddings dominate), {sh['score']:.2%} = "
      f"{sh['retained']:.1%} retained, forward {sh['speedup']:.2f}x the teacher's speed."
    )
  return [
    DISTIL.row(
      f"UPOS (UD EWT dev, held-out words): teacher {teacher['score']:.2%} (majority tag "
      f"{majority:.1%}); {d['depth']}-layer student {d['score']:.2%} = {d['retained']:.1%} "
      f"retained with {1 - d['param_ratio']:.0%} fewer parameters, {d['speedup']:.2f}x faster "
      f"forward on the CPU; trained on labels only {lab['score']:.2%} ({lab['retained']:.1%}).",
      measured(DISTIL, d),
    ),
    SHARING.row(sharing, measured(SHARING, sh)),
    INT8.row(
      f"dynamic int8 of the fine-tuned teacher: {q['score']:.2%} = {q['retained']:.2%} "
      f"retained; weights {q['mb']:.1f} MB vs {teacher['mb']:.1f} MB ({q['compression']:.2f}x "
      "smaller; the float32 embedding table is most of what is left); forward "
      f"{q['speedup']:.2f}x the float32 speed on {cpu} (XLA's integer dot; no fused int8 kernel).",
      measured(INT8, q),
    ),
  ]


# How sure each row is ------------------------------------------------------------------------


def uncertainty(r: dict, s: dict) -> list[claims.Judgement]:
  """The retained scores over the held-out sentences (each model's correct words over the
  teacher's on the same resample), the speed-ups over the interleaved timing rounds; the first
  two rows resample the two, independent samples, jointly (`compression.judge_joint`)."""
  rows, sp, runs = r["rows"], r["speed"], r["runs"]
  names, timed = list(runs), [k for k in ("teacher", "distilled_3l", "shared_6l") if k in sp]
  rounds = np.asarray([sp[k]["rounds_s"] for k in timed], float).T  # (rounds, models)
  kept = lambda c, k: c[..., names.index(k)].sum(-1) / c[..., names.index("teacher")].sum(-1)
  speed = lambda t, k: np.median(t[..., 0], -1) / np.median(t[..., timed.index(k)], -1)
  words = "per-sentence correct counts of each model (paired with the teacher's)"
  constant = [PARAMS]  # what nothing samples: the row's value on every resample
  if "correct" in runs["teacher"]:  # each model's correctly tagged words in each sentence
    correct = np.asarray([runs[k]["correct"] for k in names]).T  # (sentences, models)
    held = f"the {len(correct)} held-out sentences (each model's correct words paired)"
    q8 = lambda c: {RETAINED: kept(c, "int8")}
    int8 = INT8.judge(correct, q8, point=measured(INT8, rows["int8"]), over=held, shown=SHOWN_Q8)
    samples, over = (correct, rounds), f"{held} and the {len(rounds)} interleaved rounds"
    over += " (independent, resampled jointly)"
    stat = lambda k: lambda c, t: {RETAINED: kept(c, k), SPEEDUP: speed(t, k)}
  else:  # a run that kept none: the retained scores as measured, only the rounds resampled
    int8, samples, constant = claims.rerun_needed(words), (rounds,), [PARAMS, RETAINED]
    over = f"the {len(rounds)} interleaved rounds (retained: rerun needed, no {words})"
    stat = lambda k: lambda t: {SPEEDUP: speed(t, k)}

  def judged(claim, k, before=""):
    point = measured(claim, rows[k])
    fixed = {q: point[q] for q in constant if q in point}
    return compression.judge_joint(
      claim, samples, stat(k), point=point, over=over, shown=SHOWN, fixed=fixed, before=before
    )

  sh = rows.get("shared_6l")
  if sh is None:  # a teacher without an ALBERT counterpart: the sharing row is n/a
    sharing = claims.note("n/a: nothing measured")
  else:
    before = f"exact: parameters ({sh['param_ratio']:.0%} of the teacher's); "
    sharing = judged(SHARING, "shared_6l", before)
  return [judged(DISTIL, "distilled_3l"), sharing, int8]


if __name__ == "__main__":
  sys.exit(main())
