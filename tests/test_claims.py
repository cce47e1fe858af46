"""`bertjax.claims`: rules as data, the verdict on per-item arrays with its bootstrap interval,
and the words the report's readings and the Findings state it in."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats

from bertjax import claims
from bertjax.claims import Claim, Test


def test_rules_are_data():
  """(Moved from tests/test_experiments.py, where the rule lived in experiments/findings.py.)"""
  T = Test
  both = Claim("P", "C", yes=(T("a", ">", 0.8), T("a", ">", "b")), missing="n/a")
  assert [both.verdict({"a": a, "b": 0.5}) for a in (0.9, 0.7, 0.4)] == ["yes", "partly", "no"]
  assert both.verdict({"a": 0.9, "b": None}) == "n/a"  # a quantity without a value
  assert both.text() == (
    "Rule: yes if a > 0.8 and > b; partly if some of these hold; n/a if a quantity has no "
    "value; else no."
  )
  graded = Claim(
    "P",
    "C",
    yes=(T("s", "<=", 0.05),),
    partly=(T("s", "<=", 0.2),),
    missing="no",
    missing_when="none is found",
  )
  verdicts = [graded.verdict({"s": s}) for s in (0.05, 0.2, 0.21, None)]
  assert verdicts == ["yes", "partly", "no", "no"]
  assert graded.text() == "Rule: yes if s <= 0.05; partly if <= 0.2; no if none is found; else no."
  gate = Claim(
    "P", "C", yes=(T("x", ">=", 1),), partly=(T("y", ">=", 1), T("z", "<", 0)), partly_if="all"
  )
  assert gate.verdict({"x": 0, "y": 1, "z": -1}) == "partly"
  assert gate.verdict({"x": 0, "y": 1, "z": 1}) == "no"
  assert gate.text() == "Rule: yes if x >= 1; partly if y >= 1 and z < 0; else no."
  early = Claim("P", "C", yes=(T("x", ">=", 1),), applies=(T("lead", ">=", 0.1),))
  assert [early.verdict({"x": 2, "lead": v}) for v in (0.05, 0.1)] == ["n/a", "yes"]
  assert early.text() == "Rule: n/a unless lead >= 0.1; yes if x >= 1; else no."
  row = graded.row("measured 3%.", {"s": 0.03})
  assert row == {
    "paper": "P",
    "claim": "C",
    "measured": "measured 3%. " + graded.text(),
    "holds": "yes",
    "short": "C",
    "value": {"name": "s", "value": 0.03},
  }
  named = Claim(
    "P", "a long statement", yes=(T("s", "<", 1), T("t", "<", 1)), headline="t", short="S"
  )
  assert named.row("m", {"s": 0.5, "t": 0.25})["value"] == {"name": "t", "value": 0.25}
  assert (named.brief, named.lead, graded.lead) == ("S", "t", "s")
  with pytest.raises(ValueError, match="21 words: at most 20"):
    Claim("P", "C", yes=(T("s", "<", 1),), short=" ".join(["w"] * 21))
  with pytest.raises(KeyError, match=r"the rule reads \['s'\]"):
    graded.verdict({"t": 1.0})
  with pytest.raises(ValueError, match=r"\['y'\] measured as None"):
    gate.verdict({"x": 0, "y": None, "z": 1})
  with pytest.raises(ValueError, match="op='=>' not understood"):
    T("s", "=>", 1)
  strict = Claim("P", "C", yes=(T("a", "<", 1), T("b", "<", 1)), partly_if="never")
  assert strict.verdict({"a": 0, "b": 2}) == "no" and strict.verdict({"a": 0, "b": 0}) == "yes"
  assert strict.text() == "Rule: yes if a < 1 and b < 1; else no."
  for bad in (
    {"partly_if": "all"},
    {"partly_if": "never", "partly": (T("s", "<", 2),)},
    {"partly_if": "some"},
  ):
    with pytest.raises(ValueError, match=r"partly_if 'any', 'never' \(no partly tests\)"):
      Claim("P", "C", yes=(T("s", "<", 1),), **bad)


def test_levels_on_arrays_equal_the_verdict_on_each_value():
  """A rule applied to one value per resample gives, elementwise, the scalar verdict."""
  rng = np.random.default_rng(0)
  q = {"a": rng.uniform(0, 1, 200), "b": rng.uniform(0, 1, 200), "c": rng.uniform(-1, 1, 200)}
  rules = [
    Claim("P", "C", yes=(Test("a", ">", 0.8), Test("a", ">", "b"))),
    Claim("P", "C", yes=(Test("a", ">=", 0.5),), partly=(Test("b", "<", 0.3), Test("c", ">", 0))),
    Claim("P", "C", yes=(Test("a", "<", 0.5),), partly=(Test("b", "<", 0.3),), partly_if="all"),
    Claim("P", "C", yes=(Test("a", "<", 0.5), Test("c", ">", 0)), partly_if="never"),
    Claim("P", "C", yes=(Test("a", ">", 0.2),), applies=(Test("c", ">", -0.5),)),
  ]
  for rule in rules:
    levels = rule.levels(q)
    each = [rule.verdict({k: v[i] for k, v in q.items()}) for i in range(200)]
    assert [claims.LEVEL.get(v, -1) for v in each] == levels.tolist()
    assert len(set(each)) > 1  # the draw reaches more than one verdict
    one_b = {**q, "b": 0.25}  # one value of a statistic beside per-resample values of others
    each = [rule.verdict({**{k: v[i] for k, v in q.items()}, "b": 0.25}) for i in range(200)]
    assert [claims.LEVEL.get(v, -1) for v in each] == rule.levels(one_b).tolist()


def test_judge_is_the_percentile_bootstrap_with_the_rule_on_every_resample():
  """The interval of each statistic equals SciPy's percentile bootstrap on the same draws;
  the span is the rule's verdict at the resamples' 2.5% and 97.5% levels."""
  rng = np.random.default_rng(1)
  x = rng.normal(0.3, 1.0, 60)
  claim = Claim("P", "the mean is positive", yes=(Test("mean", ">", 0),), unit="sentences")
  j = claim.judge(x, lambda a: {"mean": a.mean(-1)}, resamples=999, seed=3)
  ref = scipy.stats.bootstrap(
    (x,),
    np.mean,
    n_resamples=999,
    method="percentile",
    rng=np.random.default_rng(3),
  ).confidence_interval
  np.testing.assert_allclose(j.intervals["mean"], (ref.low, ref.high), rtol=1e-12)
  assert j.values["mean"] == pytest.approx(x.mean())
  assert j.text.startswith("95% CI over the 60 sentences: mean [")
  # The rule's verdict on every resample: its ends are where the mean's interval lies.
  expect = ("yes" if ref.low > 0 else "no", "yes" if ref.high > 0 else "no")
  assert j.span == expect
  assert j.shown == ("yes" if expect == ("yes", "yes") else "inconclusive")


def test_resampled_values_give_the_judgement_judge_gives():
  """Statistics computed on each resample during a run (`Claim.resampled`) give `judge`'s
  interval and span when they are the same resamples' values."""
  rng = np.random.default_rng(4)
  x = rng.normal(0.1, 1.0, 50)
  claim = Claim("P", "the mean is positive", yes=(Test("mean", ">", 0),), unit="sentences")
  j = claim.judge(x, lambda a: {"mean": a.mean(-1)}, resamples=500, seed=5)
  idx = np.random.default_rng(5).integers(0, 50, (500, 50))
  values = {"mean": np.append(x[idx].mean(1), np.nan)}  # a resample with no value is left out
  got = claim.resampled({"mean": x.mean()}, values, over="the 50 sentences")
  np.testing.assert_allclose(got.intervals["mean"], j.intervals["mean"], rtol=1e-12)
  assert (got.span, got.text, got.verdict) == (j.span, j.text, j.verdict)


