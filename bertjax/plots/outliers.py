"""Figures of outlier dimensions (`bertjax.analysis.representations.outliers`)."""

from __future__ import annotations

import pathlib
from collections.abc import Mapping

import numpy as np

from bertjax.plots.charts import pyplot, save_png


def outlier_census(r: Mapping, path, *, title: str = "Outlier dimensions") -> pathlib.Path:
  """Three panels: each layer's largest |z| and the outlier dimensions' |z| by layer; the UPOS
  probe's accuracy with dimensions disabled (`probe_without_dimensions`); the int8 error by
  layer beside the largest activation (`int8_error_by_layer`).

  Args:
    r: `z` (L, H) z-scores of the mean activations, `dims`, `probe` and `int8`.
    path: the PNG.
    title: the first panel's title.
  """
  plt = pyplot()
  z = np.asarray(r["z"])
  layers = np.arange(1, len(z) + 1)
  fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
  ax = axes[0]
  ax.plot(layers, np.abs(z).max(1), "o-", label="largest |z| of the layer")
  for d in r["dims"]:
    ax.plot(layers, np.abs(z[:, d]), ".--", label=f"dimension {d}")
  ax.axhline(3, color="k", lw=0.8, ls=":", label="outlier threshold (3 sd)")
  ax.set(xlabel="layer", ylabel="|z| of the mean activation", xticks=layers, title=title)
  ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.22))
  ax = axes[1]
  acc = r["probe"]["accuracy"]
  names = list(acc)
  x = np.arange(len(names))
  for i, layer in enumerate(r["probe"]["layers"]):
    ax.bar(x + 0.4 * i - 0.2, [100 * acc[k][i] for k in names], 0.4, label=f"layer {layer}")
  ax.set_xticks(x, [n.replace("_", " ") for n in names], rotation=30, ha="right", fontsize=8)
  ax.set(ylabel="UPOS probe accuracy (%)", title="Dimensions disabled (norm scale and bias 0)")
  ax.legend(fontsize=8)
  ax = axes[2]
  q = r["int8"]
  ax.plot(layers, 100 * np.asarray(q["relative_error"]), "o-", color="tab:red")
  ax.set(
    xlabel="layer",
    ylabel="int8 block-output error (%)",
    xticks=layers,
    title=f"int8 error vs largest activation (Spearman {q['spearman']:.2f})",
  )
  ax2 = ax.twinx()
  ax2.plot(layers, q["max_abs"], "s--", color="tab:gray")
  ax2.set_ylabel("largest |activation|", color="tab:gray")
  for a in axes:
    a.grid(alpha=0.3)
  fig.tight_layout()
  return save_png(fig, path)
