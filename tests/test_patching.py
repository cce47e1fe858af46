"""Activation patching: sweeps against loops of single patched forwards and PyTorch hooks.

The (layer, head) and (layer, position) sweeps equal Python loops of single
`bertjax.forward(..., patch=...)` calls (1e-5), in both directions and with
padding; head patching on a random-weight `transformers.BertModel` equals the
same edit made with a PyTorch pre-hook on `attention.output.dense`; attribution
patching equals (clean - corrupted) . gradient taken by float64 central
differences; path patching equals its two explicit patched runs; the
normalisation is checked on hand examples.
"""

import functools
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
from bertjax.analysis.interventions import metrics as patching_metrics
from bertjax.analysis.interventions import patching

B, T = 3, 9


def _tiny(**overrides):
  config = bertjax.BertConfig.preset(
    "tiny",
    vocab_size=97,
    max_position_embeddings=32,
    num_hidden_layers=3,
    initializer_range=0.2,
    **overrides,
  )
  params = bertjax.init(config, 0, heads=("mlm",))
  # Random LayerNorm parameters, so no normalised state is trivially constant.
  leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  keys = jax.random.split(jax.random.key(7), len(leaves))
  leaves = [
    a + 0.2 * jax.random.normal(k, a.shape, a.dtype)
    if "LayerNorm" in jax.tree_util.keystr(path)
    else a
    for (path, a), k in zip(leaves, keys)
  ]
  return config, jax.tree_util.tree_unflatten(treedef, leaves)


def _pair():
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 97, (B, T)).astype(np.int32)
  corrupted = ids.copy()
  corrupted[:, 2] = rng.integers(5, 97, B)
  corrupted[:, 5] = rng.integers(5, 97, B)
  mask = np.ones((B, T), np.int32)
  mask[1, 6:] = 0  # right padding in one sequence
  targets = {
    "position": np.array([4, 3, 7]),
    "answer": np.array([11, 12, 13]),
    "distractor": np.array([20, 21, 22]),
  }
  return (
    {"input_ids": ids, "attention_mask": mask},
    {"input_ids": corrupted, "attention_mask": mask},
    targets,
  )


def _loop(
  params, config, clean, corrupted, metric, targets, site, over, direction="denoise", positions=None
):
  """The reference: one patched forward per (layer, head | position)."""
  dst = corrupted if direction == "denoise" else clean
  batch = {
    **{k: jnp.asarray(v) for k, v in dst.items()},
    **{k: jnp.asarray(v) for k, v in targets.items()},
  }
  n = config.num_attention_heads if over == "heads" else T
  values = np.zeros((config.depth, n))
  for layer in range(config.depth):
    for i in range(n):
      pick = {"heads": [i], "positions": positions} if over == "heads" else {"positions": [i]}
      out = patching.patched_forward(
        params, config, clean, corrupted, site=site, layers=[layer], direction=direction, **pick
      )
      values[layer, i] = float(metric(params, config, out, batch))
  return values


@pytest.mark.parametrize(
  "site,positions,direction",
  [
    ("head_out", None, "denoise"),
    ("v", [2, 4], "denoise"),
    ("head_out", None, "noise"),
    ("probs", None, "denoise"),
  ],
)
def test_head_sweep_equals_loop_of_patched_forwards(site, positions, direction):
  config, params = _tiny()
  clean, corrupted, targets = _pair()
  metric = patching_metrics.LogitDiff("mlm")
  got = patching.head_patching(
    params,
    config,
    clean,
    corrupted,
    metric,
    targets=targets,
    site=site,
    positions=positions,
    direction=direction,
    chunk_size=2,
  )
  want = _loop(
    params, config, clean, corrupted, metric, targets, site, "heads", direction, positions
  )
  assert got.values.shape == (config.depth, config.num_attention_heads)
  assert np.ptp(want) > 1e-3  # the patches do something
  np.testing.assert_allclose(got.values, want, atol=1e-5, rtol=0)
  # The unpatched runs' metrics: a weight-0 forward of each input. A "probs" sweep runs the
  # map path, the plain forward the fused attention (on the CPU a YNNPACK fusion of the
  # softmax and the values, bertjax/xla_options.py): float32 rounding apart, as above. The
  # other sites' sweeps run the fused path too; two programs still round differently, by a
  # few ulps of the logits the metric subtracts (1.1e-6 under the suite's cheap compile).
  for run, value in ((clean, got.clean), (corrupted, got.corrupted)):
    out = bertjax.forward(params, config, run["input_ids"], run["attention_mask"])
    batch = {**{k: jnp.asarray(v) for k, v in run.items()}, **targets}
    np.testing.assert_allclose(
      value, float(metric(params, config, out, batch)), atol=1e-5 if site == "probs" else 3e-6
    )


