"""Matrix products on the CPU: XLA:CPU's paths against PyTorch's, float32 and bfloat16.

Run: ./run.sh bench bench_gemm           (writes benchmarks/results/bench_gemm.*)
     ./run.sh bench bench_gemm --smoke   (tiny shapes, one round; checks the script runs)

Issue 61 asks every family's forward to be at least as fast as PyTorch's on every CPU, and,
where XLA's own matrix products cap it, for that floor shown by parts with what was tried.
An encoder's forward at 8 x 128 and 8 x 512 is mostly dense products (the projections and
the FFN), so this times those products alone: M x K times K x N for BERT-base's shapes at
1,024 and 4,096 tokens (768 -> 768, 768 -> 2304, 768 -> 3072, 3072 -> 768) and 2048^3, the
peak. Each XLA path is one program compiled with its own XLA:CPU options
(`jax.jit(..., compiler_options=...)`), so every path runs in this one process, side by side
with PyTorch's (2 threads unless `--threads`), in interleaved rounds, compile apart:

* `xla`: the process's settings (`import bertjax` sets YNNPACK's reduce fusions only,
  `bertjax.xla_options`); XLA's own dot emitter (Eigen);
* `xla, YNNPACK dot`: YNNPACK library fusions take each dot (`LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT`);
* `xla, oneDNN`: `xla_cpu_use_onednn`, XLA's oneDNN rewrite, where this jaxlib was built with
  it (the optimised program is read: a product that stays XLA's own dot is reported so);
* `torch`: `torch.matmul`, oneDNN/MKL;
* bfloat16, as an explicit option (never a default): `xla bf16` casts the float32 inputs to
  bfloat16 and multiplies with float32 accumulation and output, in one program (with XLA's
  dot, and with YNNPACK's: `xla bf16, YNNPACK dot`); `torch bf16
  autocast` is `a @ b` under `torch.autocast("cpu", torch.bfloat16)` on the same float32
  inputs. On a CPU with AMX, oneDNN runs these on its tile units.

Each product's largest error against a float64 NumPy product (relative to the largest entry)
is reported beside its rate.

Then the same paths on a whole forward pass: a BERT-base `BertModel` with every parameter
random, saved by transformers and loaded by both, at 8 x 128 and 8 x 512, float32 against
`config.replace(dtype="bfloat16")` (bfloat16 products summed in float32, float32 parameters,
LayerNorm statistics and softmax), with XLA's dots and with YNNPACK's
(`bertjax.xla_options.BF16_CPU_OPTIONS`, its reduce fusions kept), against
transformers' sdpa forward in float32 and under bfloat16 autocast; each output's error is
relative to PyTorch's float32 output (Frobenius norm). Results name the CPU and its ISA.
"""

from __future__ import annotations

import functools
import pathlib
import sys
import tempfile

import common
import jax
import jax.numpy as jnp
import numpy as np

import bertjax
from bertjax import timing, xla_options

# (name, M, K, N): tokens x inputs x outputs.
SHAPES = (
  ("peak 2048^3", 2048, 2048, 2048),
  ("8 x 128: 768 -> 768", 1024, 768, 768),
  ("8 x 128: 768 -> 3072", 1024, 768, 3072),
  ("8 x 128: 3072 -> 768", 1024, 3072, 768),
  ("8 x 512: 768 -> 768", 4096, 768, 768),
  ("8 x 512: 768 -> 2304", 4096, 768, 2304),
  ("8 x 512: 768 -> 3072", 4096, 768, 3072),
  ("8 x 512: 3072 -> 768", 4096, 3072, 768),
)
SMOKE_SHAPES = (("smoke", 64, 48, 32),)
FORWARD_SHAPES = ((8, 128), (8, 512))
YNN_DOT = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}
# Path name -> XLA:CPU options of its float32 program (None: the process's own).
XLA_PATHS = {"xla": None, "xla, YNNPACK dot": YNN_DOT, "xla, oneDNN": {"xla_cpu_use_onednn": True}}


def _float32(a, b):
  return jnp.matmul(a, b)


def _bf16(a, b):
  return jnp.matmul(
    a.astype(jnp.bfloat16), b.astype(jnp.bfloat16), preferred_element_type=jnp.float32
  )


def _float64(out, torch) -> np.ndarray:
  """A JAX or PyTorch result (bfloat16 included) as a float64 array."""
  out = out.float().numpy() if isinstance(out, torch.Tensor) else out
  return np.asarray(out, np.float64)


