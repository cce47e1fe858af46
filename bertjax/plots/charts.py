"""Matplotlib figures (Agg backend) for the analyses; each function saves a PNG and returns its path.

Sizes are chosen for the report's page (about 1,070 px of content width at 120 dpi):
text stays at 7 pt or more (about 12 px) when a figure is shown at its natural size.
Layer axes take `first_layer`: the report numbers transformer blocks 1..L and the
embedding output 0, so a (layers, heads) grid of blocks is drawn with `first_layer=1`.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence

import numpy as np


def pyplot():
  """`matplotlib.pyplot` on the Agg backend (unless a backend was already chosen)."""
  import matplotlib

  matplotlib.use("Agg", force=False)
  import matplotlib.pyplot as plt

  return plt


def save_png(fig, path) -> pathlib.Path:
  """Saves `fig` as the PNG `path` (parents made; 120 dpi), closes it, returns the path."""
  path = pathlib.Path(path)
  if path.suffix.lower() != ".png":
    raise ValueError(f"path={str(path)!r} must end in .png")
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=120, bbox_inches="tight")
  pyplot().close(fig)
  return path


def _check_grid(values, name="values") -> np.ndarray:
  values = np.asarray(values, np.float64)
  if values.ndim != 2:
    raise ValueError(f"{name} shape {values.shape} must be (layers, heads)")
  return values


def _text_colour(rgba) -> str:
  """Black on light cells, white on dark ones (relative luminance, sRGB weights)."""
  r, g, b = rgba[:3]
  return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.45 else "white"


def _layer_ticks(ax, n: int, first_layer: int, axis: str = "y") -> None:
  ticks, labels = range(n), [str(first_layer + i) for i in range(n)]
  if axis == "y":
    ax.set_yticks(ticks, labels)
  else:
    ax.set_xticks(ticks, labels)


def draw_head_grid(
  ax,
  values,
  *,
  title: str = "",
  cbar_label: str = "",
  cmap: str = "viridis",
  center: float | None = None,
  span: float | None = None,
  vmin: float | None = None,
  vmax: float | None = None,
  annotate: bool = False,
  fmt: str = "{:.2g}",
  fontsize: float = 7,
  first_layer: int = 1,
):
  """Draws a layers x heads grid into `ax`, with its colour bar; returns the image.

  Args:
    ax: a matplotlib axes (one panel of a larger figure, or its only one).
    values: (layers, heads); NaN cells are left blank.
    title, cbar_label: texts.
    cmap: a matplotlib colormap name.
    center: a diverging scale symmetric about this value, `span` either side (default: the
      largest distance from it); cells beyond `span` saturate and the bar says so.
    vmin, vmax: the colour scale's ends, without `center` (default: the data's).
    annotate: print each value in its cell with `fmt` (`fontsize` pt), black on light
      cells and white on dark ones.
    first_layer: the number of the first row (default 1: the rows are blocks 1..L).
  """
  values = _check_grid(values)
  layers, heads = values.shape
  kw: dict = {"vmin": vmin, "vmax": vmax}
  extend = "neither"
  if center is not None:
    far = float(np.nanmax(np.abs(values - center))) if np.isfinite(values).any() else 0.0
    span = (far or 1.0) if span is None else span
    kw = {"vmin": center - span, "vmax": center + span}
    extend = "both" if far > span else "neither"
  im = ax.imshow(values, cmap=cmap, aspect="auto", **kw)
  ax.figure.colorbar(im, ax=ax, label=cbar_label, extend=extend)
  ax.set_xlabel("head")
  ax.set_ylabel("layer")
  ax.set_xticks(range(heads))
  _layer_ticks(ax, layers, first_layer)
  if annotate:
    for (l, h), v in np.ndenumerate(values):
      if np.isfinite(v):
        colour = _text_colour(im.cmap(im.norm(v)))
        ax.text(h, l, fmt.format(v), ha="center", va="center", fontsize=fontsize, color=colour)
  ax.set_title(title)
  return im


def head_heatmap(
  values,
  path,
  *,
  title: str = "",
  cbar_label: str = "",
  cmap: str = "viridis",
  center: float | None = None,
  annotate: bool | None = None,
  first_layer: int = 1,
) -> pathlib.Path:
  """A layers x heads heatmap (ablation effect, importance, special-token mass ...) in a
  figure of its own (`draw_head_grid` draws one into a panel).

  Args:
    values: (layers, heads); NaN cells are left blank.
    path: output .png path.
    title, cbar_label: texts.
    cmap: a matplotlib colormap name.
    center: if given, a diverging scale symmetric about this value.
    annotate: print each value in its cell, black on light cells and white on dark
      ones (default: when there are at most 144 cells).
    first_layer: the number of the first row (default 1: the rows are blocks 1..L).

  Returns:
    The saved path.
  """
  values = _check_grid(values)
  layers, heads = values.shape
  fig, ax = pyplot().subplots(figsize=(1.6 + 0.5 * heads, 1.0 + 0.42 * layers))
  draw_head_grid(
    ax,
    values,
    title=title,
    cbar_label=cbar_label,
    cmap=cmap,
    center=center,
    annotate=annotate or (annotate is None and values.size <= 144),
    first_layer=first_layer,
  )
  return save_png(fig, path)


def pattern_heatmap(
  codes,
  path,
  *,
  names: Sequence[str] | None = None,
  title: str = "Dominant attention pattern",
  first_layer: int = 1,
) -> pathlib.Path:
  """Categorical layers x heads map of pattern types (e.g. `PatternCounts.dominant`)."""
  plt = pyplot()
  from matplotlib.colors import ListedColormap

  if names is None:
    from bertjax.analysis.attention.patterns import PATTERN_TYPES as names
  codes = np.asarray(codes)
  if codes.ndim != 2:
    raise ValueError(f"codes shape {codes.shape} must be (layers, heads)")
  if codes.size and (codes.min() < 0 or codes.max() >= len(names)):
    raise ValueError(
      f"codes in [{codes.min()}, {codes.max()}] must index names of length {len(names)}"
    )
  colours = plt.get_cmap("tab10").colors[: len(names)]
  fig, ax = plt.subplots(figsize=(1.5 + 0.45 * codes.shape[1], 0.8 + 0.4 * codes.shape[0]))
  ax.imshow(codes, cmap=ListedColormap(colours), vmin=-0.5, vmax=len(names) - 0.5, aspect="auto")
  handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours]
  ax.legend(handles, names, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
  ax.set_xlabel("head")
  ax.set_ylabel("layer")
  ax.set_xticks(range(codes.shape[1]))
  _layer_ticks(ax, codes.shape[0], first_layer)
  ax.set_title(title)
  return save_png(fig, path)


def attention_grid(
  maps,
  tokens: Sequence[str],
  path,
  *,
  layers: Sequence[int] | None = None,
  heads: Sequence[int] | None = None,
  title: str = "",
) -> pathlib.Path:
  """Attention maps of one sentence, a grid of (layer rows, head columns).

  Args:
    maps: (layers, heads, T, T) for one sequence; only the first len(tokens) rows
      and columns are drawn.
    tokens: the token strings (tick labels).
    path: output .png path.
    layers, heads: subsets to draw (default all), as 0-based indices into `maps`; panels
      are titled by layer number (block index + 1) and head.
    title: figure title.
  """
  plt = pyplot()
  maps = np.asarray(maps, np.float64)
  if maps.ndim != 4 or maps.shape[-1] != maps.shape[-2]:
    raise ValueError(f"maps shape {maps.shape} must be (layers, heads, T, T)")
  n = len(tokens)
  if n > maps.shape[-1]:
    raise ValueError(f"{n} tokens but maps are {maps.shape[-1]} wide")
  layers = list(range(maps.shape[0])) if layers is None else list(layers)
  heads = list(range(maps.shape[1])) if heads is None else list(heads)
  fig, axes = plt.subplots(
    len(layers),
    len(heads),
    squeeze=False,
    figsize=(1.9 * len(heads) + 0.5, 1.9 * len(layers) + 0.5),
  )
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
      ax.set_title(f"L{l + 1} H{h}", fontsize=7)  # blocks 1..L, heads 0..H-1
  fig.suptitle(title)
  return save_png(fig, path)


def pruning_curve(
  curves: Mapping[str, tuple[Sequence[float], Sequence[float]]],
  path,
  *,
  ylabel: str = "metric",
  baseline: float | None = None,
  title: str = "Iterative head pruning",
) -> pathlib.Path:
  """Metric against the fraction of heads pruned; `curves` maps a label to (fractions, values)."""
  plt = pyplot()
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
  return save_png(fig, path)


def type_ratios(
  per_layer,
  path,
  *,
  names: Sequence[str] | None = None,
  title: str = "Attention pattern types per layer",
  first_layer: int = 1,
) -> pathlib.Path:
  """Stacked bars of pattern-type ratios per layer (`PatternCounts.per_layer`, (layers, types))."""
  plt = pyplot()
  if names is None:
    from bertjax.analysis.attention.patterns import PATTERN_TYPES as names
  ratios = _check_grid(per_layer, "per_layer")
  if ratios.shape[1] != len(names):
    raise ValueError(f"per_layer has {ratios.shape[1]} types, names has {len(names)}")
  fig, ax = plt.subplots(figsize=(2.5 + 0.55 * ratios.shape[0], 3.5))
  bottom = np.zeros(ratios.shape[0])
  for k, name in enumerate(names):
    ax.bar(range(ratios.shape[0]), ratios[:, k], bottom=bottom, label=name)
    bottom += ratios[:, k]
  _layer_ticks(ax, ratios.shape[0], first_layer, axis="x")
  ax.set_xlabel("layer")
  ax.set_ylabel("fraction of maps")
  ax.set_title(title)
  ax.legend(fontsize=8, bbox_to_anchor=(1.01, 1), loc="upper left")
  return save_png(fig, path)


def layer_curves(
  curves: Mapping[str, Sequence[float]],
  path,
  *,
  ylabel: str = "",
  title: str = "",
  first_layer: int = 0,
  xlabel: str | None = None,
) -> pathlib.Path:
  """One line per named per-layer curve, the x axis numbered from `first_layer`.

  Args:
    curves: `{name: (layers,)}`, all the same length.
    path: output .png path.
    ylabel, title: texts.
    first_layer: the number of the first value: 0 when it is the embedding output,
      1 when the curve holds blocks 1..L.
    xlabel: the x label (default: says what layer 0 is, when there is one).
  """
  plt = pyplot()
  if not curves:
    raise ValueError("curves is empty")
  arrays = {k: np.asarray(v, np.float64) for k, v in curves.items()}
  lengths = {k: v.shape for k, v in arrays.items()}
  if len(set(lengths.values())) != 1 or next(iter(arrays.values())).ndim != 1:
    raise ValueError(f"curves must be 1-D and of one length; shapes: {lengths}")
  n = len(next(iter(arrays.values())))
  fig, ax = plt.subplots(figsize=(6, 3.6))
  for name, values in arrays.items():
    ax.plot(first_layer + np.arange(n), values, marker="o", ms=3, label=name)
  ax.set_xticks(first_layer + np.arange(n))
  ax.set_xlabel(xlabel or ("layer (0 = embeddings)" if first_layer == 0 else "layer"))
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  return save_png(fig, path)


def _decade_ticks(top: float, linthresh: float, most: int = 5) -> list[float]:
  """0 and about `most` powers of ten up to `top` on each side, none inside the linear part."""
  lo, hi = int(np.floor(np.log10(linthresh))) + 1, int(np.ceil(np.log10(top)))
  step = max(1, -(-(hi - lo + 1) // most))
  decades = [10.0**k for k in range(hi, lo - 1, -step)]
  return sorted([0.0, *decades, *(-d for d in decades)])


def layer_bars(
  series: Mapping[str, Sequence[float]],
  path,
  *,
  ylabel: str,
  title: str,
  baseline: float | None = None,
  first_layer: int = 1,
) -> pathlib.Path:
  """Grouped bars per layer; a symmetric-log axis when the values span decades.

  On the symmetric-log axis only 0 and a few powers of ten are labelled (the small
  values inside the linear part would otherwise crowd 0 with overlapping labels), and
  every bar carries its value.

  Args:
    series: `{name: (layers,)}`.
    path: output .png path.
    ylabel, title: texts.
    baseline: a horizontal reference line (e.g. the intact model), or None.
    first_layer: the number of the first bar's layer (1: blocks 1..L).
  """
  plt = pyplot()
  from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

  values = {k: np.asarray(v, np.float64) for k, v in series.items()}
  if not values:
    raise ValueError("series is empty")
  layers = len(next(iter(values.values())))
  width = 0.8 / len(values)
  fig, ax = plt.subplots(figsize=(2.0 + 0.8 * layers, 3.8))
  log_axis = False
  small = [np.abs(v[v != 0]).min() for v in values.values() if (v != 0).any()]
  big = max(np.abs(v).max() for v in values.values())
  if small and big > 50 * min(small) and big > 1:
    log_axis = True
    linthresh = 10.0 ** np.floor(np.log10(max(min(small), big * 1e-4)))
    ax.set_yscale("symlog", linthresh=linthresh, linscale=0.5)
    ax.yaxis.set_major_locator(FixedLocator(_decade_ticks(big, linthresh)))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
  for i, (name, v) in enumerate(values.items()):
    x = np.arange(layers) + (i - (len(values) - 1) / 2) * width
    bars = ax.bar(x, v, width, label=name)
    if log_axis or layers <= 12:
      ax.bar_label(bars, labels=[f"{value:.2g}" for value in v], fontsize=7, padding=2)
  if baseline is not None:
    ax.axhline(baseline, color="grey", ls="--", lw=1, label="intact model")
  ax.axhline(0, color="black", lw=0.6)
  _layer_ticks(ax, layers, first_layer, axis="x")
  ax.set_xlabel("layer")
  ax.set_ylabel(ylabel + (" (symmetric log scale)" if log_axis else ""))
  ax.set_title(title)
  ax.grid(alpha=0.3, axis="y")
  ax.margins(y=0.12)
  ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
  return save_png(fig, path)


def attention_maps(
  panels: Sequence[tuple[str, np.ndarray, Sequence[str]]],
  path,
  *,
  columns: int = 2,
  title: str = "",
  max_labels: int = 40,
  panel_inches: float = 4.3,
) -> pathlib.Path:
  """Attention maps in rows of `columns`, each with its title, token labels and colour bar.

  Args:
    panels: `(title, (T, T) map, T tokens)` per map. A map with negative values
      (effective attention) gets a diverging scale centred on 0, others a 0-based one.
    path: output .png path.
    columns: maps per row (2 keeps the page width with readable token labels).
    title: the figure's title.
    max_labels: at most this many token labels per axis; longer sequences label every
      k-th token (the tick marks say which).
    panel_inches: each map's width; at 120 dpi, 4.3 inches is about 520 px.
  """
  plt = pyplot()
  if not panels:
    raise ValueError("panels is empty")
  columns = max(1, min(columns, len(panels)))
  rows = -(-len(panels) // columns)
  fig, axes = plt.subplots(
    rows,
    columns,
    squeeze=False,
    figsize=(panel_inches * columns + 0.6, (panel_inches + 0.5) * rows + (0.4 if title else 0)),
  )
  for ax in axes.ravel()[len(panels) :]:
    ax.axis("off")
  for ax, (name, grid, tokens) in zip(axes.ravel(), panels):
    grid = np.asarray(grid, np.float64)
    n = len(tokens)
    if grid.shape != (n, n):
      raise ValueError(f"panel {name!r}: map shape {grid.shape} does not match {n} tokens")
    top = max(float(np.abs(grid).max()), 1e-9)
    if grid.min() < -1e-6:
      im = ax.imshow(grid, cmap="RdBu_r", vmin=-top, vmax=top)
    else:
      im = ax.imshow(grid, cmap="Blues", vmin=0, vmax=top)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03).ax.tick_params(labelsize=7)
    step = max(1, -(-n // max_labels))
    ticks = list(range(0, n, step))
    size = 7 if n / step <= 30 else 6
    ax.set_xticks(ticks, [tokens[t] for t in ticks], rotation=90, fontsize=size)
    ax.set_yticks(ticks, [tokens[t] for t in ticks], fontsize=size)
    ax.set_xlabel("key" + (f" (one token in {step} labelled)" if step > 1 else ""), fontsize=8)
    ax.set_ylabel("query", fontsize=8)
    ax.set_title(name, fontsize=9)
  if title:
    fig.suptitle(title, fontsize=11)
  fig.tight_layout()
  return save_png(fig, path)


def method_ranks(
  stats: Mapping[str, Mapping[str, float]], chance_mrr: float, agreement, path, *, title: str = ""
) -> pathlib.Path:
  """Left: each attribution method's mean reciprocal rank and top-1 rate of a target token;
  right: the methods' mean Spearman agreement matrix."""
  plt = pyplot()
  names = list(stats)
  agree = np.asarray(agreement, float)
  # Constrained layout keeps the matrix's long method names clear of the bar panel.
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12.4, 4.8), layout="constrained")
  x = np.arange(len(names))
  ax1.bar(x - 0.2, [stats[k]["mrr"] for k in names], 0.4, label="mean reciprocal rank")
  ax1.bar(x + 0.2, [stats[k]["top1"] for k in names], 0.4, label="ranked first")
  ax1.axhline(chance_mrr, color="k", ls="--", lw=1, label="chance (MRR)")
  ax1.set_xticks(x, names, rotation=40, ha="right")
  ax1.set_ylim(0, 1.2)  # the legend sits above 1, where no bar reaches
  ax1.set_yticks(np.linspace(0, 1, 6))
  ax1.set_title(title)
  ax1.legend(fontsize=8, loc="upper center", ncols=3)
  im = ax2.imshow(agree, vmin=-1, vmax=1, cmap="RdBu_r")
  ax2.set_xticks(x, names, rotation=40, ha="right")
  ax2.set_yticks(x, names)
  for i in range(len(names)):
    for j in range(len(names)):
      if np.isfinite(agree[i, j]):
        ax2.text(
          j,
          i,
          f"{agree[i, j]:.2f}",
          ha="center",
          va="center",
          fontsize=7,
          color=_text_colour(im.cmap(im.norm(agree[i, j]))),
        )
  fig.colorbar(im, ax=ax2, label="Spearman (token scores)")
  ax2.set_title("Agreement between methods")
  return save_png(fig, path)


def patching_heatmaps(
  exact, approx, path, *, title: str = "", cbar_label: str = "share restored"
) -> pathlib.Path:
  """Exact and attribution patching of every (layer, head), side by side, on one colour scale
  (rows are layers 1..L, as in every other figure)."""
  plt = pyplot()
  exact, approx = _check_grid(exact, "exact"), _check_grid(approx, "approx")
  lim = float(np.nanmax(np.abs(np.concatenate([exact.ravel(), approx.ravel()])))) or 1.0
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
  for ax, values, name in (
    (axes[0], exact, "exact activation patching"),
    (axes[1], approx, "attribution patching (gradient)"),
  ):
    im = ax.imshow(values, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
    ax.set_xlabel("head")
    ax.set_xticks(range(values.shape[1]))
    _layer_ticks(ax, values.shape[0], 1)
    ax.set_ylabel("layer")
    ax.set_title(name)
    fig.colorbar(im, ax=ax, label=cbar_label)
  if title:
    fig.suptitle(title)
  return save_png(fig, path)
