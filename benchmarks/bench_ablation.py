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
(batches are timed one by one; per-batch values are combined by sentence count). The methods
run one after the other, so that peak memory, `resource.getrusage(RUSAGE_SELF).ru_maxrss`
after each phase (monotone), is each method's.

Head importance (`head_importance`, per-example |dL/dxi|, Michel et al.) is timed
against one forward pass over the same data computing the same loss, in interleaved rounds
(`bertjax.timing`; compile apart: the first call less the median), for two criteria:

* `task`: Michel et al. score heads by a fine-tuned task's loss. MiniLM has no task
  head, so the task is one read from the treebank: does the sentence contain a
  negation (a word with `Polarity=Neg` in UD's FEATS)? A logistic-regression head on
  the mean-pooled final states (MiniLM's pooling) is fitted on these sentences'
  intact embeddings (full-batch Adam), and the importance is that head's
  cross-entropy. This is the benchmark's criterion.
* `token_reconstruction`: `ablation.token_reconstruction_loss`, a full-vocabulary
  softmax at every real token through the tied embeddings (self-supervised, no
  head needed); its loss alone costs about as much as the encoder.

`--importance-only` skips the sweep. Writes `ablation_<device>.json` and `.md` under `--out`.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import resource

import common
import jax
import jax.numpy as jnp
import numpy as np
import optax

import bertjax
from bertjax import stats, timing
from bertjax.analysis import batching
from bertjax.analysis.interventions import ablation
from bertjax.data import fetch
from bertjax.data.conllu import read_conllu


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default="benchmarks/results", help="output directory")
  parser.add_argument(
    "--smoke", action="store_true", help="random tiny model (2 layers x 4 heads) on 16 sentences"
  )
  parser.add_argument("--sentences", type=int, default=512, help="EWT dev sentences (default 512)")
  parser.add_argument("--batch-size", type=int, default=64, help="sentences per batch")
  parser.add_argument(
    "--chunk-sizes",
    default="1,12",
    help="comma list of sweep chunk sizes (masks per vmap chunk) to time",
  )
  parser.add_argument(
    "--data",
    default=None,
    help="CoNLL-U file with '# text =' lines (default: UD EWT dev, found by "
    "`bertjax data`'s lookup; --smoke: the shipped sample)",
  )
  parser.add_argument("--skip-naive", action="store_true", help="time the sweep only")
  parser.add_argument(
    "--importance-only", action="store_true", help="time head importance only (no ablation sweep)"
  )
  parser.add_argument(
    "--repeats",
    type=int,
    default=3,
    help="timed repeats of forward and importance (medians reported)",
  )
  return parser.parse_args(argv)


def read_sentences(path, n):
  """The first `n` sentences' texts and negation labels (any word with Polarity=Neg)."""
  sentences = read_conllu(path, max_sentences=n)
  if len(sentences) < n:
    raise ValueError(f"{path} has only {len(sentences)} sentences, --sentences={n}")
  texts = [s.text or " ".join(s.forms) for s in sentences]
  negated = np.array([any("Polarity=Neg" in f for f in s.feats) for s in sentences], np.int32)
  return texts, negated


def read_texts(path, n):
  return read_sentences(path, n)[0]


def make_batches(tok, texts, batch_size, multiple=16, labels=None):
  """Length-sorted batches padded to a multiple of `multiple`; `labels` ride along."""
  lengths = np.array([len(tok.encode([t]).input_ids[0]) for t in texts])
  order = np.argsort(lengths, kind="stable")
  batches = []
  for i in range(0, len(order), batch_size):
    idx = order[i : i + batch_size]
    longest = int(lengths[idx].max())
    b = batching.as_batch(
      tok.encode([texts[j] for j in idx], pad_to=-(-longest // multiple) * multiple)
    )
    if labels is not None:
      b["labels"] = jnp.asarray(labels[idx])
    batches.append(b)
  return batches, int(lengths.sum())


def negation_probe(params, config, batches, steps=300):
  """A logistic-regression head (w, b) on intact mean-pooled states, and its loss function."""
  encode = jax.jit(
    lambda b: stats.mean_pool(
      bertjax.run_layers(
        params,
        config,
        bertjax.embed(params, config, b["input_ids"], b["token_type_ids"]),
        b["attention_mask"],
      )[0],
      b["attention_mask"],
    )
  )
  x = jnp.concatenate([encode(b) for b in batches])
  y = jnp.concatenate([b["labels"] for b in batches])
  mu, sd = x.mean(0), x.std(0) + 1e-6

  def head_loss(head, x, y):
    logits = ((x - mu) / sd) @ head["w"] + head["b"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, y)

  head = {"w": jnp.zeros((x.shape[1], 2)), "b": jnp.zeros(2)}
  tx = optax.adam(0.05)
  opt = tx.init(head)

  @jax.jit
  def step(head, opt):
    loss, g = jax.value_and_grad(lambda h: head_loss(h, x, y).mean() + 1e-3 * (h["w"] ** 2).sum())(
      head
    )
    updates, opt = tx.update(g, opt)
    return optax.apply_updates(head, updates), opt, loss

  for _ in range(steps):
    head, opt, loss = step(head, opt)
  accuracy = float((((x - mu) / sd) @ head["w"] + head["b"]).argmax(-1).__eq__(y).mean())

  def loss_fn(params, config, batch, last_hidden_state, pooled):
    nll = head_loss(
      head, stats.mean_pool(last_hidden_state, batch["attention_mask"]), batch["labels"]
    )
    return nll.sum(), jnp.asarray(nll.shape[0], nll.dtype)

  return loss_fn, {
    "train_loss": float(loss),
    "train_accuracy": accuracy,
    "positives": int(y.sum()),
    "sentences": int(y.shape[0]),
  }


def time_importance(params, config, batches, loss_fn, repeats):
  """Median seconds of head importance and of a forward pass with the same loss, side by side
  (`bertjax.timing.interleaved`), and each one's compile (first call minus the median)."""
  fwd = jax.jit(
    lambda p, b: loss_fn(
      p,
      config,
      b,
      bertjax.run_layers(
        p,
        config,
        bertjax.embed(p, config, b["input_ids"], b["token_type_ids"]),
        b["attention_mask"],
      )[0],
      None,
    )
  )
  calls = {
    "forward": lambda: [fwd(params, b) for b in batches],
    "importance": lambda: ablation.head_importance(params, config, batches, loss_fn),
  }
  outputs = {}
  t = timing.interleaved(calls, repeats, warmup=0, outputs=outputs)
  f, i = t["forward"]["median_s"], t["importance"]["median_s"]
  return {
    "forward_s": f,
    "importance_s": i,
    "ratio": i / f,
    "forward_all_s": t["forward"]["times_s"],
    "importance_all_s": t["importance"]["times_s"],
    "forward_compile_s": max(t["forward"]["first_call_s"] - f, 0.0),
    "importance_compile_s": max(t["importance"]["first_call_s"] - i, 0.0),
    "importance": np.asarray(outputs["importance"]).tolist(),
  }


def rss_mib():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv=None):
  args = parse_args(argv)
  if args.smoke:
    config = bertjax.BertConfig.preset("tiny", vocab_size=30522, max_position_embeddings=512)
    params = bertjax.init(config, 0)
    args.sentences, args.batch_size = 16, 8
  else:
    config, params = bertjax.from_hf(bertjax.minilm_path())
  if args.data is None:
    ud = fetch.smoke_dir() / "ud_english_ewt" if args.smoke else fetch.find("ud_english_ewt")
    args.data = str(next(ud.glob("*-ud-dev.conllu")))
  tok = bertjax.Tokenizer.from_pretrained(bertjax.minilm_path())
  texts, negated = read_sentences(args.data, args.sentences)
  batches, real_tokens = make_batches(tok, texts, args.batch_size, labels=negated)
  shapes = sorted({tuple(b["input_ids"].shape) for b in batches})
  warm = [next(b for b in batches if tuple(b["input_ids"].shape) == s) for s in shapes]
  padded_tokens = sum(int(np.prod(b["input_ids"].shape)) for b in batches)
  metric = ablation.mean_embedding_cosine
  chunks = [int(c) for c in args.chunk_sizes.split(",")]
  methods = [(f"prefix_chunk{c}", "prefix", c) for c in chunks]
  methods += [] if args.skip_naive else [("loop", "loop", 1)]
  methods = [] if args.importance_only else methods
  run = lambda method, data: ablation.ablation_sweep(
    params,
    config,
    data,
    metric,
    head_ablations=("scale",),
    include=("heads",),
    chunk_size=method[2],
    strategy=method[1],
  )["scale"]
  report = {
    "machine": timing.machine(),
    "device": jax.devices()[0].device_kind,
    "platform": platform.platform(),
    "cpu_count": jax.local_device_count(),
    "model": "tiny (random)" if args.smoke else "all-MiniLM-L6-v2",
    "layers": config.depth,
    "heads": config.num_attention_heads,
    "sentences": len(texts),
    "batches": len(batches),
    "shapes": [list(s) for s in shapes],
    "real_tokens": real_tokens,
    "padded_tokens": padded_tokens,
    "chunk_sizes": chunks,
    "metric": "mean-pooled embedding cosine to unablated",
    "rss_start_mib": rss_mib(),
  }
  results = {}
  warm_ids = {id(b) for b in warm}
  # The methods run one after the other, not interleaved: each one's peak memory is recorded
  # after it (a wide vmap's buffers would otherwise count against the next).
  for method in methods:
    strategy = method[0]
    _, warm_s = timing.timed(lambda m=method: run(m, warm))  # compile + one run of each shape
    total, count, steady_warm, wall = 0.0, 0.0, 0.0, 0.0
    for b in batches:  # one batch at a time, to time the warm batches again, compiled
      result, t = timing.timed(lambda m=method, b=b: run(m, [b]))
      n = b["input_ids"].shape[0]  # the metric's count: one cosine per sentence
      total, count, wall = total + n * result.heads, count + n, wall + t
      steady_warm += t if id(b) in warm_ids else 0.0
    results[strategy] = ablation.AblationResult("scale", 1.0, total / count, *(None,) * 3)
    report[strategy] = {
      "wall_s": wall,
      "compile_s": max(warm_s - steady_warm, 0.0),
      "rss_after_mib": rss_mib(),
    }
    print(f"{strategy}: {wall:.2f} s (compile {warm_s - steady_warm:.1f} s)", flush=True)
  if "loop" in results:
    report["max_abs_diff"] = float(
      max(np.abs(results[m[0]].heads - results["loop"].heads).max() for m in methods)
    )
    report["speedup"] = {
      m[0]: report["loop"]["wall_s"] / report[m[0]]["wall_s"] for m in methods if m[0] != "loop"
    }
  if methods:
    sweep = results[methods[0][0]]
    report["baseline"] = 1.0  # the cosine of the intact model to itself
    report["head_ablation"] = sweep.heads.tolist()
    order = np.argsort(sweep.heads.ravel())
    report["most_harmful"] = [
      [
        int(i // config.num_attention_heads),
        int(i % config.num_attention_heads),
        float(sweep.heads.ravel()[i]),
      ]
      for i in order[:5]
    ]

  task_loss, probe = negation_probe(params, config, batches)
  report["negation_probe"] = probe
  report["importance"] = {}
  for name, loss_fn in (
    ("task", task_loss),
    ("token_reconstruction", ablation.token_reconstruction_loss),
  ):
    r = time_importance(params, config, batches, loss_fn, args.repeats)
    report["importance"][name] = r
    print(
      f"importance ({name}): {r['importance_s']:.2f} s vs forward {r['forward_s']:.2f} s "
      f"= {r['ratio']:.2f}x",
      flush=True,
    )
  report["rss_end_mib"] = rss_mib()

  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  name = (
    "ablation_smoke" if args.smoke else f"ablation_{report['device'].lower().replace(' ', '_')}"
  )
  name += "_importance" if args.importance_only else ""
  (out / f"{name}.json").write_text(json.dumps(report, indent=1))
  (out / f"{name}.md").write_text(markdown(report))
  print((out / f"{name}.md").read_text())


def markdown(r):
  lines = [
    f"# Single-head ablation sweep: {r['model']} ({r['layers']}x{r['heads']} heads)",
    "",
    (
      f"{r['sentences']} UD EWT dev sentences, {r['batches']} batches, shapes {r['shapes']}; "
      f"{r['real_tokens']} real / {r['padded_tokens']} padded tokens; device {r['device']}"
      + (f"; metric: {r['metric']} (baseline {r['baseline']:.4f})." if "baseline" in r else ".")
    ),
    "",
    common.measured_on(r["machine"]),
  ]
  keys = [k for k in r if k.startswith("prefix_chunk")] + ["loop"]
  if any(k in r for k in keys):  # not --importance-only
    lines += [
      "",
      "| method | passes | wall (s) | compile (s) | peak RSS after (MiB) |",
      "|---|---|---|---|---|",
    ]
  for key in keys:
    label = (
      "naive loop (one jitted forward per mask)"
      if key == "loop"
      else f"sweep, prefix reuse, vmap chunk {key.removeprefix('prefix_chunk')}"
    )
    if key in r:
      x = r[key]
      lines.append(
        f"| {label} | {r['layers'] * r['heads'] + 1} | {x['wall_s']:.2f} | "
        f"{x['compile_s']:.1f} | "
        f"{x['rss_after_mib']:.0f} |"
      )
  if "speedup" in r:
    lines += [
      "",
      "Speed-up over the loop: "
      + ", ".join(f"{k} {v:.2f}x" for k, v in r["speedup"].items())
      + f"; max |sweep - loop| = {r['max_abs_diff']:.2e}.",
    ]
  probe = r["negation_probe"]
  lines += [
    "",
    (
      "Head importance (per-example |dL/dxi|) against one forward pass over the same "
      "data computing the same loss (medians of interleaved rounds; compile apart: the first "
      "call less the median). "
      f"Task: negation probe ({probe['positives']} of {probe['sentences']} sentences "
      f"negated; train accuracy {probe['train_accuracy']:.3f})."
    ),
    "",
    "| criterion | importance | forward + loss | ratio | compile (imp / fwd) |",
    "|---|---|---|---|---|",
  ]
  for name, x in r["importance"].items():
    lines.append(
      f"| {name} | {x['importance_s']:.2f} s | {x['forward_s']:.2f} s | "
      f"**{x['ratio']:.2f}x** | {x['importance_compile_s']:.1f} s / "
      f"{x['forward_compile_s']:.1f} s |"
    )
  if "most_harmful" in r:
    lines += [
      "",
      "Most harmful single-head ablations (layer, head, cosine): "
      + ", ".join(f"({l}, {h}, {v:.4f})" for l, h, v in r["most_harmful"]),
    ]
  return "\n".join(lines + [""])


if __name__ == "__main__":
  main()
