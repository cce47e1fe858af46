"""`bertjax.timing`: side-by-side timing (interleaved rounds, warm-up and compile apart), the
machine a figure names, the progress loop."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import timing, utils


def _recording(names, log):
  return {n: (lambda n=n: log.append(n) or n) for n in names}


def test_first_calls_and_warm_up_come_before_rounds_whose_order_rotates():
  log = []
  got = timing.interleaved(_recording("abc", log), 4, warmup=2, wait=lambda x: x)
  # Each call's first call and its warm-up, apart and untimed, then the rounds.
  assert log[:9] == list("aaabbbccc")
  assert log[9:] == [*"abc", *"bca", *"cab", *"abc"]  # one rotation per round
  assert list(got) == ["a", "b", "c"]
  for t in got.values():
    assert len(t["times_s"]) == 4 and t["first_call_s"] >= 0
    assert t["median_s"] == np.median(t["times_s"]) and t["min_s"] == min(t["times_s"])


def test_each_clock_times_its_own_call():
  import time

  calls = {"fast": lambda: None, "slow": lambda: time.sleep(0.05), "fast2": lambda: None}
  got = timing.interleaved(calls, 3, warmup=0, wait=None)
  assert got["slow"]["min_s"] >= 0.05 > max(got["fast"]["median_s"], got["fast2"]["median_s"])


def test_without_rotation_or_first_call_the_order_is_as_given():
  log, outputs = [], {}
  got = timing.interleaved(
    _recording("ab", log), 2, warmup=0, rotate=False, first_call=False, outputs=outputs, wait=None
  )
  assert log == list("abab") and outputs == {"a": "a", "b": "b"}
  assert all(t["first_call_s"] == t["times_s"][0] for t in got.values())
  got = timing.interleaved(_recording("ab", log), 3, cpu_time=True, wait=lambda x: x)
  assert all(len(t["cpu_times_s"]) == 3 and t["cpu_min_s"] >= 0 for t in got.values())


def test_rounds_are_reported_together_and_ratios_pair_them():
  seen = []
  clock = iter([0.5, 2.0, 0.25, 1.0, 0.125, 0.5])  # a worker's own seconds, round by round
  calls = {"unit": lambda: next(clock), "task": lambda: next(clock)}
  got = timing.interleaved(
    calls,
    3,
    first_call=False,
    warmup=0,
    own_clock=("unit", "task"),
    on_round=lambda r, s: seen.append((r, s)),
    wait=lambda x: x,
  )
  # Rotation: round 1 calls the task first, so it reads the clock's next value first.
  assert got["unit"]["times_s"] == [0.5, 1.0, 0.125]
  assert got["task"]["times_s"] == [2.0, 0.25, 0.5]
  assert seen[1] == (1, {"unit": 1.0, "task": 0.25})
  assert timing.ratios(got["task"], got["unit"]) == [4.0, 0.25, 4.0]


def test_compile_is_measured_apart_from_every_run():
  """compile_ahead compiles; the first call, the warm-up and the rounds then compile nothing."""
  x = jnp.asarray(np.random.default_rng(0).standard_normal((64, 64)), jnp.float32)
  fns = {"square": (lambda a: a @ a, (x,)), "tanh": (lambda a: jnp.tanh(a).sum(0), (x,))}
  calls = {name: timing.compile_ahead(fn, *args)[0] for name, (fn, args) in fns.items()}
  before, outputs = utils.compiled_programs(), {}
  timing.interleaved(calls, 3, warmup=2, outputs=outputs)
  assert utils.compiled_programs() == before
  np.testing.assert_allclose(outputs["square"], x @ x, rtol=1e-5)
  got = timing.compiled_side_by_side(fns, 2, warmup=0)
  for t in got.values():
    assert t["compile_s"] > 0 and t["first_call_s"] > 0 and len(t["times_s"]) == 2


def test_bad_counts_and_names_are_refused():
  with pytest.raises(ValueError, match="rounds=0 must be >= 1"):
    timing.interleaved({"a": lambda: 1}, 0)
  with pytest.raises(ValueError, match="warmup=-1"):
    timing.interleaved({"a": lambda: 1}, 1, warmup=-1)
  with pytest.raises(ValueError, match=r"own_clock names \['b'\]"):
    timing.interleaved({"a": lambda: 1}, 1, own_clock=("b",))


def test_the_machine_is_named():
  m = timing.machine(extra_key=1)
  assert m["cpu"] and m["cpus"] >= 1 and m["device"] and m["jax"] == jax.__version__
  assert m["extra_key"] == 1 and ("accelerator" in m) == (jax.default_backend() != "cpu")
  line = timing.describe(m)
  assert m["cpu"] in line and f"jax {jax.__version__}" in line
  cpu = {"cpu": "AMD EPYC", "cpus": 2, "isa_flags": ["avx2", "avx512f"], "jax": "0.10.2"}
  assert timing.describe(cpu) == "2-core AMD EPYC (AVX2, AVX-512), jax 0.10.2"
  zen4 = {**cpu, "cpu_family_model_stepping": ["25", "17", "1"]}
  assert timing.describe(zen4) == "2-core AMD EPYC (family 25 model 17; AVX2, AVX-512), jax 0.10.2"
  gpu = {**cpu, "isa_flags": [], "accelerator": "NVIDIA H200"}
  assert timing.describe(gpu) == "NVIDIA H200 (host: 2-core AMD EPYC (no AVX2)), jax 0.10.2"


def test_steps_is_a_range_under_a_bar(capsys):
  assert list(timing.steps(3, "quiet", show=False)) == [0, 1, 2]
  losses = []
  for i in timing.steps(4, "fit", postfix=lambda: {"loss": f"{losses[-1]:.2f}"}):
    losses.append(1.0 / (i + 1))
  assert len(losses) == 4
  err = capsys.readouterr().err
  assert "fit" in err and "4/4" in err and "loss=0.25" in err
