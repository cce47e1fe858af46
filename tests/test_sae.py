"""Top-k sparse autoencoders (`bertjax.analysis.representations.sae`).

The encoder, decoder and both loss terms against the same function written in PyTorch
from Gao et al.'s released definitions (openai/sparse_autoencoder: `FastAutoencoder`,
`normalized_mse`, the training loss of `train.py`), values and every gradient; the
geometric median against SciPy's minimiser of the summed distances; the step's decoder
constraint; dead-latent counting; a real run on all-MiniLM-L6-v2's residual stream over
WikiText-2; `loss_recovered` at its two exact ends (an SAE that reconstructs exactly, and
one that outputs zeros); the same steps on a two-device mesh.
"""

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax.analysis.representations import sae

REPO = pathlib.Path(__file__).resolve().parents[1]


def _random_sae(config: sae.SAEConfig, seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  d, m = config.d_model, config.latents
  return {
    "pre_bias": jnp.asarray(rng.standard_normal(d), jnp.float32) * 0.1,
    "W_enc": jnp.asarray(rng.standard_normal((d, m)), jnp.float32) / np.sqrt(d),
    "latent_bias": jnp.asarray(rng.standard_normal(m), jnp.float32) * 0.05,
    "W_dec": sae.unit_rows(jnp.asarray(rng.standard_normal((m, d)), jnp.float32)),
  }


def _torch_loss(p, x, config, dead, scale):
  """Gao et al.'s forward and loss in PyTorch, from their definitions."""
  import torch

  pre = (x - p["pre_bias"]) @ p["W_enc"] + p["latent_bias"]
  top = torch.topk(pre, config.k, dim=-1)
  vals = torch.relu(top.values)

  def decode_sparse(inds, vals):
    dense = torch.zeros(x.shape[0], config.latents, dtype=x.dtype).scatter(-1, inds, vals)
    return dense @ p["W_dec"] + p["pre_bias"]

  recons = decode_sparse(top.indices, vals)
  mse = scale * ((recons - x) ** 2).mean()
  aux = torch.topk(pre * dead, config.auxk, dim=-1)
  aux_recons = decode_sparse(aux.indices, torch.relu(aux.values))
  target = x - recons.detach() + p["pre_bias"].detach()
  normalized = ((aux_recons - target) ** 2).mean() / ((target.mean(0) - target) ** 2).mean()
  return mse + config.auxk_coef * normalized.nan_to_num(0), recons, mse, normalized


@pytest.mark.parametrize("not_dead", [False, True])
def test_forward_loss_and_gradients_against_pytorch(not_dead):
  torch = pytest.importorskip("torch")
  config = sae.SAEConfig(d_model=24, latents=96, k=6, auxk=12)
  params = _random_sae(config)
  rng = np.random.default_rng(1)
  x = rng.standard_normal((40, 24)).astype(np.float32)
  dead = rng.uniform(size=96) < 0.4
  if not_dead:
    dead[:] = False  # the closed form of the AuxK term with no dead latent
  scale = sae.mse_scale(x)
  terms = sae.loss_terms(params, x, config, jnp.asarray(dead), scale)
  grads = jax.grad(lambda p: sae.loss_terms(p, x, config, jnp.asarray(dead), scale)["loss"])(params)
  tp = {
    k: torch.tensor(np.asarray(v), dtype=torch.float64, requires_grad=True)
    for k, v in params.items()
  }
  loss, recons, mse, aux = _torch_loss(
    tp, torch.tensor(x, dtype=torch.float64), config, torch.tensor(dead, dtype=torch.float64), scale
  )
  loss.backward()
  np.testing.assert_allclose(
    sae.reconstruct(params, x, config.k), recons.detach().numpy(), rtol=1e-5, atol=1e-5
  )
  np.testing.assert_allclose(terms["mse"], mse.item(), rtol=1e-5)
  np.testing.assert_allclose(terms["auxk"], aux.item(), rtol=1e-5)
  assert aux.item() > 0.1  # the dead latents (or b_pre alone) really enter
  for name in params:
    np.testing.assert_allclose(
      grads[name], tp[name].grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=name
    )
  # The dense form of the sparse latents is what the torch scatter gives.
  values, indices = sae.encode(params, x, config.k)
  dense = np.asarray(sae.dense_latents(values, indices, config.latents))
  assert ((dense > 0).sum(1) <= config.k).all() and (dense >= 0).all()


def test_geometric_median_minimises_summed_distances():
  scipy_opt = pytest.importorskip("scipy.optimize")
  rng = np.random.default_rng(0)
  x = np.concatenate([rng.standard_normal((200, 5)), 30 + rng.standard_normal((20, 5))])
  ours = np.asarray(sae.geometric_median(x), np.float64)
  cost = lambda y: np.linalg.norm(x - y, axis=1).sum()
  ref = scipy_opt.minimize(
    cost, x.mean(0), method="Nelder-Mead", options=dict(xatol=1e-9, fatol=1e-9, maxiter=20000)
  ).x
  assert cost(ours) <= cost(ref) * (1 + 1e-6)
  assert np.linalg.norm(ours - np.median(x, 0)) < np.linalg.norm(x.mean(0) - np.median(x, 0))


def test_init_and_step_keep_the_decoder_rows_unit_and_count_dead_latents():
  config = sae.SAEConfig(d_model=16, latents=64, k=4, auxk=8, dead_tokens=50, lr=1e-3)
  rng = np.random.default_rng(0)
  x = rng.standard_normal((512, 16)).astype(np.float32) + 2
  params = sae.init(0, config, x)
  np.testing.assert_allclose(np.linalg.norm(params["W_dec"], axis=1), 1, rtol=1e-5)
  # The tied init: each decoder row is its encoder column's direction.
  cos = np.sum(sae.unit_rows(params["W_enc"].T) * params["W_dec"], -1)
  np.testing.assert_allclose(cos, 1, rtol=1e-5)
  # Random unit inputs around b_pre reconstruct with norm 1 on average (the released init).
  u = rng.standard_normal((4096, 16)).astype(np.float32)
  u = u / np.linalg.norm(u, axis=1, keepdims=True) + np.asarray(params["pre_bias"])
  norm = np.linalg.norm(sae.reconstruct(params, u, 4) - params["pre_bias"], axis=1).mean()
  assert abs(norm - 1) < 0.05
  # A latent that can never fire (its bias far below) is dead after dead_tokens tokens.
  params["latent_bias"] = params["latent_bias"].at[0].set(-1e6)
  state = sae.start(params, config)
  step = sae.make_step(config)
  losses = []
  for i in range(30):
    state, m = step(state, x[(i * 32) % 512 : (i * 32) % 512 + 32], sae.mse_scale(x))
    losses.append(float(m["loss"]))
  np.testing.assert_allclose(np.linalg.norm(state.params["W_dec"], axis=1), 1, rtol=1e-5)
  since = np.asarray(state.tokens_since)
  # Counted as the released code counts (this batch first), saturated past the threshold.
  assert since[0] == config.dead_tokens + 32 and since.min() == 32
  assert float(m["dead"]) > 0 and np.mean(losses[-5:]) < np.mean(losses[:5])


def test_exact_and_zero_saes_bound_the_loss_recovered(minilm_dir):
  """[I; -I] with k = d reconstructs every vector exactly (|x_i| from the right half), so
  the loss is the clean one and all of it is recovered; a zero decoder and pre-bias is the
  zero ablation, so none is."""
  config, params = bertjax.from_hf(minilm_dir)
  tok = bertjax.Tokenizer.from_pretrained(minilm_dir)
  batch = tok.encode(["The keys to the cabinet are on the table.", "No dog barked."])
  d = config.hidden_size
  exact = {
    "pre_bias": jnp.zeros(d),
    "latent_bias": jnp.zeros(2 * d),
    "W_enc": jnp.concatenate([jnp.eye(d), -jnp.eye(d)], 1),
    "W_dec": jnp.concatenate([jnp.eye(d), -jnp.eye(d)], 0),
  }
  cfg = sae.SAEConfig(d_model=d, latents=2 * d, k=d)
  pooled = lambda out, b: jnp.sum(out.last_hidden_state[:, 0] ** 2)  # any differentiable read
  r = sae.loss_recovered(params, config, [batch], "mid", 2, exact, cfg, pooled)
  np.testing.assert_allclose(r["sae"], r["clean"], rtol=1e-5)
  np.testing.assert_allclose(r["recovered"], 1, atol=1e-4)
  zero = {**exact, "W_dec": jnp.zeros_like(exact["W_dec"])}
  r0 = sae.loss_recovered(params, config, [batch], "mid", 2, zero, cfg, pooled)
  np.testing.assert_allclose(r0["recovered"], 0, atol=1e-6)
  assert abs(r0["zero"] - r0["clean"]) > 1e-2 * abs(r0["clean"])
  # Only block 2 is edited: the zero ablation equals an array patch of that block alone.
  weight = np.zeros((config.depth, 1, 1, 1), np.float32)
  weight[2] = 1
  out = bertjax.forward(
    params, config, batch.input_ids, batch.attention_mask, patch={"mid": (0.0, weight)}
  )
  np.testing.assert_allclose(r0["zero"], float(pooled(out, None)), rtol=1e-5)


@pytest.mark.optimized
def test_sae_on_minilm_residual_stream(minilm_dir, data_dir):
  """A real run: WikiText-2's validation paragraphs (64 tokens each) at layer 4's block output of all-MiniLM-L6-v2 (384
  wide), 8x latents, k = 32: held-out variance explained, few dead latents, the loss
  recovered on the mean-pooled sentence embedding (its squared distance to the clean one),
  and each latent's top tokens are real tokens where it fires."""
  config, params = bertjax.from_hf(minilm_dir)
  tok = bertjax.Tokenizer.from_pretrained(minilm_dir)
  lines = [
    ln.strip()
    for ln in (data_dir / "wikitext2_tokens" / "valid.txt").open()
    if len(ln.split()) > 12 and not ln.strip().startswith("=")
  ][:800]
  batches = [
    tok.encode(lines[i : i + 32], max_length=64, truncation=True) for i in range(0, len(lines), 32)
  ]
  acts = sae.activations(params, config, batches, "out", 3)
  assert acts.shape[1] == 384 and len(acts) > 40000, acts.shape
  train, held = acts[:-8192], acts[-8192:]
  cfg = sae.SAEConfig(d_model=384, latents=8 * 384, k=32, lr=1e-3, dead_tokens=200_000)
  state, log = sae.train(train, cfg, steps=100, batch_tokens=1024, progress=False, log_every=50)
  assert log[-1][1]["loss"] < log[0][1]["loss"]
  groups = np.arange(len(held)) % 7  # the FVU's sums kept per group: their ratio is the FVU
  ev = sae.evaluate(state.params, cfg, held, groups=groups)
  assert ev["fvu"] < 0.4, ev["fvu"]  # 0.30 on the Xeon (Sapphire Rapids)
  assert ev["l0"] <= 32 and ev["dead"] < 0.5
  per = ev["per_group"]
  assert per["error"].shape == per["variance"].shape == (7,)
  assert per["error"].sum() / per["variance"].sum() == pytest.approx(ev["fvu"], rel=1e-12)
  x = np.asarray(held, np.float64)
  want = np.sum((x[groups == 3] - x.mean(0)) ** 2)  # deviations from the whole set's mean
  assert per["variance"][3] == pytest.approx(want, rel=1e-9)
  with pytest.raises(ValueError, match="groups shape"):
    sae.evaluate(state.params, cfg, held, groups=groups[1:])
  clean = {}

  def emb(out, b):
    m = b["attention_mask"][..., None]
    return jnp.sum(out.last_hidden_state * m, 1) / m.sum(1)

  def loss_fn(out, b):  # distance of the sentence embedding to the clean run's
    key = np.asarray(b["input_ids"]).tobytes()
    clean.setdefault(key, emb(out, b))
    return jnp.mean(jnp.sum((emb(out, b) - clean[key]) ** 2, -1))

  r = sae.loss_recovered(params, config, batches[-2:], "out", 3, state.params, cfg, loss_fn)
  assert r["clean"] == 0 and 0.5 < r["recovered"] <= 1, r
  top = sae.top_activating(
    params,
    config,
    tok,
    batches[-2:],
    "out",
    3,
    state.params,
    cfg,
    [int(np.argmax(ev["frequency"]))],
    n=5,
  )
  (items,) = top.values()
  assert len(items) == 5 and items[0]["value"] >= items[-1]["value"] > 0
  assert all(
    i["token"] in i["text"].replace(" ", "")
    or i["token"].startswith("##")
    or i["token"].startswith("[")
    for i in items
  )


@pytest.mark.parametrize(
  "bad, message",
  [
    (dict(d_model=8, latents=4, k=5), "k=5 must be at most latents=4"),
    (dict(d_model=0, latents=4), "d_model=0 must be a positive int"),
  ],
)
def test_bad_configs(bad, message):
  with pytest.raises(ValueError, match=message):
    sae.SAEConfig(**bad)


def test_bad_sites_and_shapes():
  config = bertjax.BertConfig.preset("tiny")
  params = bertjax.init(config, 0)
  batch = {"input_ids": np.ones((1, 4), np.int32)}
  with pytest.raises(ValueError, match="site='resid' is not a site"):
    sae.activations(params, config, [batch], "resid", 0)
  with pytest.raises(ValueError, match=r"layer=2 must be a block index in \[0, 2\)"):
    sae.activations(params, config, [batch], "out", 2)
  with pytest.raises(ValueError, match="is an attention map"):
    sae.activations(params, config, [batch], "probs", 0)
  assert sae.activations(params, config, [batch], "q", 1).shape == (4, 64)
  mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.int32)
  two = [{"input_ids": np.arange(8, dtype=np.int32).reshape(2, 4) + 5, "attention_mask": mask}]
  both = sae.activations_by_layer(params, config, two * 3, "q", [1, 0], max_tokens=12)
  assert both.shape == (2, 12, 64)  # 5 real tokens a batch, cut at 12
  for row, layer in zip(both, (1, 0)):
    np.testing.assert_array_equal(
      row, sae.activations(params, config, two * 3, "q", layer, max_tokens=12)
    )
  with pytest.raises(ValueError, match=r"layer=2 must be a block index"):
    sae.activations_by_layer(params, config, [batch], "out", [0, 2])
  with pytest.raises(ValueError, match="layers is empty"):
    sae.activations_by_layer(params, config, [batch], "out", [])
  with pytest.raises(ValueError, match=r"must be \(n, d_model=8\)"):
    sae.train(np.zeros((10, 3)), sae.SAEConfig(d_model=8, latents=16, k=2), steps=1)


