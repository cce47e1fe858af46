"""UPOS probes for all 7 layers of all-MiniLM-L6-v2: one jitted program vs scikit-learn, layer by layer.

Run: .venv/bin/python benchmarks/bench_probing.py            (EWT dev; writes benchmarks/results/probing_cpu.{json,md})
     .venv/bin/python benchmarks/bench_probing.py --smoke    (a few dozen sentences; checks the script runs)

Features: word features of every layer (first subword) of UD English-EWT dev,
extracted with ``features.extract_word_features`` (one forward per length
bucket); its tokens/s, once compiled, is compared with the plain forward pass
(last hidden state only) on the same batches.

Probes: softmax regression with the same objective on both sides, scikit-learn's
``C * sum CE + ||W||^2 / 2`` being ours ``mean CE + l2/2 ||W||^2`` with
``l2 = 1 / (C n)``. bertjax trains all layers in one ``vmap``-ed, jitted Adam
program (mini-batches, a fixed step count); scikit-learn fits
``LogisticRegression(lbfgs)`` to convergence one layer after another. Both are
scored on the same held-out sentences (20%).
"""

from __future__ import annotations

import argparse
import json
import pathlib

import common
import numpy as np

import bertjax
from bertjax import timing
from bertjax.analysis.representations import features, probing, probing_run
from bertjax.data import conllu, fetch

RESULTS = pathlib.Path(__file__).parent / "results"


def bench_features(params, config, tok, sents, repeats: int) -> dict:
  extract = lambda: features.extract_word_features(params, config, tok, sents, progress=False)
  wf, first = timing.timed(extract)
  # Compiled now. Extraction and the plain forward alternate (each reports its own seconds),
  # best of `repeats` each, so that load from other processes hits both alike.
  ext, fwd = [], []

  def extraction():  # its own seconds: the model's part, as extraction reports it
    ext.append(extract())
    return ext[-1].seconds

  def forward():
    fwd.append(features.forward_throughput(params, config, tok, sents, repeats=1))
    return fwd[-1]["seconds"]

  calls = {"extraction": extraction, "forward": forward}
  timing.interleaved(calls, repeats, warmup=0, first_call=False, own_clock=tuple(calls))
  best = min(ext, key=lambda w: w.seconds)
  plain = min(fwd, key=lambda r: r["seconds"])
  return {
    "wf": wf,
    "first_call_s": first,
    "extraction": best.summary(),
    "forward": plain,
    "extraction_seconds_all": [w.seconds for w in ext],
    "forward_seconds_all": [r["seconds"] for r in fwd],
    "ratio": best.tokens_per_second / plain["tokens_per_second"],
  }


def bench_probes(
  feats, labels, num_classes, train, test, C: float, steps: int, batch: int, max_iter: int
) -> dict:
  from sklearn.linear_model import LogisticRegression

  n = len(train)
  cfg = probing.ProbeConfig(
    l2=1.0 / (C * n),
    learning_rate=1e-2,
    max_steps=steps,
    batch_size=batch,
    eval_every=steps,
    patience=None,
  )
  xtr, ytr, xte, yte = feats[:, train], labels[train], feats[:, test], labels[test]

  def ours():
    p = probing.Probe(cfg, num_classes).fit(xtr, ytr)
    return p, p.accuracy(xte, yte)

  _, first = timing.timed(ours)
  (_, acc), steady = timing.timed(ours)

  sk_acc, sk_iter, sk_times = [], [], []
  for layer in range(feats.shape[0]):
    fit = lambda layer=layer: LogisticRegression(C=C, max_iter=max_iter, tol=1e-4).fit(
      xtr[layer], ytr
    )
    clf, seconds = timing.timed(fit, wait=lambda x: x)
    sk_times.append(seconds)
    sk_acc.append(float(clf.score(xte[layer], yte)))
    sk_iter.append(int(np.max(clf.n_iter_)))
  sk_total = float(sum(sk_times))
  acc = [float(a) for a in acc]
  return {
    "l2": cfg.l2,
    "C": C,
    "steps": steps,
    "batch": batch,
    "train_words": n,
    "test_words": len(test),
    "bertjax": {"accuracy": acc, "first_call_s": first, "steady_s": steady},
    "sklearn": {
      "accuracy": sk_acc,
      "seconds": sk_times,
      "total_s": sk_total,
      "n_iter": sk_iter,
      "max_iter": max_iter,
      "converged": all(i < max_iter for i in sk_iter),
    },
    "max_abs_accuracy_gap_points": 100 * float(np.max(np.abs(np.subtract(acc, sk_acc)))),
    "speedup_incl_compile": sk_total / first,
    "speedup_steady": sk_total / steady,
  }


