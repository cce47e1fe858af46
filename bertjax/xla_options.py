"""XLA:CPU options bertjax sets for its process, and how to keep XLA's own defaults.

jax 0.10's XLA:CPU can hand parts of a program to YNNPACK library fusions, chosen by type
(`xla_cpu_experimental_ynn_fusion_type`). bertjax enables the *reduce* type alone: it
fuses each attention's softmax with the probabilities-times-values product (exp, row sums,
the batched dot and the normalisation in one YNNPACK subgraph), which XLA's own emitters run
as separate passes over the `(B, H, T, T)` scores. The *dot* types (matmuls with their
elementwise neighbours) stay off: for BERT's shapes they are slower than XLA's own dot and
loop emitters. Measured on a 2-core AMD EPYC (Zen 4: AVX-512, no AMX), float32, jax 0.10.2,
BERT-base forward, medians of interleaved runs in one process, against every YNNPACK fusion
off: 8 x 128 0.96x the time, 32 x 128 0.94x, all-MiniLM-L6-v2-shaped 8 x 128 0.89x,
attention maps 8 x 128 0.93x, the head-mask gradient 1.00x; outputs equal to 3e-6.
(Earlier, with every type at XLA's default: 4 BERT-base blocks, forward 32 x 128 1693 ms vs
1351 ms with every type off.) LayerNorm statistics on the CPU are matrix-vector products,
not reductions (`bertjax.model.layers.Norm`), so the reduce fusions take the attention only.

`import bertjax` therefore adds `CPU_OPTIONS` to the `XLA_FLAGS` environment variable,
which XLA reads when it compiles, so every program compiled afterwards in the process uses
them, the user's own `jax.jit(bertjax.forward)` included. Nothing is changed when
`XLA_FLAGS` already names an option (the user's setting wins) or when the environment sets
`BERTJAX_XLA_DEFAULTS=0`. The options are debug options of XLA:CPU: other backends ignore
them. To use them for one program only, pass `jax.jit(f, compiler_options=CPU_OPTIONS)`.

Programs with a YNNPACK fusion go through JAX's persistent compilation cache like any other:
`tests/test_xla_options.py` writes a forward-and-gradient program in one process and reads it
back in another. The test workers that segfaulted inside XLA on 2026-11-25 and -26 (in a
compile, and twice reading that cache) were not meeting a fault of the fusion: they had run
out of memory mappings, with the fusion on or off (`bertjax.utils.release_compiled_programs`
has the cause and the remedy).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

# Option name -> value (the form both XLA_FLAGS and `compiler_options` accept): YNNPACK's
# reduce fusions on, every other YNNPACK fusion type off.
CPU_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_REDUCE"}
OPT_OUT = "BERTJAX_XLA_DEFAULTS"
# An explicit option for bfloat16 programs (never a default): YNNPACK's dot fusions beside its
# reduce fusions, `jax.jit(f, compiler_options=BF16_CPU_OPTIONS)`. A bfloat16 x bfloat16 ->
# float32 product (`config.dtype="bfloat16"`: `bertjax.model.layers.float32_sum_dot_general`)
# then runs in YNNPACK, on AMX tiles where the CPU has them. BERT-base's forward on a 2-core
# Intel Xeon with AMX (`benchmarks/results/bench_gemm.md`): 8 x 128 267 ms, against PyTorch's
# 698 ms in float32 and 279 ms under bfloat16 autocast; 8 x 512 1767 ms against 3001 and 782 ms
# (the attention's own products stay float32 in bertjax). float32 products stay XLA's own,
# which are faster for them, so it is for bfloat16 programs only.
BF16_CPU_OPTIONS = {
  "xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_REDUCE,LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"
}


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
