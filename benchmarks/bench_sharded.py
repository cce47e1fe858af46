"""The mesh path of a sweep against the single-device run, on 8 simulated CPU devices.

Run:   JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_sharded.py --out benchmarks/results
       JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_sharded.py --analysis patching \
           --out benchmarks/results
Check: JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_sharded.py --smoke --out /tmp/b
       (and with --analysis patching)

`--analysis ablation` (the default; `sharded_cpu.json` / `.md`). The sweep:
`ablation_sweep(include=("heads", "layers"), head_ablations=("scale",))` with prefix reuse
and the default chunk (1 mask on CPU), on random weights of a `--preset` (bert-mini: 4 layers
of 4 heads, 256 wide: 20 masks) over `--batches` batches of `--batch-size` x `--seq-len`
random tokens (lengths varied, right padding), metric `mean_embedding_cosine`. The same
process (`--xla_force_host_platform_device_count=8`) runs it on one device (`mesh=None`),
on a 1x1x1 mesh (the mesh code path on that one device: per-row metric, padding, placement)
and on the 8-device meshes 8x1, 4x2, 2x4 and 1x8 (data x interventions). Each is compiled
and run once (the first-call time), then all are timed in `--repeats` interleaved rounds
(the minimum over rounds is compared: on a shared machine it is the least disturbed). The
8 simulated devices share the machine's cores, so their times measure the overhead of
splitting the work, not a speed-up; the 1x1x1 row isolates the code path's own cost. The
cost model's work (block passes x rows, per device and over all devices) is printed beside
each. Writes `sharded_cpu.json` and `.md` under `--out`.

`--analysis patching` (`sharded_patching_cpu.json` / `.md`): `patching.head_patching` of
`head_out` with `LogitDiff("mlm")` on the first batch as the clean run and a corrupted copy
(one real token per row replaced, the metric's answer and distractor), the same meshes; the
pair's rows over data, each layer's heads over interventions. Cost model: rows / D x [2 L +
sum_l ceil(N / I) (L - l)] block passes per device (the two unpatched runs, then patched
block l and the blocks above it for each of a layer's N heads).
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8 " + os.environ.get(
  "XLA_FLAGS", ""
)

import argparse
import json
import pathlib

import common
import jax
import numpy as np

import bertjax
from bertjax import mesh as mesh_lib
from bertjax import timing
from bertjax.analysis.interventions import ablation, metrics, patching

MESHES = {
  "1 device": None,
  "1x1x1": (1, 1, 1),
  "8x1": (8, 1, 1),
  "4x2": (4, 2, 1),
  "2x4": (2, 4, 1),
  "1x8": (1, 8, 1),
}


def _batches(config, n, rows, seq, seed=0):
  rs = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    ids = rs.integers(5, config.vocab_size, (rows, seq)).astype(np.int32)
    mask = (np.arange(seq)[None] < rs.integers(seq // 2, seq + 1, (rows, 1))).astype(np.int32)
    out.append({"input_ids": ids * mask, "attention_mask": mask})
  return out


def _pair(batch, config, seed=1):
  """(clean, corrupted, targets): one real token per row replaced in the corrupted copy."""
  rs = np.random.default_rng(seed)
  clean = {k: np.asarray(v) for k, v in batch.items()}
  rows = np.arange(clean["input_ids"].shape[0])
  position = np.asarray([rs.integers(0, n) for n in clean["attention_mask"].sum(-1)], np.int32)
  answer = clean["input_ids"][rows, position]
  distractor = (answer + 1 - 5) % (config.vocab_size - 5) + 5
  corrupted = dict(clean, input_ids=clean["input_ids"].copy())
  corrupted["input_ids"][rows, position] = distractor
  return clean, corrupted, {"position": position, "answer": answer, "distractor": distractor}


def predicted_work(config, rows: int, shape, analysis: str = "ablation") -> tuple[float, float]:
  """The cost model's (per-device, all devices) block passes x rows of one batch's sweep:
  ablation: rows / D x [L + sum_l ceil(m_l / I) (L - l)], m_l = heads + 1 masks starting at
  block l; patching: rows / D x [2 L + sum_l ceil(N / I) (L - l)]."""
  depth, heads = config.depth, config.num_attention_heads
  d, i = (1, 1) if shape is None else (shape[0] * shape[2], shape[1])
  if analysis == "patching":
    per_row = 2 * depth + sum(-(-heads // i) * (depth - l) for l in range(depth))
  else:
    per_row = depth + sum(-(-(heads + 1) // i) * (depth - l) for l in range(depth))
  per_device = -(-rows // d) * per_row
  return per_device, per_device * d * i


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--preset", default="bert-mini")
  p.add_argument("--batches", type=int, default=2)
  p.add_argument("--batch-size", type=int, default=32)
  p.add_argument("--seq-len", type=int, default=32)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument(
    "--analysis",
    choices=("ablation", "patching"),
    default="ablation",
    help="the ablation sweep (default) or the head patching sweep",
  )
  p.add_argument("--smoke", action="store_true", help="a tiny model, one repeat")
  p.add_argument("--out", default="out/bench")
  args = p.parse_args(argv)
  if args.smoke:
    args.preset, args.batches, args.batch_size, args.seq_len, args.repeats = "tiny", 1, 8, 16, 1
  return args


def make_sweep(args, config, batches):
  """`sweep(mesh)`: the analysis on `mesh` (None: one device), its values as one vector.

  Patching runs on one (clean, corrupted) pair made from the first batch, so it sets
  `args.batches` to 1.
  """
  if args.analysis == "patching":
    params = bertjax.init(config, 0, heads=("mlm",))
    clean, corrupted, targets = _pair(batches[0], config)
    metric = metrics.LogitDiff("mlm")
    args.batches = 1  # one pair

    def sweep(mesh):
      r = patching.head_patching(
        params, config, clean, corrupted, metric, targets=targets, mesh=mesh
      )
      return np.concatenate([[r.clean, r.corrupted], r.values.ravel()])

    return sweep

  params = bertjax.init(config, 0)

  def sweep(mesh):
    r = ablation.ablation_sweep(
      params,
      config,
      batches,
      ablation.mean_embedding_cosine,
      head_ablations=("scale",),
      include=("heads", "layers"),
      mesh=mesh,
    )
    return np.concatenate([[r["scale"].baseline], r["scale"].heads.ravel(), r["scale"].layers])

  return sweep


def time_meshes(sweep, args, config) -> dict[str, dict]:
  """Each mesh of `MESHES`: its first call (compile and check against one device), then
  `args.repeats` interleaved rounds; the rows of the table."""
  rows, meshes, ref = {}, {}, None
  for name, shape in MESHES.items():  # compile (and check) each first
    devices = jax.devices()[: int(np.prod(shape))] if shape else None
    meshes[name] = None if shape is None else mesh_lib.make_mesh(*shape, devices=devices)
    values, first = timing.timed(lambda mesh=meshes[name]: sweep(mesh))
    ref = values if ref is None else ref
    per_device, total = predicted_work(config, args.batch_size, shape, args.analysis)
    rows[name] = {
      "first_call_s": first,
      "max_abs_diff": float(np.abs(values - ref).max()),
      "model_work_per_device": per_device * args.batches,
      "model_work_total": total * args.batches,
    }
  # Rounds that time every run once, interleaved, so that load from other processes on a
  # shared machine falls on all of them alike; the minimum is the least disturbed.
  calls = {name: lambda mesh=mesh: sweep(mesh) for name, mesh in meshes.items()}
  times = timing.interleaved(calls, args.repeats, warmup=0, first_call=False, cpu_time=True)
  for name, t in times.items():
    rows[name] |= {
      "runs_s": t["times_s"],
      "cpu_runs_s": t["cpu_times_s"],
      "min_s": t["min_s"],
      "median_s": t["median_s"],
      "cpu_min_s": t["cpu_min_s"],
    }
  base, work = None, None
  for name, r in rows.items():
    base, work = base or (r["min_s"], r["cpu_min_s"]), work or r["model_work_total"]
    r["overhead"] = r["min_s"] / base[0] - 1
    r["cpu_overhead"] = r["cpu_min_s"] / base[1] - 1
    r["model_total_vs_1"] = r["model_work_total"] / work
    r["model_per_device_vs_1"] = r["model_work_per_device"] / work
    print(
      f"{name:>8}: first call {r['first_call_s']:6.2f} s, min {r['min_s']:.3f} s, median "
      f"{r['median_s']:.3f} s, max |diff| {r['max_abs_diff']:.1e}",
      flush=True,
    )
  return rows


def markdown(args, masks: int, rows: dict[str, dict], machine: dict) -> str:
  """The Markdown table of the runs."""
  what = "Ablation sweep" if args.analysis == "ablation" else "Head patching sweep"
  title = f"# {what} on a mesh vs one device (CPU, 8 simulated devices, {os.cpu_count()} cores)"
  patches = (
    "single heads + layers masked, prefix reuse, chunk 1"
    if args.analysis == "ablation"
    else "head_out of each (layer, head) patched, LogitDiff, prefix reuse, chunk 1"
  )
  setting = (
    f"{args.preset}, {masks} masks ({patches}), "
    f"{args.batches} x {args.batch_size} x {args.seq_len} tokens, {args.repeats} "
    f"interleaved rounds; jax {jax.__version__}."
  )
  lines = [
    title,
    "",
    setting,
    "",
    common.measured_on(machine),
    "",
    (
      "| run | first call (s) | wall min (s) | wall median (s) | wall vs 1 device | CPU "
      "time min (s) | CPU time vs 1 device | cost model: all devices' work | cost model: "
      "per-device work | max abs diff |"
    ),
    "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for name, r in rows.items():
    lines.append(
      f"| {name} | {r['first_call_s']:.2f} | {r['min_s']:.3f} | "
      f"{r['median_s']:.3f} | {r['overhead']:+.0%} | {r['cpu_min_s']:.3f} | "
      f"{r['cpu_overhead']:+.0%} | {r['model_total_vs_1']:.2f}x | "
      f"{r['model_per_device_vs_1']:.2f}x | {r['max_abs_diff']:.1e} |"
    )
  lines += [
    "",
    (
      "The simulated devices share the CPU's cores, so time follows all devices' "
      "work (the unpatched or intact runs repeated on each interventions slice, "
      "each group of masks or patches padded to a multiple of the interventions "
      "size); on real "
      "devices it follows the per-device work. CPU time (this process, all threads) "
      "is less disturbed by other processes on a shared machine than wall time."
    ),
  ]
  return "\n".join(lines)


def main(argv=None) -> int:
  args = parse_args(argv)
  assert jax.device_count() == 8, jax.devices()
  config = bertjax.BertConfig.preset(args.preset)
  batches = _batches(config, args.batches, args.batch_size, args.seq_len)
  sweep = make_sweep(args, config, batches)
  rows = time_meshes(sweep, args, config)
  masks = config.depth * config.num_attention_heads + (
    config.depth if args.analysis == "ablation" else 0
  )
  result = {
    "analysis": args.analysis,
    "preset": args.preset,
    "masks": masks,
    "batches": args.batches,
    "batch_size": args.batch_size,
    "seq_len": args.seq_len,
    "repeats": args.repeats,
    **timing.machine(),
    "jax": jax.__version__,
    "xla_flags": os.environ["XLA_FLAGS"],
    "rows": rows,
  }
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  stem = "sharded_cpu" if args.analysis == "ablation" else "sharded_patching_cpu"
  (out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
  text = markdown(args, masks, rows, result)
  (out / f"{stem}.md").write_text(text + "\n")
  print(text)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
