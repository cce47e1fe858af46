"""One attribution graph (`bertjax.analysis.circuits.graphs.attribute`) on the CPU, by parts.

Run: ./run.sh bench bench_graphs           (writes benchmarks/results/bench_graphs.*)
     ./run.sh bench bench_graphs --smoke   (tiny shapes; checks the script runs)

Issue 62's target: a 32-token graph on all-mpnet-base-v2 in at most 2 minutes on 2 CPU cores.
For all-MiniLM-L6-v2's shape (6 x 384) and all-mpnet-base-v2's (12 x 768), random weights,
float32, one 32-token sequence, a cross-layer top-k transcoder of 4 x d latents and k = 32
(initialised on the sequence's own FFN activations: an untrained one has k active latents
per (layer, position) as a trained one does, and the time depends on that count alone), and
a projection of the pooled state as the target:

* forward: `jax.jit` of `bertjax.forward`, for scale;
* the graph with every active feature's row, first call (compiling) and second call;
* the graph with `max_features` (circuit-tracer's selection by influence), second call.

Beside each graph: its rows, and the FLOPs of their backward passes if every row ran
through every block of the frozen model (per row and block, the value and output
projections' input gradients and the two products with the frozen pattern; the decoder's
transposed writes). `attribute` runs a batch of layer-l features through blocks 0 .. l
only, so its work is about (l + 1) / depth of that, half on average; "GFLOP/s" divides the
full-depth count. Results name the CPU and its ISA.
"""

from __future__ import annotations

import sys
import time

import common
import jax
import jax.numpy as jnp
import numpy as np

import bertjax
from bertjax import timing
from bertjax.analysis.circuits import graphs as G
from bertjax.analysis.circuits import transcoders as tcs

SHAPES = {
  "all-MiniLM-L6-v2": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12),
  "all-mpnet-base-v2": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12),
}


def row_flops(config, tc_cfg, seq: int) -> float:
  """Matrix-product FLOPs of one row's backward pass through every block (2 per multiply-add):
  two d x d input gradients and two seq x seq products per block, the decoder's writes."""
  d, depth = config.hidden_size, config.depth
  blocks = depth * (2 * 2 * seq * d * d + 2 * 2 * seq * seq * d)
  reach = sum(tc_cfg.reach(layer) for layer in range(depth))
  return float(blocks + 2 * seq * tc_cfg.k * reach * d)


def time_model(shape: dict, seq: int, max_features: int, batch: int) -> dict:
  config = bertjax.BertConfig(vocab_size=30527, intermediate_size=4 * shape["hidden_size"], **shape)
  params = bertjax.init(config, 0)
  rng = np.random.default_rng(0)
  ids = rng.integers(1000, config.vocab_size, seq).astype(np.int32)
  d = config.hidden_size
  tc_cfg = tcs.TranscoderConfig(
    d_model=d, layers=config.depth, latents=4 * d, k=32, cross_layer=True
  )
  x, y = tcs.activations(
    params, config, [{"input_ids": ids[None], "attention_mask": np.ones((1, seq))}]
  )
  tc = tcs.init(0, tc_cfg, x, y)
  target = [G.Projection(tuple(rng.standard_normal(d).tolist()))]
  forward = jax.jit(lambda p, i: bertjax.forward(p, config, i).last_hidden_state)
  jax.block_until_ready(forward(params, ids[None]))
  t0 = time.perf_counter()
  jax.block_until_ready(forward(params, jnp.asarray(ids[None])))
  row = {"forward_s": time.perf_counter() - t0, "seq": seq, "latents": tc_cfg.latents}
  for name, limit in (("all features", None), (f"max_features={max_features}", max_features)):
    seconds = []
    for _ in range(1 if limit else 2):
      t0 = time.perf_counter()
      graph = G.attribute(params, config, tc, tc_cfg, ids, target, max_features=limit, batch=batch)
      seconds.append(time.perf_counter() - t0)
    rows = graph.n_features + 1
    flops = rows * row_flops(config, tc_cfg, seq)
    row[name] = {
      "seconds": seconds,
      "features": graph.n_features,
      "rows": rows,
      "flops": flops,
      "gflops_per_s": flops / seconds[-1] / 1e9,
      **G.scores(graph),
    }
    print(f"  {name}: {graph.n_features} features, {seconds} s", file=sys.stderr, flush=True)
  return row


def main(argv=None) -> dict:
  p = common.parser(__doc__)
  p.add_argument("--seq", type=int, default=32, help="tokens in the sequence")
  p.add_argument("--max-features", type=int, default=4096, help="the selected graph's features")
  p.add_argument("--batch", type=int, default=128, help="rows per backward pass")
  args = p.parse_args(argv)
  shapes, seq, limit = SHAPES, args.seq, args.max_features
  if args.smoke:
    shapes = {"tiny": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4)}
    seq, limit = 8, 64
  result = {"machine": timing.machine(), "smoke": args.smoke, "batch": args.batch, "models": {}}
  for name, shape in shapes.items():
    print(name, file=sys.stderr, flush=True)
    result["models"][name] = time_model(shape, seq, limit, args.batch)
  common.write(result, markdown(result), args.out, "bench_graphs", files=not args.smoke)
  return result


def markdown(r: dict) -> str:
  lines = [
    (
      f"One attribution graph on the CPU, float32, a CLT of 4 x d latents (k = 32), "
      f"{r['batch']} rows per backward pass; the first call compiles. "
      f"{common.measured_on(r['machine'])}"
    ),
    "",
  ]
  rows = []
  for name, m in r["models"].items():
    for call, e in m.items():
      if not isinstance(e, dict):
        continue
      rows.append(
        (
          name,
          call,
          f"{m['seq']}",
          f"{e['features']:,}",
          ", ".join(f"{s:.1f}" for s in e["seconds"]),
          f"{e['flops'] / 1e12:.2f}",
          f"{e['gflops_per_s']:.0f}",
          f"{e['replacement']:.2f} / {e['completeness']:.2f}",
        )
      )
  header = ("model shape", "graph", "tokens", "features", "seconds (calls)", "TFLOP", "GFLOP/s",
            "replacement / completeness")  # fmt: skip
  lines += common.table(header, rows)
  lines += ["", "Target: a 32-token graph on all-mpnet-base-v2 in at most 2 minutes."]
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  main()
