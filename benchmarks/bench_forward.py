"""Forward-pass speed on the CPU: bertjax vs transformers PyTorch (sdpa), as a share of matmul peak.

Run: ./run.sh bench bench_forward            (writes benchmarks/results/forward_cpu.{json,md})
     ./run.sh bench bench_forward --smoke    (a few seconds; checks the script runs)

Two models (all-MiniLM-L6-v2 with its real weights; a BERT-base-shaped model with
random weights, every parameter random, saved by transformers and loaded by both)
at two shapes (batch 32 x 128 and 8 x 512), float32. Both implementations are
timed in one run, interleaved round by round so that machine noise hits them
alike, each warmed up first, compile time apart. Each forward's achieved GFLOP/s
(matmul FLOPs counted from the shapes) is reported as a fraction of the measured
float32 matmul peak of the same machine, for JAX and for PyTorch (the best of ten
large square matmuls in each, before and after the rows). The result file names
the CPU model, its vector ISA flags (AVX2, AVX-512, AMX) and the thread counts.
"""

from __future__ import annotations

import pathlib
import tempfile

import common
import jax.numpy as jnp
import numpy as np

import bertjax
from bertjax import timing


def matmul_peak(torch, size: int, repeats: int) -> dict:
  """Best float32 GFLOP/s of a (size x size) @ (size x size) matmul in JAX and in PyTorch,
  the two timed side by side."""
  a = np.random.default_rng(0).standard_normal((size, size)).astype(np.float32)
  ta = torch.from_numpy(a)

  def torch_mm():
    with torch.inference_mode():
      return torch.mm(ta, ta)

  jax_mm, _ = timing.compile_ahead(lambda x: x @ x, jnp.asarray(a))
  best = timing.interleaved({"jax": jax_mm, "torch": torch_mm}, repeats)
  flops = 2 * size**3
  return {
    "size": size,
    "jax_gflops": flops / best["jax"]["min_s"] / 1e9,
    "torch_gflops": flops / best["torch"]["min_s"] / 1e9,
  }


def forward_flops(config, batch: int, seq: int) -> float:
  """Matmul FLOPs of one forward: projections, FFN and the two attention products."""
  h, i, layers = config.hidden_size, config.intermediate_size, config.depth
  tokens = batch * seq
  per_layer = 2 * tokens * (4 * h * h + 2 * h * i) + 2 * 2 * batch * seq * seq * h
  return float(layers * per_layer)


def measure(transformers, torch, path, name, batch, seq, args) -> dict:
  config, params = bertjax.from_hf(path)
  rng = np.random.default_rng(0)
  ids = rng.integers(1000, config.vocab_size, (batch, seq)).astype(np.int32)
  mask = np.ones_like(ids)
  fwd = lambda p, x, m: bertjax.forward(p, config, x, m).last_hidden_state
  ours, compile_s = timing.compile_ahead(fwd, params, jnp.asarray(ids), jnp.asarray(mask))
  model = transformers.BertModel.from_pretrained(str(path), attn_implementation="sdpa").eval()
  ids_t, mask_t = torch.tensor(ids).long(), torch.tensor(mask).long()

  def theirs():
    with torch.inference_mode():
      return model(input_ids=ids_t, attention_mask=mask_t).last_hidden_state

  first = {}
  times = common.interleaved({"bertjax": ours, "torch_sdpa": theirs}, args, outputs=first)
  # Same numbers: a speed comparison of different functions means nothing.
  diff = float(np.abs(np.asarray(first["bertjax"]) - first["torch_sdpa"].numpy()).max())
  t_ours, t_torch = times["bertjax"]["median_s"], times["torch_sdpa"]["median_s"]
  flops = forward_flops(config, batch, seq)
  return {
    "model": name,
    "batch": batch,
    "seq": seq,
    "max_abs_diff_vs_torch": diff,
    "gflop": flops / 1e9,
    "bertjax": {"median_s": t_ours, "gflops": flops / t_ours / 1e9, "compile_s": compile_s},
    "torch_sdpa": {"median_s": t_torch, "gflops": flops / t_torch / 1e9},
    "speedup_vs_torch": t_torch / t_ours,
  }


def main(argv=None) -> dict:
  args = common.parser(__doc__, rounds=11, warmup=3).parse_args(argv)
  import torch
  import transformers

  shapes = [(2, 16)] if args.smoke else [(32, 128), (8, 512)]
  if args.smoke:
    args.rounds, args.warmup = 2, 2
  # The peak is the best of runs before and after the rows, so that a neighbour's
  # burst during one of them cannot understate it (and overstate every share).
  peak_size = 512 if args.smoke else 2048
  peak_before = matmul_peak(torch, peak_size, 10)
  with tempfile.TemporaryDirectory() as tmp:
    models = [
      ("all-MiniLM-L6-v2", bertjax.minilm_path()),
      (
        "bert-base (random)",
        common.bert_base_dir(transformers, torch, pathlib.Path(tmp), args.smoke),
      ),
    ]
    rows = [
      measure(transformers, torch, path, name, b, t, args)
      for name, path in models
      for b, t in shapes
    ]
  peak_after = matmul_peak(torch, peak_size, 10)
  peak = {k: max(peak_before[k], peak_after[k]) for k in peak_before}
  for row in rows:
    row["bertjax"]["fraction_of_peak"] = row["bertjax"]["gflops"] / peak["jax_gflops"]
    row["torch_sdpa"]["fraction_of_peak"] = row["torch_sdpa"]["gflops"] / peak["torch_gflops"]
  result = {
    "machine": timing.machine(transformers=transformers.__version__),
    "matmul_peak_float32": peak,
    "rows": rows,
  }
  common.write(result, markdown(result), args.out, "forward_cpu", files=not args.smoke)
  return result


def markdown(r: dict) -> str:
  m, peak = r["machine"], r["matmul_peak_float32"]
  lines = [
    (
      f"Forward pass, float32, on {m['cpu']} ({m['cpus']} cores; "
      f"{', '.join(m['isa_flags']) or 'no AVX2'}; PyTorch threads {m['torch_threads']}), "
      f"jax {m['jax']}, torch {m['torch']}, transformers {m['transformers']}. Float32 "
      f"matmul peak measured in the same run ({peak['size']}^3): JAX "
      f"{peak['jax_gflops']:.0f} GFLOP/s, PyTorch {peak['torch_gflops']:.0f} GFLOP/s. "
      f"XLA_FLAGS: `{m.get('xla_flags') or '(none)'}`."
    ),
    "",
    (
      "| model | batch x seq | bertjax | PyTorch sdpa | bertjax speed-up | bertjax "
      "GFLOP/s (of peak) | PyTorch GFLOP/s (of peak) | max diff |"
    ),
    "|---|---|---|---|---|---|---|---|",
  ]
  for x in r["rows"]:
    ours, theirs = x["bertjax"], x["torch_sdpa"]
    lines.append(
      f"| {x['model']} | {x['batch']} x {x['seq']} | {ours['median_s'] * 1e3:.0f} ms | "
      f"{theirs['median_s'] * 1e3:.0f} ms | **{x['speedup_vs_torch']:.2f}x** | "
      f"{ours['gflops']:.0f} ({ours['fraction_of_peak']:.0%}) | "
      f"{theirs['gflops']:.0f} ({theirs['fraction_of_peak']:.0%}) | "
      f"{x['max_abs_diff_vs_torch']:.1e} |"
    )
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  main()
