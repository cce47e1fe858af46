"""Figures of edge attribution and circuits (`bertjax.analysis.interventions.edges` and
`circuits`): scores against exact edge patching, faithfulness by circuit size, and a circuit
drawn over the model's layers.

Each figure function saves a PNG and returns its path; `draw_circuit` draws into a given axes.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence

import numpy as np

from bertjax.plots.charts import pyplot, save_png

COLOURS = ("tab:orange", "tab:blue", "tab:green")


def _agreement(ax, exact, scores: Mapping[str, Sequence[float]]) -> None:
  ex = np.asarray(exact, np.float64)
  for (name, values), colour in zip(scores.items(), COLOURS):
    v = np.asarray(values, np.float64)
    ok = np.isfinite(v) & np.isfinite(ex)
    r = np.corrcoef(ex[ok], v[ok])[0, 1] if ok.sum() > 2 else float("nan")
    label = f"{name.upper().replace('_', '-')} (Pearson {r:.2f})"
    ax.scatter(ex[ok], v[ok], s=6, alpha=0.5, color=colour, label=label)
  lim = float(np.nanmax(np.abs(ex))) if np.isfinite(ex).any() else 1.0
  ax.plot([-lim, lim], [-lim, lim], color="gray", lw=0.8)
  ax.set(
    xlabel="exact edge patching (change of the metric)",
    ylabel="score",
    title=f"{len(ex):,} edges patched exactly",
  )
  ax.legend(fontsize=8)


def _faithfulness(ax, curves: Mapping[str, Mapping], share: float) -> None:
  for (name, f), style in zip(curves.items(), ("-o", "--s", ":^")):
    ax.plot(f["edges"], f["normalized"], style, ms=4, label=name)
  ax.axhline(share, color="gray", lw=0.8, ls=":")
  ax.set(
    xscale="log",
    xlabel="edges in the circuit",
    ylabel="normalised faithfulness",
    title="Circuits from EAP-IG scores",
  )
  if len(curves) > 1:
    ax.legend(fontsize=8)


def draw_circuit(ax, graph, circuit, *, share: float = 0.8) -> None:
  """The edges of `circuit` (a bool (senders, receivers) array over `graph`, or None when no
  circuit kept `share`) drawn over the layers: heads left of each layer's tick (red), the FFN
  right of it (black), the input at 0 and the logits after the last layer."""
  layers = max((int(s[1:].split(".")[0]) for s in graph.senders if s[0] in "am"), default=0) + 1
  heads_in = {
    layer: sum(1 for s in graph.senders if s.startswith(f"a{layer}.")) for layer in range(layers)
  }

  def place(node: str) -> tuple[float, float]:
    base = node.split("<")[0]
    if base == "input":
      return 0.0, 0.0
    if base == "logits":
      return layers + 1.0, 0.0
    block = int(base[1:].split(".")[0])  # drawn as layer block + 1
    if base.startswith("m"):
      return block + 1.25, 0.0
    head, heads = int(base.split(".h")[1]), heads_in[block]
    return block + 0.75, (head - (heads - 1) / 2) / max(heads, 1) * 2

  if circuit is not None:
    circuit = np.asarray(circuit, bool)
    nodes = set()
    for s, t in zip(*np.nonzero(circuit)):
      a, b = graph.senders[s], graph.receivers[t]
      (x0, y0), (x1, y1) = place(a), place(b)
      ax.plot([x0, x1], [y0, y1], color="tab:blue", alpha=0.35, lw=0.8)
      nodes.update([a, b.split("<")[0]])
    for n in nodes:
      x, y = place(n)
      ax.scatter([x], [y], s=30, color="tab:red" if n[0] == "a" else "black", zorder=3)
      if n in ("input", "logits") or n[0] == "m":
        ax.annotate(n, (x, y), fontsize=7, xytext=(2, 4), textcoords="offset points")
    ax.set_title(
      f"The smallest top-k circuit keeping {share:.0%}: {int(circuit.sum())} edges "
      "(heads red, FFNs black)"
    )
  else:
    ax.set_title(f"No circuit asked for keeps {share:.0%}")
  ax.set(xlabel="layer (heads left of the tick, the FFN right; 1 = the first block)", yticks=[])
  ax.set_xticks(range(1, layers + 1))


def edge_agreement(
  exact,
  scores: Mapping[str, Sequence[float]],
  faithfulness: Mapping,
  path,
  *,
  share: float = 0.8,
  graph=None,
  circuit=None,
  title: str = "",
) -> pathlib.Path:
  """Edge scores against exact edge patching (a scatter per method, with its Pearson) and the
  faithfulness of circuits by size; with a `graph`, a third panel draws `circuit`
  (`draw_circuit`).

  Args:
    exact: (edges,) exact patching effects.
    scores: method -> (edges,) scores.
    faithfulness: `{"edges", "normalized"}` of one circuit family, or name -> that.
    path: the PNG.
    share: the faithfulness a circuit must keep (a dotted line).
    graph, circuit: the edge graph and the circuit to draw, or None.
    title: the figure's title.
  """
  plt = pyplot()
  curves = {"top-k": faithfulness} if "edges" in faithfulness else faithfulness
  panels = 3 if graph is not None else 2
  widths = [1, 1, 1.5][:panels]
  size = (17, 5.2) if graph is not None else (11, 4)
  fig, axes = plt.subplots(1, panels, figsize=size, gridspec_kw={"width_ratios": widths})
  _agreement(axes[0], exact, scores)
  _faithfulness(axes[1], curves, share)
  for ax in axes[:2]:
    ax.grid(alpha=0.3)
  if graph is not None:
    draw_circuit(axes[2], graph, circuit, share=share)
  if title:
    fig.suptitle(title, fontsize=11)
  fig.tight_layout()
  return save_png(fig, path)


def localisation(tasks: Mapping[str, Mapping], path, *, title: str = "") -> pathlib.Path:
  """Both MIB tracks, a column per task: above, interchange-intervention accuracy by layer
  (layers 1..L) of each method; below, the faithfulness of circuits by share of the edges
  (log axis) of each scoring method, with its CPR.

  Args:
    tasks: `{task: {"iia": {method: (L,)}, "circuits": {method: {"percentages": (P,),
      "faithfulness": (P,), "cpr": float}}}}`.
    path: output .png path.
    title: the figure's title.
  """
  plt = pyplot()
  fig, axes = plt.subplots(2, len(tasks), figsize=(4.2 * len(tasks), 6.4), squeeze=False)
  for col, (task, t) in enumerate(tasks.items()):
    top, bottom = axes[0, col], axes[1, col]
    for method, iia in t["iia"].items():
      layers = 1 + np.arange(len(iia))
      top.plot(layers, iia, marker="o", ms=3, label=method)
    top.set(title=task, xlabel="layer", ylabel="held-out IIA", ylim=(-0.02, 1.02))
    top.set_xticks(layers)
    for method, c in t["circuits"].items():
      label = f"{method.upper().replace('_', '-')} (CPR {c['cpr']:.2f})"
      bottom.plot(c["percentages"], c["faithfulness"], "-o", ms=3, label=label)
    bottom.axhline(1.0, color="gray", lw=0.8)
    bottom.set(xscale="log", xlabel="share of the edges", ylabel="faithfulness")
    for ax in (top, bottom):
      ax.grid(alpha=0.3)
      ax.legend(fontsize=7)
  fig.suptitle(title)
  fig.tight_layout()
  return save_png(fig, path)
