"""Are sixteen heads really better than one? Michel et al. 2019 on all-MiniLM-L6-v2.

Run:
  ./run.sh experiment sixteen_heads
  .venv/bin/python experiments/sixteen_heads.py [--smoke] [--model DIR_OR_HUB_ID]

The method, the data and what differs from the paper: docs/experiments.md, section
`sixteen_heads` (the site's Experiments page).
"""

from __future__ import annotations

import pathlib
import sys
import time
from typing import Any

import common
import numpy as np
from rules import sixteen_heads as rules

from bertjax import stats

NAME = "sixteen_heads"
PRUNE_TARGETS = (0.2, 0.4, 0.6)  # fractions of heads physically removed for the timing


def run_settings(smoke: bool, seed: int) -> dict[str, Any]:
  """The sizes of a run: the full one, or the small smoke one."""
  if smoke:
    return {
      "model": "tiny random (2 layers x 4 heads, 64 wide, MiniLM vocabulary)",
      "max_sentences": 48,
      "probe_steps": 60,
      "batch_size": 64,
      "prune_step": 0.25,
      "prune_max": 0.75,
      "random_orders": 2,
      "timing_batch": 4,
      "timing_length": 32,
      "timing_repeats": 3,
      "alpha": 0.01,
      "seed": seed,
    }
  return {
    "model": "all-MiniLM-L6-v2",
    "max_sentences": None,
    "probe_steps": 500,
    "batch_size": 128,
    "prune_step": 0.1,
    "prune_max": 0.9,
    "random_orders": 8,
    "timing_batch": 32,
    "timing_length": 64,
    "timing_repeats": 15,
    "alpha": 0.01,
    "seed": seed,
  }


# Figures and the run -----------------------------------------------------------------------


def figures(r: dict, out, stem: str = NAME) -> list[str]:
  """Importance and ablation heatmaps, the pruning curves, the speed-up bars and the layer
  ablation (`stem`: the file names' start, `common.results_stem`)."""
  from bertjax.plots import pruning as plots

  out = pathlib.Path(out)
  paths = (
    plots.importance_and_ablation(r["importance"], r["ablation"], out / f"{stem}_heads.png"),
    plots.pruning_panels(
      r["pruning"],
      out / f"{stem}_pruning.png",
      task="negation",
      majority=r["pruning"]["majority_accuracy"],
    ),
    plots.speedup_bars(r["speed"], out / f"{stem}_speedup.png"),
    plots.layer_ablation(r["ablation"], out / f"{stem}_layers.png"),
  )
  return [p.name for p in paths]


def load(args, s: dict[str, Any], timings: dict[str, float]):
  """The model (`s["model"]` becomes its name) and the negation task's labelled sentences
  (a seeded sample of `s["max_sentences"]` when set): `(config, params, tok, sentences)`."""
  from bertjax.tasks.sentences import load_sentences

  with common.timed(timings, "load"):
    config, params, tok, s["model"] = common.load_model(
      args,
      lambda: common.tiny_model(
        0, s["model"], preset="tiny", num_hidden_layers=2, max_position_embeddings=512
      ),
    )
    sentences = load_sentences()
    if s["max_sentences"]:
      pick = np.random.default_rng(args.seed).choice(
        len(sentences), s["max_sentences"], replace=False
      )
      sentences = [sentences[i] for i in np.sort(pick)]
  return config, params, tok, sentences


def timing_batch(tok, data, s: dict[str, Any]):
  """The first `timing_batch` UD EWT dev sentences of at most `timing_length` tokens, padded
  to that length: `(ids, attention_mask)`."""
  from bertjax.data import conllu
  from bertjax.tasks import text_batches

  words = [
    list(x.forms) for x in conllu.read_conllu(common.ud_file(data, "dev"), max_sentences=400)
  ]
  fit = [words[i] for i in text_batches.fitting(tok, words, s["timing_length"])]
  if len(fit) < s["timing_batch"]:
    raise common.UsageError(
      f"only {len(fit)} UD sentences fit timing_length={s['timing_length']}; need timing_batch={s['timing_batch']}"
    )
  b = tok.encode_words(fit[: s["timing_batch"]], pad_to=s["timing_length"])
  return b.input_ids, b.attention_mask


