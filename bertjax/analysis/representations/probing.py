"""Classifier probes trained for every layer at once.

Features are stacked on a leading layer axis, ``(layers, n, dim)``; one jitted
program ``vmap``s a single-layer training loop (Optax Adam, ``lax.scan`` over
steps inside a ``lax.while_loop`` over evaluation rounds) across that axis, so
all layers train together with identical seeds and data order. Each layer keeps
the parameters of its best held-out round (early stopping with patience), and
stops updating once its patience runs out.

Probes:
  * linear: softmax regression, loss = mean cross-entropy + l2/2 * ||W||^2
    (biases unpenalised). This is scikit-learn's ``LogisticRegression`` objective
    divided by ``C * n``, i.e. ``C = 1 / (l2 * n)``.
  * mlp: one ReLU hidden layer, same L2 on both weight matrices.
  * scalar mix (Tenney et al. 2019): ``gamma * sum_l softmax(s)_l h_l`` feeding
    one linear or MLP probe; a single probe over all layers.

Also: edge-probing features for (head, dependent) pairs, control tasks and
selectivity (Hewitt & Liang 2019).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Hashable, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax.utils import flat_kwargs

PROBE_KINDS = ("linear", "mlp")


# ----------------------------------------------------------------------------
# Generic layer-wise trainer


class LayerModel(Protocol):
  """A hashable model description for ``fit_layerwise`` (one layer's probe)."""

  def init(self, key: jax.Array, x: jax.Array, t: Any) -> Any:
    """The parameters of one layer's model for inputs `x` and targets `t`, from `key`."""
    ...

  def loss(self, params: Any, x: jax.Array, t: Any) -> jax.Array:
    """The scalar training loss of `params` on (`x`, `t`), regularisation included."""
    ...

  def score(self, params: Any, x: jax.Array, t: Any) -> jax.Array:
    """The scalar held-out score of `params` on (`x`, `t`) (higher is better)."""
    ...


@dataclasses.dataclass(frozen=True)
class FitConfig:
  """How a probe is fitted (the same for every layer): optimisation and early stopping.

  Attributes:
    learning_rate: Adam step size.
    max_steps: upper bound on optimisation steps (rounded up to ``eval_every``).
    batch_size: examples per step; None for full-batch training.
    eval_every: steps between held-out evaluations (one "round").
    patience: rounds without held-out improvement before a layer stops; None never
      stops early. Ignored without a held-out set (the last parameters are kept).
    seed: seeds initialisation and mini-batch order (the same for every layer).
  """

  learning_rate: float = 1e-2
  max_steps: int = 1000
  batch_size: int | None = None
  eval_every: int = 50
  patience: int | None = 5
  seed: int = 0

  def __post_init__(self):
    if not self.learning_rate > 0:
      raise ValueError(f"{self.learning_rate=} must be positive")
    if self.max_steps < 1:
      raise ValueError(f"{self.max_steps=} must be >= 1")
    if self.eval_every < 1:
      raise ValueError(f"{self.eval_every=} must be >= 1")
    if self.batch_size is not None and self.batch_size < 1:
      raise ValueError(f"{self.batch_size=} must be >= 1 or None")
    if self.patience is not None and self.patience < 1:
      raise ValueError(f"{self.patience=} must be >= 1 or None")


@dataclasses.dataclass
class LayerwiseFit:
  """What ``fit_layerwise`` returns; every array has a leading layer axis.

  Attributes:
    params: the best parameters per layer (pytree, leaves ``(layers, ...)``).
    best_score: held-out score of those parameters ``(layers,)`` (without a
      held-out set: minus the last training loss).
    best_step: the step at which they were reached ``(layers,)``.
    train_loss: the last mini-batch loss ``(layers,)``.
    steps_run: steps each layer actually trained ``(layers,)``.
  """

  params: Any
  best_score: np.ndarray
  best_step: np.ndarray
  train_loss: np.ndarray
  steps_run: np.ndarray


def _take(tree: Any, idx: jax.Array) -> Any:
  return jax.tree.map(lambda a: a[idx], tree)


@functools.partial(jax.jit, static_argnames=("model", "train"))
def _fit_layerwise(model, train, features, targets, val_features, val_targets):
  """One compiled program: vmap of a single-layer train loop over the layer axis."""
  n = features.shape[1]
  has_val = val_features is not None
  rounds = math.ceil(train.max_steps / train.eval_every)
  patience = train.patience if (has_val and train.patience is not None) else rounds + 1
  batch = train.batch_size if train.batch_size is not None and train.batch_size < n else None
  opt = optax.adam(train.learning_rate)
  init_key, order_key = jax.random.split(jax.random.PRNGKey(train.seed))
  if batch is None:
    order = jnp.zeros((rounds, train.eval_every, 0), jnp.int32)
  else:
    # Epoch-wise shuffles, the same for every layer, so computed outside the vmap:
    # batch k of round r is order[r, k].
    epochs = math.ceil(rounds * train.eval_every * batch / n)
    perms = jax.vmap(lambda k: jax.random.permutation(k, n))(
      jax.random.split(order_key, epochs)
    )  # (epochs, n)
    order = perms.reshape(-1)[: rounds * train.eval_every * batch]
    order = order.reshape(rounds, train.eval_every, batch)

  def one_layer(x, vx):
    params = model.init(init_key, x, targets)
    opt_state = opt.init(params)

    def step(carry, idx):
      params, opt_state = carry
      if batch is None:
        xb, tb = x, targets
      else:
        xb, tb = x[idx], _take(targets, idx)
      loss, grads = jax.value_and_grad(model.loss)(params, xb, tb)
      updates, opt_state = opt.update(grads, opt_state, params)
      return (optax.apply_updates(params, updates), opt_state), loss

    def body(state):
      params, opt_state, best, best_score, best_step, since, r, _ = state
      (params, opt_state), losses = jax.lax.scan(step, (params, opt_state), order[r])
      score = model.score(params, vx, val_targets) if has_val else -losses[-1]
      improved = (score > best_score) | (not has_val)
      best = jax.tree.map(lambda a, b: jnp.where(improved, a, b), params, best)
      best_score = jnp.where(improved, score, best_score)
      best_step = jnp.where(improved, (r + 1) * train.eval_every, best_step)
      since = jnp.where(improved, 0, since + 1)
      return params, opt_state, best, best_score, best_step, since, r + 1, losses[-1]

    def cond(state):
      return (state[6] < rounds) & (state[5] < patience)

    init_score = model.score(params, vx, val_targets) if has_val else -jnp.inf
    state = (
      params,
      opt_state,
      params,
      jnp.asarray(init_score, jnp.float32),
      jnp.int32(0),
      jnp.int32(0),
      jnp.int32(0),
      jnp.float32(jnp.nan),
    )
    _, _, best, best_score, best_step, _, r, last_loss = jax.lax.while_loop(cond, body, state)
    return best, best_score, best_step, last_loss, r * train.eval_every

  in_axes = (0, 0 if has_val else None)
  return jax.vmap(one_layer, in_axes=in_axes)(features, val_features)


def fit_layerwise(
  model: LayerModel,
  features: jax.Array,
  targets: Any,
  val_features: jax.Array | None = None,
  val_targets: Any = None,
  train: FitConfig = FitConfig(),
) -> LayerwiseFit:
  """Trains one probe per layer, all layers in one jitted, vmapped program.

  Args:
    model: a hashable probe description (``init``, ``loss``, ``score``).
    features: ``(layers, n, ...)``; examples on axis 1.
    targets: a pytree whose leaves have ``n`` examples on axis 0 (shared by layers).
    val_features: held-out ``(layers, n_val, ...)``, or None.
    val_targets: held-out targets, matching ``val_features``.
    train: optimisation settings.

  Returns:
    A ``LayerwiseFit`` with per-layer best parameters and scores.
  """
  if (val_features is None) != (val_targets is None):
    raise ValueError(
      "give both val_features and val_targets, or neither "
      f"(got {val_features is None=}, {val_targets is None=})"
    )
  best, score, step, loss, steps = _fit_layerwise(
    model, train, features, targets, val_features, val_targets
  )
  return LayerwiseFit(
    best, np.asarray(score), np.asarray(step), np.asarray(loss), np.asarray(steps)
  )


# ----------------------------------------------------------------------------
# Classifier probes


@dataclasses.dataclass(frozen=True)
class ClassifierProbe:
  """Linear or one-hidden-layer MLP softmax probe (hashable; a static jit argument).

  Attributes:
    num_classes: number of labels.
    kind: ``"linear"`` or ``"mlp"``.
    hidden_dim: MLP hidden width.
    l2: weight of ``0.5 * ||W||^2`` added to the mean cross-entropy.
    scalar_mix: the features are ``(n, layers, dim)`` and are first mixed with
      learned softmax layer weights times a scalar gamma.
  """

  num_classes: int
  kind: str = "linear"
  hidden_dim: int = 256
  l2: float = 0.0
  scalar_mix: bool = False

  def __post_init__(self):
    if self.kind not in PROBE_KINDS:
      raise ValueError(f"{self.kind=} must be one of {PROBE_KINDS}")
    if self.num_classes < 2:
      raise ValueError(f"{self.num_classes=} must be >= 2")
    if self.hidden_dim < 1:
      raise ValueError(f"{self.hidden_dim=} must be >= 1")
    if self.l2 < 0:
      raise ValueError(f"{self.l2=} must be >= 0")

  def init(self, key, x, t):
    """Zeros for a linear probe; for the MLP, weights ~ N(0, 1/fan_in) and zero biases; with
    `scalar_mix`, uniform layer weights and gamma 1."""
    dim, c = x.shape[-1], self.num_classes
    params = {}
    if self.scalar_mix:
      params["mix"] = {"s": jnp.zeros((x.shape[1],)), "gamma": jnp.ones(())}
    if self.kind == "linear":
      params["w"], params["b"] = jnp.zeros((dim, c)), jnp.zeros((c,))
    else:
      k1, k2 = jax.random.split(key)
      params["w1"] = jax.random.normal(k1, (dim, self.hidden_dim)) / math.sqrt(dim)
      params["b1"] = jnp.zeros((self.hidden_dim,))
      params["w2"] = jax.random.normal(k2, (self.hidden_dim, c)) / math.sqrt(self.hidden_dim)
      params["b2"] = jnp.zeros((c,))
    return params

  def logits(self, params, x):
    """(n, classes) logits of features `x` (n, dim), or (n, layers, dim) with `scalar_mix`."""
    if self.scalar_mix:  # x: (n, layers, dim) -> (n, dim)
      w = jax.nn.softmax(params["mix"]["s"])
      x = params["mix"]["gamma"] * jnp.einsum("nld,l->nd", x, w)
    if self.kind == "linear":
      return x @ params["w"] + params["b"]  # (n, c)
    h = jax.nn.relu(x @ params["w1"] + params["b1"])  # (n, hidden)
    return h @ params["w2"] + params["b2"]

  def loss(self, params, x, t):
    """The mean cross-entropy plus `l2` / 2 times the squared weights (biases not penalised)."""
    ce = optax.softmax_cross_entropy_with_integer_labels(self.logits(params, x), t).mean()
    weights = [params["w"]] if self.kind == "linear" else [params["w1"], params["w2"]]
    return ce + 0.5 * self.l2 * sum(jnp.sum(w * w) for w in weights)

  def score(self, params, x, t):
    """The accuracy of the argmax class against the labels `t`."""
    return jnp.mean(jnp.argmax(self.logits(params, x), -1) == t)


@flat_kwargs("fit")
@dataclasses.dataclass(frozen=True)
class ProbeConfig:
  """A probe (see ``ClassifierProbe``) and how it is fitted (``fit``, a ``FitConfig``).

  ``FitConfig``'s fields may also be given flat: ``ProbeConfig(l2=1e-3, max_steps=300)``.
  """

  kind: str = "linear"
  hidden_dim: int = 256
  l2: float = 0.0
  scalar_mix: bool = False
  fit: FitConfig = FitConfig()


def _check_features(features, labels, name="features"):
  features = jnp.asarray(features, jnp.float32)
  labels = np.asarray(labels)
  if features.ndim != 3:
    raise ValueError(f"{name} must be (layers, n, dim), got shape {features.shape}")
  if labels.shape != (features.shape[1],):
    raise ValueError(
      f"labels shape {labels.shape} must be ({features.shape[1]},) to match "
      f"{name} shape {features.shape}"
    )
  if not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f"labels dtype {labels.dtype} must be integer")
  return features, jnp.asarray(labels, jnp.int32)


