"""Keeping freed host memory for reuse (`bertjax.host_memory.TUNABLES`) against glibc's defaults.

Run (full, CPU):  JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_host_memory.py
                  (about 10 minutes on 2 cores; writes benchmarks/results/host_memory_cpu.*)
Check (tiny):     JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_host_memory.py --smoke

The malloc options are process-wide and set before anything is allocated, so the two modes
cannot share a process: each measurement is a fresh process, and the processes alternate
(reuse, default, reuse, default, ...) so that the machine's drift falls on both alike. Each
process times a BERT-base forward pass (8 x 128, random weights) and every edge's EAP scores
(`bench_edges`' task) over `--rounds` interleaved rounds after two warm-up calls, compile
apart, and counts the minor page faults of one more call of each.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import time

import common

from bertjax import host_memory, timing

HERE = pathlib.Path(__file__).resolve().parent


def one_process(mode: str, smoke: bool, rounds: int) -> dict:
  """In this process (freshly started): the medians and the page faults of each task."""
  if host_memory.applied() != (mode == "reuse"):
    raise SystemExit(f"bench_host_memory: GLIBC_TUNABLES does not match mode {mode!r}")
  from types import SimpleNamespace

  import bench_edges

  tasks = bench_edges._tasks(SimpleNamespace(smoke=smoke, batch=8, seq=128))
  tasks = {k: tasks[k] for k in ("forward", "eap")}
  times = timing.interleaved(tasks, rounds)
  faults = {}
  for k, f in tasks.items():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    f()
    faults[k] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
  return {
    k: {"median_s": t["median_s"], "times_s": t["times_s"], "page_faults": faults[k]}
    for k, t in times.items()
  }


def markdown(report: dict) -> str:
  m = report["machine"]
  rows = []
  for i, pair in enumerate(report["pairs_results"], 1):
    for task in ("forward", "eap"):
      a, b = pair["reuse"][task], pair["default"][task]
      rows.append(
        (
          i,
          task,
          f"{a['median_s']:.3f}",
          f"{b['median_s']:.3f}",
          f"{a['median_s'] / b['median_s']:.2f}",
          a["page_faults"],
          b["page_faults"],
        )
      )
  header = (
    "pair",
    "task",
    "reuse s",
    "default s",
    "reuse / default",
    "faults, reuse",
    "faults, default",
  )
  return (
    "\n".join(
      [
        (
          f"# Freed host memory kept for reuse against glibc's defaults ({m['cpu']}, "
          f"{m['cpus']} cores, ISA: {', '.join(m['isa_flags'])}; jax {report['jax']})"
        ),
        "",
        (
          f"{report['shape']}, batch 8 x 128, float32, random weights; {report['pairs']} pairs of "
          f"fresh processes, alternating; per process the median of {report['rounds']} "
          "interleaved rounds, compile apart; page faults: minor faults of one call."
        ),
        "",
        *common.table(header, rows),
      ]
    )
    + "\n"
  )


def main(argv=None) -> int:
  p = common.parser(__doc__, rounds=5)
  p.add_argument("--pairs", type=common.at_least(1), default=2, help="process pairs")
  p.add_argument("--one-process", choices=("reuse", "default"), help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.smoke:
    args.pairs, args.rounds = 1, 1
  if args.one_process:
    print(json.dumps(one_process(args.one_process, args.smoke, args.rounds)))
    return 0
  pairs = []
  start = time.perf_counter()
  for i in range(args.pairs):
    pair = {}
    for mode in ("reuse", "default"):
      cmd = [sys.executable, str(HERE / "bench_host_memory.py"), "--one-process", mode]
      cmd += ["--rounds", str(args.rounds)] + (["--smoke"] if args.smoke else [])
      env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
      if mode == "reuse":
        env["GLIBC_TUNABLES"] = host_memory.TUNABLES
      out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
      if out.returncode != 0:
        sys.stderr.write(out.stderr[-4000:])
        return out.returncode
      pair[mode] = json.loads(out.stdout.strip().splitlines()[-1])
      print(
        f"pair {i + 1}/{args.pairs} {mode}: "
        + ", ".join(f"{k} {v['median_s']:.3f} s" for k, v in pair[mode].items())
        + f" ({time.perf_counter() - start:.0f} s)",
        file=sys.stderr,
        flush=True,
      )
    pairs.append(pair)
  import jax

  report = {
    "machine": timing.machine(),
    "jax": jax.__version__,
    "shape": "smoke" if args.smoke else "BERT-base",
    "pairs": args.pairs,
    "rounds": args.rounds,
    "pairs_results": pairs,
  }
  common.write(report, markdown(report), args.out, "host_memory_cpu", files=not args.smoke)
  return 0


if __name__ == "__main__":
  sys.exit(main())