def test_a_straddling_interval_is_inconclusive_and_a_clear_one_is_not():
  """Planted: a mean of 0.05 +- 1 over 40 items straddles a threshold of 0; 3 +- 1 does not."""
  rng = np.random.default_rng(2)
  claim = Claim("P", "positive", yes=(Test("mean", ">", 0),), unit="heads")
  mean = lambda a: {"mean": a.mean(-1)}
  loose = claim.judge(rng.normal(0, 1, 40) + 0.05, mean)
  sure = claim.judge(rng.normal(3, 1, 40), mean)
  assert loose.span == ("no", "yes") and not loose.conclusive and loose.shown == "inconclusive"
  assert loose.mark == "❔ inconclusive (no to yes within the CI)"
  assert loose.sentence("M").startswith("the verdict on M is inconclusive (95% CI over the 40 ")
  assert loose.sentence("M").endswith("from 'disagrees' to 'agrees' within it)")
  assert sure.span == ("yes", "yes") and sure.shown == "yes" and sure.mark == "✅ yes"
  assert sure.sentence("M") == f"M agrees ({sure.text}; the same verdict across it)"


def test_paired_items_point_values_and_shown_statistics():
  """A tuple of arrays resamples items together; `point` stands in for the values on all items;
  `shown` picks and formats what the text states."""
  rng = np.random.default_rng(4)
  x = rng.normal(size=80)
  y = x + rng.normal(scale=0.3, size=80)
  claim = Claim(
    "P", "they agree", yes=(Test("r", ">", 0.8),), partly=(Test("r", ">", 0),), unit="pairs"
  )
  from bertjax import stats

  j = claim.judge(
    (x, y),
    lambda a, b: {"r": stats.pearson_rows(a, b), "gap": (a - b).mean(-1)},
    point={"r": 0.5},
    shown={"r": "{:.3f}"},
  )
  assert j.values["r"] == 0.5 and j.verdict == "partly"
  assert j.values["gap"] == pytest.approx((x - y).mean())
  assert "gap" in j.intervals and "gap" not in j.text and j.text.count("[") == 1
  # The point's own verdict (partly) lies within the span even where every resample says yes.
  assert j.span == ("partly", "yes") and not j.conclusive


