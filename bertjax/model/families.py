"""The encoder families as data: one row per Hugging Face `model_type`.

A row describes the whole block, so the one layer in `layers.py` reads the row and never
`model_type`: where the norms sit (after each sublayer's residual, BERT; or before it, with
a final norm after the last block, ModernBERT/EuroBERT; or both, Gemma 3), which norm
(LayerNorm, RMSNorm, Gemma's `1 + w`), how positions enter (a learned table counted from 0 or
after the padding index, a fixed sinusoidal table, rotary q/k on halves or on interleaved
pairs, a relative-position bias shared by every layer), the feed-forward kind (dense, or
gated: GeGLU/SwiGLU) and its width rule, and the names of every tensor. What a
config may switch (biases, grouped key/value heads, the per-layer window and rope theta) are
config fields (`config.py`) whose Hugging Face keys the row names. `config.py` (config
keys), `hf.py` (tensor names, fused tensors, architectures), `layers.py` (block,
positions), `heads.py` (heads) and `tokenizer.py` (special-token roles) read this table;
adding the next family is a new row plus its parity tests.

Our parameter tree has the same paths for every family (see `layers.py`); the tables below
map its roles to each family's Hugging Face names. What each field of a row means is
`bertjax.model.family_schema` (`Family`, `Head`, the role names; re-exported here); a family's
own config options are `bertjax.model.options`.
"""

from __future__ import annotations

import dataclasses

from bertjax.model.family_schema import (
  FFNS,
  FUSED,
  LAYER_ROLES,
  LAYER_TYPES,
  NORM_KINDS,
  NORM_ROLES,
  NORMS,
  POSITION_BIASES,
  POSITIONS,
  Family,
  Head,
  _dense,
  _linear,
  _mlm,
  _norm,
  _two_layer,
  swiglu_width,
)
from bertjax.model.options import (
  DebertaOptions,
  DistilBertOptions,
  Gemma3Options,
  MPNetOptions,
  UltraBertOptions,
)

# The table and, re-exported, the shape of its rows (`bertjax.model.family_schema`).
__all__ = [
  "COMMON_FIELDS",
  "FAMILIES",
  "FFNS",
  "FUSED",
  "HEADS",
  "IGNORED_CONFIG_KEYS",
  "INERT_CONFIG_VALUES",
  "LAYER_ROLES",
  "LAYER_TYPES",
  "MODEL_TYPES",
  "NORMS",
  "NORM_KINDS",
  "NORM_ROLES",
  "POSITIONS",
  "POSITION_BIASES",
  "Family",
  "Head",
  "family",
  "register",
]


def _bert_layer(query, key, value, out, attn_norm, ffn_in, ffn_out, ffn_norm):
  return dict(
    query=query,
    key=key,
    value=value,
    attn_output=out,
    attn_norm=attn_norm,
    ffn_in=ffn_in,
    ffn_out=ffn_out,
    ffn_norm=ffn_norm,
  )


BERT_LAYER = _bert_layer(
  "attention.self.query",
  "attention.self.key",
  "attention.self.value",
  "attention.output.dense",
  "attention.output.LayerNorm",
  "intermediate.dense",
  "output.dense",
  "output.LayerNorm",
)
ALBERT_LAYER = _bert_layer(
  "attention.query",
  "attention.key",
  "attention.value",
  "attention.dense",
  "attention.LayerNorm",
  "ffn",
  "ffn_output",
  "full_layer_layer_norm",
)
DISTILBERT_LAYER = _bert_layer(
  "attention.q_lin",
  "attention.k_lin",
  "attention.v_lin",
  "attention.out_lin",
  "sa_layer_norm",
  "ffn.lin1",
  "ffn.lin2",
  "output_layer_norm",
)
MPNET_LAYER = _bert_layer(
  "attention.attn.q",
  "attention.attn.k",
  "attention.attn.v",
  "attention.attn.o",
  "attention.LayerNorm",
  "intermediate.dense",
  "output.dense",
  "output.LayerNorm",
)
# The Llama-style layer of EuroBERT and NomicBERT (NomicBERT's norms sit after the residual).
LLAMA_LAYER = dict(
  query="self_attn.q_proj",
  key="self_attn.k_proj",
  value="self_attn.v_proj",
  attn_output="self_attn.o_proj",
  ffn_gate="mlp.gate_proj",
  ffn_in="mlp.up_proj",
  ffn_out="mlp.down_proj",
)
DEBERTA_LAYER = dict(
  _bert_layer(
    "attention.self.query_proj",
    "attention.self.key_proj",
    "attention.self.value_proj",
    "attention.output.dense",
    "attention.output.LayerNorm",
    "intermediate.dense",
    "output.dense",
    "output.LayerNorm",
  ),
  pos_key="attention.self.pos_key_proj",
  pos_query="attention.self.pos_query_proj",
)
MODERNBERT_LAYER = dict(
  qkv="attn.Wqkv",
  attn_output="attn.Wo",
  attn_norm="attn_norm",
  gate_in="mlp.Wi",
  ffn_out="mlp.Wo",
  ffn_norm="mlp_norm",
)


