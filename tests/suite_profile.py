"""Where the suite's time goes: a pytest plugin that records, for every test, its wall time
(setup + call + teardown), the programs JAX built for it and the seconds spent tracing,
lowering and compiling them, how many of those programs were read from the persistent cache
instead of compiled (JAX's compile event and its seconds cover both), and the CPU time of the
subprocesses it started (smoke runs, the docs build, CLI runs).

Loaded by `tests/conftest.py`. With `BERTJAX_SUITE_PROFILE=DIR` each worker writes one JSON
line per test to `DIR/<worker>.jsonl` (with the names of the programs it compiled); with
`--suite-profile` the run ends with the table per file, the slowest first (in a fresh
temporary folder when `BERTJAX_SUITE_PROFILE` is not set). CI prints it. A
program compiled by a fixture is charged to the first test that asked for the fixture.
`python tests/suite_profile.py DIR` prints the Markdown table of `docs/testing.md` from a
run's files.

The quick subset (`./run.sh test -m "not slow"`) leaves out, besides the tests marked `slow`
in their files, every test listed in `tests/durations.json`: those that took `QUICK_LIMIT_S`
or more in a full run. `python tests/suite_profile.py --durations DIR [DIR ...]` writes that
file from runs' profiles (a test's longest time among them); `tests/conftest.py` marks them.
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import sys
import time

# JAX's monitoring events (jax/_src/dispatch.py, pxla.py, compilation_cache.py).
EVENTS = {
  "/jax/core/compile/backend_compile_duration": "compile_s",
  "/jax/core/compile/jaxpr_trace_duration": "trace_s",
  "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
  "/jax/compilation_cache/cache_retrieval_time_sec": "cache_read_s",
}
COUNTED = {"/jax/core/compile/backend_compile_duration": "compiles"}
CACHE_HITS = "/jax/compilation_cache/cache_hits"
# A test that took this long in a full run is left out of the quick subset.
QUICK_LIMIT_S = 2.0
DURATIONS = pathlib.Path(__file__).with_name("durations.json")


class _Recorder:
  """Running totals of JAX's events in this process, read before and after each test."""

  def __init__(self):
    self.totals = collections.Counter()
    self.names = collections.Counter()  # compiled programs by name (`jit_<function>`)
    self.listening = False

  def listen(self):
    if self.listening or "jax" not in sys.modules:
      return
    from jax import monitoring

    def on_duration(event: str, seconds: float, fun_name: str = "", **_):
      key = EVENTS.get(event)
      if key:
        self.totals[key] += seconds
      if event in COUNTED:
        self.totals[COUNTED[event]] += 1
        self.names[fun_name] += 1

    def on_event(event: str, **_):
      if event == CACHE_HITS:
        self.totals["cache_hits"] += 1

    monitoring.register_event_duration_secs_listener(on_duration)
    monitoring.register_event_listener(on_event)
    self.listening = True


_RECORDER = _Recorder()
_PER_TEST: dict[str, dict] = {}
_START: dict[str, tuple] = {}
_CONFIG: list = []
_OUTCOMES: dict[str, str] = {}


def _recording() -> bool:
  # An xdist controller only relays its workers' reports: they record, it does not.
  return not (_CONFIG and _CONFIG[0].pluginmanager.hasplugin("dsession"))


def _children_cpu() -> float:
  t = os.times()
  return t.children_user + t.children_system


def pytest_addoption(parser):
  parser.addoption(
    "--suite-profile",
    action="store_true",
    help="print the time, compiles and subprocess CPU of each test file at the end",
  )


def pytest_configure(config):
  _CONFIG.append(config)
  if os.environ.get("PYTEST_XDIST_WORKER"):
    return
  # Before the workers start: `--suite-profile` alone names a fresh folder in the environment;
  # a folder given holds this run's rows only (an earlier run's would be summed in).
  if config.getoption("--suite-profile") and not os.environ.get("BERTJAX_SUITE_PROFILE"):
    import tempfile

    os.environ["BERTJAX_SUITE_PROFILE"] = tempfile.mkdtemp(prefix="bertjax-suite-profile-")
  out = _out_dir()
  if out is not None and out.is_dir():
    for old in out.glob("*.jsonl"):
      old.unlink()


def pytest_runtest_logstart(nodeid, location):
  if not _recording():
    return
  # From the moment jax is imported (tests/conftest.py imports it unless the cache is off; else
  # the first test that needs it, whose compiles count from its next phase on).
  _RECORDER.listen()
  _START[nodeid] = (
    time.perf_counter(),
    dict(_RECORDER.totals),
    _children_cpu(),
    collections.Counter(_RECORDER.names),
  )


def pytest_runtest_logfinish(nodeid, location):
  if not _recording():
    return
  _RECORDER.listen()
  t0, before, child0, names0 = _START.pop(nodeid)
  row = {
    "test": nodeid,
    "wall_s": time.perf_counter() - t0,
    "child_cpu_s": _children_cpu() - child0,
  }
  for key in (*EVENTS.values(), "compiles", "cache_hits"):
    row[key] = _RECORDER.totals.get(key, 0) - before.get(key, 0)
  row["programs"] = dict(_RECORDER.names - names0)
  row["outcome"] = _OUTCOMES.pop(nodeid, None)
  _PER_TEST[nodeid] = row


