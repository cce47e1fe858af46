"""Outlier dimensions, massive activations and their cost to int8, for any family.

* **Outlier dimensions** (Kovaleva et al. 2021, "BERT Busters: Outlier Dimensions that Disrupt
  Transformers"; Puccetti et al. 2022, "Outlier Dimensions that Disrupt Transformers Are
  Driven by Frequency"). A dimension i of layer l's hidden state is an outlier when its mean
  activation over the real tokens lies at least `sigmas` (3) standard deviations from the
  mean of those per-dimension means (over the hidden dimensions of that layer), and an
  outlier dimension of the model is one that is an outlier in at least `min_fraction` (25%)
  of the layers -- Puccetti et al.'s reading of Kovaleva et al.'s criterion, on block outputs
  (`hidden_states[1:]`). `disable_dimensions` is Kovaleva et al.'s test of what they carry:
  the scale and bias of every LayerNorm (and RMSNorm) set to zero at those dimensions, so
  no block output carries them, to be scored with any loss: a probe's accuracy
  (`probe_without_dimensions`) or the masked-LM loss (`mlm_loss_without_dimensions`, with the
  checkpoint's head or one fitted to the frozen body, `bertjax.training.mlm_head`), each set
  against as many random dimensions (`ablation_sets`).
* **Massive activations** (Sun et al. 2024, "Massive Activations in Large Language
  Models"): hidden-state entries whose magnitude exceeds both `threshold` (100) and `ratio`
  (1000) times the median magnitude of that layer's hidden state; reported per layer with
  where they sit (dimension, position, token id).
* **int8 error by layer**: each block output of the dynamic int8 model
  (`config.quantize="int8"`, per-token activations and per-channel weights) against the
  float32 one, relative L2 error per layer, beside the layer's largest activation magnitude
  (how far an outlier stretches a per-token quantisation step).

The attention-sink share of each head (its mass on [CLS]/<s> and [SEP]) is
`attention.clark_statistics`; its mean over heads and layers, intact and with dimensions
disabled, is `with_and_without` of `attention.statistics.special_mass_by_layer`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from bertjax import stats
from bertjax.analysis.batching import as_batch
from bertjax.model.config import BertConfig
from bertjax.model.forward import forward

Params = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class OutlierDimensions:
  """Per-layer statistics of the block outputs and the outlier dimensions they give.

  Attributes:
    mean: (L, H) mean activation of each dimension over the real tokens.
    z: (L, H) `(mean - mean over dims) / std over dims`, per layer.
    is_outlier: (L, H) `|z| >= sigmas`.
    dims: the model's outlier dimensions (outliers in >= `min_fraction` of the layers).
    tokens: how many real tokens were read.
  """

  mean: np.ndarray
  z: np.ndarray
  is_outlier: np.ndarray
  dims: tuple[int, ...]
  tokens: int

  def summary(self) -> dict[str, Any]:
    """The census as results: `z`, `outliers_per_layer` (L,), `dims` (a list) and `max_abs_z`,
    each outlier dimension's largest |z| over the layers."""
    dims = list(self.dims)
    return {
      "z": self.z,
      "outliers_per_layer": self.is_outlier.sum(1),
      "dims": dims,
      "max_abs_z": [float(np.abs(self.z[:, d]).max()) for d in dims],
    }


@dataclasses.dataclass(frozen=True)
class MassiveActivations:
  """Per layer: the largest magnitude, the median magnitude, and the massive entries.

  Attributes:
    max_abs: (L,) the largest |activation| of each block output.
    median_abs: (L,) the median |activation| (over real tokens and dimensions).
    count: (L,) how many entries are massive.
    where: per layer, a list of (dimension, position, token id, value) of its massive
      entries in the first batch that has any (at most 20 per layer).
  """

  max_abs: np.ndarray
  median_abs: np.ndarray
  count: np.ndarray
  where: list[list[tuple[int, int, int, float]]]

  def summary(self) -> dict[str, Any]:
    """As results: `count`, `max_abs`, `median_abs`, `where` and `dims`, the sorted
    dimensions of the entries listed in `where` (Sun et al.: massive activations sit at a few
    fixed dimensions)."""
    return {
      "count": self.count,
      "max_abs": self.max_abs,
      "median_abs": self.median_abs,
      "dims": sorted({w[0] for layer in self.where for w in layer}),
      "where": self.where,
    }


def _hidden(params, config, batch) -> tuple[np.ndarray, np.ndarray]:
  """Block outputs (L, B, T, H) float64 and the real-token mask (B, T)."""
  b = as_batch(batch)
  out = forward(
    params,
    config,
    b["input_ids"],
    b["attention_mask"],
    b["token_type_ids"],
    output_hidden_states=True,
  )
  return np.asarray(out.hidden_states[1:], np.float64), np.asarray(b["attention_mask"]) > 0


