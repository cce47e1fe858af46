"""Knowledge distillation as an objective: DistilBERT's loss and TinyBERT's layer-wise losses.

`Distillation(teacher_config, teacher_params, ...)` is one component (see
`training.objectives`) whose terms are, for a student trained on masked batches:

* ``"distill_ce"`` (Sanh et al. 2019): soft-target cross-entropy at the masked
  positions, ``-T^2 sum_v softmax(z_t / T)_v log softmax(z_s / T)_v`` (the KL of
  DistilBERT up to the teacher's entropy, a constant), weight ``alpha_ce`` (5);
* ``"mlm"``: the student's own masked-LM loss, weight ``alpha_mlm`` (2);
* ``"cos"``: ``1 - cos(h_s, h_t)`` of the final hidden states at real tokens, weight
  ``alpha_cos`` (1);
* with ``tinybert=True`` (Jiao et al. 2020), ``"hidden"``: the mean squared error
  between the student's hidden states (embeddings and every layer m) through a learned
  projection ``W_h`` (student H -> teacher H, ``params["distill_proj"]``) and the teacher's
  at layer ``g(m) = m * L_t / L_s``, averaged over hidden units, summed over layers, per
  real token; ``"attn"``: the mean squared error between the student's attention
  probabilities at layer m and the teacher's at ``g(m)`` (TinyBERT's code compares
  pre-softmax scores; the model exposes probabilities), summed over layers; weights
  ``alpha_hidden``, ``alpha_attn`` (1). The attention error follows the paper's
  definition, ``(1/h) sum_i MSE(A_i^S, A_i^T)`` with ``A`` the ``l x l`` map over the
  ``l`` real tokens: it is averaged over heads (the head counts must agree), over the
  real key columns of each real query row, and over the real query rows (weighted by
  token, as the other per-token terms). Padded keys and padded query rows are left
  out, so the term does not depend on how far a batch is padded. TinyBERT's released
  code (``general_distill.py`` / ``task_distill.py``) zeroes the masked scores and
  takes ``MSELoss`` over the whole padded ``(B, h, T, T)`` block, which divides by
  every padded column and row: its value shrinks about as 1 / T with padding.

Only measured quantities get an ``<term>_accuracy``: MLM accuracy, and for
``"distill_ce"`` the agreement of the student's top prediction with the teacher's;
``"cos"``, ``"hidden"`` and ``"attn"`` have none.

The teacher is frozen: its parameters live in the objective (not in the train state, so
neither the optimizer nor weight decay touches them) and its outputs are under
``stop_gradient``. `student_from_teacher` builds DistilBERT's initialisation: the
teacher with every other layer (`default_student_layers`, which for TinyBERT's layer map
picks a depth that divides the teacher's); `shared_student_from_teacher` an ALBERT-style
student whose one shared layer is a chosen teacher layer.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax

from bertjax.model.config import BertConfig
from bertjax.model.forward import forward, init
from bertjax.model.heads import head_logits, mlm_logits
from bertjax.model.layers import Params
from bertjax.training import losses
from bertjax.training.objective_base import Context, Objective


def student_from_teacher(
  teacher_config: BertConfig, teacher_params: Params, layers: tuple[int, ...] | None = None
) -> tuple[BertConfig, Params]:
  """A student initialised from a teacher's layers (DistilBERT: every other layer).

  Args:
    teacher_config: the teacher's architecture (not ALBERT-style shared layers).
    teacher_params: its parameters (embeddings, pooler and heads are copied).
    layers: the teacher layers to keep, in order; default ``(0, 2, 4, ...)``
      (`default_student_layers`).

  Returns:
    ``(student_config, student_params)``.
  """
  if teacher_config.num_param_layers != teacher_config.num_hidden_layers:
    raise ValueError(
      f"a {teacher_config.model_type} teacher with shared layers "
      f"(num_param_layers={teacher_config.num_param_layers}) cannot seed a "
      "student layer by layer"
    )
  n = teacher_config.num_hidden_layers
  layers = default_student_layers(teacher_config) if layers is None else tuple(layers)
  if not layers or any(not 0 <= i < n for i in layers):
    raise ValueError(f"{layers=} must be a non-empty tuple of teacher layers in [0, {n})")
  if teacher_config.is_pruned:
    raise ValueError("a pruned teacher cannot seed a student layer by layer")
  index = jnp.asarray(layers)
  student = dict(teacher_params)
  student["encoder"] = {
    **teacher_params["encoder"],
    "layers": jax.tree.map(lambda a: a[index], teacher_params["encoder"]["layers"]),
  }
  return teacher_config.replace(num_hidden_layers=len(layers)), student


def shared_student_from_teacher(
  teacher_config: BertConfig, teacher_params: Params, layer: int
) -> tuple[BertConfig, Params]:
  """An ALBERT-style student (Lan et al. 2020: one layer shared by every depth) of the
  teacher's depth and width, seeded with the teacher's `layer` (0-based).

  The embeddings (with an identity E -> H projection, E = H), the shared layer, the pooler
  and the task heads are copied, so before training the student runs the teacher's layer
  `layer` at every depth.

  Args:
    teacher_config: a BERT without shared layers.
    teacher_params: its parameters; every head it has must be an ALBERT head too.
    layer: the teacher layer to share, in [0, depth).

  Returns:
    ``(student_config, student_params)``.
  """
  n = teacher_config.num_hidden_layers
  counterpart = teacher_config.family.training.get("shared_student")
  if counterpart is None or teacher_config.num_param_layers != n:
    raise ValueError(
      "a shared-layer student is built from a teacher without sharing whose family has a "
      "shared-layer counterpart (BERT's is ALBERT); got "
      f"model_type={teacher_config.model_type!r}, "
      f"num_param_layers={teacher_config.num_param_layers}"
    )
  if not 0 <= layer < n:
    raise ValueError(f"{layer=} must be a teacher layer in [0, {n})")
  config = teacher_config.replace(
    model_type=counterpart,
    embedding_size=teacher_config.hidden_size,
    num_hidden_groups=1,
    inner_group_num=1,
  )
  rest = [k for k in teacher_params if k not in ("embeddings", "encoder")]
  fresh = init(config, 0, heads=tuple(k for k in rest if k in config.family.heads))
  emb = dict(fresh["embeddings"])
  for name, value in teacher_params["embeddings"].items():
    if name not in emb:
      raise ValueError(
        f"teacher embedding {name!r} has no place in the ALBERT student (its embeddings: "
        f"{sorted(emb)})"
      )
    emb[name] = value
  for name in set(fresh["embeddings"]) - set(teacher_params["embeddings"]):
    sub = emb[name]  # the E -> H map: identity, so the embeddings pass unchanged
    emb[name] = {
      "kernel": jnp.eye(config.hidden_size, dtype=sub["kernel"].dtype),
      "bias": jnp.zeros_like(sub["bias"]),
    }
  student = {
    "embeddings": emb,
    "encoder": {
      **teacher_params["encoder"],
      "layers": jax.tree.map(lambda a: a[layer : layer + 1], teacher_params["encoder"]["layers"]),
    },
    **{k: teacher_params[k] for k in rest},
  }
  want, got = (jax.tree.map(lambda a: a.shape, p) for p in (fresh, student))
  if want != got:
    raise ValueError(f"the teacher's parameters do not fit the ALBERT student: {got} vs {want}")
  return config, student


def default_student_layers(
  teacher_config: BertConfig, *, tinybert: bool = False
) -> tuple[int, ...]:
  """The teacher layers a student starts from when none are chosen.

  Every other layer (DistilBERT). TinyBERT's layer map needs a student depth that divides
  the teacher's, so with `tinybert` every k-th layer, k the smallest divisor of the depth
  above 1: a 4- or 6-layer teacher gives every other layer, a 9-layer one layers 0, 3, 6,
  a 3-layer (or any prime-depth) one a single layer.
  """
  n = teacher_config.num_hidden_layers
  k = next((d for d in range(2, n + 1) if n % d == 0), 1) if tinybert else 2
  return tuple(range(0, n, k))


def _mse_rows(a, b):
  return jnp.mean(jnp.square(a - b), -1)


def _attention_rows(s_a, t_a, real):
  """(B, T) squared error of attention maps (L, B, N, T, T) per query row: the mean over
  heads and over the real key columns (padded keys left out), summed over layers."""
  keys = real[None, :, None, None, :]  # (1, B, 1, 1, T)
  n_keys = jnp.maximum(jnp.sum(real, -1), 1.0)[None, :, None, None]  # (1, B, 1, 1)
  rows = jnp.sum(jnp.square(s_a - t_a) * keys, -1) / n_keys  # (L, B, N, T)
  return jnp.sum(jnp.mean(rows, 2), 0)


@dataclasses.dataclass(frozen=True, eq=False)
class Distillation(Objective):
  """DistilBERT (and optionally TinyBERT) distillation from a frozen teacher.

  Attributes:
    teacher_config: the teacher's architecture (same vocabulary as the student).
    teacher_params: its parameters, with an "mlm" head.
    temperature: T of the soft targets (DistilBERT: 2).
    alpha_ce, alpha_mlm, alpha_cos: DistilBERT's weights (5, 2, 1).
    tinybert: add the hidden-state and attention terms.
    alpha_hidden, alpha_attn: their weights.
  """

  teacher_config: BertConfig | None = None
  teacher_params: Any = None
  name: str = dataclasses.field(default="distill", kw_only=True)
  temperature: float = 2.0
  alpha_ce: float = 5.0
  alpha_mlm: float = 2.0
  alpha_cos: float = 1.0
  tinybert: bool = False
  alpha_hidden: float = 1.0
  alpha_attn: float = 1.0

  def __post_init__(self):
    if not isinstance(self.teacher_config, BertConfig):
      raise TypeError(f"Distillation needs the teacher's BertConfig, got {self.teacher_config!r}")
    if self.teacher_params is None or "mlm" not in self.teacher_params:
      raise ValueError("Distillation needs teacher_params with an 'mlm' head")
    if not self.temperature > 0:
      raise ValueError(f"{self.temperature=} must be > 0")

  @property
  def heads(self):
    """The student's MLM head."""
    return ("mlm",)

  @property
  def fields(self):
    """The MLM fields: masked positions, original ids, weights."""
    return ("mlm_positions", "mlm_ids", "mlm_weights")

  @property
  def weights(self):
    """`alpha_mlm`, `alpha_ce` and `alpha_cos` for the hard MLM, soft cross-entropy and
    cosine terms; with `tinybert`, `alpha_hidden` and `alpha_attn` for the layer terms too."""
    w = {"mlm": self.alpha_mlm, "distill_ce": self.alpha_ce, "cos": self.alpha_cos}
    if self.tinybert:
      w.update(hidden=self.alpha_hidden, attn=self.alpha_attn)
    return w

  def counts(self, batch):
    """Masked tokens for the MLM and soft cross-entropy terms, real tokens for the others."""
    masked = jnp.sum(batch["mlm_weights"].astype(jnp.float32))
    tokens = jnp.sum(batch["attention_mask"].astype(jnp.float32))
    out = {"mlm": masked, "distill_ce": masked, "cos": tokens}
    if self.tinybert:
      out.update(hidden=tokens, attn=tokens)
    return out

  def init_params(self, config, rng):
    """With `tinybert`, the projection `distill_proj` from the student's width to the
    teacher's (initialised as the model's dense layers); else none."""
    if not self.tinybert:
      return {}
    h_s, h_t = config.hidden_size, self.teacher_config.hidden_size
    kernel = config.initializer_range * jax.random.normal(rng, (h_s, h_t), jnp.float32)
    return {"distill_proj": {"kernel": kernel, "bias": jnp.zeros(h_t)}}

  def layer_map(self, student: BertConfig) -> list[int]:
    """g(m): the teacher layer each student layer m = 0..L_s (0: embeddings) is matched to."""
    ls, lt = student.num_hidden_layers, self.teacher_config.num_hidden_layers
    if lt % ls:
      raise ValueError(
        f"teacher num_hidden_layers={lt} must be a multiple of the student's "
        f"{ls} for the layer map g(m) = m * {lt} / {ls}"
      )
    return [m * (lt // ls) for m in range(ls + 1)]

  def terms(self, ctx: Context):
    """The student's MLM loss, the soft cross-entropy against the teacher's tempered MLM
    distribution, 1 - the cosine of the two models' final states per real token and, with
    `tinybert`, the mapped layers' hidden-state and attention terms (the teacher runs
    without gradient)."""
    b, cfg = ctx.batch, ctx.config
    t_cfg = self.teacher_config.replace(dtype=cfg.dtype)
    student = {k: v for k, v in ctx.params.items() if k != "distill_proj"}
    s_out = forward(
      student,
      cfg,
      b["input_ids"],
      b["attention_mask"],
      b["token_type_ids"],
      deterministic=ctx.deterministic,
      rng=ctx.forward_rng,
      output_hidden_states=self.tinybert,
      output_attentions=self.tinybert,
    )
    t_out = forward(
      self.teacher_params,
      t_cfg,
      b["input_ids"],
      b["attention_mask"],
      b["token_type_ids"],
      output_hidden_states=self.tinybert,
      output_attentions=self.tinybert,
    )
    t_out = jax.tree.map(jax.lax.stop_gradient, t_out)
    pos, ids = b["mlm_positions"], b["mlm_ids"].astype(jnp.int32)
    w = b["mlm_weights"].astype(jnp.float32)
    s_logits = mlm_logits(student, cfg, losses.gather_positions(s_out.last_hidden_state, pos))
    t_logits = mlm_logits(
      self.teacher_params, t_cfg, losses.gather_positions(t_out.last_hidden_state, pos)
    )
    s_logits, t_logits = s_logits.astype(jnp.float32), jax.lax.stop_gradient(t_logits)
    temp = self.temperature
    soft = jax.nn.softmax(t_logits.astype(jnp.float32) / temp, -1)
    ce_soft = -jnp.sum(soft * jax.nn.log_softmax(s_logits / temp, -1), -1) * temp**2  # (B, P)
    ce = optax.softmax_cross_entropy_with_integer_labels(s_logits, ids)
    correct = (jnp.argmax(s_logits, -1) == ids).astype(jnp.float32)
    agree = (jnp.argmax(s_logits, -1) == jnp.argmax(t_logits, -1)).astype(jnp.float32)
    real = b["attention_mask"].astype(jnp.float32)
    hs = s_out.last_hidden_state.astype(jnp.float32)
    ht = t_out.last_hidden_state.astype(jnp.float32)
    cos = jnp.sum(hs * ht, -1) / jnp.maximum(
      jnp.linalg.norm(hs, axis=-1) * jnp.linalg.norm(ht, axis=-1), 1e-8
    )
    out = {
      "mlm": {"loss_sum": jnp.sum(ce * w), "correct_sum": jnp.sum(correct * w)},
      "distill_ce": {"loss_sum": jnp.sum(ce_soft * w), "correct_sum": jnp.sum(agree * w)},
      "cos": {"loss_sum": jnp.sum((1 - cos) * real)},  # no accuracy: nothing to count
    }
    if self.tinybert:
      g = jnp.asarray(self.layer_map(cfg))
      proj = ctx.params["distill_proj"]
      s_h = s_out.hidden_states.astype(jnp.float32) @ proj["kernel"] + proj["bias"]
      t_h = t_out.hidden_states.astype(jnp.float32)[g]  # (L_s + 1, B, T, H_t)
      hidden = jnp.sum(_mse_rows(s_h, t_h), 0)  # (B, T)
      s_a = s_out.attentions.astype(jnp.float32)  # (L_s, B, N, T, T)
      t_a = t_out.attentions.astype(jnp.float32)[g[1:] - 1]
      if s_a.shape[2] != t_a.shape[2]:
        raise ValueError(
          f"attention distillation needs equal head counts; student "
          f"{s_a.shape[2]}, teacher {t_a.shape[2]}"
        )
      out["hidden"] = {"loss_sum": jnp.sum(hidden * real)}
      out["attn"] = {"loss_sum": jnp.sum(_attention_rows(s_a, t_a, real) * real)}
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class TaskDistillation(Objective):
  """Fine-tuning with a fine-tuned teacher (Hinton et al. 2015; DistilBERT's task-specific
  variant): ``(1 - alpha) * CE(labels) + alpha * T^2 * CE(softmax(z_t / T), z_s / T)``.

  Terms: "cls" or "tok" (the labels) and "distill_ce" (soft targets); for token
  classification both over labelled tokens. Regression heads (1 output) are not supported.

  Attributes:
    teacher_config, teacher_params: the frozen teacher, with the task's head.
    task: "classification" or "token_classification".
    temperature: T.
    alpha: the soft-target weight.
  """

  teacher_config: BertConfig | None = None
  teacher_params: Any = None
  task: str = "classification"
  name: str = dataclasses.field(default="distill_ce", kw_only=True)
  temperature: float = 2.0
  alpha: float = 0.5

  def __post_init__(self):
    if not isinstance(self.teacher_config, BertConfig):
      raise TypeError(
        f"TaskDistillation needs the teacher's BertConfig, got {self.teacher_config!r}"
      )
    if self.task not in ("classification", "token_classification"):
      raise ValueError(f"task={self.task!r} must be 'classification' or 'token_classification'")
    head = self.head
    if self.teacher_params is None or head not in self.teacher_params:
      raise ValueError(f"the teacher has no {head!r} head (a model fine-tuned for {self.task})")
    if self.teacher_config.num_labels < 2:
      raise ValueError(
        f"teacher num_labels={self.teacher_config.num_labels}: soft targets need "
        ">= 2 classes (regression is not supported)"
      )
    if not self.temperature > 0 or not 0 <= self.alpha <= 1:
      raise ValueError(f"{self.temperature=} must be > 0 and {self.alpha=} in [0, 1]")

  @property
  def head(self) -> str:
    """The task head both models have: "classifier" or "token_classifier"."""
    return "classifier" if self.task == "classification" else "token_classifier"

  @property
  def _hard(self) -> str:
    return "cls" if self.task == "classification" else "tok"

  @property
  def heads(self):
    """The student's task head."""
    return (self.head,)

  @property
  def fields(self):
    """The hard labels."""
    return ("labels",)

  @property
  def weights(self):
    """`1 - alpha` for the hard labels' term, `alpha` for the soft one."""
    return {self._hard: 1.0 - self.alpha, "distill_ce": self.alpha}

  def counts(self, batch):
    """Sequences (classification) or labelled tokens (token classification), for both terms."""
    if self.task == "classification":
      n = jnp.asarray(batch["input_ids"].shape[0], jnp.float32)
    else:
      n = jnp.sum((batch["labels"] != losses.IGNORE_INDEX).astype(jnp.float32))
    return {self._hard: n, "distill_ce": n}

  def terms(self, ctx: Context):
    """The hard-label loss of the student's head and the soft cross-entropy against the
    teacher's tempered logits (the teacher runs without gradient)."""
    b, cfg = ctx.batch, ctx.config
    t_cfg = self.teacher_config.replace(dtype=cfg.dtype)
    s = head_logits(
      ctx.params, cfg, ctx.out, self.head, deterministic=ctx.deterministic, rng=ctx.head_rng
    ).astype(jnp.float32)
    t_out = forward(
      self.teacher_params, t_cfg, b["input_ids"], b["attention_mask"], b["token_type_ids"]
    )
    t = jax.lax.stop_gradient(head_logits(self.teacher_params, t_cfg, t_out, self.head))
    labels = b["labels"]
    if self.task == "classification":
      hard = losses.classification_loss_terms(s, labels)
      valid = jnp.ones(labels.shape, jnp.float32)
    else:
      hard = losses.token_classification_loss_terms(s, labels)
      valid = (labels != losses.IGNORE_INDEX).astype(jnp.float32)
    temp = self.temperature
    soft = jax.nn.softmax(t.astype(jnp.float32) / temp, -1)
    ce = -jnp.sum(soft * jax.nn.log_softmax(s / temp, -1), -1) * temp**2
    agree = (jnp.argmax(s, -1) == jnp.argmax(t, -1)).astype(jnp.float32)
    return {
      self._hard: {"loss_sum": hard["loss_sum"], "correct_sum": hard["correct_sum"]},
      "distill_ce": {"loss_sum": jnp.sum(ce * valid), "correct_sum": jnp.sum(agree * valid)},
    }