def pytest_runtest_logreport(report):
  # A test's reports come before its logfinish: keep the outcome until its row is made.
  if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
    _OUTCOMES[report.nodeid] = report.outcome


def _out_dir() -> pathlib.Path | None:
  d = os.environ.get("BERTJAX_SUITE_PROFILE")
  return pathlib.Path(d) if d else None


def pytest_sessionfinish(session):
  out = _out_dir()
  if out is None or not _PER_TEST:
    return
  out.mkdir(parents=True, exist_ok=True)
  worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
  with open(out / f"{worker}.jsonl", "w") as f:
    f.writelines(json.dumps(row) + "\n" for row in _PER_TEST.values())


def read_rows(out: pathlib.Path) -> list[dict]:
  """Every test's row from a run's `<worker>.jsonl` files."""
  rows = []
  for path in sorted(out.glob("*.jsonl")):
    rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
  return rows


def by_file(rows: list[dict]) -> list[dict]:
  """Rows summed per test file, the slowest first."""
  files: dict[str, collections.Counter] = {}
  for row in rows:
    c = files.setdefault(row["test"].split("::")[0], collections.Counter())
    c["tests"] += 1
    for key, value in row.items():
      if isinstance(value, (int, float)):
        c[key] += value
  table = [{"file": name, **c} for name, c in files.items()]
  return sorted(table, key=lambda r: -r["wall_s"])


def markdown(rows: list[dict], top: int | None = None) -> str:
  """The per-file table: tests, wall, compiles and their seconds, subprocess CPU."""
  table = by_file(rows)
  total = collections.Counter()
  for r in table:
    total.update({k: v for k, v in r.items() if k != "file"})
  lines = [
    (
      "| file | tests | wall s | programs | compile s | trace + lower s | read from cache | "
      "subprocess CPU s |"
    ),
    "|---|---:|---:|---:|---:|---:|---:|---:|",
  ]

  def line(name, r):
    return (
      f"| {name} | {r['tests']} | {r['wall_s']:.1f} | {r['compiles']} | {r['compile_s']:.1f} | "
      f"{r['trace_s'] + r['lower_s']:.1f} | {r['cache_hits']} | {r['child_cpu_s']:.1f} |"
    )

  for r in table[:top] if top else table:
    lines.append(line(f"`{r['file']}`", r))
  lines.append(line("**all**", total))
  return "\n".join(lines)


def pytest_terminal_summary(terminalreporter, config):
  out = _out_dir()
  if out is None or not config.getoption("--suite-profile"):
    return
  if os.environ.get("PYTEST_XDIST_WORKER"):
    return
  rows = read_rows(out) if out.exists() else list(_PER_TEST.values())
  if rows:
    from bertjax.utils import cpu_info

    cpu = cpu_info()
    fms = ", ".join(
      f"{k} {v}" for k, v in zip(("family", "model"), cpu["cpu_family_model_stepping"])
    )
    kinds = [("AVX2", "avx2"), ("AVX-512", "avx512f"), ("AMX", "amx_tile")]
    isa = ", ".join(name for name, flag in kinds if flag in cpu["isa_flags"]) or "no AVX2"
    terminalreporter.write_sep("=", "time per test file (tests/suite_profile.py)")
    terminalreporter.write_line(
      f"on {cpu['cpu']} ({cpu['cpu_vendor']}, {fms}; {isa}),"
      f" {cpu['cpus_usable']} of {cpu['cpus']} CPUs"
    )
    terminalreporter.write_line(markdown(rows, top=40))


def durations(runs: list[list[dict]], limit_s: float = QUICK_LIMIT_S) -> dict[str, float]:
  """The tests whose wall time reached `limit_s` in any of `runs` (each a run's rows), with
  their longest time in seconds, by test id."""
  longest: dict[str, float] = {}
  for rows in runs:
    for row in rows:
      longest[row["test"]] = max(longest.get(row["test"], 0.0), row["wall_s"])
  return {t: round(s, 1) for t, s in sorted(longest.items()) if s >= limit_s}


def slow_by_duration(path: pathlib.Path = DURATIONS) -> set[str]:
  """The test ids `tests/durations.json` lists (none when there is no such file)."""
  if not path.exists():
    return set()
  return set(json.loads(path.read_text())["seconds"])


def main(argv: list[str]) -> None:
  """`DIR`: the per-file table of a run; `--durations DIR [DIR ...]`: write
  `tests/durations.json` from runs' profiles, naming the machine they ran on."""
  if not argv or argv[0] in ("-h", "--help"):
    print(main.__doc__)
    return
  if argv[0] != "--durations":
    print(markdown(read_rows(pathlib.Path(argv[0]))))
    return
  runs = [read_rows(pathlib.Path(d)) for d in argv[1:]]
  if not runs or not all(runs):
    sys.exit(f"--durations needs folders of a run's <worker>.jsonl files, got {argv[1:]}")
  from bertjax.utils import cpu_info

  table = {
    "limit_s": QUICK_LIMIT_S,
    "cpu": cpu_info()["cpu"],
    "runs": len(runs),
    "seconds": durations(runs),
  }
  DURATIONS.write_text(json.dumps(table, indent=1) + "\n")
  print(f"{len(table['seconds'])} tests at or over {QUICK_LIMIT_S} s -> {DURATIONS}")


if __name__ == "__main__":
  main(sys.argv[1:])
