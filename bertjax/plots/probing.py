"""PNG figures for probing, structural-probe, geometry and CKA results.

Figures are built on ``matplotlib.figure.Figure`` and render headless; every function
writes one PNG through the package's one writer (`charts.save_png`) and returns its path.

Layers are numbered as everywhere in bertjax: transformer blocks 1..L, the embedding
output 0. A per-layer vector with the embeddings first (`embeddings_first=True`, length
L + 1) is drawn at layers 0..L; one without them (length L) at layers 1..L.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from bertjax import utils
from bertjax.analysis.representations import probing_run
from bertjax.plots.charts import save_png

if TYPE_CHECKING:
  from matplotlib.figure import Figure

PathLike = str | os.PathLike


def _per_layer(name: str, values) -> np.ndarray:
  arr = np.asarray(values, float)
  if arr.ndim != 1 or arr.size == 0:
    raise ValueError(f"{name} must be a non-empty per-layer vector, got shape {arr.shape}")
  return arr


def _figure(**kwargs) -> Figure:
  """A new figure; matplotlib (the `plots` extra) is imported here, so importing this module
  (and the analyses that use it) does not need it."""
  from matplotlib.figure import Figure

  return Figure(**kwargs)


_save = save_png  # the plots package's one PNG writer (120 dpi, closes the figure)


def _layers(num_layers: int, embeddings_first: bool) -> np.ndarray:
  """The layer numbers of a per-layer vector: 0..L with the embeddings first, else 1..L."""
  return np.arange(num_layers) + (0 if embeddings_first else 1)


def _layer_axis(ax, num_layers: int, embeddings_first: bool) -> None:
  ax.set_xlabel("layer (0 = embeddings)" if embeddings_first else "layer (transformer block)")
  ax.set_xticks(_layers(num_layers, embeddings_first))
  ax.grid(alpha=0.3)


def plot_layer_curves(
  curves: Mapping[str, Sequence[float]],
  path: PathLike,
  *,
  ylabel: str = "",
  title: str = "",
  embeddings_first: bool = True,
) -> pathlib.Path:
  """One line per named per-layer curve.

  Args:
    curves: ``{name: (layers,)}``; all curves must have the same length.
    path: the ``.png`` to write.
    ylabel, title: axis label and title.
    embeddings_first: the first value is the embedding output (layer 0); False: the values
      are blocks 1..L.

  Returns:
    The path written.
  """
  if not curves:
    raise ValueError("curves is empty")
  arrays = {k: _per_layer(k, v) for k, v in curves.items()}
  lengths = {k: len(v) for k, v in arrays.items()}
  if len(set(lengths.values())) != 1:
    raise ValueError(f"curves have different numbers of layers: {lengths}")
  fig = _figure(figsize=(6, 3.6))
  ax = fig.add_subplot()
  for name, arr in arrays.items():
    ax.plot(_layers(len(arr), embeddings_first), arr, marker="o", ms=3, label=name)
  _layer_axis(ax, len(next(iter(arrays.values()))), embeddings_first)
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  ax.legend(fontsize=8)
  return _save(fig, path)


def plot_probing(
  task_accuracy: Sequence[float],
  path: PathLike,
  control_accuracy: Sequence[float] | None = None,
  *,
  task_name: str = "task",
  embeddings_first: bool = True,
) -> pathlib.Path:
  """Per-layer probe accuracy, with control accuracy and selectivity when given."""
  task = _per_layer("task_accuracy", task_accuracy)
  fig = _figure(figsize=(6, 3.6))
  ax = fig.add_subplot()
  x = _layers(len(task), embeddings_first)
  ax.plot(x, task, marker="o", ms=3, label=f"{task_name} accuracy")
  if control_accuracy is not None:
    control = _per_layer("control_accuracy", control_accuracy)
    if control.shape != task.shape:
      raise ValueError(f"control_accuracy shape {control.shape} != task shape {task.shape}")
    ax.plot(x, control, marker="s", ms=3, label="control accuracy")
    ax.bar(x, task - control, alpha=0.3, color="gray", label="selectivity")
  _layer_axis(ax, len(task), embeddings_first)
  ax.set_ylabel("accuracy")
  ax.set_ylim(0, 1)
  ax.set_title(f"{task_name} probe per layer")
  ax.legend(fontsize=8)
  return _save(fig, path)


def plot_structural(
  metrics: Mapping[str, Sequence[float]], path: PathLike, *, embeddings_first: bool = True
) -> pathlib.Path:
  """Structural-probe metrics per layer (e.g. ``{"UUAS": ..., "DSpr.": ...}``), on [0, 1]."""
  return plot_layer_curves(
    metrics, path, ylabel="score", title="structural probes", embeddings_first=embeddings_first
  )


def plot_contextuality(
  summary: Mapping[str, Sequence[float]], path: PathLike, *, embeddings_first: bool = True
) -> pathlib.Path:
  """Ethayarajh's measures from ``geometry.contextuality``: raw (left) and centred (right)."""
  raw = {k: v for k, v in summary.items() if not k.endswith("_centered")}
  cen = {k[: -len("_centered")]: v for k, v in summary.items() if k.endswith("_centered")}
  if not raw:
    raise ValueError(f"summary has no raw measures, keys {sorted(summary)}")
  panels = [("raw", raw)] + ([("mean-centred", cen)] if cen else [])
  fig = _figure(figsize=(5.5 * len(panels), 3.6))
  for i, (title, curves) in enumerate(panels, start=1):
    ax = fig.add_subplot(1, len(panels), i)
    n = 0
    for name, values in curves.items():
      arr = _per_layer(name, values)
      n = len(arr)
      ax.plot(_layers(n, embeddings_first), arr, marker="o", ms=3, label=name)
    _layer_axis(ax, n, embeddings_first)
    ax.set_ylabel("cosine similarity")
    ax.set_title(title)
    ax.legend(fontsize=7)
  return _save(fig, path)


