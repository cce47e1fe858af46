"""Matplotlib figures (Agg backend) for the analyses; each function saves a PNG and returns its path."""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence

import numpy as np


def _plt():
  import matplotlib

  matplotlib.use("Agg", force=False)
  import matplotlib.pyplot as plt

  return plt


def _save(fig, path) -> pathlib.Path:
  path = pathlib.Path(path)
  if path.suffix.lower() != ".png":
    raise ValueError(f"path={str(path)!r} must end in .png")
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=120, bbox_inches="tight")
  _plt().close(fig)
  return path


def _check_grid(values, name="values") -> np.ndarray:
  values = np.asarray(values, np.float64)
  if values.ndim != 2:
    raise ValueError(f"{name} shape {values.shape} must be (layers, heads)")
  return values


def head_heatmap(values, path, *, title: str = "", cbar_label: str = "", cmap: str = "viridis",
                 center: float | None = None, annotate: bool | None = None) -> pathlib.Path:
  """A layers x heads heatmap (ablation effect, importance, special-token mass ...).

  Args:
    values: (layers, heads); NaN cells are left blank.
    path: output .png path.
    title, cbar_label: texts.
    cmap: a matplotlib colormap name.
    center: if given, a diverging scale symmetric about this value.
    annotate: print each value in its cell (default: when there are at most 144 cells).

  Returns:
    The saved path.
  """
  plt = _plt()
  values = _check_grid(values)
  layers, heads = values.shape
  fig, ax = plt.subplots(figsize=(1.0 + 0.45 * heads, 0.8 + 0.4 * layers))
  kw = {}
  if center is not None:
    span = np.nanmax(np.abs(values - center)) or 1.0
    kw = {"vmin": center - span, "vmax": center + span}
  im = ax.imshow(values, cmap=cmap, aspect="auto", **kw)
  fig.colorbar(im, ax=ax, label=cbar_label)
  ax.set_xlabel("head")
  ax.set_ylabel("layer")
  ax.set_xticks(range(heads))
  ax.set_yticks(range(layers))
  if annotate or (annotate is None and values.size <= 144):
    for (l, h), v in np.ndenumerate(values):
      if np.isfinite(v):
        ax.text(h, l, f"{v:.2g}", ha="center", va="center", fontsize=6, color="w")
  ax.set_title(title)
  return _save(fig, path)


def pattern_heatmap(codes, path, *, names: Sequence[str] | None = None,
                    title: str = "Dominant attention pattern") -> pathlib.Path:
  """Categorical layers x heads map of pattern types (e.g. `PatternCounts.dominant`)."""
  plt = _plt()
  from matplotlib.colors import ListedColormap

  if names is None:
    from bertjax.analysis.attention import PATTERN_TYPES as names
  codes = np.asarray(codes)
  if codes.ndim != 2:
    raise ValueError(f"codes shape {codes.shape} must be (layers, heads)")
  if codes.size and (codes.min() < 0 or codes.max() >= len(names)):
    raise ValueError(f"codes in [{codes.min()}, {codes.max()}] must index names of length "
                     f"{len(names)}")
  colours = plt.get_cmap("tab10").colors[:len(names)]
  fig, ax = plt.subplots(figsize=(1.5 + 0.45 * codes.shape[1], 0.8 + 0.4 * codes.shape[0]))
  ax.imshow(codes, cmap=ListedColormap(colours), vmin=-0.5, vmax=len(names) - 0.5, aspect="auto")
  handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours]
  ax.legend(handles, names, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7)
  ax.set_xlabel("head")
  ax.set_ylabel("layer")
  ax.set_title(title)
  return _save(fig, path)


