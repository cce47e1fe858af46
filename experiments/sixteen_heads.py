"""Are sixteen heads really better than one? Michel et al. 2019 on all-MiniLM-L6-v2.

Run:
  ./run.sh experiment sixteen_heads
  .venv/bin/python -m experiments.sixteen_heads [--smoke] [--model DIR_OR_HUB_ID]

The method, the data and what differs from the paper: docs/experiments.md, section
`sixteen_heads` (the site's Experiments page).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

from bertjax import claims, stats, study
from bertjax.claims import Claim, Test
from experiments import common

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

  with study.timed(timings, "load"):
    config, params, tok, s["model"] = study.load_model(args, study.tiny_stand_in(s["model"]))
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

  data = study.data_dir(args.data_dir, "ud_english_ewt")
  s = run_settings(args.smoke, args.seed)
  timings: dict[str, float] = {}
  config, params, tok, sentences = load(args, s, timings)
  with study.timed(timings, "task"):
    rs = task.TaskSettings(batch_size=s["batch_size"], probe_steps=s["probe_steps"], seed=args.seed)
    task_results, fitted = task.fit_task(params, config, tok, sentences, rs, study.log)
    tparams, train, test = fitted["params"], fitted["train"], fitted["test"]
  chunk = batching.default_chunk_size()
  with study.timed(timings, "importance"):
    imp_raw = ablation.head_importance(
      tparams, config, train, task.task_loss, normalize_layers=False
    )
    imp_norm = ablation.layer_normalized(imp_raw)  # Michel's per-layer L2 normalisation
  with study.timed(timings, "ablation"):
    ab = pruning.head_ablation_tests(
      tparams, config, test, task.task_rows, alpha=s["alpha"], chunk_size=chunk
    )
    study.log(f"single heads: {ab['significant_accuracy_drops']} significant accuracy drops")
  with study.timed(timings, "pruning"):
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
    study.log(f"pruning: iterative accuracy {np.round(pr['accuracy']['iterative'], 3).tolist()}")
  with study.timed(timings, "speed"):
    ud = conllu.read_conllu(study.ud_file(data, "dev"), max_sentences=400)
    batch = text_batches.first_fitting(
      tok, [list(x.forms) for x in ud], s["timing_batch"], s["timing_length"]
    )
    ids, attn = batch.input_ids, batch.attention_mask
    order = ablation.pruning_order(pr["masks_iterative"], imp_norm)
    sp = pruning.pruned_speedups(
      params, config, ids, attn, order, targets=PRUNE_TARGETS, repeats=s["timing_repeats"]
    )
    sp.update(batch=s["timing_batch"], length=s["timing_length"])
    study.log(
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
    "indexing": INDEXING,
  }
  figs = sixteen_heads_figures(results, args.out, study.results_stem(NAME, args.model))
  study.finish(NAME, args, results, settings, findings=findings, started=start, figures=figs)
  return 0


# The claims ---------------------------------------------------------------------------------------
# `findings(results, settings)`: the Findings rows, made from the numbers as the JSON holds
# them; `uncertainty(results, settings)`: each claim's interval and verdict.

PAPER = "Michel et al. 2019"


INDEXING = (
  "layers are numbered 1..L (blocks; 0 would be the embeddings) and heads 0..H-1; "
  "per-layer arrays hold layers 1..L in order, (L, H) arrays layer by head; "
  "task.probe_accuracy_by_layer and probe_loss_by_layer hold layers 0..L"
)


REMOVABLE = "the share of heads removable alone"
LAYERS_OK = "the share of layers where one head is enough"
KEPT = "the share of heads masked within the tolerance"
OVER_ALL = "importance's mean accuracy minus the best random order's"
OVER_MEAN = "minus their mean"
DIFF = "pruned vs masked outputs' largest difference"
AT40, AT60, FASTEST = "the speed-up with 40% removed", "with 60%", "the largest speed-up"
SINGLE = Claim(
  PAPER,
  "Most attention heads can be removed individually at test time without a "
  "statistically significant drop in performance.",
  yes=(Test(REMOVABLE, ">=", 0.75),),
  partly=(Test(REMOVABLE, ">=", 0.5),),
)
ONE_HEAD = Claim(
  PAPER,
  "In many layers a single head is enough: all heads but one can be removed with little loss.",
  yes=(Test(LAYERS_OK, ">=", 2 / 3),),
  partly=(Test(LAYERS_OK, ">=", 1 / 3),),
)
PRUNING = Claim(
  PAPER,
  "Iterative importance pruning removes 20-40% of heads with no noticeable drop (BERT: 40%).",
  yes=(Test(KEPT, ">=", 0.35),),
  partly=(Test(KEPT, ">=", 0.15),),
)
ORDER = Claim(
  PAPER,
  "Pruning by head importance degrades the model far more slowly than pruning in random order.",
  yes=(Test(OVER_ALL, ">", 0),),
  partly=(Test(OVER_MEAN, ">", 0),),
)
SPEED = Claim(
  PAPER,
  "Physically pruning heads speeds up inference (BERT, 50% of heads pruned: up to 17.5% faster).",
  yes=(Test(DIFF, "<", 1e-4), Test(AT40, ">=", 1.05), Test(AT60, ">=", 1.10)),
  partly=(Test(DIFF, "<", 1e-4), Test(FASTEST, ">=", 1.02)),
  partly_if="all",
  headline=AT40,
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
  return rows_of(study.from_json(r), s)


def rows_of(r: dict, s: dict) -> list[dict]:
  """`findings` on results already read back (`study.from_json`); the Findings' bootstrap
  intervals call it once per resample."""
  ab, pr = r["ablation"], r["pruning"]
  layer_acc = np.asarray(r["task"]["probe_accuracy_by_layer"])
  lower = int(np.argmax(layer_acc[:-1]))
  model = study.describe_model(s.get("model") or "the model", s.get("layers", len(layer_acc) - 1))
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


# How sure each row is ------------------------------------------------------------------------


def _first_left(accuracy, fractions, tolerance):
  """`max_fraction_within_tolerance` on accuracies (..., steps), the intact model first."""
  ok = accuracy >= accuracy[..., :1] - tolerance
  first_out = np.where(ok.all(-1), ok.shape[-1], np.argmin(ok, -1))
  return np.asarray(fractions)[first_out - 1]


def _area(fractions, accuracy):
  """`stats.curve_area` over the last axis."""
  x = np.asarray(fractions, np.float64)
  return ((accuracy[..., 1:] + accuracy[..., :-1]) / 2 * np.diff(x)).sum(-1) / (x[-1] - x[0])


def uncertainty(r: dict, s: dict) -> list[claims.Judgement]:
  """One judgement per row: the per-head tests the first rule applies; 95% intervals over the
  test sentences for the keep-one, pruning and order rows (each example's correctness under
  every mask, resampled together); over the interleaved timing rounds for the speed row."""
  r = study.from_json(r)
  ab, pr = r["ablation"], r["pruning"]
  n = ab["num_test"]
  single = SINGLE.tested(
    {REMOVABLE: ab["heads_removable_alone"] / np.size(ab["head_loss"])},
    f"exact McNemar per head at p < {s['alpha']} (n = {n})",
  )
  return [single, *_per_sentence(ab, pr), _speed(r, s)]


def _per_sentence(ab: dict, pr: dict) -> list[claims.Judgement]:
  """The keep-one, pruning-curve and importance-order rows over the test sentences."""
  ex, curves = ab.get("per_example"), pr.get("per_example")
  missing = "per-example correctness under each mask"
  if ex is None or curves is None:
    return [claims.rerun_needed(missing)] * 3
  tolerance, fractions = pr["tolerance"], np.asarray(pr["fractions"], float)
  base = np.asarray(ex["correct_baseline"], float)[:, None]
  keep_one = np.asarray(ex["correct_keep_one"], float)
  depth, heads, _ = keep_one.shape
  one = np.concatenate([base, keep_one.reshape(depth * heads, -1).T], 1)  # (n, 1 + L*H)

  def layers_ok(x):  # (R, n, 1 + L*H): the share of layers whose best kept head is near
    acc = x.mean(1)
    best = acc[:, 1:].reshape(len(acc), depth, heads).max(-1)
    return {LAYERS_OK: (best >= acc[:, :1] - tolerance).mean(-1)}

  c = curves["correct"]
  iterative = np.asarray(c["iterative"], float).T  # (n, steps)
  random = np.asarray(c["random"], float)  # (orders, steps, n)
  orders = np.concatenate([iterative, random.transpose(2, 0, 1).reshape(len(iterative), -1)], 1)
  steps = iterative.shape[1]

  def over_random(x):  # (R, n, steps * (1 + orders)): importance's area minus random orders'
    area = _area(fractions, x.mean(1).reshape(len(x), -1, steps))
    return {
      OVER_ALL: area[:, 0] - area[:, 1:].max(-1),
      OVER_MEAN: area[:, 0] - area[:, 1:].mean(-1),
    }

  over = f"the {len(one)} test sentences"
  return [
    ONE_HEAD.judge(one, layers_ok, over=over),
    PRUNING.judge(
      iterative,
      lambda x: {KEPT: _first_left(x.mean(1), fractions, tolerance)},
      over=over,
      shown={KEPT: "{:.0%}"},
    ),
    ORDER.judge(orders, over_random, over=over, shown={OVER_ALL: "{:+.3f}", OVER_MEAN: "{:+.3f}"}),
  ]


def _speed(r: dict, s: dict) -> claims.Judgement:
  """The speed row over the interleaved timing rounds (paired by round)."""
  sp = r["speed"]
  names = ["unpruned"] + [f"pruned_{f:.1f}" for f in sp["targets"]]  # as pruned_speedups names them
  times = np.asarray([sp["times"][k]["times_s"] for k in names], float).T  # (rounds, models)
  diff = max(sp["max_abs_diff_pruned_vs_masked"])

  def speedups(t):  # (R, rounds, models): each pruned model's median speed-up
    med = np.median(t, 1)
    up = med[:, :1] / med[:, 1:]
    return {DIFF: np.full(len(t), diff), AT40: up[:, 1], AT60: up[:, 2], FASTEST: up.max(-1)}

  over = f"the {len(times)} interleaved rounds"
  return SPEED.judge(times, speedups, over=over, shown={AT40: "{:.2f}x", AT60: "{:.2f}x"})


# The likely cause where the models' verdicts differ (or agree for different reasons), as
# the committed numbers show it: (row index, model tag) -> the sentence on the Findings page.
CAUSES = {
  (2, "all-mpnet-base-v2"): (
    "the interval, not the point: both points say yes (MiniLM 89% of heads masked within "
    "the 2-point tolerance, MPNet 58%), but MPNet's accuracy sits near the tolerance "
    "along its curve, so over the 115 test sentences its share runs from 10% to 78%"
  ),
}


if __name__ == "__main__":
  sys.exit(main())
