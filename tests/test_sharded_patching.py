"""Patching sweeps and the map-reading attention analyses on a mesh equal their one-device runs.

As in `test_sharded_analyses`, the mesh runs need 8 CPU devices, set before JAX starts, so
they run in a subprocess: it runs every patching sweep (head, position, path and
attribution patching) and the attention analyses that read maps (pattern types, attention
change, word-level attention, effective attention) on one device and on the meshes 8x1, 4x2
and 1x8 (data x interventions: data alone, both axes, interventions alone; a 2x4 mesh added
nothing those do not cover and cost a fifth of the test), with XLA's cheap CPU compile
settings on both sides. The attention analyses split rows over every device of a mesh, so
they run on 8x1 and 4x2 only.

The pair has 10 rows (every mesh pads them; the ready metrics are row means) and the model
3 heads and 22 positions (the 2- and 8-way intervention axes pad the patch set). A plain
metric function (no `row_mean`) runs on the first 8 rows, which every mesh divides, and on
all 10 it must be refused on a mesh and accepted on one device.
"""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
from conftest import FAST_COMPILE

REPO = pathlib.Path(__file__).resolve().parents[1]
SENTENCES = REPO / "bertjax" / "resources" / "sentences.tsv"

SCRIPT = textwrap.dedent("""
    import csv, json, os, sys, time
    os.environ["XLA_FLAGS"] = ("--xla_force_host_platform_device_count=8 "
                               + os.environ.get("XLA_FLAGS", ""))
    import jax
    import jax.numpy as jnp
    import numpy as np
    import bertjax
    from bertjax import mesh as mesh_lib
    from bertjax.analysis.attention import patterns
    from bertjax.analysis.attention import effective as effective_attention_lib
    from bertjax.analysis.attention import statistics
    from bertjax.analysis.interventions import metrics as patching_metrics
    from bertjax.analysis.interventions import patching
    from bertjax.data import corpus as C

    assert jax.device_count() == 8
    texts = [r["sentence"] for r in csv.DictReader(open(sys.argv[1]), delimiter="\\t")]
    tok = bertjax.Tokenizer(C.train_wordpiece(texts, 300), 64)
    cfg = bertjax.BertConfig.preset("tiny", vocab_size=300, hidden_size=48, num_hidden_layers=3,
                                    num_attention_heads=3, intermediate_size=64,
                                    max_position_embeddings=64)
    params = bertjax.init(cfg, 0, heads=("mlm",))
    params_b = bertjax.init(cfg, 1, heads=("mlm",))
    words = [t.split() for t in texts[:10]]
    enc = tok.encode_words(words, max_length=22, pad_to=22, truncation=True)
    batches = [dict(input_ids=enc.input_ids, attention_mask=enc.attention_mask,
                    token_type_ids=enc.token_type_ids, word_ids=enc.word_ids)]

    # The pair: one real, non-special token per row replaced in the corrupted copy.
    rs = np.random.default_rng(0)
    clean = {k: np.asarray(v) for k, v in batches[0].items() if k != "word_ids"}
    lengths = clean["attention_mask"].sum(-1)
    position = np.asarray([rs.integers(1, n - 1) for n in lengths], np.int32)
    rows = np.arange(len(position))
    answer = clean["input_ids"][rows, position]
    distractor = (answer + 7) % 290 + 5
    corrupted = dict(clean, input_ids=clean["input_ids"].copy())
    corrupted["input_ids"][rows, position] = distractor
    targets = {"position": position, "answer": answer, "distractor": distractor}
    metric = patching_metrics.LogitDiff("mlm")

    def first_logit(params, config, out, batch):  # a plain function: no row_mean
      return jnp.mean(out.last_hidden_state[:, 0, 0] * 3.0 + out.pooler_output[:, 1])

    eight = lambda d: {k: v[:8] for k, v in d.items()}

    def patching_runs(mesh):
      got = {}
      r = patching.head_patching(params, cfg, clean, corrupted, metric, targets=targets, mesh=mesh)
      got["head_out"] = np.concatenate([[r.clean, r.corrupted], r.values.ravel()])
      r = patching.head_patching(params, cfg, clean, corrupted, metric, targets=targets, site="v",
                           positions=[1, 2], direction="noise", mesh=mesh)
      got["v_noise"] = np.concatenate([[r.clean, r.corrupted], r.values.ravel()])
      r = patching.position_patching(params, cfg, clean, corrupted, metric, targets=targets,
                               mesh=mesh)
      got["positions_out"] = np.concatenate([[r.clean, r.corrupted], r.values.ravel()])
      r = patching.position_patching(params, cfg, clean, corrupted, patching_metrics.AnswerLogProb("mlm"),
                               targets=targets, site="mid", mesh=mesh)
      got["positions_mid"] = np.concatenate([[r.clean, r.corrupted], r.values.ravel()])
      r = patching.path_patching(params, cfg, clean, corrupted, metric, targets=targets,
                           receivers=[(2, 0), (2, 2)], receiver_sites=("q", "v"), mesh=mesh)
      got["path"] = np.concatenate([[r.clean, r.corrupted], r.values.ravel()])
      r = patching.attribution_patching(params, cfg, clean, corrupted, metric, targets=targets,
                                  mesh=mesh)
      got["attribution"] = np.concatenate([[r.clean, r.corrupted], r.values.ravel()])
      r = patching.head_patching(params, cfg, eight(clean), eight(corrupted), first_logit,
                           mesh=mesh)
      got["plain_metric"] = np.concatenate([[r.clean, r.corrupted], r.values.ravel()])
      return got

    def attention_runs(mesh):
      got = {}
      pc = patterns.pattern_types(params, cfg, batches, special_ids=[tok.cls_id, tok.sep_id],
                                   mesh=mesh)
      got["patterns"] = pc.counts.ravel().astype(np.float64)
      ch = patterns.attention_change(params, cfg, params_b, batches, max_tokens=50, mesh=mesh)
      got["attention_change"] = np.concatenate([ch.cosine.ravel(), ch.cka])
      got["word_attention"] = np.concatenate(
          [np.concatenate([m.ravel(), g]) for m, g in
           statistics.word_level_attention(params, cfg, batches, mesh=mesh)])
      ef = effective_attention_lib.effective_attention_statistics(params, cfg, batches, cls_id=tok.cls_id,
                                                    sep_id=tok.sep_id, mesh=mesh)
      got["effective"] = np.concatenate([v.ravel() for kind in ("raw", "effective")
                                         for _, v in sorted(ef[kind].items())])
      return got

    def run(mesh, attention_too=True):
      t0 = time.process_time()
      out = patching_runs(mesh)
      if attention_too:
        out.update(attention_runs(mesh))
      shape = None if mesh is None else tuple(mesh.devices.shape)
      print(f"{shape}: {time.process_time() - t0:.1f} s CPU", file=sys.stderr, flush=True)
      return out

    def errors(got, ref):
      return {k: float(np.nanmax(np.abs(got[k] - ref[k]) / np.maximum(1.0, np.abs(ref[k]))))
              for k in got}

    ref = run(None)
    report = {"errors": {}, "nan_agree": {}, "sizes": {k: int(v.size) for k, v in ref.items()},
              "spread": {k: float(np.nanstd(v)) for k, v in ref.items()}}
    for name, shape, attention_too in (("8x1", (8, 1, 1), True), ("4x2", (4, 2, 1), True),
                                       ("1x8", (1, 8, 1), False)):
      got = run(mesh_lib.make_mesh(*shape), attention_too)
      report["errors"][name] = errors(got, ref)
      report["nan_agree"][name] = all(bool((np.isnan(got[k]) == np.isnan(ref[k])).all())
                                      for k in got)
    try:
      patching.head_patching(params, cfg, clean, corrupted, first_logit,
                       mesh=mesh_lib.make_mesh(4, 2))
      report["refused"] = None
    except ValueError as e:
      report["refused"] = str(e)
    one = patching.head_patching(params, cfg, clean, corrupted, first_logit)  # one device: any rows
    report["one_device_plain_finite"] = bool(np.isfinite(one.values).all())
    print("RESULT " + json.dumps(report))
""")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
  root = tmp_path_factory.mktemp("sharded_patching")
  (root / "script.py").write_text(SCRIPT)
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=FAST_COMPILE)
  proc = subprocess.run(
    [sys.executable, str(root / "script.py"), str(SENTENCES)],
    env=env,
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=1200,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.split("RESULT ", 1)[1].splitlines()[0])


