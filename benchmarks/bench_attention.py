"""Benchmark of bertjax's fused attention against cuDNN, XLA and JAX's Pallas `mha`.

Run (GPU):     .venv/bin/python benchmarks/bench_attention.py --out benchmarks/results
Check (CPU):   JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_attention.py --smoke --out /tmp/b

bfloat16, head_dim 64; shapes batch 256 x seq 128 and batch 64 x seq 512 with 12 and 16
heads; forward and forward+backward; full batches and padded batches (lengths uniform in
[T/4, T] from a fixed seed). Implementations, side by side in one process:

* `bertjax_pallas`: `kernels.attention(impl="pallas", kv_lengths=...)` (skips padded blocks).
* `bertjax_pallas_dropout`: the same with attention dropout at rate 0.1 (`dropout_rate=0.1`,
  a fixed `dropout_seed`): the cost of recomputing the hashed mask in all three kernels.
* `cudnn`: `jax.nn.dot_product_attention(implementation="cudnn")` with sequence lengths.
* `xla`: `jax.nn.dot_product_attention(implementation="xla")` with sequence lengths.
* `jax_pallas_mha`: `jax.experimental.pallas.ops.gpu.attention.mha`; padding expressed as
  segment ids (it cannot skip padded blocks).

FLOPs count only real tokens: forward = 4 * heads * head_dim * sum_b len_b**2 (QK^T and PV,
2 flops per multiply-add); forward+backward = 3.5 x forward (the backward's five matmuls:
QK^T recomputed, dV, dP, dQ, dK). Each timing is the median of `--iters` runs after
`--warmup` runs, every run blocked on its result, the implementations side by side in
rotating rounds (`bertjax.timing`); compile time is measured separately (lower + compile).
The fraction of peak divides by a measured bf16 matmul rate.
Writes `attention_<device>.json` and `.md` under `--out`.

`--window W` times sliding-window attention instead (ModernBERT's local layers: keys with
|q - k| <= W // 2) at `--shapes` (default 8 x 8192 x 12): `bertjax_pallas` with
`Mask(window=W)`, which skips key blocks outside the band, against cuDNN's
`local_window_size=(W // 2, W // 2)`; FLOPs count the band only. Writes
`attention_window<W>_<device>.*`.

`--peak-only` measures the bf16 matmul peak alone and stops with an error when it is below
half the device's datasheet figure (`DATASHEET_BF16_TFLOPS`; a device without one, the CPU,
is not checked): `benchmarks/gpu_suite.sh` runs it first, so that a machine running far
below its specification (XLA's GEMM autotuning off gave 10.5 of 989 TFLOP/s on an H200)
spends no device time on tables that would not mean anything. Writes `peak_<device>.json`.

`--deberta` times DeBERTa-v3-base's disentangled attention instead (both position terms,
log buckets 256, span 256, max_position 512, scale `1/sqrt(3 d)`) at 256 x 128 x 12 and
64 x 512 x 12: `bertjax_pallas`, the fused kernels that gather c2p and p2c per tile from
the per-row position scores, against `xla`, bertjax's XLA path (one (T, rows) product per
term and a gather, then the T x T scores); no other library has a fused version to compare.
The backward gives q, k and v's gradients (and through the scores the tables'). FLOPs
count the content products only. Writes `attention_deberta_<device>.*`.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform

import common
import jax
import jax.numpy as jnp
import numpy as np

from bertjax import kernels, timing

FULL_SHAPES = [(256, 128, 12), (256, 128, 16), (64, 512, 12), (64, 512, 16)]  # (B, T, H)
SMOKE_SHAPES = [(2, 64, 2)]
HEAD_DIM = 64
IMPLS = ("bertjax_pallas", "bertjax_pallas_dropout", "cudnn", "xla", "jax_pallas_mha")
DROPOUT_RATE = 0.1  # bertjax_pallas_dropout: BERT's attention_probs_dropout_prob
# Dense bfloat16 tensor-core TFLOP/s (no sparsity) in NVIDIA's datasheets, by `device_kind`.
DATASHEET_BF16_TFLOPS = {
  "NVIDIA H100 80GB HBM3": 989.4,  # H100 SXM5
  "NVIDIA H100 PCIe": 756.0,
  "NVIDIA H100 NVL": 835.0,
  "NVIDIA H200": 989.4,
}


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default="benchmarks/results", help="output directory")
  parser.add_argument(
    "--smoke",
    action="store_true",
    help="tiny shapes, few iterations; runs on CPU in interpret mode",
  )
  parser.add_argument("--iters", type=int, default=None, help="timed runs (default 50; smoke 2)")
  parser.add_argument("--warmup", type=int, default=None, help="warm-up runs (default 5; smoke 1)")
  parser.add_argument("--impls", default=",".join(IMPLS), help=f"comma list from {IMPLS}")
  parser.add_argument(
    "--shapes",
    default=None,
    help="comma list of BxTxH shapes (default: the four full shapes; smoke 2x64x2)",
  )
  parser.add_argument("--seed", type=int, default=0, help="seed of inputs and padded lengths")
  parser.add_argument(
    "--matmul-size",
    type=int,
    default=None,
    help="n of the n x n x n bf16 matmul used as peak (default 8192; smoke 256)",
  )
  parser.add_argument(
    "--window",
    type=int,
    default=None,
    help="sliding-window attention with this window (default shape 8x8192x12; smoke 2x256x2)",
  )
  parser.add_argument(
    "--peak-only",
    action="store_true",
    help="only the bf16 matmul peak; fail below half the device's datasheet figure",
  )
  parser.add_argument(
    "--deberta",
    action="store_true",
    help="DeBERTa-v3's disentangled attention, fused against bertjax's XLA path",
  )
  parser.add_argument(
    "--blocks",
    default=None,
    help="bertjax BlockSizes as block_q,block_k,block_q_bwd,block_k_bwd (default: per backend)",
  )
  return parser.parse_args(argv)


def matmul_peak(n, warmup, iters):
  """Measured bf16 matmul TFLOP/s on an n x n x n product."""
  a = jax.random.normal(jax.random.key(1), (n, n), jnp.bfloat16)
  b = jax.random.normal(jax.random.key(2), (n, n), jnp.bfloat16)
  call, _ = timing.compile_ahead(lambda x, y: x @ y, a, b)
  t = timing.interleaved({"matmul": call}, iters, warmup=max(warmup - 1, 0))
  return 2 * n**3 / t["matmul"]["median_s"] / 1e12


def _time_impls(fns: dict, warmup: int, iters: int) -> dict[str, dict]:
  """Each implementation's `fn(*args)` of `name -> (fn, args)` compiled apart and run once (an
  implementation unavailable here gets `{"error"}`), then the rest timed side by side
  (`bertjax.timing.interleaved`: `warmup` untimed calls, this first run among them, then
  `iters` rounds in a rotating order); each gets `{"compile_s", "median_s"}`."""
  out, calls = {}, {}
  for name, (fn, args) in fns.items():
    try:
      calls[name], compile_s = timing.compile_ahead(fn, *args)
      jax.block_until_ready(calls[name]())
      out[name] = {"compile_s": compile_s}
    except Exception as e:  # noqa: BLE001 (one unavailable impl must not stop the run)
      calls.pop(name, None)
      out[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
  if calls:
    times = timing.interleaved(calls, iters, warmup=max(warmup - 1, 0), first_call=False)
    for name, t in times.items():
      out[name]["median_s"] = t["median_s"]
  return out


def make_attention(impl, seq, lengths, padded, interpret, blocks=None, window=None, bias=None):
  """fn(q, k, v) -> out for one implementation, or raises if unavailable here."""
  on_gpu = jax.default_backend() == "gpu"
  lens = jnp.asarray(lengths, jnp.int32) if padded else None
  if window is not None:
    return _windowed(impl, lens, interpret, blocks, window, on_gpu)
  if bias is not None:
    if impl not in ("bertjax_pallas", "xla"):
      raise ValueError(f"--deberta compares bertjax_pallas and xla, not {impl!r}")
    kw = {"impl": "xla"}
    if impl == "bertjax_pallas":
      kw = {"impl": "pallas", "interpret": interpret, "block_sizes": blocks}
    return lambda q, k, v: kernels.attention(q, k, v, kv_lengths=lens, bias=bias, **kw)
  if impl in ("bertjax_pallas", "bertjax_pallas_dropout"):
    dropout = {}
    if impl == "bertjax_pallas_dropout":
      dropout = {"dropout_rate": DROPOUT_RATE, "dropout_seed": jnp.uint32(1234)}
    return lambda q, k, v: kernels.attention(
      q,
      k,
      v,
      kv_lengths=lens,
      impl="pallas",
      interpret=interpret,
      block_sizes=blocks,
      **dropout,
    )
  if impl in ("cudnn", "xla"):
    if impl == "cudnn" and not on_gpu:
      raise RuntimeError("cudnn needs a GPU")
    return lambda q, k, v: jax.nn.dot_product_attention(
      q, k, v, query_seq_lengths=lens, key_value_seq_lengths=lens, implementation=impl
    )
  if impl == "jax_pallas_mha":
    from jax.experimental.pallas.ops.gpu import attention as jax_attention  # guarded by caller

    segments = None
    if padded:
      segments = (jnp.arange(seq)[None, :] < lens[:, None]).astype(jnp.int32)  # (B, T)
    kwargs = {}
    if interpret:
      small = jax_attention.BlockSizes(
        block_q=32, block_k=32, block_q_dkv=32, block_kv_dkv=32, block_q_dq=32, block_kv_dq=32
      )
      kwargs = {"interpret": True, "block_sizes": small}
    sm_scale = 1.0 / HEAD_DIM**0.5
    return lambda q, k, v: jax_attention.mha(q, k, v, segments, sm_scale=sm_scale, **kwargs)
  raise ValueError(f"{impl=} must be one of {IMPLS}")


def _windowed(impl, lens, interpret, blocks, window, on_gpu):
  """Sliding-window attention: bertjax's band-skipping kernel or cuDNN's local window."""
  if impl == "bertjax_pallas":
    mask = kernels.Mask(kv_lengths=lens, window=window)
    return lambda q, k, v: kernels.attention(
      q, k, v, mask=mask, impl="pallas", interpret=interpret, block_sizes=blocks
    )
  if impl == "cudnn":
    if not on_gpu:
      raise RuntimeError("cudnn needs a GPU")
    half = window // 2
    return lambda q, k, v: jax.nn.dot_product_attention(
      q,
      k,
      v,
      query_seq_lengths=lens,
      key_value_seq_lengths=lens,
      implementation="cudnn",
      local_window_size=(half, half),
    )
  raise ValueError(f"--window compares bertjax_pallas and cudnn, not {impl!r}")


def with_backward(fn):
  """fn(q, k, v, cot) -> (dq, dk, dv) of sum(out * cot): forward plus backward."""

  def loss(q, k, v, cot):
    return jnp.sum(fn(q, k, v).astype(jnp.float32) * cot)

  return jax.grad(loss, argnums=(0, 1, 2))


def run(args):
  smoke = args.smoke
  iters = args.iters or (2 if smoke else 50)
  warmup = args.warmup or (1 if smoke else 5)
  shapes = SMOKE_SHAPES if smoke else FULL_SHAPES
  if args.window:
    shapes = [(2, 256, 2)] if smoke else [(8, 8192, 12)]
    if args.impls == ",".join(IMPLS):
      args.impls = "bertjax_pallas,cudnn"
  if args.deberta:
    shapes = [(2, 64, 2)] if smoke else [(256, 128, 12), (64, 512, 12)]
    if args.impls == ",".join(IMPLS):
      args.impls = "bertjax_pallas,xla"
  if args.shapes:
    shapes = [tuple(int(x) for x in shape.split("x")) for shape in args.shapes.split(",")]
  interpret = jax.default_backend() == "cpu"
  impls = [name for name in args.impls.split(",") if name]
  for name in impls:
    if name not in IMPLS:
      raise ValueError(f"impl {name!r} must be one of {IMPLS}")
  blocks = None
  if args.blocks:
    bq, bk, bq_bwd, bk_bwd = (int(x) for x in args.blocks.split(","))
    blocks = kernels.BlockSizes(block_q=bq, block_k=bk, block_q_bwd=bq_bwd, block_k_bwd=bk_bwd)
  device = jax.devices()[0]
  peak = matmul_peak(args.matmul_size or (256 if smoke else 8192), warmup, max(iters, 3))
  print(f"device: {device.device_kind}; bf16 matmul peak {peak:.1f} TFLOP/s", flush=True)

  rng = np.random.default_rng(args.seed)
  rows = []
  for batch, seq, heads in shapes:
    key = jax.random.key(args.seed)
    q, k, v, cot = (
      jax.random.normal(kk, (batch, seq, heads, HEAD_DIM), jnp.bfloat16)
      for kk in jax.random.split(key, 4)
    )
    cot = cot.astype(jnp.float32)
    bias = None
    if args.deberta:  # DeBERTa-v3-base's layout; the tables are the layer's Kr and Qr
      kr, qr = (
        jax.random.normal(kk, (512, heads, HEAD_DIM), jnp.bfloat16)
        for kk in jax.random.split(jax.random.key(args.seed + 1))
      )
      bias = kernels.DisentangledBias(
        kr, qr, span=256, buckets=256, max_position=512, scale=1 / (3 * HEAD_DIM) ** 0.5
      )
    padded_lengths = rng.integers(seq // 4, seq + 1, size=batch)
    for padded in (False, True):
      lengths = padded_lengths if padded else np.full(batch, seq)
      if args.window:  # the band's keys only: min(len, w + 1) per query, at the edges fewer
        reach = np.minimum(lengths, args.window + 1).astype(np.float64)
        fwd_flops = 4 * heads * HEAD_DIM * float(np.sum(lengths * reach))
      else:
        fwd_flops = 4 * heads * HEAD_DIM * float(np.sum(lengths.astype(np.float64) ** 2))
      timed = {}
      for mode in ("fwd", "fwd+bwd"):  # the implementations side by side, per mode
        fns = {}
        for impl in impls:
          try:
            fn = make_attention(impl, seq, lengths, padded, interpret, blocks, args.window, bias)
          except Exception as e:  # noqa: BLE001 (one unavailable impl must not stop the run)
            timed[impl, mode] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
            continue
          fns[impl] = (fn, (q, k, v))
          if mode == "fwd+bwd":  # the cotangent is an argument, not a folded constant
            fns[impl] = (with_backward(fn), (q, k, v, cot))
        timed |= {(impl, mode): t for impl, t in _time_impls(fns, warmup, iters).items()}
      for impl in impls:
        for mode in ("fwd", "fwd+bwd"):
          row = {
            "impl": impl,
            "batch": batch,
            "seq": seq,
            "heads": heads,
            "head_dim": HEAD_DIM,
            "padded": padded,
            "mode": mode,
            "real_tokens": int(lengths.sum()),
          }
          t = timed[impl, mode]
          if "error" in t:
            row.update(error=t["error"])
          else:
            flops = fwd_flops * (3.5 if mode == "fwd+bwd" else 1.0)
            tflops = flops / t["median_s"] / 1e12
            row.update(
              ms=t["median_s"] * 1e3,
              compile_s=t["compile_s"],
              tflops=tflops,
              frac_peak=tflops / peak,
            )
          rows.append(row)
          print(_row_line(row), flush=True)
  return {
    "device_kind": device.device_kind,
    "backend": jax.default_backend(),
    "jax_version": jax.__version__,
    "host": platform.node(),
    "smoke": smoke,
    "iters": iters,
    "warmup": warmup,
    "bertjax_block_sizes": str(blocks or kernels.BlockSizes.get_default()),
    "window": args.window,
    "deberta": args.deberta,
    "matmul_peak_tflops": peak,
    "flop_formula": "fwd = 4*H*D*sum_b len_b^2 (real tokens only); fwd+bwd = 3.5*fwd",
    "rows": rows,
  }


def _row_line(row):
  shape = (
    f"B={row['batch']} T={row['seq']} H={row['heads']} {'padded' if row['padded'] else 'full'}"
  )
  if "error" in row:
    return f"{row['impl']:>22} {row['mode']:>8} {shape}: {row['error']}"
  return (
    f"{row['impl']:>22} {row['mode']:>8} {shape}: {row['ms']:.3f} ms, "
    f"{row['tflops']:.2f} TFLOP/s ({100 * row['frac_peak']:.1f}% of matmul peak), "
    f"compile {row['compile_s']:.1f} s"
  )


def markdown(result):
  lines = [
    f"# Attention benchmark on {result['device_kind']}",
    "",
    (
      f"jax {result['jax_version']}, bf16, head_dim {HEAD_DIM}; median of {result['iters']} "
      f"runs; measured bf16 matmul peak {result['matmul_peak_tflops']:.1f} TFLOP/s; "
      f"FLOPs: {result['flop_formula']}."
    ),
    "",
    "| shape (B x T x H) | batch | mode | impl | ms | TFLOP/s | % peak | compile s |",
    "|---|---|---|---|---:|---:|---:|---:|",
  ]
  for r in result["rows"]:
    shape = f"{r['batch']} x {r['seq']} x {r['heads']}"
    kind = "padded" if r["padded"] else "full"
    if "error" in r:
      lines.append(
        f"| {shape} | {kind} | {r['mode']} | {r['impl']} | n/a | | | {r['error'][:60]} |"
      )
    else:
      lines.append(
        f"| {shape} | {kind} | {r['mode']} | {r['impl']} | {r['ms']:.3f} | "
        f"{r['tflops']:.2f} | {100 * r['frac_peak']:.1f} | {r['compile_s']:.1f} |"
      )
  return "\n".join(lines) + "\n"


def peak_verdict(kind: str, peak: float) -> tuple[bool, str]:
  """(ok, a line saying so): a measured peak of at least half `kind`'s datasheet figure is
  ok; a device without one is not checked (ok)."""
  sheet = DATASHEET_BF16_TFLOPS.get(kind)
  if sheet is None:
    return True, f"{kind}: bf16 matmul peak {peak:.3g} TFLOP/s; no datasheet figure, not checked"
  line = f"{kind}: bf16 matmul peak {peak:.1f} TFLOP/s, {peak / sheet:.0%} of its datasheet {sheet}"
  if peak < sheet / 2:
    return False, (
      f"{line}: below half of it, so no table here would mean anything; look at XLA_FLAGS "
      "(GEMM autotuning off?) and at what else runs on the device"
    )
  return True, line


def peak_only(args) -> int:
  """`--peak-only`: the peak, its verdict printed and written; 1 when it is too low."""
  kind = jax.devices()[0].device_kind
  n = args.matmul_size or (256 if args.smoke else 8192)
  peak = matmul_peak(
    n, args.warmup or (1 if args.smoke else 5), args.iters or (3 if args.smoke else 20)
  )
  ok, line = peak_verdict(kind, peak)
  print(line, flush=True)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  doc = dict(device_kind=kind, jax=jax.__version__, matmul_n=n, matmul_peak_tflops=peak)
  doc.update(datasheet_tflops=DATASHEET_BF16_TFLOPS.get(kind), ok=ok, verdict=line)
  stem = "peak_" + common.slug(kind) + ("_smoke" if args.smoke else "")
  (out / f"{stem}.json").write_text(json.dumps(doc, indent=2))
  return 0 if ok else 1


def main(argv=None):
  args = parse_args(argv)
  if args.peak_only:
    raise SystemExit(peak_only(args))
  result = run(args)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  stem = (
    "attention_"
    + (f"window{result['window']}_" if result["window"] else "")
    + ("deberta_" if result["deberta"] else "")
    + common.slug(result["device_kind"])
  )
  if result["smoke"]:
    stem += "_smoke"
  (out / f"{stem}.json").write_text(json.dumps(result, indent=2))
  (out / f"{stem}.md").write_text(markdown(result))
  print(f"wrote {out / stem}.json and .md")


if __name__ == "__main__":
  main()
