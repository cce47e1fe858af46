"""`bertjax.study` bound to this repository: the experiments' committed results folder and
their sizes file."""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Any

from bertjax import study

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "experiments" / "results"  # what the Findings are generated from
SIZES = REPO / "experiments" / "sizes.toml"  # every experiment's full, smoke and GPU sizes


def parser(doc: str | None, **options: Any) -> argparse.ArgumentParser:
  """`bertjax.study.parser` whose `--update-results` writes `experiments/results`, and whose
  usage line names the command that runs the experiment, `python -m experiments.NAME`."""
  script = pathlib.Path(sys.argv[0]).resolve()
  prog = f"python -m experiments.{script.stem}" if script.parent == REPO / "experiments" else None
  return study.parser(doc, results=RESULTS, prog=prog, **options)


def sizes(name: str) -> dict[str, dict[str, Any]]:
  """Experiment `name`'s sizes by scale, from `experiments/sizes.toml` (`bertjax.study.sizes`)."""
  return study.sizes(SIZES, name)
