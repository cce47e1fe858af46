"""One frozen config for every encoder family, with presets and the Hugging Face mapping.

The family (`model_type`: BERT, ALBERT, RoBERTa, XLM-R, ELECTRA, DistilBERT, MPNet,
NomicBERT, ModernBERT, EuroBERT) is a row of `bertjax.model.families` that fixes the block's
structure; this config holds the sizes, numerics and the options a checkpoint may switch
(biases, grouped key/value heads, rotary thetas, which layers use a sliding window), the
options of its family alone in one group (`options`, `bertjax.model.options`), and its
Hugging Face mapping reads the row's key names.

A model is a stack of `depth = num_hidden_layers * inner_group_num` transformer
blocks. BERT gives every block its own weights. ALBERT shares them: there are
`num_hidden_groups` groups of `inner_group_num` blocks each, and layer `i` runs
group `int(i / (num_hidden_layers / num_hidden_groups))` (Hugging Face's rule).
Parameters are stored stacked on a leading axis of size `num_param_layers`, and
`layer_param_index[d]` says which slice block `d` uses.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

from bertjax.kernels import IMPLS as _ATTENTION_IMPLS
from bertjax.model.families import (
  FAMILIES,
  IGNORED_CONFIG_KEYS,
  INERT_CONFIG_VALUES,
  LAYER_TYPES,
  Family,
  family,
)
from bertjax.model.options import (
  OPTION_CLASSES,
  POS_ATT_TYPES,
  DebertaOptions,
  DistilBertOptions,
  Gemma3Options,
  MPNetOptions,
  UltraBertOptions,
)
from bertjax.model.options import OWNER as OPTION_OWNER
from bertjax.model.options import field_names as option_names
from bertjax.model.settings import GROUP_OF, GROUPS, Runtime, TaskHeads

_ACTIVATIONS = (
  "gelu",
  "gelu_new",
  "gelu_pytorch_tanh",
  "gelu_fast",
  "relu",
  "silu",
  "swish",
  "tanh",
)
_DTYPES = ("float32", "bfloat16", "float64")  # float64 needs jax_enable_x64 (for exact checks)


@dataclasses.dataclass(frozen=True, init=False)
class BertConfig:
  """Architecture and numerics of an encoder of any family in `bertjax.model.families`.

  Hashable, so it can be passed to `jax.jit` as a static argument.
  `embedding_size=None` means `hidden_size`; `num_hidden_groups=None` means one
  group per layer (no sharing, BERT); `type_vocab_size=0` means no token-type
  embeddings (DistilBERT). `options` holds what only this model's family has (DeBERTa's
  `pos_att_type`, ...; `bertjax.model.options`), given and read as flat fields.
  """

  vocab_size: int = 30522
  hidden_size: int = 768
  num_hidden_layers: int = 12
  num_attention_heads: int = 12
  intermediate_size: int = 3072
  embedding_size: int | None = None
  hidden_act: str = "gelu"
  hidden_dropout_prob: float = 0.1
  attention_probs_dropout_prob: float = 0.1
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  layer_norm_eps: float = 1e-12
  initializer_range: float = 0.02
  num_hidden_groups: int | None = None
  inner_group_num: int = 1
  model_type: str = "bert"
  pad_token_id: int = 0
  # Physically removed heads, as sorted (layer, (head, ...)) pairs in original head indices.
  pruned_heads: tuple[tuple[int, tuple[int, ...]], ...] = ()
  # Block options a checkpoint may switch (the family row fixes the rest; BERT's defaults).
  norm_bias: bool = True
  attention_bias: bool = True
  mlp_bias: bool = True
  # Grouped key/value heads (EuroBERT); None means num_attention_heads.
  num_key_value_heads: int | None = None
  # Rotary theta of full and of sliding layers (local None: the same; no rotary: None).
  rope_theta: float | None = None
  local_rope_theta: float | None = None
  # Per layer "full_attention"/"sliding_attention" (None: all full); sliding layers see keys
  # with |q - k| <= sliding_window // 2 (ModernBERT's local_attention).
  layer_types: tuple[str, ...] | None = None
  sliding_window: int | None = None
  # How it runs and its task heads (`bertjax.model.settings`), and the options this family
  # alone has (`Family.options`, `bertjax.model.options`: DeBERTa's disentangled attention,
  # MPNet's bias buckets, ...; None for a family without any). Given as flat keywords too,
  # and read through as attributes (`config.dtype`, `config.pos_att_type`).
  runtime: Runtime = dataclasses.field(default_factory=Runtime)
  task: TaskHeads = dataclasses.field(default_factory=TaskHeads)
  options: Any = None

  def __init__(self, **fields: Any):
    """Takes every field by keyword; the groups' fields flat among them (`dtype=...`,
    `pos_att_type=...`) or whole (`runtime=Runtime(...)`, `options=DebertaOptions(...)`).
    Lists (a config read from JSON) become the tuples a hashable config needs."""
    fields = {k: _frozen(v) for k, v in fields.items()}
    groups = {}
    for attr, group in GROUPS.items():
      given = fields.pop(attr, None)
      flat = {k: fields.pop(k) for k in list(fields) if GROUP_OF.get(k) == attr}
      if isinstance(given, dict):  # as `config_to_json` writes it
        given, flat = None, {**given, **flat}
      groups[attr] = dataclasses.replace(given if given is not None else group(), **flat)
    model_type = fields.get("model_type", "bert")
    kind = FAMILIES[model_type].options if model_type in FAMILIES else None
    flat = {k: fields.pop(k) for k in list(fields) if k in OPTION_OWNER}
    options = fields.pop("options", None)
    if isinstance(options, dict):  # as `config_to_json` writes it
      flat, options = {**options, **flat}, None
    foreign = {
      k: v
      for k, v in flat.items()
      if OPTION_OWNER[k] is not kind and v != _OPTION_DEFAULTS[k]  # defaults carry nothing
    }
    if foreign:
      name, value = next(iter(foreign.items()))
      label = _OPTION_LABELS[OPTION_OWNER[name]]
      raise ValueError(
        f"{name}={value!r} is a {label} option; model_type={model_type!r} does not have it"
      )
    if kind is not None and (options is None or isinstance(options, kind)):
      own = {k: v for k, v in flat.items() if OPTION_OWNER[k] is kind}
      options = dataclasses.replace(options or kind(), **own)
    for f in dataclasses.fields(self):
      if f.name != "options" and f.name not in groups:
        object.__setattr__(self, f.name, fields.pop(f.name, f.default))
    for attr, value in groups.items():
      object.__setattr__(self, attr, value)
    object.__setattr__(self, "options", options)
    if fields:
      raise TypeError(f"BertConfig got unknown fields {sorted(fields)}")
    self.__post_init__()

  def __getattr__(self, name: str) -> Any:
    """A field of a group (`runtime`, `task`) or of the family's own `options`, read
    through (only called when `name` is no field or property)."""
    attr = GROUP_OF.get(name)
    if attr is not None and attr in self.__dict__:
      return getattr(self.__dict__[attr], name)
    options = self.__dict__.get("options")
    if options is not None and name in option_names(options):
      return getattr(options, name)
    if name in OPTION_OWNER:
      raise AttributeError(
        f"{name!r} is a {_OPTION_LABELS[OPTION_OWNER[name]]} option; a "
        f"{self.__dict__.get('model_type')} config does not have it"
      )
    raise AttributeError(f"'BertConfig' object has no attribute {name!r}")

  def __post_init__(self):
    for name in (
      "vocab_size",
      "hidden_size",
      "num_hidden_layers",
      "num_attention_heads",
      "intermediate_size",
      "max_position_embeddings",
      "inner_group_num",
      "num_labels",
      "scan_unroll",
    ):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive int")
    if self.model_type not in FAMILIES:
      raise ValueError(f"model_type={self.model_type!r} must be one of {tuple(FAMILIES)}")
    fam = self.family
    if (fam.options is None) != (self.options is None) or (
      fam.options is not None and not isinstance(self.options, fam.options)
    ):
      want = "None" if fam.options is None else fam.options.__name__
      raise ValueError(
        f"options={self.options!r}: a {self.model_type} config holds {want} (its family's "
        "own options, `Family.options`)"
      )
    least = int(fam.token_types and not fam.optional_token_types)
    if not isinstance(self.type_vocab_size, int) or self.type_vocab_size < least:
      raise ValueError(
        f"type_vocab_size={self.type_vocab_size!r} must be an int >= "
        f"{least} for model_type={self.model_type!r}"
      )
    if not fam.token_types and self.type_vocab_size:
      raise ValueError(
        f"model_type={self.model_type!r} has no token-type embeddings; got "
        f"type_vocab_size={self.type_vocab_size}"
      )
    if self.label_names is not None and len(self.label_names) != self.num_labels:
      raise ValueError(
        f"label_names={self.label_names} must name num_labels={self.num_labels} classes"
      )
    if not isinstance(self.pad_token_id, int) or not 0 <= self.pad_token_id < self.vocab_size:
      raise ValueError(
        f"pad_token_id={self.pad_token_id!r} must be an id in [0, vocab_size={self.vocab_size})"
      )
    if self.max_length < 1:
      raise ValueError(
        f"max_position_embeddings={self.max_position_embeddings} leaves no usable "
        f"positions after pad_token_id={self.pad_token_id} ({self.model_type})"
      )
    for name, allowed in (
      ("hidden_act", _ACTIVATIONS),
      ("dtype", _DTYPES),
      ("attention_impl", _ATTENTION_IMPLS),
      ("quantize", (None, "int8")),
      ("relevance_rules", (None, "attnlrp", "cp-lrp")),
    ):
      if getattr(self, name) not in allowed:
        raise ValueError(f"{name}={getattr(self, name)!r} must be one of {allowed}")
    if self.hidden_size % self.num_attention_heads:
      raise ValueError(
        f"hidden_size={self.hidden_size} must be divisible by "
        f"num_attention_heads={self.num_attention_heads}"
      )
    groups = self.groups
    if not 1 <= groups <= self.num_hidden_layers:
      raise ValueError(
        f"num_hidden_groups={groups} must be in [1, num_hidden_layers={self.num_hidden_layers}]"
      )
    if not fam.shared_layers and (groups != self.num_hidden_layers or self.inner_group_num != 1):
      raise ValueError(
        f"model_type={self.model_type!r} has no layer sharing: got num_hidden_groups={groups}, "
        f"inner_group_num={self.inner_group_num}; use model_type='albert'"
      )
    for layer, heads in self.pruned_heads:
      if fam.shared_layers:
        raise ValueError(
          f"pruned_heads is not supported for model_type={self.model_type!r} "
          "(its layers share weights: use head masks)"
        )
      if not 0 <= layer < self.num_hidden_layers or any(
        not 0 <= h < self.num_attention_heads for h in heads
      ):
        raise ValueError(
          f"pruned_heads entry {(layer, heads)} is out of range for "
          f"{self.num_hidden_layers} layers x {self.num_attention_heads} heads"
        )
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
      if not 0.0 <= getattr(self, name) < 1.0:
        raise ValueError(f"{name}={getattr(self, name)} must be in [0, 1)")
    self._check_block(fam)

  def _check_block(self, fam: Family) -> None:
    """The block options against the family row: each wrong value named."""
    for field in _FIXED_BLOCK_FIELDS:
      if field in fam.config_defaults and field not in fam.config_fields:
        fixed = fam.config_defaults[field]
        if getattr(self, field) != fixed:
          raise ValueError(
            f"{field}={getattr(self, field)!r}: a {self.model_type} block has "
            f"{field}={fixed!r} (BertConfig.for_family({self.model_type!r}, ...) "
            "starts from the family's values)"
          )
    kv = self.num_key_value_heads
    if kv is not None and (not isinstance(kv, int) or kv < 1 or self.num_attention_heads % kv):
      raise ValueError(
        f"num_key_value_heads={kv!r} must be a positive divisor of "
        f"num_attention_heads={self.num_attention_heads}"
      )
    if kv not in (None, self.num_attention_heads) and self.pruned_heads:
      raise ValueError(
        "pruned_heads is not supported with grouped key/value heads "
        f"(num_key_value_heads={kv}); use head masks"
      )
    rotary = fam.positions == "rotary"
    for name in ("rope_theta", "local_rope_theta"):
      value = getattr(self, name)
      if value is not None and (not rotary or not isinstance(value, (int, float)) or value <= 0):
        raise ValueError(
          f"{name}={value!r}: "
          + (
            "must be a positive number"
            if rotary
            else f"model_type={self.model_type!r} has no rotary positions"
          )
        )
    if rotary and self.rope_theta is None:
      raise ValueError(
        f"model_type={self.model_type!r} has rotary positions: rope_theta is required"
      )
    if self.layer_types is not None:
      if len(self.layer_types) != self.num_hidden_layers or any(
        t not in LAYER_TYPES for t in self.layer_types
      ):
        raise ValueError(
          f"layer_types={self.layer_types} must give one of {LAYER_TYPES} for "
          f"each of the {self.num_hidden_layers} layers"
        )
      if "sliding_attention" in self.layer_types and self.sliding_window is None:
        raise ValueError("layer_types has sliding_attention layers: sliding_window is required")
    w = self.sliding_window
    if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 2):
      raise ValueError(f"sliding_window={w!r} must be an int >= 2")
    if w is not None and fam.window_radius and w % 2:
      raise ValueError(
        f"sliding_window={w} must be even for model_type={self.model_type!r}: its "
        "config.json holds the radius, sliding_window // 2"
      )
    if isinstance(self.options, DebertaOptions):
      self._check_disentangled()
    poolings = fam.poolings
    if self.classifier_pooling not in poolings:
      raise ValueError(
        f"classifier_pooling={self.classifier_pooling!r} must be one of "
        f"{poolings} for model_type={self.model_type!r}"
      )
    if self.classifier_activation is not None and self.classifier_activation not in _ACTIVATIONS:
      raise ValueError(
        f"classifier_activation={self.classifier_activation!r} must be one of {_ACTIVATIONS}"
      )
    if (
      fam.ffn_dropout == "inside" and self.hidden_dropout_prob != self.attention_probs_dropout_prob
    ):
      raise ValueError(
        f"a {self.model_type} model has one dropout rate in bertjax: hidden_dropout_prob="
        f"{self.hidden_dropout_prob} and attention_probs_dropout_prob="
        f"{self.attention_probs_dropout_prob} must be equal"
      )

  def _check_disentangled(self) -> None:
    """DeBERTa's options against the rest of the config (each checks its own values)."""
    if self.position_buckets == 1 or (
      0 < self.position_buckets and self.rel_max_position <= self.position_buckets // 2
    ):
      raise ValueError(
        f"position_buckets={self.position_buckets} needs max_relative_positions="
        f"{self.rel_max_position} > position_buckets // 2 (and >= 2 buckets)"
      )
    if not self.legacy and self.embed_dim != self.hidden_size:
      raise ValueError(
        f"legacy=False (DeBERTa's lm_predictions head) needs embedding_size="
        f"{self.embed_dim} == hidden_size={self.hidden_size}"
      )

  # Derived structure -------------------------------------------------------

  @property
  def rel_max_position(self) -> int:
    """DeBERTa's `max_relative_positions`, or `max_position_embeddings` when unset."""
    return (
      self.max_relative_positions
      if self.max_relative_positions >= 1
      else (self.max_position_embeddings)
    )

  @property
  def rel_span(self) -> int:
    """DeBERTa's relative span s: `position_buckets`, else `max_relative_positions`; the
    relative embeddings have 2 s rows."""
    return self.position_buckets if self.position_buckets > 0 else self.rel_max_position

  @property
  def disentangled_terms(self) -> tuple[str, ...]:
    """The position terms DeBERTa's scores add ("c2p", "p2c"), in that order; () without
    relative attention (or for other families)."""
    if self.family.position_bias != "disentangled" or not self.relative_attention:
      return ()
    return tuple(t for t in POS_ATT_TYPES if t in self.pos_att_type)

  @property
  def attention_scale(self) -> float | None:
    """The logit scale when it is not `1 / sqrt(head_dim)`: DeBERTa's `1 / sqrt(f d)`, f = 1
    + the number of `pos_att_type` terms (counted even without relative attention, as
    transformers does); Gemma 3's `query_pre_attn_scalar ** -0.5`. None otherwise."""
    scalar = getattr(self.options, "query_pre_attn_scalar", None)
    if scalar is not None:  # Gemma 3
      return scalar**-0.5
    if self.family.position_bias != "disentangled":
      return None
    factor = 1 + sum(t in self.pos_att_type for t in POS_ATT_TYPES)
    return 1.0 / math.sqrt(self.head_dim * factor)

  @property
  def lm_head_layout(self) -> bool:
    """DeBERTa's MLM head in its own layout (`lm_predictions.lm_head`, `legacy=False`)."""
    return isinstance(self.options, DebertaOptions) and not self.options.legacy

  @property
  def position_table(self) -> str | None:
    """The absolute position embedding the input adds: "learned", "sinusoidal" (DistilBERT's
    fixed table, `sinusoidal_positions`) or None (rotary families; DeBERTa-v3 without
    `position_biased_input`)."""
    if self.family.positions == "rotary" or not getattr(
      self.options, "position_biased_input", True
    ):
      return None
    return "sinusoidal" if getattr(self.options, "sinusoidal_positions", False) else "learned"

  @property
  def family(self) -> Family:
    """This model's row of the family table."""
    return family(self.model_type)

  @property
  def has_pooler(self) -> bool:
    """Whether the model has a pooler: the family has one and `use_pooler` keeps it."""
    return self.use_pooler and self.family.pooler is not None

  @property
  def position_offset(self) -> int:
    """Index of the first position embedding a real token uses (RoBERTa: pad_token_id + 1)."""
    return self.pad_token_id + 1 if self.family.positions == "after_padding" else 0

  @property
  def max_length(self) -> int:
    """The longest input the position table (or, rotary, `max_position_embeddings`) allows."""
    return self.max_position_embeddings - self.position_offset

  @property
  def kv_heads(self) -> int:
    """Key/value heads per layer (fewer than the query heads when grouped)."""
    return self.num_key_value_heads or self.num_attention_heads

  @property
  def untied(self) -> bool:
    """Whether the MLM decoder is its own matrix, not the word embeddings."""
    return not self.tie_word_embeddings

  @property
  def layer_windows(self) -> tuple[int | None, ...]:
    """For each block d, its sliding window w (None: full attention)."""
    types = self.layer_types or ("full_attention",) * self.num_hidden_layers
    per_layer = [self.sliding_window if t == "sliding_attention" else None for t in types]
    return tuple(per_layer[i] for i in self.layer_index)

  @property
  def layer_rope_thetas(self) -> tuple[float, ...] | None:
    """For each block d, its rotary theta (None for families without rotary positions)."""
    if self.rope_theta is None:
      return None
    local = self.local_rope_theta if self.local_rope_theta is not None else self.rope_theta
    return tuple(float(local if w is not None else self.rope_theta) for w in self.layer_windows)

  @property
  def layer_index(self) -> tuple[int, ...]:
    """For each block d, its layer in [0, num_hidden_layers) (ALBERT repeats inner groups)."""
    return tuple(i for i in range(self.num_hidden_layers) for _ in range(self.inner_group_num))

  @property
  def embed_dim(self) -> int:
    """Width of the token embeddings (ALBERT's E)."""
    return self.embedding_size or self.hidden_size

  @property
  def has_embedding_projection(self) -> bool:
    """ALBERT always maps E -> H; other families only when factorised (E != H)."""
    return self.family.always_project or self.embed_dim != self.hidden_size

  @property
  def ffn_size(self) -> int:
    """The FFN's width: `intermediate_size`, or the family's rule on it (NeoBERT's SwiGLU
    is two thirds of it, rounded up to a multiple of 8: `Family.ffn_width`)."""
    rule = self.family.ffn_width
    return self.intermediate_size if rule is None else rule(self.intermediate_size)

  @property
  def head_dim(self) -> int:
    """Each head's width: `hidden_size / num_attention_heads`."""
    return self.hidden_size // self.num_attention_heads

  @property
  def groups(self) -> int:
    """Stacked parameter groups: ALBERT's `num_hidden_groups`, else one per layer."""
    return self.num_hidden_groups or self.num_hidden_layers

  @property
  def depth(self) -> int:
    """Number of transformer blocks a forward pass runs."""
    return self.num_hidden_layers * self.inner_group_num

  @property
  def num_param_layers(self) -> int:
    """Size of the stacked-parameter axis."""
    return self.groups * self.inner_group_num

  @property
  def layer_param_index(self) -> tuple[int, ...]:
    """For each block d in [0, depth), the index of its parameters in the stack."""
    index = []
    for i in range(self.num_hidden_layers):
      group = int(i / (self.num_hidden_layers / self.groups))
      index.extend(group * self.inner_group_num + j for j in range(self.inner_group_num))
    return tuple(index)

  @property
  def is_pruned(self) -> bool:
    """Whether any layer has heads physically removed (`pruned_heads`)."""
    return any(heads for _, heads in self.pruned_heads)

  def kept_heads(self, layer: int) -> tuple[int, ...]:
    """Original indices of the heads layer `layer` still has."""
    removed = dict(self.pruned_heads).get(layer, ())
    return tuple(h for h in range(self.num_attention_heads) if h not in removed)

  @property
  def classifier_dropout(self) -> float:
    """The task heads' dropout rate: `classifier_dropout_prob`, else the family's default,
    else (as transformers' heads do when the config gives None, MPNet's) the hidden rate."""
    p = self.classifier_dropout_prob
    if p is None:
      p = self.family.config_defaults.get("classifier_dropout_prob")
    return self.hidden_dropout_prob if p is None else p

  def replace(self, **changes: Any) -> BertConfig:
    """A copy with `changes` applied (`dataclasses.replace`; a family's options flat too)."""
    return dataclasses.replace(self, **changes)

  @classmethod
  def for_family(cls, model_type: str, **fields: Any) -> BertConfig:
    """A config of `model_type` with the family's defaults (its biases, norm, rotary thetas,
    window, dropout) under `fields`: `BertConfig.for_family("modernbert", num_hidden_layers=4)`.
    A bare `BertConfig(model_type=...)` takes BERT's defaults for every field."""
    fam = family(model_type)
    return cls(**{"model_type": model_type, **fam.config_defaults, **fields})

  # Presets -----------------------------------------------------------------

  @classmethod
  def preset(cls, name: str, **overrides: Any) -> BertConfig:
    """A named architecture (see `PRESETS`), with any field overridden."""
    if name not in PRESETS:
      raise ValueError(f"preset {name=!r} is unknown; expected one of {sorted(PRESETS)}")
    fields = {**PRESETS[name], **overrides}
    types = fields.get("layer_types")
    if types and "layer_types" not in overrides and len(types) != fields["num_hidden_layers"]:
      # A preset's layer pattern repeats (ModernBERT: global every third layer); another depth
      # keeps the pattern rather than failing on the preset's own count.
      period = next(
        p for p in range(1, len(types) + 1) if all(t == types[i % p] for i, t in enumerate(types))
      )
      fields["layer_types"] = tuple(types[i % period] for i in range(fields["num_hidden_layers"]))
    return cls.for_family(fields.pop("model_type", "bert"), **fields)

  # Hugging Face mapping ----------------------------------------------------

  @classmethod
  def from_hf_dict(
    cls, hf: dict[str, Any], *, allow_unknown_keys: Iterable[str] = (), **overrides: Any
  ) -> BertConfig:
    """Builds a config from a Hugging Face `config.json` dictionary of any supported family.

    Args:
      hf: the `config.json` dictionary.
      allow_unknown_keys: keys to load without, although bertjax neither reads them nor
        knows them to change nothing (`families.IGNORED_CONFIG_KEYS`, `Family.ignored_keys`).
      **overrides: `BertConfig` fields to set.

    Raises:
      ValueError: an unsupported `model_type`, a key whose value bertjax does not implement,
        or keys it does not know (all named).
    """
    hf = _ReadKeys(hf)
    model_type = hf.get("model_type")
    if model_type not in FAMILIES:
      raise ValueError(
        f"model_type={model_type!r} in config.json is not supported; expected one of "
        f"{tuple(FAMILIES)}"
      )
    fam = FAMILIES[model_type]
    if hf.get("position_embedding_type", "absolute") != "absolute":
      raise ValueError(
        f"position_embedding_type={hf['position_embedding_type']!r} is not "
        "supported; expected 'absolute'"
      )
    if hf.get("tie_word_embeddings") is False and "tie_word_embeddings" not in fam.config_fields:
      raise ValueError(
        f"tie_word_embeddings=False is not supported for {model_type}: bertjax "
        "ties its MLM decoder to the word embeddings"
      )
    kwargs: dict[str, Any] = {"model_type": model_type}
    for field in fam.config_fields:
      value = hf.get(fam.config_keys.get(field, field))
      if value is not None:
        kwargs[field] = value
    kwargs.update(_hf_block_options(fam, hf))
    if fam.position_bias == "disentangled":
      kwargs.update(_hf_disentangled_options(hf))
    for field, value in fam.config_defaults.items():
      kwargs.setdefault(field, value)
    labels = hf.get("id2label") or {}
    kwargs["num_labels"] = hf.get("num_labels") or len(labels) or 2
    if labels and len(labels) == kwargs["num_labels"]:
      names = tuple(
        str(labels.get(str(i), labels.get(i, f"LABEL_{i}"))) for i in range(len(labels))
      )
      if names != tuple(f"LABEL_{i}" for i in range(len(labels))):
        kwargs["label_names"] = names
    pruned = {int(k): tuple(sorted(set(v))) for k, v in (hf.get("pruned_heads") or {}).items()}
    kwargs["pruned_heads"] = tuple(sorted((k, v) for k, v in pruned.items() if v))
    _check_keys(fam, hf, allow_unknown_keys)
    kwargs.update(overrides)
    return cls(**kwargs)

  def label_name(self, i: int) -> str:
    """Class `i`'s name: `label_names[i]`, else Hugging Face's default `LABEL_i`."""
    return self.label_names[i] if self.label_names else f"LABEL_{i}"

  def to_hf_dict(self, architectures: list[str] | None = None) -> dict[str, Any]:
    """The Hugging Face `config.json` dictionary for this config."""
    fam = self.family
    if self.has_embedding_projection and "embedding_size" not in fam.config_fields:
      raise ValueError(
        f"a {self.model_type} config with embedding_size={self.embed_dim} != hidden_size="
        f"{self.hidden_size} has no Hugging Face equivalent; use model_type='albert' or "
        "'electra'"
      )
    for field in sorted(set(fam.config_defaults) - set(fam.config_fields)):
      if field in _BLOCK_KEYS and fam.rope_keys:
        continue  # written below in the family's own layout
      if getattr(self, field) != fam.config_defaults[field]:
        raise ValueError(
          f"{field}={getattr(self, field)!r} has no Hugging Face equivalent for "
          f"model_type={self.model_type!r} (it is fixed at "
          f"{fam.config_defaults[field]!r})"
        )
    values = dict(
      num_key_value_heads=self.kv_heads,  # a number: Gemma 3's config class takes no null
      embedding_size=self.embed_dim,
      num_hidden_groups=self.groups,
      classifier_dropout_prob=(
        self.classifier_dropout if fam.shared_layers else self.classifier_dropout_prob
      ),
    )
    hf: dict[str, Any] = {"model_type": self.model_type}
    for field in fam.config_fields:
      hf[fam.config_keys.get(field, field)] = values.get(field, getattr(self, field))
    if fam.positions != "rotary" and not fam.position_bias:
      hf["position_embedding_type"] = "absolute"
    hf.update(self._hf_block_options())
    hf.update(
      num_labels=self.num_labels,
      id2label={str(i): self.label_name(i) for i in range(self.num_labels)},
      label2id={self.label_name(i): i for i in range(self.num_labels)},
    )
    if self.is_pruned:
      hf["pruned_heads"] = {str(layer): list(heads) for layer, heads in self.pruned_heads}
    if architectures:
      hf["architectures"] = list(architectures)
    return hf

  def _hf_block_options(self) -> dict[str, Any]:
    """The rotary, layer-type and head-size keys, in transformers 5's layout."""
    fam = self.family
    hf: dict[str, Any] = {}
    if fam.positions == "rotary" and fam.rope_keys:
      hf["head_dim"] = self.head_dim
      if fam.layer_typed or self.layer_types is not None:
        local = self.local_rope_theta if self.local_rope_theta is not None else self.rope_theta
        hf["rope_parameters"] = {
          "full_attention": {"rope_type": "default", "rope_theta": self.rope_theta},
          "sliding_attention": {"rope_type": "default", "rope_theta": local},
        }
      else:
        hf["rope_parameters"] = {"rope_type": "default", "rope_theta": self.rope_theta}
    if self.layer_types is not None or fam.layer_typed:
      hf["layer_types"] = list(self.layer_types or ("full_attention",) * self.num_hidden_layers)
    if fam.window_radius and self.sliding_window is not None:
      hf["sliding_window"] = self.sliding_window // 2
    if fam.ffn_dropout == "inside":  # ModernBERT's embedding dropout is the one rate too
      hf["embedding_dropout"] = self.hidden_dropout_prob
    if "tie_word_embeddings" not in fam.config_fields:
      hf["tie_word_embeddings"] = True
    hf.update(fam.required_values)
    return hf


