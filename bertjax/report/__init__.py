"""The BERTology report: `bertjax report` and `./run.sh demo`.

`build_report` loads a BERT or ALBERT checkpoint (the built-in all-MiniLM-L6-v2
by default; a directory or a hub id in the local cache), runs the analyses of
`bertjax.analysis` on the project's own sentences
(`bertjax/resources/sentences.tsv`) or, with `data_dir`, on UD English EWT, and
writes `index.html` (its PNG figures beside it; `bertjax.report.page` draws and lays
them out) and `report.json` (every number the page shows). Layers are numbered
one way throughout (`LAYER_NUMBERING`): blocks 1..L, the embedding output 0.

Sections: attention to [CLS], [SEP] and punctuation and attention entropy
(Clark et al. 2019); attention pattern types (Kovaleva et al. 2019); head and
layer ablation and head importance with a pruning curve (Michel et al. 2019) on
a negation-detection task scored without downloads; anisotropy (Ethayarajh
2019); a POS probe when UD data is present; raw vs effective attention (Brunner
et al. 2020); token attribution and head patching on negation. Each section ends in a
generated reading (`bertjax.report.reading`, stored under `readings`): the paper's finding,
this model's measured value beside it, and whether they agree under a stated rule.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib.resources
import json
import os
import pathlib
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

import bertjax
from bertjax import stats, utils
from bertjax.analysis import ablation, attention, geometry, probing
from bertjax.hub import DEFAULT_MODEL
from bertjax.report import page, reading

SENTENCE_COLUMNS = ("sentence", "negated", "question", "phenomenon")
LAYER_NUMBERING = {
    "layers": "transformer blocks are layers 1..L; the embedding output is layer 0",
    "heads": "heads are numbered 0..H-1 within a layer, as in head-mask arrays",
    "arrays": "per-block arrays (length L, or L x H) hold layers 1..L in order; arrays "
              "with the embeddings (length L + 1) hold layers 0..L; every 'layer' field "
              "is a layer number"}
PROBE_KEY = "report_task_probe"  # where the task classifier rides inside the params pytree

TASK_NAME = "negation detection from the sentence embedding"
TASK_WHY = (
    "Every sentence of the project's own set is labelled negated (it contains not, n't, never, "
    "no, nobody, nothing, none, neither, nor or nowhere) or affirmative, so the task needs no "
    "download. A logistic-regression head is fitted on the frozen model's mean-pooled final "
    "layer (the sentence embedding all-MiniLM-L6-v2 is used through) of a stratified training "
    "split and scored on the held-out split. The head stays fixed while heads and layers are "
    "ablated, so every change in held-out cross-entropy and accuracy is the encoder's doing. "
    "Negation is a property sentence-embedding models are known to blur (their training pulls "
    "'X' and 'not X' together), so how well it survives to the last layer, and which heads "
    "carry it there, is a question worth asking of this model; questions vs statements "
    "would be decided by the final '?' alone.")


@dataclasses.dataclass(frozen=True)
class Sentence:
  """One labelled sentence of the project's own set."""

  text: str
  negated: int
  question: int
  phenomenon: str


