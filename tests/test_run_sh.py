"""`./run.sh`: its help, the experiment and benchmark lists, and the quiet, staged set-up.

Run as a user runs it (a subprocess). The set-up tests point `BERTJAX_VENV` at a fake
virtual environment whose `python` prints pip-like noise (and fails on request), so the
staging, the log file and the failure message are checked without installing anything.
"""

import ast
import hashlib
import os
import pathlib
import re
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
COMMANDS = (
  "setup",
  "demo",
  "test",
  "report",
  "pretrain",
  "finetune",
  "export",
  "analyze",
  "data list",
  "data fetch",
  "models list",
  "models install",
  "experiment",
  "bench",
  "help",
)


def _run(*args, env=None, cwd=REPO):
  return subprocess.run(
    [str(REPO / "run.sh"), *args],
    cwd=cwd,
    capture_output=True,
    text=True,
    timeout=120,
    check=False,
    env=dict(os.environ, **(env or {})),
  )


def _bertjax_commands() -> list[str]:
  """The `bertjax` subcommands, from its parser."""
  import argparse

  from bertjax import cli

  sub = next(a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction))
  return list(sub.choices)


def _scripts(folder: str) -> dict[str, str]:
  """Each script's name and the first line of its docstring."""
  out = {}
  for path in sorted((REPO / folder).glob("*.py")):
    if path.stem in ("common", "findings", "findings_pages") or path.stem.startswith("_"):
      continue
    doc = ast.get_docstring(ast.parse(path.read_text()))
    assert doc, f"{path} has no docstring"
    out[path.stem] = doc.strip().splitlines()[0]
  return out


def _listed(text: str, scripts: dict[str, str]) -> None:
  for name, line in scripts.items():
    assert any(row.split(None, 1) == [name, line] for row in text.splitlines()), (name, line)


# How ./run.sh help names each family (a new row of bertjax.model.families needs its name here).
FAMILY_NAMES = {
  "bert": "BERT",
  "albert": "ALBERT",
  "roberta": "RoBERTa",
  "xlm-roberta": "XLM-R",
  "electra": "ELECTRA",
  "distilbert": "DistilBERT",
  "mpnet": "MPNet",
  "nomic_bert": "NomicBERT",
  "modernbert": "ModernBERT",
  "eurobert": "EuroBERT",
  "deberta-v2": "DeBERTa-v2",
  "ultrabert": "UltraBERT",
  "gemma3_text": "EmbeddingGemma",
  "neobert": "NeoBERT",
}


def test_help_names_every_family_for_report():
  from bertjax.model.families import MODEL_TYPES

  assert set(FAMILY_NAMES) == set(MODEL_TYPES)
  usage = (REPO / "run.sh").read_text().split("<<'EOF'")[1].split("\nEOF")[0]
  entry = usage.split("\n  report [ARGS]")[1].split("\n  pretrain")[0]
  missing = [name for name in FAMILY_NAMES.values() if name not in " ".join(entry.split())]
  assert not missing, f"./run.sh help's report entry lacks {missing}"


@pytest.mark.slow
@pytest.mark.parametrize("arg", ["help", "--help", "-h", None])
def test_help_lists_every_command_experiment_and_benchmark(arg):
  proc = _run(*([arg] if arg else []))
  assert proc.returncode == 0, proc.stderr
  out = proc.stdout
  assert "set -euo pipefail" not in out and "Usage: ./run.sh COMMAND" in out
  for cmd in COMMANDS:
    assert f"\n  {cmd} " in out, cmd
  _listed(out, _scripts("experiments"))
  _listed(out, _scripts("benchmarks"))


@pytest.mark.slow
@pytest.mark.parametrize("args", [["experiment"], ["experiment", "--help"], ["experiment", "-h"]])
def test_experiment_without_a_name_lists_the_experiments(args):
  proc = _run(*args)
  assert proc.returncode == 0 and "Usage: ./run.sh experiment NAME" in proc.stdout
  _listed(proc.stdout, _scripts("experiments"))
  assert "bench_forward" not in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("args", [["bench"], ["bench", "--help"]])
def test_bench_without_a_name_lists_the_benchmarks(args):
  proc = _run(*args)
  assert proc.returncode == 0 and "Usage: ./run.sh bench NAME" in proc.stdout
  _listed(proc.stdout, _scripts("benchmarks"))


