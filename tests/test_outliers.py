"""Outlier dimensions, massive activations, Kovaleva et al.'s disabling and the int8 error
by layer (`analysis.outliers`), against NumPy on the model's own hidden states, with
outliers planted through the LayerNorm biases."""

import types

import numpy as np
import pytest
from scipy import stats as sps

import bertjax
from bertjax.analysis.representations import outliers


def _planted(beta_last=10.0, beta_all=10.0, dim=7):
  config = bertjax.BertConfig(
    vocab_size=90,
    hidden_size=32,
    num_hidden_layers=4,
    num_attention_heads=4,
    intermediate_size=40,
    max_position_embeddings=40,
  )
  params = bertjax.init(config, 0)
  ln = params["encoder"]["layers"]["LayerNorm"]  # each block's output norm, (L, H)
  bias = np.asarray(ln["bias"]).copy()
  bias[:, dim] = beta_all
  bias[-1, dim] = beta_last
  params["encoder"]["layers"]["LayerNorm"] = {**ln, "bias": bias}
  return config, params


def _batches(config):
  rng = np.random.default_rng(0)
  out = []
  for t in (9, 12):
    ids = rng.integers(5, config.vocab_size, (3, t)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[2, t - 3 :] = 0
    out.append({"input_ids": ids, "attention_mask": mask})
  return out


def _states(params, config, batches):
  hs = []
  for b in batches:
    out = bertjax.forward(
      params, config, b["input_ids"], b["attention_mask"], output_hidden_states=True
    )
    real = b["attention_mask"] > 0
    hs.append(np.asarray(out.hidden_states[1:], np.float64)[:, real])
  return np.concatenate(hs, 1)  # (L, n, H)


def test_outlier_dimensions_find_the_planted_one_and_equal_numpy():
  config, params = _planted()
  batches = _batches(config)
  got = outliers.outlier_dimensions(params, config, batches)
  h = _states(params, config, batches)
  mean = h.mean(1)
  z = (mean - mean.mean(-1, keepdims=True)) / mean.std(-1, keepdims=True)
  np.testing.assert_allclose(got.mean, mean, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(got.z, z, rtol=1e-6, atol=1e-6)
  assert got.dims == (7,) and got.tokens == h.shape[1]
  assert got.is_outlier[:, 7].all()
  plain = bertjax.init(config, 0)
  assert 7 not in outliers.outlier_dimensions(plain, config, batches).dims


def test_massive_activations_equal_numpy():
  config, params = _planted(beta_last=5000.0, beta_all=0.0)
  batches = _batches(config)
  got = outliers.massive_activations(params, config, batches)
  mag = np.abs(_states(params, config, batches))
  np.testing.assert_allclose(got.max_abs, mag.max((1, 2)), rtol=1e-6)
  median = np.median(mag.reshape(len(mag), -1), 1)
  np.testing.assert_allclose(got.median_abs, median, rtol=1e-6)
  want = (mag > np.maximum(100, 1000 * median)[:, None, None]).sum((1, 2))
  np.testing.assert_array_equal(got.count, want)
  assert got.count[-1] == mag.shape[1] and not got.count[:-1].any()  # every token, last layer
  assert {d for d, *_ in got.where[-1]} == {7}


def test_disabling_a_dimension_zeroes_it_in_every_block_output():
  config, params = _planted()
  off = outliers.disable_dimensions(params, config, [7])
  h = _states(off, config, _batches(config))
  assert not h[..., 7].any()
  assert np.abs(h[..., 6]).max() > 0
  with pytest.raises(ValueError, match=r"dims must be in \[0, 32\)"):
    outliers.disable_dimensions(params, config, [32])


def test_mlm_loss_without_dimensions_is_the_loss_of_the_disabled_model():
  """Each condition's masked-LM loss is `mlm_head.mlm_loss` of `disable_dimensions`' model on
  the same predictions; disabling the planted outlier costs more than a random dimension."""
  from bertjax.training import mlm_head

  config, params = _planted()
  params = {**params, "mlm": bertjax.init(config, 1, heads=("mlm",))["mlm"]}
  batches = [{**b, "token_type_ids": np.zeros_like(b["input_ids"])} for b in _batches(config)]
  masked = mlm_head.mask_batches(batches, mask_id=4, special_ids=(0,), vocab_size=90, seed=3)
  got = outliers.mlm_loss_without_dimensions(params, config, masked, {"outliers": [7], "r": [6]})
  for name, dims in (("intact", []), ("outliers", [7]), ("r", [6])):
    want = mlm_head.mlm_loss(outliers.disable_dimensions(params, config, dims), config, masked)
    assert got["loss"][name] == pytest.approx(want["loss"], rel=1e-6), name
    assert got["accuracy"][name] == want["accuracy"]
  assert got["predictions"] == want["predictions"] > 0
  assert got["loss"]["outliers"] != got["loss"]["intact"]


def test_int8_error_by_layer_equals_its_definition():
  config, params = _planted(beta_all=3.0)
  batches = _batches(config)
  got = outliers.int8_error_by_layer(params, config, batches)
  h = _states(params, config, batches)
  hq = _states(params, config.replace(quantize="int8"), batches)
  want = np.sqrt(((hq - h) ** 2).sum((1, 2)) / (h**2).sum((1, 2)))
  np.testing.assert_allclose(got["relative_error"], want, rtol=1e-6)
  assert (0 < want).all() and (want < 0.2).all()
  np.testing.assert_allclose(got["max_abs"], np.abs(h).max((1, 2)), rtol=1e-6)


def test_report_section_matches_the_library_and_numpy():
  """The report's section 10: the census is `outlier_dimensions`'; the per-sentence attention
  on special tokens is recomputed from the maps in NumPy; the per-sentence massive counts add
  up to `massive_activations`'; the interval brackets the count found."""
  from bertjax.report import sections
  from bertjax.report.settings import ReportSettings

  config, params = _planted(beta_last=2e4, beta_all=10.0)  # massive in the last layer
  batches = _batches(config)
  for b in batches:
    b["input_ids"][:, 0] = 2  # [CLS]-like first token, and a special id inside
    b["input_ids"][:, 4] = 3
    b["token_type_ids"] = np.zeros_like(b["input_ids"])
  tok = type("Tok", (), {"cls_id": 2, "sep_id": 3})()
  got = sections.outlier_section(
    params, config, tok, list(enumerate(batches)), ReportSettings(bootstrap_resamples=50)
  )
  census = outliers.outlier_dimensions(params, config, batches)
  assert got["dims"] == [7] and np.allclose(got["z"], census.z)
  assert got["count_ci"][0] <= 1 <= got["count_ci"][1]
  massive = outliers.massive_activations(params, config, batches)
  assert massive.count[-1] > 0
  np.testing.assert_array_equal(np.asarray(got["massive"]["by_sentence"]).sum(0), massive.count)
  want = []
  for b in batches:
    a = np.asarray(
      bertjax.forward(
        params, config, b["input_ids"], b["attention_mask"], output_attentions=True
      ).attentions,
      np.float64,
    )
    for i in range(len(b["input_ids"])):
      real = b["attention_mask"][i] > 0
      cols = real & np.isin(b["input_ids"][i], [2, 3])
      want.append(a[:, i][:, :, real][..., cols].sum(-1).mean())
  np.testing.assert_allclose(got["special_mass"]["intact"], want, rtol=1e-6)
  assert np.mean(got["special_mass"]["disabled"]) != pytest.approx(np.mean(want))


def test_token_counts_against_the_tokenizer(tmp_path):

  tok = bertjax.Tokenizer.from_pretrained(bertjax.minilm_path())
  lines = ["the cat sat on the mat .", "", "the dog , the cat and the bird ."]
  path = tmp_path / "t.txt"
  path.write_text("\n".join(lines) + "\n")
  counts = outliers.token_frequencies(tok, [path, path])
  want = np.zeros(tok.vocab_size, np.int64)
  for line in lines:
    if line:
      for i in tok.tokenizer.encode(line).ids:
        want[i] += 2
  for special in tok.special_ids:
    want[special] = 0
  np.testing.assert_array_equal(counts, want)
  assert counts[tok.tokenizer.token_to_id("the")] == 2 * 5


def test_frequency_correlation_against_a_loop():
  rng = np.random.default_rng(0)
  layers, n, hidden = 4, 300, 10
  ids = rng.integers(5, 40, n)
  acts = rng.normal(size=(layers, n, 2))
  z = rng.normal(size=(layers, hidden))
  z[:, 3], z[:, 7] = [4, 5, 0, 0], [-3.5, 0, -4, -6]  # dimension 7 outlies downwards
  census = types.SimpleNamespace(z=z, is_outlier=np.abs(z) >= 3)
  counts = rng.integers(0, 1000, 50)
  got = outliers.frequency_correlation(acts, ids, counts, census, [3, 7])
  uniq = np.unique(ids)
  for j, (d, sign, flagged) in enumerate([(3, 1, [0, 1]), (7, -1, [0, 2, 3])]):
    per_type = [sign * acts[flagged][:, ids == t, j].mean() for t in uniq]
    want = sps.spearmanr(per_type, np.log1p(counts[uniq])).statistic
    assert got["rho"][j] == pytest.approx(want, abs=1e-12), d
  assert got["types"] == len(uniq)
  # The claim's one number, unbatched and over a leading axis of resamples (as bootstrapped).
  per_type, log_count = np.asarray(got["per_type"]), np.log1p(counts[uniq])
  mean = outliers.mean_frequency_correlation(per_type, log_count)
  assert mean == pytest.approx(np.mean(got["rho"]), abs=1e-12)
  idx = rng.integers(0, len(uniq), (3, len(uniq)))
  batched = outliers.mean_frequency_correlation(per_type[idx], log_count[idx])
  want = [
    np.mean([sps.spearmanr(p, c).statistic for p in per_type[i].T])
    for i, c in zip(idx, log_count[idx])
  ]
  np.testing.assert_allclose(batched, want, atol=1e-12)


def test_dimension_activations_are_the_hidden_states_of_real_ordinary_tokens():
  config, params = _planted()
  batches = _batches(config)
  special = [5, 6]
  acts, ids = outliers.dimension_activations(params, config, batches, [7, 3], special)
  h = _states(params, config, batches)  # (L, n real, H)
  real_ids = np.concatenate([b["input_ids"][b["attention_mask"] > 0] for b in batches])
  keep = ~np.isin(real_ids, special)
  assert keep.sum() < keep.size  # some specials were dropped
  np.testing.assert_array_equal(ids, real_ids[keep])
  np.testing.assert_allclose(acts, h[:, keep][..., [7, 3]], rtol=1e-6, atol=1e-6)
