"""`bertjax export`: a training checkpoint (any saved step) as a Hugging Face directory
(`bertjax.training.export.export_checkpoint` does the work)."""

from __future__ import annotations

import argparse
import pathlib
from collections.abc import Sequence

from bertjax.cli.args import debug_arg, parse_args
from bertjax.cli.help_format import HelpFormatter
from bertjax.training.export import export_checkpoint


def export_parser() -> argparse.ArgumentParser:
  """The argument parser of `export_main`."""
  p = argparse.ArgumentParser(
    prog="bertjax export",
    formatter_class=HelpFormatter,
    description="Turns a training checkpoint (the newest, or any saved --step, mid-run "
    "too) into a Hugging Face model directory: config.json, model.safetensors "
    "and the run's tokenizer files (tokenizer.json, vocab.txt, "
    "tokenizer_config.json), which `bertjax report --model`, `bertjax finetune "
    "--init-from` and transformers' Auto classes load.",
  )
  p.add_argument(
    "checkpoint_dir",
    metavar="CHECKPOINT_DIR",
    help="a `bertjax pretrain --output-dir` folder, or its checkpoints/ folder",
  )
  p.add_argument("--to", required=True, metavar="DIR", help="the model directory to write")
  p.add_argument(
    "--step",
    type=int,
    default=None,
    metavar="N",
    help="the checkpoint step to export (default: the newest readable one)",
  )
  p.add_argument(
    "--tokenizer",
    default=None,
    metavar="PATH",
    help="the tokenizer (a directory or tokenizer.json / vocab.txt; default: "
    "the run's own, saved in its vocab/ folder)",
  )
  debug_arg(p)
  return p


def export_main(argv: Sequence[str] | None = None) -> int:
  """`bertjax export`: a training checkpoint to a Hugging Face directory.

  Returns:
    0 on success.
  """
  args = parse_args(export_parser(), argv)
  config, step, tokenizer = export_checkpoint(
    args.checkpoint_dir, args.to, step=args.step, tokenizer=args.tokenizer
  )
  target = pathlib.Path(args.to)
  print(
    f"exported step {step} of {args.checkpoint_dir} ({config.model_type}, "
    f"{config.num_hidden_layers} layers, vocabulary {tokenizer.vocab_size}) to {target}"
  )
  from bertjax.training.electra import ROLES

  pair = [target / r for r in ROLES if (target / r / "config.json").is_file()]
  for model_dir in pair or [target]:
    print(
      f"  files{f' ({model_dir.name})' if pair else ''}: "
      f"{', '.join(sorted(p.name for p in model_dir.iterdir()))}"
    )
  print(f"  next:  bertjax report --model {pair[-1] if pair else target}")
  return 0