@dataclasses.dataclass(frozen=True)
class ReportSettings:
  """Sizes of the analyses; `reduced()` for the CI test.

  Attributes:
    max_sentences: how many of the built-in sentences to use (spread over the
      file), or None for all.
    max_text_sentences: with `data_dir`, how many UD sentences the attention
      and geometry analyses read.
    batch_size: sentences per forward call.
    test_fraction: held-out share of the task sentences (stratified by label).
    probe_steps, probe_l2: the task and negation probes' full-batch Adam steps and
      L2 weight.
    prune_step, prune_max: Michel et al.'s pruning: fraction of heads masked per
      step, and where to stop.
    pos_sentences: UD sentences for the POS probe (split by sentence).
    pos_probe_steps: its most optimisation steps (early stopping on a held-out split).
    anisotropy_pairs: random token pairs per layer.
    passage_tokens: approximate length of the passages for effective attention
      (at least twice the head dimension: only on sequences longer than the head
      dimension does it differ from raw attention).
    passages: how many passages the effective-attention statistics average over.
    example_heads: heads shown raw vs effective.
    ablation_strategy: `ablation.evaluate_masks`'s strategy.
    ablation_chunk_size: masks evaluated at once; None means
      `ablation.default_chunk_size()` (1 on CPU, fastest there; 16 on accelerators).
    attribution_sentences: negated sentences the token-attribution methods explain
      (None: every one with a one-token cue).
    attribution_ig_steps: integrated gradients' quadrature points.
    patching_pairs: negated sentences (and twins) the head-patching sweep reads.
    seed: the seed of every split and sample.
  """

  max_sentences: int | None = None
  max_text_sentences: int = 400
  batch_size: int = 64
  test_fraction: float = 0.3
  probe_steps: int = 500
  probe_l2: float = 0.1
  prune_step: float = 0.1
  prune_max: float = 0.9
  pos_sentences: int = 2000
  pos_probe_steps: int = 1500
  anisotropy_pairs: int = 5000
  passage_tokens: int = 64
  passages: int = 8
  example_heads: int = 4
  ablation_strategy: str = "prefix"
  ablation_chunk_size: int | None = None
  attribution_sentences: int | None = 48
  attribution_ig_steps: int = 32
  patching_pairs: int = 64
  seed: int = 0

  @classmethod
  def reduced(cls) -> ReportSettings:
    """A few sentences and steps: the whole report in well under a minute or two."""
    return cls(max_sentences=60, max_text_sentences=40, batch_size=32, probe_steps=150,
               prune_step=0.25, prune_max=0.5, pos_sentences=60, pos_probe_steps=100,
               anisotropy_pairs=500, passage_tokens=64, passages=2, example_heads=2,
               ablation_strategy="vmap", attribution_sentences=6, attribution_ig_steps=4,
               patching_pairs=8)


# Inputs -----------------------------------------------------------------------


def sentences_path() -> pathlib.Path:
  """The project's own labelled sentences (`bertjax/resources/sentences.tsv`)."""
  return pathlib.Path(str(importlib.resources.files("bertjax") / "resources" / "sentences.tsv"))


def load_sentences(path: str | os.PathLike | None = None) -> list[Sentence]:
  """Reads a sentences TSV with the columns of `SENTENCE_COLUMNS`.

  Raises:
    ValueError: naming the line, for a missing column, a label outside {0, 1}
      or an empty sentence.
  """
  path = pathlib.Path(path) if path is not None else sentences_path()
  with open(path, newline="", encoding="utf-8") as f:
    reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
    missing = set(SENTENCE_COLUMNS) - set(reader.fieldnames or ())
    if missing:
      raise ValueError(f"{path} lacks the columns {sorted(missing)}; header is {reader.fieldnames}")
    out = []
    for line, row in enumerate(reader, start=2):
      text = (row["sentence"] or "").strip()
      if not text:
        raise ValueError(f"{path}:{line}: empty sentence")
      flags = {}
      for name in ("negated", "question"):
        if row[name] not in ("0", "1"):
          raise ValueError(f"{path}:{line}: {name}={row[name]!r} must be 0 or 1")
        flags[name] = int(row[name])
      out.append(Sentence(text, flags["negated"], flags["question"], row["phenomenon"].strip()))
  if not out:
    raise ValueError(f"{path} has no sentences")
  return out


def default_data_dir() -> pathlib.Path | None:
  """The data directory holding UD English EWT, by the project's one lookup
  (`bertjax.data.fetch.find_root`: `$BERTJAX_DATA_DIR` or the user cache, then
  `../shared/data`); None when none holds it."""
  from bertjax.data import fetch

  try:
    return fetch.find_root(need=["ud_english_ewt"])
  except fetch.DataNotFoundError:
    return None


_GENERIC_NAMES = {"model", "models", "hf", "export", "exported", "final", "latest", "best",
                  "output", "outputs", "out", "snapshot", "checkpoint", "pytorch", "weights"}


