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
from findings import Rule, Test

from bertjax import stats

NAME = "sixteen_heads"
PAPER = "Michel et al. 2019"
PRUNE_TARGETS = (0.2, 0.4, 0.6)  # fractions of heads physically removed for the timing
INDEXING = (
  "layers are numbered 1..L (blocks; 0 would be the embeddings) and heads 0..H-1; "
  "per-layer arrays hold layers 1..L in order, (L, H) arrays layer by head; "
  "task.probe_accuracy_by_layer and probe_loss_by_layer hold layers 0..L"
)


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


REMOVABLE = "the share of heads removable alone"
LAYERS_OK = "the share of layers where one head is enough"
KEPT = "the share of heads masked within the tolerance"
OVER_ALL = "importance's mean accuracy minus the best random order's"
OVER_MEAN = "minus their mean"
DIFF = "pruned vs masked outputs' largest difference"
AT40, AT60, FASTEST = "the speed-up with 40% removed", "with 60%", "the largest speed-up"
SINGLE = Rule(
  PAPER,
  "Most attention heads can be removed individually at test time without a "
  "statistically significant drop in performance.",
  yes=(Test(REMOVABLE, ">=", 0.75),),
  partly=(Test(REMOVABLE, ">=", 0.5),),
)
ONE_HEAD = Rule(
  PAPER,
  "In many layers a single head is enough: all heads but one can be removed with little loss.",
  yes=(Test(LAYERS_OK, ">=", 2 / 3),),
  partly=(Test(LAYERS_OK, ">=", 1 / 3),),
)
PRUNING = Rule(
  PAPER,
  "Iterative importance pruning removes 20-40% of heads with no noticeable drop (BERT: 40%).",
  yes=(Test(KEPT, ">=", 0.35),),
  partly=(Test(KEPT, ">=", 0.15),),
)
ORDER = Rule(
  PAPER,
  "Pruning by head importance degrades the model far more slowly than pruning in random order.",
  yes=(Test(OVER_ALL, ">", 0),),
  partly=(Test(OVER_MEAN, ">", 0),),
)
SPEED = Rule(
  PAPER,
  "Physically pruning heads speeds up inference (BERT, 50% of heads pruned: up to 17.5% faster).",
  yes=(Test(DIFF, "<", 1e-4), Test(AT40, ">=", 1.05), Test(AT60, ">=", 1.10)),
  partly=(Test(DIFF, "<", 1e-4), Test(FASTEST, ">=", 1.02)),
  partly_if="all",
)


def _row_single_heads(ab: dict, s: dict, differs: str) -> dict:
  """Michel Table 1: how many heads can go alone without a significant accuracy drop."""
  total_heads = np.size(ab["head_loss"])
  base_acc0, n_test = ab["baseline_accuracy"], ab["num_test"]
  removable = ab["heads_removable_alone"] / total_heads
  return SINGLE.row(
    f"{ab['heads_removable_alone']} of {total_heads} heads ({removable:.0%}) removed alone "
    f"give no significant held-out accuracy drop on negation detection (exact McNemar "
    f"p<{s['alpha']}, n={n_test}; baseline {base_acc0:.3f}, worst single head "
    f"-{ab['max_single_head_accuracy_drop']:.3f}); "
    f"{ab['significant_loss_rises']} raise the per-example loss significantly (Wilcoxon). "
    f"{differs} With n={n_test} the test detects only drops of "
    f">= {stats.mcnemar_min_detectable_drop(n_test, s['alpha']):.3f} (Michel: MNLI's ~10k examples).",
    {REMOVABLE: removable},
  )


def _row_one_head_enough(ab: dict, tolerance: float) -> dict:
  """Michel Table 2: layers where keeping only their best head stays near the intact model."""
  depth = np.shape(ab["head_loss"])[0]
  base_acc0 = ab["baseline_accuracy"]
  best_keep = np.max(ab["keep_one_accuracy"], 1)
  layers_ok = int((best_keep >= base_acc0 - tolerance).sum())
  return ONE_HEAD.row(
    f"keeping only the best head of a layer (best on the held-out split itself, as Michel's "
    f"Table 2) stays within {tolerance:.0%} accuracy of the intact model in {layers_ok} of "
    f"{depth} layers (best-head accuracy, layers 1-{depth}: "
    f"{np.round(best_keep, 3).tolist()}, baseline {base_acc0:.3f}).",
    {LAYERS_OK: layers_ok / depth},
  )


