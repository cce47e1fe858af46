"""Are sixteen heads really better than one? Michel et al. 2019 on all-MiniLM-L6-v2.

Run:
  ./run.sh experiment sixteen_heads
  .venv/bin/python experiments/sixteen_heads.py [--smoke] [--model DIR_OR_HUB_ID]

What it measures, on the real all-MiniLM-L6-v2 (6 layers x 12 heads):

* head importance I_h = E_x |dL/dxi_h| (`ablation.head_importance`), with and without
  Michel et al.'s per-layer L2 normalisation;
* single-head ablation (`ablation.ablation_sweep`): the held-out loss and accuracy with each
  head removed alone, each layer's heads removed together, and all heads of a layer but one
  (Michel Table 2), and how many heads can go alone without a significant accuracy drop
  (exact McNemar test against the intact model, p < 0.01, as Michel's Table 1 tests);
* the pruning curve (`ablation.iterative_pruning`): accuracy against the fraction of heads
  masked, 10% at a time by re-estimated importance, against a static importance order
  (normalised and unnormalised scores) and random pruning orders;
* the measured inference speed-up of the physically pruned model (`bertjax.prune_heads`) at
  about 20/40/60% of heads removed, against the unpruned model, timed side by side in this
  process (jit, warm-up, compile time excluded and reported apart, median of interleaved
  repeats, a batch of real UD EWT dev sentences padded to one length), and the check that the
  pruned model's outputs equal the head-masked model's.

Criterion. Michel et al. score a fine-tuned classifier; all-MiniLM-L6-v2 has no task head and
nothing may be downloaded, so the task is the report's negation detection (`bertjax.tasks.negation_probe`):
a logistic-regression head on the frozen, mean-pooled final layer, fitted on a stratified
training split of the project's own 385 labelled sentences (`bertjax/resources/sentences.tsv`)
and scored on the held-out split. The head stays fixed while attention heads are removed, so
every change in loss and accuracy is the encoder's doing; importance is estimated on the
training split, every curve is scored on the held-out one. Negation is a property sentence
encoders are known to blur, and the sentence embedding is how this model is used.

`--smoke` runs a tiny random-weight model (MiniLM's tokenizer vocabulary) on 48 sentences.
"""

from __future__ import annotations

import functools
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


def _per_example_fn():
  """A jitted `(params, config, batch, hidden_in, start, head_masks (M, L, N))` -> (M, B) x 2.

  Blocks `start ..` run from `hidden_in` (the intact model's input of block `start`)
  for each mask, `lax.map`-ed; the report's (sum, count) task metrics on one-example
  slices give each example's loss and correctness.
  """
  import jax

  import bertjax
  from bertjax.tasks import negation_probe

  @functools.partial(jax.jit, static_argnums=(1, 4))
  def fn(params, config, batch, hidden_in, start, head_masks):
    def one(mask):
      last = bertjax.run_layers(
        params, config, hidden_in, batch["attention_mask"], start=start, head_mask=mask
      ).last

      def example(h, m, y):
        small = {"attention_mask": m[None], "labels": y[None]}
        return (
          negation_probe.task_loss(params, config, small, h[None], None)[0],
          negation_probe.task_accuracy(params, config, small, h[None], None)[0],
        )

      return jax.vmap(example)(last, batch["attention_mask"], batch["labels"])

    return jax.lax.map(one, head_masks)

  return fn


def per_example(params, config, batches, head_masks) -> tuple[np.ndarray, np.ndarray]:
  """Per-example task loss and correctness under each mask: two (M, n_examples) arrays.

  Like `ablation.evaluate_masks(strategy="prefix")`, the intact blocks below a mask's
  first modified block run once per batch, shared by every mask.
  """
  import bertjax
  from bertjax.analysis import batching

  fn = _per_example_fn()
  head_masks = np.asarray(head_masks, np.float32)
  # An all-ones mask still runs the last block (so no zero-length scan).
  starts = np.minimum(batching.first_modified_layer(head_masks), config.depth - 1)
  losses, correct = [], []
  for b in batches:
    hidden = bertjax.forward(
      params,
      config,
      b["input_ids"],
      b["attention_mask"],
      b["token_type_ids"],
      output_hidden_states=True,
    ).hidden_states
    loss = np.zeros((len(head_masks), b["input_ids"].shape[0]))
    acc = np.zeros_like(loss)
    for start in np.unique(starts):
      idx = np.flatnonzero(starts == start)
      lo, ac = fn(params, config, b, hidden[start], int(start), head_masks[idx])
      loss[idx], acc[idx] = np.asarray(lo, np.float64), np.asarray(ac, np.float64)
    losses.append(loss)
    correct.append(acc > 0.5)
  return np.concatenate(losses, 1), np.concatenate(correct, 1)


