"""Script-specific checks of `experiments/sixteen_heads.py` (Michel et al.'s pruning)."""

import math
import pathlib
import sys

import numpy as np

import bertjax
from bertjax import stats

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
  assert sh.heads_to_prune(mask) == {0: [0, 1, 2, 3], 1: [1, 3]}


def test_pruning_orders_extend_the_iterative_masks():
  rng = np.random.default_rng(1)
  shape = (3, 4)
  importance = rng.random(shape)
  steps = np.ones((4, *shape), np.float32)
  first, second = [5, 0, 9], [2, 11, 7]
  for i, heads in ((1, first), (2, first + second), (3, first + second + [1, 4])):
    steps[i].ravel()[heads] = 0
  order = sh.iterative_order(steps, importance)
  assert sorted(order.tolist()) == list(range(12))
  # Each step's heads come before the next step's, so every step's mask is a prefix.
  masks = sh.order_masks(order, [0, 3, 6, 8], shape)
  np.testing.assert_array_equal(masks, steps)
  # Within a step, least important first; never-pruned heads last, by importance.
  assert list(order[:3]) == sorted(first, key=lambda h: importance.ravel()[h])
  rest = [h for h in range(12) if h not in first + second + [1, 4]]
  assert list(order[8:]) == sorted(rest, key=lambda h: importance.ravel()[h])


def test_mcnemar_exact_and_curve_area():
  base = np.array([True] * 20)
  other = base.copy()
  other[:8] = False  # 8 lost
  base[19], other[19] = False, True  # 1 gained
  expected = min(1.0, 2 * sum(math.comb(9, k) for k in range(2)) / 2**9)
  assert math.isclose(stats.mcnemar_p(base, other), expected, rel_tol=1e-9)
  assert stats.mcnemar_p(base, base) == 1.0
  assert stats.wilcoxon_p(np.ones(5), np.ones(5)) == 1.0
  assert math.isclose(sh.curve_area([0, 0.5, 1.0], [1.0, 1.0, 0.0]), 0.75)


def test_min_detectable_drop_is_the_first_significant_count():
  # Exact McNemar with every discordant pair one way: p = 2 / 2^b.
  assert sh.min_detectable_drop(115, 0.01) == 8 / 115  # 2 / 2^8 = 0.0078; 2 / 2^7 = 0.0156
  assert sh.min_detectable_drop(100, 0.05) == 6 / 100
  lost = np.ones(115, bool)
  other = lost.copy()
  other[:8] = False
  assert stats.mcnemar_p(lost, other) < 0.01
  other[7] = True
  assert stats.mcnemar_p(lost, other) >= 0.01
