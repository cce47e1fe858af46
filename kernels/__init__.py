"""Pallas attention kernels, each with its pure-jnp reference beside it.

The kernels themselves live in the submodules `kernels.flash_attention` (forward, backward,
`BlockSizes`) and `kernels.flash_attention_stats` (statistics pass); `kernels.attention` is
the entry point that validates inputs and dispatches between implementations.
"""

from .attention import (
  attention,
  attention_probs,
  attention_with_stats,
  reference_attention,
  reference_statistics,
)
from .flash_attention import STAT_NAMES, BlockSizes

__all__ = [
  "STAT_NAMES",
  "BlockSizes",
  "attention",
  "attention_probs",
  "attention_with_stats",
  "reference_attention",
  "reference_statistics",
]