# Timing -------------------------------------------------------------------------------------


def pruned_vs_masked(params, config, mask, ids, attn) -> tuple[Any, Any, float]:
  """Physically prunes the zeros of `mask`; returns (config, params, max |pruned - masked|)."""
  import bertjax

  pconfig, pparams = bertjax.prune_heads(config, params, bertjax.heads_of_mask(mask))
  masked = bertjax.forward(params, config, ids, attn, head_mask=mask).last_hidden_state
  pruned = bertjax.forward(pparams, pconfig, ids, attn).last_hidden_state
  real = np.asarray(attn, bool)
  diff = float(np.abs(np.asarray(pruned) - np.asarray(masked))[real].max())
  return pconfig, pparams, diff


def time_models(
  models: dict[str, tuple[Any, Any, Any]], ids, attn, repeats: int
) -> dict[str, dict]:
  """Median forward time of each `name -> (config, params, head_mask or None)`.

  Each model is called once (its compile, unless already compiled, is in
  `first_call_s`, reported apart) and once more (warm-up); then `repeats` rounds
  time every model once, in a rotating order, so load on the shared machine falls
  on all of them alike.
  """
  import bertjax

  fns, out = {}, {}
  for name, (config, params, hm) in models.items():
    # `bertjax.forward` is jitted inside (config static), so a model checked against
    # its masked twin is already compiled here; its first call then reports no compile.
    def fn(p, i, m, c=config, hm=hm):
      return bertjax.forward(p, c, i, m, head_mask=hm).last_hidden_state

    t0 = time.perf_counter()
    fn(params, ids, attn).block_until_ready()
    first = time.perf_counter() - t0
    fn(params, ids, attn).block_until_ready()  # warm-up
    fns[name] = fn
    out[name] = {"first_call_s": first, "times_s": []}
  names = list(models)
  for r in range(repeats):
    for name in names[r % len(names) :] + names[: r % len(names)]:  # rotate the order
      t0 = time.perf_counter()
      fns[name](models[name][1], ids, attn).block_until_ready()
      out[name]["times_s"].append(time.perf_counter() - t0)
  for v in out.values():
    v["median_s"] = float(np.median(v["times_s"]))
  return out


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


# Figures ------------------------------------------------------------------------------------


