"""`bertjax.utils.interleaved_times`: side-by-side timing of several calls."""

import time

import pytest

from bertjax import utils


def test_interleaved_times_rotate_the_order_and_time_every_round():
  order = []

  def sleeper(name, seconds):
    def call():
      order.append(name)
      time.sleep(seconds)
      return name

    return call

  calls = {"a": sleeper("a", 0.001), "b": sleeper("b", 0.05), "c": sleeper("c", 0.001)}
  got = utils.interleaved_times(calls, 3, warmup=2)
  # First call and two warm-ups of each, in turn; then rounds a b c, b c a, c a b.
  assert order == ["a"] * 3 + ["b"] * 3 + ["c"] * 3 + list("abc") + list("bca") + list("cab")
  for v in got.values():
    assert len(v["times_s"]) == 3 and v["min_s"] == min(v["times_s"])
    assert v["median_s"] == sorted(v["times_s"])[1] and v["first_call_s"] > 0
  assert got["b"]["min_s"] >= 0.05 > got["a"]["median_s"]  # each clock times its own call
  order.clear()
  utils.interleaved_times(calls, 2, warmup=0, rotate=False)
  assert order == list("abc") * 3
  with pytest.raises(ValueError, match="rounds=0 must be >= 1"):
    utils.interleaved_times(calls, 0)
