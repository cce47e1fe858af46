"""The report's PNG figures (`write_figures`), drawn by `bertjax.plots.charts` from the numbers of
`report.json`, one helper per section.

Figures are drawn to be read at the page's width (about 1,070 px); layer axes number the
transformer blocks 1..L and the embedding output 0 (`report.LAYER_NUMBERING`).
"""

from __future__ import annotations

import pathlib

import numpy as np

from bertjax.plots import charts
from bertjax.plots import circuits as circuit_plots
from bertjax.plots import probing as probing_plots

Figures = dict[str, pathlib.Path]  # figure key -> the PNG written


def _clark_figures(r: dict, out: pathlib.Path) -> Figures:
  clark = r["clark"]
  layer = lambda name: clark["by_layer"][name]
  return {
    "clark_layers": charts.layer_curves(
      {"[CLS]": layer("cls"), "[SEP]": layer("sep"), "punctuation": layer("punct")},
      out / "clark_layers.png",
      ylabel="mean attention mass",
      first_layer=1,
      title="Attention to special tokens and punctuation (mean over heads)",
    ),
    "entropy_layers": charts.layer_curves(
      {"mean entropy": layer("entropy")},
      out / "entropy_layers.png",
      ylabel="nats",
      first_layer=1,
      title="Attention entropy by layer (mean over heads)",
    ),
    "entropy_heads": charts.head_heatmap(
      clark["entropy"],
      out / "entropy_heads.png",
      title="Attention entropy",
      cbar_label="nats",
      first_layer=1,
    ),
  }


def _pattern_figures(r: dict, out: pathlib.Path) -> Figures:
  pat = r["patterns"]
  figs = {
    "pattern_layers": charts.type_ratios(
      pat["per_layer"], out / "pattern_layers.png", first_layer=1
    ),
    "pattern_heads": charts.pattern_heatmap(
      pat["dominant"],
      out / "pattern_heads.png",
      title="Most frequent pattern of each head",
      first_layer=1,
    ),
  }
  if pat["examples"]:
    figs["pattern_examples"] = charts.attention_maps(
      [
        (f"{name}: layer {e['layer']}, head {e['head']}", e["map"], e["tokens"])
        for name, e in pat["examples"].items()
      ],
      out / "pattern_examples.png",
      columns=2,
      title="One example map of each pattern type found",
    )
  return figs


def _task_figures(r: dict, out: pathlib.Path) -> Figures:
  task = r["task"]
  return {
    "task_layers": charts.layer_curves(
      {
        "held-out accuracy": task["probe_accuracy_by_layer"],
        "majority class": [task["majority_accuracy"]] * len(task["probe_accuracy_by_layer"]),
      },
      out / "task_layers.png",
      ylabel="accuracy",
      first_layer=0,
      title="Negation probe on the mean-pooled states of each layer",
    )
  }


def _ablation_figures(r: dict, out: pathlib.Path) -> Figures:
  ab = r["ablation"]
  return {
    "ablation_heads": charts.head_heatmap(
      np.asarray(ab["head_loss"]) - ab["baseline_loss"],
      out / "ablation_heads.png",
      title="Held-out loss change when one head is ablated",
      cbar_label="delta cross-entropy",
      cmap="RdBu_r",
      center=0.0,
      annotate=False,
      first_layer=1,
    ),
    "ablation_layers": charts.layer_bars(
      {
        "all heads of the layer masked": np.asarray(ab["layer_heads_loss"]) - ab["baseline_loss"],
        "whole layer skipped": np.asarray(ab["layer_skip_loss"]) - ab["baseline_loss"],
      },
      out / "ablation_layers.png",
      ylabel="delta held-out cross-entropy",
      title="Layer ablation: loss change",
    ),
    "ablation_layers_acc": charts.layer_bars(
      {
        "all heads of the layer masked": ab["layer_heads_accuracy"],
        "whole layer skipped": ab["layer_skip_accuracy"],
      },
      out / "ablation_layers_acc.png",
      ylabel="held-out accuracy",
      title="Layer ablation: accuracy",
      baseline=ab["baseline_accuracy"],
    ),
  }


def _pruning_figures(r: dict, out: pathlib.Path) -> Figures:
  ab = r["ablation"]
  return {
    "importance": charts.head_heatmap(
      ab["importance"],
      out / "importance.png",
      title="Head importance (Michel et al., layer-normalised)",
      cbar_label="importance",
      cmap="magma",
      first_layer=1,
    ),
    "pruning": charts.pruning_curve(
      {"held-out accuracy": (ab["pruning_fraction"], ab["pruning_accuracy"])},
      out / "pruning.png",
      ylabel="accuracy",
      baseline=ab["baseline_accuracy"],
      title="Iterative pruning by importance",
    ),
    "pruning_loss": charts.pruning_curve(
      {"held-out cross-entropy": (ab["pruning_fraction"], ab["pruning_loss"])},
      out / "pruning_loss.png",
      ylabel="cross-entropy",
      baseline=ab["baseline_loss"],
      title="Iterative pruning by importance: loss",
    ),
  }


def _anisotropy_figures(r: dict, out: pathlib.Path) -> Figures:
  an = r["anisotropy"]
  return {
    "anisotropy": charts.layer_curves(
      {"raw": an["anisotropy"], "mean-centred": an["anisotropy_centered"]},
      out / "anisotropy.png",
      ylabel="mean cosine of random token pairs",
      first_layer=0,
      title="Anisotropy by layer",
    )
  }