def markdown(res: dict) -> str:
  m, f, p = res["machine"], res["features"], res["probes"]
  lines = [
    "# Probing benchmark: UPOS probes on all-MiniLM-L6-v2, UD EWT dev",
    "",
    (
      f"{common.measured_on(m)} {res['sentences']} sentences, {f['extraction']['words']} words; "
      f"smoke={res['smoke']}."
    ),
    "",
    "## Feature extraction (all 7 layers, first subword)",
    "",
    "| | tokens | seconds | tokens/s |",
    "|---|---|---|---|",
    (
      f"| extract_word_features (compiled) | {f['extraction']['tokens']} | "
      f"{f['extraction']['seconds']:.2f} | {f['extraction']['tokens_per_second']:.0f} |"
    ),
    (
      f"| plain forward, same batches | {f['forward']['tokens']} | {f['forward']['seconds']:.2f} | "
      f"{f['forward']['tokens_per_second']:.0f} |"
    ),
    "",
    (
      f"Extraction / forward throughput: {f['ratio']:.2f}. First call including "
      f"{len(f['extraction']['shapes'])} compilations: {f['first_call_s']:.1f} s. Padding waste "
      f"{100 * f['extraction']['padding_waste']:.1f}%."
    ),
    "",
    (
      f"## Linear probes (C = {p['C']}, l2 = {p['l2']:.3g}; {p['train_words']} train / "
      f"{p['test_words']} test words)"
    ),
    "",
    "| layer | bertjax acc. | sklearn acc. | sklearn s | sklearn iters |",
    "|---|---|---|---|---|",
  ]
  for i, (a, b) in enumerate(zip(p["bertjax"]["accuracy"], p["sklearn"]["accuracy"])):
    lines.append(
      f"| {i} | {100 * a:.2f} | {100 * b:.2f} | {p['sklearn']['seconds'][i]:.2f} | "
      f"{p['sklearn']['n_iter'][i]} |"
    )
  lines += [
    "",
    "| | wall time (s) |",
    "|---|---|",
    f"| bertjax, all layers, first call (compile + train) | {p['bertjax']['first_call_s']:.2f} |",
    f"| bertjax, all layers, compiled | {p['bertjax']['steady_s']:.2f} |",
    f"| scikit-learn, layer by layer | {p['sklearn']['total_s']:.2f} |",
    "",
    (
      f"Largest accuracy gap: {p['max_abs_accuracy_gap_points']:.2f} points. Speed-up: "
      f"{p['speedup_incl_compile']:.1f}x including compilation, {p['speedup_steady']:.1f}x "
      f"compiled. scikit-learn converged: {p['sklearn']['converged']}."
    ),
    "",
  ]
  return "\n".join(lines)


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--smoke", action="store_true", help="tiny run (seconds) that checks the script")
  ap.add_argument("--sentences", type=int, default=None, help="first N EWT dev sentences (all)")
  ap.add_argument("--C", type=float, default=1.0, help="inverse L2 strength, as in scikit-learn")
  ap.add_argument("--steps", type=int, default=1500, help="Adam steps of the bertjax probes")
  ap.add_argument("--batch", type=int, default=1024, help="bertjax mini-batch size")
  ap.add_argument("--max-iter", type=int, default=5000, help="scikit-learn lbfgs iterations")
  ap.add_argument("--repeats", type=int, default=3, help="timed extraction/forward repeats")
  ap.add_argument("--out", type=pathlib.Path, default=RESULTS, help="results directory")
  ap.add_argument(
    "--data-dir",
    default=None,
    metavar="DIR",
    help="the data directory holding ud_english_ewt/ (default: `bertjax data`'s "
    "lookup; --smoke: the shipped sample)",
  )
  args = ap.parse_args(argv)
  n = 40 if args.smoke and args.sentences is None else args.sentences
  steps, max_iter = (50, 50) if args.smoke else (args.steps, args.max_iter)

  path = bertjax.minilm_path()
  config, params = bertjax.from_hf(path)
  tok = bertjax.Tokenizer.from_pretrained(path)
  root = fetch.smoke_dir() if args.smoke and args.data_dir is None else args.data_dir
  ud = fetch.find("ud_english_ewt", root)
  sents = conllu.read_conllu(next(ud.glob("*-ud-dev.conllu")), n)
  fres = bench_features(params, config, tok, sents, 1 if args.smoke else args.repeats)
  wf = fres.pop("wf")
  feats = np.asarray(wf.features, np.float32)
  vocab = conllu.build_vocab(sents, "upos")
  labels = conllu.encode_field(sents, vocab, "upos")
  split = probing_run.sentence_splits(len(sents), 0.05, 0.2, seed=0)
  train_s = np.concatenate([split["train"], split["val"]])
  train = np.flatnonzero(np.isin(wf.sentence_index, train_s))
  test = np.flatnonzero(np.isin(wf.sentence_index, split["test"]))
  pres = bench_probes(feats, labels, len(vocab), train, test, args.C, steps, args.batch, max_iter)
  res = {
    "machine": timing.machine(),
    "smoke": args.smoke,
    "sentences": len(sents),
    "features": fres,
    "probes": pres,
  }
  args.out.mkdir(parents=True, exist_ok=True)
  stem = "probing_cpu_smoke" if args.smoke else "probing_cpu"
  (args.out / f"{stem}.json").write_text(json.dumps(res, indent=1))
  (args.out / f"{stem}.md").write_text(markdown(res))
  print(markdown(res))
  return res


if __name__ == "__main__":
  main()
