"""One frozen config for every encoder family, with presets and the Hugging Face mapping.

The family (`model_type`: BERT, ALBERT, RoBERTa, XLM-R, ELECTRA, DistilBERT) is
a row of `bertjax.families`; this config holds the sizes and numerics, and its
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
from typing import Any

from bertjax.families import FAMILIES, MODEL_TYPES, Family, family
from bertjax.kernels import IMPLS as _ATTENTION_IMPLS

_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu", "silu", "swish", "tanh")
_DTYPES = ("float32", "bfloat16", "float64")  # float64 needs jax_enable_x64 (for exact checks)


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """Architecture and numerics of an encoder of any family in `bertjax.families`.

  Hashable, so it can be passed to `jax.jit` as a static argument.
  `embedding_size=None` means `hidden_size`; `num_hidden_groups=None` means one
  group per layer (no sharing, BERT); `type_vocab_size=0` means no token-type
  embeddings (DistilBERT).
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
  classifier_dropout_prob: float | None = None
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  layer_norm_eps: float = 1e-12
  initializer_range: float = 0.02
  num_hidden_groups: int | None = None
  inner_group_num: int = 1
  model_type: str = "bert"
  use_pooler: bool = True
  # DistilBERT's fixed sinusoidal position table (not trained).
  sinusoidal_positions: bool = False
  num_labels: int = 2
  # Class names of the classifier heads, index -> name (Hugging Face `id2label`).
  label_names: tuple[str, ...] | None = None
  pad_token_id: int = 0
  dtype: str = "float32"
  attention_impl: str = "xla"
  # Blocks per iteration of the layer scan (1: a rolled loop, compile time flat in depth;
  # depth: fully unrolled, which lets XLA fuse across blocks). Numerics are unchanged.
  scan_unroll: int = 1
  # Physically removed heads, as sorted (layer, (head, ...)) pairs in original head indices.
  pruned_heads: tuple[tuple[int, tuple[int, ...]], ...] = ()
  # Forward mode of the linear layers: None (float) or "int8" (dynamic int8, `bertjax.quantize`).
  quantize: str | None = None

  def __post_init__(self):
    for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                 "intermediate_size", "max_position_embeddings",
                 "inner_group_num", "num_labels", "scan_unroll"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive int")
    if self.model_type not in MODEL_TYPES:
      raise ValueError(f"model_type={self.model_type!r} must be one of {MODEL_TYPES}")
    fam = self.family
    if not isinstance(self.type_vocab_size, int) or self.type_vocab_size < int(fam.token_types):
      raise ValueError(f"type_vocab_size={self.type_vocab_size!r} must be an int >= "
                       f"{int(fam.token_types)} for model_type={self.model_type!r}")
    if not fam.token_types and self.type_vocab_size:
      raise ValueError(f"model_type={self.model_type!r} has no token-type embeddings; got "
                       f"type_vocab_size={self.type_vocab_size}")
    if self.label_names is not None and len(self.label_names) != self.num_labels:
      raise ValueError(f"label_names={self.label_names} must name num_labels={self.num_labels} "
                       "classes")
    if self.max_length < 1:
      raise ValueError(f"max_position_embeddings={self.max_position_embeddings} leaves no usable "
                       f"positions after pad_token_id={self.pad_token_id} ({self.model_type})")
    if self.hidden_act not in _ACTIVATIONS:
      raise ValueError(f"hidden_act={self.hidden_act!r} must be one of {_ACTIVATIONS}")
    if self.dtype not in _DTYPES:
      raise ValueError(f"dtype={self.dtype!r} must be one of {_DTYPES}")
    if self.attention_impl not in _ATTENTION_IMPLS:
      raise ValueError(f"attention_impl={self.attention_impl!r} must be one of {_ATTENTION_IMPLS}")
    if self.quantize not in (None, "int8"):
      raise ValueError(f"quantize={self.quantize!r} must be None or 'int8'")
    if self.hidden_size % self.num_attention_heads:
      raise ValueError(
          f"hidden_size={self.hidden_size} must be divisible by "
          f"num_attention_heads={self.num_attention_heads}")
    groups = self.groups
    if not 1 <= groups <= self.num_hidden_layers:
      raise ValueError(
          f"num_hidden_groups={groups} must be in [1, num_hidden_layers={self.num_hidden_layers}]")
    if not fam.shared_layers and (groups != self.num_hidden_layers or self.inner_group_num != 1):
      raise ValueError(
          f"model_type={self.model_type!r} has no layer sharing: got num_hidden_groups={groups}, "
          f"inner_group_num={self.inner_group_num}; use model_type='albert'")
    for layer, heads in self.pruned_heads:
      if fam.shared_layers:
        raise ValueError(f"pruned_heads is not supported for model_type={self.model_type!r} "
                         "(its layers share weights: use head masks)")
      if not 0 <= layer < self.num_hidden_layers or any(
          not 0 <= h < self.num_attention_heads for h in heads):
        raise ValueError(f"pruned_heads entry {(layer, heads)} is out of range for "
                         f"{self.num_hidden_layers} layers x {self.num_attention_heads} heads")
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
      if not 0.0 <= getattr(self, name) < 1.0:
        raise ValueError(f"{name}={getattr(self, name)} must be in [0, 1)")

  # Derived structure -------------------------------------------------------

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
    """The longest input the position table allows."""
    return self.max_position_embeddings - self.position_offset

  @property
  def embed_dim(self) -> int:
    """Width of the token embeddings (ALBERT's E)."""
    return self.embedding_size or self.hidden_size

  @property
  def has_embedding_projection(self) -> bool:
    """ALBERT always maps E -> H; other families only when factorised (E != H)."""
    return self.model_type == "albert" or self.embed_dim != self.hidden_size

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_attention_heads

  @property
  def groups(self) -> int:
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
    return any(heads for _, heads in self.pruned_heads)

  def kept_heads(self, layer: int) -> tuple[int, ...]:
    """Original indices of the heads layer `layer` still has."""
    removed = dict(self.pruned_heads).get(layer, ())
    return tuple(h for h in range(self.num_attention_heads) if h not in removed)

  @property
  def classifier_dropout(self) -> float:
    p = self.classifier_dropout_prob
    if p is None:
      p = self.family.config_defaults.get("classifier_dropout_prob", self.hidden_dropout_prob)
    return p

  def replace(self, **changes: Any) -> BertConfig:
    return dataclasses.replace(self, **changes)

  # Presets -----------------------------------------------------------------

  @classmethod
  def preset(cls, name: str, **overrides: Any) -> BertConfig:
    """A named architecture (see `PRESETS`), with any field overridden."""
    if name not in PRESETS:
      raise ValueError(f"preset {name=!r} is unknown; expected one of {sorted(PRESETS)}")
    return cls(**{**PRESETS[name], **overrides})

  # Hugging Face mapping ----------------------------------------------------

  @classmethod
  def from_hf_dict(cls, hf: dict[str, Any], **overrides: Any) -> BertConfig:
    """Builds a config from a Hugging Face `config.json` dictionary of any supported family."""
    model_type = hf.get("model_type")
    if model_type not in FAMILIES:
      raise ValueError(f"model_type={model_type!r} in config.json is not supported; "
                       f"expected one of {MODEL_TYPES}")
    fam = FAMILIES[model_type]
    if hf.get("position_embedding_type", "absolute") != "absolute":
      raise ValueError(f"position_embedding_type={hf['position_embedding_type']!r} is not "
                       "supported; expected 'absolute'")
    if hf.get("tie_word_embeddings") is False:
      raise ValueError("tie_word_embeddings=False is not supported: every family here ties the "
                       "MLM decoder to the word embeddings")
    kwargs: dict[str, Any] = {"model_type": model_type}
    for field in fam.config_fields:
      value = hf.get(fam.config_keys.get(field, field))
      if value is not None:
        kwargs[field] = value
    for field, value in fam.config_defaults.items():
      kwargs.setdefault(field, value)
    labels = hf.get("id2label") or {}
    kwargs["num_labels"] = hf.get("num_labels") or len(labels) or 2
    if labels and len(labels) == kwargs["num_labels"]:
      names = tuple(str(labels.get(str(i), labels.get(i, f"LABEL_{i}")))
                    for i in range(len(labels)))
      if names != tuple(f"LABEL_{i}" for i in range(len(labels))):
        kwargs["label_names"] = names
    pruned = {int(k): tuple(sorted(set(v))) for k, v in (hf.get("pruned_heads") or {}).items()}
    kwargs["pruned_heads"] = tuple(sorted((k, v) for k, v in pruned.items() if v))
    kwargs.update(overrides)
    return cls(**kwargs)

  def label_name(self, i: int) -> str:
    return self.label_names[i] if self.label_names else f"LABEL_{i}"

  def to_hf_dict(self, architectures: list[str] | None = None) -> dict[str, Any]:
    """The Hugging Face `config.json` dictionary for this config."""
    fam = self.family
    if self.has_embedding_projection and "embedding_size" not in fam.config_fields:
      raise ValueError(
          f"a {self.model_type} config with embedding_size={self.embed_dim} != hidden_size="
          f"{self.hidden_size} has no Hugging Face equivalent; use model_type='albert' or "
          "'electra'")
    for field in sorted(set(fam.config_defaults) - set(fam.config_fields)):
      if getattr(self, field) != fam.config_defaults[field]:
        raise ValueError(f"{field}={getattr(self, field)!r} has no Hugging Face equivalent for "
                         f"model_type={self.model_type!r} (it is fixed at "
                         f"{fam.config_defaults[field]!r})")
    values = dict(embedding_size=self.embed_dim, num_hidden_groups=self.groups,
                  classifier_dropout_prob=(self.classifier_dropout if fam.shared_layers
                                           else self.classifier_dropout_prob))
    hf: dict[str, Any] = {"model_type": self.model_type}
    for field in fam.config_fields:
      hf[fam.config_keys.get(field, field)] = values.get(field, getattr(self, field))
    hf["position_embedding_type"] = "absolute"
    hf.update(num_labels=self.num_labels,
              id2label={str(i): self.label_name(i) for i in range(self.num_labels)},
              label2id={self.label_name(i): i for i in range(self.num_labels)})
    if self.is_pruned:
      hf["pruned_heads"] = {str(layer): list(heads) for layer, heads in self.pruned_heads}
    if architectures:
      hf["architectures"] = list(architectures)
    return hf


