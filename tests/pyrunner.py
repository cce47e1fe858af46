"""The Python commands tests start, run in one long-lived interpreter per test worker.

A test that runs `python SCRIPT ARGS` or `python -m MODULE ARGS` (an experiment's smoke run, a
benchmark, the `bertjax` CLI) calls `run` instead of `subprocess.run`, with the same arguments,
and gets the same `subprocess.CompletedProcess` (return code, stdout, stderr). The command runs
in a child interpreter that the worker starts once: importing jax, bertjax and transformers is
paid once per worker instead of once per command, and a program one command compiled is in
memory for the next. The child runs each command as Python would (`runpy` as `__main__`, the
given `sys.argv`, working folder and environment, its output captured at the file descriptors,
`SystemExit` as the exit status, an uncaught exception's traceback on stderr and status 1),
then puts back its folder, environment, `sys.argv`, `sys.path`, warning filters and JAX
settings. What it saves is in docs/testing.md.

A command gets a process of its own (`subprocess.run`), as before, where the child could not
run it as a new interpreter would: an environment that differs from the child's in a setting
read when a library is imported (`JAX_*`, `XLA_*`, `HF_*`, ...), a command that is not
`python SCRIPT` or `python -m MODULE`, input on stdin, or `BERTJAX_TEST_RUNNER=0` (for the
whole run). A test whose subject is the process itself (killed and resumed, several processes,
a terminal) keeps calling `subprocess` directly.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import pathlib
import select
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence

# Environment variables a library reads when it is imported: a command whose environment
# differs from the child's in one of them runs in a process of its own.
IMPORT_TIME = (
  "JAX_",
  "XLA_",
  "TF_",
  "CUDA",
  "TPU_",
  "PJRT_",
  "HF_",
  "HUGGINGFACE_",
  "TRANSFORMERS_",
  "XDG_",
  "HOME",
  "PYTHON",
  "LD_",
  "GLIBC_",
  "OMP_",
  "MKL_",
  "OPENBLAS_",
  "BERTJAX_XLA",
)


def _import_time(env: Mapping[str, str]) -> dict[str, str]:
  """The settings of `env` read at import; not PYTHONPATH, which `_main` applies itself."""
  return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME) and k != "PYTHONPATH"}


class _Child:
  """The worker's interpreter: requests as JSON lines on its stdin, replies on its stdout."""

  def __init__(self):
    self.env = dict(os.environ)
    self.proc = subprocess.Popen(
      [sys.executable, __file__, "--serve"],
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      env=self.env,
      text=True,
    )
    self.folder = pathlib.Path(tempfile.mkdtemp(prefix="bertjax-pyrunner-"))
    self.count = 0

  def alive(self) -> bool:
    return self.proc.poll() is None

  def close(self) -> None:
    if self.alive():
      self.proc.stdin.close()
      try:
        self.proc.wait(timeout=30)
      except subprocess.TimeoutExpired:
        self.proc.kill()
    shutil.rmtree(self.folder, ignore_errors=True)

  def run(self, argv: list[str], cwd: str, env: dict[str, str], timeout: float | None):
    self.count += 1
    out, err = self.folder / f"{self.count}.out", self.folder / f"{self.count}.err"
    request = {"argv": argv, "cwd": cwd, "env": env, "out": str(out), "err": str(err)}
    self.proc.stdin.write(json.dumps(request) + "\n")
    self.proc.stdin.flush()
    ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
    if not ready:  # what subprocess.run does on a timeout: kill, then raise
      self.proc.kill()
      self.proc.wait()
      raise subprocess.TimeoutExpired([sys.executable, *argv], timeout)
    line = self.proc.stdout.readline()
    code = json.loads(line)["returncode"] if line else self.proc.wait()  # the child died
    texts = [p.read_text(errors="replace") if p.exists() else "" for p in (out, err)]
    for p in (out, err):
      p.unlink(missing_ok=True)
    return code, *texts


_CHILD: _Child | None = None


def _child() -> _Child:
  global _CHILD
  if _CHILD is None or not _CHILD.alive():
    _CHILD = _Child()
    atexit.register(_CHILD.close)
  return _CHILD