def _row_pruning_curve(pr: dict, layer_acc: np.ndarray, lower: int) -> dict:
  """The iterative pruning curve: how many heads go before the accuracy drops."""
  tolerance = pr["tolerance"]
  pa, pl = pr["accuracy"], pr["loss"]
  fractions = pr["fractions"]
  keep_frac, base_acc = pr["max_fraction_within_tolerance"], pa["iterative"][0]
  peak = int(np.argmax(pa["iterative"]))
  rises = pa["iterative"][peak] > base_acc + tolerance
  return PRUNING.row(
    f"held-out accuracy stays within {tolerance:.0%} of the intact {base_acc:.3f} up to "
    f"{keep_frac:.0%} of heads masked (accuracy by fraction "
    f"{np.round(pa['iterative'], 3).tolist()} at {np.round(fractions, 2).tolist()}; "
    f"held-out loss {pl['iterative'][0]:.3f} intact, {pl['iterative'][-1]:.3f} at the end; "
    f"training loss {pr['train_loss_iterative'][0]:.3f} -> "
    f"{pr['train_loss_iterative'][-1]:.3f}). "
    + (
      f"The curve rises (to {pa['iterative'][peak]:.3f} at {fractions[peak]:.0%}), likely "
      f"because the probe reads negation better nearer the embeddings (layer {lower} "
      f"{layer_acc[lower]:.3f} vs final {layer_acc[-1]:.3f}) and masking heads moves the "
      "final state that way: on this task pruning is a weak test. "
      if rises and layer_acc[lower] > layer_acc[-1] + tolerance
      else ""
    ),
    {KEPT: keep_frac},
  )


def _row_importance_order(pr: dict, importance: dict) -> dict:
  """Pruning by importance against pruning in random orders."""
  fractions = pr["fractions"]
  area, area_random = pr["mean_accuracy_over_curve"], pr["mean_accuracy_over_curve_random"]
  return ORDER.row(
    f"mean held-out accuracy over the curve (0-{fractions[-1]:.0%} masked): "
    f"importance, re-estimated {area['iterative']:.3f}; static normalised "
    f"{area['static_normalized']:.3f}; static raw {area['static_raw']:.3f}; random orders "
    f"{np.mean(area_random):.3f} (range {min(area_random):.3f}-{max(area_random):.3f}, "
    f"{len(area_random)} orders); importance vs the single-head ablation loss change: "
    f"Spearman {importance['spearman_vs_single_ablation_loss']:.2f}.",
    {
      OVER_ALL: area["iterative"] - max(area_random),
      OVER_MEAN: area["iterative"] - float(np.mean(area_random)),
    },
  )


def _row_speedup(sp: dict) -> dict:
  """The measured speed-up of physically pruned models."""
  speedup, speedup_min = sp["speedup"], sp["speedup_fastest"]
  diffs = sp["max_abs_diff_pruned_vs_masked"]
  s40, s60 = speedup[1], speedup[2]
  f = sp["fractions"]
  return SPEED.row(
    f"{sp['backend']} batch {sp['batch']}x{sp['length']}, median of "
    f"{sp['repeats']}: speed-up {speedup[0]:.2f}x / {s40:.2f}x / {s60:.2f}x with "
    f"{f[0]:.0%} / {f[1]:.0%} / {f[2]:.0%} of heads removed "
    f"(fastest of the repeats: {' / '.join(f'{x:.2f}x' for x in speedup_min)}; head-masked "
    f"model, every head still computed: {sp['speedup_masked']:.2f}x); "
    f"pruned outputs equal masked ones to {max(diffs):.1e}.",
    {DIFF: max(diffs), AT40: s40, AT60: s60, FASTEST: max(speedup)},
  )


def findings(r: dict, s: dict) -> list[dict]:
  """The Findings rows from the results as written to JSON (`r`) and the settings `s`.

  Each `holds` follows the stated rule from the numbers; each row says what differs from
  Michel et al.'s setting (a fixed probe on a frozen encoder, a small held-out set, a task the
  embeddings already solve).
  """
  r = common.from_json(r)
  ab, pr = r["ablation"], r["pruning"]
  layer_acc = np.asarray(r["task"]["probe_accuracy_by_layer"])
  lower = int(np.argmax(layer_acc[:-1]))
  model = common.describe_model(s.get("model") or "the model", s.get("layers", len(layer_acc) - 1))
  differs = (
    f"Differs from Michel: {model + '; ' if model else ''}a fixed linear probe on the "
    f"frozen encoder's final layer for negation, a lexical cue the probe reads as well "
    f"from layer {lower} ({layer_acc[lower]:.3f}; final layer {layer_acc[-1]:.3f}), "
    "rather than a fine-tuned model on MNLI or translation, so heads are less needed "
    "than there."
  )
  return [
    _row_single_heads(ab, s, differs),
    _row_one_head_enough(ab, pr["tolerance"]),
    _row_pruning_curve(pr, layer_acc, lower),
    _row_importance_order(pr, r["importance"]),
    _row_speedup(r["speed"]),
  ]


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
    findings=findings,
    settings={
      **s,
      "data": "bertjax/resources/sentences.tsv (negation task); UD EWT dev (timing batch)",
      "criterion": task_results["why"],
      "layers": depth,
      "heads": config.num_attention_heads,
      "chunk_size": chunk,
      "ablation_strategy": "prefix",
      "indexing": INDEXING,
    },
    smoke=args.smoke,
    seconds=seconds,
    figures=figures(results, args.out, common.results_stem(NAME, args.model)),
    model=args.model,
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
