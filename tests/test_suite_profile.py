"""The suite's own bookkeeping (`tests/suite_profile.py`): the table of tests left out of the
quick subset, and that collection marks them `slow`."""

import json

import pytest
from suite_profile import DURATIONS, QUICK_LIMIT_S, durations, slow_by_duration


def _row(test, wall_s):
  return {"test": test, "wall_s": wall_s}


def test_durations_keep_each_tests_longest_time_at_or_over_the_limit():
  runs = [
    [_row("t::a", 0.5), _row("t::b", 2.0), _row("t::c", 9.94)],
    [_row("t::a", 3.25), _row("t::b", 1.0), _row("t::d", 1.99)],
  ]
  assert durations(runs, limit_s=2.0) == {"t::a": 3.2, "t::b": 2.0, "t::c": 9.9}
  assert durations(runs, limit_s=5.0) == {"t::c": 9.9}
  assert durations([], limit_s=2.0) == {}


def test_the_committed_table_is_read_and_a_missing_one_lists_nothing(tmp_path):
  table = json.loads(DURATIONS.read_text())
  assert table["limit_s"] == QUICK_LIMIT_S and table["cpu"]
  assert all(s >= QUICK_LIMIT_S for s in table["seconds"].values())
  assert slow_by_duration() == set(table["seconds"])
  assert slow_by_duration(tmp_path / "none.json") == set()


def test_every_listed_test_collected_is_marked_slow(request):
  # Under `-m "not slow"` no listed test is collected at all; in a full run each one is.
  listed = slow_by_duration()
  items = [item for item in request.session.items if item.nodeid in listed]
  if "not slow" in (request.config.getoption("-m") or ""):
    assert items == []
  assert all(item.get_closest_marker("slow") is not None for item in items)
  assert any(i.nodeid == request.node.nodeid for i in request.session.items)


@pytest.mark.parametrize("argv", [["--durations", "/nonexistent-folder"]])
def test_a_folder_without_profiles_is_refused(argv, capsys):
  from suite_profile import main

  with pytest.raises(SystemExit, match="needs folders of a run's"):
    main(argv)