# Our config fields that every family's `config.json` carries (under `Family.config_keys`
# names where they differ); `Family.config_fields` adds the family's own.
COMMON_FIELDS = (
  "vocab_size",
  "hidden_size",
  "num_hidden_layers",
  "num_attention_heads",
  "intermediate_size",
  "hidden_act",
  "hidden_dropout_prob",
  "attention_probs_dropout_prob",
  "max_position_embeddings",
  "initializer_range",
  "pad_token_id",
  "classifier_dropout_prob",
)
_BERT_FIELDS = COMMON_FIELDS + ("type_vocab_size", "layer_norm_eps")

# `config.json` keys that change nothing bertjax computes, whatever their value, in every
# family (a family's own are `Family.ignored_keys`). `BertConfig.from_hf_dict` refuses by name
# any other key it does not read: a checkpoint whose block differs from its row never loads
# without a word. These are what transformers' `PretrainedConfig` (4.x and 5.x) writes besides
# the block, and what released checkpoints carry from the code that trained them.
IGNORED_CONFIG_KEYS = frozenset(
  {
    # bookkeeping; `auto_map` names remote code, whose transformers class is the reference
    "_name_or_path",
    "_commit_hash",
    "transformers_version",
    "architectures",  # read by `from_hf` to tell the heads apart, never needed
    "auto_map",
    # the dtype the weights were saved in (bertjax's own is the `dtype` override)
    "torch_dtype",
    "dtype",
    "use_bfloat16",
    # labels, tasks and losses (`id2label` and `num_labels` are read)
    "label2id",
    "problem_type",
    "finetuning_task",
    "tf_legacy_loss",
    # the tokenizer's (`pad_token_id` is read: positions count from it in some families)
    "tokenizer_class",
    "bos_token_id",
    "eos_token_id",
    "sep_token_id",
    "cls_token_id",
    "mask_token_id",
    "unk_token_id",
    "decoder_start_token_id",
    # what a call returns, not what it computes
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "torchscript",
    "output_scores",
    "return_dict_in_generate",
    # how transformers runs it, with the same numbers: activation checkpointing, the FFN in
    # chunks, a decoder's cache, the attention implementation
    "gradient_checkpointing",
    "chunk_size_feed_forward",
    "use_cache",
    "output_past",
    "_attn_implementation_autoset",
    # encoder-decoder settings, inert without cross-attention (see INERT_CONFIG_VALUES)
    "tie_encoder_decoder",
    "cross_attention_hidden_size",
    # generation
    "max_length",
    "min_length",
    "do_sample",
    "early_stopping",
    "num_beams",
    "num_beam_groups",
    "diversity_penalty",
    "temperature",
    "top_k",
    "top_p",
    "typical_p",
    "repetition_penalty",
    "length_penalty",
    "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size",
    "bad_words_ids",
    "num_return_sequences",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "remove_invalid_values",
    "exponential_decay_length_penalty",
    "suppress_tokens",
    "begin_suppress_tokens",
    "prefix",
    "task_specific_params",
  }
)
# `PretrainedConfig` keys that change the computation at any value but this one, the only one
# bertjax implements (a causal mask, cross-attention): another value is refused by name.
INERT_CONFIG_VALUES: dict[str, object] = {
  "is_decoder": False,
  "add_cross_attention": False,
  "is_encoder_decoder": False,
}


_BERT_TOKENS = dict(cls="[CLS]", sep="[SEP]", pad="[PAD]", mask="[MASK]", unk="[UNK]")
_ROBERTA_TOKENS = dict(
  cls="<s>", sep="</s>", pad="<pad>", mask="<mask>", unk="<unk>", bos="<s>", eos="</s>"
)


def _standard(model_type: str, cls_prefix: str, heads: tuple[str, ...]):
  """architectures and no_pooler for a family whose classes are {prefix}Model / For*."""
  names = {
    "mlm": "MaskedLM",
    "classifier": "SequenceClassification",
    "token_classifier": "TokenClassification",
  }
  arch = {(): f"{cls_prefix}Model"}
  arch.update({(h,): f"{cls_prefix}For{names[h]}" for h in heads})
  return arch


def _roberta_like(model_type: str, cls_prefix: str) -> Family:
  return Family(
    model_type=model_type,
    prefix="roberta",
    layer_prefix="encoder.layer.{i}.",
    layer_names=BERT_LAYER,
    config_fields=_BERT_FIELDS,
    config_keys={"classifier_dropout_prob": "classifier_dropout"},
    config_defaults=dict(pad_token_id=1),
    projection=None,
    pooler="pooler.dense",
    positions="after_padding",
    token_types=True,
    shared_layers=False,
    heads={
      "mlm": _mlm(
        "lm_head.dense",
        "lm_head.layer_norm",
        "lm_head.bias",
        ("lm_head.decoder.weight", "lm_head.decoder.bias"),
        act="gelu",
      ),
      "classifier": _two_layer("classifier.dense", "classifier.out_proj", "tanh"),
      "token_classifier": _linear("tokens", "classifier"),
    },
    architectures=_standard(model_type, cls_prefix, ("mlm", "classifier", "token_classifier")),
    no_pooler=frozenset(
      f"{cls_prefix}For{t}" for t in ("MaskedLM", "SequenceClassification", "TokenClassification")
    ),
    special_tokens=_ROBERTA_TOKENS,
    what_differs="BERT with positions counted after the padding index, byte-level BPE"
    + ("" if model_type == "roberta" else " (SentencePiece: XLM-R)"),
  )