def main(argv=None) -> int:
  args = common.parser(__doc__).parse_args(argv)
  start = time.perf_counter()
  from bertjax.analysis import batching
  from bertjax.analysis.interventions import ablation, pruning
  from bertjax.tasks import negation_probe as task

  data = common.data_dir(args.data_dir, "ud_english_ewt")
  s = run_settings(args.smoke, args.seed)
  timings: dict[str, float] = {}
  config, params, tok, sentences = load(args, s, timings)
  with common.timed(timings, "task"):
    rs = task.TaskSettings(batch_size=s["batch_size"], probe_steps=s["probe_steps"], seed=args.seed)
    task_results, fitted = task.fit_task(params, config, tok, sentences, rs, common.log)
    tparams, train, test = fitted["params"], fitted["train"], fitted["test"]
  chunk = batching.default_chunk_size()
  with common.timed(timings, "importance"):
    imp_raw = ablation.head_importance(
      tparams, config, train, task.task_loss, normalize_layers=False
    )
    imp_norm = ablation.layer_normalized(imp_raw)  # Michel's per-layer L2 normalisation
  with common.timed(timings, "ablation"):
    ab = pruning.head_ablation_tests(
      tparams, config, test, task.task_rows, alpha=s["alpha"], chunk_size=chunk
    )
    common.log(f"single heads: {ab['significant_accuracy_drops']} significant accuracy drops")
  with common.timed(timings, "pruning"):
    pr = pruning.pruning_curves(
      tparams,
      config,
      train,
      test,
      task.task_loss,
      task.task_rows,
      imp_raw,
      imp_norm,
      step=s["prune_step"],
      max_fraction=s["prune_max"],
      random_orders=s["random_orders"],
      seed=args.seed + 1,
      chunk_size=chunk,
    )
    pr["majority_accuracy"] = task_results["majority_accuracy"]
    common.log(f"pruning: iterative accuracy {np.round(pr['accuracy']['iterative'], 3).tolist()}")
  with common.timed(timings, "speed"):
    ids, attn = timing_batch(tok, data, s)
    order = ablation.pruning_order(pr["masks_iterative"], imp_norm)
    sp = pruning.pruned_speedups(
      params, config, ids, attn, order, targets=PRUNE_TARGETS, repeats=s["timing_repeats"]
    )
    sp.update(batch=s["timing_batch"], length=s["timing_length"])
    common.log(
      f"speed-up {np.round(sp['speedup'], 3).tolist()} at {np.round(sp['fractions'], 3).tolist()}"
    )
  results = {
    "task": task_results,
    "importance": {
      "normalized": imp_norm,
      "raw": imp_raw,
      "spearman_normalized_vs_raw": stats.spearman(imp_norm, imp_raw),
      "spearman_vs_single_ablation_loss": stats.spearman(
        imp_norm, ab["head_loss"] - ab["baseline_loss"]
      ),
    },
    "ablation": ab,
    "pruning": pr,
    "speed": sp,
  }
  depth = config.depth
  seconds = time.perf_counter() - start
  results["timings_s"] = timings
  common.write_results(
    NAME,
    args.out,
    results,
    findings=rules.findings,
    settings={
      **s,
      "data": "bertjax/resources/sentences.tsv (negation task); UD EWT dev (timing batch)",
      "criterion": task_results["why"],
      "layers": depth,
      "heads": config.num_attention_heads,
      "chunk_size": chunk,
      "ablation_strategy": "prefix",
      "indexing": rules.INDEXING,
    },
    smoke=args.smoke,
    seconds=seconds,
    figures=figures(results, args.out, common.results_stem(NAME, args.model)),
    model=args.model,
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