PRESETS: dict[str, dict[str, Any]] = {
    # Devlin et al. 2019.
    "bert-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                      intermediate_size=3072),
    "bert-large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                       intermediate_size=4096),
    # Turc et al. 2019 ("Well-read students"): the small BERT family.
    "bert-tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=512),
    "bert-mini": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                      intermediate_size=1024),
    "bert-small": dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                       intermediate_size=2048),
    "bert-medium": dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                        intermediate_size=2048),
    # Lan et al. 2020.
    "albert-base": dict(model_type="albert", vocab_size=30000, embedding_size=128,
                        hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                        intermediate_size=3072, num_hidden_groups=1, hidden_act="gelu_new",
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        classifier_dropout_prob=0.1),
    "albert-large": dict(model_type="albert", vocab_size=30000, embedding_size=128,
                         hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                         intermediate_size=4096, num_hidden_groups=1, hidden_act="gelu_new",
                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                         classifier_dropout_prob=0.1),
    # Liu et al. 2019.
    "roberta-base": dict(model_type="roberta", vocab_size=50265, max_position_embeddings=514,
                         type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5),
    # Clark et al. 2020 (the discriminators).
    "electra-small": dict(model_type="electra", embedding_size=128, hidden_size=256,
                          num_hidden_layers=12, num_attention_heads=4, intermediate_size=1024),
    "electra-base": dict(model_type="electra", embedding_size=768),
    # Sanh et al. 2019.
    "distilbert-base": dict(model_type="distilbert", num_hidden_layers=6, type_vocab_size=0,
                            classifier_dropout_prob=0.2),
    # For tests: small enough to compile and run in a second on a CPU.
    "tiny": dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=128, max_position_embeddings=128),
}


def config_to_json(config: BertConfig) -> dict[str, Any]:
  """The config as a JSON-serialisable dict of its fields."""
  return dataclasses.asdict(config)


def config_from_json(d: dict[str, Any]) -> BertConfig:
  """Inverse of `config_to_json` (JSON lists become the tuples the frozen config needs)."""
  def tuples(v):
    return tuple(tuples(x) for x in v) if isinstance(v, list) else v
  fields = {f.name for f in dataclasses.fields(BertConfig)}
  unknown = sorted(set(d) - fields)
  if unknown:
    raise ValueError(f"config has unknown fields {unknown}")
  return BertConfig(**{k: tuples(v) for k, v in d.items()})
