"""Figures of sparse autoencoders (`bertjax.analysis.representations.sae`) across sizes."""

from __future__ import annotations

import pathlib
from collections.abc import Mapping

import numpy as np

from bertjax.plots.charts import pyplot, save_png


def scaling(r: Mapping, path, *, title: str = "Top-k SAE scaling") -> pathlib.Path:
  """Held-out FVU against the number of latents on log-log axes with its power-law fit, and
  the shares of dead and dense latents.

  Args:
    r: `latents`, `fvu`, `dead`, `dense` (one per size) and `fit` (`stats.power_law_fit`).
    path: the PNG.
    title: the first panel's title.
  """
  plt = pyplot()
  fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
  n = np.asarray(r["latents"], float)
  fit = r["fit"]
  a.loglog(n, r["fvu"], "o-", label="held-out FVU")
  a.loglog(
    n,
    fit["coefficient"] * n ** fit["exponent"],
    "--",
    label=f"fit: {fit['coefficient']:.2f} N^{fit['exponent']:.2f} (R² {fit['r2']:.2f})",
  )
  a.set(xlabel="latents N", ylabel="fraction of variance unexplained", title=title)
  a.legend()
  b.semilogx(n, 100 * np.asarray(r["dead"]), "o-", label="dead (no held-out token)")
  b.semilogx(n, 100 * np.asarray(r["dense"]), "s-", label="dense (> 10% of tokens)")
  b.set(xlabel="latents N", ylabel="% of latents", title="Dead and dense latents")
  b.legend()
  for ax in (a, b):  # one labelled tick per size, no minor labels
    ax.set_xticks(n, [f"{int(v):,}" for v in n])
    ax.xaxis.set_minor_formatter(plt.NullFormatter())
  fig.tight_layout()
  return save_png(fig, path)
