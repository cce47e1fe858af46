"""JAX's persistent compilation cache, kept in the user cache, one folder per jaxlib and CPU.

XLA:CPU compiles each new program in 0.05 s to several seconds; a process that asks for a
program another process (or an earlier run) compiled can read it from disk instead. JAX keys
each cached program by the program itself (its StableHLO, so any change of code that changes
what is computed gives a new key), the jaxlib version, the backend, `XLA_FLAGS` and the
compile options; `folder()` adds the jaxlib version and the CPU (model and vector ISA) to the
path, so a cache copied with a home folder to another machine is never read there.

`enable()` turns it on for this process (when jax is already imported) and, through the
environment, for every Python process it starts (subprocesses read `JAX_*` variables when they
import jax). The test suite enables it (`tests/conftest.py`); a user can too:

    from bertjax import compile_cache
    compile_cache.enable()   # ~/.cache/bertjax/xla/jaxlib-<version>-<cpu>/
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
from collections.abc import MutableMapping

ENV_DIR = "JAX_COMPILATION_CACHE_DIR"
ENV_MIN_COMPILE_S = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
ENV_MIN_BYTES = "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"


def folder(root: pathlib.Path | None = None) -> pathlib.Path:
  """The cache folder for this jaxlib and this CPU: `ROOT/jaxlib-<version>-<cpu key>`.

  Args:
    root: where the per-version folders go (default: `xla/` in the user cache,
      `bertjax.utils.user_cache_root()`, beside the data sets).

  Returns:
    The folder (not created).
  """
  import importlib.metadata

  from bertjax.utils import cpu_info, user_cache_root

  cpu = cpu_info()
  what = f"{cpu['cpu']}|{cpu['cpu_family_model_stepping']}|{' '.join(cpu['isa_flags'])}"
  key = hashlib.sha256(what.encode()).hexdigest()[:12]
  version = importlib.metadata.version("jaxlib")
  return (root or user_cache_root() / "xla") / f"jaxlib-{version}-{key}"


def prune(path: pathlib.Path, keep_bytes: int) -> int:
  """Deletes the programs in `path` written longest ago until at most `keep_bytes` remain;
  returns how many it deleted."""
  entries = []
  for entry in os.scandir(path):
    try:
      st = entry.stat()
    except FileNotFoundError:  # another process pruned it
      continue
    entries.append((st.st_mtime, st.st_size, entry.path))
  total = sum(size for _, size, _ in entries)
  deleted = 0
  for _, size, name in sorted(entries):
    if total <= keep_bytes:
      break
    with contextlib.suppress(FileNotFoundError):
      os.remove(name)
    total -= size
    deleted += 1
  return deleted


def enable(
  path: pathlib.Path | None = None,
  *,
  min_compile_s: float = 0.0,
  keep_bytes: int = 4 << 30,
  environ: MutableMapping[str, str] | None = None,
) -> pathlib.Path:
  """Turns on JAX's persistent compilation cache here and in the processes this one starts.

  Args:
    path: the cache folder (default: `folder()`); created if missing.
    min_compile_s: programs that compile faster than this are not written (JAX's default is
      1 s; 0 writes every program, which suits many small programs compiled again and again).
    keep_bytes: past this size, the programs written longest ago are deleted now, once
      (JAX's own bound, `jax_compilation_cache_max_size`, rescans the folder on every write
      and locks it around every read: 1.5x the compile time of a cold run of small programs,
      measured on a 2-core AMD EPYC Zen 4; so it is left off).
    environ: the environment handed to child processes (default: `os.environ`).

  Returns:
    The cache folder.
  """
  if min_compile_s < 0:
    raise ValueError(f"min_compile_s must be >= 0 seconds, got {min_compile_s!r}")
  if keep_bytes <= 0:
    raise ValueError(f"keep_bytes must be > 0, got {keep_bytes!r}")
  environ = os.environ if environ is None else environ
  path = pathlib.Path(path) if path is not None else folder()
  path.mkdir(parents=True, exist_ok=True)
  prune(path, keep_bytes)
  environ[ENV_DIR] = str(path)
  environ[ENV_MIN_COMPILE_S] = str(min_compile_s)
  environ[ENV_MIN_BYTES] = "0"
  import sys

  if "jax" in sys.modules:  # jax read the environment when it was imported
    import jax

    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_s)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return path
