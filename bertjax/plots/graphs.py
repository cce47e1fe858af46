"""Figures of attribution graphs (`bertjax.analysis.circuits.graphs`): a pruned graph drawn
by layer and position, and the graph's predictions against interventions on the model."""

from __future__ import annotations

import pathlib
from collections.abc import Mapping

import numpy as np

from bertjax.plots.charts import pyplot, save_png

KIND_COLOUR = {"embedding": "0.45", "feature": "C0", "error": "C3", "target": "C2"}


def draw(view: Mapping, ax, *, title: str = "") -> None:
  """A pruned graph (`graphs.view`) on `ax`: x the position, y the layer (embeddings below,
  the targets on top), each node's area its influence; edges as lines, blue where they
  excite and red where they inhibit, their width the weight's size."""
  nodes, edges = view["nodes"], view["edges"]
  tokens = view["tokens"]
  layers = max(n["layer"] for n in nodes)
  cells = [
    (n["layer"], len(tokens) // 2 if n.get("position") is None else n["position"]) for n in nodes
  ]
  count: dict[tuple[int, int], int] = {}
  for cell in cells:
    count[cell] = count.get(cell, 0) + 1
  seen: dict[tuple[int, int], int] = {}
  xy = []
  for cell in cells:  # the nodes of one cell side by side, within +-0.35 of its position
    j = seen.get(cell, 0)
    seen[cell] = j + 1
    xy.append((cell[1] + (0.7 * (j + 0.5) / count[cell] - 0.35 if count[cell] > 1 else 0), cell[0]))
  xy = np.asarray(xy, float)
  weights = np.array([abs(e[2]) for e in edges]) if edges else np.zeros(0)
  scale = weights.max() if len(weights) else 1.0
  for e, w in zip(edges, weights):
    (x0, y0), (x1, y1) = xy[e[0]], xy[e[1]]
    colour = "C0" if e[2] > 0 else "C3"
    ax.plot(
      [x0, x1], [y0, y1], color=colour, lw=0.2 + 2.5 * w / scale, alpha=0.15 + 0.5 * w / scale
    )
  infl = np.array([n["influence"] for n in nodes])
  size = 12 + 220 * infl / max(infl.max(), 1e-12)
  for kind, colour in KIND_COLOUR.items():
    sel = [i for i, n in enumerate(nodes) if n["kind"] == kind]
    if sel:
      ax.scatter(
        xy[sel, 0], xy[sel, 1], s=size[sel], c=colour, label=kind, zorder=3, edgecolor="k", lw=0.3
      )
  ax.set_xticks(range(len(tokens)))
  ax.set_xticklabels(tokens, rotation=60, ha="right", fontsize=8)
  ax.set_yticks(range(-1, layers + 1))
  ax.set_yticklabels(["emb"] + [str(i + 1) for i in range(layers)] + ["target"])
  ax.set(ylabel="layer", title=title)
  ax.legend(loc="upper left", fontsize=7, markerscale=0.5)


def checks(examples: Mapping[str, Mapping], path, *, views=(), title: str = "") -> pathlib.Path:
  """The graphs' predicted change of the target against the model's, for single features
  ablated (x 0) and doubled (x 2), every example; then each example's replacement and
  completeness scores; then the pruned graphs `views` given as (label, view)."""
  plt = pyplot()
  cols = 2 + len(views)
  fig, axes = plt.subplots(1, cols, figsize=(6 * cols, 4.8))
  a, b = axes[0], axes[1]
  lim = 0.0
  for i, (name, e) in enumerate(examples.items()):
    p = np.asarray(e["predicted"], float).reshape(-1, len(e["factors"]))
    r = np.asarray(e["real"], float).reshape(-1, len(e["factors"]))
    for j, (factor, marker) in enumerate(zip(e["factors"], "ox^s")):
      label = f"{name}, x {factor:g}" if i == 0 or j == 0 else None
      a.scatter(p[:, j], r[:, j], marker=marker, color=f"C{i}", s=18, label=label)
    lim = max(lim, np.abs(p).max(initial=0), np.abs(r).max(initial=0))
  lim = lim * 1.05 or 1.0
  a.plot([-lim, lim], [-lim, lim], "k--", lw=0.8)
  a.axhline(0, color="0.7", lw=0.5)
  a.axvline(0, color="0.7", lw=0.5)
  a.set(
    xlabel="change the graph predicts",
    ylabel="change in the model",
    title=f"Single-feature interventions{': ' + title if title else ''}",
  )
  a.legend(fontsize=7)
  names = list(examples)
  x = np.arange(len(names))
  for k, (metric, off) in enumerate((("replacement", -0.2), ("completeness", 0.2))):
    b.bar(x + off, [examples[n][metric] for n in names], 0.4, label=metric, color=f"C{k + 4}")
  b.set_xticks(x)
  b.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
  b.set(ylim=(0, 1.05), title="circuit-tracer's graph scores")
  b.legend()
  for ax, (label, view) in zip(axes[2:], views):
    draw(view, ax, title=f"{label}: {view['targets'][0]}")
  fig.tight_layout()
  return save_png(fig, path)
