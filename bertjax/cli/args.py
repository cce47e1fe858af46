"""What the `bertjax` commands share before any work: parsing and the output directory.

`parse_args` names unknown options (argparse names missing required ones first, and
never the unknown one); `debug_arg` adds `--debug`. `check_output_dir` keeps a command
from mixing two runs in one directory: a directory that holds anything is refused unless
the command continues the run there (`pretrain --resume`) or is told to replace it
(`--overwrite`, which `clear_output_dir` then carries out).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import pathlib
import shutil
from collections.abc import Iterable, Sequence


def _parsers(p: argparse.ArgumentParser):
  """`p` and every subcommand parser below it."""
  yield p
  for a in p._actions:
    if isinstance(a, argparse._SubParsersAction):
      for sub in a.choices.values():
        yield from _parsers(sub)


def parse_args(p: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
  """`p.parse_args(argv)`, naming unknown options first.

  argparse reports missing required options before unknown ones, so `bertjax pretrain
  --nonsense-flag` said only that --corpus was missing. Here the arguments are first parsed
  with nothing required; whatever is left over is reported as argparse reports it.
  """
  parsers = list(_parsers(p))
  required = [a for q in parsers for a in q._actions if a.required]
  groups = [g for q in parsers for g in q._mutually_exclusive_groups if g.required]
  try:
    for x in required + groups:
      x.required = False
    try:  # quietly: --help, or another mistake (a bad value), is the full parse's to print
      with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        _, extra = p.parse_known_args(argv)
    except SystemExit:
      extra = []
  finally:
    for x in required + groups:
      x.required = True
  if extra:
    p.error(f"unrecognized arguments: {' '.join(extra)}")
  return p.parse_args(argv)


def debug_arg(p: argparse.ArgumentParser) -> None:
  """Adds `--debug` (`bertjax.cli` acts on it before the command parses)."""
  p.add_argument(
    "--debug",
    action="store_true",
    help="show the Python traceback of an error instead of a one-line message",
  )


def _names(entries: list[pathlib.Path], most: int = 6) -> str:
  shown = ", ".join(p.name + ("/" if p.is_dir() else "") for p in entries[:most])
  return shown + (f", ... ({len(entries)} entries)" if len(entries) > most else "")


def check_output_dir(
  out: pathlib.Path, *, overwrite: bool, run_files: Iterable[str], resume: bool | None = None
) -> list[pathlib.Path]:
  """What `--overwrite` will delete from `--output-dir out`; raises if the run may not start.

  Reads only. A missing or empty directory is fine; so is any directory with `resume`
  (the command continues the run there). Otherwise a directory that holds anything is
  refused, unless `overwrite` and it holds a run (one of `run_files`) and is not the current
  directory or above it.

  Args:
    out: the output directory.
    overwrite: `--overwrite` was given.
    run_files: the names a run of this command writes into `out`.
    resume: `--resume` was given; None for a command without it.

  Returns:
    The entries `clear_output_dir` is to delete (none without `overwrite`).
  """
  if out.exists() and not out.is_dir():
    raise NotADirectoryError(f"--output-dir {out} is a file, not a directory")
  entries = sorted(out.iterdir()) if out.is_dir() else []
  if not entries or resume:
    return []
  if not overwrite:
    ways = ("--resume to continue that run, " if resume is not None else "") + "--overwrite"
    raise FileExistsError(
      f"--output-dir {out} is not empty ({_names(entries)}); a new run "
      f"there would mix with what is there: add {ways} to delete it "
      "and start again, or choose another directory"
    )
  here = pathlib.Path.cwd().resolve()
  if out.resolve() == here or out.resolve() in here.parents:
    raise ValueError(
      f"--overwrite would delete --output-dir {out}, which holds the current "
      "directory; choose another --output-dir"
    )
  run_files = tuple(run_files)
  if not any(p.name in run_files for p in entries):
    raise FileExistsError(
      f"--output-dir {out} holds {_names(entries)}, none of it a run's "
      f"files ({', '.join(run_files)}); --overwrite deletes only an "
      "earlier run: choose another directory"
    )
  return entries


def clear_output_dir(out: pathlib.Path, entries: list[pathlib.Path], command: str) -> None:
  """Deletes `entries` (from `check_output_dir`) and says so."""
  if not entries:
    return
  for p in entries:
    if p.is_dir() and not p.is_symlink():
      shutil.rmtree(p)
    else:
      p.unlink()
  print(f"{command}: --overwrite: deleted the earlier run in {out} ({_names(entries)})", flush=True)
