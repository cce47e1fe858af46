"""The shape of the family table: what a row (`Family`) and a head (`Head`) hold.

`bertjax.model.families` holds the rows themselves (and re-exports these names); this module
says what each field of a row means, with the role names and value sets the rows use.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

# Roles of a layer's tensors -> our parameter path (under encoder/layers). Each role is a
# linear module (kernel + optional bias) or a norm (scale + optional bias).
LAYER_ROLES: dict[str, tuple[str, ...]] = {
  "query": ("attention", "query"),
  "key": ("attention", "key"),
  "value": ("attention", "value"),
  "attn_output": ("attention", "output"),
  "attn_norm": ("attention", "LayerNorm"),
  "ffn_in": ("intermediate",),
  "ffn_gate": ("gate",),
  "ffn_out": ("output",),
  "ffn_norm": ("LayerNorm",),
  # Sandwich blocks (Gemma 3): the norms of each sublayer's output, before the residual.
  "attn_post_norm": ("attention", "post_LayerNorm"),
  "ffn_post_norm": ("post_LayerNorm",),
  # QK-norm: each head's query and key normed over the head dimension, before rotary.
  "q_norm": ("attention", "q_norm"),
  "k_norm": ("attention", "k_norm"),
  # DeBERTa: the projections of the shared relative embeddings (absent with share_att_key).
  "pos_key": ("attention", "pos_key"),
  "pos_query": ("attention", "pos_query"),
}
NORM_ROLES = ("attn_norm", "ffn_norm", "attn_post_norm", "ffn_post_norm", "q_norm", "k_norm")
# Fused Hugging Face tensors -> the roles they hold, in order along the output axis.
FUSED = {
  "qkv": ("query", "key", "value"),
  "gate_in": ("ffn_gate", "ffn_in"),
  # NeoBERT's qkv: per head, that head's query, key and value rows (H q_h k_h v_h blocks).
  "qkv_per_head": ("query", "key", "value"),
}

NORMS = ("post", "pre", "sandwich")
NORM_KINDS = ("layernorm", "rmsnorm")
POSITIONS = ("absolute", "after_padding", "rotary")
POSITION_BIASES = (None, "relative_buckets", "disentangled")
FFNS = ("dense", "gated")
LAYER_TYPES = ("full_attention", "sliding_attention")
ROTARY_LAYOUTS = ("halves", "pairs")


def swiglu_width(intermediate_size: int) -> int:
  """NeoBERT's FFN width from its `intermediate_size`: two thirds of it, rounded up to a
  multiple of 8 (3072 -> 2048), as its released code sizes xformers' SwiGLU."""
  return 8 * ((int(2 * intermediate_size / 3) + 7) // 8)


@dataclasses.dataclass(frozen=True)
class Head:
  """A task head: what it reads, how it is built, and the Hugging Face names of its tensors.

  Attributes:
    reads: "pooled" (the pooler output), "first" (the first token's final state), "tokens"
      (every token's final state) or "pooling" (`config.classifier_pooling` decides: "cls"
      or "bos" the first token, "mean" the masked mean of the tokens, "late" per-token
      logits then their masked mean).
    tensors: (our sub-path, Hugging Face name, kind, config flag or None) per tensor; a
      tensor with a flag exists only when that config field is true (a bias switched off).
    tied: Hugging Face names that are copies of other tensors (the MLM decoder).
    act: the activation inside the head; None means the config's `hidden_act`,
      "classifier" the config's `classifier_activation`.
    pre_dropout: whether dropout precedes the first dense layer of a two-layer head.
    dropout: the config rate its dropout uses: "classifier" (`classifier_dropout`),
      "hidden" (`hidden_dropout_prob`: DistilBERT's token classifier) or "none".
    width: the config attribute that sizes an MLM transform's first layer when it is not
      the embedding width (UltraBERT's `prediction_head_size`); None: the embedding width.
  """

  reads: str
  tensors: tuple[tuple[tuple[str, ...], str, str, str | None], ...]
  tied: tuple[str, ...] = ()
  act: str | None = None
  pre_dropout: bool = True
  dropout: str = "classifier"
  width: str | None = None

  @property
  def names(self) -> tuple[str, ...]:
    """The names of the head's tensors, in order."""
    return tuple(name for _, name, _, _ in self.tensors)

  def has(self, sub: str) -> bool:
    """Whether the head has a module named `sub` (e.g. "pre", "norm", "decoder")."""
    return any(path[0] == sub for path, _, _, _ in self.tensors)

  def has_tensor(self, config, path: tuple[str, ...]) -> bool:
    """Whether `config` gives this head the tensor at `path` (a bias may be switched off)."""
    return any(p == path for p, _, _ in self.present(config))

  def present(self, config) -> tuple[tuple[tuple[str, ...], str, str], ...]:
    """(our sub-path, Hugging Face name, kind) of the tensors `config` gives this head."""
    return tuple(
      (path, name, kind)
      for path, name, kind, flag in self.tensors
      if flag is None or getattr(config, flag)
    )


def _dense(ours: str, hf: str, bias: str | None = None):
  """A linear module's tensors; `bias` names the config flag its bias depends on, if any."""
  return (
    ((ours, "kernel"), f"{hf}.weight", "linear", None),
    ((ours, "bias"), f"{hf}.bias", "plain", bias),
  )


def _norm(ours: str, hf: str, bias: str | None = None):
  return (
    ((ours, "scale"), f"{hf}.weight", "plain", None),
    ((ours, "bias"), f"{hf}.bias", "plain", bias),
  )


def _mlm(dense: str, norm: str, bias: str, tied: tuple[str, ...], act: str | None) -> Head:
  # Transform (dense -> act -> LayerNorm), then the decoder tied to the word embeddings.
  tensors = _dense("dense", dense) + _norm("LayerNorm", norm) + ((("bias",), bias, "plain", None),)
  return Head("tokens", tensors, tied, act)


def _linear(reads: str, hf: str) -> Head:
  return Head(reads, _dense("dense", hf))


def _two_layer(pre: str, out: str, act: str, reads: str = "first") -> Head:
  """dense -> act -> dense (RoBERTa, ELECTRA, DistilBERT, MPNet, EuroBERT classifiers)."""
  return Head(reads, _dense("pre", pre) + _dense("dense", out), act=act)


@dataclasses.dataclass(frozen=True)
class Family:
  """How one encoder family's model is built and named.

  Attributes:
    model_type: the Hugging Face `model_type`.
    prefix: the base model's attribute in task models ("bert" in `bert.encoder...`).
    layer_prefix: format string of one layer's prefix, after the base prefix; `{i}`
      is the parameter layer (ALBERT: `{g}` group and `{j}` layer within it).
    layer_names: role (`LAYER_ROLES`, or a fused name of `FUSED`) -> Hugging Face module
      name within the layer.
    embedding_names: "word", "position", "token_type", "norm" -> module names after the
      base prefix (a missing entry: the family has no such module).
    config_keys: our config field -> its `config.json` key, where they differ.
    config_fields: our config fields its `config.json` carries.
    config_defaults: our config field -> value when `config.json` lacks it (and,
      for fields not in `config_fields`, the only value the family supports).
    projection: Hugging Face name of the E -> H embedding projection, if any.
    always_project: the projection exists even when E == H (ALBERT); otherwise only when
      the embeddings are factorised (ELECTRA with E != H).
    pooler: Hugging Face name of the pooler's dense layer, if the family has one.
    final_norm: Hugging Face name of the norm after the last block (pre-LN), if any.
    relative_bias: Hugging Face name of the relative-position table shared by every layer, if
      any (MPNet's bias table; DeBERTa's relative embeddings).
    relative_norm: Hugging Face name of the norm of DeBERTa's relative embeddings
      (`norm_rel_ebd="layer_norm"`).
    projection_bias: whether the E -> H embedding projection has a bias (DeBERTa's has none).
    project_before_norm: the projection precedes the embedding norm (DeBERTa: the norm is
      over H), rather than following its dropout (ALBERT, ELECTRA: the norm is over E).
    ignored_prefixes: tensors a checkpoint may hold that no transformers class reads
      (DeBERTa-v3's replaced-token-detection head `mask_predictions.*`).
    ignored_keys: `config.json` keys of this family that change nothing bertjax computes,
      beyond `IGNORED_CONFIG_KEYS`; any other key bertjax does not read is refused by name.
    positions: "absolute" (0, 1, ...), "after_padding" (RoBERTa, MPNet: real tokens
      count from `pad_token_id + 1`, padding sits at `pad_token_id`) or "rotary" (no
      position table; q and k rotated in every layer).
    position_bias: None, "relative_buckets" (MPNet: T5's bidirectional buckets, one
      table shared by every layer) or "disentangled" (DeBERTa: content-to-position and
      position-to-content terms from relative embeddings shared by every layer, projected
      by each; `kernels.DisentangledBias`).
    norm: "post" (BERT: `LN(x + sublayer(x))`), "pre" (`x + sublayer(LN(x))`, and the
      final norm after the last block) or "sandwich" (Gemma 3: `x + LN'(sublayer(LN(x)))`,
      each sublayer's output normed too before the residual; the final norm too).
    norm_kind: "layernorm" or "rmsnorm".
    norm_offset: a norm multiplies by `offset + scale` (Gemma's `1 + w`: its weights are
      stored as `w`, initialised to 0); 0 for every other family.
    embedding_scale: the word embeddings are multiplied by `sqrt(hidden_size)` (Gemma).
    rotary_layout: how q and k are rotated: "halves" (transformers' `rotate_half`: dimension i
      pairs with i + D/2) or "pairs" (NeoBERT: dimensions 2i and 2i + 1, as complex numbers).
    rope_keys: its `config.json` carries the rotary theta (`rope_parameters`) and `head_dim`;
      False where the family's code fixes the theta (NeoBERT: 10000), which is then refused
      at any other value.
    ffn_width: the FFN's width from `config.intermediate_size` where they differ
      (`swiglu_width`: NeoBERT); None: the FFN is `intermediate_size` wide.
    required_values: `config.json` keys whose only value bertjax implements is this one
      (EmbeddingGemma's `use_bidirectional_attention: true`); another value is refused by
      name, and `to_hf` writes them.
    ffn: "dense" (`act(x W1) W2`) or "gated" (`(act(x Wg) * (x W1)) W2`: GeGLU, SwiGLU).
    first_attn_norm: False when block 0 has no attention norm (ModernBERT: the embedding
      norm precedes it).
    ffn_dropout: "after" (BERT: dropout on the FFN output) or "inside" (ModernBERT:
      between the activation and the output projection).
    token_types: whether the family has token-type embeddings.
    optional_token_types: they may be absent (`type_vocab_size=0`: DeBERTa-v3).
    shared_layers: ALBERT's cross-layer sharing.
    heads: head name -> `Head`.
    architectures: sorted head names -> Hugging Face class.
    no_pooler: classes built without the pooler (`add_pooling_layer=False`).
    special_tokens: role -> the token the family's tokenizers use by default
      (the checkpoint's tokenizer files override these).
    wordpiece_class: the transformers class that turns a bare `vocab.txt` into the family's
      tokenizer (MPNet's `<s> A </s></s> B </s>` template), where BERT's does not fit.
    options: the frozen dataclass of the options this family alone has
      (`bertjax.model.options`), held by `BertConfig.options`; None: it has none.
    poolings: the `classifier_pooling` values its classifier takes (ModernBERT's and
      EuroBERT's names).
    layer_typed: its `config.json` gives `layer_types` and one rotary theta per layer type
      even when every layer is full (ModernBERT's and UltraBERT's layout).
    global_every: where a `config.json` of the family gives no `layer_types`, a global
      layer every this many layers from the first (ModernBERT's older files, or their
      `global_attn_every_n_layers`); None: such a file is refused.
    window_radius: its `config.json` gives the sliding window as the radius r (keys with
      |q - k| <= r: UltraBERT), which bertjax holds as `sliding_window` = 2 r.
    training: what bertjax's trainers do with the family beyond MLM: "stacking" (progressive
      stacking copies its layers), "shared_student" (the family whose block a shared-layer
      student of it is, `distill.shared_student_from_teacher`), "rtd" (how a replaced-token
      detection pair shares embeddings: "tables", ELECTRA's one copy, or "gdes", DeBERTa-v3's
      gradient-disentangled sharing).
    what_differs: one line for the README's families table.
  """

  model_type: str
  prefix: str
  layer_prefix: str
  layer_names: Mapping[str, str]
  config_fields: tuple[str, ...]
  config_keys: Mapping[str, str]
  config_defaults: Mapping[str, object]
  projection: str | None
  pooler: str | None
  positions: str
  token_types: bool
  shared_layers: bool
  heads: Mapping[str, Head]
  architectures: Mapping[tuple[str, ...], str]
  no_pooler: frozenset[str]
  special_tokens: Mapping[str, str]
  embedding_names: Mapping[str, str] = dataclasses.field(
    default_factory=lambda: dict(
      word="embeddings.word_embeddings",
      position="embeddings.position_embeddings",
      token_type="embeddings.token_type_embeddings",
      norm="embeddings.LayerNorm",
    )
  )
  final_norm: str | None = None
  relative_bias: str | None = None
  relative_norm: str | None = None
  projection_bias: bool = True
  project_before_norm: bool = False
  optional_token_types: bool = False
  ignored_prefixes: tuple[str, ...] = ()
  ignored_keys: tuple[str, ...] = ()
  position_bias: str | None = None
  norm: str = "post"
  norm_kind: str = "layernorm"
  norm_offset: float = 0.0
  embedding_scale: bool = False
  rotary_layout: str = "halves"
  rope_keys: bool = True
  ffn_width: Callable[[int], int] | None = None
  required_values: Mapping[str, object] = dataclasses.field(default_factory=dict)
  ffn: str = "dense"
  first_attn_norm: bool = True
  ffn_dropout: str = "after"
  always_project: bool = False
  wordpiece_class: str | None = None
  options: type | None = None
  poolings: tuple[str, ...] = ("cls",)
  layer_typed: bool = False
  global_every: int | None = None
  window_radius: bool = False
  training: Mapping[str, str] = dataclasses.field(default_factory=dict)
  what_differs: str = ""

  def __post_init__(self):
    for name, allowed in (
      ("norm", NORMS),
      ("norm_kind", NORM_KINDS),
      ("positions", POSITIONS),
      ("position_bias", POSITION_BIASES),
      ("ffn", FFNS),
      ("ffn_dropout", ("after", "inside")),
      ("rotary_layout", ROTARY_LAYOUTS),
    ):
      if getattr(self, name) not in allowed:
        raise ValueError(
          f"Family {self.model_type!r}: {name}={getattr(self, name)!r} must be one of {allowed}"
        )

  def architecture(self, heads: tuple[str, ...]) -> str:
    """The Hugging Face class name for a model with these `heads` (e.g. "BertForMaskedLM").

    Raises:
      ValueError: the family has no class with exactly these heads."""
    key = tuple(sorted(heads))
    if key not in self.architectures:
      raise ValueError(
        f"heads={list(key)} on a {self.model_type} model have no Hugging Face "
        f"class; supported: {sorted(self.architectures)}"
      )
    return self.architectures[key]

  @property
  def pre_norm(self) -> bool:
    """Whether each sublayer reads its input through a norm (pre-LN and sandwich blocks)."""
    return self.norm != "post"

  @property
  def qk_norm(self) -> bool:
    """Whether queries and keys are normed per head before rotary (Gemma 3's QK-norm)."""
    return "q_norm" in self.layer_names

  @property
  def roles(self) -> tuple[str, ...]:
    """The layer roles this family's block has (fused names expanded)."""
    roles = []
    for name in self.layer_names:
      roles.extend(FUSED.get(name, (name,)))
    return tuple(r for r in LAYER_ROLES if r in roles)
