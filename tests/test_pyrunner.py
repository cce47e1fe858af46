"""The shared interpreter that runs the tests' Python commands (`tests/pyrunner.py`) behaves as
a new interpreter would: each command gets its own folder's modules, its arguments, folder and
environment, its exit status and traceback, and leaves nothing behind for the next."""

import os
import subprocess
import sys

import pyrunner
import pytest

SCRIPT = """
import os, sys
import helper
print(helper.NAME, sys.argv[1:], os.getcwd() == {cwd!r}, os.environ.get("GREETING"), os.getpid())
os.environ["LEFT_BEHIND"] = "yes"
sys.excepthook = lambda *a: print("hooked:", a[1], file=sys.stderr)
code = sys.argv[1]
if code == "raise":
  raise ValueError("bad value")
sys.exit(int(code))
"""


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
  """Two scripts, each importing its own folder's `helper` module."""
  root = tmp_path_factory.mktemp("scripts")
  paths = {}
  for name in ("first", "second"):
    folder = root / name
    folder.mkdir()
    (folder / "helper.py").write_text(f"NAME = {name!r}\n")
    (folder / "main.py").write_text(SCRIPT.format(cwd=str(folder)))
    paths[name] = folder / "main.py"
  return paths


def _run(path, *args, env=None, **kw):
  return pyrunner.run([sys.executable, str(path), *args], cwd=path.parent, env=env, **kw)


def test_each_command_sees_its_own_modules_arguments_folder_and_environment(scripts):
  env = dict(os.environ, GREETING="hello")
  first = _run(scripts["first"], "0", env=env)
  second = _run(scripts["second"], "3")
  assert first.returncode == 0 and second.returncode == 3, (first.stderr, second.stderr)
  name, args, in_folder, greeting, pid = first.stdout.split(maxsplit=4)[:5]
  assert (name, args, in_folder, greeting) == ("first", "['0']", "True", "hello")
  words = second.stdout.split()
  assert words[:4] == ["second", "['3']", "True", "None"]  # nor LEFT_BEHIND nor GREETING
  assert words[-1] == pid.strip()  # one interpreter ran both
  assert "LEFT_BEHIND" not in os.environ


def test_an_uncaught_exception_goes_to_the_command_s_hook_with_status_1(scripts):
  proc = _run(scripts["first"], "raise")
  assert proc.returncode == 1 and proc.stderr.strip() == "hooked: bad value"
  plain = pyrunner.run([sys.executable, "-c", "raise ValueError('own')"])  # not a script
  assert plain.returncode == 1 and "Traceback (most recent call last)" in plain.stderr


def test_a_traceback_starts_at_the_command_s_own_frames(tmp_path):
  script = tmp_path / "fails.py"
  script.write_text("def f():\n  raise KeyError('k')\nf()\n")
  proc = pyrunner.run([sys.executable, str(script)])
  frames = [line for line in proc.stderr.splitlines() if line.lstrip().startswith("File ")]
  assert proc.returncode == 1 and frames and all(str(script) in f for f in frames), proc.stderr


def test_an_import_time_setting_gets_a_process_of_its_own(scripts):
  shared = _run(scripts["first"], "0").stdout.split()[-1]
  own = _run(scripts["first"], "0", env=dict(os.environ, JAX_ENABLE_X64="1"))
  assert own.returncode == 0 and own.stdout.split()[-1] != shared


def test_a_timeout_kills_the_command_and_the_next_one_runs(tmp_path, scripts):
  slow = tmp_path / "slow.py"
  slow.write_text("import time\ntime.sleep(60)\n")
  with pytest.raises(subprocess.TimeoutExpired):
    pyrunner.run([sys.executable, str(slow)], timeout=1)
  assert _run(scripts["second"], "0").returncode == 0