def _mix_input(features: jax.Array) -> jax.Array:
  return jnp.transpose(features, (1, 0, 2))[None]  # (1, n, layers, dim)


@dataclasses.dataclass
class Probe:
  """Per-layer probes with a scikit-learn-like interface.

  ``Probe(ProbeConfig(...)).fit(features, labels)`` trains one probe per layer
  (or one scalar-mix probe); ``accuracy`` returns ``(layers,)`` (``(1,)`` for a
  scalar mix).

  Attributes:
    config: the settings.
    num_classes: labels are ``0..num_classes-1``; None infers ``max(labels) + 1``.
    params: fitted per-layer parameters (leaves ``(layers, ...)``).
    fit_info: the ``LayerwiseFit`` of the last ``fit``.
  """

  config: ProbeConfig = ProbeConfig()
  num_classes: int | None = None
  params: Any = None
  fit_info: LayerwiseFit | None = None

  @property
  def model(self) -> ClassifierProbe:
    """The `ClassifierProbe` of this probe's settings (needs `num_classes`, known after `fit`)."""
    if self.num_classes is None:
      raise ValueError("num_classes is unknown before fit")
    c = self.config
    return ClassifierProbe(self.num_classes, c.kind, c.hidden_dim, c.l2, c.scalar_mix)

  def _inputs(self, features):
    return _mix_input(features) if self.config.scalar_mix else features

  def fit(self, features, labels, val_features=None, val_labels=None) -> Probe:
    """Trains on ``features (layers, n, dim)`` and int ``labels (n,)``; returns self."""
    features, labels = _check_features(features, labels)
    if self.num_classes is None:
      self.num_classes = max(int(labels.max()) + 1, 2)
    if int(labels.min()) < 0 or int(labels.max()) >= self.num_classes:
      raise ValueError(
        f"labels span [{int(labels.min())}, {int(labels.max())}], outside [0, {self.num_classes=})"
      )
    vt = None
    if val_features is not None:
      val_features, vt = _check_features(val_features, val_labels, "val_features")
      if val_features.shape[0] != features.shape[0] or val_features.shape[2] != features.shape[2]:
        raise ValueError(
          f"val_features shape {val_features.shape} does not match features "
          f"shape {features.shape} in layers and dim"
        )
      val_features = self._inputs(val_features)
    self.fit_info = fit_layerwise(
      self.model, self._inputs(features), labels, val_features, vt, self.config.fit
    )
    self.params = self.fit_info.params
    return self

  def logits(self, features) -> jax.Array:
    """Per-layer logits ``(layers, n, num_classes)``."""
    if self.params is None:
      raise ValueError("call fit before predict")
    features = jnp.asarray(features, jnp.float32)
    if features.ndim != 3:
      raise ValueError(f"features must be (layers, n, dim), got shape {features.shape}")
    return _logits(self.model, self.params, self._inputs(features))

  def predict(self, features) -> np.ndarray:
    """Per-layer predicted labels ``(layers, n)``."""
    return np.asarray(jnp.argmax(self.logits(features), -1))

  def accuracy(self, features, labels) -> np.ndarray:
    """Per-layer accuracy ``(layers,)`` in [0, 1]."""
    features, labels = _check_features(features, labels)
    return np.mean(self.predict(features) == np.asarray(labels)[None], axis=1)

  def mix_weights(self) -> tuple[np.ndarray, float]:
    """For a scalar-mix probe: the softmax layer weights ``(layers,)`` and gamma."""
    if not self.config.scalar_mix or self.params is None:
      raise ValueError("mix_weights needs a fitted probe with scalar_mix=True")
    mix = jax.tree.map(lambda a: a[0], self.params["mix"])
    return np.asarray(jax.nn.softmax(mix["s"])), float(mix["gamma"])


