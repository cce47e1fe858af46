"""The `bertjax` command: `bertjax report`, and `pretrain` / `finetune` where installed.

Run as `bertjax report [--model PATH] [--out DIR] [--data-dir DIR] [--reduced]`
or `python -m bertjax.cli report ...` (what `./run.sh demo` does).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Sequence


def _report_parser(sub) -> None:
  p = sub.add_parser(
      "report", help="analyse a model and write the HTML BERTology report",
      description="Analyses a BERT or ALBERT checkpoint (attention statistics and patterns, "
                  "head and layer ablation, head importance and pruning, anisotropy, a POS "
                  "probe when UD data is present, effective attention) and writes "
                  "index.html, report.json and PNG figures.")
  p.add_argument("--model", default=None, metavar="PATH",
                 help="a Hugging Face BERT or ALBERT directory (default: the built-in "
                      "all-MiniLM-L6-v2)")
  p.add_argument("--out", default="out/report", metavar="DIR",
                 help="output directory (default: out/report)")
  p.add_argument("--data-dir", default=None, metavar="DIR",
                 help="the real data sets (ud_english_ewt/ ...); analyse UD text instead of the "
                      "project's own sentences (default: own sentences; UD from ../shared/data "
                      "for the POS probe when present)")
  p.add_argument("--reduced", action="store_true",
                 help="a small, fast run (few sentences and pruning steps), for tests")
  p.add_argument("--quiet", action="store_true", help="no progress lines")
  p.set_defaults(run=_run_report)


def _run_report(args) -> int:
  from bertjax.report import build_report

  results = build_report(args.model, args.out, args.data_dir, reduced=args.reduced,
                         progress=not args.quiet)
  print(f"report: {results['files'][0]} ({results['timing']['total_seconds']:.1f}s)")
  return 0


_TRAINING = ("pretrain", "finetune")


def _training_parsers(sub) -> None:
  """`pretrain` and `finetune`, delegating to `bertjax.training.commands` when it exists."""
  if importlib.util.find_spec("bertjax.training.commands") is None:
    return
  for name, help_text in (("pretrain", "pre-train a BERT or ALBERT model (MLM + NSP/SOP)"),
                          ("finetune", "fine-tune a model on a classification task")):
    # Listed here for `bertjax --help`; `main` hands their arguments over untouched.
    sub.add_parser(name, help=help_text, add_help=False)


def _run_training(name: str, argv: Sequence[str]) -> int:
  from bertjax.training import commands

  main = commands.pretrain_main if name == "pretrain" else commands.finetune_main
  return int(main(list(argv)) or 0)


def parser() -> argparse.ArgumentParser:
  """The `bertjax` argument parser."""
  p = argparse.ArgumentParser(prog="bertjax",
                              description="BERT and ALBERT in pure JAX for BERTology research.")
  sub = p.add_subparsers(dest="command", metavar="COMMAND")
  _report_parser(sub)
  _training_parsers(sub)
  return p


def main(argv: Sequence[str] | None = None) -> int:
  """Runs the `bertjax` command; returns its exit status."""
  argv = list(sys.argv[1:] if argv is None else argv)
  if argv and argv[0] in _TRAINING and importlib.util.find_spec("bertjax.training.commands"):
    return _run_training(argv[0], argv[1:])
  p = parser()
  args = p.parse_args(argv)
  if args.command is None:
    p.print_help()
    return 2
  return args.run(args)


if __name__ == "__main__":
  sys.exit(main())
