"""Forward-pass speed on the CPU: bertjax vs transformers (PyTorch sdpa) vs HF Flax BERT; compile time.

Run: ./run.sh bench bench_forward            (writes benchmarks/results/forward_cpu.{json,md})
     ./run.sh bench bench_forward --smoke    (a few seconds; checks the script runs)

all-MiniLM-L6-v2 (real weights), float32, batch 32 x 128 tokens. The three
implementations are timed in one run, interleaved round by round so that
machine noise hits them alike; each is warmed up first and compile time is
reported separately. The HF Flax peer is transformers 4.57 (the last release
with Flax), run in a subprocess from the side install `.venv/hf4`.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import bertjax

RESULTS = pathlib.Path(__file__).parent / "results"
HF4 = pathlib.Path(sys.prefix) / "hf4"

_FLAX_PEER = """
import json, sys, time, numpy as np, jax, jax.numpy as jnp
from transformers import FlaxBertModel
model = FlaxBertModel.from_pretrained(sys.argv[1], from_pt=True)
ids = np.load(sys.argv[2])
fwd = jax.jit(lambda p, x: model(x, attention_mask=jnp.ones_like(x), params=p).last_hidden_state)
t0 = time.perf_counter(); jax.block_until_ready(fwd(model.params, ids)); compile_s = time.perf_counter() - t0
for _ in range(int(sys.argv[4])): jax.block_until_ready(fwd(model.params, ids))
times = []
for _ in range(int(sys.argv[3])):
  t0 = time.perf_counter(); jax.block_until_ready(fwd(model.params, ids)); times.append(time.perf_counter() - t0)