MESH_SCRIPT = """
import json, sys, numpy as np, jax
from bertjax import mesh as mesh_lib
from bertjax.analysis.representations import sae
x = np.random.default_rng(0).standard_normal((2048, 32)).astype(np.float32)
cfg = sae.SAEConfig(d_model=32, latents=128, k=8, auxk=16, lr=1e-3)
mesh = mesh_lib.make_mesh() if sys.argv[1] == "mesh" else None
state, log = sae.train(x, cfg, steps=6, batch_tokens=256, mesh=mesh, progress=False)
print(json.dumps({"devices": jax.device_count(), "loss": log[-1][1]["loss"],
                  "W_dec": np.asarray(state.params["W_dec"]).tolist()}))
"""


def test_training_on_a_mesh_equals_one_device():
  """Six steps with each step's tokens split over two CPU devices give the single-device
  parameters (the gradient is a sum over tokens either way)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
  runs = {}
  for mode in ("mesh", "single"):
    proc = subprocess.run(
      [sys.executable, "-c", MESH_SCRIPT, mode],
      cwd=REPO,
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
  assert runs["mesh"]["devices"] == 2
  np.testing.assert_allclose(runs["mesh"]["loss"], runs["single"]["loss"], rtol=1e-5)
  np.testing.assert_allclose(runs["mesh"]["W_dec"], runs["single"]["W_dec"], atol=1e-5)


def test_report_section_counts_dead_latents_per_held_out_sentence():
  """The report's section 12: trained on all but the last fifth of the batches, evaluated on
  those (every real token counted once); the interval's upper end is at least the dead share
  counted over all of them; the latents shown fire on held-out text."""
  import bertjax
  from bertjax.report import sections
  from bertjax.report.settings import ReportSettings

  config = bertjax.BertConfig(
    vocab_size=90,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=40,
    max_position_embeddings=40,
  )
  params = bertjax.init(config, 0)
  rng = np.random.default_rng(0)
  batches = []
  for i in range(5):
    ids = rng.integers(5, 90, (6, 12)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 7:] = 0
    batches.append(
      (
        np.arange(6 * i, 6 * i + 6),
        {"input_ids": ids, "attention_mask": mask, "token_type_ids": 0 * ids},
      )
    )
  tok = type(
    "Tok",
    (),
    {
      "convert_ids_to_tokens": lambda self, ids: [str(i) for i in ids],
      "decode": lambda self, ids: " ".join(map(str, ids)),
    },
  )()
  got = sections.sae_section(
    params,
    config,
    tok,
    batches,
    ReportSettings(sae_steps=20, sae_expansion=2, bootstrap_resamples=50),
  )
  assert got["available"] and got["held_sentences"] == 6 and got["latents"] == 64
  assert got["held_tokens"] == 6 * 12 - 5 and got["train_tokens"] == 4 * (6 * 12 - 5)
  assert got["dead"] <= got["dead_ci"][1] and 0 <= got["dead"] < 1
  assert 1 <= len(got["top"]) <= 8 and all(v for v in got["top"].values())


def test_scaling_sweep_is_one_train_and_evaluate_per_size():
  rng = np.random.default_rng(0)
  acts = (rng.normal(size=(640, 4)) @ rng.normal(size=(4, 8))).astype(np.float32)
  train, held = acts[:512], acts[512:]
  kw = dict(k=4, lr=1e-3, steps=6, batch_tokens=64, seed=1)
  lines = []
  r, (state, cfg, ev) = sae.scaling_sweep(train, held, (1, 2), **kw, log=lines.append)
  assert r["latents"] == [8, 16] and len(lines) == 2 and "16 latents: FVU" in lines[1]
  assert (r["train_tokens"], r["held_out_tokens"]) == (512, 128)
  for i, e in enumerate((1, 2)):
    c = sae.SAEConfig(d_model=8, latents=8 * e, k=4, lr=1e-3, dead_tokens=6400)
    s, _ = sae.train(train, c, steps=6, batch_tokens=64, seed=1, progress=False)
    want = sae.evaluate(s.params, c, held)
    for key in ("fvu", "dead", "dense", "l0"):
      assert r[key][i] == pytest.approx(want[key], rel=1e-6), key
  assert cfg.latents == 16 and ev["fvu"] == r["fvu"][-1]
  assert state.params["W_dec"].shape[0] == 16
  from bertjax import stats

  assert r["fit"] == stats.power_law_fit([8, 16], r["fvu"])
