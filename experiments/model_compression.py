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
from findings import Rule, Test

from bertjax.training import compression

NAME = "model_compression"
ROWS = compression.ROLES
LABELS = {
  "teacher": "teacher (MiniLM-L6, fine-tuned)",
  "distilled_3l": "DistilBERT-style 3L",
  "labels_3l": "3L, labels only",
  "shared_6l": "ALBERT-style shared 6L",
  "int8": "Q8BERT-style int8",
}


@dataclasses.dataclass(frozen=True)
class Scale(common.Scale):
  """Data, training and timing sizes of one run (the budget: `common.Scale`)."""

  max_len: int
  max_sentences: int | None
  eval_fraction: float
  temperature: float
  alpha: float
  time_batch: int
  rounds: int
  warmup_rounds: int


FULL = Scale(
  max_len=64,
  max_sentences=None,
  eval_fraction=0.2,
  steps=150,
  batch=16,
  lr=1e-4,
  warmup=15,
  temperature=2.0,
  alpha=0.5,
  time_batch=32,
  rounds=9,
  warmup_rounds=2,
)
SMOKE = Scale(
  max_len=32,
  max_sentences=None,
  eval_fraction=0.25,
  steps=4,
  batch=8,
  lr=1e-3,
  warmup=1,
  temperature=2.0,
  alpha=0.5,
  time_batch=4,
  rounds=3,
  warmup_rounds=1,
)


def smoke_teacher_config(vocab_size: int):
  """The tiny random BERT that stands in for MiniLM with --smoke."""
  import bertjax

  return bertjax.BertConfig(
    vocab_size=vocab_size,
    hidden_size=32,
    num_hidden_layers=4,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
  )


def check_block(block: int, depth: int) -> None:
  """Raises a `common.UsageError` (a ValueError) unless `block` (`--shared-layer`) names
  one of blocks 1..`depth`."""
  if not 1 <= block <= depth:
    raise common.UsageError(
      f"--shared-layer {block} must be in 1..{depth} (the teacher's blocks, counted from 1)"
    )


def labels_for(rows: dict[str, dict], teacher: str) -> dict[str, str]:
  """Each row's label, its depth from the numbers (`LABELS` for the MiniLM teacher)."""
  if teacher == "all-MiniLM-L6-v2":
    return LABELS
  short = common.model_tag(teacher) or teacher
  half = rows["distilled_3l"]["depth"]
  return {
    **LABELS,
    "teacher": f"teacher ({short}, fine-tuned)",
    "distilled_3l": f"DistilBERT-style {half}L",
    "labels_3l": f"{half}L, labels only",
  }