print(json.dumps({"times": times, "compile_s": compile_s}))
"""


def _time(fn, repeats: int) -> list[float]:
  out = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    out.append(time.perf_counter() - t0)
  return out


def compile_seconds(layers: int, seq: int, batch: int) -> float:
  """Lower + compile the forward of a bert-base-width model with `layers` layers."""
  config = bertjax.BertConfig.preset("bert-base", num_hidden_layers=layers)
  params = jax.eval_shape(lambda: bertjax.init(config, 0))
  ids = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
  fwd = jax.jit(lambda p, x: bertjax.forward(p, config, x, jnp.ones_like(x)).last_hidden_state)
  t0 = time.perf_counter()
  fwd.lower(params, ids).compile()
  return time.perf_counter() - t0


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--seq", type=int, default=128)
  parser.add_argument("--rounds", type=int, default=15, help="timed rounds per implementation")
  parser.add_argument("--warmup", type=int, default=3)
  parser.add_argument("--smoke", action="store_true", help="tiny sizes, no result files")
  parser.add_argument("--no-flax", action="store_true", help="skip the HF Flax peer")
  parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
  args = parser.parse_args(argv)
  if args.smoke:
    args.batch, args.seq, args.rounds, args.warmup = 2, 16, 2, 1

  import torch
  import transformers

  path = bertjax.minilm_path()
  config, params = bertjax.from_hf(path)
  rng = np.random.default_rng(0)
  ids = rng.integers(1000, config.vocab_size, (args.batch, args.seq)).astype(np.int32)
  mask = np.ones_like(ids)

  fwd = jax.jit(lambda p, x, m: bertjax.forward(p, config, x, m).last_hidden_state)
  ids_j, mask_j = jnp.asarray(ids), jnp.asarray(mask)
  t0 = time.perf_counter()
  jax.block_until_ready(fwd(params, ids_j, mask_j))
  ours_compile = time.perf_counter() - t0
  ours = lambda: jax.block_until_ready(fwd(params, ids_j, mask_j))

  model = transformers.BertModel.from_pretrained(str(path), attn_implementation="sdpa").eval()
  ids_t, mask_t = torch.tensor(ids).long(), torch.tensor(mask).long()

  def theirs():
    with torch.inference_mode():
      return model(input_ids=ids_t, attention_mask=mask_t).last_hidden_state

  # Same numbers first: a speed comparison of different functions means nothing.
  diff = float(np.abs(np.asarray(ours()) - theirs().numpy()).max())
  for _ in range(args.warmup):
    ours(), theirs()
  t_ours, t_torch = [], []
  for _ in range(args.rounds):  # interleaved rounds
    t_ours += _time(ours, 1)
    t_torch += _time(theirs, 1)

  flax = None
  if not args.no_flax and (HF4 / "transformers").is_dir():
    ids_file = args.out / "_ids.npy" if not args.smoke else pathlib.Path("/tmp/_bench_ids.npy")
    ids_file.parent.mkdir(parents=True, exist_ok=True)
    np.save(ids_file, ids)
    env = {**os.environ, "PYTHONPATH": str(HF4), "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-c", _FLAX_PEER, str(path), str(ids_file),
                          str(args.rounds), str(args.warmup)], env=env, capture_output=True,
                         text=True, timeout=1200)
    ids_file.unlink()
    if run.returncode == 0:
      flax = json.loads(run.stdout.strip().splitlines()[-1])
    else:
      print("HF Flax peer failed:", run.stderr[-2000:], file=sys.stderr)

  layers = (2, 4) if args.smoke else (12, 24)
  compile_times = {n: compile_seconds(n, args.seq, args.batch) for n in layers}

  med = statistics.median
  tokens = args.batch * args.seq
  result = {
      "machine": {"processor": platform.processor() or platform.machine(),
                  "cpus": os.cpu_count(), "jax": jax.__version__, "torch": torch.__version__,
                  "transformers": transformers.__version__, "backend": jax.default_backend()},
      "shape": {"batch": args.batch, "seq": args.seq, "model": "all-MiniLM-L6-v2", "dtype": "float32"},
      "max_abs_diff_vs_torch": diff,
      "bertjax": {"median_s": med(t_ours), "tokens_per_s": tokens / med(t_ours),
                  "compile_s": ours_compile},
      "torch_sdpa": {"median_s": med(t_torch), "tokens_per_s": tokens / med(t_torch)},
      "speedup_vs_torch": med(t_torch) / med(t_ours),
      "compile_s_by_layers": {str(k): v for k, v in compile_times.items()},
  }
  if flax:
    result["hf_flax_4_57"] = {"median_s": med(flax["times"]),
                              "tokens_per_s": tokens / med(flax["times"]),
                              "compile_s": flax["compile_s"]}
    result["speedup_vs_hf_flax"] = med(flax["times"]) / med(t_ours)
  print(json.dumps(result, indent=2))
  if not args.smoke:
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "forward_cpu.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "forward_cpu.md").write_text(markdown(result))
  return result


def markdown(r: dict) -> str:
  m = r["machine"]
  lines = [f"Forward pass, all-MiniLM-L6-v2, float32, batch {r['shape']['batch']} x "
           f"{r['shape']['seq']} tokens, on {m['processor']} ({m['cpus']} CPUs), "
           f"jax {m['jax']}, torch {m['torch']}, transformers {m['transformers']}.", "",
           "| implementation | median time | tokens/s | vs bertjax | compile |",
           "|---|---|---|---|---|"]
  ours = r["bertjax"]["median_s"]
  rows = [("bertjax (jit, scan)", r["bertjax"]), ("transformers PyTorch (sdpa)", r["torch_sdpa"])]
  if "hf_flax_4_57" in r:
    rows.append(("transformers 4.57 Flax", r["hf_flax_4_57"]))
  for name, x in rows:
    compile_s = f"{x['compile_s']:.2f} s" if "compile_s" in x else "-"
    lines.append(f"| {name} | {x['median_s'] * 1e3:.1f} ms | {x['tokens_per_s']:.0f} | "
                 f"{x['median_s'] / ours:.2f}x slower | {compile_s} |" if x is not r["bertjax"]
                 else f"| {name} | {x['median_s'] * 1e3:.1f} ms | {x['tokens_per_s']:.0f} | 1.00x "
                 f"| {compile_s} |")
  lines += ["", f"Max |difference| vs PyTorch: {r['max_abs_diff_vs_torch']:.2e}.", "",
            "Compile time of the forward (bert-base width, batch x 128): " + ", ".join(
                f"{k} layers {v:.2f} s" for k, v in r["compile_s_by_layers"].items()) + "."]
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  main()