def _pos_figures(r: dict, out: pathlib.Path) -> Figures:
  pos = r["pos"]
  if not pos.get("available"):
    return {}
  return {
    "pos": probing_plots.plot_probing(
      pos["accuracy"], out / "pos.png", pos["control_accuracy"], task_name="UPOS"
    )
  }


def _effective_figures(r: dict, out: pathlib.Path) -> Figures:
  eff = r["effective"]
  panels = []
  for e in eff["examples"]:
    panels.append((f"layer {e['layer']}, head {e['head']}: raw", e["raw"], eff["example_tokens"]))
    panels.append(
      (f"layer {e['layer']}, head {e['head']}: effective", e["effective"], eff["example_tokens"])
    )
  return {
    "effective": charts.attention_maps(
      panels, out / "effective.png", columns=2, title="Raw vs effective attention (one passage)"
    )
  }


def _attribution_figures(r: dict, out: pathlib.Path) -> Figures:
  attrib = r.get("attribution")
  if not (attrib and attrib.get("available")):
    return {}
  cues, patch = attrib["cues"], attrib["patching"]
  return {
    "attribution_methods": charts.method_ranks(
      cues["stats"],
      cues["chance"]["mrr"],
      cues["agreement"]["spearman"],
      out / "attribution_methods.png",
      title=f"Where each method puts the negation cue ({len(cues['sentences'])} sentences)",
    ),
    "attribution_patching": charts.patching_heatmaps(
      patch["exact"],
      patch["attribution"],
      out / "attribution_patching.png",
      cbar_label="share of the negation logit restored",
      title=f"Heads patched from {patch['pairs']} negated sentences into their twins",
    ),
  }


def _disentangled_figures(r: dict, out: pathlib.Path) -> Figures:
  d = r.get("disentangled")
  if not (d and d.get("available")):
    return {}
  bl = d["by_layer"]
  return {
    "disentangled_layers": charts.layer_curves(
      {"c2p": bl["share_c2p"], "p2c": bl["share_p2c"], "c2p + p2c": bl["positional_share"]},
      out / "disentangled_layers.png",
      ylabel="share of score variance",
      first_layer=1,
      title="Position's share of the scores by layer (mean over heads)",
    ),
    "disentangled_heads": charts.head_heatmap(
      d["positional_share"],
      out / "disentangled_heads.png",
      title=f"Positional share (c2p + p2c); > {d['threshold']}: mostly positional",
      cbar_label="share of score variance",
      cmap="RdBu_r",
      center=d["threshold"],
      first_layer=1,
    ),
  }


def _circuit_figures(r: dict, out: pathlib.Path) -> Figures:
  c = r["circuit"]
  if not c.get("available"):
    return {}
  return {
    "circuit": circuit_plots.edge_agreement(
      c["exact_scores"], c["scores"], c["faithfulness"], out / "circuit.png"
    )
  }


def _outlier_figures(r: dict, out: pathlib.Path) -> Figures:
  o = r["outliers"]
  z = np.abs(np.asarray(o["z"], float))  # (L, H)
  shown = sorted(o["dims"], key=lambda d: -z[:, d].max())[:8]  # the 8 most outlying
  curves = {f"dimension {d}": z[:, d] for d in shown}
  curves["largest |z| of the layer"] = z.max(1)
  curves["outlier threshold (3)"] = np.full(len(z), 3.0)
  return {
    "outliers": charts.layer_curves(
      curves,
      out / "outliers.png",
      ylabel="|z| of the mean activation",
      first_layer=1,
      title=f"Outlier dimensions ({len(o['dims'])} in >= 25% of the layers)",
    )
  }


# In page order (`write_figures` returns the figures in this order): the page section, the
# results it draws (a section that failed has none to draw), the helper.
_SECTION_FIGURES = (
  ("clark", "clark", _clark_figures),
  ("patterns", "patterns", _pattern_figures),
  ("task", "task", _task_figures),
  ("ablation", "ablation", _ablation_figures),
  ("pruning", "ablation", _pruning_figures),
  ("anisotropy", "anisotropy", _anisotropy_figures),
  ("pos", "pos", _pos_figures),
  ("effective", "effective", _effective_figures),
  ("attribution", "attribution", _attribution_figures),
  ("circuit", "circuit", _circuit_figures),
  ("outliers", "outliers", _outlier_figures),
  ("disentangled", "disentangled", _disentangled_figures),
)


def write_figures(
  results: dict, out: pathlib.Path, errors: dict[str, str] | None = None
) -> dict[str, str]:
  """Writes every PNG of the report into `out` (created).

  Args:
    results: the results of `build_report` (arrays or the lists of `report.json`).
    out: the report's directory.
    errors: when given, a section whose figures fail to draw is recorded here (page section
      id -> the error) and the other figures are still drawn; when None, the error is raised.

  Returns:
    Figure key -> file name (relative to `out`), in page order; a section without its
    data (no POS probe, no attribution, a section that failed or was not run) has no figure.
  """
  out = pathlib.Path(out)
  out.mkdir(parents=True, exist_ok=True)
  figs: Figures = {}
  for section, source, draw in _SECTION_FIGURES:
    data = results.get(source)
    if data is None or (isinstance(data, dict) and (data.get("failed") or data.get("skipped"))):
      continue
    try:
      figs.update(draw(results, out))
    except Exception as e:  # one figure failing must not lose the page
      if errors is None:
        raise
      errors[section] = f"{type(e).__name__}: {e}"
  return {k: p.name for k, p in figs.items()}
