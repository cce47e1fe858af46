"""All 72 single-head ablations of all-MiniLM-L6-v2: vmapped sweep with prefix reuse vs a naive loop.

Run (CPU, full):  JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_ablation.py --out benchmarks/results
Check (tiny):     JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_ablation.py --smoke --out /tmp/b

Data: the first `--sentences` `# text = ...` lines of UD English EWT dev, sorted by
length and batched (`--batch-size`), each batch padded to a multiple of 16 tokens
so that few shapes compile. Metric: mean cosine similarity of the mean-pooled
final sentence embedding (MiniLM's own pooling) to the unablated one; 1 = no
effect. Both methods evaluate the same 73 masks (baseline + 72 single heads) on
the same batches in one process, CPU float32:

* `sweep`: `ablation_sweep(strategy="prefix")`: blocks below layer l run once
  (the intact pass) and blocks l.. run over layer l's 12 masks, `chunk` masks
  vmapped at a time (`--chunk-sizes`; chunk 1 is a `lax.map` of single masks).
* `naive`: `strategy="loop"`: 73 full forward passes per batch through one jitted
  function (the baseline pass is shared, as the sweep's).

Compile time is measured separately: a warm-up pass over one batch of each shape
(compile + one run), minus the same batches' compiled time in the timed pass
(batches are timed one by one; per-batch values are combined by sentence count). Peak memory is
`resource.getrusage(RUSAGE_SELF).ru_maxrss` after each phase (monotone). Head
importance (`head_importance`, token-reconstruction loss through the tied
embeddings, per-example gradients) is timed against one plain forward pass over
the same data. Writes `ablation_<device>.json` and `.md` under `--out`.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import resource
import time

import jax
import numpy as np

import bertjax
from bertjax.analysis import ablation as ab

EWT_DEV = pathlib.Path(__file__).resolve().parents[2] / "shared/data/ud_english_ewt/en_ewt-ud-dev.conllu"


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default="benchmarks/results", help="output directory")
  parser.add_argument("--smoke", action="store_true",
                      help="random tiny model (2 layers x 4 heads) on 16 sentences")
  parser.add_argument("--sentences", type=int, default=512, help="EWT dev sentences (default 512)")
  parser.add_argument("--batch-size", type=int, default=64, help="sentences per batch")
  parser.add_argument("--chunk-sizes", default="1,12",
                      help="comma list of sweep chunk sizes (masks per vmap chunk) to time")
  parser.add_argument("--data", default=str(EWT_DEV), help="CoNLL-U file with '# text =' lines")
  parser.add_argument("--skip-naive", action="store_true", help="time the sweep only")
  return parser.parse_args(argv)


def read_texts(path, n):
  texts = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      if line.startswith("# text = "):
        texts.append(line[len("# text = "):].strip())
        if len(texts) == n:
          break
  if len(texts) < n:
    raise ValueError(f"{path} has only {len(texts)} sentences, --sentences={n}")
  return texts


def make_batches(tok, texts, batch_size, multiple=16):
  lengths = np.array([len(tok.encode([t]).input_ids[0]) for t in texts])
  order = np.argsort(lengths, kind="stable")
  batches = []
  for i in range(0, len(order), batch_size):
    chunk = [texts[j] for j in order[i:i + batch_size]]
    longest = int(lengths[order[i:i + batch_size]].max())
    b = tok.encode(chunk, pad_to=-(-longest // multiple) * multiple)
    batches.append(ab.as_batch(b))
  return batches, int(lengths.sum())


def rss_mib():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(fn):
  start = time.perf_counter()
  out = fn()
  jax.block_until_ready(out)
  return out, time.perf_counter() - start


def main(argv=None):
  args = parse_args(argv)
  if args.smoke:
    config = bertjax.BertConfig.preset("tiny", vocab_size=30522, max_position_embeddings=512)
    params = bertjax.init(config, 0)
    args.sentences, args.batch_size = 16, 8
  else:
    config, params = bertjax.from_hf(bertjax.minilm_path())
  tok = bertjax.Tokenizer.from_pretrained(bertjax.minilm_path())
  texts = read_texts(args.data, args.sentences)
  batches, real_tokens = make_batches(tok, texts, args.batch_size)
  shapes = sorted({tuple(b["input_ids"].shape) for b in batches})
  warm = [next(b for b in batches if tuple(b["input_ids"].shape) == s) for s in shapes]
  padded_tokens = sum(int(np.prod(b["input_ids"].shape)) for b in batches)
  metric = ab.mean_embedding_cosine
  chunks = [int(c) for c in args.chunk_sizes.split(",")]
  methods = [(f"prefix_chunk{c}", "prefix", c) for c in chunks]
  methods += [] if args.skip_naive else [("loop", "loop", 1)]
  run = lambda method, data: ab.ablation_sweep(
      params, config, data, metric, modes=("scale",), include=("heads",),
      chunk_size=method[2], strategy=method[1])["scale"]
  report = {"device": jax.devices()[0].device_kind, "platform": platform.platform(),
                "cpu_count": jax.local_device_count(), "model": "tiny (random)" if args.smoke
                else "all-MiniLM-L6-v2", "layers": config.depth, "heads": config.num_attention_heads,
                "sentences": len(texts), "batches": len(batches), "shapes": [list(s) for s in shapes],
                "real_tokens": real_tokens, "padded_tokens": padded_tokens,
                "chunk_sizes": chunks, "metric": "mean-pooled embedding cosine to unablated",
                "rss_start_mib": rss_mib()}
  results = {}
  warm_ids = {id(b) for b in warm}
  for method in methods:
    strategy = method[0]
    _, warm_s = timed(lambda m=method: run(m, warm))  # compile + one run of each shape
    total, count, steady_warm, wall = 0.0, 0.0, 0.0, 0.0
    for b in batches:  # one batch at a time, to time the warm batches again, compiled
      result, t = timed(lambda m=method, b=b: run(m, [b]))
      n = b["input_ids"].shape[0]  # the metric's count: one cosine per sentence
      total, count, wall = total + n * result.heads, count + n, wall + t
      steady_warm += t if id(b) in warm_ids else 0.0
    results[strategy] = ab.AblationResult("scale", 1.0, total / count, *(None,) * 3)
    report[strategy] = {"wall_s": wall, "compile_s": max(warm_s - steady_warm, 0.0),
                            "rss_after_mib": rss_mib()}
    print(f"{strategy}: {wall:.2f} s (compile {warm_s - steady_warm:.1f} s)", flush=True)
  sweep = results[methods[0][0]]
  if "loop" in results:
    report["max_abs_diff"] = float(max(np.abs(results[m[0]].heads - results["loop"].heads).max()
                                       for m in methods))
    report["speedup"] = {m[0]: report["loop"]["wall_s"] / report[m[0]]["wall_s"]
                         for m in methods if m[0] != "loop"}
  report["baseline"] = 1.0  # the cosine of the intact model to itself
  report["head_ablation"] = sweep.heads.tolist()
  order = np.argsort(sweep.heads.ravel())
  report["most_harmful"] = [[int(i // config.num_attention_heads),
                             int(i % config.num_attention_heads),
                             float(sweep.heads.ravel()[i])] for i in order[:5]]

  fwd = jax.jit(lambda p, b: bertjax.pool(p, config, bertjax.run_layers(
      p, config, bertjax.embed(p, config, b["input_ids"], b["token_type_ids"]),
      b["attention_mask"])[0]))
  fwd_pass = lambda data: [fwd(params, b) for b in data]
  timed(lambda: fwd_pass(warm))
  _, forward_s = timed(lambda: fwd_pass(batches))
  imp = lambda data: ab.head_importance(params, config, data, ab.token_reconstruction_loss)
  _, imp_warm = timed(lambda: imp(warm))
  importance, imp_s = timed(lambda: imp(batches))
  imp_warm -= imp_s * sum(int(np.prod(b["input_ids"].shape)) for b in warm) / padded_tokens
  report.update(forward_s=forward_s, importance_s=importance_s_ratio(imp_s, forward_s),
                importance_compile_s=max(imp_warm, 0.0), importance=np.asarray(importance).tolist(),
                rss_end_mib=rss_mib())
  print(f"forward {forward_s:.2f} s, importance {imp_s:.2f} s", flush=True)

  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  name = "ablation_smoke" if args.smoke else f"ablation_{report['device'].lower().replace(' ', '_')}"
  (out / f"{name}.json").write_text(json.dumps(report, indent=1))
  (out / f"{name}.md").write_text(markdown(report))
  print((out / f"{name}.md").read_text())


def importance_s_ratio(imp_s, forward_s):
  return {"wall_s": imp_s, "per_forward": imp_s / forward_s}


def markdown(r):
  lines = [f"# Single-head ablation sweep: {r['model']} ({r['layers']}x{r['heads']} heads)", "",
           (f"{r['sentences']} UD EWT dev sentences, {r['batches']} batches, shapes {r['shapes']}; "
           f"{r['real_tokens']} real / {r['padded_tokens']} padded tokens; device {r['device']}; "
           f"metric: {r['metric']} (baseline {r['baseline']:.4f})."), "",
           "| method | passes | wall (s) | compile (s) | peak RSS after (MiB) |",
           "|---|---|---|---|---|"]
  keys = [k for k in r if k.startswith("prefix_chunk")] + ["loop"]
  for key in keys:
    label = ("naive loop (one jitted forward per mask)" if key == "loop" else
             f"sweep, prefix reuse, vmap chunk {key.removeprefix('prefix_chunk')}")
    if key in r:
      x = r[key]
      lines.append(f"| {label} | {r['layers'] * r['heads'] + 1} | {x['wall_s']:.2f} | "
                   f"{x['compile_s']:.1f} | "
                   f"{x['rss_after_mib']:.0f} |")
  if "speedup" in r:
    lines += ["", "Speed-up over the loop: " + ", ".join(f"{k} {v:.2f}x" for k, v in r["speedup"].items())
              + f"; max |sweep - loop| = {r['max_abs_diff']:.2e}."]
  imp = r["importance_s"]
  lines += ["", "| head importance (grad, per-example) | one forward pass | ratio |",
            "|---|---|---|",
            f"| {imp['wall_s']:.2f} s | {r['forward_s']:.2f} s | {imp['per_forward']:.2f}x |", "",
            "Most harmful single-head ablations (layer, head, cosine): "
            + ", ".join(f"({l}, {h}, {v:.4f})" for l, h, v in r["most_harmful"]), ""]
  return "\n".join(lines)


if __name__ == "__main__":
  main()
