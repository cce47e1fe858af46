"""The `bertjax` command: `bertjax report`, `bertjax data`, and `pretrain` / `finetune`.

Run as `bertjax report [--model PATH] [--out DIR] [--data-dir DIR] [--reduced]`
or `python -m bertjax.cli report ...` (what `./run.sh demo` does);
`bertjax data list` and `bertjax data fetch NAME|all [--to DIR]` list and download the
real data sets (`bertjax.data.fetch`).
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


def _data_parser(sub) -> None:
  from bertjax.data import fetch

  names = ", ".join(fetch.DATASETS)
  p = sub.add_parser(
      "data", help="list the real data sets and where they are; download them",
      description="The real data sets the experiments, tests and report read. Each is looked "
                  "up in --data-dir DIR when given; else in $BERTJAX_DATA_DIR (or the user "
                  f"cache, {fetch.user_cache_dir()}), then in ../shared/data beside the "
                  "repository.")
  data_sub = p.add_subparsers(dest="data_command", metavar="{list,fetch}", required=True)
  ls = data_sub.add_parser(
      "list", help="each data set: licence, size, source, and whether and where it is present",
      description="Lists each data set with its licence, size and public source, and whether "
                  "(and where) it is present and verified against the package's SHA-256 sums.")
  ls.add_argument("--data-dir", default=None, metavar="DIR",
                  help="look only in DIR (default: the search path printed at the top)")
  ls.set_defaults(run=_run_data_list)
  fe = data_sub.add_parser(
      "fetch", help="download data sets from their public sources, verified",
      description="Downloads data sets from their canonical public sources (pinned commits), "
                  "verifies every file's SHA-256 sum, and moves a set into place only when it "
                  "is complete. Prints each set's licence: check it fits your use.")
  fe.add_argument("names", nargs="+", metavar="NAME", help=f"data sets: {names}, or all")
  fe.add_argument("--to", default=None, metavar="DIR",
                  help="the data directory to fill (default: $BERTJAX_DATA_DIR, else "
                       f"{fetch.user_cache_dir()})")
  fe.add_argument("--mirror", default=None, metavar="URL",
                  help="fetch from URL/NAME/FILE instead of the public sources (a copy laid "
                       "out as a data directory, e.g. file:///path/to/data; default: "
                       "$BERTJAX_DATA_MIRROR)")
  fe.add_argument("--force", action="store_true",
                  help="download again even when a verified copy is present")
  fe.add_argument("--quiet", action="store_true", help="no progress bars")
  fe.set_defaults(run=_run_data_fetch)


def _run_data_list(args) -> int:
  from bertjax.data import fetch

  try:
    rows = fetch.describe(args.data_dir)
    places = fetch.search_path(args.data_dir)
  except fetch.DataError as e:
    return _user_error(e)
  print("data directories, in the order they are searched:")
  for i, place in enumerate(places, 1):
    print(f"  {i}. {place}{'' if place.is_dir() else ' (does not exist)'}")
  print(f"`bertjax data fetch NAME|all` writes to {args.data_dir or fetch.default_dir()}\n")
  width = max(len(r["name"]) for r in rows)
  for r in rows:
    where = {"ok": f"present: {r['path']}", "missing": "not present",
             "incomplete": f"incomplete: {r['path']}",
             "modified": f"modified (sums differ): {r['path']}"}[r["status"]]
    print(f"{r['name']:<{width}}  {fetch.human_size(r['size']):>8}  {where}")
    print(f"{'':<{width}}  {r['title']}")
    print(f"{'':<{width}}  licence: {r['license']}")
    print(f"{'':<{width}}  source:  {r['homepage']}")
    print(f"{'':<{width}}  files:   {r['source']}" + (f"/{r['archive']}" if r["archive"] else ""))
  return 0


def _run_data_fetch(args) -> int:
  from bertjax.data import fetch

  try:
    names = fetch.resolve_names(args.names)
    for name in names:
      fetch.fetch_one(fetch.DATASETS[name], args.to, mirror=args.mirror, force=args.force,
                      progress=not args.quiet)
  except fetch.DataError as e:
    return _user_error(e)
  print(f"done: {len(names)} data set{'s' if len(names) > 1 else ''} in "
        f"{args.to or fetch.default_dir()}")
  return 0


def _user_error(e: Exception) -> int:
  """A user error: one line on stderr, exit status 1 (no traceback)."""
  print(f"bertjax: error: {e}", file=sys.stderr)
  return 1


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
  _data_parser(sub)
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