@pytest.mark.parametrize("site", ["out", "mid"])
def test_position_sweep_equals_loop_of_patched_forwards(site):
  config, params = _tiny()
  clean, corrupted, targets = _pair()
  metric = patching_metrics.AnswerLogProb("mlm")
  got = patching.position_patching(
    params, config, clean, corrupted, metric, targets=targets, site=site, chunk_size=3
  )
  want = _loop(params, config, clean, corrupted, metric, targets, site, "positions")
  assert got.values.shape == (config.depth, T) and np.ptp(want) > 1e-3
  np.testing.assert_allclose(got.values, want, atol=1e-5, rtol=0)


def test_normalisation_hand_examples():
  np.testing.assert_allclose(
    patching_metrics.normalize([[3.0, 1.0, 2.0, 5.0]], clean=3.0, corrupted=1.0),
    [[1.0, 0.0, 0.5, 2.0]],
  )
  # Noising keeps the same convention: 1 = the clean metric, 0 = the corrupted one.
  r = patching_metrics.PatchingResult(
    "out",
    ("layer", "position"),
    np.array([[-2.0, 0.0]]),
    clean=-2.0,
    corrupted=2.0,
    direction="noise",
  )
  np.testing.assert_allclose(r.normalized, [[1.0, 0.5]])
  with pytest.raises(ValueError, match="must differ"):
    patching_metrics.normalize([1.0], clean=0.5, corrupted=0.5)
  # On the model: a probe of the [CLS] state is fully restored by patching the last block's
  # output at position 0 and untouched by patching it anywhere else.
  config, params = _tiny()
  clean, corrupted, _ = _pair()
  rng = np.random.default_rng(3)
  probe = patching_metrics.ProbeLogitDiff(
    rng.normal(size=(config.hidden_size, 3)), rng.normal(size=3)
  )
  labels = {"answer": np.array([0, 1, 2]), "distractor": np.array([1, 2, 0])}
  got = patching.position_patching(params, config, clean, corrupted, probe, targets=labels)
  norm = got.normalized
  np.testing.assert_allclose(norm[-1, 0], 1.0, atol=1e-5)
  np.testing.assert_allclose(norm[-1, 1:], 0.0, atol=1e-5)
  assert abs(got.clean - got.corrupted) > 1e-3


def test_attribution_equals_finite_difference_directional_derivative():
  config, params = _tiny()
  clean, corrupted, targets = _pair()
  metric = patching_metrics.LogitDiff("mlm")
  with jax.enable_x64(True):
    c64 = config.replace(dtype="float64")
    p64 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), params)
    approx = patching.attribution_patching(p64, c64, clean, corrupted, metric, targets=targets)
    approx_pos = patching.attribution_patching(
      p64, c64, clean, corrupted, metric, targets=targets, site="mid", over="positions"
    )
    clean_ho = bertjax.forward(
      p64, c64, clean["input_ids"], clean["attention_mask"], capture=("head_out", "mid")
    ).cache
    batch = {
      **{k: jnp.asarray(v) for k, v in corrupted.items()},
      **{k: jnp.asarray(v) for k, v in targets.items()},
    }

    @functools.partial(jax.jit, static_argnums=2)
    def f(site_value, w, site):
      patch = {site: (site_value, w)}
      out = bertjax.forward(
        p64, c64, corrupted["input_ids"], corrupted["attention_mask"], patch=patch
      )
      return metric(p64, c64, out, batch)

    eps = 1e-5
    for layer, head in [(0, 1), (1, 3), (2, 0)]:
      w = patching.patch_weight(c64, "head_out", T, layers=[layer], heads=[head]).astype(np.float64)
      fd = (
        float(f(clean_ho["head_out"], eps * w, "head_out"))
        - float(f(clean_ho["head_out"], -eps * w, "head_out"))
      ) / (2 * eps)
      got = approx.values[layer, head] - approx.corrupted
      assert abs(fd) > 1e-6
      np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-10)
    for layer, position in [(0, 2), (2, 4)]:
      w = patching.patch_weight(c64, "mid", T, layers=[layer], positions=[position]).astype(
        np.float64
      )
      fd = (
        float(f(clean_ho["mid"], eps * w, "mid")) - float(f(clean_ho["mid"], -eps * w, "mid"))
      ) / (2 * eps)
      np.testing.assert_allclose(
        approx_pos.values[layer, position] - approx_pos.corrupted, fd, rtol=1e-6, atol=1e-10
      )
  # Against the exact sweep it is an approximation that ranks heads alike here.
  exact = patching.head_patching(
    params, config, clean, corrupted, metric, targets=targets, chunk_size=2
  )
  agree = patching_metrics.agreement(
    exact, patching.attribution_patching(params, config, clean, corrupted, metric, targets=targets)
  )
  assert agree["n"] == config.depth * config.num_attention_heads and agree["pearson"] > 0.5


