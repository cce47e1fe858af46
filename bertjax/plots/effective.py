"""Figures of raw against effective attention (Brunner et al. 2020;
`bertjax.analysis.attention.effective`).

`head_analysis` results are dicts of (passages, layers, heads) arrays keyed `raw_cls`,
`effective_sep`, `null_dim`, `corr`, ...; each function saves a PNG and returns its path.
Layers are drawn as blocks 1..L, heads as 0..H-1.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping

import numpy as np

from bertjax.analysis.attention.effective import KINDS, expected_null_dim
from bertjax.plots.charts import pyplot, save_png

CLASSES = {"cls": "[CLS]", "sep": "[SEP]", "punct": "punctuation"}


def null_space_by_length(
  sweep: Mapping[int, Mapping], head_dim: int, path, *, title: str = ""
) -> pathlib.Path:
  """The left null space's dimension against the sequence length, with max(0, n - d_head),
  and the raw/effective correlation by layer against the length (`sweep`: length ->
  `head_analysis` result)."""
  plt = pyplot()
  lengths = sorted(sweep)
  depth = np.shape(sweep[lengths[0]]["corr"])[1]
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
  ax = axes[0]
  dims = [np.ravel(sweep[n]["null_dim"]) for n in lengths]
  ax.plot(lengths, [d.mean() for d in dims], "o", ms=7, label="measured (mean over heads)")
  ax.vlines(
    lengths,
    [d.min() for d in dims],
    [d.max() for d in dims],
    color="tab:blue",
    label="min-max over heads and passages",
  )
  grid = np.arange(0, max(lengths) + 1)
  ax.plot(
    grid,
    [expected_null_dim(n, head_dim) for n in grid],
    "k--",
    lw=1,
    label=f"max(0, n - d_head), d_head = {head_dim}",
  )
  ax.set(
    xlabel="sequence length n (tokens)",
    ylabel="dim of left null space of T_h",
    title="Null-space dimension: non-identifiable when n > d_head",
  )
  ax.legend(fontsize=8)
  ax = axes[1]
  for d in range(depth):
    ax.plot(
      lengths,
      [np.asarray(sweep[n]["corr"])[:, d].mean() for n in lengths],
      marker="o",
      label=f"layer {d + 1}",
    )
  ax.axvline(head_dim, color="gray", ls=":", label="n = d_head")
  ax.set(
    xlabel="sequence length n (tokens)",
    ylabel="Pearson r (mean over heads, passages)",
    title="Correlation of raw and effective attention vs length",
  )
  ax.legend(fontsize=7, ncol=2)
  for ax in axes:
    ax.grid(alpha=0.3)
  fig.suptitle(title or "Brunner et al. (2020): identifiability against length")
  return save_png(fig, path)


def class_mass_by_layer(
  analysis: Mapping, statistics: Mapping, path, *, title: str = ""
) -> pathlib.Path:
  """Raw and effective attention mass on [CLS], [SEP] and punctuation by layer, and the
  correlation of the attention a token receives with its position (`statistics`:
  `effective_attention_statistics`)."""
  plt = pyplot()
  layers = np.arange(1, np.shape(analysis["raw_cls"])[1] + 1)
  fig, axes = plt.subplots(1, 4, figsize=(19, 4.3), layout="constrained")
  for ax, c in zip(axes, CLASSES):
    for kind, style in zip(KINDS, ("-o", "--s")):
      ax.plot(layers, np.mean(analysis[f"{kind}_{c}"], (0, 2)), style, label=kind)
    ax.axhline(0, color="k", lw=0.8)
    ax.set(xlabel="layer", title=f"attention mass on {CLASSES[c]}", xticks=layers)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  axes[0].set_ylabel("mean mass per query (mean over heads)")
  ax = axes[3]
  for kind, style in zip(KINDS, ("-o", "--s")):
    ax.plot(layers, np.nanmean(statistics[kind]["position_corr"], -1), style, label=kind)
  ax.axhline(0, color="k", lw=0.8)
  ax.set(
    xlabel="layer",
    ylabel="Pearson r (mean over heads)",
    xticks=layers,
    title="corr(attention received, token position)",
  )
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.suptitle(title or "Raw vs effective attention by layer")
  return save_png(fig, path)


def class_mass_by_head(analysis: Mapping, path) -> pathlib.Path:
  """Each head's mass on each token class, raw against effective (Brunner Fig. 3b/c)."""
  plt = pyplot()
  fig, axes = plt.subplots(1, 3, figsize=(15, 4.5), layout="constrained")
  for ax, c in zip(axes, CLASSES):
    raw = np.mean(analysis[f"raw_{c}"], 0)  # (layers, heads)
    eff = np.mean(analysis[f"effective_{c}"], 0)
    layers = np.repeat(np.arange(1, raw.shape[0] + 1), raw.shape[1])
    sc = ax.scatter(raw.ravel(), eff.ravel(), c=layers, cmap="viridis", s=18)
    top, low = max(raw.max(), eff.max(), 1e-3), min(0, eff.min())
    ax.plot([low, top], [low, top], "k--", lw=0.8, label="y = x")
    ax.set(
      xlabel="raw attention mass",
      ylabel="effective attention mass",
      title=f"mass on {CLASSES[c]}, one point per head",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
  fig.colorbar(sc, ax=axes, label="layer")
  fig.suptitle("Each head's attention to token classes, raw vs effective (Brunner Fig. 3b/c)")
  return save_png(fig, path)


def example_maps(raw, effective, layer: int, head: int, path) -> pathlib.Path:
  """One head's raw and effective (n, n) maps on one passage, and the attention each position
  receives (`layer`: the block, 0-based; drawn as layer + 1)."""
  plt = pyplot()
  raw, effective = np.asarray(raw), np.asarray(effective)
  fig, axes = plt.subplots(1, 3, figsize=(16, 4.5), layout="constrained")
  top = float(np.abs(effective).max())
  im = axes[0].imshow(raw, cmap="Blues", vmin=0)
  fig.colorbar(im, ax=axes[0], shrink=0.8, label="attention weight")
  im = axes[1].imshow(effective, cmap="RdBu_r", vmin=-top, vmax=top)
  fig.colorbar(im, ax=axes[1], shrink=0.8, label="effective weight")
  axes[0].set_title(f"raw, layer {layer + 1}, head {head}")
  axes[1].set_title("effective (negative = red)")
  for ax in axes[:2]:
    ax.set(xlabel="key position", ylabel="query position")
  for kind, m in zip(KINDS, (raw, effective)):
    axes[2].plot(m.mean(0), label=kind)
  axes[2].set(
    xlabel="key position ([CLS] = 0, [SEP] = last)",
    ylabel="mean attention received",
    title="attention received by each position",
  )
  axes[2].grid(alpha=0.3)
  axes[2].legend(fontsize=8)
  fig.suptitle(f"One passage of {len(raw)} tokens; the head with the most raw [CLS]+[SEP] mass")
  return save_png(fig, path)


def effective_attention_figures(
  sweep, analysis, statistics, example, out, stem: str, *, model: str, head_dim: int
) -> list[str]:
  """The four figures of the `effective_attention` experiment, saved in `out` as
  `STEM_null_space.png` (`null_space_by_length` of `sweep`), `_special` (`class_mass_by_layer`
  of `analysis` and `statistics`), `_heads` and `_example` (`example_maps(**example)`).

  Returns:
    The file names.
  """
  out = pathlib.Path(out)
  n = np.shape(analysis["raw_cls"])[0]
  paths = (
    null_space_by_length(
      sweep, head_dim, out / f"{stem}_null_space.png", title=f"Brunner et al. (2020) on {model}"
    ),
    class_mass_by_layer(
      analysis,
      statistics,
      out / f"{stem}_special.png",
      title=f"Raw vs effective attention by layer ({model}, {n} passages of "
      f"{analysis['length']} tokens)",
    ),
    class_mass_by_head(analysis, out / f"{stem}_heads.png"),
    example_maps(**example, path=out / f"{stem}_example.png"),
  )
  return [p.name for p in paths]
