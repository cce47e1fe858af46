"""Analyses on a device mesh equal their single-device results; two processes equal one.

The mesh runs need 8 CPU devices (`--xla_force_host_platform_device_count`), which must be
set before JAX starts, so they run in subprocesses: one runs every analysis on one device
and on the meshes 8x1, 4x2 and 2x4 (data x interventions) and 2x2x2 (with fsdp); two more
run the sweep, the extraction and a head-patching sweep as two `jax.distributed` processes
on localhost, compared with the first script's single-device values. The subprocesses
compile with XLA's cheap CPU settings (both sides of every comparison alike), since
compiling is most of their time.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import FAST_COMPILE

REPO = pathlib.Path(__file__).resolve().parents[1]
SENTENCES = REPO / "bertjax" / "resources" / "sentences.tsv"

# A tiny model and tokenizer, ten sentences (rows divisible by neither 8 nor 4: every mesh
# pads), MLM labels; shared by both scripts.
SETUP = textwrap.dedent("""
    import csv, json, sys
    import numpy as np
    import bertjax
    from bertjax.data import corpus as C

    texts = [r["sentence"] for r in csv.DictReader(open(sys.argv[1]), delimiter="\\t")]
    tok = bertjax.Tokenizer(C.train_wordpiece(texts, 300), 64)
    cfg = bertjax.BertConfig.preset("tiny", vocab_size=300, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=4, intermediate_size=64,
                                    max_position_embeddings=64)
    params = bertjax.init(cfg, 0, heads=("mlm",))
    words = [t.split() for t in texts[:10]]
    enc = tok.encode_words(words, pad_to=48)
    rs = np.random.default_rng(0)
    labels = np.where((enc.attention_mask > 0) & (rs.random(enc.input_ids.shape) < 0.3),
                      enc.input_ids, -100).astype(np.int32)
    batches = [dict(input_ids=enc.input_ids, attention_mask=enc.attention_mask,
                    token_type_ids=enc.token_type_ids, labels=labels)]

    def sweep_values(mesh, cache_dir=None):
      from bertjax.analysis.interventions import ablation
      r = ablation.ablation_sweep(params, cfg, batches, ablation.mlm_batch_loss, head_ablations=("scale",),
                           include=("heads", "layers", "pairs"), mesh=mesh)["scale"]
      return np.concatenate([[r.baseline], r.heads.ravel(), r.layers,
                             r.pairs[~np.isnan(r.pairs)]])

    def patching_values(mesh):
      from bertjax.analysis.interventions import metrics
      from bertjax.analysis.interventions import patching
      clean = {k: v for k, v in batches[0].items() if k != "labels"}
      rows = np.arange(len(words))
      position = np.ones(len(words), np.int32)  # the first word: a real token in every row
      answer = clean["input_ids"][rows, position]
      distractor = (answer + 7) % 290 + 5
      corrupted = dict(clean, input_ids=clean["input_ids"].copy())
      corrupted["input_ids"][rows, position] = distractor
      r = patching.head_patching(params, cfg, clean, corrupted, metrics.LogitDiff("mlm"),
                           targets=dict(position=position, answer=answer,
                                        distractor=distractor), mesh=mesh)
      return np.concatenate([[r.clean, r.corrupted], r.values.ravel()])

    def feature_values(mesh, cache_dir=None):
      from bertjax.analysis.representations import features
      wf = features.extract_word_features(params, cfg, tok, words, progress=False,
                                          length_multiple=64, mesh=mesh, cache_dir=cache_dir)
      return np.asarray(wf.features, np.float64).ravel()
