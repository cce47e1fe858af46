"""Script-specific checks of `experiments/sixteen_heads.py` (Michel et al.'s pruning)."""

import pathlib
import sys

import numpy as np

import bertjax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "experiments"))
import sixteen_heads as sh

CONFIG = bertjax.BertConfig.preset("tiny", num_hidden_layers=2, vocab_size=97)


def test_pruned_model_equals_masked_model_even_with_a_layer_emptied():
  params = bertjax.init(CONFIG, 3)
  rng = np.random.default_rng(0)
  ids = rng.integers(1, CONFIG.vocab_size, (3, 10)).astype(np.int32)
  attn = np.ones((3, 10), np.int32)
  attn[1, 6:] = 0
  mask = np.ones((CONFIG.depth, CONFIG.num_attention_heads), np.float32)
  mask[0] = 0  # every head of layer 0
  mask[1, [1, 3]] = 0
  config, pruned, diff = sh.pruned_vs_masked(params, CONFIG, mask, ids, attn)
  assert diff < 1e-5
  assert dict(config.pruned_heads) == {0: (0, 1, 2, 3), 1: (1, 3)}
  per_head = 4 * CONFIG.hidden_size * CONFIG.head_dim + 3 * CONFIG.head_dim
  assert bertjax.count_params(params) - bertjax.count_params(pruned) == 6 * per_head
  assert bertjax.heads_of_mask(mask) == {0: [0, 1, 2, 3], 1: [1, 3]}
