"""XLA:CPU options bertjax sets for its process, and how to keep XLA's own defaults.

jax 0.10's XLA:CPU hands matmuls and the elementwise ops around them to YNNPACK library
fusions by default. For BERT's shapes those fusions are slower than XLA's own dot and
loop emitters. Measured on a 2-core AMD EPYC (Zen 4: AVX-512, no AMX), float32, jax 0.10.2,
4 BERT-base blocks: forward 32 x 128 1693 -> 1351 ms, 8 x 512 1958 -> 1683 ms, the
gradient 32 x 128 6098 -> 5695 ms, outputs equal to 3e-6 (`benchmarks/bench_forward.py`
measures both settings side by side on any machine).

`import bertjax` therefore adds `CPU_OPTIONS` to the `XLA_FLAGS` environment variable,
which XLA reads when it compiles, so every program compiled afterwards in the process uses
them, the user's own `jax.jit(bertjax.forward)` included. Nothing is changed when
`XLA_FLAGS` already names an option (the user's setting wins) or when the environment sets
`BERTJAX_XLA_DEFAULTS=0`. The options are debug options of XLA:CPU: other backends ignore
them. To use them for one program only, pass `jax.jit(f, compiler_options=CPU_OPTIONS)`.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

# Option name -> value; an empty value turns every YNNPACK fusion type off.
CPU_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}
OPT_OUT = "BERTJAX_XLA_DEFAULTS"


def apply(environ: MutableMapping[str, str] | None = None) -> list[str]:
  """Adds the `CPU_OPTIONS` the user has not set to `XLA_FLAGS`; returns the names added."""
  environ = os.environ if environ is None else environ
  if environ.get(OPT_OUT, "1").strip().lower() in ("0", "false", "no", "off"):
    return []
  flags = environ.get("XLA_FLAGS", "")
  added = [name for name in CPU_OPTIONS if f"--{name}" not in flags]
  if added:
    extra = " ".join(f"--{name}={CPU_OPTIONS[name]}" for name in added)
    environ["XLA_FLAGS"] = f"{flags} {extra}".strip()
  return added


def without_cpu_options(flags: str) -> str:
  """`flags` (an `XLA_FLAGS` value) with every `CPU_OPTIONS` entry removed: XLA's defaults."""
  return " ".join(f for f in flags.split() if f.lstrip("-").split("=")[0] not in CPU_OPTIONS)
