"""The figures of `bertjax analyze` (`bertjax.analysis.jobs`): every scalar metric of every
checkpoint's results, one PNG per analysis."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Sequence

import numpy as np

from bertjax.analysis import jobs
from bertjax.analysis.jobs import ANALYSES


def require_matplotlib() -> None:
  """Raises an ImportError saying how to get matplotlib (the ``plots`` extra), or to pass
  ``--no-plots``, when it is not installed: checked before an analysis job starts."""
  try:
    import matplotlib  # noqa: F401
  except ImportError:
    raise ImportError(
      "the figures need matplotlib: pip install 'bertjax[plots]', or pass --no-plots"
    ) from None


def results_figures(out_dir, analyses: Sequence[str] = ANALYSES) -> list[pathlib.Path]:
  """``figures/<analysis>.png``: every scalar metric of every checkpoint, one panel per metric.

  When every checkpoint has a training step, the x-axis is the step. Otherwise each
  checkpoint gets its own place on the x-axis, labelled by name (the steps of a run side by
  side, in order). Either way a line joins only the checkpoints of one training run (one
  run and seed), other models are single points, and a legend names every series
  (`jobs.figure_series`). Returns the files written.
  """
  from matplotlib.figure import Figure

  written = []
  for analysis in analyses:
    results = jobs.read_results(out_dir, analysis)
    if not results:
      continue
    names = sorted(results[0]["metrics"])
    series = jobs.figure_series(results)
    by_step = all(p[0] is not None for s in series for p in s["points"])
    slots = [p[1] for s in series for p in s["points"]]  # the x-axis when not by step
    starts = np.cumsum([0] + [len(s["points"]) for s in series])
    fig = Figure(
      figsize=(
        max(3.4 * len(names), 6.0),
        3.0 + (0 if by_step else 0.12 * max(len(x) for x in slots)) + 0.22 * len(series),
      ),
      layout="constrained",
    )
    axes = fig.subplots(1, len(names), squeeze=False)[0]
    colours = [f"C{i % 10}" for i in range(len(series))]
    for ax, name in zip(axes, names):
      for s, colour, start in zip(series, colours, starts):
        xs = [p[0] for p in s["points"]] if by_step else start + np.arange(len(s["points"]))
        ys = [p[2].get(name, np.nan) for p in s["points"]]
        ax.plot(
          xs,
          ys,
          marker="o",
          markersize=4,
          linestyle="-" if s["line"] else "none",
          color=colour,
          label=s["name"],
        )
      ax.set_title(name, fontsize=9)
      if by_step:
        ax.set_xlabel("training step")
      else:
        ax.set_xticks(range(len(slots)), slots, rotation=35, ha="right", fontsize=7)
        ax.set_xlabel("checkpoint")
      ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(
      handles,
      labels,
      loc="outside lower center",
      fontsize=7,
      ncol=min(len(series), 3),
      title="models (a line: one run's steps)",
      title_fontsize=7,
    )
    fig.suptitle(analysis)
    path = pathlib.Path(out_dir) / "figures" / f"{analysis}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fig.savefig(tmp, format="png", dpi=100, metadata={"Software": None})
    os.replace(tmp, path)
    written.append(path)
  return written
