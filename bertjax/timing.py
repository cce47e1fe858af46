"""Timing: the one way the benchmarks and the library time what they compare, and name the
machine a figure comes from.

`interleaved` times several calls side by side: each call's first call apart (`first_call_s`:
its compile, when it compiles), `warmup` untimed calls, then `rounds` rounds that make every
call once, in an order rotated by one each round, so that a slow spell of a shared machine
falls on all of them alike; `ratios` reads two calls' times round by round. `compile_ahead`
compiles a function apart (`jax.jit(fn).lower(*args).compile()`), so that its compile time
is measured apart from any run, and `compiled_side_by_side` does both for several
functions. `machine` records what a figure comes from (the CPU as `utils.cpu_info` names it,
JAX, its backend and device kind, the accelerator), `describe` says it in one line.
`steps` is the one progress-bar loop of the library's small trainers.

Nothing here imports JAX when the module is imported, and only the standard library at all
unless asked: a benchmark's peer in a side environment without JAX (bench_tl's
TransformerLens side) loads this file by its path and waits on its own results (`wait`).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any


def _block(x: Any) -> Any:
  import jax

  return jax.block_until_ready(x)


def timed(
  call: Callable[[], Any], *, wait: Callable[[Any], Any] | None = None
) -> tuple[Any, float]:
  """`(call(), seconds)`: one call, timed until its result is ready (`wait`; by default
  `jax.block_until_ready`)."""
  wait = _block if wait is None else wait
  t0 = time.perf_counter()
  out = wait(call())
  return out, time.perf_counter() - t0


def interleaved(
  calls: Mapping[str, Callable[[], Any]],
  rounds: int,
  *,
  warmup: int = 1,
  rotate: bool = True,
  first_call: bool = True,
  wait: Callable[[Any], Any] | None = None,
  own_clock: Collection[str] = (),
  outputs: dict[str, Any] | None = None,
  on_round: Callable[[int, dict[str, float]], None] | None = None,
  log: Callable[[str], None] | None = None,
  cpu_time: bool = False,
) -> dict[str, dict[str, Any]]:
  """Wall times of several calls measured side by side, so that machine load falls on all
  alike.

  Each call is made once (`first_call_s`: its compile, if it compiles) and `warmup` times
  more, untimed, before the next call's turn; then each of `rounds` rounds makes every call
  once, in an order rotated by one each round with `rotate` (else in the given order). A
  call's result is waited for before its clock stops.

  Args:
    calls: name -> a function of no arguments.
    rounds: timed rounds (>= 1).
    warmup: untimed calls after the first (>= 0).
    rotate: rotate the order each round.
    first_call: make the first call apart; without it (a peer's eager sweep too slow to run
      twice: nothing to compile), `first_call_s` is the first round's time.
    wait: applied to each result before the clock stops (default `jax.block_until_ready`;
      a torch peer on a GPU passes its synchronisation).
    own_clock: names whose call returns its own seconds (a worker process that times itself,
      so that the round trip of its pipe is not counted).
    outputs: a dict that receives each call's first result.
    on_round: called after each round with (round index, {name: seconds}).
    log: given one line per call once timed ("name: first call 1.23 s, then 0.0456 s").
    cpu_time: also record this process's CPU time of each timed call (all its threads;
      less disturbed than wall time by other processes on a shared machine).

  Returns:
    `{name: {"first_call_s", "times_s": [one per round], "median_s", "min_s"}}`, in the
    order of `calls`, with `"cpu_times_s"` and `"cpu_min_s"` when `cpu_time`; `times_s[r]`
    of every call come from the same round r.
  """
  if rounds < 1 or warmup < 0:
    raise ValueError(f"rounds={rounds} must be >= 1 and warmup={warmup} >= 0")
  if unknown := set(own_clock) - set(calls):
    raise ValueError(f"own_clock names {sorted(unknown)} that are not among calls {list(calls)}")
  wait = _block if wait is None else wait

  def run(name: str) -> tuple[Any, float]:
    out, seconds = timed(calls[name], wait=wait)
    return out, float(out) if name in own_clock else seconds

  times: dict[str, dict[str, Any]] = {name: {"first_call_s": None, "times_s": []} for name in calls}
  for name in calls:
    if first_call:
      out, times[name]["first_call_s"] = run(name)
      if outputs is not None:
        outputs[name] = out
    for _ in range(warmup):
      run(name)
  names = list(calls)
  for r in range(rounds):
    k = r % len(names) if rotate else 0
    this_round = {}
    for name in names[k:] + names[:k]:
      cpu0 = time.process_time()
      out, this_round[name] = run(name)
      times[name]["times_s"].append(this_round[name])
      if cpu_time:
        times[name].setdefault("cpu_times_s", []).append(time.process_time() - cpu0)
      if not first_call and r == 0 and outputs is not None:
        outputs[name] = out
    if on_round is not None:
      on_round(r, {name: this_round[name] for name in names})
  for name, t in times.items():
    if t["first_call_s"] is None:
      t["first_call_s"] = t["times_s"][0]
    t["median_s"], t["min_s"] = statistics.median(t["times_s"]), min(t["times_s"])
    if cpu_time:
      t["cpu_min_s"] = min(t["cpu_times_s"])
    if log is not None:
      log(f"{name}: first call {t['first_call_s']:.2f} s, then {t['median_s']:.4f} s")
  return times


def ratios(times: Mapping[str, Any], unit: Mapping[str, Any]) -> list[float]:
  """Round by round, `times`'s seconds over `unit`'s (two entries of one `interleaved`
  result): a slow spell of the machine then falls on both sides of each ratio."""
  return [a / b for a, b in zip(times["times_s"], unit["times_s"], strict=True)]


def compile_ahead(fn: Callable, *args: Any) -> tuple[Callable[[], Any], float]:
  """`fn` jitted (unless it is already), lowered and compiled for `args`, apart from any run.

  Returns:
    `(a function of no arguments running the compiled program on args, compile seconds)`.
  """
  import jax

  jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
  t0 = time.perf_counter()
  compiled = jitted.lower(*args).compile()
  return functools.partial(compiled, *args), time.perf_counter() - t0


def compiled_side_by_side(
  fns: Mapping[str, tuple[Callable, tuple]], rounds: int, **kwargs: Any
) -> dict[str, dict[str, Any]]:
  """Each `name -> (fn, args)` compiled ahead (`compile_ahead`), then all timed side by side
  (`interleaved`, which takes `kwargs`); its first call is then a run, not a compile.

  Returns:
    `interleaved`'s entries with `"compile_s"` added.
  """
  calls, compile_s = {}, {}
  for name, (fn, args) in fns.items():
    calls[name], compile_s[name] = compile_ahead(fn, *args)
  times = interleaved(calls, rounds, **kwargs)
  return {name: {"compile_s": compile_s[name], **t} for name, t in times.items()}


def machine(*, torch: bool = False, **extra: Any) -> dict[str, Any]:
  """What a figure comes from: the CPU (`bertjax.utils.cpu_info`: model, vendor, family/model/
  stepping, ISA flags, cores), Python, the platform, JAX and its backend and device kind, the
  accelerator if any, the thread and XLA settings of the environment, and PyTorch's version
  and threads when it is loaded (or `torch`: load it); `extra` entries are added."""
  import os
  import platform
  import sys

  import jax

  from bertjax.utils import cpu_info

  if torch:
    import torch as _  # noqa: F401  (its version and threads are recorded)

  info = {
    **cpu_info(),
    "python": platform.python_version(),
    "platform": platform.platform(),
    "jax": jax.__version__,
    "backend": jax.default_backend(),
    "device": str(jax.devices()[0].device_kind),
    "xla_flags": os.environ.get("XLA_FLAGS", ""),
    "env": {
      k: os.environ[k]
      for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "XLA_FLAGS")
      if k in os.environ
    },
  }
  if jax.default_backend() != "cpu":
    info["accelerator"] = jax.devices()[0].device_kind
  loaded = sys.modules.get("torch")
  if loaded is not None:
    info.update(
      torch=loaded.__version__,
      torch_threads=loaded.get_num_threads(),
      torch_interop_threads=loaded.get_num_interop_threads(),
    )
  return {**info, **extra}


def _isa(flags: Collection[str]) -> str:
  """The vector ISA families of `cpu_info`'s flags: "AVX2", "AVX-512", "AMX", ..."""
  found = [
    name
    for name, has in (
      ("AVX2", "avx2" in flags),
      ("AVX-VNNI", "avx_vnni" in flags),
      ("AVX-512", any(f.startswith("avx512") for f in flags)),
      ("AMX", any(f.startswith("amx") for f in flags)),
    )
    if has
  ]
  return ", ".join(found) or "no AVX2"


