"""Figures of representation geometry by layer (Ethayarajh 2019;
`bertjax.analysis.representations.geometry.ethayarajh_measures`).

Each function takes the per-layer dict of `ethayarajh_measures` (layer 0 = the embeddings),
saves a PNG and returns its path.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping

import numpy as np

from bertjax.analysis.representations.geometry import MEV_DEFINITIONS
from bertjax.plots.charts import pyplot, save_png


def contextuality_by_layer(
  m: Mapping, path, *, definition: str = "truncated_svd", title: str = ""
) -> pathlib.Path:
  """Three panels by layer: anisotropy raw and mean-centred; the raw measures (self- and
  intra-sentence similarity, MEV of every definition) over the anisotropy baseline; and the
  anisotropy-adjusted ones (MEV of `definition`)."""
  plt = pyplot()
  layers = np.arange(len(m["anisotropy"]))
  fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
  ax = axes[0]
  ax.plot(layers, m["anisotropy"], marker="o", label="random-pair cosine (raw)")
  ax.plot(layers, m["anisotropy_centered"], marker="s", label="after mean-centring")
  ax.axhline(0, color="k", lw=0.8)
  ax.set(title="Anisotropy", ylabel="mean cosine similarity")
  ax = axes[1]
  ax.plot(layers, m["self_similarity"], marker="o", label="self-similarity")
  ax.plot(layers, m["intra_sentence"], marker="s", label="intra-sentence similarity")
  for d, style in zip(MEV_DEFINITIONS, ("^-", "v:", "d:")):
    ax.plot(layers, m[f"mev_{d}"], style, label=f"MEV, {d}")
  ax.plot(layers, m["anisotropy"], ls="--", color="gray", label="anisotropy baseline")
  ax.set(title="Raw measures", ylabel="cosine / variance share", ylim=(-0.03, 1.35))
  ax = axes[2]
  ax.plot(layers, m["self_similarity_adjusted"], marker="o", label="self-similarity - baseline")
  ax.plot(layers, m["intra_sentence_adjusted"], marker="s", label="intra-sentence - baseline")
  ax.plot(
    layers,
    m[f"mev_{definition}_adjusted"],
    marker="^",
    label=f"MEV - random-word MEV ({definition})",
  )
  ax.axhline(0, color="k", lw=0.8)
  ax.set(title="Anisotropy-adjusted", ylabel="adjusted value")
  for ax in axes:
    ax.set(xlabel="layer (0 = embeddings)", xticks=layers)
    ax.grid(alpha=0.3)
    middle = ax is axes[1]
    ax.legend(fontsize=7, ncol=2 if middle else 1, loc="upper center" if middle else "best")
  fig.suptitle(title or "Ethayarajh (2019) measures by layer")
  return save_png(fig, path)


def centred_similarity(m: Mapping, path) -> pathlib.Path:
  """Self- and intra-sentence similarity of mean-centred vectors by layer."""
  plt = pyplot()
  layers = np.arange(len(m["anisotropy"]))
  fig, ax = plt.subplots(figsize=(6.5, 4.2))
  for key, label in (
    ("self_similarity_centered", "self-similarity"),
    ("intra_sentence_centered", "intra-sentence similarity"),
  ):
    ax.plot(layers, m[key], marker="o", label=label)
  ax.axhline(0, color="k", lw=0.8)
  ax.set(
    xlabel="layer (0 = embeddings)",
    ylabel="mean cosine (mean-centred vectors)",
    title="Self- and intra-sentence similarity after mean-centring",
    xticks=layers,
  )
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  return save_png(fig, path)


def anisotropy_figures(
  m: Mapping, out, stem: str, *, model_name: str, definition: str
) -> list[str]:
  """The two figures of the `anisotropy` experiment from its measures `m`, saved in `out`:
  `STEM_by_layer.png` (`contextuality_by_layer`, with the MEV `definition`) and
  `STEM_centred.png` (`centred_similarity`).

  Returns:
    The file names.
  """
  out = pathlib.Path(out)
  title = f"Ethayarajh (2019) measures by layer: {model_name}, UD EWT dev words"
  paths = (
    contextuality_by_layer(m, out / f"{stem}_by_layer.png", definition=definition, title=title),
    centred_similarity(m, out / f"{stem}_centred.png"),
  )
  return [p.name for p in paths]