""")

MESHES = textwrap.dedent("""
    import os, sys, time
    os.environ["XLA_FLAGS"] = ("--xla_force_host_platform_device_count=8 "
                               + os.environ.get("XLA_FLAGS", ""))
    import jax
    assert jax.device_count() == 8
    exec(open(sys.argv[2]).read())
    from bertjax import mesh as mesh_lib
    from bertjax.analysis.interventions import ablation
    from bertjax.analysis.attention import statistics
    from bertjax.analysis.representations import cloze
    from bertjax.analysis.representations import features

    cloze_texts = [" ".join(w[:3]) + " [MASK] ." for w in words]
    candidates = [[w[0], w[1]] for w in words]
    pll_texts = [" ".join(w[:4]) for w in words[:3]]
    punct = statistics.punctuation_ids(tok)

    def run(mesh, only=None):
      out, seconds = {}, {}
      def timed(name, fn):
        if only is None or name in only:
          t0 = time.perf_counter()
          out.update(fn())
          seconds[name] = time.perf_counter() - t0
      def sweep():
        return {"sweep": sweep_values(mesh)}
      def pruning():
        r = ablation.iterative_pruning(params, cfg, batches, ablation.mlm_batch_loss, step=0.25,
                                max_fraction=0.25, mesh=mesh)
        return {"pruning": np.concatenate([r.metrics, r.masks.ravel()])}
      def features_():
        return {"features": feature_values(mesh)}
      def cloze_():
        s = cloze.score_queries((cfg, params), tok, cloze_texts, candidates, k=5, batch_size=12,
                                mesh=mesh)
        pll = cloze.pseudo_log_likelihood((cfg, params), tok, pll_texts, max_rows=24, mesh=mesh)
        return {"cloze_logprob": s.target_logprob.ravel(), "cloze_topk": s.topk.ravel(),
                "pll": pll}
      def attention_():
        got = {}
        for smoothing in (1e-4, 0.0):  # the maps path and the kernel statistics path
          st = statistics.clark_statistics(params, cfg, batches, sep_id=tok.sep_id,
                                          punct_ids=punct, entropy_smoothing=smoothing,
                                          mesh=mesh)
          got[f"clark_{smoothing}"] = np.concatenate([st[k].ravel()
                                                      for k in statistics.CLARK_NAMES])
        return got
      timed("sweep", sweep)
      timed("importance", lambda: {"importance": ablation.head_importance(
          params, cfg, batches, ablation.mlm_batch_loss, mesh=mesh).ravel()})
      timed("pruning", pruning)
      timed("features", features_)
      timed("cloze", cloze_)
      timed("attention", attention_)
      timed("patching", lambda: {"patching": patching_values(mesh)})
      return out, seconds

    def errors(got, ref):
      return {k: float(np.nanmax(np.abs(got[k] - ref[k]) / np.maximum(1.0, np.abs(ref[k]))))
              for k in got}

    ref, seconds = run(None)
    report = {"errors": {}, "seconds": {"1": seconds}, "nan_agree": {}}
    meshes = [("8x1", (8, 1, 1), None), ("4x2", (4, 2, 1), None), ("2x4", (2, 4, 1), None),
              ("2x2x2", (2, 2, 2), ("sweep", "features"))]
    for name, shape, only in meshes:
      got, seconds = run(mesh_lib.make_mesh(*shape), only)
      report["errors"][name] = errors(got, ref)
      report["nan_agree"][name] = all(bool((np.isnan(got[k]) == np.isnan(ref[k])).all())
                                      for k in got)
      report["seconds"][name] = seconds
    mesh = mesh_lib.make_mesh(2, 2, 2)
    placed = mesh_lib.shard_params(params, mesh)
    report["fsdp_word_spec"] = str(placed["embeddings"]["word_embeddings"]["embedding"]
                                   .sharding.spec)
    report["reference"] = {k: ref[k].tolist() for k in ("sweep", "features", "patching")}
    print("RESULT " + json.dumps(report))
""")

MULTIHOST = textwrap.dedent("""
    import pathlib, sys
    from bertjax import mesh as mesh_lib
    distributed = mesh_lib.initialize_distributed()  # first, as `bertjax pretrain` does
    import jax
    exec(open(sys.argv[2]).read())
    from bertjax.analysis.jobs import write_json_atomic

    out = pathlib.Path(sys.argv[3])
    mesh = mesh_lib.make_mesh(2, 2)  # data 2 x interventions 2 over both processes
    result = {"process": jax.process_index(), "processes": jax.process_count(),
              "devices": jax.device_count(), "sweep": sweep_values(mesh).tolist(),
              "features": feature_values(mesh, out / "cache").tolist(),
              "patching": patching_values(mesh).tolist()}
    if mesh_lib.is_primary():
      write_json_atomic(out / "result.json", {k: result[k] for k in ("process", "sweep")})
    print("RESULT " + json.dumps(result), flush=True)