def outlier_dimensions(
  params: Params,
  config: BertConfig,
  batches: Iterable,
  *,
  sigmas: float = 3.0,
  min_fraction: float = 0.25,
) -> OutlierDimensions:
  """The outlier dimensions of the block outputs over `batches` (module docstring)."""
  total, tokens = 0.0, 0
  for batch in batches:
    h, real = _hidden(params, config, batch)
    total = total + h[:, real].sum(1)  # (L, H)
    tokens += int(real.sum())
  if not tokens:
    raise ValueError("outlier_dimensions needs at least one real token; the batches had none")
  mean = total / tokens
  z = (mean - mean.mean(-1, keepdims=True)) / mean.std(-1, keepdims=True)
  is_outlier = np.abs(z) >= sigmas
  dims = tuple(int(i) for i in np.flatnonzero(is_outlier.mean(0) >= min_fraction))
  return OutlierDimensions(mean, z, is_outlier, dims, tokens)


def massive_activations(
  params: Params,
  config: BertConfig,
  batches: Iterable,
  *,
  threshold: float = 100.0,
  ratio: float = 1000.0,
) -> MassiveActivations:
  """Sun et al.'s massive activations of every block output over `batches`.

  The median is per layer over every real token's dimensions of all batches (kept in
  memory: L x tokens x H floats)."""
  mags, seen = [], []
  for batch in batches:
    h, real = _hidden(params, config, batch)
    mags.append(np.abs(h[:, real]))  # (L, n, H)
    seen.append((np.asarray(as_batch(batch)["input_ids"]), real, np.abs(h)))
  if not mags:
    raise ValueError("massive_activations needs at least one batch")
  allm = np.concatenate(mags, 1)
  max_abs, median = allm.max((1, 2)), np.median(allm.reshape(allm.shape[0], -1), 1)
  bound = np.maximum(threshold, ratio * median)  # (L,)
  count = (allm > bound[:, None, None]).sum((1, 2))
  where: list[list[tuple[int, int, int, float]]] = [[] for _ in range(len(bound))]
  for ids, real, mag in seen:
    for layer in range(len(bound)):
      if where[layer] or not count[layer]:
        continue
      hit = np.argwhere((mag[layer] > bound[layer]) & real[..., None])
      where[layer] = [
        (int(d), int(t), int(ids[r, t]), float(mag[layer, r, t, d])) for r, t, d in hit[:20]
      ]
  return MassiveActivations(max_abs, median, count, where)


def disable_dimensions(params: Params, config: BertConfig, dims) -> Params:
  """Kovaleva et al.'s ablation: every norm's scale and bias zero at `dims` (the embedding
  norm, each block's norms, a final norm and the MLM head's transform norm alike)."""
  dims = np.asarray(sorted({int(d) for d in dims}), np.int32)
  if dims.size and (dims.min() < 0 or dims.max() >= config.hidden_size):
    raise ValueError(f"dims must be in [0, {config.hidden_size}); got {dims.tolist()}")
  keep = np.ones(config.hidden_size, np.float32)
  keep[dims] = 0

  def visit(tree, in_norm=False):
    if isinstance(tree, dict):
      return {k: visit(v, in_norm or "norm" in k.lower()) for k, v in tree.items()}
    if in_norm and tree.shape[-1] == config.hidden_size:
      return tree * keep.astype(tree.dtype)
    return tree

  return visit(params)


def ablation_sets(dims, hidden_size: int, draws: int, seed: int = 0) -> dict[str, Any]:
  """Kovaleva et al.'s ablation and its control, as `dims_sets` for `probe_without_dimensions`
  and `mlm_loss_without_dimensions`: "outliers" -> `dims`, and "random_0", "random_1", ... ->
  `draws` draws of as many other dimensions (each without repeats), so that disabling the
  outliers is set against disabling as many dimensions that are not. Empty when `dims` is."""
  if not len(dims):
    return {}
  rng = np.random.default_rng(seed)
  others = np.setdiff1d(np.arange(hidden_size), dims)
  randoms = {f"random_{i}": rng.choice(others, len(dims), replace=False) for i in range(draws)}
  return {"outliers": dims} | randoms


