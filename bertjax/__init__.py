"""bertjax: BERT and its family (ALBERT, RoBERTa, XLM-R, ELECTRA, DistilBERT, MPNet, NomicBERT,
ModernBERT, EuroBERT, DeBERTa-v2/v3) in pure JAX, for BERTology.

One process-wide setting: `import bertjax` adds bertjax's XLA:CPU options to the `XLA_FLAGS`
environment variable (unless `XLA_FLAGS` already names them or `BERTJAX_XLA_DEFAULTS=0`), so
programs compiled afterwards use them; `bertjax.xla_options` says which and why. Nothing
else global is changed.
"""

from bertjax import xla_options

xla_options.apply()  # before anything compiles; see bertjax/xla_options.py

from bertjax.hub import minilm_path
from bertjax.model.config import PRESETS, BertConfig
from bertjax.model.families import FAMILIES, MODEL_TYPES
from bertjax.model.forward import (
  BertOutput,
  LayersOutput,
  attention_statistics,
  checked_forward,
  count_params,
  embed,
  forward,
  init,
  param_counts,
  run_layers,
)
from bertjax.model.heads import (
  classify,
  head_input,
  head_logits,
  mlm_logits,
  nsp_logits,
  pool,
  rtd_logits,
  sop_logits,
  token_classify,
)
from bertjax.model.hf import from_hf, hf_state_dict, resolve_model_path, to_hf
from bertjax.model.input_checks import check_inputs
from bertjax.model.intervention import Intervention
from bertjax.model.packing import Packing
from bertjax.model.prune import heads_of_mask, prune_heads
from bertjax.model.sites import SITES, model_sites, site_shape
from bertjax.model.tokenizer import Batch, Tokenizer

__version__ = "0.1.0"

__all__ = [
  "FAMILIES",
  "MODEL_TYPES",
  "PRESETS",
  "SITES",
  "Batch",
  "BertConfig",
  "BertOutput",
  "Intervention",
  "LayersOutput",
  "Packing",
  "Tokenizer",
  "attention_statistics",
  "check_inputs",
  "checked_forward",
  "classify",
  "count_params",
  "embed",
  "forward",
  "from_hf",
  "head_input",
  "head_logits",
  "heads_of_mask",
  "hf_state_dict",
  "init",
  "minilm_path",
  "mlm_logits",
  "model_sites",
  "nsp_logits",
  "param_counts",
  "pool",
  "prune_heads",
  "resolve_model_path",
  "rtd_logits",
  "run_layers",
  "site_shape",
  "sop_logits",
  "to_hf",
  "token_classify",
]
