"""Figures of the head-pruning study (`bertjax.analysis.interventions.pruning`).

Each function takes that module's result dicts (or their JSON form), saves a PNG and returns
its path. Layers are drawn as blocks 1..L, heads as 0..H-1.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping

import numpy as np

from bertjax.plots.charts import draw_head_grid, pyplot, save_png


def importance_and_ablation(importance: Mapping, ablation: Mapping, path) -> pathlib.Path:
  """Three (layers, heads) grids: normalised and raw head importance, and the held-out
  accuracy change with each head removed alone."""
  plt = pyplot()
  fig, axes = plt.subplots(1, 3, figsize=(17, 4), layout="constrained")
  change = np.asarray(ablation["head_accuracy"]) - ablation["baseline_accuracy"]
  draw_head_grid(
    axes[0],
    importance["normalized"],
    title="Head importance (per-layer L2 normalised)",
    cbar_label="importance",
  )
  draw_head_grid(
    axes[1], importance["raw"], title="Head importance (raw E|dL/dxi|)", cbar_label="importance"
  )
  draw_head_grid(
    axes[2],
    change,
    title="Held-out accuracy change, one head removed",
    cbar_label="accuracy - baseline",
    cmap="RdBu",
    center=0.0,
    span=max(float(np.nanmax(np.abs(change))), 0.01),  # an all-zero grid stays readable
  )
  return save_png(fig, path)


def pruning_panels(
  curves: Mapping, path, *, task: str = "the task", majority: float | None = None
) -> pathlib.Path:
  """Held-out accuracy and loss against the fraction of heads masked, for the iterative and
  static importance orders and the random orders' mean and range (`pruning_curves`' dict;
  `majority`: the majority class's accuracy, drawn as a line)."""
  plt = pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
  x = curves["fractions"]
  for ax, key, label in (
    (axes[0], "accuracy", f"held-out accuracy ({task})"),
    (axes[1], "loss", f"held-out cross-entropy ({task})"),
  ):
    v = curves[key]
    ax.plot(x, v["iterative"], "o-", label="importance, re-estimated (Michel)")
    ax.plot(x, v["static_normalized"], "s--", label="importance, static, normalised")
    ax.plot(x, v["static_raw"], "^--", label="importance, static, raw")
    rnd = np.asarray(v["random"])
    ax.plot(x, rnd.mean(0), "k-", label=f"random order (mean of {len(rnd)})")
    ax.fill_between(x, rnd.min(0), rnd.max(0), color="k", alpha=0.15, label="random (min-max)")
    ax.set_xlabel("fraction of heads masked")
    ax.set_ylabel(label)
  if majority is not None:
    axes[0].axhline(majority, color="gray", ls=":", label="majority class")
  axes[0].set_title("Pruning curve: accuracy")
  axes[1].set_title("Pruning curve: loss (lower is better)")
  axes[0].legend(fontsize=8)
  return save_png(fig, path)


def speedup_bars(speed: Mapping, path) -> pathlib.Path:
  """The speed-up of each pruned model and of the head-masked one (`pruned_speedups`' dict,
  with the batch's `batch` and `length` added): medians as bars, fastest rounds as marks."""
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(6.5, 4))
  masked = next(k for k in speed["times"] if k.startswith("masked_"))
  labels = ["unpruned", f"masked {float(masked[7:]):.0%}"] + [
    f"pruned {f:.0%}" for f in speed["fractions"]
  ]
  values = [1.0, speed["speedup_masked"], *speed["speedup"]]
  ax.bar(
    labels,
    values,
    color=["gray", "lightgray"] + ["tab:blue"] * len(speed["fractions"]),
    label="median of repeats",
  )
  ax.plot(
    labels,
    [1.0, speed["speedup_masked_fastest"], *speed["speedup_fastest"]],
    "kD",
    label="fastest of repeats",
  )
  ax.legend(fontsize=8, loc="lower right")
  ax.axhline(1.0, color="k", lw=0.8)
  for i, v in enumerate(values):
    ax.text(i, v, f"{v:.2f}x", ha="center", va="bottom", fontsize=8)
  ax.set_ylabel("speed-up over the unpruned model")
  ax.set_xlabel("model (heads physically removed)")
  ax.set_title(
    f"Inference speed-up, batch {speed['batch']} x {speed['length']} tokens, {speed['backend']}"
  )
  return save_png(fig, path)


def layer_ablation(ablation: Mapping, path) -> pathlib.Path:
  """Held-out accuracy with each layer's heads removed, and with all but its best head
  removed (Michel's Table 2), against the intact model (`head_ablation_tests`' dict)."""
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(6.5, 4))
  layers = np.arange(1, len(ablation["layer_heads_accuracy"]) + 1)
  ax.plot(layers, ablation["layer_heads_accuracy"], "o-", label="all heads of the layer removed")
  ax.plot(
    layers, np.max(ablation["keep_one_accuracy"], 1), "s-", label="all but the best head removed"
  )
  ax.axhline(ablation["baseline_accuracy"], color="k", ls="--", label="intact model")
  ax.set_xlabel("layer")
  ax.set_xticks(layers)
  ax.set_ylabel("held-out accuracy")
  ax.set_title("Whole-layer ablation and 'one head is enough' (Michel Table 2)")
  ax.legend(fontsize=8)
  return save_png(fig, path)


def sixteen_heads_figures(r: Mapping, out, stem: str) -> list[str]:
  """The four figures of the `sixteen_heads` experiment from its results `r`, saved in `out`
  as `STEM_heads.png` (importance and ablation), `_pruning`, `_speedup` and `_layers`.

  Returns:
    The file names.
  """
  out = pathlib.Path(out)
  paths = (
    importance_and_ablation(r["importance"], r["ablation"], out / f"{stem}_heads.png"),
    pruning_panels(
      r["pruning"],
      out / f"{stem}_pruning.png",
      task="negation",
      majority=r["pruning"]["majority_accuracy"],
    ),
    speedup_bars(r["speed"], out / f"{stem}_speedup.png"),
    layer_ablation(r["ablation"], out / f"{stem}_layers.png"),
  )
  return [p.name for p in paths]
