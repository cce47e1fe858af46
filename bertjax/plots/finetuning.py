"""Figures of what fine-tuning does (Kovaleva et al. 2019): pattern types before and after,
heads and layers disabled, attention change, and pre-trained against random initialisation.

Each function saves a PNG and returns its path. Layers are drawn as blocks 1..L.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping

import numpy as np

from bertjax.plots.charts import draw_head_grid, pyplot, save_png

INITS = {"pretrained": ("pre-trained", "tab:blue"), "random": ("random init", "tab:orange")}


def pattern_types_before_after(before: Mapping, after: Mapping, path) -> pathlib.Path:
  """Stacked pattern-type shares per layer and overall, before and after fine-tuning
  (`patterns.PatternCounts.summary()` of each)."""
  plt = pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True, layout="constrained")
  for ax, (label, p) in zip(axes, (("pre-trained", before), ("fine-tuned", after))):
    ratios = np.vstack([p["per_layer"], np.asarray(p["overall"])[None]])
    x = np.arange(len(ratios))
    bottom = np.zeros(len(ratios))
    for k, name in enumerate(before["types"]):
      ax.bar(x, ratios[:, k], bottom=bottom, label=name, color=plt.get_cmap("tab10")(k))
      bottom += ratios[:, k]
    ax.set_xticks(x, [str(i + 1) for i in range(len(ratios) - 1)] + ["all"])
    ax.set_xlabel("layer")
    ax.set_title(f"{label} (repeated types {100 * p['repeated_share']:.0f}%)")
  axes[0].set_ylabel("fraction of attention maps")
  axes[1].legend(fontsize=7, bbox_to_anchor=(1.01, 1), loc="upper left")
  fig.suptitle("Attention pattern types per layer (Kovaleva et al. Fig. 2 style)")
  return save_png(fig, path)


def disabled_heads_and_layers(acc: Mapping[str, Mapping], path) -> pathlib.Path:
  """The accuracy change with each head disabled ("uniform") as a grid, and with each layer
  disabled in every mode as bars (`acc`: mode -> `AblationResult.improvements()`, with
  "uniform" holding heads, layers and block skips and "scale" layers)."""
  plt = pyplot()
  u = acc["uniform"]
  depth = len(u["delta_layers"])  # 12 layers of 12 heads need a taller panel than 6
  fig, (a0, a1) = plt.subplots(
    1,
    2,
    figsize=(11.5, max(3.9, 1.3 + 0.33 * depth)),
    gridspec_kw={"width_ratios": [3, 2]},
    layout="constrained",
  )
  d = 100 * np.asarray(u["delta_heads"])
  # One badly hurt head would wash out the rest: saturate beyond the 95th percentile.
  span = max(float(np.percentile(np.abs(d), 95)), 0.5)
  draw_head_grid(
    a0,
    d,
    title=f"one head disabled (uniform patterns); intact accuracy {100 * u['baseline']:.1f}%",
    cbar_label="accuracy change (points)",
    cmap="RdBu",
    center=0.0,
    span=span,
    annotate=True,
    fmt="{:+.1f}",
    fontsize=6,
  )
  a0.title.set_fontsize(9)
  bars = [
    ("all heads uniform", u["delta_layers"]),
    ("all heads zeroed (scale)", acc["scale"]["delta_layers"]),
    ("block skipped", u["delta_layer_skips"]),
  ]
  width = 0.8 / len(bars)
  for k, (label, values) in enumerate(bars):
    a1.bar(np.arange(depth) + k * width, 100 * np.asarray(values), width, label=label)
  a1.axhline(0, color="k", lw=0.8)
  a1.set_xticks(np.arange(depth) + width * (len(bars) - 1) / 2, [str(i + 1) for i in range(depth)])
  a1.set_xlabel("layer disabled")
  a1.set_ylabel("accuracy change (points)")
  a1.set_title("one layer disabled", fontsize=9)
  a1.grid(axis="y", alpha=0.3)
  a1.legend(fontsize=7)
  fig.suptitle(
    "Disabling heads and layers of the fine-tuned classifier "
    "(above 0 / blue = better than intact; Kovaleva et al. Figs. 6-7)"
  )
  return save_png(fig, path)


def attention_change(cosine, cka, path) -> pathlib.Path:
  """Each head's cosine of attention maps before vs after fine-tuning as a grid, and by layer
  the heads' mean beside the hidden states' CKA (`cka`: embeddings first)."""
  plt = pyplot()
  cosine = np.asarray(cosine, np.float64)
  fig, (a0, a1) = plt.subplots(
    1,
    2,
    figsize=(11, max(3.8, 1.2 + 0.33 * len(cosine))),
    gridspec_kw={"width_ratios": [3, 2]},
    layout="constrained",
  )
  draw_head_grid(
    a0,
    cosine,
    title="cosine of attention maps, pre-trained vs fine-tuned",
    cbar_label="cosine similarity",
    vmin=min(0.5, float(cosine.min())),
    vmax=1.0,
    annotate=True,
    fmt="{:.2f}",
    fontsize=5.5,
  )
  a0.title.set_fontsize(9)
  layers = np.arange(cosine.shape[0])
  a1.plot(layers, cosine.mean(-1), marker="o", label="attention-map cosine (mean of heads)")
  a1.plot(layers, np.asarray(cka)[1:], marker="s", label="CKA of the layer's output")
  a1.set_xticks(layers, [str(i + 1) for i in layers])
  a1.set_xlabel("layer")
  a1.set_ylabel("similarity")
  a1.set_title(f"per layer (embeddings' CKA {float(cka[0]):.3f})", fontsize=9)
  a1.grid(alpha=0.3)
  a1.legend(fontsize=7)
  fig.suptitle("What fine-tuning changes (Kovaleva et al. Fig. 3)")
  return save_png(fig, path)


def init_learning_curves(results: Mapping[str, Mapping], path) -> pathlib.Path:
  """Dev accuracy against steps for every run, a panel per task (`results`: task ->
  {"runs": [{init: {"curve": [{"step", "dev"}], "best_step", "dev"}}], "summary": {"majority",
  "lexical_baseline"}}, init one of "pretrained", "random")."""
  plt = pyplot()
  fig, axes = plt.subplots(
    1, len(results), figsize=(3.4 * len(results), 3.3), layout="constrained", squeeze=False
  )
  for ax, (task, res) in zip(axes[0], results.items()):
    for run in res["runs"]:
      for init, (label, colour) in INITS.items():
        c = run[init]["curve"]
        ax.plot(
          [p["step"] for p in c],
          [100 * p["dev"] for p in c],
          color=colour,
          alpha=0.8,
          lw=1.2,
          label=label if run is res["runs"][0] else None,
        )
        ax.plot(run[init]["best_step"], 100 * run[init]["dev"], "o", ms=3, color=colour)
    s = res["summary"]
    ax.axhline(100 * s["majority"], color="grey", ls="--", lw=1, label="majority")
    ax.axhline(100 * s["lexical_baseline"], color="grey", ls=":", lw=1, label="lexical baseline")
    ax.set_title(task, fontsize=10)
    ax.set_xlabel("fine-tuning step")
    ax.grid(alpha=0.3)
  axes[0, 0].set_ylabel("dev accuracy (%)")
  axes[0, 0].legend(fontsize=7)
  fig.suptitle("Learning curves, one line per seed (dots: the best-dev checkpoint)")
  return save_png(fig, path)


def init_scores(results: Mapping[str, Mapping], path) -> pathlib.Path:
  """Test accuracy per task: majority, lexical baseline, random init and pre-trained (error
  bars: the seeds' spread), with random init's share of the gain over majority (`results`:
  task -> {"summary": {"majority", "lexical_baseline", "random", "random_sd", "pretrained",
  "pretrained_sd", "gain_ratio"}})."""
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(8, 3.8), layout="constrained")
  bars = [
    ("majority", "lightgrey", "majority", None),
    ("lexical baseline", "darkgrey", "lexical_baseline", None),
    (*INITS["random"], "random", "random_sd"),
    (*INITS["pretrained"], "pretrained", "pretrained_sd"),
  ]
  x = np.arange(len(results))
  width = 0.8 / len(bars)
  for k, (label, colour, key, sd) in enumerate(bars):
    vals = [100 * r["summary"][key] for r in results.values()]
    err = None if sd is None else [100 * r["summary"][sd] for r in results.values()]
    ax.bar(x + k * width, vals, width, yerr=err, capsize=2, label=label, color=colour)
  for i, r in enumerate(results.values()):
    ratio = r["summary"]["gain_ratio"]
    ax.text(
      i + 0.4, 102, f"r={ratio:.2f}" if ratio is not None else "r=n/a", ha="center", fontsize=8
    )
  ax.set_xticks(x + width * (len(bars) - 1) / 2, list(results))
  ax.set_ylim(0, 108)
  ax.set_ylabel("test accuracy (%)")
  ax.legend(fontsize=7, loc="lower left")
  ax.set_title(
    "Pre-trained vs random initialisation at equal budgets (Kovaleva et al. 2019); "
    "r = random's share of the gain over majority",
    fontsize=9,
  )
  return save_png(fig, path)