def test_path_patching_equals_its_two_patched_runs():
  config, params = _tiny()
  clean, corrupted, targets = _pair()
  metric = patching_metrics.LogitDiff("mlm")
  receivers = [(2, 1), (2, 3)]
  got = patching.path_patching(
    params,
    config,
    clean,
    corrupted,
    metric,
    targets=targets,
    receivers=receivers,
    receiver_sites=("k", "v"),
  )
  assert np.isnan(got.values[2]).all() and np.isfinite(got.values[:2]).all()
  runs = {
    name: bertjax.forward(
      params, config, b["input_ids"], b["attention_mask"], capture=("head_out",)
    ).cache["head_out"]
    for name, b in (("clean", clean), ("corrupted", corrupted))
  }
  batch = {
    **{k: jnp.asarray(v) for k, v in corrupted.items()},
    **{k: jnp.asarray(v) for k, v in targets.items()},
  }
  w_recv = patching.patch_weight(config, "v", T, heads=receivers)
  for layer, head in [(0, 2), (1, 0)]:
    sender = patching.patch_weight(config, "head_out", T, layers=[layer], heads=[head])
    frozen = sender * runs["clean"] + (1 - sender) * runs["corrupted"]
    step = bertjax.forward(
      params,
      config,
      corrupted["input_ids"],
      corrupted["attention_mask"],
      patch={"head_out": (frozen, 1.0)},
      capture=("k", "v"),
    ).cache
    out = bertjax.forward(
      params,
      config,
      corrupted["input_ids"],
      corrupted["attention_mask"],
      patch={"k": (step["k"], w_recv), "v": (step["v"], w_recv)},
    )
    np.testing.assert_allclose(
      got.values[layer, head], float(metric(params, config, out, batch)), atol=1e-5
    )
  # With no receiver input touched by the sender the path effect is nil: the corrupted metric.
  assert np.ptp(got.values[:2]) > 0


def test_patch_weight_selects_layers_heads_positions():
  config, _ = _tiny()
  w = patching.patch_weight(config, "head_out", T, heads=[(0, 1), (2, 3)], positions=[4])
  assert w.shape == (3, 1, T, 4, 1)
  assert set(zip(*np.nonzero(w[:, 0, :, :, 0]))) == {(0, 4, 1), (2, 4, 3)}
  w = patching.patch_weight(config, "probs", T, layers=[1], heads=[2], positions=[0, 5])
  assert w.shape == (3, 1, 4, T, 1) and w.sum() == 2 and w[1, 0, 2, 5, 0] == 1
  assert patching.patch_weight(config, "out", T, layers=[2]).shape == (3, 1, 1, 1)
  assert patching.patch_weight(config, "embeddings", T, positions=[3]).shape == (1, T, 1)