def attention_grid(maps, tokens: Sequence[str], path, *, layers: Sequence[int] | None = None,
                   heads: Sequence[int] | None = None, title: str = "") -> pathlib.Path:
  """Attention maps of one sentence, a grid of (layer rows, head columns).

  Args:
    maps: (layers, heads, T, T) for one sequence; only the first len(tokens) rows
      and columns are drawn.
    tokens: the token strings (tick labels).
    path: output .png path.
    layers, heads: subsets to draw (default all).
    title: figure title.
  """
  plt = _plt()
  maps = np.asarray(maps, np.float64)
  if maps.ndim != 4 or maps.shape[-1] != maps.shape[-2]:
    raise ValueError(f"maps shape {maps.shape} must be (layers, heads, T, T)")
  n = len(tokens)
  if n > maps.shape[-1]:
    raise ValueError(f"{n} tokens but maps are {maps.shape[-1]} wide")
  layers = list(range(maps.shape[0])) if layers is None else list(layers)
  heads = list(range(maps.shape[1])) if heads is None else list(heads)
  fig, axes = plt.subplots(len(layers), len(heads), squeeze=False,
                           figsize=(1.9 * len(heads) + 0.5, 1.9 * len(layers) + 0.5))
  label = n <= 24
  for r, l in enumerate(layers):
    for c, h in enumerate(heads):
      ax = axes[r, c]
      ax.imshow(maps[l, h, :n, :n], cmap="Blues", vmin=0, vmax=1)
      ax.set_xticks(range(n) if label and r == len(layers) - 1 else [])
      ax.set_yticks(range(n) if label and c == 0 else [])
      if label and r == len(layers) - 1:
        ax.set_xticklabels(tokens, rotation=90, fontsize=5)
      if label and c == 0:
        ax.set_yticklabels(tokens, fontsize=5)
      ax.set_title(f"L{l} H{h}", fontsize=7)
  fig.suptitle(title)
  return _save(fig, path)


def pruning_curve(curves: Mapping[str, tuple[Sequence[float], Sequence[float]]], path, *,
                  ylabel: str = "metric", baseline: float | None = None,
                  title: str = "Iterative head pruning") -> pathlib.Path:
  """Metric against the fraction of heads pruned; `curves` maps a label to (fractions, values)."""
  plt = _plt()
  if not curves:
    raise ValueError("curves is empty")
  fig, ax = plt.subplots(figsize=(5, 3.5))
  for label, (x, y) in curves.items():
    x, y = np.asarray(x), np.asarray(y)
    if x.shape != y.shape:
      raise ValueError(f"curve {label!r}: fractions shape {x.shape} != values shape {y.shape}")
    ax.plot(100 * x, y, marker="o", ms=3, label=label)
  if baseline is not None:
    ax.axhline(baseline, color="grey", ls="--", lw=1, label="unpruned")
  ax.set_xlabel("heads pruned (%)")
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  ax.legend(fontsize=7)
  ax.grid(alpha=0.3)
  return _save(fig, path)


def type_ratios(per_layer, path, *, names: Sequence[str] | None = None,
                title: str = "Attention pattern types per layer") -> pathlib.Path:
  """Stacked bars of pattern-type ratios per layer (`PatternCounts.per_layer`, (layers, types))."""
  plt = _plt()
  if names is None:
    from bertjax.analysis.attention import PATTERN_TYPES as names
  ratios = _check_grid(per_layer, "per_layer")
  if ratios.shape[1] != len(names):
    raise ValueError(f"per_layer has {ratios.shape[1]} types, names has {len(names)}")
  fig, ax = plt.subplots(figsize=(1.5 + 0.5 * ratios.shape[0], 3.5))
  bottom = np.zeros(ratios.shape[0])
  for k, name in enumerate(names):
    ax.bar(range(ratios.shape[0]), ratios[:, k], bottom=bottom, label=name)
    bottom += ratios[:, k]
  ax.set_xlabel("layer")
  ax.set_ylabel("fraction of maps")
  ax.set_title(title)
  ax.legend(fontsize=7, bbox_to_anchor=(1.01, 1), loc="upper left")
  return _save(fig, path)
