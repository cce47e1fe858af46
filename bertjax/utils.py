"""Plumbing shared by the report, the analyses and the experiments: JSON results, BLAS threads.

`to_json` is the one conversion of results to JSON values: NumPy and JAX arrays become
lists, NumPy scalars Python numbers, dataclasses dicts, paths strings, and NaN and
infinities `null` (JSON has no NaN; `json.dumps` would write the invalid token `NaN`).
`write_json` writes a file with it, atomically. `flat_kwargs` lets a config that nests
another (a probe's fitting settings, a run's optimiser) take the nested fields as keywords.
`compiled_programs` counts the XLA programs this process has compiled, so a long run can
say how many its shapes cost; `release_compiled_programs` frees them before a long-lived
process runs out of memory mappings. `cpu_info` names the CPU and its vector ISA, which every
committed figure records.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import pathlib
import platform
import re
import sys
from typing import Any

import numpy as np


def user_cache_root() -> pathlib.Path:
  """bertjax's per-user cache folder: `~/.cache/bertjax` on Linux (`$XDG_CACHE_HOME`),
  `~/Library/Caches/bertjax` on macOS, `%LOCALAPPDATA%/bertjax/Cache` on Windows. The data
  sets (`bertjax.data.fetch`) and compiled programs (`bertjax.compile_cache`) go below it."""
  if sys.platform == "win32":
    base = pathlib.Path(os.environ.get("LOCALAPPDATA") or pathlib.Path.home() / "AppData/Local")
    return base / "bertjax" / "Cache"
  if sys.platform == "darwin":
    return pathlib.Path.home() / "Library" / "Caches" / "bertjax"
  base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
  return pathlib.Path(base) / "bertjax"


def to_json(x: Any, *, digits: int | None = None) -> Any:
  """`x` as plain JSON values (dict, list, str, int, float, bool, None).

  Args:
    x: nested dicts (keys become strings), lists, tuples, dataclasses, NumPy or JAX
      arrays and scalars, paths, and plain values.
    digits: round floats to this many decimals (None: keep them whole).

  Returns:
    The converted value; non-finite floats become None.
  """
  if isinstance(x, dict):
    return {str(k): to_json(v, digits=digits) for k, v in x.items()}
  if dataclasses.is_dataclass(x) and not isinstance(x, type):
    return {f.name: to_json(getattr(x, f.name), digits=digits) for f in dataclasses.fields(x)}
  if isinstance(x, (list, tuple)):
    return [to_json(v, digits=digits) for v in x]
  if isinstance(x, (bool, np.bool_)):
    return bool(x)
  if isinstance(x, (int, np.integer)):
    return int(x)
  if isinstance(x, (float, np.floating)):
    if not math.isfinite(x):
      return None
    return float(x) if digits is None else round(float(x), digits)
  if isinstance(x, os.PathLike):
    return os.fspath(x)
  if hasattr(x, "tolist") and not isinstance(x, (str, bytes)):  # NumPy and JAX arrays
    return to_json(np.asarray(x).tolist(), digits=digits)
  return x


_LIST_START, _LIST_END, _ITEM = (
  re.compile(r"\[\n\s*"),
  re.compile(r"\n\s*\]"),
  re.compile(r",\n\s*"),
)
_FLAT_LIST = re.compile(r"\[[^\[\]{}]*\]")  # a list with no list or object inside


def json_text(obj: Any, *, indent: int | None = 1, sort_keys: bool = False) -> str:
  """`obj` (plain JSON values, no NaN) as JSON text, indented, with every list of numbers or
  strings on one line: a result's arrays take a line each, not a line per number.

  Only whitespace between values changes (a JSON string holds no raw newline), so the text
  reads back as `json.dumps` would give it.
  """
  text = json.dumps(obj, indent=indent, sort_keys=sort_keys, allow_nan=False)
  if indent is None:
    return text
  flat = lambda m: _ITEM.sub(", ", _LIST_END.sub("]", _LIST_START.sub("[", m.group(0))))
  return _FLAT_LIST.sub(flat, text)


def write_json(
  path: str | os.PathLike,
  obj: Any,
  *,
  indent: int | None = 1,
  digits: int | None = None,
  sort_keys: bool = False,
) -> pathlib.Path:
  """Writes `to_json(obj)` to `path` as valid JSON (through a temporary file) and returns it.

  Args:
    path: the file to write; its directory must exist.
    obj: the value (see `to_json`).
    indent: JSON indentation (None: one line); lists of numbers or strings stay on one line
      (`json_text`).
    digits: round floats to this many decimals (None: keep them whole).
    sort_keys: sort object keys.
  """
  path = pathlib.Path(path)
  text = json_text(to_json(obj, digits=digits), indent=indent, sort_keys=sort_keys)
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text(text + "\n")
  tmp.replace(path)
  return path


def single_thread_blas():
  """A context limiting NumPy's BLAS to one thread (its pool thrashes small SVDs and
  products on small shared machines); does nothing without threadpoolctl."""
  try:
    from threadpoolctl import threadpool_limits
  except ImportError:  # threadpoolctl comes with scikit-learn
    return contextlib.nullcontext()
  return threadpool_limits(limits=1, user_api="blas")


def flat_kwargs(field: str):
  """Class decorator: keyword arguments naming fields of the config nested in `field` go into it.

  For a frozen dataclass whose `field` holds another frozen dataclass (with a default),
  `Cls(a=1, lr=0.1)` means `Cls(a=1, field=replace(<given or default field>, lr=0.1))`, so
  the nested fields are declared once and can still be given flat (also by
  `dataclasses.replace`). The instance itself keeps only the nested value.
  """

  def decorate(cls):
    default = cls.__dataclass_fields__[field].default
    names = {f.name for f in dataclasses.fields(default)}
    clash = names & set(cls.__dataclass_fields__)
    if clash:
      raise TypeError(f"{cls.__name__} and its {field} both define {sorted(clash)}")
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
      flat = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
      if flat:
        kwargs[field] = dataclasses.replace(kwargs.get(field, default), **flat)
      init(self, *args, **kwargs)

    cls.__init__ = __init__
    return cls

  return decorate


_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def cpu_info() -> dict[str, Any]:
  """The CPU a figure comes from: its model name and vendor, family/model/stepping, the vector
  ISA flags that matter for matrix products (AVX2, AVX-VNNI, AVX-512, AMX), and the CPU count (all, and
  usable by this process). From the first processor of `/proc/cpuinfo`; off Linux, the model
  is `platform.processor()` and the flags are empty."""
  info: dict[str, str] = {}
  flags: set[str] = set()
  try:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
      key, _, value = (part.strip() for part in line.partition(":"))
      if key == "flags" and not flags:
        flags = set(value.split())
      elif key in ("model name", "vendor_id", "cpu family", "model", "stepping"):
        info.setdefault(key, value)
  except OSError:
    pass
  usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return {
    "cpu": info.get("model name") or platform.processor() or platform.machine(),
    "cpu_vendor": info.get("vendor_id"),
    "cpu_family_model_stepping": [info.get(k) for k in ("cpu family", "model", "stepping")],
    "isa_flags": sorted(
      f for f in flags if f in ("avx2", "avx_vnni") or f.startswith(("avx512", "amx"))
    ),
    "cpus": os.cpu_count(),
    "cpus_usable": usable,
  }


_compiles = {"count": 0, "listening": False}


def _on_duration_event(name: str, _seconds: float, **_kw) -> None:
  if name == _COMPILE_EVENT:
    _compiles["count"] += 1


def compiled_programs() -> int:
  """How many XLA programs this process has built since the first call (JAX's
  backend-compile events, which also cover a program read from the persistent compilation
  cache instead of compiled). Differences between two calls count a stage's new programs."""
  if not _compiles["listening"]:
    import jax

    jax.monitoring.register_event_duration_secs_listener(_on_duration_event)
    _compiles["listening"] = True
  return _compiles["count"]


def memory_maps() -> tuple[int, int]:
  """(memory mappings this process holds, the kernel's per-process limit); (0, 0) where
  `/proc` does not say (not Linux)."""
  try:
    with open("/proc/self/maps", "rb") as f:
      count = sum(1 for _ in f)
    with open("/proc/sys/vm/max_map_count") as f:
      return count, int(f.read())
  except (OSError, ValueError):
    return 0, 0


def release_compiled_programs(fraction: float = 0.5) -> bool:
  """Drops JAX's caches of compiled programs when this process holds more than `fraction`
  of the memory mappings Linux allows it; returns whether it did.

  XLA:CPU maps about 20 memory regions for each compiled program and JAX keeps every
  program it compiled while its function lives. A process that compiles a few thousand
  distinct programs (a long test worker, a notebook sweeping many shapes or models) reaches
  Linux's default `vm.max_map_count` of 65530, and XLA then crashes with a segmentation
  fault inside its next compile (LLVM: "Cannot allocate memory"). After the release, the
  next call of each function compiles it again.
  """
  if not 0.0 < fraction <= 1.0:
    raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
  count, limit = memory_maps()
  if not limit or count <= fraction * limit:
    return False
  import gc

  import jax

  jax.clear_caches()
  gc.collect()
  return True
