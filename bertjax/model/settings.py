"""The config's groups that every family shares, apart from the block: how a model runs
(`Runtime`) and its task heads (`TaskHeads`).

`BertConfig` holds one of each (`config.runtime`, `config.task`) beside the block's own
fields and its family's options (`bertjax.model.options`). Their fields are given and read
flat as well (`config.replace(attention_impl="pallas")`, `config.dtype`), so a caller need
not know which group a field sits in; the values are checked by `BertConfig`, which knows the
family.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Runtime:
  """How the model runs; the function it computes stays the same (up to rounding).

  Attributes:
    dtype: "float32", "bfloat16" or "float64" (float64 needs `jax_enable_x64`).
    attention_impl: "xla", "pallas", "cudnn" or "auto" (`bertjax.kernels.IMPLS`).
    scan_unroll: blocks per iteration of the layer scan (1: a rolled loop, compile time flat
      in depth; depth: fully unrolled, which lets XLA fuse across blocks).
    quantize: None (float linear layers) or "int8" (`bertjax.quantize`).
    relevance_rules: None (the gradient), "attnlrp" or "cp-lrp": the backward rules of
      `bertjax.analysis.attribution.lrp` (the forward values are the same).
  """

  dtype: str = "float32"
  attention_impl: str = "xla"
  scan_unroll: int = 1
  quantize: str | None = None
  relevance_rules: str | None = None


@dataclasses.dataclass(frozen=True)
class TaskHeads:
  """The task heads' settings (what `Family.heads` builds reads them).

  Attributes:
    num_labels: classes of the classifier heads.
    label_names: their names, index -> name (Hugging Face `id2label`), or None.
    use_pooler: keep the pooler where the family has one.
    classifier_dropout_prob: the heads' dropout (None: the family's default, else the
      hidden rate).
    classifier_pooling: where the classifier reads ("cls", "mean"; EuroBERT "bos", "mean",
      "late"; `Family.poolings`).
    classifier_bias, classifier_activation: ModernBERT's head bias and activation (None:
      `hidden_act`).
    decoder_bias: the MLM decoder's bias (ModernBERT's switch).
    tie_word_embeddings: the MLM decoder is the word embeddings (not EuroBERT's or
      UltraBERT's by default).
  """

  num_labels: int = 2
  label_names: tuple[str, ...] | None = None
  use_pooler: bool = True
  classifier_dropout_prob: float | None = None
  classifier_pooling: str = "cls"
  classifier_bias: bool = True
  classifier_activation: str | None = None
  decoder_bias: bool = True
  tie_word_embeddings: bool = True


# The config's attribute for each group, and each flat field -> its group's attribute.
GROUPS = {"runtime": Runtime, "task": TaskHeads}
GROUP_OF = {f.name: attr for attr, kind in GROUPS.items() for f in dataclasses.fields(kind)}
