"""The XLA:CPU options `import bertjax` sets: added once, never over the user's, same numbers."""

import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax import xla_options


def test_apply_adds_each_option_once_and_keeps_the_users_flags():
  env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
  assert xla_options.apply(env) == list(xla_options.CPU_OPTIONS)
  assert env["XLA_FLAGS"] == (
    "--xla_force_host_platform_device_count=8 "
    "--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_REDUCE"
  )
  assert xla_options.apply(env) == []  # a second import changes nothing
  assert env["XLA_FLAGS"].count("ynn_fusion_type") == 1
  assert (
    xla_options.without_cpu_options(env["XLA_FLAGS"]) == "--xla_force_host_platform_device_count=8"
  )


def test_user_setting_and_opt_out_win():
  env = {"XLA_FLAGS": "--xla_cpu_experimental_ynn_fusion_type=dot"}
  assert xla_options.apply(env) == [] and env["XLA_FLAGS"].endswith("=dot")
  env = {xla_options.OPT_OUT: "0"}
  assert xla_options.apply(env) == [] and "XLA_FLAGS" not in env


def test_import_sets_the_flag_in_a_fresh_process():
  code = "import os, bertjax; print(os.environ.get('XLA_FLAGS', ''))"
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", xla_options.OPT_OUT)}
  out = subprocess.run(
    [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
  ).stdout
  assert "--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_REDUCE" in out
  env[xla_options.OPT_OUT] = "0"
  out = subprocess.run(
    [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
  ).stdout
  assert "ynn_fusion_type" not in out


def test_forward_equals_the_xla_default_compilation():
  """The options change which emitter runs the attention and the dots, not the function:
  with bertjax's options, with YNNPACK's dot fusions and with every YNNPACK fusion off,
  outputs agree to float32 rounding."""
  config = bertjax.BertConfig(
    vocab_size=120,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
  )
  params = bertjax.init(config, 0)
  ids = jnp.asarray(np.random.default_rng(0).integers(5, 120, (3, 17)), jnp.int32)
  mask = jnp.ones_like(ids).at[1, 9:].set(0)
  fn = lambda p, x, m: bertjax.forward(p, config, x, m).last_hidden_state
  ours = jax.jit(fn, compiler_options=xla_options.CPU_OPTIONS)(params, ids, mask)
  ynn = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"}
  with_ynn = jax.jit(fn, compiler_options=ynn)(params, ids, mask)
  np.testing.assert_allclose(np.asarray(ours), np.asarray(with_ynn), atol=2e-5, rtol=0)
  off = {"xla_cpu_experimental_ynn_fusion_type": ""}
  without = jax.jit(fn, compiler_options=off)(params, ids, mask)
  np.testing.assert_allclose(np.asarray(ours), np.asarray(without), atol=2e-5, rtol=0)


def test_the_reduce_fusion_takes_the_attention_and_not_the_layer_norms():
  """What the options are for: a YNNPACK fusion of the softmax with its product with the
  values (output (batch, heads, seq, head_dim)), and none for the LayerNorms' statistics."""
  config = bertjax.BertConfig(
    vocab_size=120,
    hidden_size=64,
    num_hidden_layers=1,
    num_attention_heads=4,
    intermediate_size=128,
  )
  params = bertjax.init(config, 0)
  ids = jnp.ones((8, 128), jnp.int32)  # YNNPACK's cost model leaves tiny shapes to XLA
  fn = lambda p, x: bertjax.forward(p, config, x).last_hidden_state
  text = jax.jit(fn, compiler_options=xla_options.CPU_OPTIONS).lower(params, ids).compile()
  text = text.as_text()
  calls = dict(re.findall(r"%ynn_fusion[.\d]* = (\S+)\{[\d,]*\} fusion\(.*calls=(%[\w.]+)", text))
  assert "f32[8,4,128,16]" in calls, calls
  body = text.split(f"{calls['f32[8,4,128,16]']} ")[1].split("\n}\n")[0]
  assert " dot(" in body and " exponential(" in body and " reduce(" in body
  assert not [shape for shape in calls if shape.startswith(("f32[8,128]", "f32[8,128,1]"))]


_CACHE_ROUND_TRIP = """
import json, sys
import jax, jax.numpy as jnp, numpy as np
import bertjax
from jax._src import monitoring
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
hits = []
monitoring.register_event_listener(
    lambda name, **kw: hits.append(name) if name == "/jax/compilation_cache/cache_hits" else None)
config = bertjax.BertConfig(vocab_size=120, hidden_size=64, num_hidden_layers=2,
                            num_attention_heads=4, intermediate_size=128)
params = bertjax.init(config, 0)
ids = jnp.asarray(np.random.default_rng(0).integers(5, 120, (8, 128)), jnp.int32)
loss = lambda p, x: bertjax.forward(p, config, x).last_hidden_state.std()
step = jax.jit(jax.value_and_grad(loss))
text = step.lower(params, ids).compile().as_text()
value, grads = step(params, ids)
print(json.dumps({"ynn": text.count("ynn_fusion"), "hits": len(hits), "value": float(value),
                  "grad": float(jnp.abs(grads["encoder"]["layers"]["attention"]["query"]["kernel"]).sum())}))
"""


def test_a_cached_executable_with_the_reduce_fusion_reads_back(tmp_path):
  """JAX's persistent compilation cache writes a program with a YNNPACK reduce fusion (a
  forward and its gradient under the layer scan) in one process and a second process reads
  it back and runs it: same numbers, no recompilation."""
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", xla_options.OPT_OUT)}
  runs = [
    json.loads(
      subprocess.run(
        [sys.executable, "-c", _CACHE_ROUND_TRIP, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
      ).stdout.splitlines()[-1]
    )
    for _ in range(2)
  ]
  assert runs[0]["ynn"] > 0 and runs[0]["hits"] == 0
  assert runs[1]["hits"] >= 1
  assert (runs[1]["value"], runs[1]["grad"]) == (runs[0]["value"], runs[0]["grad"])


def test_the_smoke_runs_cache_is_private_and_off_afterwards():
  """`bertjax.study.smoke_compilation_cache`: inside, a cache of its own that a second
  compile writes to; afterwards the process's own cache setting is back (JAX keeps its cache
  object once built, so restoring the config value alone would not do it) and the directory
  is gone."""
  from jax._src import compilation_cache as cc

  from bertjax import study

  backend = jax.extend.backend.get_backend()
  fn = lambda x: jnp.tanh(x) @ x.T
  x = jnp.ones((64, 64))
  suite_cache = jax.config.jax_compilation_cache_dir
  if suite_cache:  # the suite's cache (tests/conftest.py) stays in place
    with study.smoke_compilation_cache():
      assert jax.config.jax_compilation_cache_dir == suite_cache
    # Without a cache of the process's own, the smoke run makes a private one.
    jax.config.update("jax_compilation_cache_dir", None)
    cc.reset_cache()
  try:
    _check_private_smoke_cache(study, cc, backend, fn, x)
  finally:
    jax.config.update("jax_compilation_cache_dir", suite_cache)
    cc.reset_cache()


def _check_private_smoke_cache(study, cc, backend, fn, x):
  before = jax.config.jax_compilation_cache_dir
  with study.smoke_compilation_cache():
    path = pathlib.Path(jax.config.jax_compilation_cache_dir)
    assert path.name.startswith("bertjax-smoke-jax-cache-")
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # restored below
    jax.jit(fn)(x).block_until_ready()
    assert list(path.glob("*-cache")), "the program was written to the private cache"
    assert pathlib.Path(cc._get_cache(backend)._path) == path
  assert jax.config.jax_compilation_cache_dir == before
  # JAX's cache object would keep the private path after the config value went back: it is
  # gone, and the process's own cache (the suite's, tests/conftest.py) is built afresh.
  assert not path.exists()
  own = cc._get_cache(backend)
  assert (own is None) == (not before)
  assert own is None or pathlib.Path(own._path) == pathlib.Path(before)
  with study.smoke_compilation_cache(enabled=False):
    assert jax.config.jax_compilation_cache_dir == before


def test_release_compiled_programs_frees_their_memory_mappings():
  """Each XLA:CPU program holds memory mappings until JAX drops it (the cause of the test
  workers' segfaults once mappings ran out); the release frees them, and only past its
  threshold."""
  from bertjax import utils

  start, limit = utils.memory_maps()
  if not limit:
    pytest.skip("no /proc/self/maps here (not Linux)")
  kept = []
  for i in range(60):  # 60 distinct programs, each called once and kept alive
    f = jax.jit(lambda x, i=i: jnp.tanh(x * i).sum(-1) + (jax.nn.softmax(x, -1) @ x.T).sum(-1))
    f(jnp.ones((4, 8 + i))).block_until_ready()
    kept.append(f)
  x = jnp.ones((4, 11))
  before = np.asarray(kept[3](x))
  grown = utils.memory_maps()[0]
  assert grown - start >= 5 * 60, (start, grown)
  assert not utils.release_compiled_programs(fraction=1.0)
  assert utils.release_compiled_programs(fraction=grown / limit / 2)
  assert utils.memory_maps()[0] < grown - 4 * 60
  np.testing.assert_array_equal(kept[3](x), before)  # compiled again, the same program
  with pytest.raises(ValueError, match="fraction must be in"):
    utils.release_compiled_programs(fraction=0.0)


def test_cpu_info_names_the_cpu_and_its_vector_isa():
  """Every committed figure records `utils.cpu_info()`: the model name and the ISA flags that
  matter for matrix products, read from /proc/cpuinfo."""
  from bertjax.utils import cpu_info

  info = cpu_info()
  assert info["cpu"] and info["cpus"] >= info["cpus_usable"] >= 1
  text = pathlib.Path("/proc/cpuinfo").read_text() if pathlib.Path("/proc/cpuinfo").exists() else ""
  flags = next(
    (set(ln.split(":", 1)[1].split()) for ln in text.splitlines() if ln.startswith("flags")), set()
  )
  assert set(info["isa_flags"]) <= flags
  assert ("avx2" in info["isa_flags"]) == ("avx2" in flags)
  assert all(
    f in ("avx2", "avx_vnni") or f.startswith(("avx512", "amx")) for f in info["isa_flags"]
  )