class _ReadKeys(dict):
  """A `config.json` dictionary that records the keys looked up in it: those are the keys
  bertjax reads. A key its layout leaves unread (`rope_theta` beside `rope_parameters`) is
  not, and is refused like any other unknown key unless the row ignores it."""

  def __init__(self, hf: dict[str, Any]):
    super().__init__(hf)
    self.read: set[str] = set()

  def get(self, key, default=None):
    self.read.add(key)
    return super().get(key, default)

  def __getitem__(self, key):
    self.read.add(key)
    return super().__getitem__(key)

  def __contains__(self, key):
    self.read.add(key)
    return super().__contains__(key)


def _check_keys(fam: Family, hf: _ReadKeys, allowed: Iterable[str]) -> None:
  """Refuses a key set to a value bertjax does not implement, and every key it neither read
  nor knows to change nothing (it might change the block: loading without it would quietly
  compute another model)."""
  for key, inert in INERT_CONFIG_VALUES.items():
    if hf.get(key) not in (None, inert):
      raise ValueError(
        f"{key}={hf[key]!r} in config.json of a {fam.model_type!r} model is not supported; "
        f"bertjax implements {key}={inert!r} only"
      )
  for key, only in fam.required_values.items():
    if hf.get(key, only) != only:
      raise ValueError(
        f"{key}={hf[key]!r} in config.json of a {fam.model_type!r} model is not supported; "
        f"bertjax implements {key}={only!r} only"
      )
  if isinstance(allowed, str):
    allowed = (allowed,)
  known = hf.read | IGNORED_CONFIG_KEYS | set(fam.ignored_keys) | set(allowed)
  unknown = sorted(set(hf) - known)
  if unknown:
    raise ValueError(
      f"config.json has keys that bertjax's {fam.model_type!r} family does not know: "
      f"{unknown}; they may change the model, and loading without them would compute "
      f"another one. If they change nothing, pass allow_unknown_keys={unknown} to from_hf"
    )