def describe(m: Mapping[str, Any]) -> str:
  """`machine`'s record in one line: "2-core AMD EPYC (family 25 model 17; AVX2, AVX-512),
  jax 0.10.2" on a CPU (family and model tell apart CPUs that a virtual machine names alike),
  "NVIDIA H200 (host: 16-core ...), jax ..." with an accelerator."""
  family, model = (list(m.get("cpu_family_model_stepping") or ()) + [None, None])[:2]
  kind = f"family {family} model {model}; " if family and model else ""
  isa = _isa(m.get("isa_flags", ()))
  cpu = f"{m.get('cpus', '?')}-core {m.get('cpu', '?')} ({kind}{isa})"
  where = f"{m['accelerator']} (host: {cpu})" if m.get("accelerator") else cpu
  return where + (f", jax {m['jax']}" if m.get("jax") else "")


def steps(
  total: int,
  desc: str,
  *,
  show: bool = True,
  leave: bool = True,
  postfix: Callable[[], Mapping[str, Any]] | None = None,
) -> Iterator[int]:
  """`range(total)` under a tqdm bar (when `show`) that advances after each step's body and
  shows `postfix()` (read after the body: the step's loss, say); the bar closes when the loop
  ends, however it ends."""
  if not show:
    yield from range(total)
    return
  from tqdm.auto import tqdm

  bar = tqdm(total=total, desc=desc, unit="step", leave=leave)
  try:
    for i in range(total):
      yield i
      bar.update(1)
      if postfix is not None:
        bar.set_postfix(postfix())
  finally:
    bar.close()
