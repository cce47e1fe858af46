"""Claims as data: a paper's statement, the rule that judges it on measured statistics, and
how sure the verdict is.

One engine for every verdict bertjax states: the report's readings (`bertjax.report.reading`)
and the experiments' Findings (`experiments.findings`) both write their rules as `Claim`s
and take their intervals and verdict words from here.

A `Claim` is the paper, the statement, and the rule: tests of named statistics against
thresholds (`Test`), "yes" when every `yes` test holds, "partly" when the `partly` tests do,
else "no". `Claim.judge` reads the statistics from per-item arrays (sentences, heads,
passages, seeds, interleaved timing rounds): the value on all items, its 95% percentile
bootstrap interval, and the rule applied to every resample. The verdict is "inconclusive"
where the rule's verdicts at the interval's two ends differ (the interval straddles a
threshold). Where the statistics were computed on each resample during a run (items too large
to keep), `Claim.resampled` takes those values instead. Where nothing was sampled,
`Claim.exact` judges the values as they are; where the rule itself is an exact test,
`Claim.tested` says so; where the items were not kept, `Claim.unsampled` says that no interval
could be computed.

A claim about one's own model takes a few lines:

    from bertjax import claims
    flat = claims.Claim(
      "Ethayarajh 2019", "Upper layers are more anisotropic than lower ones.",
      yes=(claims.Test("last minus first", ">", 0),), unit="sentences",
    )
    j = flat.judge(cosines, lambda c: {"last minus first": c[..., -1].mean(1) - c[..., 0].mean(1)})
    j.shown, j.text   # "yes" / "inconclusive", "95% CI over the 200 sentences: ..."
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from bertjax import stats

OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}
VERDICTS = ("yes", "partly", "no", "n/a")
LEVEL = {"no": 0, "partly": 1, "yes": 2}
# The report's words for the verdicts (a reading says "<model> agrees"), and the Findings'.
WORDS = {"yes": "agrees", "partly": "partly agrees", "no": "disagrees"}
MARK = {"yes": "✅ yes", "partly": "◐ partly", "no": "❌ no", "n/a": "— n/a"}
RESAMPLES = 2000
SEED = 0

Statistics = Callable[..., Mapping[str, np.ndarray]]


@dataclasses.dataclass(frozen=True)
class Test:
  """`quantity op threshold`: a named statistic against a number or another statistic's name,
  with `op` one of >=, >, <=, <."""

  quantity: str
  op: str
  threshold: float | str
  __test__ = False  # not a pytest test class, where a test module imports it

  def __post_init__(self):
    if self.op not in OPS:
      raise ValueError(f"op={self.op!r} not understood: expected one of {', '.join(OPS)}")

  def names(self) -> tuple[str, ...]:
    """The statistics the test reads."""
    return (self.quantity,) + ((self.threshold,) if isinstance(self.threshold, str) else ())

  def holds(self, quantities: Mapping[str, float | np.ndarray]):
    """Whether the test holds: a bool, or a bool array where the statistics are arrays (one
    value per resample)."""
    missing = [n for n in self.names() if n not in quantities]
    if missing:
      raise KeyError(f"the rule reads {missing}, which the quantities {sorted(quantities)} lack")
    right = self.threshold
    right = quantities[right] if isinstance(right, str) else right
    out = OPS[self.op](np.asarray(quantities[self.quantity], float), np.asarray(right, float))
    return bool(out) if np.ndim(out) == 0 else out

  def text(self, after: str | None = None) -> str:
    """The test in words; the quantity's name is left out when it is `after`, the quantity
    the text just named ("x > 0.8 and > y")."""
    right = self.threshold if isinstance(self.threshold, str) else f"{self.threshold:.3g}"
    left = "" if self.quantity == after else f"{self.quantity} "
    return f"{left}{self.op} {right}"


def _joined(tests: Sequence[Test], word: str, after: str | None) -> str:
  texts = []
  for t in tests:
    texts.append(t.text(after))
    after = t.quantity
  return texts[0] if len(texts) == 1 else ", ".join(texts[:-1]) + f" {word} " + texts[-1]


@dataclasses.dataclass(frozen=True)
class Claim:
  """A paper's `statement` and the rule its verdict follows.

  "yes" when every `yes` test holds. Else "partly" when the `partly` tests hold: every one
  with `partly_if="all"`, at least one with `"any"` (without `partly` tests, some but not
  all of the `yes` tests), never with `"never"`. Else "no". Where an `applies` test fails,
  the claim cannot be judged: "n/a". A statistic measured as None (not measured, or never
  reached) gives `missing` (`missing_when` says when, in words); with no `missing`, None is
  an error. `unit` names the items `judge` resamples ("sentences", "heads", "rounds");
  `short` is the statement in at most 20 words, for a table (`brief`: the statement where it
  is that short), and `headline` the statistic a table shows (by default the first `yes`
  test's).
  """

  paper: str
  statement: str
  yes: tuple[Test, ...]
  partly: tuple[Test, ...] = ()
  partly_if: str = "any"
  missing: str | None = None
  missing_when: str = "a quantity has no value"
  applies: tuple[Test, ...] = ()
  unit: str = "items"
  short: str = ""
  headline: str = ""

  def __post_init__(self):
    ok = self.partly_if == "any" or (
      self.partly_if in ("all", "never") and (self.partly_if == "all") == bool(self.partly)
    )
    if not self.yes or not ok or self.missing not in (None, *VERDICTS):
      raise ValueError(
        f"Claim({self.statement[:40]!r}...) not understood: it needs yes tests, partly_if "
        f"'any', 'never' (no partly tests) or 'all' (with them) (got {self.partly_if!r}) and "
        f"missing one of {VERDICTS} (got {self.missing!r})"
      )
    if len(self.short.split()) > 20:
      raise ValueError(f"short={self.short!r} has {len(self.short.split())} words: at most 20")

  @property
  def brief(self) -> str:
    """The statement in at most 20 words: `short`, or the statement itself."""
    return self.short or self.statement

  @property
  def lead(self) -> str:
    """The statistic a table shows beside the verdict: `headline`, or the first `yes` test's."""
    return self.headline or self.yes[0].quantity

  @property
  def reads(self) -> tuple[str, ...]:
    """The statistics the rule reads, in the order its tests name them."""
    names = [n for t in self.applies + self.yes + self.partly for n in t.names()]
    return tuple(dict.fromkeys(names))

  def levels(self, quantities: Mapping[str, float | np.ndarray]) -> np.ndarray:
    """The verdict as a level, 2 yes, 1 partly, 0 no, -1 n/a; elementwise where the
    statistics are arrays (one value per resample)."""
    # a statistic given one value beside others given per resample holds on every resample
    held = lambda tests: np.broadcast_arrays(*(np.asarray(t.holds(quantities)) for t in tests))
    every = lambda tests: np.logical_and.reduce(held(tests))
    yes = every(self.yes)
    if self.partly_if == "never":
      part = np.zeros_like(yes)
    else:
      how = np.logical_or if self.partly_if == "any" else np.logical_and
      part = how.reduce(held(self.partly or self.yes))
    level = np.where(yes, 2, np.where(part, 1, 0))
    return np.where(every(self.applies), level, -1) if self.applies else level

  def verdict(self, quantities: Mapping[str, float | None]) -> str:
    """The verdict ("yes", "partly", "no", "n/a", or `missing`) on the measured values."""
    none = sorted(n for n in self.reads if n in quantities and quantities[n] is None)
    if none and self.missing is None:
      raise ValueError(f"{none} measured as None, and the rule gives no verdict without them")
    if none:
      return self.missing
    return _NAMES[int(self.levels(quantities))]

  def text(self) -> str:
    """The rule in words, as a Findings row states it."""
    last = self.yes[-1].quantity
    out = "Rule: "
    if self.applies:
      out += f"n/a unless {_joined(self.applies, 'and', None)}; "
    out += f"yes if {_joined(self.yes, 'and', None)}"
    if self.partly:
      word = "or" if self.partly_if == "any" else "and"
      out += f"; partly if {_joined(self.partly, word, last)}"
    elif self.partly_if == "any" and len(self.yes) > 1:
      out += "; partly if some of these hold"
    if self.missing is not None:
      out += f"; {self.missing} if {self.missing_when}"
    return out + "; else no."

  def row(self, measured: str, quantities: Mapping[str, float | None]) -> dict:
    """A Findings row: paper, claim, `measured` followed by the rule, and the verdict; with
    the claim in brief (`short`) and the statistic a table shows (`value`: name and value)."""
    value = quantities.get(self.lead)
    return {
      "paper": self.paper,
      "claim": self.statement,
      "measured": f"{measured.rstrip()} {self.text()}",
      "holds": self.verdict(quantities),
      "short": self.brief,
      "value": {"name": self.lead, "value": _finite(value)},
    }

  # Judging ---------------------------------------------------------------------------------

  def judge(
    self,
    items,
    statistics: Statistics,
    *,
    point: Mapping[str, float] | None = None,
    shown: Mapping[str, str] | None = None,
    over: str | None = None,
    resamples: int = RESAMPLES,
    seed: int = SEED,
  ) -> Judgement:
    """The verdict on per-item arrays, with the 95% percentile bootstrap interval of every
    statistic and the rule applied to every resample.

    Args:
      items: an array with the items first, or a tuple of them resampled together (item i of
        each goes with item i of the others).
      statistics: `statistics(*arrays)` -> {name: values}: given the arrays with a leading
        resample axis, `(R, n, ...)`, one value per resample, `(R,)`, of every statistic the
        rule reads (and of any other the sentence states).
      point: values on all the items that stand for `statistics`' own (the numbers a table
        shows, where they are computed otherwise, as token-weighted means).
      shown: `{name: format}` of the statistics the interval's text states, in order; by
        default every statistic, `"{:.2f}"`.
      over: what the items are, for the text; by default "the N <unit>".
      resamples, seed: the bootstrap's (`bertjax.stats.bootstrap_ci`).

    Returns:
      The `Judgement`.
    """
    arrays = items if isinstance(items, tuple) else (items,)
    arrays = tuple(np.asarray(a) for a in arrays)
    n = len(arrays[0])
    on_all = statistics(*(a[None] for a in arrays))
    names = list(on_all)
    point = {**{k: float(np.asarray(v)[0]) for k, v in on_all.items()}, **(point or {})}

    def columns(*resampled):
      s = statistics(*resampled)
      cols = [np.asarray(s[k], np.float64) for k in names]
      return np.stack(cols + [self.levels(s).astype(np.float64)], -1)

    low, high = stats.bootstrap_ci(
      arrays, columns, n_resamples=resamples, seed=seed, vectorized=True
    )
    ends = (int(np.floor(low[-1])), int(np.ceil(high[-1])))
    intervals = {k: (float(low[i]), float(high[i])) for i, k in enumerate(names)}
    return self._judgement(point, intervals, ends, over or f"the {n} {self.unit}", shown)

  def resampled(
    self,
    point: Mapping[str, float],
    values: Mapping[str, np.ndarray],
    *,
    over: str,
    shown: Mapping[str, str] | None = None,
  ) -> Judgement:
    """The verdict where the statistics were computed on each resample during the run (items too
    large to keep, as every word's vector): `values` maps each statistic the rule reads to its
    `(R,)` values on the resamples; the 95% percentile interval and the verdicts at its ends are
    `judge`'s, from these values (NaN resamples left out), and `point` the values on all items."""
    names = list(values)
    cols = np.stack([np.asarray(values[k], np.float64) for k in names], -1)
    levels = self.levels({k: cols[:, i] for i, k in enumerate(names)}).astype(np.float64)
    levels[np.isnan(cols).any(-1)] = np.nan  # no verdict on a resample with a missing value
    cols = np.concatenate([cols, levels[:, None]], -1)
    with np.errstate(invalid="ignore"):
      low, high = np.nanquantile(cols, [0.025, 0.975], axis=0)
    ends = (int(np.floor(low[-1])), int(np.ceil(high[-1])))
    intervals = {k: (float(low[i]), float(high[i])) for i, k in enumerate(names)}
    return self._judgement(dict(point), intervals, ends, over, shown)

  def at_ends(
    self,
    point: Mapping[str, float],
    low: Mapping[str, float],
    high: Mapping[str, float],
    *,
    over: str,
    shown: Mapping[str, str] | None = None,
  ) -> Judgement:
    """The verdict where the statistics' intervals were computed elsewhere (items too large to
    keep): the rule applied across the box the intervals span, at both ends of each and on
    both sides of every threshold within it, so a rule that is not monotone ("yes" for 1 to a
    few, "partly" above) is seen whole. Statistics without an interval keep their `point`
    value; a test of one statistic against another is checked where the grid puts them."""
    grid = {}
    for k in low:
      lo, hi = float(low[k]), float(high[k])
      at = {lo, hi}
      for t in self.applies + self.yes + self.partly:
        if t.quantity == k and not isinstance(t.threshold, str) and lo <= t.threshold <= hi:
          x = float(t.threshold)
          at |= {x, float(np.nextafter(x, -np.inf)), float(np.nextafter(x, np.inf))}
      grid[k] = sorted(v for v in at if lo <= v <= hi)
    mesh = np.meshgrid(*grid.values(), indexing="ij")
    levels = self.levels({**point, **{k: m.ravel() for k, m in zip(grid, mesh)}})
    intervals = {k: (float(low[k]), float(high[k])) for k in low}
    return self._judgement(point, intervals, (int(levels.min()), int(levels.max())), over, shown)

  def exact(
    self, quantities: Mapping[str, float | None], why: str = "nothing sampled"
  ) -> Judgement:
    """The verdict where nothing was sampled (counts over every item, linear algebra)."""
    return Judgement(self, dict(quantities), self.verdict(quantities), None, {}, f"exact: {why}")

  def tested(self, quantities: Mapping[str, float | None], test: str) -> Judgement:
    """The verdict where the rule itself applies an exact test (`test` names it)."""
    text = f"test the rule applies: {test}; no interval"
    return Judgement(self, dict(quantities), self.verdict(quantities), None, {}, text)

  def unsampled(self, quantities: Mapping[str, float | None], why: str) -> Judgement:
    """The verdict where the per-item values an interval needs were not kept (`why` says so,
    "report.json keeps no per-item values for this rule"): no interval is made up."""
    text = f"no confidence interval: {why}"
    return Judgement(self, dict(quantities), self.verdict(quantities), None, {}, text)

  def _judgement(self, point, intervals, ends, over, shown) -> Judgement:
    verdict = self.verdict(point)
    lo, hi = ends
    if verdict in LEVEL:  # the point's own verdict lies within the span
      lo, hi = min(lo, LEVEL[verdict]), max(hi, LEVEL[verdict])
    shown = shown if shown is not None else {k: "{:.2f}" for k in intervals}
    text = f"95% CI over {over}: " + ", ".join(
      f"{k} [{fmt.format(intervals[k][0])}, {fmt.format(intervals[k][1])}]"
      for k, fmt in shown.items()
    )
    return Judgement(self, dict(point), verdict, (_NAMES[lo], _NAMES[hi]), intervals, text)


_NAMES = {-1: "n/a", 0: "no", 1: "partly", 2: "yes"}


def _finite(x) -> float | None:
  """`x` as a float, None where it has no finite value (JSON keeps no NaN)."""
  return None if x is None or not np.isfinite(x) else float(x)


@dataclasses.dataclass(frozen=True)
class Judgement:
  """A claim judged: the `values` of its statistics, the rule's `verdict` on them, and how sure
  it is: `span`, the verdicts at the two ends of the 95% interval (None where no interval was
  computed), `intervals` per statistic, and `text`, the interval (or why there is none) in
  words."""

  claim: Claim | None
  values: dict
  verdict: str
  span: tuple[str, str] | None
  intervals: dict
  text: str

  @property
  def conclusive(self) -> bool:
    """False where the verdicts at the interval's two ends differ."""
    return self.span is None or self.span[0] == self.span[1]

  @property
  def shown(self) -> str:
    """The verdict as a table states it: "inconclusive" where the interval straddles a
    threshold, else the rule's verdict."""
    return self.verdict if self.conclusive else "inconclusive"

  @property
  def mark(self) -> str:
    """The Findings' cell: the verdict with its mark, or what the interval spans."""
    return mark(self.verdict, self.span)

  def sentence(self, model: str) -> str:
    """The verdict as a reading states it: `"<model> agrees (<interval>; the same verdict
    across it)"`, or `"the verdict on <model> is inconclusive (<interval>: from 'partly agrees'
    to 'agrees' within it)"`."""
    word = WORDS.get(self.verdict, self.verdict)
    if self.span is None:
      return f"{model} {word} ({self.text})"
    if self.conclusive:
      return f"{model} {word} ({self.text}; the same verdict across it)"
    low, high = (WORDS.get(v, v) for v in self.span)
    return (
      f"the verdict on {model} is inconclusive ({self.text}: from '{low}' to '{high}' within it)"
    )


def mark(verdict: str, span: tuple[str, str] | None = None) -> str:
  """A verdict as a Findings cell states it: with its mark, or "inconclusive" with what the
  interval spans where its two ends differ."""
  if span is not None and span[0] != span[1]:
    order = sorted(set(span), key=lambda v: LEVEL.get(v, -1))
    return f"❔ inconclusive ({' to '.join(order)} within the CI)"
  return MARK.get(verdict, verdict)


def note(text: str, span: tuple[str, str] | None = None) -> Judgement:
  """A judgement made elsewhere: `text` states the interval (or why there is none) and `span`
  the verdicts at its two ends; for a row whose interval comes from a rule applied to whole
  recomputed rows (`span_of`)."""
  return Judgement(None, {}, "", span, {}, text)


def rerun_needed(what: str) -> Judgement:
  """The judgement of a row whose results keep no per-item values (`what` names them): "CI:
  rerun needed", no interval made up."""
  return note(f"CI: rerun needed (the JSON keeps no {what})")


def span_of(items, verdict: Callable[..., str], *, resamples: int = RESAMPLES, seed: int = SEED):
  """The verdicts at the two ends of the 95% interval of `verdict(*resampled items)`, a rule
  applied to one resample at a time (where a row is recomputed whole on each resample); "n/a"
  and a `missing` verdict other than a level count below "no"."""
  lo, hi = stats.bootstrap_ci(
    items, lambda *a: LEVEL.get(verdict(*a), -1), n_resamples=resamples, seed=seed
  )
  return _NAMES[int(np.floor(lo))], _NAMES[int(np.ceil(hi))]


def interval_text(
  items, statistic, fmt: str = "{:.2f}", *, resamples: int = RESAMPLES
) -> list[str]:
  """`[low, high]` for each value of a vectorized `statistic` of the resampled items (it maps
  `(R, n, ...)` resamples to `(R,)` or `(R, k)` values)."""
  lo, hi = stats.bootstrap_ci(items, statistic, n_resamples=resamples, vectorized=True)
  return [
    f"[{fmt.format(a)}, {fmt.format(b)}]" for a, b in zip(np.atleast_1d(lo), np.atleast_1d(hi))
  ]