# Each option's default (what a family without it has), and how errors name its family.
_OPTION_DEFAULTS = {f.name: f.default for kind in OPTION_CLASSES for f in dataclasses.fields(kind)}
_OPTION_LABELS = {
  DebertaOptions: "DeBERTa",
  MPNetOptions: "MPNet",
  DistilBertOptions: "DistilBERT",
  UltraBertOptions: "UltraBERT",
  Gemma3Options: "Gemma 3",
}

# Block fields a family may fix (in its config_defaults, not read from config.json).
_FIXED_BLOCK_FIELDS = (
  "norm_bias",
  "attention_bias",
  "mlp_bias",
  "tie_word_embeddings",
  "classifier_pooling",
)

# Config fields read from (and written to) config.json in a family's own layout
# (`_hf_block_options`), not as a plain key.
_BLOCK_KEYS = ("rope_theta", "local_rope_theta", "layer_types", "sliding_window")


def _rope_theta(params: Any, where: str) -> float | None:
  """The theta of one rope_parameters entry; an error for rope types bertjax lacks."""
  if not isinstance(params, dict):
    return None
  rope_type = params.get("rope_type", params.get("type", "default"))
  if rope_type != "default":
    raise ValueError(
      f"{where} has rope_type={rope_type!r}; bertjax supports 'default' rotary positions only"
    )
  for key in ("factor", "partial_rotary_factor"):
    if params.get(key) not in (None, 1, 1.0):
      raise ValueError(
        f"{where} has {key}={params[key]!r}; bertjax supports plain rotary "
        "positions over the whole head only"
      )
  return params.get("rope_theta")


