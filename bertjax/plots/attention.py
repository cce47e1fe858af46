"""Figures of where attention goes and what it tracks (Clark et al. 2019):
`statistics.clark_summary` by layer and head, and the attention-based dependency probe
(`syntax.probe_results`) by relation and head.

Each function saves a PNG and returns its path. Layers are drawn as blocks 1..L.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence

import numpy as np

from bertjax.plots.charts import draw_head_grid, pyplot, save_png

SERIES = (
  ("cls", "o-"),
  ("sep", "s-"),
  ("punct", "^-"),
  ("self", "x--"),
  ("prev", "<--"),
  ("next", ">--"),
)


def clark_by_layer(summary: Mapping, path) -> pathlib.Path:
  """Three panels: the mass on [CLS], [SEP], punctuation, self and neighbours by layer; the
  entropy by layer beside uniform attention's; the mass on [SEP] per head."""
  plt = pyplot()
  by, definition = summary["by_layer"], summary["definition"]
  averaged = (
    "per sentence, then over sentences" if definition["weighting"] == "document" else "over tokens"
  )
  layers = np.arange(1, len(by["sep"]) + 1)
  fig, axes = plt.subplots(1, 3, figsize=(17, 4.2))
  for key, style in SERIES:
    label = {"cls": "[CLS]", "sep": "[SEP]"}.get(key, key)
    if key == "punct" and definition["punctuation"] == "clark":
      label = '". ," (Clark)'
    axes[0].plot(layers, by[key], style, label=label)
  axes[0].set_ylabel(f"mean attention mass ({averaged}; mean of heads)", fontsize=8)
  axes[0].set_title("Where attention goes, by layer")
  axes[1].plot(layers, by["entropy"], "o-", color="tab:purple", label="attention")
  axes[1].plot(
    layers,
    np.full(len(layers), summary["uniform_entropy"]),
    "k:",
    label="uniform over the sentence",
  )
  axes[1].set_ylabel(f"mean entropy, nats ({averaged})", fontsize=8)
  axes[1].set_title("Attention entropy by layer")
  for ax in axes[:2]:
    ax.set_xlabel("layer")
    ax.set_xticks(layers)
    ax.legend(fontsize=8)
  draw_head_grid(
    axes[2],
    summary["sep"],
    title="Attention mass on [SEP], per head",
    cbar_label="mean mass on [SEP]",
    vmin=0,
    vmax=1,
  )
  return save_png(fig, path)


def probe_relations(table: Mapping, relations: Sequence[str], path) -> pathlib.Path:
  """Held-out accuracy of the best head (both directions) and of the best fixed offset, for
  all arcs and each of `relations` (`table`: relation -> `syntax.probe_results` entry)."""
  plt = pyplot()
  rels = [x for x in ("all", *relations) if x in table]
  x = np.arange(len(rels))
  fig, ax = plt.subplots(figsize=(max(8, 0.7 * len(rels) + 2), 4.5))
  for offset, key, label, colour in (
    (-0.27, "dep_to_head", "best head, dependent -> head", None),
    (0.0, "head_to_dep", "best head, head -> dependent", None),
    (0.27, "baseline", "best fixed offset", "gray"),
  ):
    ax.bar(x + offset, [table[k][key]["accuracy"] for k in rels], 0.27, color=colour, label=label)
  ax.set_xticks(x, [f"{k}\n({table[k]['count_eval']})" for k in rels], fontsize=7)
  ax.set_xlabel("relation (held-out arcs)")
  ax.set_ylabel("held-out accuracy")
  ax.set_ylim(0, 1)
  ax.set_title(
    "Attention-based dependency probe: best single head vs fixed offset "
    "(chosen on even sentences, scored on odd)"
  )
  ax.legend(fontsize=8)
  return save_png(fig, path)


def probe_head_grids(
  table: Mapping, relations: Sequence[str], path, *, most: int = 8
) -> pathlib.Path:
  """Each head's accuracy (dependent -> head, all sentences) for all arcs and the first
  relations, at most `most` panels."""
  plt = pyplot()
  shown = [x for x in ("all", *relations) if x in table][:most]
  cols = 4
  rows = max(1, -(-len(shown) // cols))
  fig, axes = plt.subplots(
    rows, cols, figsize=(17, 3.75 * rows), squeeze=False, constrained_layout=True
  )
  for ax, rel in zip(axes.ravel(), shown):
    draw_head_grid(
      ax,
      table[rel]["dep_to_head"]["per_head_in_sample"],
      title=f"{rel}: dependent -> head (n={table[rel]['count']})",
      cbar_label="accuracy",
      cmap="magma",
      vmin=0,
      vmax=1,
    )
    ax.title.set_fontsize(9)
    ax.tick_params(labelsize=7)
  for ax in axes.ravel()[len(shown) :]:
    ax.axis("off")
  fig.suptitle("Per-head accuracy of the attention probe (all sentences)")
  return save_png(fig, path)


def clark_figures(r: Mapping, relations: Sequence[str], out, stem: str) -> list[str]:
  """The three figures of the `what_bert_looks_at` experiment from its results `r`, saved in
  `out`: `STEM_special_tokens.png` (attention by layer), `_relations` and `_heads` (the
  dependency probe for `relations`).

  Returns:
    The file names.
  """
  out, table = pathlib.Path(out), r["probe"]["relations"]
  paths = (
    clark_by_layer(r["clark"], out / f"{stem}_special_tokens.png"),
    probe_relations(table, relations, out / f"{stem}_relations.png"),
    probe_head_grids(table, relations, out / f"{stem}_heads.png"),
  )
  return [p.name for p in paths]
