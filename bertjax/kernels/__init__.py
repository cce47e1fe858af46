"""Pallas kernels, each with its pure-jnp reference beside it.

`kernels.attention` (module `bertjax/kernels/attention.py`) is the entry point that validates inputs
and dispatches between implementations; the padding is one `Mask` (`bertjax/kernels/masks.py`). The
kernels live in the submodules `kernels.flash_attention` (Triton layout: forward, backward),
`kernels.flash_attention_stats` (its statistics pass) and `kernels.flash_attention_tpu`
(Mosaic layout), sharing `kernels.tiling` (`BlockSizes`, padding, helpers); the plain-XLA
implementation is `kernels.xla_attention`, the reference `kernels.reference`, the dropout
stream `kernels.dropout`.
"""

from .attention import (
  IMPLS,
  KERNEL_VARIANTS,
  attention,
  attention_impl,
  attention_probs,
  attention_with_stats,
)
from .disentangled import DisentangledBias, log_bucket, relative_index
from .masks import Mask
from .position_bias import PositionBias, alibi_slopes, relative_position_bucket
from .reference import ABLATIONS, STAT_NAMES, reference_attention, reference_statistics
from .tiling import BlockSizes

__all__ = [
  "ABLATIONS",
  "IMPLS",
  "KERNEL_VARIANTS",
  "STAT_NAMES",
  "BlockSizes",
  "DisentangledBias",
  "Mask",
  "PositionBias",
  "alibi_slopes",
  "attention",
  "attention_impl",
  "attention_probs",
  "attention_with_stats",
  "log_bucket",
  "reference_attention",
  "reference_statistics",
  "relative_index",
  "relative_position_bucket",
]