def test_judgements_without_an_interval():
  claim = Claim("P", "C", yes=(Test("s", "<=", 0.1),), partly=(Test("s", "<=", 0.5),))
  exact = claim.exact({"s": 0.05}, "counted over every token")
  assert (exact.verdict, exact.span, exact.text) == ("yes", None, "exact: counted over every token")
  assert exact.conclusive and exact.mark == "✅ yes"
  tested = claim.tested({"s": 0.3}, "exact McNemar per head at p < 0.01")
  assert tested.text == "test the rule applies: exact McNemar per head at p < 0.01; no interval"
  none = claim.unsampled({"s": 0.7}, "report.json keeps no per-item values for this rule")
  assert none.sentence("M") == (
    "M disagrees (no confidence interval: report.json keeps no per-item values for this rule)"
  )
  ends = claim.at_ends({"s": 0.08}, {"s": 0.06}, {"s": 0.2}, over="the 9 sentences")
  assert (
    ends.span == ("partly", "yes") and ends.text == "95% CI over the 9 sentences: s [0.06, 0.20]"
  )
  assert claims.mark("n/a") == "— n/a" and claims.mark("yes", ("no", "yes")).startswith("❔")
  yes, partly = (Test("n", ">=", 1), Test("n", "<=", 5)), (Test("n", ">", 5),)
  few = Claim("P", "a few", yes=yes, partly=partly, partly_if="all")
  # Not monotone: "no" at 0, "partly" at 9, and "yes" between them.
  assert few.at_ends({"n": 9}, {"n": 0}, {"n": 9}, over="x").span == ("no", "yes")
  assert few.at_ends({"n": 9}, {"n": 5.5}, {"n": 9}, over="x").span == ("partly", "partly")
  assert few.at_ends({"n": 3}, {"n": 2}, {"n": 5}, over="x").span == ("yes", "yes")


def test_span_of_applies_a_whole_rule_to_each_resample():
  """`span_of` (a rule recomputed whole per resample) agrees with `judge`'s vectorized span."""
  rng = np.random.default_rng(5)
  x = rng.normal(0.1, 1, 50)
  claim = Claim("P", "C", yes=(Test("m", ">", 0),))
  span = claims.span_of(x, lambda a: claim.verdict({"m": a.mean()}), resamples=500)
  assert span == claim.judge(x, lambda a: {"m": a.mean(-1)}, resamples=500).span