def table(rows: dict[str, dict], cpu: str, labels: dict[str, str] = LABELS) -> str:
  """The Markdown table of the README (one line per row)."""
  lines = [
    (
      "| model | layers (stored) | parameters | weights (MB) | UPOS accuracy | retained "
      "| CPU speed-up |"
    ),
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


RETAINED = "the score retained"
SPEEDUP = "the forward speed-up"
PARAMS = "the parameters over the teacher's"
DISTIL = Rule(
  "Sanh et al. 2019",
  "A student with half the teacher's layers, initialised from every other layer and "
  "distilled, keeps ~97% of the score and runs ~1.6x faster (DistilBERT).",
  yes=(Test(RETAINED, ">=", 0.95), Test(SPEEDUP, ">=", 1.3)),
)
SHARING = Rule(
  "Lan et al. 2020",
  "Sharing one layer's parameters across all layers divides the parameter count (ALBERT) "
  "but not the compute, at some cost in score.",
  yes=(Test(PARAMS, "<=", 0.7), Test(SPEEDUP, "<", 1.25), Test(RETAINED, ">=", 0.9)),
  partly=(Test(PARAMS, "<=", 0.7), Test(SPEEDUP, "<", 1.25)),
  partly_if="all",
  missing="n/a",
  missing_when="the teacher has no ALBERT counterpart",
)
INT8 = Rule(
  "Zafrir et al. 2019",
  "Int8 linear layers (Q8BERT) keep ~99% of the score with 4x smaller linear weights.",
  yes=(Test(RETAINED, ">=", 0.99),),
  partly=(Test(RETAINED, ">=", 0.97),),
)


def figure(out, rows: dict[str, dict], labels: dict[str, str] = LABELS, stem: str = NAME) -> str:
  """Parameters, retained score and speed-up per model, as bars (`stem_table.png`)."""
  from bertjax.plots import training as plots

  names = list(rows)
  kept = [100 * rows[n]["retained"] for n in names]
  panels = [
    {"values": [rows[n]["params"] / 1e6 for n in names], "label": "parameters (M)"},
    {
      "values": kept,
      "label": "retained score (% of teacher)",
      "ylim": (min(kept) - 5, max(100, max(kept)) + 2),
    },
    {
      "values": [rows[n]["speedup"] for n in names],
      "label": "CPU forward speed-up (x)",
      "hline": 1.0,
    },
  ]
  path = plots.model_bars(
    [labels[n].split(" (")[0] for n in names],
    panels,
    pathlib.Path(out) / f"{stem}_table.png",
    title=f"Compressing a fine-tuned {rows['teacher']['depth']}-layer model (UD EWT UPOS)",
  )
  return path.name


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  """The shared experiment options, `--steps` and `--shared-layer`."""
  parser = common.parser(__doc__)
  parser.add_argument(
    "--steps",
    type=int,
    default=None,
    help=f"fine-tuning steps of each trained model (default: {FULL.steps})",
  )
  parser.add_argument(
    "--shared-layer",
    type=int,
    default=3,
    help="the teacher block (1..L) that initialises the shared layer (default: 3)",
  )
  return parser.parse_args(argv)


def load_upos(args, sc: Scale, tok, timings: dict[str, float]):
  """UD EWT dev's UPOS tags, split into train and held-out sentences.

  Returns:
    `(train, held, tags, ud)`: the two splits, the tag names and the `.conllu` file.
  """
  from bertjax.training import finetune as F

  with common.timed(timings, "data"):
    ud = common.ud_file(common.data_dir(args.data_dir, "ud_english_ewt"), "dev")
    train, held, tags = F.load_ud_pos(
      ud,
      tok,
      max_len=sc.max_len,
      field="upos",
      eval_fraction=sc.eval_fraction,
      max_sentences=sc.max_sentences,
      seed=args.seed,
    )
  common.log(
    f"UPOS: {len(train['labels'])} train / {len(held['labels'])} held-out sentences "
    f"({int((held['labels'] >= 0).sum())} words), {len(tags)} tags, max_len "
    f"{sc.max_len}"
  )
  return train, held, tags, ud


def findings(r: dict, s: dict) -> list[dict]:
  """The Findings rows (DistilBERT, ALBERT, Q8BERT) from the results and settings as written to
  JSON (`findings.py --refresh`)."""
  rows, majority, cpu = r["rows"], r["majority_tag_accuracy"], r["cpu"]["cpu"]
  teacher = rows["teacher"]
  d, sh, q = rows["distilled_3l"], rows.get("shared_6l"), rows["int8"]
  lab = rows["labels_3l"]
  if sh is None:
    sharing = SHARING.row(
      "not measured: the teacher is not a BERT, and only BERT's family row has an ALBERT "
      "counterpart with shared layers (this family's block, e.g. MPNet's relative-position "
      "bias, has none); the row for sharing is the all-MiniLM-L6-v2 run's.",
      {PARAMS: None, SPEEDUP: None, RETAINED: None},
    )
  else:
    sharing = SHARING.row(
      f"{sh['depth']} layers sharing one set (from teacher block {s['shared_layer']}, "
      "distilled): "
      f"{sh['params'] / 1e6:.2f}M vs {teacher['params'] / 1e6:.2f}M parameters "
      f"({sh['param_ratio']:.0%}; the embeddings dominate), {sh['score']:.2%} = "
      f"{sh['retained']:.1%} retained, forward {sh['speedup']:.2f}x the teacher's speed.",
      {PARAMS: sh["param_ratio"], SPEEDUP: sh["speedup"], RETAINED: sh["retained"]},
    )
  return [
    DISTIL.row(
      f"UPOS (UD EWT dev, held-out words): teacher {teacher['score']:.2%} (majority tag "
      f"{majority:.1%}); {d['depth']}-layer student {d['score']:.2%} = {d['retained']:.1%} "
      "retained "
      f"with {1 - d['param_ratio']:.0%} fewer parameters, {d['speedup']:.2f}x faster "
      f"forward on the CPU; trained on labels only {lab['score']:.2%} "
      f"({lab['retained']:.1%}).",
      {RETAINED: d["retained"], SPEEDUP: d["speedup"]},
    ),
    sharing,
    INT8.row(
      f"dynamic int8 of the fine-tuned teacher: {q['score']:.2%} = {q['retained']:.2%} "
      f"retained; weights {q['mb']:.1f} MB vs {teacher['mb']:.1f} MB "
      f"({q['compression']:.2f}x smaller; the float32 embedding table is most of what is "
      f"left); forward {q['speedup']:.2f}x the float32 speed on {cpu} (XLA's "
      "integer dot; no fused int8 kernel).",
      {RETAINED: q["retained"]},
    ),
  ]


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  with common.smoke_compilation_cache(args.smoke):
    return run_experiment(args)


def run_experiment(args) -> int:
  """The experiment on parsed arguments."""
  t_start = time.perf_counter()
  import bertjax
  from bertjax.training import finetune as F

  sc = (SMOKE if args.smoke else FULL).with_steps(args.steps, minimum=1, min_warmup=0)
  from bertjax.utils import cpu_info

  timings: dict[str, float] = {}
  tok = bertjax.Tokenizer.from_pretrained(args.model or bertjax.minilm_path())
  teacher = (
    str(args.model)
    if args.model
    else "random tiny BERT (--smoke)"
    if args.smoke
    else "all-MiniLM-L6-v2"
  )
  train, held, tags, ud = load_upos(args, sc, tok, timings)
  hp = F.FinetuneConfig(
    steps=sc.steps, batch_size=sc.batch, learning_rate=sc.lr, warmup_steps=sc.warmup, seed=args.seed
  )
  base = smoke_teacher_config(tok.vocab_size) if args.smoke and not args.model else None
  source = args.model or (None if args.smoke else bertjax.minilm_path())
  t_config, t_params = F.prepare_model(
    "token_classification",
    len(tags),
    init_from=source,
    config=base,
    seed=args.seed,
    label_names=tags,
  )
  check_block(args.shared_layer, t_config.num_hidden_layers)  # before any training
  with common.timed(timings, "train"):
    runs, models = compression.compress(
      t_config,
      t_params,
      train,
      held,
      task="token_classification",
      hp=hp,
      temperature=sc.temperature,
      alpha=sc.alpha,
      shared_layer=args.shared_layer - 1,
      log=common.log,
    )

  timed_batch = {k: v[: sc.time_batch] for k, v in held.items()}
  load_start = os.getloadavg()
  with common.timed(timings, "forward timing"):
    speed = compression.time_logits(models, timed_batch, rounds=sc.rounds, warmup=sc.warmup_rounds)
  load_end = os.getloadavg()
  cpu = cpu_info()
  threads = {k: os.environ.get(k, "") for k in ("XLA_FLAGS", "OMP_NUM_THREADS")}

  rows = compression.compression_rows(models, runs, speed)
  tags_major = np.bincount(held["labels"][held["labels"] >= 0], minlength=len(tags))
  majority = float(tags_major.max() / tags_major.sum())
  cpu_line = (
    f"{cpu['cpu']}, {cpu['cpus']} cores ({', '.join(cpu['isa_flags']) or 'no AVX2+'}), "
    f"batch {sc.time_batch} x {sc.max_len}, float32 unless int8, median of "
    f"{sc.rounds} interleaved rounds, load {load_start[0]:.1f}->{load_end[0]:.1f}"
  )
  labels = labels_for(rows, teacher)
  md = table(rows, cpu_line, labels)
  common.log("\n" + md)
  figures = [figure(args.out, rows, labels, common.results_stem(NAME, args.model))]
  results = {
    "rows": rows,
    "table_markdown": md,
    "teacher_score": rows["teacher"]["score"],
    "majority_tag_accuracy": majority,
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
    "teacher": teacher,
    "finetune": dataclasses.asdict(hp),
    "configs": {k: dataclasses.asdict(models[k][0]) for k in models},
  }
  common.write_results(
    NAME,
    args.out,
    results,
    findings=findings,
    settings=settings,
    smoke=args.smoke,
    seconds=time.perf_counter() - t_start,
    figures=figures,
    model=args.model,
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