def plot_cka(
  matrix,
  path: PathLike,
  *,
  xlabel: str | None = None,
  ylabel: str | None = None,
  title: str = "linear CKA",
  embeddings_first: bool = True,
) -> pathlib.Path:
  """Heat map of a ``(layers_a, layers_b)`` CKA matrix, rows and columns numbered as layers
  (from 0 with the embeddings first, else from 1)."""
  matrix = np.asarray(matrix, float)
  if matrix.ndim != 2:
    raise ValueError(f"matrix must be 2-d, got shape {matrix.shape}")
  fig = _figure(figsize=(4.8, 4.2))
  ax = fig.add_subplot()
  im = ax.imshow(matrix, vmin=0, vmax=1, cmap="magma", origin="lower")
  for axis, n in ((ax.set_xticks, matrix.shape[1]), (ax.set_yticks, matrix.shape[0])):
    axis(range(n), [str(v) for v in _layers(n, embeddings_first)])
  fig.colorbar(im, ax=ax)
  default = "layer (0 = embeddings)" if embeddings_first else "layer"
  ax.set_xlabel(default if xlabel is None else xlabel)
  ax.set_ylabel(default if ylabel is None else ylabel)
  ax.set_title(title)
  return _save(fig, path)


def plot_mix_weights(
  weights: Sequence[float], path: PathLike, gamma: float | None = None
) -> pathlib.Path:
  """Bar chart of scalar-mix layer weights (Tenney et al. 2019)."""
  w = _per_layer("weights", weights)
  fig = _figure(figsize=(6, 3.2))
  ax = fig.add_subplot()
  ax.bar(_layers(len(w), True), w)
  _layer_axis(ax, len(w), True)
  ax.set_ylabel("softmax weight")
  ax.set_title("scalar mix" + (f" (gamma = {gamma:.2f})" if gamma is not None else ""))
  return _save(fig, path)


def write_probing_outputs(results: dict[str, Any], out_dir: str | os.PathLike) -> list[str]:
  """Writes the figures and ``probing.json`` of `bertjax.analysis.representations.probing_run.
  run_probing_suite` results.

  Returns:
    The paths written (figures first, the JSON last).
  """
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  paths = []
  for task in probing_run.TASKS:
    if task in results:
      r = results[task]
      paths.append(
        plot_probing(
          r["accuracy"], out / f"probe_{task}.png", r.get("control_accuracy"), task_name=task
        )
      )
  if "upos_mlp" in results:
    paths.append(
      plot_layer_curves(
        {"linear": results["upos"]["accuracy"], "mlp": results["upos_mlp"]["accuracy"]}
        if "upos" in results
        else {"mlp": results["upos_mlp"]["accuracy"]},
        out / "probe_upos_mlp.png",
        ylabel="accuracy",
        title="UPOS: linear vs MLP probe",
      )
    )
  if "structural" in results:
    s = results["structural"]
    paths.append(
      plot_structural(
        {
          "UUAS": s["distance"]["uuas"],
          "DSpr.": s["distance"]["spearman"],
          "root acc.": s["depth"]["root_accuracy"],
          "NSpr.": s["depth"]["spearman"],
        },
        out / "structural.png",
      )
    )
  paths.append(
    plot_layer_curves(
      results["anisotropy"],
      out / "anisotropy.png",
      ylabel="mean cosine",
      title=f"anisotropy ({results.get('model', '')})",
    )
  )
  results = {**results, "figures": [str(p) for p in paths]}
  json_path = out / "probing.json"
  utils.write_json(json_path, results)
  return [str(p) for p in paths] + [str(json_path)]


def plot_scores_with_best(
  curves: Mapping[str, Sequence[float]],
  path: PathLike,
  *,
  labels: Mapping[str, str] | None = None,
  title: str = "Probes by layer; ★ = best layer",
) -> pathlib.Path:
  """Every probe's score by layer (layer 0 = embeddings), its best layer starred."""
  fig = _figure(figsize=(7, 4.5))
  ax = fig.add_subplot()
  n = None
  for key, ys in curves.items():
    ys = _per_layer(key, ys)
    n = len(ys)
    (line,) = ax.plot(np.arange(n), ys, marker="o", label=(labels or {}).get(key, key))
    best = int(np.nanargmax(ys))
    ax.plot(best, ys[best], marker="*", ms=14, color=line.get_color())
  _layer_axis(ax, n, True)
  ax.set(ylabel="score on held-out sentences", title=title)
  ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
  return _save(fig, path)