@functools.partial(jax.jit, static_argnames=("model",))
def _logits(model, params, features):
  return jax.vmap(model.logits)(params, features)


def fit_probe(
  features,
  labels,
  val_features=None,
  val_labels=None,
  *,
  config: ProbeConfig = ProbeConfig(),
  num_classes: int | None = None,
) -> Probe:
  """Fits per-layer probes; shorthand for ``Probe(config, num_classes).fit(...)``."""
  return Probe(config, num_classes).fit(features, labels, val_features, val_labels)


def split_indices(
  n: int, val_fraction: float = 0.1, seed: int = 0, groups: Sequence[Hashable] | None = None
) -> tuple[np.ndarray, np.ndarray]:
  """A seeded train/held-out split of ``n`` examples.

  Args:
    n: number of examples.
    val_fraction: share of examples (or groups) held out, in (0, 1).
    seed: NumPy seed.
    groups: optional group id per example (e.g. sentence index); whole groups go
      to one side, so words of a held-out sentence are never trained on.

  Returns:
    ``(train_idx, val_idx)`` sorted int arrays.
  """
  if not 0 < val_fraction < 1:
    raise ValueError(f"{val_fraction=} must be in (0, 1)")
  rng = np.random.default_rng(seed)
  if groups is None:
    held = np.zeros(n, bool)
    held[rng.permutation(n)[: max(1, round(val_fraction * n))]] = True
  else:
    groups = np.asarray(groups)
    if groups.shape != (n,):
      raise ValueError(f"groups shape {groups.shape} must be ({n},)")
    uniq = np.unique(groups)
    chosen = rng.permutation(uniq)[: max(1, round(val_fraction * len(uniq)))]
    held = np.isin(groups, chosen)
  return np.flatnonzero(~held), np.flatnonzero(held)


