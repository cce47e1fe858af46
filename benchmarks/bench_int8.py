"""Dynamic int8 linear layers on the CPU: speed vs float32, and accuracy on a task.

Run: ./run.sh bench bench_int8            (writes benchmarks/results/int8_cpu.{json,md})
     ./run.sh bench bench_int8 --smoke    (a few seconds; checks the script runs, writes nothing)

`BertConfig(quantize="int8")` (Q8BERT-style: symmetric per-output-channel int8
weights, per-token int8 activations, int32 accumulation; `bertjax.quantize`) against
the float32 forward of all-MiniLM-L6-v2 (real weights):

* speed: the jitted forward at batch 32 x 128 and 8 x 512, float32 and int8
  interleaved round by round (median of the rounds, compile apart), and one FFN-sized
  matmul (4096 x 384 @ 384 x 1536) in float32 and through the int8 dot, so the cost of
  XLA's integer dot on this CPU is visible apart from the quantise/dequantise work;
* accuracy: the report's negation task (the project's 385 labelled sentences,
  `bertjax/resources/sentences.tsv`): a logistic-regression probe on mean-pooled final
  states, fitted on the float32 features of even-numbered sentences, scored on the
  odd-numbered ones with float32 and with int8 features (and a probe fitted on int8
  features), plus the agreement of the two models' predictions and the cosine of
  their sentence embeddings.

The result names the CPU model, its vector ISA flags (AVX2, AVX-512 VNNI, AMX-INT8: the
instructions an int8 dot can use) and the thread count.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import common
import jax
import jax.numpy as jnp
import numpy as np

import bertjax
from bertjax import timing
from bertjax.quantize import int8_matmul

RESULTS = common.RESULTS


def _interleaved(fns: dict, rounds: int, warmup: int) -> dict:
  """Median and min seconds of each zero-argument function, side by side (`warmup` untimed
  calls each, the first among them)."""
  times = timing.interleaved(fns, rounds, warmup=max(warmup - 1, 0))
  return {k: {"median_s": v["median_s"], "min_s": v["min_s"]} for k, v in times.items()}


def speed(config, params, shapes, rounds: int, warmup: int) -> list[dict]:
  """Forward seconds, float32 vs int8, at each (batch, seq)."""
  fwd = jax.jit(
    lambda p, c, ids, m: bertjax.forward(p, c, ids, m).last_hidden_state, static_argnums=1
  )
  q = config.replace(quantize="int8")
  rows = []
  for b, t in shapes:
    ids = np.random.default_rng(0).integers(1000, config.vocab_size, (b, t)).astype(np.int32)
    mask = np.ones((b, t), np.int32)
    res = _interleaved(
      {
        "float32": lambda ids=ids, mask=mask: fwd(params, config, ids, mask),
        "int8": lambda ids=ids, mask=mask: fwd(params, q, ids, mask),
      },
      rounds,
      warmup,
    )
    rows.append(
      {"batch": b, "seq": t, **res, "speedup": res["float32"]["median_s"] / res["int8"]["median_s"]}
    )
  return rows


def matmul(m: int, k: int, n: int, rounds: int, warmup: int) -> dict:
  """One (m, k) @ (k, n) product: float32 vs the dynamic int8 dot."""
  r = np.random.default_rng(0)
  x = jnp.asarray(r.standard_normal((m, k)), jnp.float32)
  w = jnp.asarray(r.standard_normal((k, n)) * 0.05, jnp.float32)
  f32, i8 = jax.jit(lambda a, b: a @ b), jax.jit(int8_matmul)
  res = _interleaved({"float32": lambda: f32(x, w), "int8": lambda: i8(x, w)}, rounds, warmup)
  gflop = 2 * m * k * n / 1e9
  for v in res.values():
    v["gflops"] = gflop / v["median_s"]
  return {
    "shape": [m, k, n],
    **res,
    "speedup": res["float32"]["median_s"] / res["int8"]["median_s"],
  }


def accuracy(config, params, tok, limit: int | None) -> dict:
  """The negation task with float32 and int8 sentence features (see the docstring)."""
  from sklearn.linear_model import LogisticRegression

  from bertjax.tasks.sentences import load_sentences

  sents = load_sentences()[:limit]
  texts = [s.text for s in sents]
  labels = np.array([int(s.negated) for s in sents])
  fwd = jax.jit(
    lambda p, c, ids, m: bertjax.forward(p, c, ids, m).last_hidden_state, static_argnums=1
  )

  def features(cfg):
    out = []
    for i in range(0, len(texts), 32):
      enc = tok.encode(texts[i : i + 32], pad_to=64)
      h = np.asarray(fwd(params, cfg, enc.input_ids, enc.attention_mask), np.float64)
      m = np.asarray(enc.attention_mask, np.float64)[..., None]
      out.append((h * m).sum(1) / m.sum(1))
    return np.concatenate(out)

  f, q = features(config), features(config.replace(quantize="int8"))
  train, test = np.arange(len(texts)) % 2 == 0, np.arange(len(texts)) % 2 == 1
  probe = LogisticRegression(C=1.0, max_iter=2000).fit(f[train], labels[train])
  probe_q = LogisticRegression(C=1.0, max_iter=2000).fit(q[train], labels[train])
  cos = (f * q).sum(-1) / np.linalg.norm(f, axis=-1) / np.linalg.norm(q, axis=-1)
  return {
    "task": "negation detection (bertjax/resources/sentences.tsv), logistic probe on "
    "mean-pooled final states, even sentences train, odd test",
    "sentences": len(texts),
    "test_sentences": int(test.sum()),
    "accuracy_float32": float(probe.score(f[test], labels[test])),
    "accuracy_int8_float_probe": float(probe.score(q[test], labels[test])),
    "accuracy_int8_own_probe": float(probe_q.score(q[test], labels[test])),
    "prediction_agreement": float(np.mean(probe.predict(f[test]) == probe.predict(q[test]))),
    "embedding_cosine_mean": float(cos.mean()),
    "embedding_cosine_min": float(cos.min()),
  }


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(
    description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
  )
  parser.add_argument("--rounds", type=int, default=11, help="timed rounds per mode")
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--smoke", action="store_true", help="tiny sizes, no result files")
  parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
  args = parser.parse_args(argv)
  path = bertjax.minilm_path()
  config, params = bertjax.from_hf(path)
  tok = bertjax.Tokenizer.from_pretrained(path)
  shapes = [(2, 16)] if args.smoke else [(32, 128), (8, 512)]
  rounds, warmup = (2, 1) if args.smoke else (args.rounds, args.warmup)
  t0 = time.perf_counter()
  result = {
    "machine": timing.machine(),
    "model": "all-MiniLM-L6-v2",
    "smoke": args.smoke,
    "forward": speed(config, params, shapes, rounds, warmup),
    "matmul": matmul(*((64, 384, 1536) if args.smoke else (4096, 384, 1536)), rounds, warmup),
    "accuracy": accuracy(config, params, tok, 40 if args.smoke else None),
  }
  result["wall_s"] = time.perf_counter() - t0
  print(json.dumps(result, indent=2))
  if not args.smoke:
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "int8_cpu.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "int8_cpu.md").write_text(markdown(result))
  return result


def markdown(r: dict) -> str:
  m, a, mm = r["machine"], r["accuracy"], r["matmul"]
  isa = ", ".join(m["isa_flags"]) or "none of the listed int8/AVX flags"
  lines = [
    (
      f"Dynamic int8 vs float32, {r['model']}, on {m['cpu']} ({m['cpus']} cores; ISA: "
      f"{isa}; jax {m['jax']})."
    ),
    "",
    "| batch x seq | float32 (ms) | int8 (ms) | speed-up |",
    "|---|---|---|---|",
  ]
  for row in r["forward"]:
    lines.append(
      f"| {row['batch']} x {row['seq']} | {row['float32']['median_s'] * 1e3:.1f} | "
      f"{row['int8']['median_s'] * 1e3:.1f} | {row['speedup']:.2f}x |"
    )
  shape = mm["shape"]
  lines += [
    "",
    (
      f"One {shape[0]}x{shape[1]} @ {shape[1]}x{shape[2]} matmul: float32 "
      f"{mm['float32']['gflops']:.1f} GFLOP/s, int8 (quantise, int32 dot, dequantise) "
      f"{mm['int8']['gflops']:.1f} GFLOP/s ({mm['speedup']:.2f}x)."
    ),
    "",
    (
      f"{a['task']}: accuracy float32 {a['accuracy_float32']:.3f}, int8 features with "
      f"the float32 probe {a['accuracy_int8_float_probe']:.3f}, int8 with its own probe "
      f"{a['accuracy_int8_own_probe']:.3f}; predictions agree on "
      f"{a['prediction_agreement']:.1%} of {a['test_sentences']} test sentences; "
      f"sentence embedding cosine mean {a['embedding_cosine_mean']:.4f}, min "
      f"{a['embedding_cosine_min']:.4f}."
    ),
    "",
  ]
  return "\n".join(lines)


if __name__ == "__main__":
  main()
