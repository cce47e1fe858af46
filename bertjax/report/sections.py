"""The report's analyses, one function per section: each runs `bertjax.analysis` on the
model and returns the section's part of `report.json`.

Sections 1-2 (`clark_section`, `pattern_section`) and 6 (`anisotropy_section`) read the
text's batches; 4-5 (`ablation_section`) and 9 (`attribution_section`) score the
negation task of `bertjax.report.task`; 7 (`pos_section`) reads UD English EWT and 8
(`effective_section`) passages of consecutive sentences (`join_passages`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np

import bertjax
from bertjax.analysis import ablation, attention, geometry
from bertjax.report import inputs, reading
from bertjax.report.sentences import Sentence
from bertjax.report.settings import ReportSettings
from bertjax.report.task import PROBE_KEY, task_accuracy, task_loss


def clark_section(params, config, tok, batches) -> dict:
  """Clark et al.'s attention mass on [CLS], [SEP], punctuation; entropy per head.

  On the definitions of Clark's released notebook: per-document averages, "." and
  "," as punctuation, smoothed entropy (`attention.clark_statistics`' defaults).
  """
  statistics = attention.clark_statistics(
      params, config, [inputs.plain(b) for _, b in batches], sep_id=tok.sep_id,
      punct_ids=attention.clark_punctuation_ids(tok))
  out = {name: np.asarray(v) for name, v in statistics.items()}
  out["by_layer"] = {name: v.mean(-1) for name, v in out.items()}
  return out


def _example_maps(params, config, tok, batch, special_ids):
  """For each pattern type found in one batch, its most typical (layer, sequence, head) map."""
  maps = np.asarray(bertjax.forward(params, config, batch["input_ids"], batch["attention_mask"],
                                    batch["token_type_ids"], output_attentions=True).attentions)
  special = np.isin(batch["input_ids"], special_ids)
  feats = attention.pattern_features(maps, special, batch["attention_mask"],
                                     batch["token_type_ids"])
  codes = attention.classify_patterns(feats)  # (L, B, N)
  # The most typical example of each type: the one with the strongest feature of its kind.
  v, d = feats["vertical"], feats["diagonal"]
  scores = {"vertical": v, "diagonal": d, "vertical+diagonal": v + d,
            "block": np.nan_to_num(feats["block"], nan=-1.0), "heterogeneous": -(v + d)}
  examples = {}
  for code, name in enumerate(attention.PATTERN_TYPES):
    found = np.argwhere(codes == code)
    if len(found):
      best = found[np.argmax([scores[name][tuple(f)] for f in found])]
      l, b, h = (int(x) for x in best)
      n = int(batch["attention_mask"][b].sum())
      examples[name] = {"layer": l + 1, "sequence": b, "head": h, "map": maps[l, b, h, :n, :n],
                        "tokens": tok.convert_ids_to_tokens(batch["input_ids"][b, :n])}
  return examples


def pattern_section(params, config, tok, pair_batches) -> dict:
  """Kovaleva et al.'s pattern types of every head on sentence pairs."""
  special_ids = [tok.cls_id, tok.sep_id]
  counts = attention.pattern_types(params, config, [inputs.plain(b) for _, b in pair_batches],
                                   special_ids=special_ids)
  examples = _example_maps(params, config, tok, pair_batches[len(pair_batches) // 2][1],
                           special_ids)
  return {"counts": counts.counts, "per_layer": counts.per_layer, "overall": counts.overall,
          "dominant": counts.dominant, "examples": examples}


def ablation_section(task: dict, config, settings: ReportSettings, log) -> dict:
  """Head and layer ablation, head importance and the pruning curve on the task."""
  params, train, test = task["params"], task["train"], task["test"]
  chunk = settings.ablation_chunk_size or ablation.default_chunk_size()
  # Every single head, every layer's heads together, every block skipped: the
  # held-out loss under each mask. "prefix" runs the intact blocks below a mask's
  # first change once; "vmap" compiles fewer programs (better for tiny runs).
  loss = ablation.ablation_sweep(params, config, test, task_loss, head_ablations=("scale",),
                                 include=("heads", "layers", "layer_skip"), chunk_size=chunk,
                                 strategy=settings.ablation_strategy)["scale"]
  # Accuracy of the layer masks only: per head it moves in steps of 1 / n_test.
  layer_masks = ablation.sweep_masks(config, ("layers", "layer_skip"))
  head_masks = np.concatenate([layer_masks["layers"][0], layer_masks["layer_skip"][0]])
  base_acc, layer_acc = ablation.evaluate_masks(
      params, config, test, task_accuracy, head_masks,
      np.concatenate([layer_masks["layers"][1], layer_masks["layer_skip"][1]]), strategy="vmap",
      chunk_size=chunk)
  log(f"ablation: baseline loss {loss.baseline:.4f}, accuracy {base_acc:.4f}")
  importance = ablation.head_importance(params, config, train, task_loss)
  # Michel et al.: mask the least important heads step by step, re-estimating
  # importance (on the training split) each time; score each mask on held-out data.
  pruning = ablation.iterative_pruning(params, config, train, task_loss, step=settings.prune_step,
                                       max_fraction=settings.prune_max, chunk_size=chunk)
  evaluate = lambda fn: ablation.evaluate_masks(params, config, test, fn, pruning.masks,
                                                strategy=settings.ablation_strategy,
                                                chunk_size=chunk)[1]
  prune_acc, prune_loss = evaluate(task_accuracy), evaluate(task_loss)
  log(f"pruning: {len(pruning.fractions) - 1} steps, held-out accuracy "
      f"{np.round(prune_acc, 3).tolist()}")
  return {
      "baseline_loss": loss.baseline, "baseline_accuracy": base_acc,
      "head_loss": loss.heads,
      "layer_heads_loss": loss.layers, "layer_heads_accuracy": layer_acc[:config.depth],
      "layer_skip_loss": loss.layer_skip, "layer_skip_accuracy": layer_acc[config.depth:],
      "importance": importance,
      "importance_vs_ablation": reading.importance_vs_ablation(
          {"importance": importance, "head_loss": loss.heads, "baseline_loss": loss.baseline}),
      "pruning_fraction": pruning.fractions, "pruning_accuracy": prune_acc,
      "pruning_loss": prune_loss, "pruning_masks": pruning.masks,
  }


def _token_states(params, config, batches, special_ids) -> np.ndarray:
  """Hidden states of every real, non-special token: (layers + 1, n_tokens, H)."""
  parts = []
  for _, batch in batches:
    o = bertjax.forward(params, config, batch["input_ids"], batch["attention_mask"],
                        batch["token_type_ids"], output_hidden_states=True)
    keep = np.asarray(batch["attention_mask"], bool) & ~np.isin(batch["input_ids"], special_ids)
    parts.append(np.asarray(o.hidden_states)[:, keep])
  return np.concatenate(parts, 1)


def anisotropy_section(params, config, tok, batches, settings: ReportSettings) -> dict:
  """Ethayarajh's anisotropy: mean cosine of random token pairs, per layer."""
  reps = _token_states(params, config, batches, [tok.cls_id, tok.sep_id, tok.pad_id])
  return {"num_tokens": int(reps.shape[1]),
          "anisotropy": geometry.anisotropy(reps, settings.anisotropy_pairs, settings.seed),
          "anisotropy_centered": geometry.anisotropy(reps, settings.anisotropy_pairs,
                                                     settings.seed, centered=True)}


def pos_section(params, config, tok, ud_files, settings: ReportSettings, progress: bool) -> dict:
  """A linear UPOS probe on every layer, with its control task (`probing_run`)."""
  from bertjax.analysis import probing_run
  from bertjax.data import conllu

  sentences = []
  for path in ud_files:
    sentences += conllu.read_conllu(path, max_sentences=settings.pos_sentences - len(sentences))
    if len(sentences) >= settings.pos_sentences:
      break
  # Sentences the model cannot read whole (its usable length) are left out, not cut.
  max_len = min(config.max_length, tok.model_max_length)
  sentences = [s for s in sentences
               if len(tok.encode_words([s.forms], truncation=False, max_length=10**6)
                      .input_ids[0]) <= max_len]
  suite = probing_run.SuiteConfig(
      tasks=("upos",), structural=False, seed=settings.seed,
      probe=dataclasses.replace(probing_run.SuiteConfig().probe,
                                max_steps=settings.pos_probe_steps))
  out = probing_run.run_probing_suite(params, config, tok, sentences, suite=suite,
                                      progress=progress)
  upos = out["upos"]
  return {"files": [p.name for p in ud_files], "num_sentences": len(sentences),
          "num_train_words": upos["train_size"], "num_test_words": upos["test_size"],
          "num_tags": upos["num_classes"], "accuracy": np.asarray(upos["accuracy"]),
          "control_accuracy": np.asarray(upos["control_accuracy"]),
          "selectivity": np.asarray(upos["selectivity"]), "best_layer": upos["best_layer"]}


def join_passages(sentences: Sequence[str], tok, target: int, count: int) -> list[str]:
  """Consecutive sentences joined into passages of about `target` tokens."""
  lengths = tok.encode(list(sentences)).attention_mask.sum(-1) - 2
  out, current, size = [], [], 2
  for text, n in zip(sentences, lengths):
    current.append(text)
    size += int(n)
    if size >= target:
      out.append(" ".join(current))
      current, size = [], 2
      if len(out) == count:
        break
  if current and len(out) < count:
    out.append(" ".join(current))
  return out


def effective_section(params, config, tok, passages: Sequence[str],
                      settings: ReportSettings) -> dict:
  """Brunner et al.'s effective attention: statistics over passages, maps of a few heads.

  Passages longer than the model reads (`config.max_length`, which for RoBERTa-style
  positions is less than `max_position_embeddings`, or the tokenizer's limit) are cut there.
  """
  batches = inputs.batches(tok, list(passages), batch_size=8, truncation=True,
                           max_length=min(config.max_length, tok.model_max_length))
  statistics = attention.effective_attention_statistics(
      params, config, [inputs.plain(b) for _, b in batches], cls_id=tok.cls_id, sep_id=tok.sep_id)
  # The heads whose raw attention (on these passages) sits most on [CLS] + [SEP]: where
  # Brunner et al. found raw and effective attention to differ most.
  score = (statistics["raw"]["cls"] + statistics["raw"]["sep"]).ravel()
  heads = [divmod(int(i), config.num_attention_heads)
           for i in np.argsort(-score)[:settings.example_heads]]
  idx, batch = batches[0]
  o = bertjax.forward(params, config, batch["input_ids"][:1], batch["attention_mask"][:1],
                      batch["token_type_ids"][:1], output_attentions=True, capture=("v",))
  n = int(batch["attention_mask"][0].sum())
  maps, values = np.asarray(o.attentions), np.asarray(o.cache["v"])
  examples = []
  for layer, head in heads:
    t = attention.head_value_outputs(params, config, layer, values[layer, 0, :n])
    raw = maps[layer, 0, :, :n, :n]
    eff = attention.effective_attention(raw, t)
    examples.append({"layer": layer + 1, "head": head, "raw": raw[head],
                     "effective": eff[head]})
  lengths = np.concatenate([b["attention_mask"].sum(-1) for _, b in batches])
  return {"num_passages": len(passages), "mean_passage_tokens": float(np.mean(lengths)),
          "head_dim": config.head_dim, "stats": statistics, "examples": examples,
          "example_tokens": tok.convert_ids_to_tokens(batch["input_ids"][0, :n]),
          "example_text": passages[int(idx[0])]}


def attribution_section(params, config, tok, sentences: Sequence[Sentence], task: dict,
                        settings: ReportSettings) -> dict:
  """Which attribution method ranks the negation cue first; which heads carry negation.

  The explained quantity is the scoring task's probe (section 3) on the final layer;
  see `bertjax.analysis.negation`. Attention flow is left out (max-flow per sentence is
  slow); `experiments/attribution.py` includes it.
  """
  from bertjax.analysis import negation

  p = jax.tree.map(lambda a: np.asarray(a, np.float64), task["params"][PROBE_KEY])
  probe = (p["w"] / p["scale"][:, None], p["b"] - (p["mean"] / p["scale"]) @ p["w"])
  negated = [s.text for s in sentences if s.negated]
  methods = tuple(m for m in negation.METHODS if m != "flow")
  try:
    negation.pairs(tok, negated[:settings.patching_pairs])
  except ValueError as e:  # a vocabulary without the cues or their twins as single tokens
    return {"available": False, "reason": str(e)}
  cues = negation.cue_statistics(params, config, tok, negated, probe, methods=methods,
                                 ig_steps=settings.attribution_ig_steps,
                                 batch_size=min(settings.batch_size, 16),
                                 max_sentences=settings.attribution_sentences)
  patch = negation.head_patching(params, config, tok, negated[:settings.patching_pairs], probe)
  return {"available": True, "cues": cues, "patching": patch}