def time_shape(name: str, m: int, k: int, n: int, args, torch) -> dict:
  """One shape's products on every path, side by side."""
  rng = np.random.default_rng(0)
  a_np = rng.standard_normal((m, k), np.float32)
  b_np = rng.standard_normal((k, n), np.float32)
  exact = a_np.astype(np.float64) @ b_np.astype(np.float64)
  a, b = jnp.asarray(a_np), jnp.asarray(b_np)
  ta, tb = torch.from_numpy(a_np), torch.from_numpy(b_np)
  calls, info, texts = {}, {}, {}
  for path, options in XLA_PATHS.items():  # "xla" first: the others' programs are read against it
    compiled = jax.jit(_float32, compiler_options=options).lower(a, b).compile()
    calls[path], texts[path] = functools.partial(compiled, a, b), compiled.as_text() or ""
    info[path] = {
      "dtype": "float32",
      "onednn_in_program": "onednn" in texts[path].lower(),
      "same_program_as_xla": texts[path] == texts["xla"],
    }
  for path, options in (("xla bf16", None), ("xla bf16, YNNPACK dot", YNN_DOT)):
    calls[path], _ = timing.compile_ahead(jax.jit(_bf16, compiler_options=options), a, b)
    info[path] = {"dtype": "bfloat16 inputs, float32 accumulation"}
  calls["torch"] = lambda: ta @ tb
  info["torch"] = {"dtype": "float32"}

  def torch_bf16():
    with torch.autocast("cpu", dtype=torch.bfloat16):
      return ta @ tb

  calls["torch bf16 autocast"] = torch_bf16
  info["torch bf16 autocast"] = {"dtype": "bfloat16 (autocast)"}
  outputs = {}
  times = common.interleaved(calls, args, outputs=outputs)
  flop = 2.0 * m * k * n
  scale = float(np.abs(exact).max())
  row = {"m": m, "k": k, "n": n, "gflop": flop / 1e9}
  for path, t in times.items():
    error = float(np.abs(_float64(outputs[path], torch) - exact).max() / scale)
    row[path] = common.entry(t, **info[path], gflop_s=flop / t["median_s"] / 1e9, rel_error=error)
  torch_s = row["torch"]["median_s"]
  for path in times:
    row[path]["speed_vs_torch_f32"] = torch_s / row[path]["median_s"]
  done = ", ".join(f"{p} {row[p]['gflop_s']:.0f}" for p in times)
  print(f"{name} (GFLOP/s): {done}", file=sys.stderr, flush=True)
  return row


def time_forward(path: pathlib.Path, batch: int, seq: int, args, torch, transformers) -> dict:
  """One forward shape on bertjax's paths and PyTorch's, side by side."""
  config, params = bertjax.from_hf(path)
  ids_np = np.random.default_rng(0).integers(1000, config.vocab_size, (batch, seq))
  ids, mask = jnp.asarray(ids_np, jnp.int32), jnp.ones((batch, seq), jnp.int32)
  bf16 = config.replace(dtype="bfloat16")
  calls = {}
  for name, cfg, options in (
    ("bertjax", config, None),
    ("bertjax bf16", bf16, None),
    ("bertjax bf16, YNNPACK dot", bf16, xla_options.BF16_CPU_OPTIONS),
  ):
    fn = lambda p, x, m, cfg=cfg: bertjax.forward(p, cfg, x, m).last_hidden_state
    jitted = jax.jit(fn, compiler_options=options)
    calls[name], _ = timing.compile_ahead(jitted, params, ids, mask)
  model = transformers.BertModel.from_pretrained(str(path), attn_implementation="sdpa").eval()
  ids_t, mask_t = torch.tensor(ids_np).long(), torch.ones((batch, seq), dtype=torch.long)

  def torch_forward(autocast: bool):
    with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16, enabled=autocast):
      return model(input_ids=ids_t, attention_mask=mask_t).last_hidden_state

  calls["torch"] = lambda: torch_forward(False)
  calls["torch bf16 autocast"] = lambda: torch_forward(True)
  outputs = {}
  times = common.interleaved(calls, args, outputs=outputs)
  ref = _float64(outputs["torch"], torch)
  row = {"batch": batch, "seq": seq}
  for name, t in times.items():
    error = float(np.linalg.norm(_float64(outputs[name], torch) - ref) / np.linalg.norm(ref))
    row[name] = common.entry(t, rel_error_vs_torch_f32=error)
    row[name]["speed_vs_torch_f32"] = times["torch"]["median_s"] / t["median_s"]
  done = ", ".join(f"{n} {t['median_s'] * 1e3:.0f} ms" for n, t in times.items())
  print(f"forward {batch} x {seq}: {done}", file=sys.stderr, flush=True)
  return row