""")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _result(stdout: str) -> dict:
  return json.loads(stdout.split("RESULT ", 1)[1].splitlines()[0])


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
  root = tmp_path_factory.mktemp("sharded")
  (root / "setup.py").write_text(SETUP)
  (root / "meshes.py").write_text(MESHES)
  (root / "multihost.py").write_text(MULTIHOST)
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=FAST_COMPILE)
  return root, env


@pytest.fixture(scope="module")
def mesh_report(scripts):
  """Every analysis on one device and on each mesh: errors, timings, reference values."""
  root, env = scripts
  proc = subprocess.run(
    [sys.executable, str(root / "meshes.py"), str(SENTENCES), str(root / "setup.py")],
    env=env,
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return _result(proc.stdout)


@pytest.mark.slow
def test_every_sharded_analysis_equals_single_device(mesh_report):
  report = mesh_report
  assert set(report["errors"]) == {"8x1", "4x2", "2x4", "2x2x2"}
  for mesh, errors in report["errors"].items():
    assert set(errors) >= (
      {"sweep", "features"}
      if mesh == "2x2x2"
      else {
        "sweep",
        "importance",
        "pruning",
        "features",
        "cloze_logprob",
        "cloze_topk",
        "pll",
        "clark_0.0001",
        "clark_0.0",
        "patching",
      }
    ), errors
    for name, err in errors.items():
      assert err <= 1e-6, (mesh, name, err)  # relative (absolute below 1)
    assert report["nan_agree"][mesh], mesh  # a candidate that is no single token: NaN in both
  assert "fsdp" in report["fsdp_word_spec"]  # the 2x2x2 mesh really shards the parameters


@pytest.mark.slow
def test_two_processes_equal_one_and_only_process_0_writes(scripts, mesh_report, tmp_path):
  root, env = scripts
  env = dict(env, XLA_FLAGS=f"--xla_force_host_platform_device_count=2 {FAST_COMPILE}")
  port = _free_port()
  logs = [(tmp_path / f"process{i}.out", tmp_path / f"process{i}.err") for i in range(2)]
  procs = []
  for i, (out, err) in enumerate(logs):  # output to files: a full pipe would stall a process
    with open(out, "w") as o, open(err, "w") as e:
      procs.append(
        subprocess.Popen(
          [
            sys.executable,
            str(root / "multihost.py"),
            str(SENTENCES),
            str(root / "setup.py"),
            str(tmp_path / "multi"),
          ],
          cwd=REPO,
          text=True,
          stdout=o,
          stderr=e,
          env=dict(
            env,
            JAX_COORDINATOR_ADDRESS=f"localhost:{port}",
            JAX_NUM_PROCESSES="2",
            JAX_PROCESS_ID=str(i),
          ),
        )
      )
  for p, (_, err) in zip(procs, logs):
    p.wait(timeout=500)
    assert p.returncode == 0, err.read_text()[-3000:]
  got = [_result(out.read_text()) for out, _ in logs]
  assert [g["process"] for g in got] == [0, 1]
  assert [g["processes"] for g in got] == [2, 2] and got[0]["devices"] == 4
  want = mesh_report["reference"]  # one process, one device
  for g in got:  # both processes hold the gathered results
    for key in ("sweep", "features", "patching"):
      np.testing.assert_allclose(g[key], want[key], rtol=1e-6, atol=1e-6, err_msg=key)
  # One result file and one feature cache, written by process 0 alone; no temporary left.
  multi = tmp_path / "multi"
  assert json.loads((multi / "result.json").read_text())["process"] == 0
  files = sorted(str(p.relative_to(multi)) for p in multi.rglob("*") if p.is_file())
  assert len(files) == 3 and files[-1] == "result.json", files
  assert [f for f in files if f.startswith("cache/features-")] == files[:2], files


# Fast checks in this process ------------------------------------------------------------


def test_head_pairs_sets_and_prefix_start():
  import bertjax
  from bertjax.analysis import batching
  from bertjax.analysis.interventions import ablation

  cfg = bertjax.BertConfig.preset("tiny", num_hidden_layers=3, num_attention_heads=4)
  n = 3 * 4
  everything, within, across = (ablation.head_pairs(cfg, p) for p in ("all", "within", "across"))
  assert len(everything) == n * (n - 1) // 2 == len(within) + len(across)
  assert len(within) == 3 * 6 and (within[:, 0, 0] == within[:, 1, 0]).all()
  assert (across[:, 0, 0] < across[:, 1, 0]).all()
  masks, index = ablation.pair_masks(cfg, [((2, 1), (0, 3)), ((1, 0), (1, 2))])
  assert index.tolist() == [[[0, 3], [2, 1]], [[1, 0], [1, 2]]]  # first head first
  assert (masks == 0).sum() == 4 and masks[0, 0, 3] == 0 and masks[0, 2, 1] == 0
  assert batching.first_modified_layer(masks).tolist() == [0, 1]  # prefix reuse from min(l1, l2)
  sweep = ablation.sweep_masks(cfg, ("pairs",), pairs="within")
  assert sweep["pairs"][0].shape == (18, 3, 4)
  for bad, match in (
    ([((0, 0), (0, 0))], "names one head twice"),
    ([((0, 0), (3, 0))], r"outside \(layers, heads\)=\(3, 4\)"),
    ([(0, 1, 2)], r"pairs shape \(1, 3\)"),
    ("some", "'some' must be one of"),
    ([], "pairs is empty"),
  ):
    with pytest.raises(ValueError, match=match):
      ablation.head_pairs(cfg, bad)


def test_pair_interactions_subtract_single_effects():
  from bertjax.analysis.interventions.ablation import AblationResult

  heads = np.asarray([[1.5, 2.0]])
  pairs = np.full((1, 2, 1, 2), np.nan)
  pairs[0, 0, 0, 1] = pairs[0, 1, 0, 0] = 3.0
  r = AblationResult("scale", 1.0, heads, np.ones(1), heads, np.ones(1), pairs)
  inter = r.interactions()
  assert inter[0, 0, 0, 1] == pytest.approx(3.0 - 0.5 - 1.0 - 1.0)
  assert np.isnan(inter[0, 0, 0, 0])
  with pytest.raises(ValueError, match="no pairs"):
    AblationResult("scale", 1.0, heads, np.ones(1), heads, np.ones(1)).interactions()


def test_mesh_helpers():
  import jax

  from bertjax import mesh as mesh_lib

  assert mesh_lib.parse_mesh("4x2") == (4, 2, 1)
  assert mesh_lib.parse_mesh("-1x1x2") == (-1, 1, 2)
  with pytest.raises(ValueError, match="'4by2'"):
    mesh_lib.parse_mesh("4by2")
  mesh = mesh_lib.make_mesh(devices=jax.devices()[:1])
  assert mesh.axis_names == ("data", "interventions", "fsdp") and mesh.devices.shape == (1, 1, 1)
  with pytest.raises(ValueError, match="interventions=2 x fsdp=1 must divide the 1 devices"):
    mesh_lib.make_mesh(interventions=2, devices=jax.devices()[:1])
  with pytest.raises(ValueError, match="fsdp=0"):
    mesh_lib.make_mesh(fsdp=0)
  assert mesh_lib.round_up(10, 8) == 16 and mesh_lib.round_up(0, 4) == 4
  padded = mesh_lib.pad_rows({"a": np.arange(6).reshape(3, 2)}, 5)["a"]
  assert padded.tolist() == [[0, 1], [2, 3], [4, 5], [4, 5], [4, 5]]