def test_bad_input_errors_name_the_value():
  config, params = _tiny()
  clean, corrupted, targets = _pair()
  metric = patching_metrics.LogitDiff("mlm")
  with pytest.raises(ValueError, match="'attn_out' is not one head_patching"):
    patching.head_patching(
      params, config, clean, corrupted, metric, targets=targets, site="attn_out"
    )
  short = {k: v[:, :5] for k, v in corrupted.items()}
  with pytest.raises(ValueError, match=r"must equal corrupted shape \(3, 5\)"):
    patching.head_patching(params, config, clean, short, metric, targets=targets)
  with pytest.raises(ValueError, match=r"heads \[7\] are outside \[0, 4\)"):
    patching.patch_weight(config, "head_out", T, heads=[7])
  with pytest.raises(ValueError, match="no head axis"):
    patching.patch_weight(config, "mid", T, heads=[0])
  with pytest.raises(ValueError, match="direction='sideways'"):
    patching.position_patching(
      params, config, clean, corrupted, metric, targets=targets, direction="sideways"
    )
  with pytest.raises(ValueError, match=r"targets\['answer'\] shape \(2,\)"):
    patching.head_patching(
      params, config, clean, corrupted, metric, targets={**targets, "answer": np.array([1, 2])}
    )
  with pytest.raises(ValueError, match="include layer 0"):
    patching.path_patching(
      params, config, clean, corrupted, metric, targets=targets, receivers=[(0, 1)]
    )
  with pytest.raises(ValueError, match="'position'"):
    patching.head_patching(
      params,
      config,
      clean,
      corrupted,
      metric,
      targets={"answer": targets["answer"], "distractor": targets["distractor"]},
    )


def test_targets_and_metrics_are_checked_before_any_program_runs():
  """Inside a program an out-of-range index is clamped, wrapped or read as NaN, so each bad
  target must be refused by name first; so must a metric that is not one number."""
  config, params = _tiny()
  clean, corrupted, targets = _pair()
  metric = patching_metrics.LogitDiff("mlm")
  bad = [
    ({"position": np.array([4, 3, 99])}, r"targets\['position'\] = 99 at row 2 .* \[0, 9\)"),
    ({"position": np.array([4, -1, 7])}, r"targets\['position'\] = -1 at row 1"),
    ({"position": np.array([4, 7, 7])}, r"= 7 at row 1 is a padding position"),
    ({"answer": np.array([11, 10**7, 13])}, r"targets\['answer'\] = 10000000 .* \[0, 97\)"),
    ({"distractor": np.array([20, 21, 97])}, r"targets\['distractor'\] = 97"),
    ({"position": np.array([4.0, 3.0, 7.0])}, "must be \\(batch,\\) integers"),
  ]
  for change, message in bad:
    for sweep in (patching.head_patching, patching.attribution_patching):
      with pytest.raises(ValueError, match=message):
        sweep(params, config, clean, corrupted, metric, targets={**targets, **change})
    with pytest.raises(ValueError, match=message):
      patching.path_patching(
        params, config, clean, corrupted, metric, targets={**targets, **change}, receivers=[(2, 1)]
      )
  with pytest.raises(ValueError, match="AnswerLogProb needs targets\\['answer'\\]"):
    patching.position_patching(
      params,
      config,
      clean,
      corrupted,
      patching_metrics.AnswerLogProb("mlm"),
      targets={"position": targets["position"]},
    )
  probe = patching_metrics.ProbeLogitDiff(np.ones((config.hidden_size, 2)), np.zeros(2))
  with pytest.raises(ValueError, match=r"targets\['answer'\] = 5 at row 0 .* class of the probe"):
    patching.head_patching(
      params,
      config,
      clean,
      corrupted,
      probe,
      targets={"answer": np.array([5, 1, 1]), "distractor": np.zeros(3, int)},
    )

  def vector(params, config, out, batch):  # per-row values: not a metric
    return out.last_hidden_state[:, 0, 0]

  with pytest.raises(ValueError, match=r"returned shape \(3,\); a metric returns one scalar"):
    patching.head_patching(params, config, clean, corrupted, vector)
  # Arguments that used to be ignored or fail obscurely.
  with pytest.raises(ValueError, match=r"receivers=\[2, 1\] must be a sequence of"):
    patching.path_patching(
      params, config, clean, corrupted, metric, targets=targets, receivers=(2, 1)
    )
  with pytest.raises(ValueError, match="over='positions' estimates every position"):
    patching.attribution_patching(
      params, config, clean, corrupted, metric, targets=targets, over="positions", positions=[1]
    )
  with pytest.raises(ValueError, match=r"heads=\[\] selects nothing"):
    patching.patch_weight(config, "head_out", T, heads=[])
  # The checks pass what they should: the sweep runs with good targets.
  patching.head_patching(params, config, clean, corrupted, metric, targets=targets)


