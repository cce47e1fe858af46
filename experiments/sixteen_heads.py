"""Are sixteen heads really better than one? Michel et al. 2019 on all-MiniLM-L6-v2.

Run:
  ./run.sh experiment sixteen_heads
  .venv/bin/python experiments/sixteen_heads.py [--smoke] [--model DIR_OR_HUB_ID]

The method, the data and what differs from the paper: docs/experiments.md, section
`sixteen_heads` (the site's Experiments page).
"""

from __future__ import annotations

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
  """The sizes of a run (`experiments/sizes.toml`): the full one, or the small smoke one."""
  return {**common.sizes(NAME)["smoke" if smoke else "full"], "seed": seed}


# The run -----------------------------------------------------------------------------------


def load(args, s: dict[str, Any], timings: dict[str, float]):
  """The model (`s["model"]` becomes its name) and the negation task's labelled sentences
  (a seeded sample of `s["max_sentences"]` when set): `(config, params, tok, sentences)`."""
  from bertjax.tasks.sentences import load_sentences

  with common.timed(timings, "load"):
    config, params, tok, s["model"] = common.load_model(args, common.tiny_stand_in(s["model"]))
    sentences = load_sentences()
    if s["max_sentences"]:
      pick = np.random.default_rng(args.seed).choice(
        len(sentences), s["max_sentences"], replace=False
      )
      sentences = [sentences[i] for i in np.sort(pick)]
  return config, params, tok, sentences


def main(argv=None) -> int:
  args = common.parser(__doc__).parse_args(argv)
  start = time.perf_counter()
  from bertjax.analysis import batching
  from bertjax.analysis.interventions import ablation, pruning
  from bertjax.data import conllu
  from bertjax.plots.pruning import sixteen_heads_figures
  from bertjax.tasks import negation_probe as task
  from bertjax.tasks import text_batches

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
    ud = conllu.read_conllu(common.ud_file(data, "dev"), max_sentences=400)
    batch = text_batches.first_fitting(
      tok, [list(x.forms) for x in ud], s["timing_batch"], s["timing_length"]
    )
    ids, attn = batch.input_ids, batch.attention_mask
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
  results["timings_s"] = timings
  settings = {
    **s,
    "data": "bertjax/resources/sentences.tsv (negation task); UD EWT dev (timing batch)",
    "criterion": task_results["why"],
    "layers": config.depth,
    "heads": config.num_attention_heads,
    "chunk_size": chunk,
    "ablation_strategy": "prefix",
    "indexing": rules.INDEXING,
  }
  figs = sixteen_heads_figures(results, args.out, common.results_stem(NAME, args.model))
  common.finish(NAME, args, results, settings, started=start, figures=figs)
  return 0


if __name__ == "__main__":
  sys.exit(main())
