"""`bertjax pretrain` and `bertjax finetune`: their parsers and `pretrain_main`, `finetune_main`.

The work is done by the library (`bertjax.training`); this module reads the command line,
checks the output directory and prints progress. Run them as `bertjax pretrain ...`,
`bertjax finetune ...` (`bertjax export` is `bertjax.cli.export`):

    bertjax pretrain --corpus ../shared/data/wikitext2_tokens/valid.txt --corpus-format wikitext \
        --train-vocab 8000 --preset bert-mini --steps 1000 --output-dir runs/mini
    bertjax export runs/mini --step 500 --to runs/mini-500
    bertjax finetune --table train.tsv dev.tsv --init-from runs/mini-500 --steps 300
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time
from collections.abc import Sequence

import numpy as np

from bertjax.cli.args import (
  check_output_dir,
  clear_output_dir,
  debug_arg,
  parse_args,
)
from bertjax.cli.help_format import HelpFormatter
from bertjax.kernels import IMPLS as ATTENTION_IMPLS
from bertjax.training.export import export_checkpoint, save_hf_model

CORPUS_FORMATS = """\
corpus formats (--corpus-format):
  plain     blank lines separate documents; a document's lines are joined and split into
            sentences at . ! ? (abbreviations and initials kept together)
  lines     blank lines separate documents; each non-blank line is one sentence (the format of
            Google's create_pretraining_data.py)
  wikitext  WikiText's raw token files: ' = Title = ' lines start documents, section headings
            and blank lines are dropped, each paragraph is split into sentences, @-@ @,@ @.@
            are undone and <unk> becomes [UNK]"""

UD_FIELDS = """\
UD tagging (--ud FILE): one label per word, on the word's first subword; --ud-field picks it:
  upos     universal part-of-speech tags (NOUN, VERB, ADP, ... 17 tags)
  xpos     the treebank's own part-of-speech tags (Penn Treebank tags for English EWT)
  deprels  each word's dependency relation to its head (nsubj, obj, det, ...)"""


def _presets() -> list[str]:
  from bertjax.model.config import PRESETS

  return sorted(PRESETS)


def _model_args(p: argparse.ArgumentParser) -> None:
  g = p.add_argument_group("model")
  src = g.add_mutually_exclusive_group()
  presets = _presets()
  src.add_argument(
    "--preset",
    default=None,
    choices=presets,
    metavar="NAME",
    help=f"a BertConfig preset: {', '.join(presets)} (default: tiny)",
  )
  src.add_argument(
    "--config-json",
    default=None,
    metavar="FILE",
    help="build the model from a Hugging Face config.json (or a JSON of "
    "BertConfig fields) instead of a preset",
  )
  src.add_argument(
    "--init-from",
    default=None,
    metavar="DIR|ID",
    help="start from a Hugging Face model directory or hub id, e.g. "
    "google-bert/bert-base-uncased (weights, config and, unless --vocab "
    "is given, tokenizer; hub ids are read from the huggingface_hub "
    "cache)",
  )
  g.add_argument(
    "--dtype",
    default="float32",
    choices=("float32", "bfloat16"),
    help="compute dtype; weights stay float32",
  )
  g.add_argument(
    "--attention-impl",
    default=None,
    choices=ATTENTION_IMPLS,
    help="attention implementation (default: the model config's, 'xla')",
  )
  g.add_argument(
    "--scan-unroll",
    type=int,
    default=1,
    metavar="N",
    help="layers per iteration of the layer scan; the depth unrolls it "
    "(same numerics; 1.5x faster BERT-base steps on an H100)",
  )


def _optim_args(p: argparse.ArgumentParser, lr: float, steps: int) -> None:
  g = p.add_argument_group("optimisation")
  g.add_argument("--steps", type=int, default=steps, help="optimizer steps")
  g.add_argument("--batch-size", type=int, default=32, help="examples per optimizer step")
  g.add_argument(
    "--grad-accum", type=int, default=1, help="micro-batches per step (gradient accumulation)"
  )
  g.add_argument("--optimizer", default="adamw", choices=("adamw", "lamb"), help="optimizer")
  g.add_argument("--lr", type=float, default=lr, help="peak learning rate")
  g.add_argument("--warmup", type=int, default=0, help="linear warm-up steps")
  g.add_argument(
    "--decay",
    default="linear",
    choices=("linear", "cosine", "constant"),
    help="learning-rate decay after warm-up",
  )
  g.add_argument("--end-lr-ratio", type=float, default=0.0, help="final lr / peak lr")
  g.add_argument("--clip", type=float, default=1.0, help="global gradient-norm clip (0: off)")
  g.add_argument(
    "--weight-decay",
    type=float,
    default=0.01,
    help="decoupled weight decay (never on biases and LayerNorm)",
  )
  g.add_argument("--seed", type=int, default=0, help="initialisation, data and dropout seed")


def _program(args) -> dict:
  """Config fields that choose how the model runs, not what it computes."""
  program = {"scan_unroll": args.scan_unroll}
  if args.attention_impl is not None:
    program["attention_impl"] = args.attention_impl
  return program


def _model_config(args, vocab_size: int | None):
  import bertjax

  if args.init_from:
    config, params = bertjax.from_hf(args.init_from)
    return config, params
  if args.config_json:
    path = pathlib.Path(args.config_json)
    if not path.is_file():
      raise FileNotFoundError(f"--config-json {path} does not exist")
    try:
      d = json.loads(path.read_text())
    except json.JSONDecodeError as e:
      raise ValueError(f"--config-json {path} is not valid JSON: {e}") from e
    from bertjax.model.config import config_from_json, field_names

    config = (
      config_from_json(d) if set(d) <= set(field_names()) else bertjax.BertConfig.from_hf_dict(d)
    )
  else:
    config = bertjax.BertConfig.preset(args.preset or "tiny")
  if vocab_size is not None and vocab_size != config.vocab_size:
    config = config.replace(vocab_size=vocab_size)
  return config, None


def _table(rows: Sequence[tuple[str, str]], indent: str = "  ") -> str:
  """Two aligned columns."""
  width = max(len(k) for k, _ in rows)
  return "\n".join(f"{indent}{k:<{width}}  {v}" for k, v in rows)


# Pretraining --------------------------------------------------------------------------------


def pretrain_parser() -> argparse.ArgumentParser:
  """The argument parser of `pretrain_main`."""
  p = argparse.ArgumentParser(
    prog="bertjax pretrain",
    formatter_class=HelpFormatter,
    description="Pretrain BERT/ALBERT with MLM (+ NSP or SOP).",
    epilog=CORPUS_FORMATS,
  )
  g = p.add_argument_group("data")
  g.add_argument("--corpus", nargs="+", required=True, metavar="FILE", help="text files")
  g.add_argument(
    "--corpus-format",
    default="plain",
    choices=("plain", "lines", "wikitext"),
    help="how documents and sentences are read (see 'corpus formats' below)",
  )
  g.add_argument(
    "--max-lines",
    type=int,
    default=None,
    metavar="N",
    help="read only the first N lines of each file (default: all)",
  )
  v = g.add_mutually_exclusive_group()
  v.add_argument(
    "--vocab",
    default=None,
    metavar="PATH|ID",
    help="a vocab.txt / tokenizer.json, a model directory or a hub id (default: "
    "the --init-from model's, else the --teacher's)",
  )
  v.add_argument(
    "--train-vocab",
    type=int,
    default=None,
    metavar="SIZE",
    help="train a WordPiece vocabulary of this size on the corpus (the same "
    "corpus gives the same vocab.txt in every run)",
  )
  g.add_argument(
    "--objective",
    default=None,
    choices=("nsp", "sop", "none"),
    help="sentence-level objective besides MLM (default: nsp); a student built from "
    "--teacher (without --init-from) has the teacher's heads, so there the default is the "
    "teacher's own NSP or SOP head, else none",
  )
  g.add_argument(
    "--masking", default="token", choices=("token", "whole_word", "span"), help="MLM masking unit"
  )
  g.add_argument("--mask-prob", type=float, default=0.15, help="fraction of tokens predicted")
  g.add_argument("--seq-len", type=int, default=128, help="tokens per sequence")
  from bertjax.cli import objectives

  objectives.add_args(p)
  _model_args(p)
  _optim_args(p, lr=1e-4, steps=1000)
  s = p.add_argument_group("progressive stacking")
  s.add_argument(
    "--stacking",
    default=None,
    metavar="SCHEDULE",
    help="grow the model during the run: 'layers:steps,...,layers', e.g. "
    "'3:500,6:700,12' (default: train at full depth)",
  )
  s.add_argument(
    "--reset-moments",
    action="store_true",
    help="zero Adam moments when growing instead of copying them",
  )
  o = p.add_argument_group("output")
  o.add_argument(
    "--output-dir",
    required=True,
    metavar="DIR",
    help="checkpoints/, vocab/, metrics.jsonl, summary.json and TensorBoard events",
  )
  o.add_argument(
    "--checkpoint-every",
    type=int,
    default=1000,
    metavar="N",
    help="save a checkpoint every N steps (0: only at the end)",
  )
  o.add_argument("--keep", type=int, default=3, help="checkpoints to keep")
  again = o.add_mutually_exclusive_group()
  again.add_argument(
    "--resume",
    action="store_true",
    help="continue the run in --output-dir from its newest checkpoint",
  )
  again.add_argument(
    "--overwrite",
    action="store_true",
    help="delete the earlier run in --output-dir first (without this or "
    "--resume, a non-empty --output-dir is refused)",
  )
  o.add_argument(
    "--export-hf",
    default=None,
    metavar="DIR",
    help="write the final model here as a Hugging Face directory (for any other "
    "step: `bertjax export`)",
  )
  o.add_argument(
    "--mesh-shape",
    default=None,
    metavar="DATAxFSDP",
    help="device mesh, e.g. '4x2' (default: one device)",
  )
  o.add_argument("--no-progress", action="store_true", help="no progress bar")
  debug_arg(p)
  return p


def _check_pretrainable(args) -> None:
  """Resolves `--init-from` (a directory or a hub id) in place, and refuses a model whose
  family lacks the heads the objectives need: MLM always, NSP or SOP when asked for."""
  import bertjax
  from bertjax.model import hf

  args.init_from = str(hf.resolve_model_path(args.init_from))
  config_file = pathlib.Path(args.init_from) / "config.json"
  if not config_file.is_file():
    raise FileNotFoundError(f"no config.json in {args.init_from}")
  config = bertjax.BertConfig.from_hf_dict(json.loads(config_file.read_text()))
  heads = config.family.heads
  if "mlm" not in heads:
    raise ValueError(
      f"pretrain trains a masked-LM head, which a {config.model_type!r} model "
      f"has not; --init-from {args.init_from}: fine-tune it with "
      "`bertjax finetune --init-from`"
    )
  if args.objective != "none" and args.objective not in heads:
    raise ValueError(
      f"--objective {args.objective}: a {config.model_type!r} model has no "
      f"{args.objective.upper()} head (its heads: {sorted(heads)}); continue it "
      f"with MLM alone, --objective none (--init-from {args.init_from})"
    )


def _sentence_objective(args, teacher) -> str:
  """The NSP/SOP objective of the run: --objective, else NSP. A student built from a --teacher
  (no --init-from) starts with the teacher's heads only, so there the default is the teacher's
  own sentence head, else none (said on the console), and a head it lacks is refused by name
  before anything is read or written."""
  if teacher is None or args.init_from:
    return args.objective or "nsp"
  t_config, t_params = teacher
  own = [h for h in ("nsp", "sop") if h in t_params]
  if args.objective is None:
    if not own:
      print(
        f"pretrain: --objective none (MLM and distillation): the teacher {args.teacher} has "
        "no NSP or SOP head for the student to start from",
        flush=True,
      )
    return own[0] if own else "none"
  if args.objective != "none" and args.objective not in t_params:
    heads = sorted(h for h in t_params if h in t_config.family.heads)
    raise ValueError(
      f"--objective {args.objective} with --teacher {args.teacher}: the student starts from "
      f"the teacher's heads, and it has no {args.objective.upper()} head (its heads: {heads}); "
      f"leave out --objective (with this teacher: {own[0] if own else 'none'}), or start the "
      "student from a model with that head: --init-from DIR"
    )
  return args.objective


PRETRAIN_FILES = ("checkpoints", "vocab", "metrics.jsonl", "summary.json", "tensorboard")


def _vocab_source(args) -> pathlib.Path | str:
  """Where the vocabulary comes from: --vocab (a file, a model directory or a hub id), else
  the --init-from model's, else the --teacher's (a distilled student needs the teacher's)."""
  from bertjax.model import hf

  if args.vocab:
    path = pathlib.Path(args.vocab).expanduser()
    if path.exists() or path.suffix in (".txt", ".json"):
      return path  # load_tokenizer names a missing file
    return hf.resolve_model_path(args.vocab)
  if args.init_from or args.teacher:
    return args.init_from or args.teacher
  raise ValueError(
    "pretrain needs a vocabulary: give --vocab PATH, --train-vocab SIZE, "
    "--init-from DIR or --teacher DIR"
  )


def _pretrain_corpus(args, vocab_dir: pathlib.Path):
  """`(tokenizer, corpus, new)`: the run's vocabulary and the tokenized corpus; `new` when
  the vocabulary is to be saved in `vocab_dir` (not when a resumed run has its own)."""
  from bertjax.data import corpus as C

  own = args.resume and any((vocab_dir / f).is_file() for f in ("tokenizer.json", "vocab.txt"))
  if args.train_vocab and not own:
    docs = C.read_documents(args.corpus, format=args.corpus_format, max_lines=args.max_lines)
    tokenizer = C.train_wordpiece((s for d in docs for s in d), args.train_vocab)
    return tokenizer, C.tokenize_documents(docs, tokenizer), True
  source = vocab_dir if args.train_vocab else _vocab_source(args)
  tokenizer = C.load_tokenizer(source)
  if own and source != vocab_dir:
    mine = C.load_tokenizer(vocab_dir).get_vocab(with_added_tokens=True)
    theirs = tokenizer.get_vocab(with_added_tokens=True)
    if mine != theirs:
      raise ValueError(
        f"--resume: the vocabulary {source} ({len(theirs)} tokens) is not the "
        f"run's own, {vocab_dir} ({len(mine)} tokens), which its checkpoints "
        "were trained with; drop --vocab, or start a new run"
      )
  if args.teacher and not (args.vocab or args.init_from):
    print(
      f"pretrain: the student uses the teacher's vocabulary, {source} "
      f"({tokenizer.get_vocab_size(with_added_tokens=True)} tokens)",
      flush=True,
    )
  corpus = C.load_corpus(
    args.corpus, tokenizer, format=args.corpus_format, max_lines=args.max_lines
  )
  return tokenizer, corpus, not own


def _start_output_dir(out: pathlib.Path, doomed, tokenizer, new_vocab: bool) -> None:
  """Clears an earlier run (--overwrite; process 0, then every process waits), then writes
  the run's vocabulary: the first writes of a run, once everything before has worked."""
  import jax

  from bertjax.data import corpus as C

  if doomed:
    if jax.process_index() == 0:
      clear_output_dir(out, doomed, "pretrain")
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils

      multihost_utils.sync_global_devices("bertjax pretrain: --overwrite")
  out.mkdir(parents=True, exist_ok=True)
  if new_vocab:
    C.save_tokenizer(tokenizer, out / "vocab")


def pretrain_main(argv: Sequence[str] | None = None) -> int:
  """Runs pretraining from command-line arguments; prints a summary and saves it as JSON.

  Returns:
    0 on success (argparse exits on --help or bad arguments).
  """
  args = parse_args(pretrain_parser(), argv)
  from bertjax import mesh as mesh_lib
  from bertjax.data import pretraining_examples as PE
  from bertjax.training import loop

  out = pathlib.Path(args.output_dir)
  doomed = check_output_dir(
    out, resume=args.resume, overwrite=args.overwrite, run_files=PRETRAIN_FILES
  )  # before anything is read or written
  mesh_lib.initialize_distributed()
  import jax  # after the distributed start, which must come first

  teacher = None
  if args.teacher:
    import bertjax
    from bertjax.model import hf

    if args.train_vocab:
      raise ValueError(
        f"--train-vocab {args.train_vocab} with --teacher {args.teacher}: a "
        "distilled student uses the teacher's vocabulary (the default); drop "
        "--train-vocab"
      )
    args.teacher = str(hf.resolve_model_path(args.teacher))
    teacher = bertjax.from_hf(args.teacher)  # read once: its heads set the default objective
  args.objective = _sentence_objective(args, teacher)
  if args.init_from:
    _check_pretrainable(args)
  tokenizer, corpus, new_vocab = _pretrain_corpus(args, out / "vocab")
  config, params = _model_config(args, None if args.init_from else corpus.vocab_size)
  config = config.replace(**_program(args))
  if config.vocab_size < corpus.vocab_size:
    raise ValueError(
      f"the model's vocab_size={config.vocab_size} is smaller than the "
      f"tokenizer's {corpus.vocab_size}"
    )
  heads = ("mlm",) + ((args.objective,) if args.objective != "none" else ())
  if params is not None and any(h not in params for h in heads):
    import bertjax

    fresh = bertjax.init(config, args.seed, heads)  # a checkpoint without these heads
    params = {**params, **{h: fresh[h] for h in heads if h not in params}}
  pc = PE.PretrainingConfig(
    max_seq_len=args.seq_len,
    objective=args.objective,
    masking=args.masking,
    mask_prob=args.mask_prob,
  )
  from bertjax.cli import objectives

  config, params, data, objective = objectives.setup(
    args, config, params, corpus, pc, teacher=teacher
  )
  train = loop.TrainConfig(
    steps=args.steps,
    batch_size=args.batch_size,
    accumulation_steps=args.grad_accum,
    optimizer=args.optimizer,
    learning_rate=args.lr,
    warmup_steps=args.warmup,
    decay=args.decay,
    end_lr_ratio=args.end_lr_ratio,
    clip_norm=args.clip or None,
    weight_decay=args.weight_decay,
    dtype=args.dtype,
    stacking=args.stacking,
    reset_moments=args.reset_moments,
    seed=args.seed,
    output_dir=str(out),
    checkpoint_every=args.checkpoint_every,
    keep=args.keep,
    mesh_shape=(
      mesh_lib.parse_mesh(args.mesh_shape, ("data", "fsdp")) if args.mesh_shape else None
    ),
    progress=not args.no_progress,
  )
  _start_output_dir(out, doomed, tokenizer, new_vocab)
  summary = loop.pretrain(
    config, data, train, resume=args.resume, params=params, objective=objective
  )
  summary.pop("history")
  if args.export_hf and jax.process_index() == 0:
    export_checkpoint(out, args.export_hf, tokenizer=out / "vocab")  # the newest step
    summary["exported_to"] = args.export_hf
  if jax.process_index() == 0:  # multi-host: one writer
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    _print_pretrain_summary(args, out, summary)
  return 0


def _print_pretrain_summary(args, out: pathlib.Path, summary: dict) -> None:
  steps = (
    f"{summary['steps']} ({summary['steps_this_run']} this run, "
    f"{summary['wall_time_s']:.1f} s, {summary['tokens_per_s']:.0f} tokens/s)"
  )
  loss = (
    f"{summary['first_loss']:.4f} -> {summary['final_loss']:.4f} (MLM "
    f"{summary['first_mlm_loss']:.4f} -> {summary['final_mlm_loss']:.4f})"
  )
  saved = (
    f"{summary['checkpoint_dir']} (last: step {summary['last_checkpoint']}; "
    f"`bertjax export {out} --to DIR` makes a model of any step)"
  )
  rows = [
    ("steps", steps),
    ("loss", loss),
    ("layers", str(summary["num_hidden_layers"])),
    ("checkpoints", saved),
    ("metrics", f"{out / 'metrics.jsonl'}, {out / 'summary.json'}"),
  ]
  if args.export_hf:
    from bertjax.training.electra import ROLES

    pair = all((pathlib.Path(args.export_hf) / r).is_dir() for r in ROLES)
    classes = (
      {
        r: (
          json.loads((pathlib.Path(args.export_hf) / r / "config.json").read_text()).get(
            "architectures"
          )
          or ["?"]
        )[0]
        for r in ROLES
      }
      if pair
      else {}
    )
    rows.append(
      (
        "model",
        f"{args.export_hf}"
        + (
          f" (generator/: {classes['generator']}, discriminator/: {classes['discriminator']})"
          if pair
          else ""
        ),
      )
    )
  print("pretrain: done\n" + _table(rows))


# Fine-tuning --------------------------------------------------------------------------------


def finetune_parser() -> argparse.ArgumentParser:
  """The argument parser of `finetune_main`."""
  p = argparse.ArgumentParser(
    prog="bertjax finetune",
    formatter_class=HelpFormatter,
    description="Fine-tune for sequence or token classification. Shows a progress bar on a "
    "terminal (a line every few steps otherwise), writes metrics.jsonl, "
    "summary.json and the model (Hugging Face format, with its label names and "
    "tokenizer) to the output directory, and prints a short summary.",
    epilog=UD_FIELDS,
  )
  g = p.add_argument_group("data (one source)")
  src = g.add_mutually_exclusive_group(required=True)
  src.add_argument(
    "--table",
    nargs="+",
    metavar="PATH",
    help="TSV (header row) or JSONL file(s): train [eval]; columns set below; "
    "string labels keep their names",
  )
  src.add_argument(
    "--blimp",
    nargs="+",
    metavar="JSONL",
    help="BLiMP files: sentence_good -> good, sentence_bad -> bad",
  )
  src.add_argument("--ud", metavar="CONLLU", help="a UD treebank, for tagging (see below)")
  src.add_argument(
    "--glue", choices=("sst2", "mrpc", "rte"), help="a GLUE task through tensorflow-datasets"
  )
  g.add_argument("--text-column", default="sentence", help="text column of --table")
  g.add_argument(
    "--pair-column",
    default=None,
    help="second sentence column of --table (sentence pairs; default: none)",
  )
  g.add_argument("--label-column", default="label", help="label column of --table")
  g.add_argument("--regression", action="store_true", help="float labels, MSE loss")
  g.add_argument(
    "--ud-field",
    default="upos",
    choices=("upos", "xpos", "deprels"),
    help="the tag --ud predicts: upos, xpos or deprels (see below)",
  )
  g.add_argument(
    "--eval-fraction",
    type=float,
    default=0.1,
    help="held-out fraction when no eval file/split is given",
  )
  g.add_argument(
    "--max-examples",
    type=int,
    default=None,
    metavar="N",
    help="use only the first N examples (default: all)",
  )
  g.add_argument(
    "--tfds-dir",
    default=None,
    metavar="DIR",
    help="tensorflow-datasets data_dir (default: tfds's own)",
  )
  g.add_argument(
    "--max-len", type=int, default=128, help="tokens per sequence (longer texts are truncated)"
  )
  g.add_argument(
    "--vocab",
    default=None,
    metavar="PATH",
    help="the tokenizer: a model directory or tokenizer.json / vocab.txt "
    "(default: the --init-from directory's)",
  )
  _model_args(p)
  _optim_args(p, lr=2e-5, steps=500)
  from bertjax.cli import objectives

  objectives.add_finetune_args(p)
  o = p.add_argument_group("output")
  o.add_argument(
    "--output-dir",
    default=None,
    metavar="DIR",
    help="where model/, metrics.jsonl and summary.json go; refused when it holds "
    "anything, unless --overwrite (default: a new out/finetune/SOURCE-TIME "
    "folder, printed)",
  )
  o.add_argument(
    "--overwrite", action="store_true", help="delete the earlier run in --output-dir first"
  )
  o.add_argument(
    "--eval-every",
    type=int,
    default=0,
    metavar="N",
    help="evaluate every N steps (0: only at the end)",
  )
  o.add_argument(
    "--log-every",
    type=int,
    default=0,
    metavar="N",
    help="without a terminal: a progress line every N steps (0: about 20 lines)",
  )
  o.add_argument("--no-progress", action="store_true", help="no progress bar or lines")
  debug_arg(p)
  return p


FINETUNE_FILES = ("model", "metrics.jsonl", "summary.json")


def _source_name(args) -> str:
  if args.table:
    return pathlib.Path(args.table[0]).stem
  if args.blimp:
    return "blimp"
  if args.ud:
    return f"ud-{args.ud_field}"
  return f"glue-{args.glue}"


def _default_output_dir(args) -> pathlib.Path:
  stamp = time.strftime("%Y%m%d-%H%M%S")
  base = pathlib.Path("out") / "finetune" / f"{_source_name(args)}-{stamp}"
  out, k = base, 1
  while out.exists():
    k += 1
    out = base.with_name(f"{base.name}-{k}")
  return out


class _Progress:
  """A tqdm bar on a terminal; otherwise a plain line every `every` steps (stderr)."""

  def __init__(self, steps: int, *, enabled: bool, every: int, stream=None):
    self.steps, self.stream = steps, stream or sys.stderr
    self.enabled = enabled
    self.every = every or max(1, steps // 20)
    self.bar = None
    if enabled and self.stream.isatty():
      from tqdm.auto import tqdm

      try:  # a terminal that reports no size (some emulators) gets a fixed width
        sized = os.get_terminal_size(self.stream.fileno()).columns > 0
      except (OSError, ValueError):
        sized = False
      self.bar = tqdm(
        total=steps,
        desc="finetune",
        unit="step",
        file=self.stream,
        dynamic_ncols=sized,
        ncols=None if sized else 100,
      )

  def __call__(self, kind: str, record: dict) -> None:
    if not self.enabled:
      return
    if kind == "eval":
      text = f"eval at step {record['step']}: " + ", ".join(
        f"{k[5:]} {v:.4f}" for k, v in record.items() if k.startswith("eval_")
      )
      if self.bar is not None:
        self.bar.write(text, file=self.stream)
      else:
        print(text, file=self.stream, flush=True)
      return
    if self.bar is not None:
      self.bar.update(1)
      self.bar.set_postfix(
        loss=f"{record['loss']:.4f}", ex_s=f"{record['examples_per_s']:.0f}", refresh=False
      )
    elif record["step"] % self.every == 0 or record["step"] in (1, self.steps):
      print(
        f"step {record['step']}/{self.steps}  loss {record['loss']:.4f}  "
        f"lr {record['learning_rate']:.2e}  {record['examples_per_s']:.1f} examples/s",
        file=self.stream,
        flush=True,
      )

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()


def _load_finetune_data(args, tokenizer):
  """`(task, train, eval, label_names)` from the command's data options."""
  from bertjax.training import finetune as F

  if args.ud:
    train, evaluation, names = F.load_ud_pos(
      args.ud,
      tokenizer,
      max_len=args.max_len,
      field=args.ud_field,
      eval_fraction=args.eval_fraction,
      max_sentences=args.max_examples,
      seed=args.seed,
    )
    return "token_classification", train, evaluation, names
  if args.glue:
    train, evaluation, names = F.load_glue(
      args.glue,
      tokenizer,
      max_len=args.max_len,
      data_dir=args.tfds_dir,
      max_examples=args.max_examples,
    )
    return "classification", train, evaluation, names
  if args.blimp:
    table = F.LabelledTexts(*F.load_blimp(args.blimp), label_names=("bad", "good"))
  else:
    table = F.read_table(
      args.table[0],
      args.text_column,
      args.label_column,
      args.pair_column,
      regression=args.regression,
    )
  if args.max_examples:
    table = table.head(args.max_examples)
  data = F.encode_classification(
    tokenizer, table.texts, table.pairs, table.labels, max_len=args.max_len
  )
  if args.table and len(args.table) > 1:
    held = F.read_table(
      args.table[1],
      args.text_column,
      args.label_column,
      args.pair_column,
      regression=args.regression,
      label_names=table.label_names,
    )
    train, evaluation = (
      data,
      F.encode_classification(tokenizer, held.texts, held.pairs, held.labels, max_len=args.max_len),
    )
  else:
    train, evaluation = F.split(data, args.eval_fraction, seed=args.seed)
  if args.regression:
    names = None
  elif table.label_names is not None:
    names = list(table.label_names)
  else:  # integer labels: as many classes as the largest id says, without names
    names = [str(i) for i in range(int(np.max(data["labels"])) + 1)]
  return "classification", train, evaluation, names


def finetune_main(argv: Sequence[str] | None = None) -> int:
  """Runs fine-tuning from command-line arguments; prints a short summary.

  Returns:
    0 on success.
  """
  args = parse_args(finetune_parser(), argv)
  from bertjax.model.tokenizer import Tokenizer
  from bertjax.training import finetune as F

  out = pathlib.Path(args.output_dir) if args.output_dir else _default_output_dir(args)
  doomed = check_output_dir(out, overwrite=args.overwrite, run_files=FINETUNE_FILES)
  vocab = args.vocab or args.init_from or args.teacher  # a student uses its teacher's
  if vocab is None:
    raise ValueError(
      "finetune needs a tokenizer: give --init-from DIR (a model with its "
      "tokenizer), --vocab PATH or --teacher DIR"
    )
  if args.vocab and not args.init_from and pathlib.Path(args.vocab).is_file():
    from bertjax.data import corpus as C

    tokenizer = Tokenizer(C.load_tokenizer(args.vocab), args.max_len)
  else:
    tokenizer = Tokenizer.from_pretrained(vocab)
  print(
    f"finetune: writing to {out}" + ("" if args.output_dir else " (choose with --output-dir)"),
    flush=True,
  )
  task, train_data, eval_data, labels = _load_finetune_data(args, tokenizer)
  num_labels = 1 if labels is None else len(labels)
  names_known = labels is not None and not all(n == str(i) for i, n in enumerate(labels))
  base = None if args.init_from else _model_config(args, tokenizer.vocab_size)[0]
  config, params = F.prepare_model(
    task,
    num_labels,
    init_from=args.init_from,
    config=base,
    seed=args.seed,
    label_names=labels if names_known else None,
  )
  config = config.replace(**_program(args))
  from bertjax.cli import objectives

  config, params, objective = objectives.finetune_setup(args, task, config, params)
  hp = F.FinetuneConfig(
    steps=args.steps,
    batch_size=args.batch_size,
    accumulation_steps=args.grad_accum,
    optimizer=args.optimizer,
    learning_rate=args.lr,
    warmup_steps=args.warmup,
    decay=args.decay,
    clip_norm=args.clip or None,
    weight_decay=args.weight_decay,
    dtype=args.dtype,
    seed=args.seed,
    eval_every=args.eval_every,
  )
  clear_output_dir(out, doomed, "finetune")  # now that everything before has worked
  out.mkdir(parents=True, exist_ok=True)
  progress = _Progress(hp.steps, enabled=not args.no_progress, every=args.log_every)
  with open(out / "metrics.jsonl", "w", encoding="utf-8") as jsonl:

    def on_record(kind: str, record: dict) -> None:
      jsonl.write(json.dumps(record) + "\n")
      jsonl.flush()
      progress(kind, record)

    try:
      result = F.finetune(
        config,
        params,
        train_data,
        eval_data,
        task=task,
        hp=hp,
        callback=on_record,
        objective=objective,
      )
    finally:
      progress.close()
  model_dir = save_hf_model(result["config"], result["params"], tokenizer, out / "model")
  summary = {k: v for k, v in result.items() if k not in ("params", "config", "history")}
  summary.update(
    task=task,
    labels=labels,
    num_train=len(train_data["labels"]),
    num_eval=len(eval_data["labels"]),
    output_dir=str(out),
    model_dir=str(model_dir),
  )
  (out / "summary.json").write_text(json.dumps(summary, indent=2))
  speed = (
    f"{summary['steps']} in {summary['wall_time_s']:.1f} s "
    f"({summary['examples_per_s']:.1f} examples/s)"
  )
  loss = f"{result['history'][0]['loss']:.4f} -> {summary['final_loss']:.4f}"
  rows = [
    ("steps", speed),
    ("training loss", loss),
    ("examples", f"{summary['num_train']} train, {summary['num_eval']} eval"),
  ]
  rows += [(f"eval {k}", f"{v:.4f}") for k, v in summary["metrics"].items()]
  if labels is not None:
    shown = ", ".join(labels[:12]) + (f", ... ({len(labels)} in all)" if len(labels) > 12 else "")
    rows.append(("labels", shown))
  rows += [
    ("model", f"{model_dir} (Hugging Face: config.json, model.safetensors, tokenizer)"),
    ("metrics", f"{out / 'metrics.jsonl'}, {out / 'summary.json'}"),
  ]
  print("finetune: done\n" + _table(rows))
  return 0