def test_pairs_with_different_padding_are_refused():
  """A site captured at a padded source position is no token's activation: every function
  that patches one run's sites into another refuses a pair whose attention masks differ, and
  names the first differing row and positions (it used to patch the padding's values in)."""
  config, params = _tiny()
  clean, corrupted, targets = _pair()
  corrupted = dict(corrupted, attention_mask=corrupted["attention_mask"].copy())
  corrupted["attention_mask"][2, 7:] = 0  # row 2 is two tokens shorter in the corrupted run
  corrupted["input_ids"] = np.where(corrupted["attention_mask"] > 0, corrupted["input_ids"], 0)
  metric = patching_metrics.LogitDiff("mlm")
  message = (
    r"masks differ in 1 row\(s\), first row 2 at positions \[7, 8\] \(at position 7 "
    r"clean mask 1, corrupted 0\)"
  )
  runs = [
    lambda: patching.head_patching(params, config, clean, corrupted, metric, targets=targets),
    lambda: patching.position_patching(params, config, clean, corrupted, metric, targets=targets),
    lambda: patching.attribution_patching(
      params, config, clean, corrupted, metric, targets=targets
    ),
    lambda: patching.path_patching(
      params, config, clean, corrupted, metric, targets=targets, receivers=[(2, 1)]
    ),
    lambda: patching.patched_forward(
      params, config, clean, corrupted, site="head_out", layers=[1], direction="noise"
    ),
  ]
  for run in runs:
    with pytest.raises(ValueError, match=message):
      run()
  # Both directions and any row: the first differing row is named.
  corrupted["attention_mask"][0, 8] = 0
  with pytest.raises(ValueError, match=r"2 row\(s\), first row 0 at positions \[8\]"):
    patching.head_patching(
      params, config, clean, corrupted, metric, targets=targets, direction="noise"
    )


def test_agreement_spearman_averages_tied_ranks():
  """`agreement`'s Spearman is scipy's (ties share their average rank), whatever the order."""
  scipy_stats = pytest.importorskip("scipy.stats")

  def result(values):
    values = np.asarray(values, float).reshape(1, -1)
    return patching_metrics.PatchingResult(
      "head_out", ("layer", "head"), values, clean=1.0, corrupted=0.0
    )

  exact = [0.0, 0.0, 0.0, 1.0, 0.5, 0.5]
  for approx in ([3e-3, 2e-3, 1e-3, 1.0, 0.4, 0.6], [1e-3, 2e-3, 3e-3, 1.0, 0.6, 0.4]):
    got = patching_metrics.agreement(result(exact), result(approx))
    want = scipy_stats.spearmanr(exact, approx).statistic
    np.testing.assert_allclose(got["spearman"], want, rtol=1e-12)
    np.testing.assert_allclose(
      got["pearson"], scipy_stats.pearsonr(exact, approx).statistic, rtol=1e-12
    )
  assert np.isnan(patching_metrics.agreement(result([1.0, 1.0]), result([0.0, 1.0]))["spearman"])