# ModernBERT's prediction head: dense (classifier_bias) -> classifier_activation -> norm.
# The Llama-like families' config.json (EuroBERT, UltraBERT): keys, names and defaults.
_LLAMA_FIELDS = (
  "vocab_size",
  "hidden_size",
  "num_hidden_layers",
  "num_attention_heads",
  "intermediate_size",
  "hidden_act",
  "attention_probs_dropout_prob",
  "max_position_embeddings",
  "initializer_range",
  "pad_token_id",
  "layer_norm_eps",
  "attention_bias",
  "mlp_bias",
  "num_key_value_heads",
  "tie_word_embeddings",
  "classifier_pooling",
)
_LLAMA_KEYS = dict(layer_norm_eps="rms_norm_eps", attention_probs_dropout_prob="attention_dropout")
_LLAMA_DEFAULTS = dict(
  type_vocab_size=0,
  norm_bias=False,
  attention_bias=False,
  mlp_bias=False,
  hidden_act="silu",
  hidden_dropout_prob=0.0,
  attention_probs_dropout_prob=0.0,
  classifier_dropout_prob=0.0,
  tie_word_embeddings=False,
  classifier_pooling="late",
)


def _modernbert_transform(dense: str, norm: str):
  return _dense(dense, "head.dense", "classifier_bias") + _norm(norm, "head.norm", "norm_bias")


