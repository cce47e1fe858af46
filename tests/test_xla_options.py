"""The XLA:CPU options `import bertjax` sets: added once, never over the user's, same numbers."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

import bertjax
from bertjax import xla_options


def test_apply_adds_each_option_once_and_keeps_the_users_flags():
  env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
  assert xla_options.apply(env) == list(xla_options.CPU_OPTIONS)
  assert env["XLA_FLAGS"] == ("--xla_force_host_platform_device_count=8 "
                              "--xla_cpu_experimental_ynn_fusion_type=")
  assert xla_options.apply(env) == []  # a second import changes nothing
  assert env["XLA_FLAGS"].count("ynn_fusion_type") == 1
  assert (xla_options.without_cpu_options(env["XLA_FLAGS"])
          == "--xla_force_host_platform_device_count=8")


def test_user_setting_and_opt_out_win():
  env = {"XLA_FLAGS": "--xla_cpu_experimental_ynn_fusion_type=dot"}
  assert xla_options.apply(env) == [] and env["XLA_FLAGS"].endswith("=dot")
  env = {xla_options.OPT_OUT: "0"}
  assert xla_options.apply(env) == [] and "XLA_FLAGS" not in env


def test_import_sets_the_flag_in_a_fresh_process():
  code = "import os, bertjax; print(os.environ.get('XLA_FLAGS', ''))"
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", xla_options.OPT_OUT)}
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       check=True).stdout
  assert "--xla_cpu_experimental_ynn_fusion_type=" in out
  env[xla_options.OPT_OUT] = "0"
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       check=True).stdout
  assert "ynn_fusion_type" not in out


def test_forward_equals_the_xla_default_compilation():
  """The options change which emitter runs the dots, not the function: with YNNPACK's dot
  fusions on (XLA's default emitter for them) and off, outputs agree to float32 rounding."""
  config = bertjax.BertConfig(vocab_size=120, hidden_size=64, num_hidden_layers=2,
                              num_attention_heads=4, intermediate_size=128)
  params = bertjax.init(config, 0)
  ids = jnp.asarray(np.random.default_rng(0).integers(5, 120, (3, 17)), jnp.int32)
  mask = jnp.ones_like(ids).at[1, 9:].set(0)
  fn = lambda p, x, m: bertjax.forward(p, config, x, m).last_hidden_state
  ours = jax.jit(fn, compiler_options=xla_options.CPU_OPTIONS)(params, ids, mask)
  ynn = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"}
  with_ynn = jax.jit(fn, compiler_options=ynn)(params, ids, mask)
  np.testing.assert_allclose(np.asarray(ours), np.asarray(with_ynn), atol=2e-5, rtol=0)
