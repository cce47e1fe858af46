"""Figures of training runs (`bertjax.training.runs.train_run` results) and of models compared
side by side: loss against time and steps, per-step times, and bars per model; and the sets
each comparison draws (`stacking_figures`, `variant_figures`, `compression_bars`).

A run is a dict with `label`, `mlm_loss` (per step), and, where a figure needs them, `cost_s`
(seconds per step, compile excluded), `raw_cost_s` (compile included) and `stage_starts`
(the steps where a stacking stage began). Each function saves a PNG and returns its path.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence

import numpy as np

from bertjax import stats
from bertjax.plots.charts import pyplot, save_png


def _style(run: Mapping, colours: Mapping[str, str] | None) -> dict:
  """A run's colour by its kind (the label before "#") and a dashed line for repeats after
  the first ("kind#2" ...)."""
  kind, _, repeat = run["label"].partition("#")
  style = {"ls": "--" if repeat not in ("", "1") else "-"}
  if colours and kind in colours:
    style["color"] = colours[kind]
  return style


def loss_against_time(
  runs: Sequence[Mapping],
  window: int,
  path,
  *,
  colours: Mapping[str, str] | None = None,
  target: float | None = None,
  deadline: tuple[float, str] | None = None,
  title: str = "MLM loss against wall-clock time",
) -> pathlib.Path:
  """Each run's smoothed training loss against its cumulative step time, with an optional
  `target` loss line and a `deadline` (seconds, label) line."""
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for r in runs:
    ax.plot(
      np.cumsum(r["cost_s"]),
      stats.trailing_mean(r["mlm_loss"], window),
      label=r.get("legend", r["label"]),
      **_style(r, colours),
    )
  if target is not None:
    ax.axhline(target, color="gray", lw=0.8, label="baseline final (smoothed)")
  if deadline is not None:
    ax.axvline(deadline[0], color="red", lw=0.8, ls=":", label=deadline[1])
  ax.set(
    xlabel="cumulative step time, compile excluded (s)",
    ylabel=f"training MLM loss ({window}-step trailing mean)",
    title=title,
  )
  ax.legend(fontsize=7)
  return save_png(fig, path)


def loss_against_steps(
  runs: Sequence[Mapping],
  window: int,
  path,
  *,
  colours: Mapping[str, str] | None = None,
  per_step: bool = False,
  title: str = "MLM loss against steps",
) -> pathlib.Path:
  """Each run's smoothed training loss against steps (`per_step`: the raw losses faint
  behind it); a run's stacking stages, if any, as dotted lines."""
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for r in runs:
    steps = np.arange(1, len(r["mlm_loss"]) + 1)
    line = ax.plot(
      steps,
      stats.trailing_mean(r["mlm_loss"], window),
      label=r.get("legend", r["label"]),
      **{**_style(r, colours), "ls": "-"},
    )[0]
    if per_step:
      ax.plot(steps, r["mlm_loss"], color=line.get_color(), alpha=0.25)
    for s in r.get("stage_starts", [])[1:]:
      ax.axvline(s + 1, color=line.get_color(), lw=0.8, ls=":")
  ylabel = f"training MLM loss ({window}-step trailing mean)"
  if per_step:
    ylabel = "training MLM loss (faint: per step; solid: trailing mean)"
  ax.set(xlabel="step", ylabel=ylabel, title=title)
  ax.legend(fontsize=7 if per_step else 8)
  return save_png(fig, path)


def step_times(
  runs: Sequence[Mapping], path, *, colours: Mapping[str, str] | None = None
) -> pathlib.Path:
  """Every run's per-step time, compile included, on a log scale."""
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(7, 4))
  for r in runs:
    steps = np.arange(1, len(r["raw_cost_s"]) + 1)
    ax.plot(steps, r["raw_cost_s"], lw=0.8, label=r["label"], **_style(r, colours))
  ax.set_yscale("log")
  ax.set(
    xlabel="step",
    ylabel="step time incl. compile (s, log)",
    title="Per-step time of every run (spikes: compiles and machine load)",
  )
  ax.legend(fontsize=7)
  return save_png(fig, path)


