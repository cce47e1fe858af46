"""DeBERTa-v3's pretraining: replaced-token detection with gradient-disentangled embedding
sharing (GDES), `training.electra` with two `deberta-v2` models.

The loss is checked against a float64 NumPy implementation of the paper's definition and of
the released code's RTD head (`LMMaskPredictionHead`: LayerNorm(h + h_0), dense, GELU, one
logit); the gradients against what GDES promises (the MLM loss alone reaches E_G, the RTD
loss alone E_delta); the export against transformers; `bertjax pretrain
--rtd-generator-layers` end to end. Kill-and-resume is `test_objectives.py`'s, on this pair
too.
"""

import json
import pathlib

import jax
import numpy as np
import pytest
import reference_numpy as ref  # float64 NumPy LayerNorm and GELU

import bertjax
from bertjax.cli import train
from bertjax.training import electra as E
from bertjax.training import step as St

REPO = pathlib.Path(__file__).resolve().parents[1]
SMOKE_TEXT = REPO / "bertjax" / "resources" / "smoke" / "wikitext2_tokens" / "valid.txt"


def gdes_configs(position_biased_input=False):
  """A tiny DeBERTa-v3 discriminator (3 layers) and its generator (same width, 2 layers)."""
  disc = bertjax.BertConfig.for_family(
    "deberta-v2",
    vocab_size=97,
    hidden_size=30,
    num_hidden_layers=3,
    num_attention_heads=5,
    intermediate_size=37,
    max_position_embeddings=40,
    position_buckets=8,
    max_relative_positions=16,
    position_biased_input=position_biased_input,
    type_vocab_size=0,
    use_pooler=False,
  )
  return disc.replace(num_hidden_layers=2), disc


def _batch(rng, b=3, t=14, p=4, vocab=97):
  ids = rng.integers(5, vocab, (b, t)).astype(np.int32)
  mask = np.ones((b, t), np.int32)
  mask[1, 10:] = 0
  mask[2, 7:] = 0
  pos = np.stack([rng.choice(np.arange(1, 7), p, replace=False) for _ in range(b)]).astype(np.int32)
  weights = np.ones((b, p), np.float32)
  weights[2, -1] = 0
  orig = np.take_along_axis(ids, pos, 1)
  masked = ids.copy()
  np.put_along_axis(masked, pos, 4, 1)  # 4 plays [MASK]
  return {
    "input_ids": masked,
    "attention_mask": mask,
    "token_type_ids": np.zeros_like(ids),
    "mlm_positions": pos,
    "mlm_ids": orig,
    "mlm_weights": weights,
  }


def _params(gen, disc, seed=0):
  """The pair with random (not zero) residuals, so E_delta enters every number."""
  params = E.init_electra(gen, disc, seed)
  k = jax.random.key(seed + 1)
  emb = params["discriminator"]["embeddings"]
  for name in [n for n in emb if n.endswith("_delta")]:
    k, sub = jax.random.split(k)
    emb[name] = {"embedding": 0.05 * jax.random.normal(sub, emb[name]["embedding"].shape)}
  return params


def rtd_head_numpy(p, h, eps):
  """The released `LMMaskPredictionHead` in float64: LayerNorm(h + h_0) -> dense -> GELU ->
  one logit per token."""
  h = np.asarray(h, np.float64)
  f = lambda a: np.asarray(a, np.float64)
  x = ref.layer_norm(h + h[:, :1], ref.float64(p["norm"]), eps)
  x = ref.gelu(x @ f(p["dense"]["kernel"]) + f(p["dense"]["bias"]))
  return (x @ f(p["out"]["kernel"]) + f(p["out"]["bias"]))[..., 0]


