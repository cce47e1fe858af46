"""The tuned lens (`bertjax.analysis.attribution.tuned_lens`): the released code's loss and optimiser,
the logit lens at initialisation, and training that beats the logit lens on held-out text."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax.analysis.attribution import tuned_lens

CONFIG = bertjax.BertConfig.preset(
  "tiny",
  vocab_size=200,
  hidden_size=32,
  num_hidden_layers=3,
  num_attention_heads=4,
  intermediate_size=64,
  max_position_embeddings=32,
)


@pytest.fixture(scope="module")
def model():
  params = bertjax.init(CONFIG, 0, heads=("mlm",))
  # Larger weights than the init's 0.02, so that the layers' distributions differ.
  params = jax.tree.map(lambda a: a * 5 if a.ndim >= 2 else a, params)
  return params


def _batches(seed, n=4):
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    mask = (np.arange(16)[None] < rng.integers(8, 17, (8, 1))).astype(np.int32)
    ids = rng.integers(5, CONFIG.vocab_size, mask.shape).astype(np.int32) * mask
    out.append({"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
  return out


def test_untrained_lens_is_the_logit_lens(model):
  lens = tuned_lens.init(CONFIG)
  states = jnp.asarray(np.random.default_rng(0).normal(size=(CONFIG.depth, 2, 5, 32)), jnp.float32)
  np.testing.assert_array_equal(np.asarray(tuned_lens.translate(lens, states)), np.asarray(states))
  got = tuned_lens.evaluate(model, CONFIG, lens, _batches(1, 2))
  np.testing.assert_allclose(got["tuned"], got["logit"], rtol=1e-6)
  assert len(got["tuned"]) == CONFIG.depth and got["tokens"] > 100


def test_kl_is_the_released_loss(model):
  """`sum(labels.exp() * (labels - logits.log_softmax(-1)), -1).mean()` (train_loop.py) in
  torch on the same logits, per layer, over the real tokens of an unpadded batch."""
  torch = pytest.importorskip("torch")
  b = _batches(2, 1)[0]
  b["attention_mask"] = np.ones_like(b["attention_mask"])
  lens = tuned_lens.TunedLens(
    *(
      0.05 * jnp.asarray(np.random.default_rng(3).normal(size=s), jnp.float32)
      for s in ((CONFIG.depth, 32, 32), (CONFIG.depth, 32))
    )
  )
  got = np.asarray(tuned_lens._evaluate_batch(model, CONFIG, lens, b)[0])
  states, final = tuned_lens._states(model, CONFIG, b)
  labels = torch.tensor(np.asarray(bertjax.mlm_logits(model, CONFIG, final))).log_softmax(-1)
  moved = tuned_lens.translate(lens, states)
  for layer in range(CONFIG.depth):
    logits = torch.tensor(np.asarray(bertjax.mlm_logits(model, CONFIG, moved[layer])))
    want = torch.sum(labels.exp() * (labels - logits.log_softmax(-1)), dim=-1).mean()
    assert got[layer] == pytest.approx(float(want), rel=1e-5, abs=1e-7)


def test_optimizer_is_torch_sgd_nesterov_with_linear_decay():
  """The released `OptimizerConfig` defaults: torch SGD(lr=lr_scale (1 - beta), momentum=beta,
  nesterov=True, weight_decay=1e-3) under a linear schedule to 0 without warm-up."""
  torch = pytest.importorskip("torch")
  steps, target = 6, np.array([1.0, -2.0, 0.5])
  x0, scale = np.array([0.3, 0.1, -0.4]), np.array([1.0, 3.0, 0.5])
  opt = tuned_lens.optimizer(steps)
  x, state = jnp.asarray(x0), opt.init(jnp.asarray(x0))
  for _ in range(steps):
    g = jax.grad(lambda v: jnp.sum((v - target) ** 2 * scale))(x)
    u, state = opt.update(g, state, x)
    x = x + u
  p = torch.tensor(x0, requires_grad=True)
  sgd = torch.optim.SGD([p], lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)
  sched = torch.optim.lr_scheduler.LambdaLR(sgd, lambda s: max(0.0, 1 - s / steps))
  for _ in range(steps):
    sgd.zero_grad()
    ((p - torch.tensor(target)) ** 2 * torch.tensor(scale)).sum().backward()
    sgd.step()
    sched.step()
  np.testing.assert_allclose(np.asarray(x), p.detach().numpy(), rtol=1e-5)


def test_training_beats_the_logit_lens_on_held_out_text(model):
  lens, log = tuned_lens.train(model, CONFIG, _batches(4, 6), steps=80, lr_scale=2.0)
  assert log[-1] < log[0]
  got = tuned_lens.evaluate(model, CONFIG, lens, _batches(5, 3))
  tuned, logit = np.asarray(got["tuned"]), np.asarray(got["logit"])
  assert (tuned < logit).all(), (tuned, logit)
  assert np.isfinite(tuned).all() and (tuned >= 0).all()
  # The means are the token-weighted means of each batch's, which each batch alone gives.
  per = got["per_batch"]
  n = np.asarray(per["tokens"], float)
  np.testing.assert_allclose(n @ np.asarray(per["tuned"]) / n.sum(), tuned, rtol=1e-12)
  one = tuned_lens.evaluate(model, CONFIG, lens, _batches(5, 3)[1:2])
  np.testing.assert_allclose(one["tuned"], per["tuned"][1], rtol=1e-12)
  assert one["tokens"] == per["tokens"][1] and sum(per["tokens"]) == got["tokens"]


def test_refuses_a_model_without_an_mlm_head():
  params = bertjax.init(CONFIG, 0)
  with pytest.raises(ValueError, match="MLM head"):
    tuned_lens.train(params, CONFIG, _batches(0, 1), steps=1)
  with pytest.raises(ValueError, match="steps=0"):
    tuned_lens.train(bertjax.init(CONFIG, 0, heads=("mlm",)), CONFIG, _batches(0, 1), steps=0)