def _hf_block_options(fam: Family, hf: dict[str, Any]) -> dict[str, Any]:
  """Rotary thetas, layer types and head sizes from either config.json layout.

  transformers 5 writes `rope_parameters` (one dict, or one per layer type) and
  `layer_types`; older ModernBERT files give `global_rope_theta`, `local_rope_theta` and
  `global_attn_every_n_layers`, and older rotary files `rope_theta`.
  """
  out: dict[str, Any] = {}
  head_dim = hf.get("head_dim")
  heads, hidden = hf.get("num_attention_heads"), hf.get("hidden_size")
  if head_dim is not None and heads and hidden and head_dim * heads != hidden:
    raise ValueError(
      f"head_dim={head_dim} with num_attention_heads={heads} does not give "
      f"hidden_size={hidden}; bertjax needs head_dim = hidden_size / heads"
    )
  if fam.positions == "rotary" and fam.rope_keys:
    rope = hf.get("rope_parameters") or hf.get("rope_scaling")
    if isinstance(rope, dict) and ("full_attention" in rope or "sliding_attention" in rope):
      full = _rope_theta(rope.get("full_attention"), "rope_parameters['full_attention']")
      local = _rope_theta(rope.get("sliding_attention"), "rope_parameters['sliding_attention']")
    else:
      full, local = _rope_theta(rope, "rope_parameters"), None
    full = full if full is not None else hf.get("global_rope_theta", hf.get("rope_theta"))
    local = local if local is not None else hf.get("local_rope_theta")
    for name, theta in (("rope_theta", full), ("local_rope_theta", local)):
      if theta is not None and (isinstance(theta, bool) or not isinstance(theta, (int, float))):
        raise ValueError(
          f"{name}={theta!r} in config.json is not one number; bertjax reads transformers "
          "5's layout (rope_parameters, one per layer type)"
        )
    if full is not None:
      out["rope_theta"] = float(full)
    if local is not None:
      out["local_rope_theta"] = float(local)
  if fam.window_radius and hf.get("sliding_window") is not None:
    out["sliding_window"] = 2 * hf["sliding_window"]  # the radius r: |q - k| <= r
  if fam.layer_typed or hf.get("layer_types") is not None:
    types = hf.get("layer_types")
    if types is None and fam.global_every is None:
      raise ValueError(
        f"config.json of a {fam.model_type!r} model gives no layer_types; bertjax reads "
        "the layout transformers 5 writes (layer_types and rope_parameters per layer type)"
      )
    if types is None:
      every = hf.get("global_attn_every_n_layers", fam.global_every)
      types = [
        "sliding_attention" if i % every else "full_attention"
        for i in range(hf.get("num_hidden_layers", 22))
      ]
    out["layer_types"] = tuple(types)
  if fam.ffn_dropout == "inside":
    for key in ("embedding_dropout",):
      rate = hf.get(key, 0.0)
      mlp = hf.get(fam.config_keys.get("hidden_dropout_prob", "hidden_dropout_prob"), 0.0)
      if rate != mlp:
        raise ValueError(
          f"{key}={rate} differs from mlp_dropout={mlp}: bertjax gives a "
          f"{fam.model_type} model one dropout rate"
        )
  return out