@pytest.mark.parametrize("position_biased_input", [False, True])
def test_gdes_tables_and_gradients_are_disentangled(position_biased_input):
  gen, disc = gdes_configs(position_biased_input)
  tables = E.shared_tables(gen, disc)
  assert tables == ("word_embeddings",) + (
    ("position_embeddings",) if position_biased_input else ()
  )
  params = _params(gen, disc)
  assert {f"{t}_delta" for t in tables} <= set(params["discriminator"]["embeddings"])
  assert not set(tables) & set(params["discriminator"]["embeddings"])
  full = E.discriminator_params(params, gen, disc)
  for t in tables:  # the discriminator reads E_G + E_delta
    np.testing.assert_array_equal(
      full["embeddings"][t]["embedding"],
      params["generator"]["embeddings"][t]["embedding"]
      + params["discriminator"]["embeddings"][f"{t}_delta"]["embedding"],
    )
  batch = _batch(np.random.default_rng(0))

  def grads(**weights):
    f = St.make_loss_and_grad(disc, objective=(E.Electra(gen, **weights),), deterministic=True)
    return jax.jit(f)(params, batch, jax.random.key(1))[2]

  both, mlm_only, rtd_only = grads(), grads(rtd_weight=0.0), grads(mlm_weight=0.0)
  for t in tables:
    g = lambda tree, t=t: np.asarray(tree["generator"]["embeddings"][t]["embedding"])
    d = lambda tree, t=t: np.asarray(tree["discriminator"]["embeddings"][f"{t}_delta"]["embedding"])
    assert np.abs(g(both)).sum() > 0 and np.abs(d(both)).sum() > 0
    # The stop-gradient: RTD never reaches E_G, MLM never reaches E_delta.
    assert not g(rtd_only).any() and not d(mlm_only).any()
    np.testing.assert_allclose(g(both), g(mlm_only), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(d(both), d(rtd_only), rtol=1e-6, atol=1e-9)


def test_gdes_loss_equals_numpy_of_the_paper_s_definition():
  """L = L_MLM + lambda L_RTD (lambda 10): L_MLM the generator's mean cross-entropy at the
  masked positions, L_RTD the mean binary cross-entropy over real tokens of whether each
  token of the corrupted sequence differs from the original, from the released RTD head."""
  gen, disc = gdes_configs()
  params = _params(gen, disc, seed=3)
  batch = _batch(np.random.default_rng(1))
  el = E.Electra(gen)
  assert el.rtd_weight == 10.0 and E.Electra(gen, rtd_weight=50.0).rtd_weight == 50.0
  key = jax.random.key(5)
  f = St.make_loss_and_grad(disc, objective=(el,), deterministic=True)
  loss, metrics, _ = jax.jit(f)(params, batch, key)
  run = jax.jit(el.run, static_argnums=(1, 4))(params, disc, batch, key, True)
  # The generator's log-probabilities at the masked positions, in float64.
  g_out = bertjax.forward(params["generator"], gen, batch["input_ids"], batch["attention_mask"])
  logits = np.asarray(bertjax.head_logits(params["generator"], gen, g_out, "mlm"), np.float64)
  logits = np.take_along_axis(logits, batch["mlm_positions"][..., None], 1)
  logp = (
    logits
    - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
    - logits.max(-1, keepdims=True)
  )
  w = batch["mlm_weights"].astype(np.float64)
  nll = -np.take_along_axis(logp, batch["mlm_ids"][..., None], -1)[..., 0]
  mlm = (nll * w).sum() / w.sum()
  # The corruption: sampled tokens at the live masked positions; labels where they differ.
  corrupted, original = np.asarray(run["corrupted"]), batch["input_ids"].copy()
  rows, live = np.nonzero(w > 0)
  original[rows, batch["mlm_positions"][rows, live]] = batch["mlm_ids"][rows, live]
  np.testing.assert_array_equal(run["original"], original)
  labels = (corrupted != original).astype(np.float64)
  assert labels.sum() > 0  # a random generator replaces some tokens
  # The discriminator reads E_G + E_delta; its head is the released one.
  d = E.discriminator_params(params, gen, disc)
  h = bertjax.forward(d, disc, corrupted, batch["attention_mask"]).last_hidden_state
  z = rtd_head_numpy(d["rtd"], h, disc.layer_norm_eps)
  np.testing.assert_allclose(run["rtd_logits"], z, atol=1e-5)
  real = batch["attention_mask"] > 0
  bce = np.maximum(z, 0) - z * labels + np.log1p(np.exp(-np.abs(z)))
  rtd = bce[real].mean()
  np.testing.assert_allclose(metrics["mlm_loss"], mlm, rtol=1e-5)
  np.testing.assert_allclose(metrics["rtd_loss"], rtd, rtol=1e-5)
  np.testing.assert_allclose(loss, mlm + 10 * rtd, rtol=1e-5)


def test_gdes_refusals_name_the_problem():
  gen, disc = gdes_configs()
  with pytest.raises(ValueError, match="differs from the discriminator's"):
    E.shared_tables(gen, bertjax.BertConfig(model_type="electra", vocab_size=97))
  with pytest.raises(ValueError, match="position_biased_input"):
    E.shared_tables(gen.replace(position_biased_input=True), disc)
  with pytest.raises(ValueError, match="trained for"):
    E.Electra(bertjax.BertConfig(vocab_size=97))


@pytest.mark.hf
def test_gdes_export_loads_in_transformers(tmp_path):
  """The generator is a `DebertaV2ForMaskedLM` with E_G; the discriminator's tables are
  E_G + E_delta and its RTD head the released checkpoints' `mask_predictions.*`."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  gen, disc = gdes_configs()
  params = _params(gen, disc, seed=4)
  gen_dir, disc_dir = E.save_electra(params, gen, disc, tmp_path)
  batch = _batch(np.random.default_rng(2))
  ids, mask = batch["input_ids"], batch["attention_mask"]
  real = mask > 0
  model, info = transformers.DebertaV2ForMaskedLM.from_pretrained(gen_dir, output_loading_info=True)
  assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
  with torch.no_grad():
    theirs = model.eval()(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits
  ours = bertjax.head_logits(
    params["generator"], gen, bertjax.forward(params["generator"], gen, ids, mask), "mlm"
  )
  np.testing.assert_allclose(np.asarray(ours)[real], theirs.numpy()[real], atol=1e-4)
  d_config, d_params = bertjax.from_hf(disc_dir)
  assert set(d_params) >= {"rtd"} and "mlm" not in d_params
  full = E.discriminator_params(params, gen, disc)
  for a, b in zip(jax.tree.leaves(full), jax.tree.leaves(d_params)):
    np.testing.assert_array_equal(a, b)
  base = transformers.DebertaV2Model.from_pretrained(disc_dir).eval()
  with torch.no_grad():
    hidden = base(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
  ours = bertjax.forward(d_params, d_config, ids, mask).last_hidden_state
  np.testing.assert_allclose(
    np.asarray(ours)[real], hidden.last_hidden_state.numpy()[real], atol=1e-4
  )


def test_pretrain_trains_deberta_v3_rtd_with_gdes(tmp_path):
  cfg = tmp_path / "deberta.json"
  cfg.write_text(
    json.dumps(
      {
        "model_type": "deberta-v2",
        "vocab_size": 30522,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 48,
        "max_position_embeddings": 64,
        "relative_attention": True,
        "position_buckets": 16,
        "pos_att_type": "p2c|c2p",
        "position_biased_input": False,
        "type_vocab_size": 0,
        "share_att_key": True,
        "norm_rel_ebd": "layer_norm",
      }
    )
  )
  run = tmp_path / "run"
  argv = [
    "--corpus",
    str(SMOKE_TEXT),
    "--corpus-format",
    "wikitext",
    "--vocab",
    str(bertjax.minilm_path() / "vocab.txt"),
    "--seq-len",
    "32",
    "--steps",
    "2",
    "--batch-size",
    "4",
    "--output-dir",
    str(run),
    "--checkpoint-every",
    "1",
    "--no-progress",
    "--objective",
    "none",
    "--config-json",
    str(cfg),
    "--lr",
    "1e-2",
    "--rtd-generator-layers",
    "1",
    "--export-hf",
    str(tmp_path / "final"),
  ]
  assert train.pretrain_main(argv) == 0
  rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
  assert len(rows) == 2 and {"mlm_loss", "rtd_loss"} <= set(rows[0])
  assert all(np.isfinite(r["loss"]) for r in rows)
  g_config, _ = bertjax.from_hf(tmp_path / "final" / "generator")
  d_config, d_params = bertjax.from_hf(tmp_path / "final" / "discriminator")
  assert (g_config.num_hidden_layers, d_config.num_hidden_layers) == (1, 2) and "rtd" in d_params
  with pytest.raises(ValueError, match="needs model_type='deberta-v2', got 'bert'"):
    refused = argv[:-8] + ["--rtd-generator-layers", "1"]
    refused[refused.index("--output-dir") + 1] = str(tmp_path / "bert")
    train.pretrain_main(refused)
