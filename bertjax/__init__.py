"""bertjax: BERT and ALBERT in pure JAX for BERTology research."""

from bertjax.config import PRESETS, BertConfig
from bertjax.functional import (
    attention_statistics,
    BertOutput,
    check_inputs,
    classify,
    count_params,
    embed,
    forward,
    init,
    mlm_logits,
    nsp_logits,
    pool,
    prune_heads,
    run_layers,
    sop_logits,
    token_classify,
)
from bertjax.hf import from_hf, hf_state_dict, to_hf
from bertjax.hub import minilm_path
from bertjax.tokenization import Batch, Tokenizer

__version__ = "0.1.0"

__all__ = [
    "PRESETS", "Batch", "attention_statistics", "BertConfig", "BertOutput", "Tokenizer", "check_inputs", "classify",
    "count_params", "embed", "forward", "from_hf", "hf_state_dict", "init", "minilm_path",
    "mlm_logits", "nsp_logits", "pool", "prune_heads", "run_layers", "sop_logits", "to_hf", "token_classify",
]