FAMILIES: dict[str, Family] = {
  "bert": Family(
    model_type="bert",
    prefix="bert",
    layer_prefix="encoder.layer.{i}.",
    layer_names=BERT_LAYER,
    config_fields=_BERT_FIELDS,
    config_keys={"classifier_dropout_prob": "classifier_dropout"},
    config_defaults={},
    projection=None,
    pooler="pooler.dense",
    positions="absolute",
    token_types=True,
    shared_layers=False,
    heads={
      "mlm": _mlm(
        "cls.predictions.transform.dense",
        "cls.predictions.transform.LayerNorm",
        "cls.predictions.bias",
        ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias"),
        act=None,
      ),
      "nsp": _linear("pooled", "cls.seq_relationship"),
      "classifier": _linear("pooled", "classifier"),
      "token_classifier": _linear("tokens", "classifier"),
    },
    architectures={
      (): "BertModel",
      ("mlm",): "BertForMaskedLM",
      ("mlm", "nsp"): "BertForPreTraining",
      ("nsp",): "BertForNextSentencePrediction",
      ("classifier",): "BertForSequenceClassification",
      ("token_classifier",): "BertForTokenClassification",
    },
    no_pooler=frozenset({"BertForMaskedLM", "BertForTokenClassification"}),
    special_tokens=_BERT_TOKENS,
    training=dict(stacking="copy layers", shared_student="albert"),
    what_differs="the reference block: post-LN, learned absolute positions, GELU FFN",
  ),
  "albert": Family(
    model_type="albert",
    prefix="albert",
    layer_prefix="encoder.albert_layer_groups.{g}.albert_layers.{j}.",
    layer_names=ALBERT_LAYER,
    config_fields=_BERT_FIELDS + ("embedding_size", "num_hidden_groups", "inner_group_num"),
    config_keys={},
    config_defaults=dict(
      embedding_size=128,
      num_hidden_groups=1,
      inner_group_num=1,
      classifier_dropout_prob=0.1,
      vocab_size=30000,
    ),
    projection="encoder.embedding_hidden_mapping_in",
    always_project=True,
    # The original TF code's research options, at their defaults in the released
    # checkpoints' config.json; transformers reads none of them.
    ignored_keys=("down_scale_factor", "gap_size", "net_structure_type", "num_memory_blocks"),
    pooler="pooler",
    positions="absolute",
    token_types=True,
    shared_layers=True,
    heads={
      "mlm": _mlm(
        "predictions.dense",
        "predictions.LayerNorm",
        "predictions.bias",
        ("predictions.decoder.weight", "predictions.decoder.bias"),
        act=None,
      ),
      "sop": _linear("pooled", "sop_classifier.classifier"),
      "classifier": _linear("pooled", "classifier"),
      "token_classifier": _linear("tokens", "classifier"),
    },
    architectures={
      (): "AlbertModel",
      ("mlm",): "AlbertForMaskedLM",
      ("mlm", "sop"): "AlbertForPreTraining",
      ("classifier",): "AlbertForSequenceClassification",
      ("token_classifier",): "AlbertForTokenClassification",
    },
    no_pooler=frozenset({"AlbertForMaskedLM", "AlbertForTokenClassification"}),
    special_tokens=dict(_BERT_TOKENS, pad="<pad>", unk="<unk>"),
    what_differs="layers shared in groups, factorised embeddings (E -> H)",
  ),
  "roberta": _roberta_like("roberta", "Roberta"),
  "xlm-roberta": _roberta_like("xlm-roberta", "XLMRoberta"),
  "electra": Family(
    model_type="electra",
    prefix="electra",
    layer_prefix="encoder.layer.{i}.",
    layer_names=BERT_LAYER,
    config_fields=_BERT_FIELDS + ("embedding_size",),
    config_keys={"classifier_dropout_prob": "classifier_dropout"},
    config_defaults=dict(embedding_size=128),
    training=dict(rtd="tables"),
    projection="embeddings_project",
    # The sequence summary of ElectraForMultipleChoice, a class bertjax has not.
    ignored_keys=(
      "summary_type",
      "summary_use_proj",
      "summary_proj_to_labels",
      "summary_activation",
      "summary_first_dropout",
      "summary_last_dropout",
    ),
    pooler=None,
    positions="absolute",
    token_types=True,
    shared_layers=False,
    heads={
      # The generator: transform to E with a fixed GELU, decoder tied to the embeddings.
      "mlm": _mlm(
        "generator_predictions.dense",
        "generator_predictions.LayerNorm",
        "generator_lm_head.bias",
        ("generator_lm_head.weight",),
        act="gelu",
      ),
      # The discriminator: dense -> hidden_act -> one logit per token.
      "rtd": Head(
        "tokens",
        _dense("dense", "discriminator_predictions.dense")
        + _dense("out", "discriminator_predictions.dense_prediction"),
      ),
      "classifier": _two_layer("classifier.dense", "classifier.out_proj", "gelu"),
      "token_classifier": _linear("tokens", "classifier"),
    },
    architectures={
      (): "ElectraModel",
      ("mlm",): "ElectraForMaskedLM",
      ("rtd",): "ElectraForPreTraining",
      ("classifier",): "ElectraForSequenceClassification",
      ("token_classifier",): "ElectraForTokenClassification",
    },
    no_pooler=frozenset(),
    special_tokens=_BERT_TOKENS,
    what_differs="BERT's block; embeddings projected E -> H; discriminator (RTD) head",
  ),
  "distilbert": Family(
    model_type="distilbert",
    prefix="distilbert",
    layer_prefix="transformer.layer.{i}.",
    layer_names=DISTILBERT_LAYER,
    config_fields=COMMON_FIELDS + ("sinusoidal_positions",),
    config_keys=dict(
      hidden_size="dim",
      num_hidden_layers="n_layers",
      num_attention_heads="n_heads",
      intermediate_size="hidden_dim",
      hidden_act="activation",
      hidden_dropout_prob="dropout",
      attention_probs_dropout_prob="attention_dropout",
      classifier_dropout_prob="seq_classif_dropout",
      sinusoidal_positions="sinusoidal_pos_embds",
    ),
    config_defaults=dict(
      type_vocab_size=0,
      layer_norm_eps=1e-12,
      classifier_dropout_prob=0.2,
      hidden_size=768,
      num_hidden_layers=6,
      num_attention_heads=12,
      intermediate_size=3072,
    ),
    # The question-answering head's dropout (bertjax has no such head); an old flag that
    # transformers no longer reads (the decoder is tied by `tie_word_embeddings`).
    ignored_keys=("qa_dropout", "tie_weights_"),
    projection=None,
    pooler=None,
    positions="absolute",
    token_types=False,
    shared_layers=False,
    heads={
      "mlm": _mlm(
        "vocab_transform",
        "vocab_layer_norm",
        "vocab_projector.bias",
        ("vocab_projector.weight",),
        act=None,
      ),
      "classifier": dataclasses.replace(
        _two_layer("pre_classifier", "classifier", "relu"), pre_dropout=False
      ),
      "token_classifier": dataclasses.replace(_linear("tokens", "classifier"), dropout="hidden"),
    },
    architectures={
      (): "DistilBertModel",
      ("mlm",): "DistilBertForMaskedLM",
      ("classifier",): "DistilBertForSequenceClassification",
      ("token_classifier",): "DistilBertForTokenClassification",
    },
    no_pooler=frozenset(),
    special_tokens=_BERT_TOKENS,
    options=DistilBertOptions,
    what_differs="no token types; optional fixed sinusoidal positions",
  ),
  "mpnet": Family(
    model_type="mpnet",
    prefix="mpnet",
    layer_prefix="encoder.layer.{i}.",
    layer_names=MPNET_LAYER,
    config_fields=COMMON_FIELDS + ("layer_norm_eps", "relative_attention_num_buckets"),
    config_keys={},
    options=MPNetOptions,
    config_defaults=dict(pad_token_id=1, type_vocab_size=0, classifier_dropout_prob=None),
    projection=None,
    pooler="pooler.dense",
    positions="after_padding",
    position_bias="relative_buckets",
    relative_bias="encoder.relative_attention_bias",
    token_types=False,
    shared_layers=False,
    heads={
      "mlm": _mlm(
        "lm_head.dense",
        "lm_head.layer_norm",
        "lm_head.bias",
        ("lm_head.decoder.weight", "lm_head.decoder.bias"),
        act="gelu",
      ),
      "classifier": _two_layer("classifier.dense", "classifier.out_proj", "tanh"),
      "token_classifier": _linear("tokens", "classifier"),
    },
    architectures=_standard("mpnet", "MPNet", ("mlm", "classifier", "token_classifier")),
    no_pooler=frozenset(
      {"MPNetForMaskedLM", "MPNetForSequenceClassification", "MPNetForTokenClassification"}
    ),
    special_tokens=dict(_ROBERTA_TOKENS, unk="[UNK]"),
    wordpiece_class="MPNetTokenizerFast",
    what_differs="BERT's block plus a T5-style relative-position bias (32 buckets, one "
    "table for every layer) on each layer's scores; positions after padding; no token types",
  ),
  "nomic_bert": Family(
    # The hub's (and transformers' save_pretrained's) layout: transformers renames it to
    # q_proj/k_proj/v_proj, up/gate/down_proj, post_*_layernorm when it loads.
    model_type="nomic_bert",
    prefix="nomic_bert",
    layer_prefix="encoder.layers.{i}.",
    layer_names=dict(
      qkv="attn.Wqkv",
      attn_output="attn.out_proj",
      ffn_in="mlp.fc11",
      ffn_gate="mlp.fc12",
      ffn_out="mlp.fc2",
      attn_norm="norm1",
      ffn_norm="norm2",
    ),
    config_fields=_BERT_FIELDS,
    config_keys={"classifier_dropout_prob": "classifier_dropout"},
    config_defaults=dict(
      attention_bias=False, mlp_bias=False, rope_theta=1000.0, hidden_act="silu"
    ),
    embedding_names=dict(
      word="embeddings.word_embeddings",
      token_type="embeddings.token_type_embeddings",
      norm="emb_ln",
    ),
    projection=None,
    pooler="pooler.dense",
    positions="rotary",
    ffn="gated",
    token_types=True,
    shared_layers=False,
    heads={
      "mlm": _mlm(
        "cls.predictions.transform.dense",
        "cls.predictions.transform.layer_norm",
        "cls.predictions.bias",
        ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias"),
        act=None,
      ),
      "classifier": _linear("pooled", "classifier"),
      "token_classifier": _linear("tokens", "classifier"),
    },
    architectures=_standard("nomic_bert", "NomicBert", ("mlm", "classifier", "token_classifier")),
    no_pooler=frozenset(
      {"NomicBertModel", "NomicBertForMaskedLM", "NomicBertForTokenClassification"}
    ),
    special_tokens=_BERT_TOKENS,
    what_differs="post-LN with rotary q/k (theta 1000, no position table), SwiGLU FFN, no "
    "biases in attention or FFN",
  ),
  "modernbert": Family(
    model_type="modernbert",
    poolings=("cls", "mean"),
    layer_typed=True,
    global_every=3,
    prefix="model",
    layer_prefix="layers.{i}.",
    layer_names=MODERNBERT_LAYER,
    config_fields=(
      "vocab_size",
      "hidden_size",
      "num_hidden_layers",
      "num_attention_heads",
      "intermediate_size",
      "hidden_act",
      "hidden_dropout_prob",
      "attention_probs_dropout_prob",
      "max_position_embeddings",
      "initializer_range",
      "pad_token_id",
      "classifier_dropout_prob",
      "layer_norm_eps",
      "norm_bias",
      "attention_bias",
      "mlp_bias",
      "decoder_bias",
      "classifier_bias",
      "classifier_activation",
      "classifier_pooling",
      "sliding_window",
    ),
    config_keys=dict(
      hidden_act="hidden_activation",
      layer_norm_eps="norm_eps",
      hidden_dropout_prob="mlp_dropout",
      attention_probs_dropout_prob="attention_dropout",
      classifier_dropout_prob="classifier_dropout",
      sliding_window="local_attention",
    ),
    config_defaults=dict(
      type_vocab_size=0,
      norm_bias=False,
      attention_bias=False,
      mlp_bias=False,
      decoder_bias=True,
      classifier_bias=False,
      classifier_activation="gelu",
      classifier_pooling="cls",
      hidden_act="gelu",
      layer_norm_eps=1e-5,
      hidden_dropout_prob=0.0,
      attention_probs_dropout_prob=0.0,
      classifier_dropout_prob=0.0,
      sliding_window=128,
      rope_theta=160000.0,
      local_rope_theta=10000.0,
    ),
    # transformers' ModernBERT reads `norm_eps`, not the `layer_norm_eps` the released files
    # also carry, and derives `layer_types` from `global_attn_every_n_layers` (bertjax does
    # too; transformers 5 writes both, and `layer_types` wins); the rest set initialisation,
    # torch.compile, flash-attention determinism and an MLM loss over masked tokens only.
    ignored_keys=(
      "layer_norm_eps",
      "global_attn_every_n_layers",
      "initializer_cutoff_factor",
      "reference_compile",
      "repad_logits_with_grad",
      "deterministic_flash_attn",
      "sparse_prediction",
      "sparse_pred_ignore_index",
    ),
    embedding_names=dict(word="embeddings.tok_embeddings", norm="embeddings.norm"),
    projection=None,
    pooler=None,
    final_norm="final_norm",
    positions="rotary",
    norm="pre",
    ffn="gated",
    first_attn_norm=False,
    ffn_dropout="inside",
    token_types=False,
    shared_layers=False,
    heads={
      "mlm": Head(
        "tokens",
        _modernbert_transform("dense", "LayerNorm")
        + ((("bias",), "decoder.bias", "plain", "decoder_bias"),),
        tied=("decoder.weight",),
        act="classifier",
      ),
      "classifier": Head(
        "pooling",
        _modernbert_transform("pre", "norm") + _dense("dense", "classifier"),
        act="classifier",
        pre_dropout=False,
      ),
      "token_classifier": Head(
        "tokens",
        _modernbert_transform("pre", "norm") + _dense("dense", "classifier"),
        act="classifier",
        pre_dropout=False,
      ),
    },
    architectures=_standard("modernbert", "ModernBert", ("mlm", "classifier", "token_classifier")),
    no_pooler=frozenset(),
    special_tokens=dict(cls="[CLS]", sep="[SEP]", pad="[PAD]", mask="[MASK]", unk="[UNK]"),
    what_differs="pre-LN without biases, rotary q/k with a theta per layer type, a "
    "sliding window (128 tokens) in two of every three layers, GeGLU, fused Wqkv",
  ),
  "eurobert": Family(
    model_type="eurobert",
    poolings=("bos", "mean", "late"),
    prefix="model",
    layer_prefix="layers.{i}.",
    layer_names=dict(LLAMA_LAYER, attn_norm="input_layernorm", ffn_norm="post_attention_layernorm"),
    config_fields=_LLAMA_FIELDS,
    config_keys=_LLAMA_KEYS,
    config_defaults=dict(_LLAMA_DEFAULTS, layer_norm_eps=1e-5, rope_theta=10000.0),
    ignored_keys=("pretraining_tp",),  # kept by transformers' EuroBERT config, never read
    embedding_names=dict(word="embed_tokens"),
    projection=None,
    pooler=None,
    final_norm="norm",
    positions="rotary",
    norm="pre",
    norm_kind="rmsnorm",
    ffn="gated",
    token_types=False,
    shared_layers=False,
    heads={
      # No transform; the decoder is its own matrix unless tie_word_embeddings.
      "mlm": Head(
        "tokens",
        (
          (("decoder",), "lm_head.weight", "linear", "untied"),
          (("bias",), "lm_head.bias", "plain", "mlp_bias"),
        ),
        tied=("lm_head.weight",),
      ),
      "classifier": Head(
        "pooling",
        _dense("pre", "dense") + _dense("dense", "classifier"),
        act="gelu",
        pre_dropout=False,
        dropout="none",
      ),
      "token_classifier": dataclasses.replace(_linear("tokens", "classifier"), dropout="none"),
    },
    architectures=_standard("eurobert", "EuroBert", ("mlm", "classifier", "token_classifier")),
    no_pooler=frozenset(),
    special_tokens=dict(
      cls="<|begin_of_text|>",
      sep="<|end_of_text|>",
      pad="<|end_of_text|>",
      mask="<|mask|>",
      bos="<|begin_of_text|>",
      eos="<|end_of_text|>",
    ),
    what_differs="Llama-like: pre-RMSNorm, SwiGLU, rotary q/k, grouped key/value heads, no "
    "biases; an untied MLM decoder",
  ),
  "ultrabert": Family(
    model_type="ultrabert",
    # The layout on disk, as transformers saves it and the released files hold it (its
    # classes rename `ultrabert.` to `model.` and `cls` to `head.decoder` as they load).
    prefix="ultrabert",
    layer_prefix="layers.{i}.",
    layer_names=dict(LLAMA_LAYER, attn_norm="input_layernorm", ffn_norm="post_attention_layernorm"),
    config_fields=_LLAMA_FIELDS + ("classifier_dropout_prob", "prediction_head_size"),
    config_keys=dict(_LLAMA_KEYS, classifier_dropout_prob="classifier_dropout"),
    config_defaults=dict(
      _LLAMA_DEFAULTS,
      layer_norm_eps=1e-6,
      rope_theta=2560000.0,
      local_rope_theta=10000.0,
      sliding_window=256,
      classifier_pooling="cls",
    ),
    options=UltraBertOptions,
    poolings=("cls", "mean"),
    layer_typed=True,
    window_radius=True,
    embedding_names=dict(word="embed_tokens"),
    projection=None,
    pooler=None,
    final_norm="norm",
    positions="rotary",
    norm="pre",
    norm_kind="rmsnorm",
    ffn="gated",
    token_types=False,
    shared_layers=False,
    heads={
      # Two layers without biases, each followed by tanh-GELU, then its own decoder.
      "mlm": Head(
        "tokens",
        (
          (("dense", "kernel"), "head.linear1.weight", "linear", None),
          (("dense2", "kernel"), "head.linear2.weight", "linear", None),
          (("decoder",), "cls.weight", "linear", "untied"),
        ),
        tied=("cls.weight",),
        act="gelu_pytorch_tanh",
        width="prediction_head_size",
      ),
      "classifier": _linear("pooling", "classifier"),
      "token_classifier": _linear("tokens", "classifier"),
    },
    architectures=_standard("ultrabert", "Ultrabert", ("mlm", "classifier", "token_classifier")),
    no_pooler=frozenset(),
    # Its tokenizer's files name the special tokens (transformers' classes fix none).
    special_tokens={},
    what_differs="EuroBERT's Llama-like block with a sliding window (radius `sliding_window`) "
    "in two of every three layers and a rotary theta per layer type; a two-layer MLM head",
  ),
  "gemma3_text": Family(
    # EmbeddingGemma: Gemma 3's text block with bidirectional attention. transformers'
    # Gemma3TextModel saves it bare (`layers.0...`), its causal LM under `model.`.
    model_type="gemma3_text",
    prefix="model",
    layer_prefix="layers.{i}.",
    layer_names=dict(
      LLAMA_LAYER,
      q_norm="self_attn.q_norm",
      k_norm="self_attn.k_norm",
      attn_norm="input_layernorm",
      attn_post_norm="post_attention_layernorm",
      ffn_norm="pre_feedforward_layernorm",
      ffn_post_norm="post_feedforward_layernorm",
    ),
    config_fields=tuple(f for f in _LLAMA_FIELDS if f not in ("mlp_bias", "classifier_pooling"))
    + ("query_pre_attn_scalar", "sliding_window"),
    config_keys=dict(_LLAMA_KEYS, hidden_act="hidden_activation"),
    config_defaults=dict(
      _LLAMA_DEFAULTS,
      hidden_act="gelu_pytorch_tanh",
      layer_norm_eps=1e-6,
      rope_theta=1000000.0,
      local_rope_theta=10000.0,
      sliding_window=4096,
      query_pre_attn_scalar=256,
      tie_word_embeddings=True,
      classifier_pooling="cls",
    ),
    options=Gemma3Options,
    layer_typed=True,
    # Only the bidirectional encoder, without logit soft-capping (EmbeddingGemma's); the
    # final logits' cap and the pattern's period belong to the causal LM and to the layer
    # types transformers writes beside them.
    required_values={"use_bidirectional_attention": True, "attn_logit_softcapping": None},
    ignored_keys=("final_logit_softcapping", "_sliding_window_pattern", "sliding_window_pattern"),
    embedding_names=dict(word="embed_tokens"),
    embedding_scale=True,
    projection=None,
    pooler=None,
    final_norm="norm",
    positions="rotary",
    norm="sandwich",
    norm_kind="rmsnorm",
    norm_offset=1.0,
    ffn="gated",
    token_types=False,
    shared_layers=False,
    heads={},
    architectures={(): "Gemma3TextModel"},
    no_pooler=frozenset(),
    special_tokens=dict(
      cls="<bos>", sep="<eos>", pad="<pad>", mask="<mask>", unk="<unk>", bos="<bos>", eos="<eos>"
    ),
    what_differs="EmbeddingGemma: Gemma 3's bidirectional block, pre- and post-sublayer "
    "RMSNorms (`1 + w`), QK-norm, GeGLU, embeddings times sqrt(H), windows in five of six "
    "layers with a rotary theta per layer type",
  ),
  "neobert": Family(
    # NeoBERT (Le Breton et al. 2025): remote code only (`NeoBERT`, `NeoBERTLMHead`,
    # `NeoBERTForSequenceClassification` of chandar-lab/NeoBERT's model.py); tensors under
    # `model.` in its task models, as its released checkpoint holds them.
    model_type="neobert",
    prefix="model",
    layer_prefix="transformer_encoder.{i}.",
    layer_names=dict(
      qkv_per_head="qkv",
      attn_output="wo",
      attn_norm="attention_norm",
      gate_in="ffn.w12",
      ffn_out="ffn.w3",
      ffn_norm="ffn_norm",
    ),
    config_fields=(
      "vocab_size",
      "hidden_size",
      "num_hidden_layers",
      "num_attention_heads",
      "intermediate_size",
      "max_position_embeddings",
      "initializer_range",
      "pad_token_id",
      "layer_norm_eps",
      "classifier_dropout_prob",
      "tie_word_embeddings",
    ),
    config_keys=dict(
      layer_norm_eps="norm_eps",
      max_position_embeddings="max_length",
      initializer_range="embedding_init_range",
      classifier_dropout_prob="classifier_dropout",
    ),
    config_defaults=dict(
      _LLAMA_DEFAULTS,
      vocab_size=30522,
      max_position_embeddings=1024,
      layer_norm_eps=1e-6,
      rope_theta=10000.0,
      classifier_dropout_prob=0.1,
      classifier_pooling="cls",
    ),
    # Its config class derives `dim_head` from the sizes and keeps the initialisers' ranges,
    # its constructor's leftover keyword arguments and where the tokenizer came from.
    ignored_keys=(
      "dim_head",
      "decoder_init_range",
      "classifier_init_range",
      "kwargs",
      "pretrained_model_name_or_path",
      "trust_remote_code",
    ),
    embedding_names=dict(word="encoder"),
    projection=None,
    pooler=None,
    final_norm="layer_norm",
    positions="rotary",
    rotary_layout="pairs",
    rope_keys=False,
    norm="pre",
    norm_kind="rmsnorm",
    ffn="gated",
    ffn_width=swiglu_width,
    token_types=False,
    shared_layers=False,
    heads={
      # The final states straight into its own decoder, with a bias.
      "mlm": Head(
        "tokens",
        (
          (("decoder",), "decoder.weight", "linear", "untied"),
          (("bias",), "decoder.bias", "plain", None),
        ),
        tied=("decoder.weight",),
      ),
      "classifier": _two_layer("dense", "classifier", "tanh"),
    },
    architectures={
      (): "NeoBERT",
      ("mlm",): "NeoBERTLMHead",
      ("classifier",): "NeoBERTForSequenceClassification",
    },
    no_pooler=frozenset(),
    special_tokens=_BERT_TOKENS,
    what_differs="pre-RMSNorm without biases, rotary q/k on interleaved pairs, SwiGLU two "
    "thirds of intermediate_size wide, q/k/v fused head by head; an untied MLM decoder",
  ),
  "deberta-v2": Family(
    model_type="deberta-v2",
    prefix="deberta",
    layer_prefix="encoder.layer.{i}.",
    layer_names=DEBERTA_LAYER,
    config_fields=_BERT_FIELDS
    + (
      "embedding_size",
      "relative_attention",
      "max_relative_positions",
      "position_buckets",
      "pos_att_type",
      "share_att_key",
      "norm_rel_ebd",
      "position_biased_input",
      "legacy",
      "classifier_activation",
    ),
    config_keys=dict(
      classifier_dropout_prob="cls_dropout", classifier_activation="pooler_hidden_act"
    ),
    config_defaults=dict(type_vocab_size=0, layer_norm_eps=1e-7, classifier_activation="gelu"),
    options=DebertaOptions,
    # The convolution's settings, inert without `conv_kernel_size` (which bertjax refuses);
    # the dropout before the classifier's pooler (training only; bertjax uses `cls_dropout`).
    ignored_keys=("conv_act", "conv_groups", "pooler_dropout"),
    training=dict(rtd="gdes"),
    projection="embeddings.embed_proj",
    projection_bias=False,
    project_before_norm=True,
    pooler=None,
    optional_token_types=True,
    positions="absolute",
    position_bias="disentangled",
    relative_bias="encoder.rel_embeddings",
    relative_norm="encoder.LayerNorm",
    token_types=True,
    shared_layers=False,
    heads={
      # transformers' two layouts: `legacy` (BERT's head, the default) or
      # `lm_predictions.lm_head` (DeBERTa's own, as the released v3 checkpoints hold).
      "mlm": Head(
        "tokens",
        tuple(
          (path, name, kind, "legacy")
          for path, name, kind, _ in _mlm(
            "cls.predictions.transform.dense",
            "cls.predictions.transform.LayerNorm",
            "cls.predictions.bias",
            (),
            act=None,
          ).tensors
        )
        + tuple(
          (path, name, kind, "lm_head_layout")
          for path, name, kind, _ in _mlm(
            "lm_predictions.lm_head.dense",
            "lm_predictions.lm_head.LayerNorm",
            "lm_predictions.lm_head.bias",
            (),
            act=None,
          ).tensors
        ),
        tied=("cls.predictions.decoder.weight", "cls.predictions.decoder.bias"),
      ),
      # ContextPooler (dense -> pooler_hidden_act on the first token), then the classifier.
      "classifier": Head(
        "first", _dense("pre", "pooler.dense") + _dense("dense", "classifier"), act="classifier"
      ),
      "token_classifier": _linear("tokens", "classifier"),
      # DeBERTa-v3's discriminator (the released code's `LMMaskPredictionHead`, held by
      # the released v3 checkpoints): LayerNorm(h + h_first) -> dense -> hidden_act ->
      # one logit per token. transformers has no class for it and skips its tensors.
      "rtd": Head(
        "tokens",
        _norm("norm", "mask_predictions.LayerNorm")
        + _dense("dense", "mask_predictions.dense")
        + _dense("out", "mask_predictions.classifier"),
      ),
    },
    architectures={
      **_standard("deberta-v2", "DebertaV2", ("mlm", "classifier", "token_classifier")),
      # transformers reads the base (and MLM head) and skips mask_predictions.
      ("rtd",): "DebertaV2Model",
      ("mlm", "rtd"): "DebertaV2ForMaskedLM",
    },
    no_pooler=frozenset(),
    special_tokens=dict(_BERT_TOKENS),
    what_differs="post-LN BERT whose scores add content-to-position and position-to-content "
    "terms (log-bucketed relative embeddings shared by every layer, projected by each; "
    "scaled 1/sqrt(3d)); no absolute positions in v3; SentencePiece",
  ),
}

