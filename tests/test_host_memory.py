"""`bertjax.host_memory`: `./run.sh` exports the options the module names, and `applied` reads
them. Their effect (page faults and time per EAP call) is measured by
`benchmarks/bench_host_memory.py`, in fresh processes: a small program's faults depend on when
its results are freed, which made a fault count here flaky."""

import pathlib

import pytest

from bertjax import host_memory

pytestmark = pytest.mark.skipif(not host_memory.glibc(), reason="glibc's malloc only")


def test_run_sh_exports_the_same_tunables():
  assert host_memory.applied({"GLIBC_TUNABLES": "a=1:" + host_memory.TUNABLES})
  assert not host_memory.applied({"GLIBC_TUNABLES": "glibc.malloc.arena_max=1"})
  run_sh = (pathlib.Path(__file__).resolve().parents[1] / "run.sh").read_text()
  assert f'local t="{host_memory.TUNABLES}"' in run_sh
