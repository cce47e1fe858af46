"""Pretraining train-step throughput: bertjax vs transformers `BertForPreTraining`; GPU MFU.

Run: ./run.sh bench bench_train_step              (CPU: 4-layer 256-wide BERT vs PyTorch)
     ./run.sh bench bench_train_step --mfu        (GPU: BERT-base, bf16, fused attention, MFU)
     ./run.sh bench bench_train_step --smoke      (a few seconds; checks the script runs)

CPU mode: the same config (4 layers, hidden 256, 4 heads, vocab 30522), the same
batch (32 x 128, 20 masked positions per sequence, NSP labels), AdamW, dropout
on, one optimizer step each; both warmed up, timed in interleaved rounds,
median reported, compile time separate. Ours gathers the masked positions
before the vocabulary projection; transformers projects every token (its
`BertForPreTraining` API), which is part of what is being compared.

MFU mode: model FLOPs per step = 6 x (non-embedding parameters) x tokens +
attention (12 x layers x seq^2 x hidden x batch, forward + backward) + the MLM
head on the gathered positions, divided by step time and by the bf16 matmul
peak measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import common
import jax
import jax.numpy as jnp
import numpy as np

import bertjax
from bertjax import timing
from bertjax.training.optim import make_optimizer
from bertjax.training.state import create_train_state
from bertjax.training.step import make_train_step


def make_batch(config, batch: int, seq: int, predictions: int, seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, config.vocab_size, (batch, seq)).astype(np.int32)
  positions = np.sort(
    np.stack([rng.choice(np.arange(1, seq - 1), predictions, replace=False) for _ in range(batch)]),
    axis=1,
  ).astype(np.int32)
  return {
    "input_ids": ids,
    "attention_mask": np.ones_like(ids),
    "token_type_ids": (np.arange(seq) >= seq // 2).astype(np.int32)[None].repeat(batch, 0),
    "mlm_positions": positions,
    "mlm_ids": np.take_along_axis(ids, positions, 1),
    "mlm_weights": np.ones(positions.shape, np.float32),
    "next_sentence_labels": rng.integers(0, 2, batch).astype(np.int32),
  }


def ours_step(config, batch, prng_impl=None):
  nsp = "nsp" in config.family.heads  # MLM alone for families without an NSP head
  params = bertjax.init(config, 0, heads=("mlm", "nsp") if nsp else ("mlm",))
  tx = make_optimizer("adamw", 1e-4)
  step = make_train_step(
    config, tx, task="pretrain", objective="nsp" if nsp else "none", donate=True
  )
  key = jax.random.key(0) if prng_impl is None else jax.random.key(0, impl=prng_impl)
  state = create_train_state(params, tx, key)
  device_batch = jax.tree.map(jnp.asarray, batch)
  holder = {"state": state}

  def run():
    holder["state"], metrics = step(holder["state"], device_batch)
    return metrics["loss"]

  return run


def torch_step(config, batch):
  import torch
  import transformers

  hf = transformers.BertConfig(
    **{k: v for k, v in config.to_hf_dict().items() if k not in ("id2label", "label2id")}
  )
  model = transformers.BertForPreTraining(hf).train()
  opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
  labels = np.full(batch["input_ids"].shape, -100, np.int64)
  np.put_along_axis(labels, batch["mlm_positions"], batch["mlm_ids"], 1)
  inputs = dict(
    input_ids=torch.tensor(batch["input_ids"]).long(),
    attention_mask=torch.tensor(batch["attention_mask"]).long(),
    token_type_ids=torch.tensor(batch["token_type_ids"]).long(),
    labels=torch.tensor(labels),
    next_sentence_label=torch.tensor(batch["next_sentence_labels"]).long(),
  )

  def run():
    opt.zero_grad(set_to_none=True)
    loss = model(**inputs).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()

  return run


def matmul_peak_tflops(
  dtype=jnp.bfloat16, n: int = 8192, trials: int = 7, calls: int = 10
) -> float:
  """Measured n x n x n matmul rate: `calls` products back to back per timing, best median."""
  a = jax.random.normal(jax.random.key(0), (n, n), dtype)
  b = jax.random.normal(jax.random.key(1), (n, n), dtype)
  f = jax.jit(lambda x, y: x @ y)
  t = timing.interleaved({"matmul": lambda: [f(a, b) for _ in range(calls)]}, trials)
  return 2 * n**3 / (t["matmul"]["median_s"] / calls) / 1e12


def profile(run, out: pathlib.Path, steps: int = 3) -> None:
  """A JAX profiler trace of `steps` train steps; the Perfetto JSON copied to `out`."""
  import shutil
  import tempfile

  with tempfile.TemporaryDirectory() as tmp:
    with jax.profiler.trace(tmp, create_perfetto_trace=True):
      for _ in range(steps):
        run()
    out.mkdir(parents=True, exist_ok=True)
    for path in pathlib.Path(tmp).rglob("*"):
      if path.is_file() and (path.name.endswith(".json.gz") or path.suffix == ".pb"):
        shutil.copy(path, out / path.name)


def model_flops(config, batch: int, seq: int, predictions: int) -> float:
  heads = ("mlm", "nsp") if "nsp" in config.family.heads else ("mlm",)
  params = jax.eval_shape(lambda: bertjax.init(config, 0, heads=heads))
  total = bertjax.count_params(params)
  emb = bertjax.count_params(params["embeddings"])
  tokens = batch * seq
  dense = 6 * (total - emb) * tokens
  # Each layer's keys per query: every position, or the window's band (w + 1 at most).
  keys = sum(seq if w is None else min(seq, w + 1) for w in config.layer_windows)
  attention = 12 * keys * seq * config.hidden_size * batch
  decoder = 6 * config.vocab_size * config.embed_dim * batch * predictions
  return dense + attention + decoder


def parse_args(argv=None) -> argparse.Namespace:
  parser = common.parser(__doc__, rounds=10, warmup=3)
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--seq", type=int, default=128)
  parser.add_argument("--predictions", type=int, default=20)
  parser.add_argument(
    "--mfu",
    action="store_true",
    help="GPU: BERT-base, bf16, fused attention; model-FLOPs utilisation",
  )
  parser.add_argument(
    "--variants",
    default="pallas:threefry:256,pallas:unsafe_rbg:256",
    help="--mfu: comma list of attention_impl:prng_impl:batch[:nodrop]"
    "[:unrollN] (nodrop: no hidden dropout; unrollN: scan_unroll=N)",
  )
  parser.add_argument(
    "--profile",
    default=None,
    help="--mfu: write a profiler trace of the last variant to this folder",
  )
  parser.add_argument(
    "--preset",
    default="bert-base",
    help="--mfu: the model (a BertConfig preset, e.g. modernbert-base)",
  )
  return parser.parse_args(argv)


def mfu_variant(spec: str, args, profile_it: bool) -> dict:
  """One `--variants` entry (attention_impl:prng_impl:batch[:nodrop][:attndrop][:unrollN])
  timed: its step time and model TFLOP/s (MFU is added once the peak is known). `attndrop`
  adds BERT's attention dropout (0.1) to its hidden dropout; `--preset` picks the model
  (a family without an NSP head trains MLM alone)."""
  impl, prng, size, *rest = spec.split(":")
  dropout = 0.0 if "nodrop" in rest else 0.1
  unroll = next((int(r.removeprefix("unroll")) for r in rest if r.startswith("unroll")), 1)
  overrides = dict(
    attention_impl=impl,
    hidden_dropout_prob=dropout,
    scan_unroll=unroll,
    attention_probs_dropout_prob=0.1 if "attndrop" in rest else 0.0,
  )
  family = bertjax.BertConfig.preset(args.preset).family
  if family.ffn_dropout == "inside":  # one rate for ModernBERT's dropouts
    overrides["attention_probs_dropout_prob"] = dropout
  if args.smoke:
    small = dict(
      vocab_size=1000,
      hidden_size=64,
      num_hidden_layers=2,
      num_attention_heads=4,
      intermediate_size=128,
      max_position_embeddings=128,
      pad_token_id=1,
    )
    config = bertjax.BertConfig.preset(args.preset, **small, **overrides)
    batch_size, seq = 4, 32
  else:
    config = bertjax.BertConfig.preset(args.preset, dtype="bfloat16", **overrides)
    batch_size, seq = int(size), args.seq
  batch = make_batch(config, batch_size, seq, args.predictions)
  run = ours_step(config, batch, None if prng == "threefry" else prng)
  t = common.interleaved({spec: run}, args)[spec]
  compile_s = t["first_call_s"]  # the first step: its compile and one run
  if profile_it:
    profile(run, pathlib.Path(args.profile))
  flops = model_flops(config, batch_size, seq, args.predictions)
  row = {
    "variant": spec,
    "attention_impl": impl,
    "prng_impl": prng,
    "batch": batch_size,
    "seq": seq,
    "hidden_dropout": dropout,
    "scan_unroll": unroll,
    "median_step_s": t["median_s"],
    "min_step_s": t["min_s"],
    "compile_s": compile_s,
    "model_tflop_per_step": flops / 1e12,
    "model_tflops": flops / t["median_s"] / 1e12,
    "tokens_per_s": batch_size * seq / t["median_s"],
  }
  print(
    f"{spec:>28}: step {1e3 * row['median_step_s']:.1f} ms, "
    f"{row['model_tflops']:.1f} TFLOP/s, compile {compile_s:.1f} s",
    flush=True,
  )
  return row


def run_mfu(args, machine: dict) -> dict:
  """`--mfu`: every variant's MFU against the bf16 matmul peak measured before and after."""
  variants = [v for v in args.variants.split(",") if v]
  if args.smoke:
    variants, args.rounds = variants[:2], 2
  peak_n = 1024 if args.smoke else 8192
  peaks = [matmul_peak_tflops(n=peak_n)]
  rows = [mfu_variant(spec, args, bool(args.profile) and spec == variants[-1]) for spec in variants]
  peaks.append(matmul_peak_tflops(n=peak_n))
  peak = max(peaks)
  for row in rows:
    row["mfu"] = row["model_tflops"] / peak
  label = f"{args.preset} (smoke sizes)" if args.smoke else f"{args.preset} bf16"
  return {
    "machine": machine,
    "config": label,
    "seq": args.seq,
    "predictions_per_sequence": args.predictions,
    "rounds": args.rounds,
    "matmul_peak_tflops_measured": peaks,
    "matmul_peak_tflops": peak,
    "flop_formula": "6 x non-embedding params x tokens + 12 x seq x keys x hidden x batch "
    "summed over layers (keys: seq, or a window's w + 1; attention, "
    "fwd+bwd) + 6 x vocab x E x masked positions",
    "variants": rows,
    "best": max(rows, key=lambda r: r["mfu"]),
  }