PATCHING = {
  "head_out",
  "v_noise",
  "positions_out",
  "positions_mid",
  "path",
  "attribution",
  "plain_metric",
}
ATTENTION = {"patterns", "attention_change", "word_attention", "effective"}


@pytest.mark.slow
def test_patching_and_attention_on_meshes_equal_one_device(report):
  assert set(report["errors"]) == {"8x1", "4x2", "1x8"}
  for mesh, errors in report["errors"].items():
    want = PATCHING | ATTENTION if mesh in ("8x1", "4x2") else PATCHING
    assert set(errors) == want, (mesh, errors)
    for name, err in errors.items():
      assert err <= 1e-6, (mesh, name, err)  # relative (absolute below 1)
    assert report["nan_agree"][mesh], mesh  # path patching: NaN at and above the receivers
  # The compared values are not degenerate: each sweep and statistic varies.
  for name, spread in report["spread"].items():
    assert spread > 1e-4, (name, spread)
  assert report["sizes"]["head_out"] == 2 + 3 * 3 and report["sizes"]["positions_out"] == 2 + 3 * 22


@pytest.mark.slow
def test_plain_metric_needs_rows_the_mesh_divides(report):
  refused = report["refused"]
  assert refused is not None and "batch=10 rows" in refused and "row_mean" in refused, refused
  assert "('data', 'fsdp')" in refused and "multiple of 4" in refused, refused
  assert report["one_device_plain_finite"]
