"""A study's command line: the shared options, progress lines, and user errors without a
traceback."""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import sys
import time
from collections.abc import Iterator
from typing import Any

SCRATCH = pathlib.Path("out") / "experiments"  # relative to the working directory
DEFAULT_MODEL = "all-MiniLM-L6-v2"  # what the experiments analyse without --model
MPNET = "sentence-transformers/all-mpnet-base-v2"  # `bertjax models install` puts it in the cache
MODEL_FAMILIES = (
  "BERT, ALBERT, RoBERTa, XLM-R, ELECTRA, DistilBERT, MPNet, NomicBERT, "
  "ModernBERT or EuroBERT"
)  # every family with a tokenizer


class UsageError(ValueError):
  """A bad command-line value (`--steps`, `--shared-layer`, ...): one line, no traceback."""


def _excepthook(kind, value, tb) -> None:
  """User errors (missing data, a bad option value) print one line on stderr, no traceback."""
  from bertjax.data.fetch import DataError

  if issubclass(kind, (DataError, UsageError)):
    print(f"error: {value}", file=sys.stderr)
    sys.exit(1)
  sys.__excepthook__(kind, value, tb)


class _Parser(argparse.ArgumentParser):
  """A study's parser: resolves `--out` and `--data-dir` once the arguments are read."""

  results: pathlib.Path  # the committed results' folder, which `--update-results` writes

  def parse_known_args(self, args=None, namespace=None):
    ns, rest = super().parse_known_args(args, namespace)
    if hasattr(ns, "smoke") and hasattr(ns, "update_results"):
      ns.out = self._out(ns)
      if ns.smoke and getattr(ns, "data_dir", "") is None:
        from bertjax.data.fetch import smoke_dir

        ns.data_dir = str(smoke_dir())
        log(f"--smoke: reading the samples in {ns.data_dir} (no real data needed)")
    return ns, rest

  def _out(self, ns) -> str:
    results = self.results.resolve()
    if ns.update_results:
      if ns.out is not None and pathlib.Path(ns.out).resolve() != results:
        self.error(f"--update-results writes {results}; it cannot be combined with --out {ns.out}")
      out = results
    elif ns.out is not None:
      out = pathlib.Path(ns.out)
    else:
      out = SCRATCH
      log(
        f"results go to {out.resolve()} (a scratch directory; --update-results writes the "
        f"committed {results})"
      )
    if ns.smoke and out.resolve() == results:
      self.error(
        f"--smoke results are not findings: they must not overwrite {results}; "
        "leave out --update-results / --out, or pass another --out DIR"
      )
    # Checked now, not after the run: the nearest existing folder on the way must be a folder.
    here = out.resolve()
    while not here.exists():
      here = here.parent
    if not here.is_dir():
      self.error(f"--out {out}: {here} is a file, not a folder; pass a folder to write to")
    return str(out)


def parser(
  doc: str | None,
  *,
  results: str | os.PathLike,
  model: bool = True,
  data: bool = True,
  steps: int | None = None,
  prog: str | None = None,
) -> argparse.ArgumentParser:
  """An argument parser with the shared options; the study's docstring is its help text.

  After parsing, `args.out` is the output directory (the scratch directory when neither
  `--out` nor `--update-results` is given) and, for `--smoke` without `--data-dir`,
  `args.data_dir` is the shipped samples' directory.

  Args:
    doc: the help text.
    results: the folder of the study's committed results: `--update-results` writes there,
      and `--smoke` never may.
    model: add `--model DIR_OR_ID` (`args.model`, None when not given; see `load_model`);
      False for experiments that train their own models from scratch.
    data: add `--data-dir DIR`; False for experiments that read no data set.
    steps: the default optimizer steps of each model a script trains: add `--steps N`
      (`args.steps`, None when not given; see `Scale.with_steps`).
    prog: the command its usage line names (default: the script's file name).
  """
  sys.excepthook = _excepthook
  p = _Parser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.results = pathlib.Path(results)
  p.add_argument(
    "--out",
    default=None,
    metavar="DIR",
    help=f"where NAME.json and the PNG figures go (default: {SCRATCH}, a scratch "
    "directory under the working directory)",
  )
  p.add_argument(
    "--update-results",
    action="store_true",
    help=f"write the committed results in {results} (what the Findings are "
    "generated from); not with --smoke",
  )
  if steps is not None:
    p.add_argument(
      "--steps",
      type=int,
      default=None,
      help=f"optimizer steps of each trained model (default: {steps}; warm-up: 10%% of them)",
    )
  if data:
    p.add_argument(
      "--data-dir",
      default=None,
      metavar="DIR",
      help="the real data sets (ud_english_ewt/, wikitext2_tokens/, blimp/, ...) "
      "(default: $BERTJAX_DATA_DIR or the user cache that `bertjax data fetch` "
      "fills, then ../shared/data beside the repository; with --smoke: the "
      "samples shipped in bertjax/resources/smoke)",
    )
  if model:
    p.add_argument(
      "--model",
      default=None,
      metavar="DIR_OR_ID",
      help=f"a Hugging Face model directory or hub id ({MODEL_FAMILIES}, with its "
      "tokenizer) to analyse instead of all-MiniLM-L6-v2, e.g. "
      f"{MPNET}; its results are NAME_MODEL.json and NAME_MODEL_*.png (MODEL: "
      "the id's or directory's last part); with --smoke, instead of the tiny "
      "random model",
    )
  p.add_argument("--seed", type=int, default=0, help="seed of every split and sample (default: 0)")
  p.add_argument(
    "--smoke",
    action="store_true",
    help="a tiny model and the shipped sample data, for the tests (results are not findings)",
  )
  return p


def log(*parts: Any) -> None:
  """A progress line on stderr."""
  print("[{}]".format(time.strftime("%H:%M:%S")), *parts, file=sys.stderr, flush=True)


@contextlib.contextmanager
def timed(timings: dict[str, float], key: str) -> Iterator[None]:
  """Adds the wall time of the block to `timings[key]` (seconds) and logs it."""
  t0 = time.perf_counter()
  yield
  timings[key] = timings.get(key, 0.0) + time.perf_counter() - t0
  log(f"{key}: {timings[key]:.1f}s")