def int8_error_by_layer(params: Params, config: BertConfig, batches: Iterable) -> dict:
  """Each block output of the int8 model against the float32 one, over real tokens.

  Returns:
    `relative_error` (L,) `||h_int8 - h||_2 / ||h||_2` over the real tokens of all batches,
    `max_abs` (L,) the float model's largest |activation| per layer, and their Spearman
    correlation across layers (`spearman`)."""
  from scipy.stats import spearmanr

  q_config = config.replace(quantize="int8")
  diff = ref = 0.0
  max_abs = None
  for batch in batches:
    h, real = _hidden(params, config, batch)
    hq, _ = _hidden(params, q_config, batch)
    diff = diff + ((hq - h)[:, real] ** 2).sum((1, 2))
    ref = ref + (h[:, real] ** 2).sum((1, 2))
    m = np.abs(h[:, real]).max((1, 2))
    max_abs = m if max_abs is None else np.maximum(max_abs, m)
  if max_abs is None:
    raise ValueError("int8_error_by_layer needs at least one batch")
  rel = np.sqrt(diff / ref)
  rho = float(spearmanr(rel, max_abs).statistic) if len(rel) > 2 else float("nan")
  return {"relative_error": rel, "max_abs": max_abs, "spearman": rho}


# What outlier dimensions do (Puccetti et al. 2022; Kovaleva et al. 2021) -----------------


def token_frequencies(tokenizer, paths) -> np.ndarray:
  """(vocab,) how often the tokenizer emits each id over the non-empty lines of the text
  files `paths` (special tokens counted 0)."""
  counts = np.zeros(tokenizer.vocab_size, np.int64)
  for path in paths:
    with open(path, encoding="utf-8") as f:
      lines = [ln.strip() for ln in f if ln.strip()]
    for i in range(0, len(lines), 256):
      enc = tokenizer.encode(lines[i : i + 256], max_length=512, truncation=True)
      ids = np.asarray(enc.input_ids)[np.asarray(enc.attention_mask) > 0]
      counts += np.bincount(ids, minlength=tokenizer.vocab_size)[: tokenizer.vocab_size]
  counts[list(tokenizer.special_ids)] = 0
  return counts


def dimension_activations(
  params: Params, config: BertConfig, batches: Iterable, dims, special_ids
) -> tuple[np.ndarray, np.ndarray]:
  """`(acts (L, n, k), ids (n,))`: every block's output at the dimensions `dims` (k of them)
  for each of the n real tokens that are not `special_ids`, and those tokens' ids."""
  acts, ids = [], []
  for batch in batches:
    b = as_batch(batch)
    out = forward(
      params,
      config,
      b["input_ids"],
      b.get("attention_mask"),
      b.get("token_type_ids"),
      output_hidden_states=True,
    )
    h = np.asarray(out.hidden_states[1:])[..., list(dims)]  # (L, B, T, k)
    token_ids = np.asarray(b["input_ids"])
    real = (
      np.ones(token_ids.shape, bool)
      if "attention_mask" not in b
      else np.asarray(b["attention_mask"]) > 0
    )
    keep = real & ~np.isin(token_ids, list(special_ids))
    acts.append(h[:, keep])
    ids.append(token_ids[keep])
  return np.concatenate(acts, 1), np.concatenate(ids)


def frequency_correlation(acts, ids, counts, census: OutlierDimensions, dims) -> dict[str, Any]:
  """Per outlier dimension, the Spearman correlation over token types between the type's mean
  activation (signed towards the dimension's outlying side, averaged over the layers where it
  outlies) and log(1 + its count).

  Args:
    acts, ids: `dimension_activations` at `dims`.
    counts: (vocab,) token counts (`token_frequencies`).
    census: the `outlier_dimensions` result that flagged `dims`.
    dims: the dimensions, in the order of `acts`' last axis.

  Returns:
    `rho` (per dimension), `types`, `per_type` (types, k) and `log_count` (types,).
  """
  types, inverse = np.unique(ids, return_inverse=True)
  per_type = np.zeros((len(types), len(dims)))
  for j, d in enumerate(dims):
    layers = np.flatnonzero(census.is_outlier[:, d])
    if layers.size == 0:
      raise ValueError(f"dimension {d} outlies in no layer of the census")
    side = np.sign(census.z[layers, d].mean())
    value = side * acts[layers, :, j].mean(0)  # (n,)
    per_type[:, j] = np.bincount(inverse, value) / np.bincount(inverse)
  log_count = np.log1p(counts[types])
  rho = [stats.spearman(per_type[:, j], log_count) for j in range(len(dims))]
  return {"rho": rho, "types": len(types), "per_type": per_type, "log_count": log_count}


def with_and_without(
  params: Params, config: BertConfig, dims, measure: Callable[[Params], float]
) -> dict[str, float]:
  """`measure(params)` of the model "intact" and with `dims` disabled ("disabled", by
  `disable_dimensions`; NaN when `dims` is empty). Puccetti et al. ask this of the heads'
  attention mass on [CLS] and [SEP] (`attention.statistics.special_mass_by_layer`): do the
  outlier dimensions drive the focus on special tokens?"""
  return {
    "intact": float(measure(params)),
    "disabled": float(measure(disable_dimensions(params, config, dims)))
    if len(dims)
    else float("nan"),
  }