# ----------------------------------------------------------------------------
# From subword hidden states to word features

POOLINGS = ("first", "mean", "last")


@functools.partial(jax.jit, static_argnames=("num_words", "reduce"))
def pool_words(hidden_states, word_ids, num_words, reduce):
  """The jitted core of `pool_subwords` for a static `num_words`: each word's subword states
  (`word_ids` -1 for none) reduced by `reduce` ("first", "mean" or "last"). Returns
  (layers, batch, num_words, hidden) vectors, zero for an absent word, and the (batch,
  num_words) mask of the words present."""
  seq = hidden_states.shape[2]
  seg = jnp.where(word_ids < 0, num_words, word_ids)  # (batch, seq); -1 -> dump segment
  pos = jnp.broadcast_to(jnp.arange(seq), word_ids.shape)

  def one(h, s, p):  # h (layers, seq, hidden), s (seq,), p (seq,)
    count = jax.ops.segment_sum(jnp.ones(seq), s, num_words + 1)[:num_words]
    if reduce == "mean":
      total = jax.vmap(lambda x: jax.ops.segment_sum(x, s, num_words + 1))(h)[:, :num_words]
      return total / jnp.maximum(count, 1.0)[None, :, None], count > 0
    pick = (
      jax.ops.segment_min(p, s, num_words + 1)
      if reduce == "first"
      else jax.ops.segment_max(p, s, num_words + 1)
    )[:num_words]
    pick = jnp.clip(pick, 0, seq - 1)
    return h[:, pick] * (count > 0)[None, :, None], count > 0

  pooled, mask = jax.vmap(one, in_axes=(1, 0, 0), out_axes=(1, 0))(hidden_states, seg, pos)
  return pooled, mask


