"""The encoder families as data: one row per Hugging Face `model_type`.

Every family here is a post-LayerNorm transformer encoder that the one layer in
`model.py` computes; a row says only how a family differs: the names of its
`config.json` keys, the names of its tensors, where positions start, whether it
has token types, a pooler, shared layers, and which task heads it ships and
what each head reads. `config.py` (config keys), `hf.py` (tensor names,
architectures), `model.py`/`functional.py` (heads, positions) and
`tokenization.py` (special-token roles) read this table; adding the next
family is a new row plus its parity tests.

Our parameter tree is the same for every family (see `model.py`); the tables
below map its paths to each family's Hugging Face names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

# Our per-layer parameter paths, in a fixed order.
LAYER_PATHS = (
    ("attention", "query", "kernel"), ("attention", "query", "bias"),
    ("attention", "key", "kernel"), ("attention", "key", "bias"),
    ("attention", "value", "kernel"), ("attention", "value", "bias"),
    ("attention", "output", "kernel"), ("attention", "output", "bias"),
    ("attention", "LayerNorm", "scale"), ("attention", "LayerNorm", "bias"),
    ("intermediate", "kernel"), ("intermediate", "bias"),
    ("output", "kernel"), ("output", "bias"),
    ("LayerNorm", "scale"), ("LayerNorm", "bias"),
)

# How each layer tensor is laid out (see `hf._KINDS`).
LAYER_KINDS = ("qkv", "qkv_bias", "qkv", "qkv_bias", "qkv", "qkv_bias", "out", "plain",
               "plain", "plain", "linear", "plain", "linear", "plain", "plain", "plain")


def _layer_names(query, key, value, out, attn_norm, ffn_in, ffn_out, out_norm, norm_w="weight"):
  """Hugging Face suffixes within one layer, in `LAYER_PATHS` order."""
  names = []
  for module in (query, key, value, out):
    names += [f"{module}.weight", f"{module}.bias"]
  names += [f"{attn_norm}.{norm_w}", f"{attn_norm}.bias"]
  for module in (ffn_in, ffn_out):
    names += [f"{module}.weight", f"{module}.bias"]
  names += [f"{out_norm}.{norm_w}", f"{out_norm}.bias"]
  return tuple(names)


BERT_LAYER = _layer_names("attention.self.query", "attention.self.key", "attention.self.value",
                          "attention.output.dense", "attention.output.LayerNorm",
                          "intermediate.dense", "output.dense", "output.LayerNorm")
ALBERT_LAYER = _layer_names("attention.query", "attention.key", "attention.value",
                            "attention.dense", "attention.LayerNorm", "ffn", "ffn_output",
                            "full_layer_layer_norm")
DISTILBERT_LAYER = _layer_names("attention.q_lin", "attention.k_lin", "attention.v_lin",
                                "attention.out_lin", "sa_layer_norm", "ffn.lin1", "ffn.lin2",
                                "output_layer_norm")


# Our config fields that every family's `config.json` carries (under `Family.config_keys`
# names where they differ); `Family.config_fields` adds the family's own.
COMMON_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                 "intermediate_size", "hidden_act", "hidden_dropout_prob",
                 "attention_probs_dropout_prob", "max_position_embeddings", "initializer_range",
                 "pad_token_id", "classifier_dropout_prob")
_BERT_FIELDS = COMMON_FIELDS + ("type_vocab_size", "layer_norm_eps")


@dataclasses.dataclass(frozen=True)
class Head:
  """A task head: what it reads and the Hugging Face names of its tensors.

  Attributes:
    reads: "pooled" (the pooler output), "first" (the first token's final
      state: `<s>` or [CLS]) or "tokens" (every token's final state).
    tensors: (our sub-path, Hugging Face name, kind) for each tensor.
    tied: Hugging Face names that are copies of other tensors (the MLM decoder).
    act: the activation inside the head; None means the config's `hidden_act`.
  """

  reads: str
  tensors: tuple[tuple[tuple[str, ...], str, str], ...]
  tied: tuple[str, ...] = ()
  act: str | None = None

  @property
  def names(self) -> tuple[str, ...]:
    return tuple(name for _, name, _ in self.tensors)


def _dense(ours: str, hf: str) -> tuple[tuple[tuple[str, ...], str, str], ...]:
  return (((ours, "kernel"), f"{hf}.weight", "linear"), ((ours, "bias"), f"{hf}.bias", "plain"))


def _norm(ours: str, hf: str) -> tuple[tuple[tuple[str, ...], str, str], ...]:
  return (((ours, "scale"), f"{hf}.weight", "plain"), ((ours, "bias"), f"{hf}.bias", "plain"))


def _mlm(dense: str, norm: str, bias: str, tied: tuple[str, ...], act: str | None) -> Head:
  # Transform (dense -> act -> LayerNorm), then the decoder tied to the word embeddings.
  tensors = _dense("dense", dense) + _norm("LayerNorm", norm) + ((("bias",), bias, "plain"),)
  return Head("tokens", tensors, tied, act)


def _linear(reads: str, hf: str) -> Head:
  return Head(reads, _dense("dense", hf))


def _two_layer(pre: str, out: str, act: str) -> Head:
  """dense -> act -> dense on the first token (RoBERTa, ELECTRA, DistilBERT classifiers)."""
  return Head("first", _dense("pre", pre) + _dense("dense", out), act=act)


@dataclasses.dataclass(frozen=True)
class Family:
  """How one encoder family differs from BERT.

  Attributes:
    model_type: the Hugging Face `model_type`.
    prefix: the base model's attribute in task models ("bert" in `bert.encoder...`).
    layer_prefix: format string of one layer's prefix, after the base prefix; `{i}`
      is the parameter layer (ALBERT: `{g}` group and `{j}` layer within it).
    layer_names: Hugging Face suffixes of the layer tensors, in `LAYER_PATHS` order.
    config_keys: our config field -> its `config.json` key, where they differ.
    config_fields: our config fields its `config.json` carries.
    config_defaults: our config field -> value when `config.json` lacks it (and,
      for fields not in `config_fields`, the only value the family supports).
    projection: Hugging Face name of the E -> H embedding projection, if any.
    pooler: Hugging Face name of the pooler's dense layer, if the family has one.
    positions: "absolute" (0, 1, ...) or "after_padding" (RoBERTa: real tokens
      count from `pad_token_id + 1`, padding sits at `pad_token_id`).
    token_types: whether the family has token-type embeddings.
    shared_layers: ALBERT's cross-layer sharing.
    heads: head name -> `Head`.
    architectures: sorted head names -> Hugging Face class.
    no_pooler: classes built without the pooler (`add_pooling_layer=False`).
    special_tokens: role -> the token the family's tokenizers use by default
      (the checkpoint's tokenizer files override these).
  """

  model_type: str
  prefix: str
  layer_prefix: str
  layer_names: tuple[str, ...]
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

  def architecture(self, heads: tuple[str, ...]) -> str:
    key = tuple(sorted(heads))
    if key not in self.architectures:
      raise ValueError(f"heads={list(key)} on a {self.model_type} model have no Hugging Face "
                       f"class; supported: {sorted(self.architectures)}")
    return self.architectures[key]


_BERT_TOKENS = dict(cls="[CLS]", sep="[SEP]", pad="[PAD]", mask="[MASK]", unk="[UNK]")
_ROBERTA_TOKENS = dict(cls="<s>", sep="</s>", pad="<pad>", mask="<mask>", unk="<unk>", bos="<s>",
                       eos="</s>")


def _roberta_like(model_type: str, cls_prefix: str) -> Family:
  return Family(
      model_type=model_type, prefix="roberta", layer_prefix="encoder.layer.{i}.",
      layer_names=BERT_LAYER, config_fields=_BERT_FIELDS,
      config_keys={"classifier_dropout_prob": "classifier_dropout"},
      config_defaults=dict(pad_token_id=1),
      projection=None, pooler="pooler.dense", positions="after_padding", token_types=True,
      shared_layers=False,
      heads={
          "mlm": _mlm("lm_head.dense", "lm_head.layer_norm", "lm_head.bias",
                      ("lm_head.decoder.weight", "lm_head.decoder.bias"), act="gelu"),
          "classifier": _two_layer("classifier.dense", "classifier.out_proj", "tanh"),
          "token_classifier": _linear("tokens", "classifier"),
      },
      architectures={(): f"{cls_prefix}Model", ("mlm",): f"{cls_prefix}ForMaskedLM",
                     ("classifier",): f"{cls_prefix}ForSequenceClassification",
                     ("token_classifier",): f"{cls_prefix}ForTokenClassification"},
      no_pooler=frozenset(f"{cls_prefix}For{t}" for t in (
          "MaskedLM", "SequenceClassification", "TokenClassification")),
      special_tokens=_ROBERTA_TOKENS)


FAMILIES: dict[str, Family] = {
    "bert": Family(
        model_type="bert", prefix="bert", layer_prefix="encoder.layer.{i}.",
        layer_names=BERT_LAYER, config_fields=_BERT_FIELDS,
        config_keys={"classifier_dropout_prob": "classifier_dropout"},
        config_defaults={}, projection=None, pooler="pooler.dense", positions="absolute",
        token_types=True, shared_layers=False,
        heads={
            "mlm": _mlm("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                        "cls.predictions.bias",
                        ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias"),
                        act=None),
            "nsp": _linear("pooled", "cls.seq_relationship"),
            "classifier": _linear("pooled", "classifier"),
            "token_classifier": _linear("tokens", "classifier"),
        },
        architectures={(): "BertModel", ("mlm",): "BertForMaskedLM",
                       ("mlm", "nsp"): "BertForPreTraining",
                       ("nsp",): "BertForNextSentencePrediction",
                       ("classifier",): "BertForSequenceClassification",
                       ("token_classifier",): "BertForTokenClassification"},
        no_pooler=frozenset({"BertForMaskedLM", "BertForTokenClassification"}),
        special_tokens=_BERT_TOKENS),
    "albert": Family(
        model_type="albert", prefix="albert",
        layer_prefix="encoder.albert_layer_groups.{g}.albert_layers.{j}.",
        layer_names=ALBERT_LAYER,
        config_fields=_BERT_FIELDS + ("embedding_size", "num_hidden_groups", "inner_group_num"),
        config_keys={},
        config_defaults=dict(embedding_size=128, num_hidden_groups=1, inner_group_num=1,
                             classifier_dropout_prob=0.1, vocab_size=30000),
        projection="encoder.embedding_hidden_mapping_in", pooler="pooler",
        positions="absolute", token_types=True, shared_layers=True,
        heads={
            "mlm": _mlm("predictions.dense", "predictions.LayerNorm", "predictions.bias",
                        ("predictions.decoder.weight", "predictions.decoder.bias"), act=None),
            "sop": _linear("pooled", "sop_classifier.classifier"),
            "classifier": _linear("pooled", "classifier"),
            "token_classifier": _linear("tokens", "classifier"),
        },
        architectures={(): "AlbertModel", ("mlm",): "AlbertForMaskedLM",
                       ("mlm", "sop"): "AlbertForPreTraining",
                       ("classifier",): "AlbertForSequenceClassification",
                       ("token_classifier",): "AlbertForTokenClassification"},
        no_pooler=frozenset({"AlbertForMaskedLM", "AlbertForTokenClassification"}),
        special_tokens=dict(_BERT_TOKENS, pad="<pad>", unk="<unk>")),
    "roberta": _roberta_like("roberta", "Roberta"),
    "xlm-roberta": _roberta_like("xlm-roberta", "XLMRoberta"),
    "electra": Family(
        model_type="electra", prefix="electra", layer_prefix="encoder.layer.{i}.",
        layer_names=BERT_LAYER, config_fields=_BERT_FIELDS + ("embedding_size",),
        config_keys={"classifier_dropout_prob": "classifier_dropout"},
        config_defaults=dict(embedding_size=128),
        projection="embeddings_project", pooler=None, positions="absolute", token_types=True,
        shared_layers=False,
        heads={
            # The generator: transform to E with a fixed GELU, decoder tied to the embeddings.
            "mlm": _mlm("generator_predictions.dense", "generator_predictions.LayerNorm",
                        "generator_lm_head.bias", ("generator_lm_head.weight",), act="gelu"),
            # The discriminator: dense -> hidden_act -> one logit per token.
            "rtd": Head("tokens", _dense("dense", "discriminator_predictions.dense")
                        + _dense("out", "discriminator_predictions.dense_prediction")),
            "classifier": _two_layer("classifier.dense", "classifier.out_proj", "gelu"),
            "token_classifier": _linear("tokens", "classifier"),
        },
        architectures={(): "ElectraModel", ("mlm",): "ElectraForMaskedLM",
                       ("rtd",): "ElectraForPreTraining",
                       ("classifier",): "ElectraForSequenceClassification",
                       ("token_classifier",): "ElectraForTokenClassification"},
        no_pooler=frozenset(), special_tokens=_BERT_TOKENS),
    "distilbert": Family(
        model_type="distilbert", prefix="distilbert", layer_prefix="transformer.layer.{i}.",
        layer_names=DISTILBERT_LAYER, config_fields=COMMON_FIELDS + ("sinusoidal_positions",),
        config_keys=dict(hidden_size="dim", num_hidden_layers="n_layers",
                         num_attention_heads="n_heads", intermediate_size="hidden_dim",
                         hidden_act="activation", hidden_dropout_prob="dropout",
                         attention_probs_dropout_prob="attention_dropout",
                         classifier_dropout_prob="seq_classif_dropout",
                         sinusoidal_positions="sinusoidal_pos_embds"),
        config_defaults=dict(type_vocab_size=0, layer_norm_eps=1e-12,
                             classifier_dropout_prob=0.2, hidden_size=768, num_hidden_layers=6,
                             num_attention_heads=12, intermediate_size=3072),
        projection=None, pooler=None, positions="absolute", token_types=False,
        shared_layers=False,
        heads={
            "mlm": _mlm("vocab_transform", "vocab_layer_norm", "vocab_projector.bias",
                        ("vocab_projector.weight",), act=None),
            "classifier": _two_layer("pre_classifier", "classifier", "relu"),
            "token_classifier": _linear("tokens", "classifier"),
        },
        architectures={(): "DistilBertModel", ("mlm",): "DistilBertForMaskedLM",
                       ("classifier",): "DistilBertForSequenceClassification",
                       ("token_classifier",): "DistilBertForTokenClassification"},
        no_pooler=frozenset(), special_tokens=_BERT_TOKENS),
}

MODEL_TYPES = tuple(FAMILIES)
HEADS = ("mlm", "nsp", "sop", "rtd", "classifier", "token_classifier")


def family(model_type: str) -> Family:
  """The row for `model_type`, or a ValueError naming the supported ones."""
  if model_type not in FAMILIES:
    raise ValueError(f"model_type={model_type!r} is not supported; expected one of {MODEL_TYPES}")
  return FAMILIES[model_type]
