"""The GPU benchmark scripts' CPU smoke modes, so that they keep running between GPU sessions.

Each runs as its users run it (a subprocess, `--smoke`, interpret-mode kernels) and must
write results whose numbers agree with each other.
"""

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pyrunner
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
ENV = dict(os.environ, JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")


def _run(script, *args):
  proc = pyrunner.run(
    [sys.executable, str(REPO / "benchmarks" / script), *args],
    cwd=REPO,
    env=ENV,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  return proc.stdout


@pytest.mark.slow
def test_gpu_ablation_benchmark_smoke(tmp_path):
  _run("bench_ablation_gpu.py", "--smoke", "--out", str(tmp_path), "--scan-unroll", "2")
  doc = json.loads((tmp_path / "ablation_gpu_cpu_unroll2_smoke.json").read_text())
  heads = np.asarray(doc["head_ablation"])
  assert heads.shape == (doc["layers"], doc["heads"]) and doc["attention_impl"] == "pallas"
  # The metric is a cosine to the unablated model: 1 at baseline, <= 1 under ablation.
  assert abs(doc["baseline"] - 1) < 1e-6 and np.all(heads <= 1 + 1e-6)
  assert doc["max_abs_diff_vs_loop"] < 1e-5
  assert doc["prefix_chunk12"]["vs_forward"] > 0 and doc["importance"]["ratio"] > 0


@pytest.mark.slow
def test_mfu_benchmark_smoke(tmp_path):
  """The XLA variant's options (test_gpu_suite_smoke runs the fused kernel's variants)."""
  out = _run(
    "bench_train_step.py", "--mfu", "--smoke", "--variants", "xla:unsafe_rbg:4:nodrop:unroll2"
  )
  doc = json.loads(out[out.index("{") :])
  rows = doc["variants"]
  assert [r["variant"] for r in rows] == ["xla:unsafe_rbg:4:nodrop:unroll2"]
  assert rows[0]["scan_unroll"] == 2 and rows[0]["hidden_dropout"] == 0.0
  for r in rows:
    assert 0 < r["mfu"] < 1
    np.testing.assert_allclose(r["model_tflops"], r["model_tflop_per_step"] / r["median_step_s"])


@pytest.mark.slow
def test_forward_benchmark_smoke():
  out = _run("bench_forward.py", "--smoke")
  doc = json.loads(out[out.index("{") :])
  assert doc["machine"]["cpu"] and doc["machine"]["torch_threads"] >= 1
  assert [r["model"] for r in doc["rows"]] == ["all-MiniLM-L6-v2", "bert-base (random)"]
  peak = doc["matmul_peak_float32"]
  for r in doc["rows"]:
    assert r["max_abs_diff_vs_torch"] < 1e-4  # the same function is being timed
    for impl, key in (("bertjax", "jax_gflops"), ("torch_sdpa", "torch_gflops")):
      np.testing.assert_allclose(r[impl]["gflops"], r["gflop"] / r[impl]["median_s"])
      # The share of the same run's matmul peak, measured with the same framework; a
      # forward pass (matmuls and more) cannot run at several times the matmul peak.
      np.testing.assert_allclose(r[impl]["fraction_of_peak"], r[impl]["gflops"] / peak[key])
      assert 0 < r[impl]["fraction_of_peak"] < 2


@pytest.mark.slow
def test_families_benchmark_smoke(tmp_path):
  """bertjax, KerasHub (side interpreter, when set up) and PyTorch side by side, tiny shapes."""
  _run("bench_families.py", "--smoke", "--out", str(tmp_path))
  doc = json.loads((tmp_path / "bench_families_smoke.json").read_text())
  assert doc["smoke"] and doc["rounds"] == 1 and doc["machine"]["cpus"] >= 1
  assert "isa_flags" in doc["machine"] and doc["machine"]["torch_threads"] >= 1
  assert [(r["model"], r["batch"]) for r in doc["rows"]] == [
    ("bert-base", 2),
    ("bert-base", 4),
    ("roberta-base", 2),
    ("roberta-base", 4),
  ]
  keras = doc["keras_hub_skipped"] is None  # else the reason names the missing interpreter
  assert keras or ".venv/keras" in doc["keras_hub_skipped"] or "worker" in doc["keras_hub_skipped"]
  for r in doc["rows"]:
    assert r["max_abs_diff_bertjax_vs_torch"] < 1e-4  # the same weights, the same numbers
    impls = ("bertjax", "torch_sdpa") + (("keras_hub",) if keras else ())
    for impl in impls:
      assert r[impl]["median_s"] > 0 and len(r[impl]["times_s"]) == 1
    assert r["bertjax"]["params"] == r["torch_sdpa"]["params"]
    if keras and r["model"] == "bert-base":
      assert r["keras_hub"]["params"] == r["bertjax"]["params"]  # same sizes, same count
  assert (tmp_path / "bench_families_smoke.md").read_text().count("| bert-base |") == 2


def test_attribution_parts_benchmark_smoke(tmp_path):
  _run("bench_attribution_parts.py", "--smoke", "--out", str(tmp_path))
  doc = json.loads((tmp_path / "attribution_parts_cpu_smoke.json").read_text())
  parts = doc["shapes"]["smoke"]
  assert doc["machine"]["cpu"] and doc["rounds"] == 2
  for name, r in parts.items():
    assert len(r["times_ms"]) == 2 and r["median_ms"] > 0, name
    assert r["over_forward"] == pytest.approx(
      np.median(np.divide(r["times_ms"], parts["forward"]["times_ms"])), rel=1e-9
    ), name
  # The whole call runs the clean run and more: it costs more than the clean run alone.
  assert parts["attribution_patching"]["median_ms"] > parts["clean_run"]["median_ms"]
  page = (tmp_path / "attribution_parts_cpu_smoke.md").read_text()
  assert "| one block: backward (activation gradients) |" in page


@pytest.mark.slow
def test_modern_families_benchmark_smoke():
  out = _run("bench_modern.py", "--smoke")
  doc = json.loads(out[out.index("{") :])
  assert doc["smoke"] and doc["machine"]["cpu"]
  rows = {(r["model"], r["seq"]): r for r in doc["rows"]}
  from bertjax.model.families import FAMILIES

  families = set(FAMILIES)
  assert {r["family"] for r in rows.values()} == families  # every family bertjax has
  assert len(rows) == len(families) + 1  # each model once, ModernBERT's long case beside it
  for r in rows.values():
    assert r["max_abs_diff_bertjax_vs_torch"] < 1e-4  # the same function is being timed
    np.testing.assert_allclose(
      r["bertjax_speedup_vs_torch_sdpa"], r["torch_sdpa"]["median_s"] / r["bertjax"]["median_s"]
    )
  longest = rows[("modernbert-base", 40)]
  assert longest["windows"] == [16] and "bertjax_global" in longest


def test_packing_benchmark_smoke():
  out = _run("bench_packing.py", "--smoke")
  doc = json.loads(out[out.index("{") :])
  assert doc["smoke"] and doc["sentences"] == 32 and doc["machine"]["cpu"]
  assert [r["model"] for r in doc["rows"]] == ["all-MiniLM-L6-v2", "modernbert-base"]
  for r in doc["rows"]:
    assert r["max_abs_diff_real_tokens"] < 1e-4  # the same function is being timed
    assert r["real_tokens"] <= r["packed_tokens"] < r["padded_tokens"]
    np.testing.assert_allclose(
      r["packed_speedup"], r["padded"]["median_s"] / r["packed"]["median_s"]
    )


def test_sae_benchmark_smoke():
  out = _run("bench_sae.py", "--smoke")
  doc = json.loads(out[out.index("{") :])
  assert doc["smoke"] and doc["latents"] == 16 * doc["d_model"] and doc["machine"]["cpu"]
  rows = doc["rows"]
  # Every latent dead before the step; those that fire on the batch revive (as counted by
  # the released code, this batch first), so the AuxK branch runs on the others.
  assert rows["sae_step"]["dead_share"] == 0 and 0 < rows["sae_step_all_dead"]["dead_share"] < 1
  np.testing.assert_allclose(
    doc["ratio_step_vs_forward"], rows["sae_step"]["median_s"] / rows["forward"]["median_s"]
  )


def test_transcoder_benchmark_smoke(tmp_path):
  out = _run("bench_transcoders.py", "--smoke")
  doc = json.loads(out[out.index("{") :])
  # The page again from the result file: the floor of every kind, against its own forward.
  (tmp_path / "r.json").write_text(json.dumps(doc))
  _run("bench_transcoders.py", "--page-from", str(tmp_path / "r.json"), "--out", str(tmp_path))
  page = (tmp_path / "bench_transcoders.md").read_text()
  assert page.count(": floor ") == 3 and "the step is" in page
  assert doc["smoke"] and doc["machine"]["cpu"]
  row = doc["models"]["tiny"]
  assert row["latents"] == 8 * 32 and row["tokens"] == 2 * 16
  assert row["forward"] == row["PLT top-k: forward"]
  for kind in ("PLT top-k", "PLT JumpReLU", "CLT top-k"):
    # Each kind is timed beside a forward pass in rounds of its own, and compared with it.
    for call in (kind, f"{kind}: forward"):
      assert row[call]["flops"] > 0
      np.testing.assert_allclose(
        row[call]["over_forward"], row[call]["median_s"] / row[f"{kind}: forward"]["median_s"]
      )
  # A CLT's layer 0 writes to both layers: its decoder does more than a PLT's.
  assert row["CLT top-k"]["flops"] > row["PLT top-k"]["flops"]
  # The floor's parts: the encoder's two products per layer (2 x 2 x tokens x d x m FLOPs
  # each layer), a top-k where the kind keeps k, and the Adam update of every kind.
  for kind in ("PLT top-k", "PLT JumpReLU", "CLT top-k"):
    assert row[f"{kind}: encoder products"]["flops"] == 2 * 2 * 32 * 32 * 256 * 2
    assert row[f"{kind}: Adam update"]["median_s"] > 0
    assert (f"{kind}: top-k" in row) == kind.endswith("top-k")


@pytest.mark.slow
def test_gpu_suite_smoke(tmp_path):
  """benchmarks/gpu_suite.sh, the one device call of the modern kernels, runs every step."""
  proc = subprocess.run(
    ["bash", str(REPO / "benchmarks" / "gpu_suite.sh"), "--smoke"],
    cwd=REPO,
    env={**ENV, "OUT": str(tmp_path), "PYTHON": sys.executable},
    capture_output=True,
    text=True,
    timeout=900,
    check=False,
  )
  assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
  for step in (
    "peak",
    "kernel_tests",
    "attention",
    "attention_window",
    "attention_deberta",
    "mfu_bert_base",
    "mfu_modernbert_base",
    "edges",
  ):
    assert f"== {step}" in proc.stdout and (tmp_path / f"{step}.log").is_file()
  peak = json.loads((tmp_path / "peak_cpu_smoke.json").read_text())
  assert peak["ok"] and peak["datasheet_tflops"] is None and peak["matmul_peak_tflops"] > 0
  edges = json.loads((tmp_path / "edges_cpu_smoke.json").read_text())
  assert {"eap_passes", "eap_ig_5_passes"} <= set(edges["results"]) and edges["gflop"]["scores"]
  for step in ("mfu_bert_base", "mfu_modernbert_base"):  # the fused kernel's MFU variants
    log = (tmp_path / f"{step}.log").read_text()
    doc = json.loads(log[log.index("{") :])
    assert all(0 < r["mfu"] < 1 for r in doc["variants"]) and len(doc["variants"]) == 2, step
  window = json.loads(next(tmp_path.glob("attention_window128_*_smoke.json")).read_text())
  assert window["window"] == 128 and {r["impl"] for r in window["rows"]} >= {"bertjax_pallas"}
  deberta = json.loads(next(tmp_path.glob("attention_deberta_*_smoke.json")).read_text())
  assert deberta["deberta"] and all("ms" in r for r in deberta["rows"])


@pytest.mark.parametrize(
  ("option", "said"), [("--rounds=0", "0 must be >= 1"), ("--warmup=x", "'x' is not an integer")]
)
def test_a_bad_count_is_a_usage_error(option, said):
  """benchmarks/common.py's options refuse a count they cannot time, before any work."""
  proc = pyrunner.run(
    [sys.executable, str(REPO / "benchmarks" / "bench_sae.py"), option],
    env=ENV,
    capture_output=True,
    text=True,
    timeout=120,
    check=False,
  )
  assert proc.returncode == 2 and said in proc.stderr and "Traceback" not in proc.stderr


def test_edges_benchmark_counts_the_products_xla_counts(monkeypatch):
  """`bench_edges.product_flops` (the floor its table prints) against XLA's own count of the
  lowered programs at BERT-base 8 x 128: an unrolled forward pass and EAP's clean run with
  its gradient (`edges._gradients`). XLA also counts the elementwise work and the MLM head,
  so its count may only be a little higher."""
  monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
  # `common` is also experiments/common.py, which a test of this worker may have imported:
  # the benchmarks' own is imported afresh here, and the other one put back afterwards.
  for name in ("common", "bench_edges"):
    monkeypatch.delitem(sys.modules, name, raising=False)
  import bench_edges
  from common import make_inputs

  import bertjax
  from bertjax.analysis.interventions import edges, metrics
  from bertjax.model.forward import embed, run_layers

  config = bertjax.BertConfig(vocab_size=30522, **bench_edges.BERT_BASE)
  params = jax.eval_shape(lambda: bertjax.init(config, 0, heads=("mlm",)))
  inputs = make_inputs(8, 128)
  batch = {
    "input_ids": jnp.asarray(inputs["clean"]),
    "attention_mask": jnp.asarray(inputs["mask"]),
    "token_type_ids": jnp.zeros((8, 128), jnp.int32),
  }
  batch.update({k: jnp.asarray(inputs[k]) for k in ("position", "answer", "distractor")})
  metric = metrics.LogitDiff("mlm")

  def forward(p, b):
    x = embed(p, config, b["input_ids"], b["token_type_ids"])
    return run_layers(p, config, x, b["attention_mask"], unroll=True).last

  def gradient_pass(p, b):
    x = embed(p, config, b["input_ids"], b["token_type_ids"])
    rows = metrics.metric_rows(metric, config, b)
    return edges._gradients(p, config, b, metric, x, rows)[:2]

  ours = bench_edges.product_flops(config, 8, 128)
  for name, fn in (("forward", forward), ("gradient_pass", gradient_pass)):
    cost = jax.jit(fn).lower(params, batch).cost_analysis()
    xla = (cost if isinstance(cost, dict) else cost[0])["flops"]
    assert 1.0 <= xla / ours[name] < 1.01, (name, xla, ours[name])
  # The floors the benchmark's docstring and the manual quote.
  assert round(ours["eap"] / ours["forward"], 2) == 3.41
  assert round(ours["eap_ig_5"] / ours["forward"], 2) == 10.87


def test_a_device_far_below_its_datasheet_stops_the_gpu_suite(monkeypatch):
  """`bench_attention.peak_verdict`, the check `gpu_suite.sh` runs first: at least half the
  datasheet's dense bf16 figure passes (an H100's measured 748 of 989 TFLOP/s), below it the
  suite stops with a message naming the figures (10.5 on an H200 with autotuning off), and a
  device without a datasheet figure is not checked."""
  monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
  for name in ("common", "bench_attention"):
    monkeypatch.delitem(sys.modules, name, raising=False)
  import bench_attention

  ok, line = bench_attention.peak_verdict("NVIDIA H100 80GB HBM3", 748.4)
  assert ok and "76% of its datasheet 989.4" in line
  ok, line = bench_attention.peak_verdict("NVIDIA H200", 10.5)
  assert not ok and "10.5 TFLOP/s, 1% of its datasheet 989.4" in line and "below half" in line
  assert bench_attention.peak_verdict("cpu", 0.04) == (
    True,
    "cpu: bf16 matmul peak 0.04 TFLOP/s; no datasheet figure, not checked",
  )


def test_edges_benchmark_floor_is_the_passes_plus_the_score_products(monkeypatch):
  """Issue 61's floor in `bench_edges`' table: the method's own passes as timed (a ratio to
  the same rounds' forward pass) plus its score products at the forward pass's FLOP rate;
  the verdict reads the method's ratio over that floor against 1.2."""
  monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
  for name in ("common", "bench_edges"):
    monkeypatch.delitem(sys.modules, name, raising=False)
  import bench_edges

  timed = lambda ratio: {"median_ms": 100.0 * ratio, "over_forward": ratio}
  report = {
    "machine": {"cpu": "a CPU", "cpus": 2, "isa_flags": ["avx2"]},
    "jax": "0",
    "shape": "BERT-base",
    "batch": 8,
    "seq": 128,
    "rounds": 3,
    "results": {
      "forward": timed(1.0),
      "eap": timed(5.0),
      "eap_passes": timed(4.0),
      "eap_ig_5": timed(13.0),
      "eap_ig_5_passes": timed(10.0),
    },
    "gflop": {"forward": 200.0, "scores": 40.0, "eap": 600.0, "eap_ig_5": 2000.0},
  }
  assert bench_edges.floor(report, "eap") == {
    "passes_over_forward": 4.0,
    "scores_over_forward": 0.2,
    "over_forward": 4.2,
  }
  rows = {line.split(" |")[0]: line for line in bench_edges.markdown(report).splitlines()}
  assert "| 4.20x | **1.19x** (<= 1.2x: met) |" in rows["| EAP, every edge"]
  assert "| 10.20x | **1.27x** (<= 1.2x: NOT met) |" in rows["| EAP-IG, 5 steps, every edge"]


def test_graph_benchmark_smoke():
  out = _run("bench_graphs.py", "--smoke")
  doc = json.loads(out[out.index("{") :])
  assert doc["smoke"] and doc["machine"]["cpu"]
  row = doc["models"]["tiny"]
  full, chosen = row["all features"], row["max_features=64"]
  assert len(full["seconds"]) == 2 and full["features"] > chosen["features"] == 64
  assert full["rows"] == full["features"] + 1 and full["flops"] > chosen["flops"] > 0


def test_das_benchmark_smoke():
  """bench_das: per-step times from the timed calls, the search's time from them, and the
  floor of a truncated search (block l runs L - l of L blocks, forward and back)."""
  out = _run("bench_das.py", "--smoke")
  doc = json.loads(out[out.index("{") :])
  row = doc["models"]["tiny"]
  assert doc["smoke"] and doc["machine"]["cpu"] and (row["pairs"], row["seq"]) == (4, 8)
  blocks = [row["block 0"], row["block 1"]]
  assert [b["floor_over_forward"] for b in blocks] == [2.0, 1.0]
  for b in blocks:
    np.testing.assert_allclose(b["step_s"], b["median_s"] / doc["steps_timed"])
  steps = doc["steps"] * sum(b["step_s"] for b in blocks)
  np.testing.assert_allclose(row["search_steps_s"], steps)
  np.testing.assert_allclose(row["search_s"], steps + row["search_compile_s"])
  np.testing.assert_allclose(row["floor_s"], doc["steps"] * 3 * row["forward"]["median_s"])


def test_gemm_benchmark_smoke():
  """bench_gemm: every path's rate is its FLOPs over its median, each speed is PyTorch's
  float32 median over the path's, and every product and forward is right (bfloat16 to its
  rounding)."""
  out = _run("bench_gemm.py", "--smoke")
  doc = json.loads(out[out.index("{") :])
  row = doc["shapes"]["smoke"]
  assert doc["smoke"] and doc["machine"]["cpu"] and doc["machine"]["torch"]
  flop = 2.0 * row["m"] * row["k"] * row["n"]
  paths = ("xla", "xla, YNNPACK dot", "xla, oneDNN", "xla bf16", "xla bf16, YNNPACK dot")
  paths += ("torch", "torch bf16 autocast")
  for path in paths:
    e = row[path]
    np.testing.assert_allclose(e["gflop_s"], flop / e["median_s"] / 1e9)
    np.testing.assert_allclose(e["speed_vs_torch_f32"], row["torch"]["median_s"] / e["median_s"])
    assert e["rel_error"] < (2e-2 if "bf16" in path else 1e-5), (path, e["rel_error"])
  forward = doc["forward"]["2 x 16"]
  for name in ("bertjax", "bertjax bf16", "bertjax bf16, YNNPACK dot", "torch bf16 autocast"):
    f = forward[name]
    np.testing.assert_allclose(
      f["speed_vs_torch_f32"], forward["torch"]["median_s"] / f["median_s"]
    )
    # float32 is PyTorch's output to rounding; bfloat16 really computed in bfloat16, within 3%
    assert (f["rel_error_vs_torch_f32"] < 1e-5) == ("bf16" not in name), (name, f)
    assert f["rel_error_vs_torch_f32"] < 3e-2, (name, f)