def main(argv=None) -> dict:
  p = common.parser(__doc__, rounds=11, warmup=2)
  p.add_argument("--threads", type=common.at_least(1), default=2, help="PyTorch's intra-op threads")
  args = p.parse_args(argv)
  import torch
  import transformers

  torch.set_num_threads(args.threads)
  shapes, forward_shapes = SHAPES, FORWARD_SHAPES
  if args.smoke:
    args.rounds, args.warmup, shapes, forward_shapes = 1, 0, SMOKE_SHAPES, ((2, 16),)
  result = {
    "machine": timing.machine(torch=True),
    "rounds": args.rounds,
    "warmup": args.warmup,
    "smoke": args.smoke,
    "shapes": {name: time_shape(name, m, k, n, args, torch) for name, m, k, n in shapes},
  }
  with tempfile.TemporaryDirectory() as tmp:
    path = common.bert_base_dir(transformers, torch, pathlib.Path(tmp), args.smoke)
    result["forward"] = {
      f"{b} x {t}": time_forward(path, b, t, args, torch, transformers) for b, t in forward_shapes
    }
  common.write(result, markdown(result), args.out, "bench_gemm", files=not args.smoke)
  return result


def markdown(r: dict) -> str:
  paths = [
    key for key, value in next(iter(r["shapes"].values())).items() if isinstance(value, dict)
  ]
  lines = [
    (
      f"Matrix products M x K times K x N, GFLOP/s (medians of {r['rounds']} interleaved "
      f"rounds after {r['warmup']} warm-up calls, compile apart) and, in brackets, the speed "
      f"against PyTorch's float32 product in the same round set. {common.measured_on(r['machine'])}"
    ),
    "",
  ]
  rows = []
  for name, s in r["shapes"].items():
    cells = [f"{s[p]['gflop_s']:.0f} ({s[p]['speed_vs_torch_f32']:.2f}x)" for p in paths]
    rows.append((name, f"{s['m']} x {s['k']} x {s['n']}", *cells))
  lines += common.table(("shape", "M x K x N", *paths), rows)
  worst = {p: max(s[p]["rel_error"] for s in r["shapes"].values()) for p in paths}
  lines += [
    "",
    "Largest error against a float64 product, relative to its largest entry: "
    + ", ".join(f"{p} {e:.1e}" for p, e in worst.items())
    + ".",
  ]
  names = [k for k, v in next(iter(r["forward"].values())).items() if isinstance(v, dict)]
  lines += [
    "",
    (
      "A BERT-base forward pass (random weights), milliseconds, and in brackets the speed "
      "against PyTorch's float32 forward; below, each output's error relative to PyTorch's "
      "float32 output:"
    ),
    "",
  ]
  rows = [
    (
      shape,
      *(f"{f[n]['median_s'] * 1e3:.0f} ms ({f[n]['speed_vs_torch_f32']:.2f}x)" for n in names),
    )
    for shape, f in r["forward"].items()
  ]
  rows += [
    (f"{shape}: error", *(f"{f[n]['rel_error_vs_torch_f32']:.1e}" for n in names))
    for shape, f in r["forward"].items()
  ]
  lines += common.table(("batch x seq", *names), rows)
  onednn = [s["xla, oneDNN"] for s in r["shapes"].values()]
  if not any(e["onednn_in_program"] for e in onednn):
    same = all(e["same_program_as_xla"] for e in onednn)
    spread = [s["xla, oneDNN"]["gflop_s"] / s["xla"]["gflop_s"] for s in r["shapes"].values()]
    lines += [
      "",
      (
        "`xla, oneDNN`: the optimised programs hold no oneDNN call: this jaxlib's XLA:CPU "
        "keeps its own dot with `xla_cpu_use_onednn` (it is built without oneDNN)"
        + (
          ", and its optimised program's text is `xla`'s, yet its rate ran "
          f"{min(spread):.2f}-{max(spread):.2f}x `xla`'s: a difference this benchmark does not "
          "explain, and the measure of how far apart two runs of one product can land."
          if same
          else "."
        )
      ),
    ]
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  main()