def figures(r: dict, out, depth: int, stem: str = NAME) -> list[str]:
  """Importance and ablation heatmaps, the pruning curves and the speed-up bars (`stem`: the
  file names' start, `common.results_stem`)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  from bertjax.plots import charts

  names = []
  fig, axes = plt.subplots(1, 3, figsize=(17, 4), layout="constrained")  # no label overlaps
  a = r["ablation"]
  importance, change = r["importance"], np.asarray(a["head_accuracy"]) - a["baseline_accuracy"]
  for ax, values, title in (
    (axes[0], importance["normalized"], "Head importance (per-layer L2 normalised)"),
    (axes[1], importance["raw"], "Head importance (raw E|dL/dxi|)"),
  ):
    charts.draw_head_grid(ax, values, title=title, cbar_label="importance")
  charts.draw_head_grid(
    axes[2],
    change,
    title="Held-out accuracy change, one head removed",
    cbar_label="accuracy - baseline",
    cmap="RdBu",
    center=0.0,
    span=max(float(np.nanmax(np.abs(change))), 0.01),  # an all-zero grid stays readable
  )
  names.append(common.savefig(fig, out, f"{stem}_heads"))

  c = r["pruning"]
  fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
  x = c["fractions"]
  for ax, key, label in (
    (axes[0], "accuracy", "held-out accuracy (negation)"),
    (axes[1], "loss", "held-out cross-entropy (negation)"),
  ):
    v = c[key]
    ax.plot(x, v["iterative"], "o-", label="importance, re-estimated (Michel)")
    ax.plot(x, v["static_normalized"], "s--", label="importance, static, normalised")
    ax.plot(x, v["static_raw"], "^--", label="importance, static, raw")
    rnd = np.asarray(v["random"])
    ax.plot(x, rnd.mean(0), "k-", label=f"random order (mean of {len(rnd)})")
    ax.fill_between(x, rnd.min(0), rnd.max(0), color="k", alpha=0.15, label="random (min-max)")
    ax.set_xlabel("fraction of heads masked")
    ax.set_ylabel(label)
  axes[0].axhline(c["majority_accuracy"], color="gray", ls=":", label="majority class")
  axes[0].set_title("Pruning curve: accuracy")
  axes[1].set_title("Pruning curve: loss (lower is better)")
  axes[0].legend(fontsize=8)
  names.append(common.savefig(fig, out, f"{stem}_pruning"))

  s = r["speed"]
  fig, ax = plt.subplots(figsize=(6.5, 4))
  labels = ["unpruned", "masked 40%"] + [f"pruned {f:.0%}" for f in s["fractions"]]
  values = [1.0, s["speedup_masked"]] + list(s["speedup"])
  ax.bar(
    labels,
    values,
    color=["gray", "lightgray"] + ["tab:blue"] * len(s["fractions"]),
    label="median of repeats",
  )
  ax.plot(
    labels,
    [1.0, s["speedup_masked_fastest"]] + list(s["speedup_fastest"]),
    "kD",
    label="fastest of repeats",
  )
  ax.legend(fontsize=8, loc="lower right")
  ax.axhline(1.0, color="k", lw=0.8)
  for i, v in enumerate(values):
    ax.text(i, v, f"{v:.2f}x", ha="center", va="bottom", fontsize=8)
  ax.set_ylabel("speed-up over the unpruned model")
  ax.set_xlabel("model (heads physically removed)")
  ax.set_title(f"Inference speed-up, batch {s['batch']} x {s['length']} tokens, {s['backend']}")
  names.append(common.savefig(fig, out, f"{stem}_speedup"))

  fig, ax = plt.subplots(figsize=(6.5, 4))
  layers = np.arange(1, depth + 1)  # blocks 1..L
  ax.plot(layers, a["layer_heads_accuracy"], "o-", label="all heads of the layer removed")
  ax.plot(layers, np.max(a["keep_one_accuracy"], 1), "s-", label="all but the best head removed")
  ax.axhline(a["baseline_accuracy"], color="k", ls="--", label="intact model")
  ax.set_xlabel("layer")
  ax.set_xticks(layers)
  ax.set_ylabel("held-out accuracy")
  ax.set_title("Whole-layer ablation and 'one head is enough' (Michel Table 2)")
  ax.legend(fontsize=8)
  names.append(common.savefig(fig, out, f"{stem}_layers"))
  return names


# The run ------------------------------------------------------------------------------------


def load(args, s: dict[str, Any], timings: dict[str, float]):
  """The model (`s["model"]` becomes its name) and the negation task's labelled sentences
  (a seeded sample of `s["max_sentences"]` when set).

  Returns:
    `(config, params, tok, sentences)`.
  """
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
      rng = np.random.default_rng(args.seed)
      sentences = [
        sentences[i] for i in np.sort(rng.choice(len(sentences), s["max_sentences"], replace=False))
      ]
  return config, params, tok, sentences


def importance(tparams, config, train, timings: dict[str, float]) -> tuple[np.ndarray, np.ndarray]:
  """`(raw, normalized)` head importance E|dL/dxi| on the training split, (layers, heads)."""
  from bertjax.analysis.interventions import ablation
  from bertjax.tasks import negation_probe

  with common.timed(timings, "importance"):
    imp_raw = ablation.head_importance(
      tparams, config, train, negation_probe.task_loss, normalize_layers=False
    )
    # Michel's per-layer L2 normalisation, as `head_importance(normalize_layers=True)`
    # computes it (applied here to save a second pass over the data).
    imp_norm = imp_raw / (np.sqrt((imp_raw**2).sum(-1, keepdims=True)) + 1e-20)
  return imp_raw, imp_norm


def ablate_heads(
  tparams, config, test, alpha: float, chunk: int, timings: dict[str, float]
) -> dict[str, Any]:
  """Held-out loss and accuracy with each head, each layer's heads and all heads of a layer
  but one removed, with paired significance tests of every single head (Michel Table 1).

  Returns:
    The result file's `ablation` entry.
  """
  from bertjax.analysis.interventions import ablation
  from bertjax.tasks import negation_probe

  depth, n_heads = config.depth, config.num_attention_heads
  total_heads = depth * n_heads
  with common.timed(timings, "ablation"):
    # The library sweep (single heads, held-out loss) ...
    loss_heads = ablation.ablation_sweep(
      tparams,
      config,
      test,
      negation_probe.task_loss,
      head_ablations=("scale",),
      include=("heads",),
      chunk_size=chunk,
      strategy="prefix",
    )["scale"]
    # ... and per-example values under every sweep mask, for the significance tests
    # (Michel Table 1: p < 0.01) and the accuracies; both metrics come from one pass.
    sweep = ablation.sweep_masks(config, ("heads", "layers", "keep_one"))
    masks = np.concatenate(
      [
        np.ones((1, depth, n_heads), np.float32),
        sweep["heads"][0],
        sweep["layers"][0],
        sweep["keep_one"][0],
      ]
    )
    ex_loss, ex_correct = per_example(tparams, config, test, masks)
    mean_loss, mean_acc = ex_loss.mean(1), ex_correct.mean(1)
    cut = np.cumsum([1, total_heads, depth])
    base_loss, base_acc0 = float(mean_loss[0]), float(mean_acc[0])
    head_loss, head_acc = mean_loss[1 : cut[1]], mean_acc[1 : cut[1]]
    p_acc = np.array([stats.mcnemar_p(ex_correct[0], ex_correct[i]) for i in range(1, cut[1])])
    p_loss = np.array([stats.wilcoxon_p(ex_loss[0], ex_loss[i]) for i in range(1, cut[1])])
    drop_sig = (p_acc < alpha) & (head_acc < base_acc0)
    loss_sig = (p_loss < alpha) & (head_loss > base_loss)
    # The per-example pass and the library sweep must agree (two code paths, one quantity).
    consistency = float(
      max(abs(loss_heads.baseline - base_loss), np.abs(loss_heads.heads.ravel() - head_loss).max())
    )
    common.log(
      f"single heads: {int(drop_sig.sum())} of {total_heads} significant accuracy "
      f"drops, {int(loss_sig.sum())} significant loss rises; sweep vs per-example "
      f"{consistency:.1e}"
    )
  return {
    "baseline_loss": base_loss,
    "baseline_accuracy": base_acc0,
    "head_loss": head_loss.reshape(depth, n_heads),
    "head_accuracy": head_acc.reshape(depth, n_heads),
    "head_loss_ablation_sweep": loss_heads.heads,
    "layer_heads_loss": mean_loss[cut[1] : cut[2]],
    "layer_heads_accuracy": mean_acc[cut[1] : cut[2]],
    "keep_one_loss": mean_loss[cut[2] :].reshape(depth, n_heads),
    "keep_one_accuracy": mean_acc[cut[2] :].reshape(depth, n_heads),
    "head_accuracy_p_mcnemar": p_acc.reshape(depth, n_heads),
    "head_loss_p_wilcoxon": p_loss.reshape(depth, n_heads),
    "significant_accuracy_drops": int(drop_sig.sum()),
    "significant_loss_rises": int(loss_sig.sum()),
    "heads_removable_alone": int(total_heads - drop_sig.sum()),
    "heads_improving_accuracy": int((head_acc > base_acc0).sum()),
    "max_single_head_accuracy_drop": float(base_acc0 - head_acc.min()),
    "sweep_vs_per_example_max_diff": consistency,
    "num_test": int(ex_correct.shape[1]),
  }


def pruning_curves(
  tparams,
  config,
  train,
  test,
  imp_raw: np.ndarray,
  imp_norm: np.ndarray,
  majority: float,
  s: dict[str, Any],
  chunk: int,
  timings: dict[str, float],
) -> dict[str, Any]:
  """Held-out accuracy and loss against the fraction of heads masked: iterative importance
  pruning (Michel), static importance orders and random orders (`majority`: the majority
  class's accuracy, drawn beside them).

  Returns:
    The result file's `pruning` entry.
  """
  from bertjax.analysis.interventions import ablation
  from bertjax.tasks import negation_probe

  depth, n_heads = config.depth, config.num_attention_heads
  total_heads = depth * n_heads
  with common.timed(timings, "pruning"):
    pruning = ablation.iterative_pruning(
      tparams,
      config,
      train,
      negation_probe.task_loss,
      step=s["prune_step"],
      max_fraction=s["prune_max"],
      chunk_size=chunk,
    )
    counts = np.rint(pruning.fractions * total_heads).astype(int)
    rng = np.random.default_rng(s["seed"] + 1)
    curves = {
      "iterative": pruning.masks,
      "static_normalized": ablation.order_masks(
        np.argsort(imp_norm.ravel(), kind="stable"), counts, (depth, n_heads)
      ),
      "static_raw": ablation.order_masks(
        np.argsort(imp_raw.ravel(), kind="stable"), counts, (depth, n_heads)
      ),
    }
    randoms = [
      ablation.order_masks(rng.permutation(total_heads), counts, (depth, n_heads))
      for _ in range(s["random_orders"])
    ]
    all_masks = np.concatenate([*curves.values(), *randoms])
    pr_loss, pr_correct = per_example(tparams, config, test, all_masks)
    pr_loss, pr_acc = pr_loss.mean(1), pr_correct.mean(1)
    k = len(counts)
    split = lambda v: (
      {name: v[i * k : (i + 1) * k] for i, name in enumerate(curves)},
      v[len(curves) * k :].reshape(-1, k),
    )
    (pa, ra), (pl, rl) = split(pr_acc), split(pr_loss)
    pa["random"], pl["random"] = ra, rl
    base_acc = float(pa["iterative"][0])
    tolerance = 0.02
    ok = pa["iterative"] >= base_acc - tolerance
    # The largest fraction reached with every step so far within the tolerance.
    keep_frac = float(pruning.fractions[-1] if ok.all() else pruning.fractions[np.argmin(ok) - 1])
    area = {
      name: stats.curve_area(pruning.fractions, v) for name, v in pa.items() if name != "random"
    }
    area_random = [stats.curve_area(pruning.fractions, v) for v in ra]
    common.log(
      f"pruning: iterative accuracy {np.round(pa['iterative'], 3).tolist()}; "
      f"random mean {np.round(ra.mean(0), 3).tolist()}"
    )
  return {
    "fractions": pruning.fractions,
    "heads_masked": counts,
    "train_loss_iterative": pruning.metrics,
    "accuracy": pa,
    "loss": pl,
    "masks_iterative": pruning.masks,
    "majority_accuracy": majority,
    "tolerance": tolerance,
    "max_fraction_within_tolerance": keep_frac,
    "mean_accuracy_over_curve": area,
    "mean_accuracy_over_curve_random": area_random,
  }


def speed(
  params,
  config,
  tok,
  data,
  masks_iterative,
  imp_norm: np.ndarray,
  s: dict[str, Any],
  timings: dict[str, float],
) -> dict[str, Any]:
  """The inference speed-up of physically pruned models (`PRUNE_TARGETS`, in the iterative
  pruning order) and of a head-masked one, on a batch of UD EWT dev sentences.

  Returns:
    The result file's `speed` entry.
  """
  import jax

  import bertjax
  from bertjax.analysis.interventions import ablation
  from bertjax.data import conllu

  depth, n_heads = config.depth, config.num_attention_heads
  total_heads = depth * n_heads
  with common.timed(timings, "speed"):
    ud = conllu.read_conllu(common.ud_file(data, "dev"), max_sentences=400)
    words = [list(x.forms) for x in ud]
    lengths = tok.encode_words(words).attention_mask.sum(-1)
    fit = [w for w, n in zip(words, lengths) if n <= s["timing_length"]]
    if len(fit) < s["timing_batch"]:
      raise ValueError(
        f"only {len(fit)} UD sentences fit timing_length={s['timing_length']}; "
        f"need timing_batch={s['timing_batch']}"
      )
    b = tok.encode_words(fit[: s["timing_batch"]], pad_to=s["timing_length"])
    ids, attn = b.input_ids, b.attention_mask
    order = ablation.pruning_order(masks_iterative, imp_norm)
    fractions, diffs, n_pruned = [], [], []
    models = {"unpruned": (config, params, None)}
    for target in PRUNE_TARGETS:
      kcount = round(target * total_heads)
      mask = ablation.order_masks(order, [kcount], (depth, n_heads))[0]
      pconfig, pparams, diff = pruned_vs_masked(params, config, mask, ids, attn)
      models[f"pruned_{target:.1f}"] = (pconfig, pparams, None)
      fractions.append(kcount / total_heads)
      n_pruned.append(kcount)
      diffs.append(diff)
    # The masked model computes every head (then scales some by 0): no faster than intact.
    mask40 = ablation.order_masks(order, [round(0.4 * total_heads)], (depth, n_heads))[0]
    models["masked_0.4"] = (config, params, mask40)
    times = time_models(models, ids, attn, s["timing_repeats"])
    base_t = times["unpruned"]["median_s"]
    speedup = [base_t / times[f"pruned_{t:.1f}"]["median_s"] for t in PRUNE_TARGETS]
    # Fastest-of-repeats ratios too: on a shared machine the minimum is the least disturbed.
    fastest = {name: min(v["times_s"]) for name, v in times.items()}
    speedup_min = [fastest["unpruned"] / fastest[f"pruned_{t:.1f}"] for t in PRUNE_TARGETS]
    common.log(
      f"speed-up at {np.round(fractions, 3).tolist()} pruned: "
      f"{np.round(speedup, 3).tolist()}; max |pruned - masked| {max(diffs):.1e}"
    )
    nparams = {name: int(bertjax.count_params(p)) for name, (_, p, _) in models.items()}
  return {
    "fractions": fractions,
    "heads_removed": n_pruned,
    "targets": PRUNE_TARGETS,
    "batch": s["timing_batch"],
    "length": s["timing_length"],
    "repeats": s["timing_repeats"],
    "backend": jax.default_backend(),
    "times": times,
    "speedup": speedup,
    "speedup_fastest": speedup_min,
    "speedup_masked_fastest": fastest["unpruned"] / fastest["masked_0.4"],
    "speedup_masked": base_t / times["masked_0.4"]["median_s"],
    "max_abs_diff_pruned_vs_masked": diffs,
    "parameters": nparams,
    "real_tokens": int(attn.sum()),
  }


def main(argv=None) -> int:
  args = common.parser(__doc__).parse_args(argv)
  start = time.perf_counter()
  from bertjax import stats
  from bertjax.analysis import batching
  from bertjax.tasks import negation_probe

  data = common.data_dir(args.data_dir, "ud_english_ewt")
  s = run_settings(args.smoke, args.seed)
  timings: dict[str, float] = {}
  config, params, tok, sentences = load(args, s, timings)
  depth, n_heads = config.depth, config.num_attention_heads

  with common.timed(timings, "task"):
    rs = negation_probe.TaskSettings(
      batch_size=s["batch_size"], probe_steps=s["probe_steps"], seed=args.seed
    )
    task_results, task = negation_probe.fit_task(params, config, tok, sentences, rs, common.log)
    tparams, train, test = task["params"], task["train"], task["test"]

  chunk = batching.default_chunk_size()
  imp_raw, imp_norm = importance(tparams, config, train, timings)
  ab = ablate_heads(tparams, config, test, s["alpha"], chunk, timings)
  pr = pruning_curves(
    tparams,
    config,
    train,
    test,
    imp_raw,
    imp_norm,
    task_results["majority_accuracy"],
    s,
    chunk,
    timings,
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
    "speed": speed(params, config, tok, data, pr["masks_iterative"], imp_norm, s, timings),
  }

  findings_ = findings(common.to_json(results), {**s, "layers": depth})
  seconds = time.perf_counter() - start
  results["timings_s"] = timings
  figs = figures(results, args.out, depth, common.results_stem(NAME, args.model))
  common.write_results(
    NAME,
    args.out,
    results,
    findings=findings_,
    settings={
      **s,
      "data": "bertjax/resources/sentences.tsv (negation task); UD EWT dev (timing batch)",
      "criterion": task_results["why"],
      "layers": depth,
      "heads": n_heads,
      "chunk_size": chunk,
      "ablation_strategy": "prefix",
      "indexing": INDEXING,
    },
    smoke=args.smoke,
    seconds=seconds,
    figures=figs,
    model=args.model,
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