def stacking_figures(
  runs: Sequence[Mapping],
  out,
  prefix: str,
  *,
  window: int,
  target: float,
  deadline: tuple[float, str],
) -> list[pathlib.Path]:
  """A stacking comparison's three figures, `out/prefix_loss_vs_time.png`,
  `_loss_vs_steps.png` and `_step_time.png`: every run's smoothed loss (over `window` steps)
  against time, with the `target` loss and the `deadline` (seconds, label); the first run of
  each kind against steps (repeats draw the same batches, so their losses are equal); and
  every step's time. Runs are labelled "baseline#1", "stacked#2", "variation#1", ... and
  carry `stacking` (their schedule, or None at full depth)."""
  out = pathlib.Path(out)
  colours = {"baseline": "tab:blue", "stacked": "tab:orange", "variation": "tab:green"}
  named = [{**r, "legend": f"{r['label']} ({r['stacking'] or 'full depth'})"} for r in runs]
  first: dict[str, Mapping] = {}
  for r in runs:
    first.setdefault(r["label"].split("#")[0], r)
  firsts = [{**r, "legend": f"{k} ({r['stacking'] or 'full depth'})"} for k, r in first.items()]
  return [
    loss_against_time(
      named,
      window,
      out / f"{prefix}_loss_vs_time.png",
      colours=colours,
      target=target,
      deadline=deadline,
      title="Progressive stacking vs full depth: MLM loss against wall-clock time",
    ),
    loss_against_steps(
      firsts,
      window,
      out / f"{prefix}_loss_vs_steps.png",
      colours=colours,
      per_step=True,
      title="MLM loss against steps (dotted: stacking)",
    ),
    step_times(runs, out / f"{prefix}_step_time.png", colours=colours),
  ]


def model_bars(
  names: Sequence[str],
  panels: Sequence[Mapping],
  path,
  *,
  title: str = "",
  colours: Sequence[str] = ("tab:gray", "tab:blue", "tab:cyan", "tab:orange", "tab:green"),
) -> pathlib.Path:
  """One panel of bars per quantity, a bar per model.

  Args:
    names: the models' tick labels.
    panels: each `{"values": (models,), "label": axis label (its part before " (" is the
      panel's title), "ylim": optional (low, high), "hline": optional value drawn across}`.
    path: the PNG.
    title: the figure's title.
    colours: the bars' colours, model by model.
  """
  plt = pyplot()
  fig, axes = plt.subplots(
    1, len(panels), figsize=(4.3 * len(panels), 3.8), squeeze=False, layout="constrained"
  )
  x = np.arange(len(names))
  for ax, panel in zip(axes[0], panels):
    ax.bar(x, panel["values"], color=list(colours)[: len(names)])
    ax.set_xticks(x, names, rotation=25, fontsize=7, ha="right")
    ax.set(ylabel=panel["label"], title=panel["label"].split(" (")[0])
    if panel.get("ylim") is not None:
      ax.set_ylim(*panel["ylim"])
    if panel.get("hline") is not None:
      ax.axhline(panel["hline"], color="k", lw=0.8)
  fig.suptitle(title)
  return save_png(fig, path)


def compression_bars(rows: Mapping[str, Mapping], labels: Mapping[str, str], path) -> pathlib.Path:
  """Parameters, retained score and CPU speed-up per compressed model, as bars (`rows`:
  `bertjax.training.compression.compression_rows`, `labels`: its `row_labels`)."""
  names = list(rows)
  kept = [100 * rows[n]["retained"] for n in names]
  panels = [
    {"values": [rows[n]["params"] / 1e6 for n in names], "label": "parameters (M)"},
    {
      "values": kept,
      "label": "retained score (% of teacher)",
      "ylim": (min(kept) - 5, max(100, max(kept)) + 2),
    },
    {
      "values": [rows[n]["speedup"] for n in names],
      "label": "CPU forward speed-up (x)",
      "hline": 1.0,
    },
  ]
  return model_bars(
    [labels[n].split(" (")[0] for n in names],
    panels,
    path,
    title=f"Compressing a fine-tuned {rows['teacher']['depth']}-layer model (UD EWT UPOS)",
  )


def variant_figures(
  runs: Mapping[str, Mapping],
  params: Mapping[str, Mapping],
  window: int,
  out,
  stem: str,
  title: str = "Models trained alike: same data, steps and schedule",
) -> list[pathlib.Path]:
  """Models trained alike (`runs` by name, each a `train_run` result with `median_step_s`,
  and `params` their `bertjax.param_counts`), side by side: the loss against steps
  (`out/stem_loss_vs_steps.png`, smoothed over `window` steps) and the bars of parameters,
  held-out MLM loss and median step time (`stem_summary.png`); `title` heads the first."""
  out, names = pathlib.Path(out), list(runs)
  curves = [
    {**runs[v], "label": v, "legend": f"{v} ({params[v]['total'] / 1e6:.2f}M params)"}
    for v in names
  ]
  loss = [runs[v]["heldout"]["mlm_loss"] for v in names]
  panels = [
    {"values": [params[v]["total"] / 1e6 for v in names], "label": "parameters (M, with MLM head)"},
    {
      "values": loss,
      "label": "held-out MLM loss (nats)",
      "ylim": (min(loss) - 0.2, max(loss) + 0.1),
    },
    {"values": [runs[v]["median_step_s"] for v in names], "label": "median train step (s)"},
  ]
  return [
    loss_against_steps(
      curves,
      window,
      out / f"{stem}_loss_vs_steps.png",
      title=title,
    ),
    model_bars(
      names,
      panels,
      out / f"{stem}_summary.png",
      title="Parameters, held-out MLM loss and step time per model",
      colours=("tab:blue", "tab:orange", "tab:green", "tab:red"),
    ),
  ]