def _hf_model(tmp_path):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  torch.manual_seed(0)
  hf_config = transformers.BertConfig(
    vocab_size=97,
    hidden_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=32,
    attn_implementation="eager",
  )
  model = transformers.BertModel(hf_config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "LayerNorm.weight" in name:
        p.copy_(1 + 0.3 * torch.randn(p.shape))
      elif name.endswith("bias"):
        p.copy_(0.1 * torch.randn(p.shape))
  model.save_pretrained(tmp_path)
  return model


@pytest.mark.hf
def test_head_patching_equals_pytorch_pre_hook_edit(tmp_path):
  import torch

  model = _hf_model(tmp_path)
  config, params = bertjax.from_hf(tmp_path)
  clean, corrupted, _ = _pair()
  rng = np.random.default_rng(5)
  weight, bias = rng.normal(size=(32, 3)), rng.normal(size=3)
  labels = {"answer": np.array([0, 1, 2]), "distractor": np.array([2, 0, 1])}
  probe = patching_metrics.ProbeLogitDiff(weight, bias, pooling="mean")
  got = patching.head_patching(params, config, clean, corrupted, probe, targets=labels)

  def run(batch, hooks=()):
    handles = [
      model.encoder.layer[layer].attention.output.dense.register_forward_pre_hook(fn)
      for layer, fn in hooks
    ]
    try:
      with torch.no_grad():
        out = model(
          input_ids=torch.tensor(batch["input_ids"]).long(),
          attention_mask=torch.tensor(batch["attention_mask"]).long(),
        )
    finally:
      for h in handles:
        h.remove()
    h = out.last_hidden_state.numpy().astype(np.float64)
    m = batch["attention_mask"][..., None].astype(np.float64)
    logits = ((h * m).sum(1) / m.sum(1)) @ weight + bias
    b = np.arange(B)
    return float(np.mean(logits[b, labels["answer"]] - logits[b, labels["distractor"]]))

  # The clean run's context (the output dense's input) of every layer.
  clean_ctx = {}

  def keep(layer):
    return lambda module, args: clean_ctx.__setitem__(layer, args[0].clone())

  run(clean, [(layer, keep(layer)) for layer in range(3)])

  def replace(layer, head):
    d = 32 // 4

    def hook(module, args):
      x = args[0].clone()
      x[..., head * d : (head + 1) * d] = clean_ctx[layer][..., head * d : (head + 1) * d]
      return (x,)

    return hook

  np.testing.assert_allclose(got.clean, run(clean), atol=1e-5)
  np.testing.assert_allclose(got.corrupted, run(corrupted), atol=1e-5)
  for layer, head in [(0, 0), (1, 2), (2, 3), (2, 1)]:
    want = run(corrupted, [(layer, replace(layer, head))])
    np.testing.assert_allclose(got.values[layer, head], want, atol=1e-5)
  assert np.ptp(got.values) > 1e-3


TL_PYTHON = pathlib.Path(__file__).resolve().parents[1] / ".venv" / "tl" / "bin" / "python"
BRIDGE_PYTHON = TL_PYTHON.parents[2] / "tl4" / "bin" / "python"


@pytest.mark.slow
@pytest.mark.hf
@pytest.mark.skipif(
  not TL_PYTHON.exists(),
  reason=(
    f"the TransformerLens side environment {TL_PYTHON} is absent; set it up with "
    "python3 -m venv .venv/tl && .venv/tl/bin/pip install torch==2.13.0 transformer-lens==3.9.0"
  ),
)
def test_transformer_lens_benchmark_smoke(tmp_path):
  repo = TL_PYTHON.parents[3]
  env = dict(os.environ, JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
  proc = subprocess.run(
    [sys.executable, str(repo / "benchmarks" / "bench_tl.py"), "--smoke", "--out", str(tmp_path)],
    cwd=repo,
    env=env,
    capture_output=True,
    text=True,
    timeout=900,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  doc = json.loads((tmp_path / "bench_tl_smoke.json").read_text())
  r = doc["models"]["smoke"]
  # Both sides computed the same numbers on the same weights.
  for key, diff in r["compare"]["max_abs_diff"].items():
    assert diff < 1e-5, (key, diff)
  assert r["transformer_lens"]["info"]["missing_keys"] == []
  assert set(r["compare"]["speedup"]) == {
    "forward",
    "attention_maps",
    "ablation_sweep",
    "patching_sweep",
    "attribution",
  }
  assert doc["machine"]["cpu_count"] >= 1 and "isa" in doc["machine"]
  page = (tmp_path / "bench_tl_smoke.md").read_text()
  assert page.startswith("# bertjax vs TransformerLens")
  if BRIDGE_PYTHON.exists():  # TransformerLens 4.3's TransformerBridge: the same numbers too
    assert doc["bridge_info"]["transformer_lens"].startswith("4.")
    assert r["transformer_bridge"]["info"]["missing_keys"] == []
    for key, diff in r["compare_bridge"]["max_abs_diff"].items():
      assert diff < 1e-5, ("bridge", key, diff)
    assert "| bertjax | TransformerBridge (docs / lean) |" in page
