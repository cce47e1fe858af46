"""A family's own options, grouped apart from the fields every family shares.

A family whose block has options no other family has names a frozen dataclass of them in its
row (`Family.options`). `BertConfig.options` holds one for a model of that family and None
for every other, so a BERT config carries no DeBERTa field. Flat keywords still build and
replace them (`BertConfig.for_family("deberta-v2", pos_att_type=("c2p",))`,
`config.replace(share_att_key=True)`), and the config reads them through
(`config.pos_att_type` on a DeBERTa config; on a BERT config it is an AttributeError that
names the family that has it). Each class checks its own values; checks that need the rest
of the config stay in `BertConfig`.
"""

from __future__ import annotations

import dataclasses

POS_ATT_TYPES = ("c2p", "p2c")


@dataclasses.dataclass(frozen=True)
class DebertaOptions:
  """DeBERTa-v2/v3's disentangled attention (`deberta-v2`).

  `pos_att_type` names the position terms of the scores ("c2p" content-to-position, "p2c"
  position-to-content; config.json's "p2c|c2p" string or a list is read as a tuple);
  relative distances are log-bucketed into `position_buckets` (<= 0: no buckets) up to
  `max_relative_positions` (<= 0: max_position_embeddings); `share_att_key` projects the
  relative embeddings with the content query/key projections; `norm_rel_ebd` "layer_norm"
  norms them; `position_biased_input=False` (v3) drops the absolute position table;
  `legacy` picks transformers' MLM head layout (BERT's `cls.predictions`, or
  `lm_predictions.lm_head`).
  """

  relative_attention: bool = False
  pos_att_type: tuple[str, ...] = ()
  position_buckets: int = -1
  max_relative_positions: int = -1
  share_att_key: bool = False
  norm_rel_ebd: str = "none"
  position_biased_input: bool = True
  legacy: bool = True

  def __post_init__(self):
    terms = self.pos_att_type
    if isinstance(terms, (str, list)):  # config.json's "p2c|c2p" or a list, as a tuple
      terms = tuple(
        t.strip().lower()
        for t in (terms.split("|") if isinstance(terms, str) else terms)
        if str(t).strip()
      )
      object.__setattr__(self, "pos_att_type", terms)
    if (
      not isinstance(terms, tuple)
      or any(t not in POS_ATT_TYPES for t in terms)
      or len(set(terms)) != len(terms)
    ):
      raise ValueError(
        f"pos_att_type={terms!r} must be a tuple of distinct terms from {POS_ATT_TYPES}"
      )
    if self.norm_rel_ebd not in ("none", "layer_norm"):
      raise ValueError(f"norm_rel_ebd={self.norm_rel_ebd!r} must be 'none' or 'layer_norm'")
    for name in ("position_buckets", "max_relative_positions"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool):
        # ValueError, as every other bad config field gets.
        raise ValueError(f"{name}={value!r} must be an int (<= 0: unset)")  # noqa: TRY004


@dataclasses.dataclass(frozen=True)
class MPNetOptions:
  """MPNet's relative-position bias (`mpnet`): the rows of its bucket table."""

  relative_attention_num_buckets: int = 32

  def __post_init__(self):
    n = self.relative_attention_num_buckets
    if not isinstance(n, int) or isinstance(n, bool) or n < 32:
      raise ValueError(
        f"relative_attention_num_buckets={n!r} must be an int >= 32 (mpnet buckets "
        "distances into 32)"
      )


@dataclasses.dataclass(frozen=True)
class DistilBertOptions:
  """DistilBERT's fixed sinusoidal position table (`distilbert`; not trained)."""

  sinusoidal_positions: bool = False


@dataclasses.dataclass(frozen=True)
class UltraBertOptions:
  """UltraBERT's MLM prediction head (`ultrabert`): the width between its two layers."""

  prediction_head_size: int = 768

  def __post_init__(self):
    n = self.prediction_head_size
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
      raise ValueError(f"prediction_head_size={n!r} must be a positive int")


@dataclasses.dataclass(frozen=True)
class Gemma3Options:
  """Gemma 3's attention scale (`gemma3_text`, EmbeddingGemma): logits times
  `query_pre_attn_scalar ** -0.5`, not `1 / sqrt(head_dim)`."""

  query_pre_attn_scalar: float = 256

  def __post_init__(self):
    s = self.query_pre_attn_scalar
    if isinstance(s, bool) or not isinstance(s, (int, float)) or s <= 0:
      raise ValueError(f"query_pre_attn_scalar={s!r} must be a positive number")


OPTION_CLASSES = (
  DebertaOptions,
  MPNetOptions,
  DistilBertOptions,
  UltraBertOptions,
  Gemma3Options,
)


def field_names(kind) -> tuple[str, ...]:
  """The option names of an options class (or instance)."""
  return tuple(f.name for f in dataclasses.fields(kind))


# Every option name -> the class it belongs to.
OWNER = {name: kind for kind in OPTION_CLASSES for name in field_names(kind)}
