"""How a `--smoke` run compiles: a compilation cache of its own, XLA's quick settings, one BLAS
thread."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile

from bertjax.study.command import log


@contextlib.contextmanager
def smoke_compilation_cache(enabled: bool = True):
  """JAX's persistent compilation cache for the duration of a `--smoke` run, in a directory of
  its own that is deleted afterwards, then the process's own settings back.

  The smoke runs train several variants of one shape, so later ones read the first one's
  compiled steps. JAX keeps its cache object once built (restoring the config value alone
  does not turn it off), so it is reset on the way in and out: a script's `main` called
  in-process (a test) leaves no cache on for the rest of that process. A process that has
  a cache already (the test suite's, `bertjax.compile_cache`, or the user's own) keeps it,
  so a later run, or another process, reads this one's programs.
  """
  import jax
  from jax.experimental.compilation_cache import compilation_cache

  names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
  before = {name: getattr(jax.config, name) for name in names}
  if not enabled or before[names[0]]:
    yield
    return
  path = tempfile.mkdtemp(prefix="bertjax-smoke-jax-cache-")
  compilation_cache.reset_cache()
  jax.config.update(names[0], path)
  jax.config.update(names[1], 0.2)
  try:
    yield
  finally:
    for name, value in before.items():
      jax.config.update(name, value)
    compilation_cache.reset_cache()
    shutil.rmtree(path, ignore_errors=True)


def smoke_cached(run):
  """Decorates a script's `run(args)` to run inside `smoke_compilation_cache(args.smoke)`."""

  @functools.wraps(run)
  def wrapper(args, *rest, **kwargs):
    with smoke_compilation_cache(args.smoke):
      return run(args, *rest, **kwargs)

  return wrapper


# What --smoke asks of XLA:CPU (besides `jax_disable_most_optimizations`): its older loop
# emitters instead of its fusion emitters, which compile ~2.5x faster at that setting. XLA reads XLA_FLAGS when it starts, so
# a process that has already compiled keeps its own emitters.
SMOKE_XLA_FLAG = "--xla_cpu_use_fusion_emitters=false"


@contextlib.contextmanager
def quick_compiles(enabled: bool = True):
  """For --smoke: XLA with most optimisations off and `SMOKE_XLA_FLAG`, then the process's
  settings back. Compiling is most of a smoke run (each program runs a few steps or a few
  times); the unoptimised programs give the same numbers to float32 rounding. A script that
  uses it records `"xla_optimised": not args.smoke` in its settings."""
  import jax

  if not enabled:
    yield
    return
  flags, off = os.environ.get("XLA_FLAGS"), jax.config.values["jax_disable_most_optimizations"]
  if SMOKE_XLA_FLAG.split("=")[0] not in (flags or ""):  # the user's setting wins
    os.environ["XLA_FLAGS"] = f"{flags or ''} {SMOKE_XLA_FLAG}".strip()
  jax.config.update("jax_disable_most_optimizations", True)
  log("--smoke: XLA compiles with most optimisations off (the programs run only a few times)")
  try:
    yield
  finally:
    jax.config.update("jax_disable_most_optimizations", off)
    if flags is None:
      os.environ.pop("XLA_FLAGS", None)
    else:
      os.environ["XLA_FLAGS"] = flags


def one_blas_thread(main):
  """Decorates a script's `main` to run with NumPy's BLAS on one thread
  (`bertjax.utils.single_thread_blas`: its pool thrashes small SVDs on a shared machine)."""

  @functools.wraps(main)
  def wrapper(*args, **kwargs):
    from bertjax.utils import single_thread_blas

    with single_thread_blas():
      return main(*args, **kwargs)

  return wrapper