def plot_selectivity_panels(
  tasks: Mapping[str, Mapping], path: PathLike, *, mlp: Mapping[str, Mapping] | None = None
) -> pathlib.Path:
  """A panel per task: linear probe and control-task accuracy by layer, selectivity as bars,
  and where `mlp` has the task, the MLP probe's two curves dashed (Hewitt & Liang 2019).

  Args:
    tasks: task name -> `probing.Probe` results with `accuracy`, `control_accuracy`,
      `selectivity` (layers,) each.
    path: the PNG.
    mlp: task name -> the MLP probe's results, for the tasks that have one.
  """
  fig = _figure(figsize=(5 * len(tasks), 4))
  axes = np.atleast_1d(fig.subplots(1, len(tasks), sharey=True))
  for ax, (task, t) in zip(axes, tasks.items()):
    x = np.arange(len(t["accuracy"]))
    ax.plot(x, t["accuracy"], marker="o", label="task accuracy")
    ax.plot(x, t["control_accuracy"], marker="s", label="control-task accuracy")
    ax.bar(x, t["selectivity"], alpha=0.35, color="tab:green", label="selectivity")
    if mlp and task in mlp:
      m = mlp[task]
      ax.plot(x, m["accuracy"], "--o", color="tab:blue", mfc="none", label="MLP probe")
      ax.plot(
        x, m["control_accuracy"], "--s", color="tab:orange", mfc="none", label="MLP control task"
      )
    _layer_axis(ax, len(x), True)
    ax.set_title(f"{task}: selectivity")
  axes[0].set_ylabel("accuracy / selectivity")
  axes[0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(0, -0.15), ncol=3)
  fig.suptitle(
    "Hewitt & Liang control tasks (solid: linear probes, dashed: MLP; bars: linear "
    "selectivity = task - control)"
  )
  return _save(fig, path)


def plot_expected_layers(
  expected: Mapping[str, float],
  num_layers: int,
  path: PathLike,
  *,
  labels: Mapping[str, str] | None = None,
  title: str = "Tenney's expected layer: POS (blue) vs syntax (orange)",
) -> pathlib.Path:
  """Each task's expected layer (`stats.expected_layer`) as a bar, the first task in blue and
  the rest in orange; `num_layers` counts layer 0 (the embeddings)."""
  fig = _figure(figsize=(6.5, 3.6))
  ax = fig.add_subplot()
  keys = list(expected)
  vals = [expected[k] for k in keys]
  colours = ["tab:blue"] + ["tab:orange"] * (len(keys) - 1)
  ax.barh(range(len(keys)), np.nan_to_num(vals), color=colours)
  for i, v in enumerate(vals):
    ax.text(np.nan_to_num(v) + 0.03, i, f"{v:.2f}", va="center", fontsize=8)
  ax.set_yticks(range(len(keys)), [(labels or {}).get(k, k) for k in keys])
  ax.set(xlabel="expected layer E[l] (running-best gains)", xlim=(0, num_layers - 0.5), title=title)
  ax.grid(alpha=0.3, axis="x")
  ax.invert_yaxis()
  return _save(fig, path)


# The names of the layer-wise probing tasks in the probing_layers figures.
PROBING_LAYERS_LABELS = {
  "upos": "UPOS accuracy",
  "deprel": "dep. relation accuracy",
  "uuas": "UUAS (distance)",
  "dspr": "DSpr. (distance)",
  "root_acc": "root accuracy (depth)",
  "nspr": "NSpr. (depth)",
}


def probing_layers_figures(curves, expected, r, out, stem: str, *, model_name: str) -> list[str]:
  """The three figures of the `probing_layers` experiment, saved in `out`: the scores by layer
  (`curves`) with the best layer marked, the selectivity against the control tasks (the
  results `r`) and the expected layers (`expected`), as `STEM_scores.png`, `_selectivity` and
  `_expected_layer`.

  Returns:
    The file names.
  """
  out = pathlib.Path(out)
  tasks = {PROBING_LAYERS_LABELS[t]: r[t] for t in ("upos", "deprel")}
  mlp = {PROBING_LAYERS_LABELS["upos"]: r["upos_mlp"]} if "upos_mlp" in r else None
  title = f"Probes by layer ({model_name}); ★ = best layer"
  paths = (
    plot_scores_with_best(
      curves, out / f"{stem}_scores.png", labels=PROBING_LAYERS_LABELS, title=title
    ),
    plot_selectivity_panels(tasks, out / f"{stem}_selectivity.png", mlp=mlp),
    plot_expected_layers(
      expected,
      len(curves["upos"]),
      out / f"{stem}_expected_layer.png",
      labels=PROBING_LAYERS_LABELS,
    ),
  )
  return [p.name for p in paths]
