"""Figures of transcoders (`bertjax.analysis.circuits.transcoders`) by layer, and of the
replacement models they make."""

from __future__ import annotations

import pathlib
from collections.abc import Mapping

import numpy as np

from bertjax.plots.charts import pyplot, save_png


def layers(kinds: Mapping[str, Mapping], path, *, title: str = "Transcoders") -> pathlib.Path:
  """Per layer, each transcoder's held-out FVU and dead latents; then each replacement
  model's top-1 agreement with the model (and the mean ablation's), where measured.

  Args:
    kinds: {name: {"fvu": (L,), "dead": (L,), "replacement": {"agreement",
      "ablated_agreement", "cosine", "ablated_cosine"}}}, e.g. "PLT", "CLT".
    path: the PNG.
    title: the first panel's title.
  """
  plt = pyplot()
  fig, (a, b, c) = plt.subplots(1, 3, figsize=(14, 4))
  for name, k in kinds.items():
    x = np.arange(1, len(k["fvu"]) + 1)
    a.plot(x, k["fvu"], "o-", label=name)
    b.plot(x, 100 * np.asarray(k["dead"]), "o-", label=name)
  a.set(xlabel="layer", ylabel="held-out FVU of the FFN output", title=title)
  b.set(xlabel="layer", ylabel="% of the layer's latents", title="Dead latents (no held-out token)")
  for ax in (a, b):
    ax.set_xticks(x)
    ax.legend()
  metric = "agreement" if "agreement" in next(iter(kinds.values()))["replacement"] else "cosine"
  names = list(kinds)
  values = [kinds[n]["replacement"][metric] for n in names]
  values.append(kinds[names[0]]["replacement"][f"ablated_{metric}"])
  labels = [f"{n}\nreplacement" for n in names] + ["FFNs\nmean-ablated"]
  c.bar(labels, values, color=["C0", "C1", "0.6"][: len(values)])
  for i, v in enumerate(values):
    c.text(i, v, f"{v:.2f}", ha="center", va="bottom")
  what = "top-1 MLM prediction = the model's" if metric == "agreement" else "pooled cosine"
  c.set(ylabel=what, ylim=(0, 1.05), title="Every FFN replaced")
  fig.tight_layout()
  return save_png(fig, path)