def model_name(path: pathlib.Path, given: str | None = None) -> str:
  """A name for the analysed model that means something to its reader.

  A hub id as given (`org/name`); a model in the Hugging Face cache
  (`models--org--name/snapshots/<hash>`) by its hub id; else the directory's name, with
  its parent's before it when the name alone says nothing (`model`, `hf`, a step
  number, a commit hash: `run-7/model`). `config.json`'s `_name_or_path` is not used:
  it records what a checkpoint was trained from (all-MiniLM-L6-v2's says
  `nreimers/MiniLM-L6-H384-uncased`), not what it is.
  """
  if given is not None and not pathlib.Path(given).expanduser().exists():
    return str(given)  # a hub id
  path = pathlib.Path(path).resolve()
  for part in reversed(path.parts):
    if part.startswith("models--") and part.count("--") >= 2:
      return "/".join(part.split("--")[1:])
  name = path.name
  generic = (name.lower() in _GENERIC_NAMES or name.isdigit()
             or (len(name) == 40 and all(c in "0123456789abcdef" for c in name))
             or name.lower().startswith(("checkpoint", "step")))
  return f"{path.parent.name}/{name}" if generic and path.parent.name else name


def _ud_files(data_dir: pathlib.Path) -> list[pathlib.Path]:
  """UD English EWT CoNLL-U files under `data_dir`, train first, then dev, then test."""
  files = sorted((data_dir / "ud_english_ewt").glob("*.conllu")) if data_dir else []
  rank = lambda p: (0 if "train" in p.name else 1 if "dev" in p.name else 2, p.name)
  return sorted(files, key=rank)


def _read_json(path: pathlib.Path) -> dict:
  try:
    return json.loads(path.read_text(encoding="utf-8"))
  except (OSError, ValueError):
    return {}


def _spread(n: int, k: int | None) -> np.ndarray:
  """`k` indices spread evenly over `range(n)` (all of them when k is None or >= n)."""
  if k is None or k >= n:
    return np.arange(n)
  return np.unique(np.linspace(0, n - 1, k).round().astype(int))


