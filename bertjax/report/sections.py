"""The report's analyses, one function per section: each runs `bertjax.analysis` on the
model and returns the section's part of `report.json`.

Sections 1-2 (`clark_section`, `pattern_section`) and 6 (`anisotropy_section`) read the
text's batches; 4-5 (`ablation_section`) and 9 (`attribution_section`) score the
negation task of `bertjax.tasks.negation_probe`, as does 10 (`circuit_section`); 7 (`pos_section`)
reads UD English EWT and 8 (`effective_section`) passages of consecutive sentences
(`bertjax.tasks.passages.joined`). Sections 11 (`outlier_section`) and 12 (`sae_section`) read the text's
batches; so does section 13 (`disentangled_section`, DeBERTa only), which compares its heads
with sections 1 and 2.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np

import bertjax
from bertjax import stats
from bertjax.analysis.attention import disentangled
from bertjax.analysis.attention import effective as effective_attention_lib
from bertjax.analysis.attention import patterns as attention_patterns
from bertjax.analysis.attention import statistics as attention_statistics
from bertjax.analysis.batching import default_chunk_size, model_token_types
from bertjax.analysis.interventions import ablation
from bertjax.analysis.representations import geometry, outliers
from bertjax.report import reading
from bertjax.report.settings import ReportSettings
from bertjax.tasks import text_batches
from bertjax.tasks.negation_probe import PROBE_KEY, task_loss, task_rows
from bertjax.tasks.sentences import Sentence


def clark_section(params, config, tok, batches) -> dict:
  """Clark et al.'s attention mass on [CLS], [SEP], punctuation; entropy per head.

  On the definitions of Clark's released notebook: per-document averages, "." and
  "," as punctuation, smoothed entropy (`attention_statistics.clark_statistics`' defaults). Each
  sentence is one call, so its own values are kept (`per_sentence`, averaged over heads: the
  items the reading's confidence intervals resample); their mean is the document-weighted
  statistic.
  """
  punct = attention_statistics.clark_punctuation_ids(tok)
  per = []
  for _, batch in batches:
    b = text_batches.plain(batch)
    for i in range(len(b["input_ids"])):
      per.append(
        attention_statistics.clark_statistics(
          params,
          config,
          [{k: v[i : i + 1] for k, v in b.items()}],
          sep_id=tok.sep_id,
          punct_ids=punct,
        )
      )
  out = {name: np.mean([p[name] for p in per], 0) for name in per[0]}
  out["by_layer"] = {name: v.mean(-1) for name, v in out.items()}
  out["per_sentence"] = {
    name: np.stack([p[name].mean(-1) for p in per])  # (sentences, layers)
    for name in ("cls", "sep", "punct", "entropy")
  }
  return out


def _pattern_codes(params, config, batch, special_ids):
  """The attention maps (L, B, N, T, T), `pattern_features` and type codes (L, B, N) of a batch."""
  maps = np.asarray(
    bertjax.forward(
      params,
      config,
      batch["input_ids"],
      batch["attention_mask"],
      model_token_types(config, batch["token_type_ids"]),
      output_attentions=True,
    ).attentions
  )
  special = np.isin(batch["input_ids"], special_ids)
  feats = attention_patterns.pattern_features(
    maps, special, batch["attention_mask"], batch["token_type_ids"]
  )
  return maps, feats, attention_patterns.classify_patterns(feats)


def _example_maps(tok, batch, maps, feats, codes):
  """For each pattern type found in one batch, its most typical (layer, sequence, head) map."""
  # The most typical example of each type: the one with the strongest feature of its kind.
  v, d = feats["vertical"], feats["diagonal"]
  scores = {
    "vertical": v,
    "diagonal": d,
    "vertical+diagonal": v + d,
    "block": np.nan_to_num(feats["block"], nan=-1.0),
    "heterogeneous": -(v + d),
  }
  examples = {}
  for code, name in enumerate(attention_patterns.PATTERN_TYPES):
    found = np.argwhere(codes == code)
    if len(found):
      best = found[np.argmax([scores[name][tuple(f)] for f in found])]
      l, b, h = (int(x) for x in best)
      n = int(batch["attention_mask"][b].sum())
      examples[name] = {
        "layer": l + 1,
        "sequence": b,
        "head": h,
        "map": maps[l, b, h, :n, :n],
        "tokens": tok.convert_ids_to_tokens(batch["input_ids"][b, :n]),
      }
  return examples


def pattern_section(params, config, tok, pair_batches) -> dict:
  """Kovaleva et al.'s pattern types of every head on sentence pairs.

  The counts are `attention_patterns.pattern_types`' (the same maps, features and decision list),
  kept per input as well (`per_input`: each input's share of maps of each type, the items the
  reading's confidence interval resamples); the examples come from the middle batch.
  """
  special_ids = [tok.cls_id, tok.sep_id]
  types = len(attention_patterns.PATTERN_TYPES)
  counts = np.zeros((config.depth, config.num_attention_heads, types), np.int64)
  shares, examples = [], {}
  for k, (_, batch) in enumerate(pair_batches):
    batch = text_batches.plain(batch)
    maps, feats, codes = _pattern_codes(params, config, batch, special_ids)
    one_hot = codes[..., None] == np.arange(types)  # (L, B, N, types)
    counts += one_hot.sum(1)
    shares.append(one_hot.mean((0, 2)))  # (B, types)
    if k == len(pair_batches) // 2:
      examples = _example_maps(tok, batch, maps, feats, codes)
  found = attention_patterns.PatternCounts(counts)
  return {
    "counts": found.counts,
    "per_layer": found.per_layer,
    "overall": found.overall,
    "dominant": found.dominant,
    "examples": examples,
    "per_input": np.concatenate(shares),
  }


def ablation_section(task: dict, config, settings: ReportSettings, log) -> dict:
  """Head and layer ablation, head importance and the pruning curve on the task.

  Every mask (each head, each layer's heads, each block skipped, each pruning step) is scored
  on the held-out sentences in one `ablation.evaluate_masks_per_row` pass ("prefix" runs the
  intact blocks below a mask's first change once; "vmap" compiles fewer programs, better for
  tiny runs), which keeps each sentence's cross-entropy and correctness: the numbers shown
  are their means, and `per_example` keeps them for the readings' confidence intervals.
  """
  params, train, test = task["params"], task["train"], task["test"]
  chunk = settings.ablation_chunk_size or default_chunk_size()
  importance = ablation.head_importance(params, config, train, task_loss)
  # Michel et al.: mask the least important heads step by step, re-estimating
  # importance (on the training split) each time; score each mask on held-out data.
  pruning = ablation.iterative_pruning(
    params,
    config,
    train,
    task_loss,
    step=settings.prune_step,
    max_fraction=settings.prune_max,
    chunk_size=chunk,
  )
  families = ("heads", "layers", "layer_skip")
  sets = ablation.sweep_masks(config, families)
  head_masks = np.concatenate([sets[k][0] for k in families] + [pruning.masks])
  layer_masks = np.concatenate(
    [sets[k][1] for k in families] + [np.ones((len(pruning.masks), config.depth), np.float32)]
  )
  base, rows = ablation.evaluate_masks_per_row(
    params,
    config,
    test,
    task_rows,
    head_masks,
    layer_masks,
    chunk_size=chunk,
    strategy=settings.ablation_strategy,
  )
  (base_loss, base_acc), means = base.mean(0), rows.mean(1)  # (M, 2): loss, accuracy
  ends = np.cumsum([0] + [len(sets[k][0]) for k in families])
  part = dict(
    zip((*families, "pruning"), (slice(a, b) for a, b in zip(ends, [*ends[1:], len(rows)])))
  )
  log(f"ablation: baseline loss {base_loss:.4f}, accuracy {base_acc:.4f}")
  log(
    f"pruning: {len(pruning.fractions) - 1} steps, held-out accuracy "
    f"{np.round(means[part['pruning'], 1], 3).tolist()}"
  )
  shape = (config.depth, config.num_attention_heads)
  head_loss = means[part["heads"], 0].reshape(shape)
  return {
    "baseline_loss": float(base_loss),
    "baseline_accuracy": float(base_acc),
    "head_loss": head_loss,
    "layer_heads_loss": means[part["layers"], 0],
    "layer_heads_accuracy": means[part["layers"], 1],
    "layer_skip_loss": means[part["layer_skip"], 0],
    "layer_skip_accuracy": means[part["layer_skip"], 1],
    "importance": importance,
    "importance_vs_ablation": reading.importance_vs_ablation(
      {"importance": importance, "head_loss": head_loss, "baseline_loss": base_loss}
    ),
    "pruning_fraction": pruning.fractions,
    "pruning_accuracy": means[part["pruning"], 1],
    "pruning_loss": means[part["pruning"], 0],
    "pruning_masks": pruning.masks,
    "per_example": {  # per held-out sentence, in the order of the test batches
      "loss_baseline": base[:, 0],
      "correct_baseline": base[:, 1],
      "loss_heads": rows[part["heads"], :, 0].reshape(*shape, -1),
      "loss_layers": rows[part["layers"], :, 0],
      "correct_pruning": rows[part["pruning"], :, 1],
    },
  }


def _token_states(params, config, batches, special_ids) -> tuple[np.ndarray, np.ndarray]:
  """Hidden states of every real, non-special token, (layers + 1, n_tokens, H), and the
  sentence each token is from, (n_tokens,)."""
  parts, owners = [], []
  for idx, batch in batches:
    o = bertjax.forward(
      params,
      config,
      batch["input_ids"],
      batch["attention_mask"],
      batch["token_type_ids"],
      output_hidden_states=True,
    )
    keep = np.asarray(batch["attention_mask"], bool) & ~np.isin(batch["input_ids"], special_ids)
    parts.append(np.asarray(o.hidden_states)[:, keep])
    owners.append(np.broadcast_to(np.asarray(idx)[:, None], keep.shape)[keep])
  return np.concatenate(parts, 1), np.concatenate(owners)


def anisotropy_section(params, config, tok, batches, settings: ReportSettings) -> dict:
  """Ethayarajh's anisotropy: mean cosine of random token pairs, per layer.

  With it, `ci`: 95% bootstrap intervals over the sentences (each resample's tokens are its
  sentences' tokens, a token never paired with its own copies) of the all-pairs mean cosine per
  layer (`geometry.anisotropy_of_groups`) and of its last block minus its first; the reading
  applies its rules to their ends.
  """
  reps, owner = _token_states(params, config, batches, [tok.cls_id, tok.sep_id, tok.pad_id])
  sums, squares, counts = geometry.unit_sums(reps, owner)

  def statistic(idx):  # (R, sentences) resampled sentence indices -> (R, layers + 1)
    weights = np.zeros((len(idx), len(counts)), np.float32)
    np.add.at(weights, (np.arange(len(idx))[:, None], idx), 1)
    a = np.asarray(geometry.anisotropy_of_groups(sums, squares, counts, weights), np.float64)
    return np.concatenate([a, a[..., -1:] - a[..., 1:2]], -1)

  low, high = stats.bootstrap_ci(
    np.arange(len(counts)),
    statistic,
    vectorized=True,
    n_resamples=settings.bootstrap_resamples,
    seed=settings.seed,
  )
  return {
    "num_tokens": int(reps.shape[1]),
    "anisotropy": geometry.anisotropy(reps, settings.anisotropy_pairs, settings.seed),
    "anisotropy_centered": geometry.anisotropy(
      reps, settings.anisotropy_pairs, settings.seed, centered=True
    ),
    "ci": {
      "sentences": len(counts),
      "all_pairs": statistic(np.arange(len(counts))[None])[0, :-1],
      "anisotropy": [low[:-1], high[:-1]],
      "rise": [low[-1], high[-1]],
    },
  }


def pos_section(params, config, tok, ud_files, settings: ReportSettings, progress: bool) -> dict:
  """A linear UPOS probe on every layer, with its control task (`probing_run`)."""
  from bertjax.analysis.representations import probing_run
  from bertjax.data import conllu

  sentences = []
  for path in ud_files:
    sentences += conllu.read_conllu(path, max_sentences=settings.pos_sentences - len(sentences))
    if len(sentences) >= settings.pos_sentences:
      break
  # Sentences the model cannot read whole (its usable length) are left out, not cut.
  max_len = min(config.max_length, tok.model_max_length)
  sentences = [
    sentences[i] for i in text_batches.fitting(tok, [s.forms for s in sentences], max_len)
  ]
  suite = probing_run.SuiteConfig(
    tasks=("upos",),
    structural=False,
    seed=settings.seed,
    probe=dataclasses.replace(probing_run.SuiteConfig().probe, max_steps=settings.pos_probe_steps),
  )
  out = probing_run.run_probing_suite(
    params, config, tok, sentences, suite=suite, progress=progress
  )
  upos = out["upos"]
  return {
    "files": [p.name for p in ud_files],
    "num_sentences": len(sentences),
    "num_train_words": upos["train_size"],
    "num_test_words": upos["test_size"],
    "num_tags": upos["num_classes"],
    "accuracy": np.asarray(upos["accuracy"]),
    "control_accuracy": np.asarray(upos["control_accuracy"]),
    "selectivity": np.asarray(upos["selectivity"]),
    "best_layer": upos["best_layer"],
    "test_by_sentence": upos["test_by_sentence"],
  }


def _sentence_sums(params, config, batches, bound) -> tuple[np.ndarray, ...]:
  """Per sentence: the block outputs summed over its real tokens (S, L, H), its real tokens
  (S,), and how many of its entries exceed each layer's `bound` (L,) in magnitude (S, L)."""
  sums, counts, above = [], [], []
  for _, batch in batches:
    o = bertjax.forward(
      params,
      config,
      batch["input_ids"],
      batch["attention_mask"],
      batch["token_type_ids"],
      output_hidden_states=True,
    )
    h = np.asarray(o.hidden_states[1:], np.float64)  # (L, B, T, H)
    real = np.asarray(batch["attention_mask"], np.float64)  # (B, T)
    sums.append(np.einsum("lbth,bt->blh", h, real))
    counts.append(real.sum(-1))
    big = (np.abs(h) > np.asarray(bound)[:, None, None, None]) & (real[None, ..., None] > 0)
    above.append(big.sum((2, 3)).T)
  return np.concatenate(sums), np.concatenate(counts), np.concatenate(above)


def _special_mass(params, config, batches, special_ids, chunk: int = 8) -> np.ndarray:
  """(S,) each sentence's attention mass on its special tokens ([CLS]/<s>, [SEP]/</s>), over
  its real query rows, every head and every layer (`chunk` sentences' maps at a time)."""
  out = []
  for _, batch in batches:
    for i in range(0, len(batch["input_ids"]), chunk):
      b = {
        k: np.asarray(batch[k])[i : i + chunk]
        for k in ("input_ids", "attention_mask", "token_type_ids")
      }
      o = bertjax.forward(
        params,
        config,
        b["input_ids"],
        b["attention_mask"],
        b["token_type_ids"],
        output_attentions=True,
      )
      a = np.asarray(o.attentions)  # (L, B, N, T, T)
      real = b["attention_mask"].astype(bool)
      on_special = (a * np.isin(b["input_ids"], special_ids)[None, :, None, None]).sum(-1)
      out.append(
        (on_special * real[None, :, None]).sum(-1, dtype=np.float64).mean((0, 2)) / real.sum(-1)
      )
  return np.concatenate(out)


def outlier_section(params, config, tok, batches, settings: ReportSettings) -> dict:
  """Outlier dimensions (Kovaleva et al. 2021, `outliers.outlier_dimensions`'s criterion),
  the attention on special tokens with and without them (Puccetti et al. 2022) and massive
  activations (Sun et al. 2024), on the text's sentences.

  With them, `count_ci`: the 95% bootstrap interval over the sentences of how many outlier
  dimensions the criterion finds (each resample's per-dimension means are its sentences'
  tokens'); `special_mass` and `massive.by_sentence` (each sentence's massive entries per
  layer, against the bound of all sentences' median) keep the per-sentence values the reading
  resamples.
  """
  census = outliers.outlier_dimensions(params, config, [b for _, b in batches])
  massive = outliers.massive_activations(params, config, [b for _, b in batches])
  sums, counts, above = _sentence_sums(
    params, config, batches, np.maximum(100.0, 1000.0 * massive.median_abs)
  )
  dims = list(census.dims)

  def found(idx):  # (R, S) resampled sentence indices -> (R,) outlier dimensions found
    weights = np.zeros((len(idx), len(counts)))
    np.add.at(weights, (np.arange(len(idx))[:, None], idx), 1)
    mean = np.einsum("rs,slh->rlh", weights, sums) / (weights @ counts)[:, None, None]
    z = (mean - mean.mean(-1, keepdims=True)) / mean.std(-1, keepdims=True)
    return ((np.abs(z) >= 3).mean(1) >= 0.25).sum(-1)

  count_ci = stats.bootstrap_ci(
    np.arange(len(counts)),
    found,
    vectorized=True,
    n_resamples=settings.bootstrap_resamples,
    seed=settings.seed,
  )
  special = [i for i in (tok.cls_id, tok.sep_id) if i is not None]
  mass = {"intact": _special_mass(params, config, batches, special)}
  if dims:
    off = outliers.disable_dimensions(params, config, dims)
    mass["disabled"] = _special_mass(off, config, batches, special)
  return {
    "z": census.z,
    "dims": dims,
    "tokens": census.tokens,
    "hidden_size": config.hidden_size,
    "outliers_per_layer": census.is_outlier.sum(1),
    "count_ci": count_ci,
    "massive": {
      "count": massive.count,
      "max_abs": massive.max_abs,
      "median_abs": massive.median_abs,
      "by_sentence": above,
    },
    "special_mass": mass,
  }


def sae_section(params, config, tok, batches, settings: ReportSettings) -> dict:
  """A top-k sparse autoencoder (Gao et al. 2024, `analysis.sae`) on the middle block's output,
  trained on the text's tokens but its last fifth of batches, evaluated on those.

  Returns FVU, L0, dead and dense shares on the held-out tokens; `dead_ci`, the 95% bootstrap
  interval of the dead share over the held-out sentences (each resample's latents fire on its
  sentences' tokens); and the strongest activations, with context, of eight latents drawn
  (seeded) among those that fire on held-out text.
  """
  from bertjax.analysis.representations import sae

  layer = config.depth // 2
  plain = [b for _, b in batches]
  held_n = max(1, len(plain) // 5)
  if len(plain) < 2:
    return {"available": False, "reason": f"{len(plain)} batch of text: none to hold out"}
  train_b, held_b = plain[:-held_n], plain[-held_n:]
  acts = sae.activations(params, config, train_b, "out", layer)
  held = sae.activations(params, config, held_b, "out", layer)
  cfg = sae.SAEConfig(
    d_model=config.hidden_size,
    latents=settings.sae_expansion * config.hidden_size,
    k=min(32, config.hidden_size),
    lr=1e-3,
    dead_tokens=100 * 1024,
  )
  state, _ = sae.train(
    acts,
    cfg,
    steps=settings.sae_steps,
    batch_tokens=min(1024, len(acts)),
    seed=settings.seed,
    progress=False,
  )
  ev = sae.evaluate(state.params, cfg, held)
  owner = np.concatenate(
    [np.nonzero(np.asarray(b["attention_mask"]) > 0)[0] + 1000 * i for i, b in enumerate(held_b)]
  )  # each held-out token's sentence
  _, sentence = np.unique(owner, return_inverse=True)
  values, indices = (np.asarray(a) for a in sae.encode(state.params, held, cfg.k))
  fires = np.zeros((sentence.max() + 1, cfg.latents), bool)
  rows = np.repeat(sentence, cfg.k).reshape(-1, cfg.k)
  fires[rows[values > 0], indices[values > 0]] = True

  def dead(idx):  # (R, S) resampled sentences -> (R,) share of latents firing on none of them
    weights = np.zeros((len(idx), len(fires)))
    np.add.at(weights, (np.arange(len(idx))[:, None], idx), 1)
    return ((weights @ fires) == 0).mean(-1)

  dead_ci = stats.bootstrap_ci(
    np.arange(len(fires)),
    dead,
    vectorized=True,
    n_resamples=settings.bootstrap_resamples,
    seed=settings.seed,
  )
  alive = np.flatnonzero(ev["frequency"] > 0)
  shown = np.random.default_rng(settings.seed).choice(alive, min(8, len(alive)), replace=False)
  top = sae.top_activating(
    params, config, tok, held_b, "out", layer, state.params, cfg, sorted(shown.tolist()), n=5
  )
  return {
    "available": True,
    "layer": layer + 1,
    "latents": cfg.latents,
    "k": cfg.k,
    "steps": settings.sae_steps,
    "train_tokens": len(acts),
    "held_tokens": len(held),
    "held_sentences": len(fires),
    "fvu": ev["fvu"],
    "l0": ev["l0"],
    "dead": ev["dead"],
    "dense": ev["dense"],
    "dead_ci": dead_ci,
    "top": {
      str(k): [{"value": t["value"], "token": t["token"], "text": t["text"]} for t in v]
      for k, v in top.items()
    },
  }


def effective_section(
  params, config, tok, passages: Sequence[str], settings: ReportSettings
) -> dict:
  """Brunner et al.'s effective attention: statistics over passages, maps of a few heads.

  Passages longer than the model reads (`config.max_length`, which for RoBERTa-style
  positions is less than `max_position_embeddings`, or the tokenizer's limit) are cut there.
  """
  batches = text_batches.batches(
    tok,
    list(passages),
    batch_size=8,
    truncation=True,
    max_length=min(config.max_length, tok.model_max_length),
  )
  statistics = effective_attention_lib.effective_attention_statistics(
    params,
    config,
    [text_batches.plain(b) for _, b in batches],
    cls_id=tok.cls_id,
    sep_id=tok.sep_id,
  )
  # The heads whose raw attention (on these passages) sits most on [CLS] + [SEP]: where
  # Brunner et al. found raw and effective attention to differ most.
  score = (statistics["raw"]["cls"] + statistics["raw"]["sep"]).ravel()
  heads = [
    divmod(int(i), config.num_attention_heads) for i in np.argsort(-score)[: settings.example_heads]
  ]
  idx, batch = batches[0]
  o = bertjax.forward(
    params,
    config,
    batch["input_ids"][:1],
    batch["attention_mask"][:1],
    batch["token_type_ids"][:1],
    output_attentions=True,
    capture=("v",),
  )
  n = int(batch["attention_mask"][0].sum())
  maps, values = np.asarray(o.attentions), np.asarray(o.cache["v"])
  examples = []
  for layer, head in heads:
    t = effective_attention_lib.head_value_outputs(params, config, layer, values[layer, 0, :n])
    raw = maps[layer, 0, :, :n, :n]
    eff = effective_attention_lib.effective_attention(raw, t)
    examples.append({"layer": layer + 1, "head": head, "raw": raw[head], "effective": eff[head]})
  lengths = np.concatenate([b["attention_mask"].sum(-1) for _, b in batches])
  # Each passage's own mass on [CLS] + [SEP] (averaged over layers and heads) and its length:
  # the statistics' token-weighted means are the length-weighted means of these.
  per_passage = {"tokens": [], "raw": [], "effective": []}
  for _, b in batches:
    for i in range(len(b["input_ids"])):
      one = effective_attention_lib.effective_attention_statistics(
        params,
        config,
        [{k: v[i : i + 1] for k, v in text_batches.plain(b).items()}],
        cls_id=tok.cls_id,
        sep_id=tok.sep_id,
      )
      per_passage["tokens"].append(int(b["attention_mask"][i].sum()))
      for kind in ("raw", "effective"):
        per_passage[kind].append(float(np.mean(one[kind]["cls"]) + np.mean(one[kind]["sep"])))
  return {
    "num_passages": len(passages),
    "mean_passage_tokens": float(np.mean(lengths)),
    "per_passage": per_passage,
    "head_dim": config.head_dim,
    "stats": statistics,
    "examples": examples,
    "example_tokens": tok.convert_ids_to_tokens(batch["input_ids"][0, :n]),
    "example_text": passages[int(idx[0])],
  }


def _task_probe(task: dict) -> tuple[np.ndarray, np.ndarray]:
  """The scoring task's probe (section 3) as `(w, b)` on raw pooled states (its
  standardisation folded in), float64."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), task["params"][PROBE_KEY])
  return p["w"] / p["scale"][:, None], p["b"] - (p["mean"] / p["scale"]) @ p["w"]


def attribution_section(
  params, config, tok, sentences: Sequence[Sentence], task: dict, settings: ReportSettings
) -> dict:
  """Which attribution method ranks the negation cue first; which heads carry negation.

  The explained quantity is the scoring task's probe (section 3) on the final layer;
  see `bertjax.tasks.negation`. Attention flow is left out (max-flow per sentence is
  slow); `experiments/attribution.py` includes it.
  """
  from bertjax.tasks import negation

  probe = _task_probe(task)
  negated = [s.text for s in sentences if s.negated]
  methods = tuple(m for m in negation.methods_for(config) if m != "flow")
  try:
    negation.pairs(tok, negated[: settings.patching_pairs])
  except ValueError as e:  # a vocabulary without the cues or their twins as single tokens
    return {"available": False, "reason": str(e)}
  cues = negation.cue_statistics(
    params,
    config,
    tok,
    negated,
    probe,
    methods=methods,
    ig_steps=settings.attribution_ig_steps,
    batch_size=min(settings.batch_size, 16),
    max_sentences=settings.attribution_sentences,
  )
  patch = negation.head_patching(params, config, tok, negated[: settings.patching_pairs], probe)
  return {"available": True, "cues": cues, "patching": patch}


def circuit_section(
  params, config, tok, sentences: Sequence[Sentence], task: dict, settings: ReportSettings
) -> dict:
  """The circuit that carries negation into the scoring task's probe (section 3):
  `negation.circuit` on the negated sentences and their twins (EAP and EAP-IG on every edge,
  a seeded sample patched exactly, top-k circuits' faithfulness)."""
  from bertjax.analysis.interventions import edges
  from bertjax.tasks import negation

  probe = _task_probe(task)
  negated = [s.text for s in sentences if s.negated][: settings.circuit_pairs]
  try:
    edges.check_supported(config)  # the edge graph's derivation names the families it covers
    negation.pairs(tok, negated)
  except ValueError as e:  # or a vocabulary without the cues or their twins as single tokens
    return {"available": False, "reason": str(e)}
  found = negation.circuit(
    params,
    config,
    tok,
    negated,
    probe,
    steps=settings.circuit_ig_steps,
    exact_edges=settings.circuit_exact_edges,
    seed=settings.seed,
  )
  return {"available": True, **found}


# Clark et al.'s previous/next-token heads: over half of the attention one token back or ahead.
PREV_NEXT_MIN = 0.5
# Kovaleva et al.'s types that are positional: the diagonal band (offsets -1, 0, +1).
DIAGONAL_TYPES = ("diagonal", "vertical+diagonal")


def _overlap(positional: np.ndarray, found: np.ndarray) -> dict:
  """How the mostly positional heads (L, N) bool meet a set of heads `found` (L, N) bool."""
  names = lambda grid: [[int(l) + 1, int(h)] for l, h in np.argwhere(grid)]
  rate = lambda grid: float(positional[grid].mean()) if grid.any() else None
  return {
    "heads": names(found),
    "positional": names(found & positional),
    "positional_rate": rate(found),
    "other_rate": rate(~found),
  }


def disentangled_section(
  params, config, batches, clark: dict | None, patterns: dict | None
) -> dict:
  """DeBERTa's score terms (He et al. 2021): each head's share of score variance carried by
  c2p and p2c, and its attention change without them (`disentangled.score_term_shares`); the
  mostly positional heads set against section 1's previous/next-token heads (`prev` or
  `next` mass > `PREV_NEXT_MIN`) and section 2's heads whose most frequent type is in
  `DIAGONAL_TYPES` (`overlap`; None where that section failed). Head lists are `[layer,
  head]`, layers numbered from 1."""
  s = disentangled.score_term_shares(params, config, [text_batches.plain(b) for _, b in batches])
  positional = s.mostly_positional()
  overlap = {"prev_next": None, "diagonal": None}
  if clark and not clark.get("failed"):
    overlap["prev_next"] = _overlap(
      positional,
      (np.asarray(clark["prev"]) > PREV_NEXT_MIN) | (np.asarray(clark["next"]) > PREV_NEXT_MIN),
    )
  if patterns and not patterns.get("failed"):
    codes = [attention_patterns.PATTERN_TYPES.index(t) for t in DIAGONAL_TYPES]
    overlap["diagonal"] = _overlap(positional, np.isin(patterns["dominant"], codes))
  return {
    "available": True,
    "terms": list(disentangled.TERMS),
    "position_terms": list(config.disentangled_terms),
    "num_pairs": s.num_pairs,
    "num_rows": s.num_rows,
    "threshold": disentangled.POSITIONAL_THRESHOLD,
    "prev_next_min": PREV_NEXT_MIN,
    "diagonal_types": list(DIAGONAL_TYPES),
    "variance": s.variance,
    "share": s.share,
    "positional_share": s.positional_share,
    "removals": list(disentangled.REMOVALS),
    "tv_direct": s.tv_direct,
    "tv_total": s.tv_total,
    "by_layer": s.by_layer(),
    "positional_heads": [[l + 1, h] for l, h in s.positional_heads()],
    "overlap": overlap,
  }
