"""How sure each reading's verdict is: 95% bootstrap intervals over the items a section keeps
one value per (sentences, inputs, passages; heads where the statistic is a correlation across
heads), with the verdict's own rule applied to every resample.

`interval` resamples the items (`bertjax.stats.bootstrap_ci`, seeded), computes the rule's
statistics on each resample and the rule's verdict level on those statistics (0 disagrees,
1 partly agrees, 2 agrees), and returns the levels at the two ends of the 95% interval with a
sentence stating the statistics' intervals. `reading` says "inconclusive" where the two ends
differ (the interval straddles the rule's threshold).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from bertjax import stats

RESAMPLES = 1000  # where report.json's settings do not say
SEED = 0


@dataclasses.dataclass(frozen=True)
class Interval:
  """A verdict's evidence: its rule's levels at the two ends of the 95% interval (low, high)
  and the sentence that states the interval."""

  levels: tuple[int, int]
  text: str


def interval(
  items,
  values: Callable,
  level: Callable,
  *,
  over: str,
  shown: Sequence[tuple[str, int, str]],
  resamples: int = RESAMPLES,
) -> Interval:
  """The 95% percentile bootstrap interval of a rule's statistics and of its verdict.

  Args:
    items: an array (items first) or a tuple of them, resampled together.
    values: `values(*resampled)` with a leading resample axis `(R, n, ...)` -> `(R, k)`: the
      rule's statistics on each resample.
    level: `level(statistics (..., k))` -> the rule's verdict level (...), 0, 1 or 2.
    over: what the items are, for the sentence ("the 115 held-out sentences").
    shown: `(label, column, format)` of the statistics the sentence states.
    resamples: how many resamples.

  Returns:
    The `Interval`.
  """

  def both(*resampled):
    v = np.asarray(values(*resampled), np.float64)
    return np.concatenate([v, np.asarray(level(v), np.float64)[:, None]], 1)

  low, high = stats.bootstrap_ci(items, both, n_resamples=resamples, seed=SEED, vectorized=True)
  text = f"95% CI over {over}: " + ", ".join(
    f"{label} [{fmt.format(low[c])}, {fmt.format(high[c])}]" for label, c, fmt in shown
  )
  return Interval((int(np.floor(low[-1])), int(np.ceil(high[-1]))), text)


def at_ends(
  low: np.ndarray,
  high: np.ndarray,
  level: Callable,
  *,
  over: str,
  shown: Sequence[tuple[str, int, str]],
) -> Interval:
  """An `Interval` from statistics' intervals computed elsewhere (a section whose items are too
  large for report.json): the rule, monotone in each statistic, applied at both ends."""
  low, high = np.asarray(low, np.float64), np.asarray(high, np.float64)
  ends = sorted((int(level(low[None])[0]), int(level(high[None])[0])))
  text = f"95% CI over {over}: " + ", ".join(
    f"{label} [{fmt.format(low[c])}, {fmt.format(high[c])}]" for label, c, fmt in shown
  )
  return Interval((ends[0], ends[1]), text)


WORDS = ("disagrees", "partly agrees", "agrees")


def verdict(model: str, full: bool, part: bool = False, evidence: Interval | None = None) -> str:
  """`"<model> agrees"`, `"<model> partly agrees"` or `"<model> disagrees"`, with its 95%
  interval; `"the verdict on <model> is inconclusive"` where the interval's two ends give
  different verdicts."""
  point = 2 if full else 1 if part else 0
  if evidence is None:
    return (
      f"{model} {WORDS[point]} (no confidence interval: report.json keeps no per-item "
      "values for this rule)"
    )
  low, high = min(evidence.levels[0], point), max(evidence.levels[1], point)
  if low == high:
    return f"{model} {WORDS[point]} ({evidence.text}; the same verdict across it)"
  return (
    f"the verdict on {model} is inconclusive ({evidence.text}: from '{WORDS[low]}' to "
    f"'{WORDS[high]}' within it)"
  )


def levels(full, part=None):
  """Verdict levels (2 agrees, 1 partly, 0 disagrees) from boolean arrays of a rule's parts."""
  full = np.asarray(full)
  return np.where(full, 2, np.where(np.asarray(part if part is not None else False), 1, 0))