def pool_subwords(
  hidden_states, word_ids, reduce: str = "first", num_words: int | None = None
) -> tuple[jax.Array, np.ndarray]:
  """Pools subword hidden states into word vectors.

  Args:
    hidden_states: ``(layers, batch, seq, hidden)``, e.g. ``forward(...).hidden_states``.
    word_ids: int ``(batch, seq)``: the word each subword belongs to (0-based within
      its sentence), -1 for special tokens and padding.
    reduce: ``"first"`` (first subword), ``"mean"`` or ``"last"``.
    num_words: words per sentence to allocate; None uses ``max(word_ids) + 1``.

  Returns:
    ``(pooled (layers, batch, num_words, hidden), mask (batch, num_words))``;
    words with no subword are zero and masked out.
  """
  if reduce not in POOLINGS:
    raise ValueError(f"{reduce=} must be one of {POOLINGS}")
  hidden_states = jnp.asarray(hidden_states)
  word_ids = np.asarray(word_ids)
  if hidden_states.ndim != 4 or word_ids.shape != hidden_states.shape[1:3]:
    raise ValueError(
      f"word_ids shape {word_ids.shape} must be (batch, seq) of hidden_states "
      f"shape {hidden_states.shape} (layers, batch, seq, hidden)"
    )
  if num_words is None:
    num_words = max(int(word_ids.max()) + 1, 1)
  elif word_ids.max() >= num_words:
    raise ValueError(f"word_ids reach {int(word_ids.max())}, outside {num_words=}")
  pooled, mask = pool_words(hidden_states, jnp.asarray(word_ids, jnp.int32), num_words, reduce)
  return pooled, np.asarray(mask)


def flatten_words(pooled, mask) -> jax.Array:
  """Real words of all sentences in order: ``(layers, batch, w, hidden)`` -> ``(layers, n, hidden)``."""
  mask = np.asarray(mask, bool)
  b, w = np.nonzero(mask)
  return jnp.asarray(pooled)[:, b, w]


# ----------------------------------------------------------------------------
# Edge probing