def _stratified_split(labels: np.ndarray, test_fraction: float, seed: int):
  """Train and test indices with each label split in the same proportion."""
  rng = np.random.default_rng(seed)
  train, test = [], []
  for value in np.unique(labels):
    idx = rng.permutation(np.flatnonzero(labels == value))
    k = max(1, round(test_fraction * len(idx)))
    test.append(idx[:k])
    train.append(idx[k:])
  return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def _round_up(x: int, m: int) -> int:
  return -(-x // m) * m


def _batches(tok: bertjax.Tokenizer, texts=None, words=None, pairs=None, *, batch_size: int,
             max_length: int, extra: dict[str, np.ndarray] | None = None,
             truncation: bool = False):
  """Length-sorted padded batches: a list of `(indices, batch dict)`.

  Give `texts` (with optional `pairs`) or `words` (pre-split). Padded lengths
  are multiples of 8, so few shapes compile. `extra` arrays (n, ...) are sliced
  into each batch (e.g. labels). `truncation` cuts longer inputs to `max_length`
  (as transformers' `truncation=True`) instead of refusing them.
  """
  items = texts if texts is not None else words

  def encode(idx, pad_to=None) -> bertjax.Batch:
    if texts is None:
      return tok.encode_words([words[i] for i in idx], max_length=max_length, pad_to=pad_to,
                              truncation=truncation)
    second = None if pairs is None else [pairs[i] for i in idx]
    return tok.encode([texts[i] for i in idx], second, max_length=max_length, pad_to=pad_to,
                      truncation=truncation)

  lengths = encode(range(len(items))).attention_mask.sum(-1)
  order = np.argsort(lengths, kind="stable")
  out = []
  for start in range(0, len(order), batch_size):
    idx = np.sort(order[start:start + batch_size])
    width = min(_round_up(int(lengths[idx].max()), 8), max_length)
    b = encode(idx, pad_to=width)
    batch = {"input_ids": b.input_ids, "attention_mask": b.attention_mask,
             "token_type_ids": b.token_type_ids, "word_ids": b.word_ids}
    for name, values in (extra or {}).items():
      batch[name] = np.asarray(values)[idx]
    out.append((idx, batch))
  return out


def _plain(batch: dict) -> dict:
  """The model inputs (and labels) of a batch, without `word_ids`."""
  return {k: v for k, v in batch.items() if k != "word_ids"}


# The scoring task ---------------------------------------------------------------


_mean_pool = jax.jit(stats.mean_pool)


def _task_logits(params, last_hidden_state, attention_mask):
  p = params[PROBE_KEY]
  x = _mean_pool(last_hidden_state.astype(jnp.float32), attention_mask)
  return ((x - p["mean"]) / p["scale"]) @ p["w"] + p["b"]


def task_loss(params, config, batch, last_hidden_state, pooled):
  """Cross-entropy of the report's task head on `batch["labels"]`: (sum, count)."""
  logp = jax.nn.log_softmax(_task_logits(params, last_hidden_state, batch["attention_mask"]))
  nll = -jnp.take_along_axis(logp, batch["labels"][:, None].astype(jnp.int32), -1)[:, 0]
  return nll.sum(), jnp.asarray(nll.shape[0], jnp.float32)


def task_accuracy(params, config, batch, last_hidden_state, pooled):
  """Accuracy of the report's task head on `batch["labels"]`: (correct, count)."""
  pred = _task_logits(params, last_hidden_state, batch["attention_mask"]).argmax(-1)
  correct = (pred == batch["labels"]).astype(jnp.float32)
  return correct.sum(), jnp.asarray(correct.shape[0], jnp.float32)


def _sentence_embeddings(params, config, batches, n: int) -> np.ndarray:
  """Mean-pooled hidden states of every layer, embeddings first: (layers + 1, n, H)."""
  out = np.zeros((config.depth + 1, n, config.hidden_size), np.float32)
  for idx, batch in batches:
    o = bertjax.forward(params, config, batch["input_ids"], batch["attention_mask"],
                        batch["token_type_ids"], output_hidden_states=True)
    out[:, idx] = np.asarray(_mean_pool(o.hidden_states, jnp.asarray(batch["attention_mask"])))
  return out


def fit_task(params, config, tok, sentences: Sequence[Sentence], settings: ReportSettings,
             log: Callable[[str], None]) -> tuple[dict, dict]:
  """Fits the negation heads (one per layer) and returns `(results, task)`.

  `task` holds the parameters with the final layer's head under `PROBE_KEY` and
  the held-out and training batches for the ablation analyses.
  """
  texts = [s.text for s in sentences]
  labels = np.asarray([s.negated for s in sentences], np.int32)
  if len(np.unique(labels)) < 2:
    raise ValueError(f"the task needs negated and affirmative sentences; labels are all "
                     f"{labels[0]}")
  train, test = _stratified_split(labels, settings.test_fraction, settings.seed)
  batches = _batches(tok, texts, batch_size=settings.batch_size,
                     max_length=config.max_position_embeddings)
  feats = _sentence_embeddings(params, config, batches, len(texts))  # (L + 1, n, H)
  mean = feats[:, train].mean(1, keepdims=True)
  scale = feats[:, train].std(1, keepdims=True) + 1e-6
  z = (feats - mean) / scale
  probe = probing.fit_probe(
      z[:, train], labels[train], num_classes=2,
      config=probing.ProbeConfig(l2=settings.probe_l2, max_steps=settings.probe_steps,
                                 patience=None, seed=settings.seed))
  logits = np.asarray(probe.logits(z[:, test]), np.float64)  # (L + 1, n_test, 2)
  logp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
  nll = -np.take_along_axis(logp, labels[test][None, :, None], -1)[..., 0].mean(-1)
  acc = probe.accuracy(z[:, test], labels[test])
  log(f"negation probe held-out accuracy by layer: {np.round(acc, 3).tolist()}")
  head = jax.tree.map(lambda a: np.asarray(a[-1]), probe.params)
  task_params = {**params, PROBE_KEY: {
      "mean": jnp.asarray(mean[-1, 0]), "scale": jnp.asarray(scale[-1, 0]),
      "w": jnp.asarray(head["w"]), "b": jnp.asarray(head["b"])}}
  split = lambda idx: [_plain(b) for _, b in _batches(
      tok, [texts[i] for i in idx], batch_size=settings.batch_size,
      max_length=config.max_position_embeddings, extra={"labels": labels[idx]})]
  results = {
      "name": TASK_NAME, "why": TASK_WHY,
      "classifier": (f"logistic regression (linear probe, L2 {settings.probe_l2}, "
                     f"{settings.probe_steps} full-batch Adam steps) on standardised mean-pooled "
                     "states"),
      "num_train": len(train), "num_test": len(test),
      "test_negated_fraction": float(labels[test].mean()),
      "majority_accuracy": float(max(labels[test].mean(), 1 - labels[test].mean())),
      "probe_accuracy_by_layer": acc.tolist(), "probe_loss_by_layer": nll.tolist(),
      "test_accuracy": float(acc[-1]), "test_loss": float(nll[-1]),
  }
  return results, {"params": task_params, "train": split(train), "test": split(test)}


# Analyses -----------------------------------------------------------------------


def clark_section(params, config, tok, batches) -> dict:
  """Clark et al.'s attention mass on [CLS], [SEP], punctuation; entropy per head.

  On the definitions of Clark's released notebook: per-document averages, "." and
  "," as punctuation, smoothed entropy (`attention.clark_statistics`' defaults).
  """
  stats = attention.clark_statistics(params, config, [_plain(b) for _, b in batches],
                                     sep_id=tok.sep_id,
                                     punct_ids=attention.clark_punctuation_ids(tok))
  out = {name: np.asarray(v) for name, v in stats.items()}
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
  counts = attention.pattern_types(params, config, [_plain(b) for _, b in pair_batches],
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
  delta = (loss.heads - loss.baseline).ravel()
  return {
      "baseline_loss": loss.baseline, "baseline_accuracy": base_acc,
      "head_loss": loss.heads,
      "layer_heads_loss": loss.layers, "layer_heads_accuracy": layer_acc[:config.depth],
      "layer_skip_loss": loss.layer_skip, "layer_skip_accuracy": layer_acc[config.depth:],
      "importance": importance,
      "importance_vs_ablation_spearman": stats.spearman(importance.ravel(), delta),
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


def _passages(sentences: Sequence[str], tok, target: int, count: int) -> list[str]:
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


def effective_section(params, config, tok, passages: Sequence[str], clark: dict,
                      settings: ReportSettings) -> dict:
  """Brunner et al.'s effective attention: statistics over passages, maps of a few heads."""
  batches = _batches(tok, list(passages), batch_size=8, truncation=True,
                     max_length=min(config.max_position_embeddings, tok.model_max_length))
  stats = attention.effective_attention_statistics(
      params, config, [_plain(b) for _, b in batches], cls_id=tok.cls_id, sep_id=tok.sep_id)
  # The heads whose raw attention sits most on [CLS] + [SEP]: where Brunner et al.
  # found raw and effective attention to differ most.
  score = (clark["cls"] + clark["sep"]).ravel()
  heads = [divmod(int(i), config.num_attention_heads)
           for i in np.argsort(-score)[:settings.example_heads]]
  idx, batch = batches[0]
  o = bertjax.forward(params, config, batch["input_ids"][:1], batch["attention_mask"][:1],
                      batch["token_type_ids"][:1], output_attentions=True,
                      output_hidden_states=True)
  n = int(batch["attention_mask"][0].sum())
  maps, hidden = np.asarray(o.attentions), np.asarray(o.hidden_states)
  examples = []
  for layer, head in heads:
    t = attention.head_value_outputs(params, config, layer, hidden[layer, 0, :n])
    raw = maps[layer, 0, :, :n, :n]
    eff = attention.effective_attention(raw, t)
    examples.append({"layer": layer + 1, "head": head, "raw": raw[head],
                     "effective": eff[head]})
  lengths = np.concatenate([b["attention_mask"].sum(-1) for _, b in batches])
  return {"num_passages": len(passages), "mean_passage_tokens": float(np.mean(lengths)),
          "head_dim": config.head_dim, "stats": stats, "examples": examples,
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


# The pipeline ------------------------------------------------------------------------


def build_report(model_dir: str | os.PathLike | None = None,
                 out_dir: str | os.PathLike = "out/report",
                 data_dir: str | os.PathLike | None = None, reduced: bool = False,
                 progress: bool = True, settings: ReportSettings | None = None) -> dict:
  """Analyses a BERT or ALBERT checkpoint and writes the HTML report.

  Args:
    model_dir: a Hugging Face BERT or ALBERT directory (weights, config and
      tokenizer files) or a hub id in the local cache; None means the built-in
      all-MiniLM-L6-v2. The page names it by `model_name`.
    out_dir: where `index.html`, `report.json` and the PNG figures go (created).
    data_dir: the real data sets (`ud_english_ewt/*.conllu` ...). Given, the
      attention and geometry analyses read UD sentences instead of the project's
      own; None looks for them (`default_data_dir`) only for the POS probe.
    reduced: a small, fast run (`ReportSettings.reduced()`), for tests.
    progress: print progress lines.
    settings: explicit sizes (overrides `reduced`).

  Returns:
    The results (as written to `report.json`), with `files`: the paths written.

  Raises:
    FileNotFoundError: `model_dir` or an explicit `data_dir` does not exist.
    ValueError: the checkpoint is physically pruned (the analyses need every head).
  """
  start = time.perf_counter()
  settings = settings or (ReportSettings.reduced() if reduced else ReportSettings())
  timing: dict[str, float] = {}
  clock = [start]

  def log(message: str) -> None:
    if progress:
      print(f"[report {time.perf_counter() - start:6.1f}s] {message}", flush=True)

  def lap(name: str) -> None:
    now = time.perf_counter()
    timing[name] = now - clock[0]
    clock[0] = now
    log(f"{name} done ({timing[name]:.1f}s)")

  if model_dir is None:
    model_path, name = bertjax.minilm_path(), DEFAULT_MODEL
  else:
    from bertjax.hf import resolve_model_path

    model_path = resolve_model_path(model_dir)  # a directory or a hub id in the cache
    name = model_name(model_path, str(model_dir))
  explicit_data = data_dir is not None
  if explicit_data and not pathlib.Path(data_dir).is_dir():
    raise FileNotFoundError(f"data_dir={str(data_dir)!r} is not a directory")
  data_path = pathlib.Path(data_dir) if explicit_data else default_data_dir()
  ud_files = _ud_files(data_path) if data_path is not None else []
  out = pathlib.Path(out_dir)

  with utils.single_thread_blas():
    log(f"loading {name} from {model_path}")
    config, params = bertjax.from_hf(model_path)
    if config.is_pruned:
      raise ValueError(f"{model_path} is a pruned checkpoint (pruned_heads={config.pruned_heads});"
                       " the report needs every head")
    tok = bertjax.Tokenizer.from_pretrained(model_path)
    max_len = min(config.max_length, tok.model_max_length)
    own = load_sentences()
    own = [own[i] for i in _spread(len(own), settings.max_sentences)]
    own_texts = [s.text for s in own]
    if explicit_data and ud_files:
      from bertjax.data import conllu

      ud = conllu.read_conllu(ud_files[0], max_sentences=settings.max_text_sentences)
      ud = [s for s in ud if len(tok.encode_words([s.forms]).input_ids[0]) <= max_len]
      words = [list(s.forms) for s in ud]
      texts = [" ".join(w) for w in words]
      batches = _batches(tok, words=words, batch_size=settings.batch_size, max_length=max_len)
      text = {"source": "ud", "num_sentences": len(ud),
              "description": f"{len(ud)} UD English EWT sentences ({ud_files[0].name})"}
    else:
      if explicit_data:
        log(f"no ud_english_ewt/*.conllu under {data_path}; using the built-in sentences")
      texts = own_texts
      batches = _batches(tok, texts, batch_size=settings.batch_size, max_length=max_len)
      phenomena: dict[str, list[int]] = {}
      for s in own:
        row = phenomena.setdefault(s.phenomenon, [0, 0, 0])
        row[0] += 1
        row[1] += s.negated
        row[2] += s.question
      text = {"source": "builtin", "num_sentences": len(own), "phenomena": phenomena,
              "description": f"{len(own)} of the project's own sentences "
                             "(bertjax/resources/sentences.tsv)",
              "about": "A few hundred English sentences written for this project: "
                       "declaratives, questions (including negated ones), negation, long-distance "
                       "subject-verb agreement across prepositional phrases and relative clauses, "
                       "punctuation-heavy sentences, relative clauses, coordination, passives, "
                       "conditionals, comparatives, indirect questions and imperatives."}
    text["num_tokens"] = int(sum(b["attention_mask"].sum() for _, b in batches))
    lap("setup")

    log(f"negation task: fitting probes on {len(own)} sentences")
    task_results, task = fit_task(params, config, tok, own, settings, log)
    lap("task")
    log("Clark et al. attention statistics")
    clark = clark_section(params, config, tok, batches)
    lap("clark")
    log("Kovaleva et al. pattern types")
    pair_batches = _batches(tok, texts[:-1], pairs=texts[1:], batch_size=settings.batch_size,
                            max_length=max_len, truncation=True)
    patterns = pattern_section(params, config, tok, pair_batches)
    patterns["num_inputs"] = len(texts) - 1
    patterns["thresholds"] = ", ".join(
        f"{k} {v}" for k, v in dataclasses.asdict(attention.PatternThresholds()).items())
    lap("patterns")
    log(f"ablation sweeps ({config.depth * config.num_attention_heads} heads, {config.depth} "
        "layers), importance and pruning")
    abl = ablation_section(task, config, settings, log)
    lap("ablation")
    log("anisotropy")
    aniso = anisotropy_section(params, config, tok, batches, settings)
    lap("anisotropy")
    if ud_files:
      log(f"POS probe on {ud_files[0].parent}")
      pos = {"available": True, **pos_section(params, config, tok, ud_files, settings, progress)}
    else:
      from bertjax.data import fetch

      try:
        fetch.find_root(data_dir if explicit_data else None, need=["ud_english_ewt"])
        reason = f"no CoNLL-U files in {data_path}/ud_english_ewt"
      except fetch.DataNotFoundError as e:
        reason = str(e)
      pos = {"available": False, "reason": reason}
      log(f"POS probe skipped: {pos['reason']}")
    lap("pos")
    log("effective attention")
    # Longer than the head dimension, or effective attention equals raw attention.
    target = min(max(settings.passage_tokens, 2 * config.head_dim), max_len - 16)
    passages = _passages(texts, tok, target, settings.passages)
    eff = effective_section(params, config, tok, passages, clark, settings)
    lap("effective")
    log("token attribution and head patching on the negated sentences")
    attrib = attribution_section(params, config, tok, own, task, settings)
    lap("attribution")

    origin = _read_json(model_path / "config.json").get("_name_or_path")
    results = {
        "layer_numbering": LAYER_NUMBERING,
        "model": {"name": name, "path": str(model_path), "model_type": config.model_type,
                  "name_or_path": origin if isinstance(origin, str) and origin else None,
                  "layers": config.depth, "heads": config.num_attention_heads,
                  "hidden_size": config.hidden_size,
                  "parameters": int(bertjax.count_params(params))},
        "text": text, "settings": dataclasses.asdict(settings), "clark": clark,
        "patterns": patterns, "task": task_results, "ablation": abl, "anisotropy": aniso,
        "pos": pos, "effective": eff, "attribution": attrib,
        "run": {"mode": "reduced" if reduced or settings.max_sentences else "full",
                "backend": jax.default_backend(), "jax_version": jax.__version__},
    }
    figs = page.write_figures(results, out)
    lap("figures")
  timing["total_seconds"] = time.perf_counter() - start
  results["timing"] = timing
  results["run"]["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
  results["figures"] = figs
  results = utils.to_json(results, digits=6)
  # Each section's reading of its numbers, computed from the JSON as written (so a reader can
  # recompute it from report.json alone).
  results["readings"] = reading.readings(results)
  utils.write_json(out / "report.json", results)
  (out / "index.html").write_text(page.render_html(results, figs), encoding="utf-8")
  results["files"] = [str(out / "index.html"), str(out / "report.json"),
                      *(str(out / f) for f in figs.values())]
  log(f"wrote {out / 'index.html'} ({timing['total_seconds']:.1f}s)")
  return results