def mean_frequency_correlation(per_type, log_count):
  """The mean over the dimensions of `frequency_correlation`'s `rho`, from its `per_type`
  (..., types, k) and `log_count` (..., types): Puccetti et al.'s claim in one number, a
  function of the token types so that it can be bootstrapped over them (`stats.bootstrap_ci`,
  vectorized: leading axes are resamples). A float for unbatched arrays."""
  per_type, log_count = np.asarray(per_type), np.asarray(log_count)
  rho = stats.spearman_rows(np.swapaxes(per_type, -1, -2), log_count[..., None, :])
  mean = np.mean(rho, -1)
  return float(mean) if mean.ndim == 0 else mean


def probe_without_dimensions(
  params: Params, config: BertConfig, tokenizer, sentences, dims_sets, seed: int = 0
) -> dict[str, Any]:
  """Whether a UPOS probe fitted on the intact model still reads the tags with dimensions
  disabled (`disable_dimensions`), at the middle and the last layer.

  The probe (linear, standardised features) is fitted on the intact model's word features of
  half the sentences (10% of them for early stopping) and scored on the other half, intact
  and with each set of `dims_sets` disabled.

  Args:
    params, config, tokenizer: the model.
    sentences: `bertjax.data.conllu` sentences (forms and UPOS tags).
    dims_sets: name -> dimensions to disable.
    seed: the split's seed.

  Returns:
    `layers`, `tags`; `correct`: condition ("intact" and each name) -> (2, test words) int8
    marks; `accuracy`: condition -> (2,); `test_words`: how many words it is scored on.
  """
  from bertjax.analysis.representations import features, probing

  tags = sorted({u for s in sentences for u in s.upos})
  labels = np.asarray([tags.index(u) for s in sentences for u in s.upos])
  layers = [config.depth // 2, config.depth]

  def feats(p):
    wf = features.extract_word_features(p, config, tokenizer, sentences, progress=False)
    return np.asarray(wf.features, np.float32)[layers], wf.sentence_index

  intact, groups = feats(params)
  train, test = probing.split_indices(len(labels), 0.5, seed, groups=groups)
  fit, val = probing.split_indices(len(train), 0.1, seed, groups=groups[train])
  mu, sd = intact[:, train].mean(1, keepdims=True), intact[:, train].std(1, keepdims=True) + 1e-6
  norm = lambda x: (x - mu) / sd
  probe = probing.fit_probe(
    norm(intact)[:, train[fit]],
    labels[train[fit]],
    norm(intact)[:, train[val]],
    labels[train[val]],
    config=probing.ProbeConfig(l2=1e-4),
    num_classes=len(tags),
  )
  right = {"intact": probe.predict(norm(intact)[:, test]) == labels[test]}
  for name, dims in dims_sets.items():
    x, _ = feats(disable_dimensions(params, config, dims))
    right[name] = probe.predict(norm(x)[:, test]) == labels[test]
  return {
    "layers": layers,
    "tags": len(tags),
    "correct": {k: v.astype(np.int8) for k, v in right.items()},
    "accuracy": {k: v.mean(1) for k, v in right.items()},
    "test_words": len(test),
  }


def ablation_costs(correct) -> np.ndarray:
  """(..., conditions - 1) the accuracy each disabled set costs against the intact model, from
  per-word marks (..., words, conditions) whose first condition is "intact" (e.g. the stacked
  `probe_without_dimensions` `correct` of one layer); leading axes, such as resamples for a
  vectorised `stats.bootstrap_ci`, are kept."""
  acc = np.mean(correct, -2)
  return acc[..., :1] - acc[..., 1:]


def mlm_loss_without_dimensions(
  params: Params, config: BertConfig, masked, dims_sets
) -> dict[str, Any]:
  """Kovaleva et al.'s measure: the masked-LM loss intact and with each set of `dims_sets`
  disabled (`disable_dimensions`, the MLM head's transform norm included).

  Args:
    params, config: a model with an "mlm" head (the checkpoint's, or one fitted to the frozen
      body by `bertjax.training.mlm_head.fit_mlm_head`).
    masked: `mlm_head.mask_batches`' output, the same predictions for every condition.
    dims_sets: name -> dimensions to disable.

  Returns:
    "loss" and "accuracy": condition ("intact" and each name) -> mean over the predictions;
    "predictions": their count.
  """
  from bertjax.training import mlm_head

  got = {"intact": mlm_head.mlm_loss(params, config, masked)}
  for name, dims in dims_sets.items():
    got[name] = mlm_head.mlm_loss(disable_dimensions(params, config, dims), config, masked)
  return {
    "loss": {k: v["loss"] for k, v in got.items()},
    "accuracy": {k: v["accuracy"] for k, v in got.items()},
    "predictions": got["intact"]["predictions"],
  }