@pytest.mark.slow
def test_unknown_names_say_what_exists():
  proc = _run("experiment", "sixteen_head")
  assert proc.returncode == 2 and "unknown experiment 'sixteen_head'" in proc.stderr
  assert "sixteen_heads" in proc.stderr and "Traceback" not in proc.stderr
  proc = _run("bench", "nope")
  assert proc.returncode == 2 and "unknown benchmark 'nope'" in proc.stderr
  proc = _run("frobnicate")
  assert proc.returncode == 2 and "unknown command: frobnicate" in proc.stderr
  for command in _bertjax_commands():
    assert command in proc.stderr, command


_FAKE_PYTHON = """#!/usr/bin/env bash
# A stand-in for the venv's python: pip-like noise, and a failure when asked.
echo "Collecting something"
echo "WARNING: a warning nobody needs to see on the terminal" >&2
if [ -n "${FAKE_FAIL:-}" ] && [[ " $* " == *"$FAKE_FAIL"* ]]; then
  echo "ERROR: No matching distribution found for $FAKE_FAIL" >&2
  exit 1
fi
exit 0
"""


def _fake_venv(tmp_path) -> pathlib.Path:
  venv = tmp_path / "venv"
  (venv / "bin").mkdir(parents=True)
  py = venv / "bin" / "python"
  py.write_text(_FAKE_PYTHON)
  py.chmod(0o755)
  return venv


_RECORDING_PYTHON = """#!/usr/bin/env bash
# A stand-in for the venv's python that records where and how it was run.
{ echo "cwd=$PWD"; echo "offline=${HF_HUB_OFFLINE:-unset}"; echo "path=${PYTHONPATH:-}";
  printf 'arg=%s\\n' "$@"; } >"$FAKE_RECORD"
"""


def _stamp() -> str:
  """What `./run.sh setup` keeps once it has installed: the SHA-256 of pyproject.toml followed
  by the side environment's pins (run.sh's SIDE_PINS), one a line."""
  text = (REPO / "run.sh").read_text()
  start = text.index("SIDE_PINS=(")
  pins = re.findall(r'"([^"\s]+==[^"\s]+)"', text[start : text.index(")", start)])
  assert "pyvene==0.1.8" in pins, pins
  body = (REPO / "pyproject.toml").read_bytes() + "".join(p + "\n" for p in pins).encode()
  return hashlib.sha256(body).hexdigest()


def _recording_venv(tmp_path) -> pathlib.Path:
  """A virtual environment that `./run.sh` finds set up, whose python records its runs."""
  venv = tmp_path / "venv"
  (venv / "bin").mkdir(parents=True, exist_ok=True)
  py = venv / "bin" / "python"
  py.write_text(_RECORDING_PYTHON)
  py.chmod(0o755)
  (venv / ".bertjax-installed").write_text(_stamp() + "\n")
  (venv / ".playwright-installed").touch()
  return venv


def _recorded(tmp_path, *args, env=None) -> dict:
  """Runs `REPO/run.sh ARGS` from tmp_path/work; returns the python's cwd, args, offline and
  PYTHONPATH."""
  work = tmp_path / "work"
  work.mkdir(exist_ok=True)
  record = tmp_path / "record.txt"
  record.unlink(missing_ok=True)
  base = {
    k: v
    for k, v in os.environ.items()
    if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
  }
  proc = subprocess.run(
    [str(REPO / "run.sh"), *args],
    cwd=work,
    capture_output=True,
    text=True,
    timeout=60,
    check=False,
    env=dict(
      base, BERTJAX_VENV=str(_recording_venv(tmp_path)), FAKE_RECORD=str(record), **(env or {})
    ),
  )
  assert proc.returncode == 0, proc.stderr
  lines = record.read_text().splitlines()
  return {
    "cwd": pathlib.Path(lines[0].removeprefix("cwd=")),
    "offline": lines[1].removeprefix("offline="),
    "path": lines[2].removeprefix("path="),
    "args": [line.removeprefix("arg=") for line in lines[3:]],
  }