MODEL_TYPES = tuple(FAMILIES)  # the built-in families; `register` adds to FAMILIES
HEADS = ("mlm", "nsp", "sop", "rtd", "classifier", "token_classifier")


def family(model_type: str) -> Family:
  """The row for `model_type`, or a ValueError naming the supported ones."""
  if model_type not in FAMILIES:
    raise ValueError(
      f"model_type={model_type!r} is not supported; expected one of {tuple(FAMILIES)}"
    )
  return FAMILIES[model_type]


def register(row: Family, *, replace: bool = False) -> Family:
  """Adds a family: `row` becomes `FAMILIES[row.model_type]`, so `BertConfig`, `from_hf`,
  `to_hf`, `forward`, every site and every analysis serve checkpoints whose `config.json`
  names that `model_type` (docs/tutorials/adding_a_family.py builds CamemBERT this way and
  checks it against transformers). A family already present is an error unless `replace`,
  so a typo cannot redefine BERT silently. Returns `row`."""
  if not isinstance(row, Family):
    raise TypeError(f"row must be a families.Family, not {type(row).__name__}")
  if row.model_type in FAMILIES and not replace:
    raise ValueError(
      f"model_type={row.model_type!r} is already a family; pass replace=True to redefine it"
    )
  for role in row.layer_names:
    if role not in LAYER_ROLES and role not in FUSED:
      raise ValueError(
        f"Family {row.model_type!r}: layer role {role!r} must be one of "
        f"{tuple(LAYER_ROLES) + tuple(FUSED)}"
      )
  for head in row.heads:
    if head not in HEADS:
      raise ValueError(f"Family {row.model_type!r}: head {head!r} must be one of {HEADS}")
  FAMILIES[row.model_type] = row
  return row