def run_cpu(args, machine: dict) -> dict:
  """CPU mode: our train step against transformers' `BertForPreTraining`, interleaved."""
  config = bertjax.BertConfig.preset("bert-mini", vocab_size=30522)
  if args.smoke:
    config = bertjax.BertConfig.preset("tiny")
    args.batch, args.seq, args.rounds, args.predictions = 2, 16, 2, 3
  batch = make_batch(config, args.batch, args.seq, args.predictions)
  times = common.interleaved(
    {"bertjax": ours_step(config, batch), "torch": torch_step(config, batch)}, args
  )
  t_ours, t_torch = times["bertjax"]["median_s"], times["torch"]["median_s"]
  import torch

  tokens = args.batch * args.seq
  return {
    "machine": {**machine, "torch": torch.__version__},
    "config": "bert-mini (4x256)",
    "batch": args.batch,
    "seq": args.seq,
    "predictions": args.predictions,
    "bertjax": {
      "median_step_s": t_ours,
      "tokens_per_s": tokens / t_ours,
      "compile_s": times["bertjax"]["first_call_s"],  # the first step: compile and one run
    },
    "torch_BertForPreTraining": {"median_step_s": t_torch, "tokens_per_s": tokens / t_torch},
    "speedup_vs_torch": t_torch / t_ours,
  }


def main(argv=None) -> dict:
  args = parse_args(argv)
  machine = timing.machine()
  if args.mfu:
    result = run_mfu(args, machine)
    name = "train_step_gpu_mfu" + ("" if args.preset == "bert-base" else f"_{args.preset}")
  else:
    result, name = run_cpu(args, machine), "train_step_cpu"
  print(json.dumps(result, indent=2))
  if not args.smoke:
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
  return result


if __name__ == "__main__":
  main()