def _hf_disentangled_options(hf: dict[str, Any]) -> dict[str, Any]:
  """DeBERTa's keys as config fields (`pos_att_type`, a list or the older "p2c|c2p" string,
  as `BertConfig` normalises it), `norm_rel_ebd` lower-cased; the convolution after block 0
  of some v2 checkpoints is refused by name."""
  if hf.get("conv_kernel_size", 0) > 0:
    raise ValueError(
      f"conv_kernel_size={hf['conv_kernel_size']} (the convolution DeBERTa-v2 "
      "xlarge/xxlarge add after block 0) is not supported by bertjax"
    )
  out: dict[str, Any] = {"pos_att_type": hf.get("pos_att_type") or ()}
  if hf.get("embedding_size") in (None, hf.get("hidden_size")):
    out["embedding_size"] = None  # not factorised (transformers writes it either way)
  if hf.get("norm_rel_ebd") is not None:
    out["norm_rel_ebd"] = "|".join(t.strip() for t in str(hf["norm_rel_ebd"]).lower().split("|"))
  if hf.get("attention_head_size") not in (
    None,
    hf.get("hidden_size", 0) // max(hf.get("num_attention_heads", 1), 1),
  ):
    raise ValueError(
      f"attention_head_size={hf['attention_head_size']} differs from hidden_size"
      " / num_attention_heads; bertjax needs head_dim = hidden_size / heads"
    )
  pooler, hidden = hf.get("pooler_hidden_size"), hf.get("hidden_size")
  if pooler is not None and hidden is not None and pooler != hidden:
    raise ValueError(
      f"pooler_hidden_size={pooler} differs from hidden_size={hidden}; bertjax's "
      "DeBERTa classifier pools to hidden_size"
    )
  return out


