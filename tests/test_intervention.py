"""One intervention value: `bertjax.Intervention` through `forward`, `run_layers` and the
checked forward.

An intervention passed whole gives bitwise the output of the same keywords; its arrays
are the pytree's leaves and its static part the treedef's (new arrays reuse the compiled
program, a new capture list compiles another); a stack of them vmaps to the loop over
them; its gradient equals the keywords' gradient; wrong input is refused by name.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax.model import forward as forward_module

CONFIG = bertjax.BertConfig(
  vocab_size=99,
  hidden_size=32,
  num_hidden_layers=3,
  num_attention_heads=4,
  intermediate_size=37,
  max_position_embeddings=64,
)
PARAMS = bertjax.init(CONFIG, 0)
RNG = np.random.RandomState(0)
IDS = RNG.randint(5, 99, (2, 9))
MASK = np.ones((2, 9), np.int32)
MASK[1, 7:] = 0
HEAD_MASK = RNG.uniform(size=(3, 4)).astype(np.float32)
LAYER_MASK = np.array([1.0, 0.3, 1.0], np.float32)
MID = RNG.normal(size=(3, 2, 9, 32)).astype(np.float32)


def double(value, index):
  return value * (index + 1.0)


KEYWORDS = dict(
  head_mask=HEAD_MASK,
  head_ablation="uniform",
  layer_mask=LAYER_MASK,
  capture=("embeddings", "q", "out"),
  patch={"mid": (MID, 0.25), "embeddings": (0.0, 0.5), "ffn_act": double},
)


def _same(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_an_intervention_gives_its_keywords_output_bitwise():
  by_keywords = bertjax.forward(PARAMS, CONFIG, IDS, MASK, output_hidden_states=True, **KEYWORDS)
  intervention = bertjax.Intervention(**KEYWORDS)
  whole = bertjax.forward(
    PARAMS, CONFIG, IDS, MASK, output_hidden_states=True, intervention=intervention
  )
  _same(by_keywords, whole)
  assert sorted(whole.cache) == ["embeddings", "out", "q"]
  # The edits happened: the unedited pass differs.
  plain = bertjax.forward(PARAMS, CONFIG, IDS, MASK)
  assert not np.allclose(plain.last_hidden_state, whole.last_hidden_state, atol=1e-3)

  block = dict(KEYWORDS, capture=("q",), patch={"mid": (MID, 0.25)})
  hidden = by_keywords.hidden_states[1]
  rest = bertjax.run_layers(PARAMS, CONFIG, hidden, MASK, start=1, **block)
  rest_whole = bertjax.run_layers(
    PARAMS, CONFIG, hidden, MASK, start=1, intervention=bertjax.Intervention(**block)
  )
  _same(rest, rest_whole)

  checked = bertjax.checked_forward(PARAMS, CONFIG, IDS, MASK, intervention=intervention)
  np.testing.assert_allclose(checked.last_hidden_state, whole.last_hidden_state, atol=1e-6)


def test_its_arrays_are_leaves_and_the_rest_is_static():
  intervention = bertjax.Intervention(**KEYWORDS)
  leaves, treedef = jax.tree.flatten(intervention)
  # head mask, layer mask, then each array patch's value and weight, sites sorted
  assert [np.shape(a) for a in leaves] == [(3, 4), (3,), (), (), (3, 2, 9, 32), ()]
  assert intervention.functions == (("ffn_act", double),)
  assert intervention.capture == ("embeddings", "out", "q")
  other = bertjax.Intervention(**dict(KEYWORDS, head_mask=HEAD_MASK * 0.5))
  assert jax.tree.structure(other) == treedef
  changed = bertjax.Intervention(**dict(KEYWORDS, capture=("out",)))
  assert jax.tree.structure(changed) != treedef
  assert "head_ablation='uniform'" in repr(intervention)

  forward = forward_module._forward
  bertjax.forward(PARAMS, CONFIG, IDS, MASK, intervention=intervention)
  compiled = forward._cache_size()
  bertjax.forward(PARAMS, CONFIG, IDS, MASK, intervention=other)  # new arrays: same program
  assert forward._cache_size() == compiled
  bertjax.forward(PARAMS, CONFIG, IDS, MASK, intervention=changed)  # new capture: a new one
  assert forward._cache_size() == compiled + 1


def test_a_stack_of_interventions_vmaps_to_the_loop():
  masks = RNG.uniform(size=(4, 3, 4)).astype(np.float32)
  weights = np.linspace(0, 1, 4, dtype=np.float32)
  values = np.stack([MID, -MID, 2 * MID, MID[::-1]])  # vmap maps every leaf
  stack = bertjax.Intervention(head_mask=masks, patch={"mid": (values, weights)})
  jit_forward = jax.jit(
    lambda iv: bertjax.forward(PARAMS, CONFIG, IDS, MASK, intervention=iv).last_hidden_state
  )
  swept = jax.vmap(jit_forward)(stack)
  looped = jnp.stack([jit_forward(jax.tree.map(lambda a, i=i: a[i], stack)) for i in range(4)])
  np.testing.assert_allclose(swept, looped, atol=2e-6)


def test_its_gradient_is_the_keywords_gradient():
  def loss_of(intervention):
    out = bertjax.forward(PARAMS, CONFIG, IDS, MASK, intervention=intervention)
    return jnp.sum(out.last_hidden_state[:, 0] ** 2)

  def loss_by_keywords(head_mask, weight):
    out = bertjax.forward(
      PARAMS, CONFIG, IDS, MASK, head_mask=head_mask, patch={"mid": (MID, weight)}
    )
    return jnp.sum(out.last_hidden_state[:, 0] ** 2)

  weight = jnp.float32(0.25)
  grad = jax.jit(jax.grad(loss_of))(
    bertjax.Intervention(head_mask=HEAD_MASK, patch={"mid": (MID, weight)})
  )
  assert isinstance(grad, bertjax.Intervention)
  head, w = jax.jit(jax.grad(loss_by_keywords, argnums=(0, 1)))(HEAD_MASK, weight)
  np.testing.assert_allclose(grad.head_mask, head, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(grad.patch["mid"][1], w, rtol=1e-5, atol=1e-6)
  assert float(jnp.abs(head).sum()) > 0 and float(jnp.abs(w)) > 0


def test_wrong_interventions_are_refused_by_name():
  intervention = bertjax.Intervention(head_mask=HEAD_MASK)
  with pytest.raises(ValueError, match=r"either intervention= or its keywords \['layer_mask'\]"):
    bertjax.forward(PARAMS, CONFIG, IDS, intervention=intervention, layer_mask=LAYER_MASK)
  with pytest.raises(TypeError, match="must be a bertjax.Intervention; got dict"):
    bertjax.forward(PARAMS, CONFIG, IDS, intervention={"head_mask": HEAD_MASK})
  with pytest.raises(ValueError, match="head_ablation='zero' must be one of"):
    bertjax.Intervention(head_ablation="zero")
  with pytest.raises(ValueError, match=r"patch\['mid'\] must be a \(value, weight\) pair"):
    bertjax.Intervention(patch={"mid": MID})
  with pytest.raises(ValueError, match=r"patch\['mid'\] weight must be a number .* got str"):
    bertjax.Intervention(patch={"mid": (MID, "half")})
  with pytest.raises(ValueError, match=r"head_mask shape \(4, 3\) must be \(layers, heads\)"):
    bertjax.forward(PARAMS, CONFIG, IDS, intervention=bertjax.Intervention(head_mask=HEAD_MASK.T))
  with pytest.raises(ValueError, match="run_layers captures and patches block sites"):
    bertjax.run_layers(
      PARAMS,
      CONFIG,
      jnp.zeros((2, 9, 32)),
      intervention=bertjax.Intervention(capture="embeddings"),
    )
  with pytest.raises(ValueError, match=r"sites \['nope'\] are unknown"):
    bertjax.forward(PARAMS, CONFIG, IDS, intervention=bertjax.Intervention(capture="nope"))


# Subspace interchanges ------------------------------------------------------------------------

SOURCE = RNG.normal(size=(3, 2, 9, 32)).astype(np.float32)
BASIS = np.linalg.qr(RNG.normal(size=(32, 5)))[0].T.astype(np.float32)  # (5, 32) orthonormal


def _interchanged(basis, weight, site="mid", source=SOURCE, **kw):
  iv = bertjax.Intervention(subspace={site: (source, basis, weight)})
  return bertjax.forward(PARAMS, CONFIG, IDS, MASK, intervention=iv, **kw).last_hidden_state


def test_a_subspace_interchange_is_the_projection_of_a_patch():
  """On the whole space (any orthonormal basis of it) weight w is the patch of weight w; on
  k rows it moves exactly those coordinates (a function patch computing the same formula);
  weight 0 is bitwise the plain forward; k rows at 1, then their complement, give the patch."""
  full = np.linalg.qr(RNG.normal(size=(32, 32)))[0].T.astype(np.float32)
  weight = np.zeros((3, 1, 1, 1), np.float32)
  weight[1] = 0.7
  patched = bertjax.forward(PARAMS, CONFIG, IDS, MASK, patch={"mid": (SOURCE, weight)})
  np.testing.assert_allclose(_interchanged(full, weight), patched.last_hidden_state, atol=2e-6)
  plain = bertjax.forward(PARAMS, CONFIG, IDS, MASK).last_hidden_state
  np.testing.assert_array_equal(np.asarray(_interchanged(BASIS, 0.0)), np.asarray(plain))

  def by_hand(value, index):
    moved = ((jnp.asarray(SOURCE)[index] - value) @ BASIS.T) @ BASIS
    return value + jnp.where(index == 1, 1.0, 0.0) * moved

  hand = bertjax.forward(PARAMS, CONFIG, IDS, MASK, patch={"mid": by_hand}).last_hidden_state
  at_one = np.zeros((3, 1, 1, 5), np.float32)
  at_one[1] = 1.0
  np.testing.assert_allclose(_interchanged(BASIS, at_one), hand, atol=2e-6)
  assert np.abs(np.asarray(hand) - np.asarray(plain)).max() > 1e-2  # the swap matters


def test_a_subspace_interchange_is_differentiable_and_vmaps():
  weight = np.zeros((3, 2, 9, 5), np.float32)
  weight[1, :, 4] = 1.0
  f = jax.jit(lambda b, w: _interchanged(b, w)[:, 0, :6].sum())
  grad_b, grad_w = jax.grad(f, argnums=(0, 1))(BASIS, weight)
  probe = RNG.normal(size=BASIS.shape).astype(np.float32)
  for eps in (1e-2,):
    fd = (f(BASIS + eps * probe, weight) - f(BASIS - eps * probe, weight)) / (2 * eps)
    np.testing.assert_allclose(float((grad_b * probe).sum()), float(fd), rtol=2e-3, atol=1e-4)
  # Position 4 of block 2's mid reaches position 0's output only through block 3's attention.
  grad_w = np.asarray(grad_w)
  assert np.abs(grad_w[1, :, 4]).max() > 0 and not grad_w[2, :, 4].any()
  stack = np.stack([weight * s for s in (0.0, 0.5, 1.0)])
  many = jax.vmap(lambda w: _interchanged(BASIS, w))(stack)
  for i, s in enumerate((0.0, 0.5, 1.0)):
    np.testing.assert_allclose(many[i], _interchanged(BASIS, weight * s), atol=2e-6)


def test_a_subspace_interchange_on_packed_rows_is_the_padded_one():
  """Two sentences of 4 and 5 tokens share one packed row; each keeps its own source and
  weight (at token 2 of the first in block 2, token 3 of the second in block 3)."""
  mask = (np.arange(9)[None] < np.array([[4], [5]])).astype(np.int32)
  assert bertjax.Packing.of(mask).shape == (1, 9)
  weight = np.zeros((3, 2, 9, 5), np.float32)
  weight[1, 0, 2] = weight[2, 1, 3] = 1.0
  iv = bertjax.Intervention(subspace={"mid": (SOURCE, BASIS, weight)})
  run = lambda **kw: bertjax.forward(PARAMS, CONFIG, IDS, mask, intervention=iv, **kw)
  padded, packed = run().last_hidden_state, run(packed=True).last_hidden_state
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(packed)[real], np.asarray(padded)[real], atol=1e-5)
  plain = bertjax.forward(PARAMS, CONFIG, IDS, mask).last_hidden_state
  assert np.abs(np.asarray(padded) - np.asarray(plain))[real].max() > 1e-3


def test_wrong_subspaces_are_refused_by_name():
  with pytest.raises(ValueError, match=r"subspace\['mid'\] basis shape \(5, 31\) must be"):
    _interchanged(BASIS[:, :31], 1.0)
  with pytest.raises(ValueError, match=r"subspace\['mid'\] weight shape \(3, 1, 1, 4\) does not"):
    _interchanged(BASIS, np.ones((3, 1, 1, 4), np.float32))
  with pytest.raises(ValueError, match=r"subspace\['embeddings'\]: interchanges act on block"):
    _interchanged(BASIS, 1.0, site="embeddings", source=SOURCE[0])
  with pytest.raises(ValueError, match=r"subspace\['mid'\] must be a \(source, basis, weight\)"):
    bertjax.Intervention(subspace={"mid": (SOURCE, BASIS)})
  with pytest.raises(ValueError, match=r"sites \['middle'\] are unknown"):
    _interchanged(BASIS, 1.0, site="middle")