def run(
  args: Sequence[str],
  *,
  cwd: str | os.PathLike | None = None,
  env: Mapping[str, str] | None = None,
  timeout: float | None = None,
  capture_output: bool = True,
  text: bool = True,
  check: bool = False,
  **rest,
) -> subprocess.CompletedProcess:
  """`subprocess.run(args, cwd=, env=, timeout=, capture_output=True, text=True)` for
  `[sys.executable, SCRIPT | -m MODULE, ARGS...]`, run in the worker's interpreter when it can
  be (see the module's docstring), else in a process of its own."""
  args = [str(a) for a in args]
  env = dict(os.environ if env is None else env)
  shared = (
    os.environ.get("BERTJAX_TEST_RUNNER", "1") != "0"
    and capture_output
    and text
    and not rest
    and len(args) >= 2
    and args[0] == sys.executable
    and (args[1] == "-m" and len(args) >= 3 or not args[1].startswith("-"))
  )
  if shared:
    child = _child()
    shared = _import_time(env) == _import_time(child.env)
  if not shared:
    return subprocess.run(
      args,
      cwd=cwd,
      env=env,
      timeout=timeout,
      capture_output=capture_output,
      text=text,
      check=check,
      **rest,
    )
  code, out, err = child.run(args[1:], os.fspath(cwd or os.getcwd()), env, timeout)
  proc = subprocess.CompletedProcess(args, code, out, err)
  if check:
    proc.check_returncode()
  return proc


# The child ----------------------------------------------------------------------------------


def _main(argv: list[str]) -> int:
  """Runs `python ARGV` in this interpreter; its exit status."""
  import runpy

  # PYTHONPATH's folders follow the command's own, as a new interpreter puts them.
  extra = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
  try:
    if argv[0] == "-m":
      sys.path[:0] = [os.getcwd(), *extra]
      sys.argv[:] = [argv[1], *argv[2:]]
      runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
      sys.path[:0] = [os.path.dirname(os.path.abspath(argv[0])), *extra]
      sys.argv[:] = list(argv)
      runpy.run_path(argv[0], run_name="__main__")
    return 0
  except SystemExit as e:
    if e.code is None or isinstance(e.code, int):
      return e.code or 0
    print(e.code, file=sys.stderr)
    return 1
  except BaseException as e:  # noqa: BLE001 (what the interpreter itself catches and prints)
    tb = e.__traceback__  # from the command's own frames, as Python prints it
    ours = (__file__, runpy.__file__, "<frozen runpy>")
    while tb is not None and tb.tb_frame.f_code.co_filename in ours:
      tb = tb.tb_next
    sys.excepthook(type(e), e.with_traceback(tb), tb)  # the command's own hook, if any
    return 1


def _jax_settings() -> dict:
  jax = sys.modules.get("jax")
  return dict(jax.config.values) if jax is not None else {}


def _restore_jax(before: dict) -> None:
  jax = sys.modules.get("jax")
  if jax is None:
    return
  for name, value in before.items():
    if jax.config.values.get(name) != value:
      with contextlib.suppress(Exception):  # a setting JAX refuses once it started
        jax.config.update(name, value)


def _forget_local_modules(before: set[str]) -> None:
  """Drops the modules a command imported from outside the installed packages and bertjax
  (its own folder's: `experiments/common.py` and `benchmarks/common.py` are both `common`),
  so that the next command imports its own, as a new interpreter would."""
  installed = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})
  for name in set(sys.modules) - before:
    path = getattr(sys.modules[name], "__file__", None) or ""
    if name != "bertjax" and not name.startswith("bertjax.") and not path.startswith(installed):
      del sys.modules[name]


def _one(request: dict) -> int:
  import warnings

  env, cwd, path = dict(os.environ), os.getcwd(), list(sys.path)
  argv, streams, filters = list(sys.argv), (sys.stdout, sys.stderr), list(warnings.filters)
  hook = sys.excepthook
  settings, modules = _jax_settings(), set(sys.modules)
  warnings._filters_mutated()  # a warning shown by an earlier command is shown again
  with open(request["out"], "wb") as out, open(request["err"], "wb") as err:
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    os.environ.clear()
    os.environ.update(request["env"])
    try:
      os.chdir(request["cwd"])
      return _main(request["argv"])
    finally:
      for stream in (sys.stdout, sys.stderr, *streams):
        with contextlib.suppress(ValueError, OSError):  # a stream the command closed
          stream.flush()
      sys.stdout, sys.stderr, sys.excepthook = *streams, hook
      os.dup2(_NULL, 1)
      os.dup2(_NULL, 2)
      os.chdir(cwd)
      os.environ.clear()
      os.environ.update(env)
      sys.path[:], sys.argv[:] = path, argv
      warnings.filters[:] = filters
      _restore_jax(settings)
      _forget_local_modules(modules)
      if "jax" in sys.modules:
        from bertjax import utils

        utils.release_compiled_programs()


def _serve() -> None:
  global _NULL
  reply = os.fdopen(os.dup(1), "w")
  _NULL = os.open(os.devnull, os.O_WRONLY)
  os.dup2(_NULL, 1)  # nothing but replies on the channel to the worker
  import bertjax.cli  # noqa: F401 (what every command imports, once)

  for line in sys.stdin:
    code = _one(json.loads(line))
    reply.write(json.dumps({"returncode": code}) + "\n")
    reply.flush()


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
  _serve()