@pytest.mark.slow
def test_commands_run_in_the_callers_directory(tmp_path):
  # Every bertjax subcommand, in the caller's directory (a relative --init-from, --model or
  # --output-dir is the caller's), not offline unless the caller says so.
  work = tmp_path / "work"
  for command in _bertjax_commands():
    got = _recorded(tmp_path, command, "--model", "runs/x")
    assert got["args"] == ["-m", "bertjax.cli", command, "--model", "runs/x"], command
    assert got["cwd"] == work and got["offline"] == "unset", (command, got)
  got = _recorded(tmp_path, "finetune", "--init-from", "runs/x", env={"HF_HUB_OFFLINE": "1"})
  assert got["offline"] == "1"  # the user's setting is kept
  got = _recorded(tmp_path, "demo", "--out", "rep")
  assert got["cwd"] == work and got["args"] == ["-m", "bertjax.cli", "report", "--out", "rep"]
  # Experiments (a package, run as a module with the checkout on the module path) and
  # benchmarks (the script from the checkout), run in the caller's directory.
  got = _recorded(tmp_path, "experiment", "sixteen_heads", "--out", "o")
  assert got["args"] == ["-m", "experiments.sixteen_heads", "--out", "o"]
  assert got["cwd"] == work and got["path"].split(":")[0] == str(REPO)
  got = _recorded(tmp_path, "bench", "bench_forward", "--smoke")
  assert got["args"] == [str(REPO / "benchmarks" / "bench_forward.py"), "--smoke"]
  assert got["cwd"] == work
  # The test suite runs in the checkout (its configuration and tests/ paths), offline.
  got = _recorded(tmp_path, "test", "tests/test_run_sh.py")
  assert got["cwd"] == REPO and got["offline"] == "1"
  assert got["args"][-1] == "tests/test_run_sh.py"


@pytest.mark.slow
def test_setup_is_quiet_and_staged(tmp_path):
  venv = _fake_venv(tmp_path)
  proc = _run("setup", env={"BERTJAX_VENV": str(venv)})
  assert proc.returncode == 0, proc.stderr
  lines = (proc.stdout + proc.stderr).strip().splitlines()
  assert all(line.startswith("[setup] ") for line in lines), lines
  assert len(lines) <= 8
  assert f"pip's output: {venv / 'setup.log'}" in proc.stderr
  for stage in (
    "upgrading pip",
    "installing torch",
    "installing bertjax",
    "transformers 4.57",
    "installing playwright",
  ):
    assert any(stage in line for line in lines), stage
  assert "WARNING" not in proc.stderr and "Collecting" not in proc.stdout
  log = (venv / "setup.log").read_text()
  assert log.count("WARNING: a warning") == 5 and "Collecting" in log
  assert (venv / ".bertjax-installed").read_text().strip() == _stamp()
  # Up to date: nothing to do, nothing printed.
  again = _run("setup", env={"BERTJAX_VENV": str(venv)})
  assert again.returncode == 0 and again.stdout == again.stderr == ""
  # A virtual environment made before the browser test gets Playwright, and only that.
  (venv / ".playwright-installed").unlink()
  late = _run("setup", env={"BERTJAX_VENV": str(venv)})
  assert late.returncode == 0 and late.stdout == ""
  assert late.stderr.strip().splitlines() == [
    line for line in late.stderr.strip().splitlines() if "installing playwright" in line
  ]
  assert len(late.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_setup_failure_names_the_stage_and_the_log(tmp_path):
  venv = _fake_venv(tmp_path)
  proc = _run("setup", env={"BERTJAX_VENV": str(venv), "FAKE_FAIL": "torch==2.13.0"})
  assert proc.returncode == 1
  err = proc.stderr
  assert "installing torch 2.13.0 (CPU build) ... failed" in err
  assert "No matching distribution found for torch==2.13.0" in err
  assert f"the full pip output is in {venv / 'setup.log'}" in err
  assert not (venv / ".bertjax-installed").exists()


def test_pyproject_license_is_an_spdx_string():
  import tomllib

  meta = tomllib.loads((REPO / "pyproject.toml").read_text())
  assert meta["project"]["license"] == "Apache-2.0"
  assert any(r.startswith("setuptools>=77") for r in meta["build-system"]["requires"])
  data = meta["tool"]["setuptools"]["package-data"]["bertjax"]
  assert "resources/smoke/**/*" in data and "data/SHA256SUMS" in data
