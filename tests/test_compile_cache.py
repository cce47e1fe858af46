"""`bertjax.compile_cache`: one folder per jaxlib and CPU, and a program compiled by one
process read by the next from disk instead of compiled again."""

import json
import subprocess
import sys

import pytest

from bertjax import compile_cache, utils

# A process that compiles one program and reports JAX's compile and cache-hit events.
CHILD = """
import json, jax, jax.numpy as jnp
from jax import monitoring
seen = {"compiles": 0, "hits": 0}
def on_duration(event, seconds, **kw):
  seen["compiles"] += event == "/jax/core/compile/backend_compile_duration"
def on_event(event, **kw):
  seen["hits"] += event == "/jax/compilation_cache/cache_hits"
monitoring.register_event_duration_secs_listener(on_duration)
monitoring.register_event_listener(on_event)
f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum() * 3.0)
value = float(f(jnp.arange(12.0).reshape(3, 4)))
print(json.dumps({**seen, "value": value}))
"""


def test_the_folder_names_jaxlib_and_the_cpu(tmp_path, monkeypatch):
  here = compile_cache.folder(tmp_path)
  assert here.parent == tmp_path and here.name.startswith("jaxlib-")
  assert compile_cache.folder(tmp_path) == here  # stable
  info = utils.cpu_info()
  other = dict(info, isa_flags=[*info["isa_flags"], "avx512_made_up"])
  monkeypatch.setattr(utils, "cpu_info", lambda: other)
  assert compile_cache.folder(tmp_path) != here  # another ISA: another folder


def test_enable_names_the_cache_for_child_processes(tmp_path):
  env = {}
  path = compile_cache.enable(tmp_path / "c", min_compile_s=0.5, environ=env)
  assert path.is_dir()
  assert env[compile_cache.ENV_DIR] == str(path)
  assert float(env[compile_cache.ENV_MIN_COMPILE_S]) == 0.5
  with pytest.raises(ValueError, match="min_compile_s"):
    compile_cache.enable(tmp_path, min_compile_s=-1.0, environ={})
  with pytest.raises(ValueError, match="keep_bytes"):
    compile_cache.enable(tmp_path, keep_bytes=0, environ={})


def test_prune_deletes_the_oldest_programs_first(tmp_path):
  import os

  for i, name in enumerate(("old", "mid", "new")):
    (tmp_path / name).write_bytes(b"x" * 100)
    os.utime(tmp_path / name, (1000 + i, 1000 + i))
  assert compile_cache.prune(tmp_path, keep_bytes=250) == 1
  assert sorted(p.name for p in tmp_path.iterdir()) == ["mid", "new"]
  assert compile_cache.prune(tmp_path, keep_bytes=250) == 0


def test_a_second_process_reads_the_program_instead_of_compiling_it(tmp_path):
  import os

  env = dict(os.environ)
  compile_cache.enable(tmp_path / "cache", environ=env)

  def child() -> dict:
    proc = subprocess.run(
      [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])

  first, second = child(), child()
  assert first["compiles"] >= 1 and first["hits"] == 0
  # JAX's compile event wraps reading from the cache too: every program was read, none built.
  assert second["hits"] == second["compiles"] == first["compiles"]
  assert second["value"] == first["value"]
  assert any((tmp_path / "cache").glob("*-cache"))
