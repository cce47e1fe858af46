"""Keeping freed host memory for reuse: glibc malloc options for analyses with large arrays.

XLA:CPU allocates every call's temporaries and outputs afresh and frees them after. glibc's
malloc serves an allocation of more than 32 MB (and any allocation too large for a worker
thread's arena) with a new `mmap` and returns it to the kernel on `free`, so the next call
touches fresh pages: the kernel zero-fills and maps each 4 KiB page on its first write. For a
forward pass that is little (BERT-base 8 x 128: 0.04 GB of faulted pages a call). Analyses
that hold per-edge or per-head arrays fault gigabytes: every edge's EAP scores at BERT-base
8 x 128 fault 2.3 GB a call, 1.2-1.4 s on a 2-core AMD EPYC (Zen 3), most of a forward pass.

`TUNABLES` are three glibc malloc options, given to a process at its start in the
`GLIBC_TUNABLES` environment variable: one arena (`arena_max`), no `mmap` for large blocks
(`mmap_max=0`) and no trimming of the heap's top (`trim_threshold` at 64 GiB). Freed blocks
then stay in the process for later calls: an EAP call at BERT-base 8 x 128 faulted 0-1,800
pages instead of 551,000 and took 0.87x the time (`benchmarks/bench_host_memory.py`). How
much is saved depends on when the arrays are freed: a small probe whose 256 MiB result was
deleted before each next call still faulted most of its pages. The cost is that the
process keeps its peak memory until it exits instead of handing freed blocks back; that is
why it is opt-in. `./run.sh` exports them for the demo, the `bertjax` commands and the
experiments (not for the tests or the benchmarks); elsewhere, start Python as
`GLIBC_TUNABLES=<TUNABLES> python ...`. They must be there at start: glibc fixes its arenas
when a second thread first allocates, which importing jax does, so setting them from inside
the process (`mallopt`) comes too late once jax is imported, as it is by `import bertjax`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

TUNABLES = (
  "glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736"
)


def glibc() -> bool:
  """Whether this process's C library is glibc (the only one that reads `GLIBC_TUNABLES`)."""
  if not sys.platform.startswith("linux"):
    return False
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    return bool(libc.gnu_get_libc_version)  # musl has no such function
  except (OSError, AttributeError):
    return False


def applied(environ=None) -> bool:
  """Whether the options are in effect: glibc, and `GLIBC_TUNABLES` (as this process was
  started with it, or `environ`) sets every one of `TUNABLES`."""
  have = set((os.environ if environ is None else environ).get("GLIBC_TUNABLES", "").split(":"))
  return glibc() and set(TUNABLES.split(":")) <= have
