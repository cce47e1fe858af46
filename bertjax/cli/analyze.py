"""`bertjax analyze`: many checkpoints as one job (`bertjax.analysis.jobs` does the work)."""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time
from collections.abc import Sequence

from bertjax.analysis.jobs import DEFAULT_ANALYSES, analyze_checkpoints


def analyze_parser() -> argparse.ArgumentParser:
  """The argument parser of `analyze_main` (`bertjax analyze`)."""
  p = argparse.ArgumentParser(
    prog="bertjax analyze",
    formatter_class=argparse.RawDescriptionHelpFormatter,
    description="Runs analyses on many checkpoints as one job: one JSON result per\n"
    "(checkpoint, analysis) in OUT/results/, each written whole (a restarted job\n"
    "skips those present), and figures of every metric in OUT/figures/ (a line\n"
    "joins only the steps of one training run; other models are points).\n"
    "\nanalyses:\n"
    "  head_ablation  every head and layer masked (MLM loss, or embedding cosine)\n"
    "  attention      Clark et al.'s [CLS]/[SEP]/punctuation mass and entropy\n"
    "  probing        a linear UPOS probe per layer (held-out accuracy)\n"
    "  anisotropy     mean cosine of random word pairs per layer\n"
    "  patterns       Kovaleva et al.'s five attention-map types (share of each)\n"
    "  effective_attention  Brunner et al.'s raw vs effective attention to\n"
    "                 [CLS]/[SEP] (per-sentence SVDs on the host: slow)\n\n"
    "multi-host: with JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and\n"
    "JAX_PROCESS_ID set (as for `bertjax pretrain`) every process runs the job\n"
    "on the global --mesh, and process 0 alone writes.",
  )
  p.add_argument(
    "checkpoints",
    nargs="+",
    metavar="CHECKPOINT",
    help="a Hugging Face model directory, a hub id, or a `bertjax pretrain` "
    "output folder (all its saved steps; RUN@8,16 for some); the results and "
    "figures keep the order given",
  )
  p.add_argument("--out", required=True, metavar="DIR", help="output directory")
  p.add_argument(
    "--analyses",
    default=",".join(DEFAULT_ANALYSES),
    metavar="A,B",
    help=f"comma-separated analyses (default: the first four, {','.join(DEFAULT_ANALYSES)})",
  )
  p.add_argument(
    "--data-dir",
    default=None,
    metavar="DIR",
    help="a data directory with ud_english_ewt/ (default: the shipped UD sample)",
  )
  p.add_argument(
    "--max-sentences",
    type=int,
    default=None,
    metavar="N",
    help="only the first N sentences (default: all)",
  )
  p.add_argument(
    "--tokenizer",
    default=None,
    metavar="PATH",
    help="one tokenizer for every checkpoint (default: each checkpoint's own; a "
    "run's vocab/ folder)",
  )
  p.add_argument(
    "--mesh",
    default=None,
    metavar="DxI[xF]",
    help="device mesh data x interventions [x fsdp], e.g. 4x2 (default: one device)",
  )
  p.add_argument(
    "--batch-size",
    type=int,
    default=16,
    metavar="N",
    help="rows per batch of the ablation and attention analyses (default: 16)",
  )
  p.add_argument("--no-plots", action="store_true", help="write no figures")
  p.add_argument("--no-progress", action="store_true", help="no progress bar")
  p.add_argument(
    "--debug",
    action="store_true",
    help="show the Python traceback of an error instead of a one-line message",
  )
  return p


def analyze_main(argv: Sequence[str] | None = None) -> int:
  """Runs `bertjax analyze` from command-line arguments; prints where the results are."""
  args = analyze_parser().parse_args(argv)
  if args.debug:
    os.environ["BERTJAX_DEBUG"] = "1"
  from bertjax import mesh as mesh_lib

  mesh_lib.initialize_distributed()  # before any other JAX call
  mesh = mesh_lib.make_mesh(*mesh_lib.parse_mesh(args.mesh)) if args.mesh else None
  figures = None
  if not args.no_plots:
    from bertjax.plots.jobs import require_matplotlib, results_figures

    require_matplotlib()
    figures = results_figures
  t0 = time.perf_counter()
  summary = analyze_checkpoints(
    args.checkpoints,
    [a.strip() for a in args.analyses.split(",") if a.strip()],
    args.out,
    data_dir=args.data_dir,
    max_sentences=args.max_sentences,
    tokenizer=args.tokenizer,
    mesh=mesh,
    batch_size=args.batch_size,
    figures=figures,
    progress=not args.no_progress,
  )
  if mesh_lib.is_primary():
    print(
      f"analyze: {len(summary['checkpoints'])} checkpoints x {len(summary['analyses'])} "
      f"analyses: {summary['computed']} computed, {summary['found']} already there "
      f"({time.perf_counter() - t0:.1f} s); results in {pathlib.Path(args.out) / 'results'}"
      + (f", figures in {pathlib.Path(args.out) / 'figures'}" if summary["figures"] else ""),
      file=sys.stdout,
    )
  return 0