PRESETS: dict[str, dict[str, Any]] = {
  # Devlin et al. 2019.
  "bert-base": dict(
    hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072
  ),
  "bert-large": dict(
    hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096
  ),
  # Turc et al. 2019 ("Well-read students"): the small BERT family.
  "bert-tiny": dict(
    hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512
  ),
  "bert-mini": dict(
    hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024
  ),
  "bert-small": dict(
    hidden_size=512, num_hidden_layers=4, num_attention_heads=8, intermediate_size=2048
  ),
  "bert-medium": dict(
    hidden_size=512, num_hidden_layers=8, num_attention_heads=8, intermediate_size=2048
  ),
  # Lan et al. 2020.
  "albert-base": dict(
    model_type="albert",
    vocab_size=30000,
    embedding_size=128,
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    num_hidden_groups=1,
    hidden_act="gelu_new",
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    classifier_dropout_prob=0.1,
  ),
  "albert-large": dict(
    model_type="albert",
    vocab_size=30000,
    embedding_size=128,
    hidden_size=1024,
    num_hidden_layers=24,
    num_attention_heads=16,
    intermediate_size=4096,
    num_hidden_groups=1,
    hidden_act="gelu_new",
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    classifier_dropout_prob=0.1,
  ),
  # Liu et al. 2019.
  "roberta-base": dict(
    model_type="roberta",
    vocab_size=50265,
    max_position_embeddings=514,
    type_vocab_size=1,
    pad_token_id=1,
    layer_norm_eps=1e-5,
  ),
  # Clark et al. 2020 (the discriminators).
  "electra-small": dict(
    model_type="electra",
    embedding_size=128,
    hidden_size=256,
    num_hidden_layers=12,
    num_attention_heads=4,
    intermediate_size=1024,
  ),
  "electra-base": dict(model_type="electra", embedding_size=768),
  # Sanh et al. 2019.
  "distilbert-base": dict(
    model_type="distilbert", num_hidden_layers=6, type_vocab_size=0, classifier_dropout_prob=0.2
  ),
  # Song et al. 2020 (all-mpnet-base-v2's shape).
  "mpnet-base": dict(
    model_type="mpnet",
    vocab_size=30527,
    max_position_embeddings=514,
    pad_token_id=1,
    type_vocab_size=0,
    layer_norm_eps=1e-5,
  ),
  # Warner et al. 2024 (answerdotai/ModernBERT-base and -large).
  "modernbert-base": dict(
    model_type="modernbert",
    vocab_size=50368,
    hidden_size=768,
    num_hidden_layers=22,
    num_attention_heads=12,
    intermediate_size=1152,
    max_position_embeddings=8192,
    pad_token_id=50283,
    layer_types=tuple("sliding_attention" if i % 3 else "full_attention" for i in range(22)),
  ),
  "modernbert-large": dict(
    model_type="modernbert",
    vocab_size=50368,
    hidden_size=1024,
    num_hidden_layers=28,
    num_attention_heads=16,
    intermediate_size=2624,
    max_position_embeddings=8192,
    pad_token_id=50283,
    layer_types=tuple("sliding_attention" if i % 3 else "full_attention" for i in range(28)),
  ),
  # Boizard et al. 2025 (EuroBERT-210m's sizes, transformers' default config).
  "eurobert-210m": dict(
    model_type="eurobert",
    vocab_size=128256,
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    max_position_embeddings=8192,
    pad_token_id=128001,
  ),
  # Nussbaum et al. 2024 (nomic-embed-text-v1.5's shape).
  "nomic-bert": dict(
    model_type="nomic_bert",
    vocab_size=30528,
    max_position_embeddings=2048,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
  ),
  # He et al. 2023 (microsoft/deberta-v3-base's shape).
  "deberta-v3-base": dict(
    model_type="deberta-v2",
    vocab_size=128100,
    type_vocab_size=0,
    relative_attention=True,
    max_relative_positions=-1,
    position_buckets=256,
    norm_rel_ebd="layer_norm",
    share_att_key=True,
    pos_att_type=("p2c", "c2p"),
    position_biased_input=False,
    layer_norm_eps=1e-7,
  ),
  # For tests: small enough to compile and run in a second on a CPU.
  "tiny": dict(
    vocab_size=1000,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    max_position_embeddings=128,
  ),
}


def config_to_json(config: BertConfig) -> dict[str, Any]:
  """The config as a JSON-serialisable dict of its fields (the family's options as a dict)."""
  return dataclasses.asdict(config)


def _frozen(v):
  """Lists as tuples, inside dicts too (JSON's arrays in a config that must hash)."""
  if isinstance(v, dict):
    return {k: _frozen(x) for k, x in v.items()}
  return tuple(_frozen(x) for x in v) if isinstance(v, list) else v


def field_names() -> tuple[str, ...]:
  """Every name `BertConfig` takes: its fields, its groups' fields and every family's options."""
  return (
    tuple(f.name for f in dataclasses.fields(BertConfig)) + tuple(GROUP_OF) + tuple(OPTION_OWNER)
  )


def config_from_json(d: dict[str, Any]) -> BertConfig:
  """Inverse of `config_to_json` (JSON lists become the tuples the frozen config needs)."""
  unknown = sorted(set(d) - set(field_names()))
  if unknown:
    raise ValueError(f"config has unknown fields {unknown}")
  return BertConfig(**d)