def dependency_edges(
  sentences: Sequence[Any],
  relation_ids: Sequence[np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(head, dependent) word pairs of every non-root word, as flat corpus indices.

  Args:
    sentences: objects with ``heads`` (1-based, 0 = root), e.g. ``conllu.Sentence``.
    relation_ids: per sentence, int relation label per word (e.g. from
      ``LabelVocab.encode(sentence.deprels)``); None gives labels of -1.

  Returns:
    ``(head_index, dep_index, labels)``, each ``(num_edges,)``, indices into the
    words of all sentences concatenated in order.
  """
  heads_out, deps_out, labels_out = [], [], []
  offset = 0
  for s_idx, sent in enumerate(sentences):
    heads = np.asarray(sent.heads, np.int64)
    dep = np.flatnonzero(heads > 0)
    heads_out.append(offset + heads[dep] - 1)
    deps_out.append(offset + dep)
    if relation_ids is None:
      labels_out.append(np.full(len(dep), -1, np.int64))
    else:
      rel = np.asarray(relation_ids[s_idx])
      if rel.shape != heads.shape:
        raise ValueError(f"relation_ids[{s_idx}] shape {rel.shape} must be {heads.shape}")
      labels_out.append(rel[dep])
    offset += len(heads)
  cat = lambda xs: np.concatenate(xs).astype(np.int32) if xs else np.zeros(0, np.int32)
  return cat(heads_out), cat(deps_out), cat(labels_out)


def edge_features(features, head_index, dep_index) -> jax.Array:
  """Pair features ``[h_head; h_dep]``: ``(layers, n, dim)`` -> ``(layers, edges, 2 dim)``."""
  features = jnp.asarray(features)
  head_index, dep_index = np.asarray(head_index), np.asarray(dep_index)
  if features.ndim != 3:
    raise ValueError(f"features must be (layers, n, dim), got shape {features.shape}")
  if head_index.shape != dep_index.shape or head_index.ndim != 1:
    raise ValueError(
      f"head_index {head_index.shape} and dep_index {dep_index.shape} must be equal 1-d shapes"
    )
  n = features.shape[1]
  for name, idx in (("head_index", head_index), ("dep_index", dep_index)):
    if idx.size and (idx.min() < 0 or idx.max() >= n):
      raise ValueError(f"{name} spans [{idx.min()}, {idx.max()}], outside [0, {n})")
  return jnp.concatenate([features[:, head_index], features[:, dep_index]], axis=-1)


# ----------------------------------------------------------------------------
# Control tasks (Hewitt & Liang 2019)


def control_task_mapping(
  word_types: Sequence[Hashable], labels, num_classes: int | None = None, seed: int = 0
) -> dict[Hashable, int]:
  """Maps each word type to a random label drawn from the empirical label distribution.

  The mapping depends only on the set of types, the label counts and the seed
  (types are sorted before drawing), so it is reproducible and the same type
  always gets the same control label.

  Args:
    word_types: the type (e.g. lower-cased form) of every example ``(n,)``.
    labels: the real task labels ``(n,)``, giving the empirical distribution.
    num_classes: label count; None infers ``max(labels) + 1``.
    seed: NumPy seed.

  Returns:
    ``{type: control_label}``.
  """
  labels = np.asarray(labels)
  if len(word_types) != len(labels):
    raise ValueError(f"{len(word_types)=} must equal {len(labels)=}")
  if labels.size == 0:
    raise ValueError("labels is empty")
  c = int(labels.max()) + 1 if num_classes is None else num_classes
  if labels.min() < 0 or labels.max() >= c:
    raise ValueError(f"labels span [{labels.min()}, {labels.max()}], outside [0, {c})")
  probs = np.bincount(labels, minlength=c) / labels.size
  types = sorted(set(word_types), key=lambda t: (type(t).__name__, t))
  drawn = np.random.default_rng(seed).choice(c, size=len(types), p=probs)
  return {t: int(d) for t, d in zip(types, drawn)}


def control_labels(word_types: Sequence[Hashable], mapping: dict[Hashable, int]) -> np.ndarray:
  """Applies a control mapping: int ``(n,)``; an unmapped type raises, naming it."""
  missing = [t for t in set(word_types) if t not in mapping]
  if missing:
    raise KeyError(f"{len(missing)} word types have no control label, e.g. {missing[:3]}")
  return np.asarray([mapping[t] for t in word_types], np.int32)


def selectivity(task_accuracy, control_accuracy) -> np.ndarray:
  """Hewitt & Liang selectivity per layer: task accuracy minus control accuracy."""
  task, control = np.asarray(task_accuracy, float), np.asarray(control_accuracy, float)
  if task.shape != control.shape:
    raise ValueError(f"task_accuracy shape {task.shape} != control_accuracy shape {control.shape}")
  return task - control
