"""`bertjax analyze`: many checkpoints as one job, on a tiny `bertjax pretrain` run's steps.

A job killed with SIGKILL mid-way and started again finishes with the same files, byte for
byte, as an uninterrupted one. The runs are subprocesses sharing one persistent compilation
cache, with XLA's cheap CPU compile settings.
"""

import csv
import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import FAST_COMPILE

REPO = pathlib.Path(__file__).resolve().parents[1]
CORPUS = REPO / "bertjax" / "resources" / "smoke" / "wikitext2_tokens" / "valid.txt"
ANALYSES = ("head_ablation", "attention", "probing", "anisotropy")

# The killed job: the library call `bertjax analyze` makes, slowed after each result file
# so that the kill lands mid-way.
SLOW_JOB = textwrap.dedent("""
    import sys, time
    from bertjax.analysis import jobs
    jobs.analyze_checkpoints([sys.argv[1]], out_dir=sys.argv[2], max_sentences=12,
                             progress=False, callback=lambda path: time.sleep(2.0))
""")


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
  """A 4-step tiny pretraining run with checkpoints at steps 2 and 4."""
  root = tmp_path_factory.mktemp("analyze")
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    XLA_FLAGS=FAST_COMPILE,
    JAX_COMPILATION_CACHE_DIR=str(root / "jax_cache"),
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
  )
  env.pop("JAX_COORDINATOR_ADDRESS", None)
  run = root / "run"
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "bertjax.cli",
      "pretrain",
      "--corpus",
      str(CORPUS),
      "--corpus-format",
      "wikitext",
      "--train-vocab",
      "300",
      "--preset",
      "tiny",
      "--seq-len",
      "32",
      "--batch-size",
      "8",
      "--steps",
      "4",
      "--warmup",
      "2",
      "--checkpoint-every",
      "2",
      "--keep",
      "10",
      "--output-dir",
      str(run),
      "--no-progress",
    ],
    env=env,
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=400,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.isdigit()) == ["2", "4"]
  return root, run, env


def _analyze(pretrained, out, *extra):
  _, run, env = pretrained
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "bertjax.cli",
      "analyze",
      str(run),
      "--out",
      str(out),
      "--max-sentences",
      "12",
      "--no-progress",
      *extra,
    ],
    env=env,
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=400,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stdout


def _files(out: pathlib.Path) -> dict[str, bytes]:
  return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_killed_and_restarted_job_equals_uninterrupted(pretrained):
  root, run, env = pretrained
  full = root / "full"
  stdout = _analyze(pretrained, full)
  assert "2 checkpoints x 4 analyses: 8 computed, 0 already there" in stdout, stdout
  want = _files(full)
  results = [f"results/run-step{s:07d}/{a}.json" for s in (2, 4) for a in ANALYSES]
  figures = [f"figures/{a}.png" for a in ANALYSES]
  assert sorted(want) == sorted(results + figures + ["summary.json"])
  ablation = json.loads(want["results/run-step0000004/head_ablation.json"])
  assert ablation["checkpoint"]["step"] == 4 and ablation["checkpoint"]["seed"] == 0
  assert ablation["arrays"]["metric"] == "mlm_loss"  # the run's checkpoints keep the MLM head
  assert len(ablation["arrays"]["heads"]) == 2  # layers of the tiny preset
  probing = json.loads(want["results/run-step0000002/probing.json"])
  assert len(probing["arrays"]["accuracy"]) == 3 and 0 <= probing["metrics"]["best_accuracy"] <= 1
  assert all(want[f][:8] == b"\x89PNG\r\n\x1a\n" for f in figures)

  killed = root / "killed"
  proc = subprocess.Popen(
    [sys.executable, "-c", SLOW_JOB, str(run), str(killed)],
    env=env,
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
  )
  deadline = time.time() + 300
  while not list((killed / "results").glob("*/*.json")):
    assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
    assert time.time() < deadline, "no result appeared"
    time.sleep(0.05)
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  partial = _files(killed)
  assert 1 <= sum(f.startswith("results/") for f in partial) < len(results), sorted(partial)
  assert "summary.json" not in partial

  stdout = _analyze(pretrained, killed)
  found = sum(f.startswith("results/") for f in partial)
  assert f"{8 - found} computed, {found} already there" in stdout, stdout
  assert _files(killed) == want  # the same names and the same bytes


def test_expand_checkpoints_names_steps_and_errors(tmp_path):
  from bertjax.analysis import jobs

  run = tmp_path / "run-a"
  for s in ("10", "20", "20.orbax-checkpoint-tmp-1", "manifests"):
    (run / "checkpoints" / s).mkdir(parents=True)
  hf = tmp_path / "multiberts-seed_3-step_20k"
  hf.mkdir()
  (hf / "config.json").write_text("{}")
  got = jobs.expand_checkpoints([str(run), f"{run}@20", str(hf), "google/multiberts-seed_1"])
  assert [c.label for c in got] == [
    "run-a-step0000010",
    "run-a-step0000020",
    "run-a-step0000020-2",
    "multiberts-seed_3-step_20k",
    "google--multiberts-seed_1",
  ]
  assert [c.step for c in got] == [10, 20, 20, 20000, None]
  assert [c.seed for c in got] == [None, None, None, 3, 1]  # a run's seed comes from its steps
  assert got[0].tokenizer == str(run / "vocab") and got[0].path == str(run / "checkpoints")
  assert got[3].run == "multiberts-seed_3"
  with pytest.raises(ValueError, match=r"steps \[30\] are not saved .* \(saved: \[10, 20\]\)"):
    jobs.expand_checkpoints([f"{run}@30"])
  with pytest.raises(FileNotFoundError, match="is not a directory, a pretraining run or a hub"):
    jobs.expand_checkpoints([str(tmp_path / "nowhere")])
  with pytest.raises(ValueError, match=r"analyses \['rollout'\] must be a non-empty subset"):
    jobs.analyze_checkpoints([str(run)], ["probing", "rollout"], tmp_path / "out")


def test_analyze_help_lists_analyses_and_defaults():
  from bertjax.analysis import jobs
  from bertjax.cli import analyze

  text = analyze.analyze_parser().format_help()
  assert all(a in text for a in jobs.ANALYSES) and tuple(jobs.DEFAULT_ANALYSES) == ANALYSES
  assert jobs.ANALYSES == ANALYSES + ("patterns", "effective_attention")
  assert f"(default: the first four, {','.join(ANALYSES)})" in " ".join(text.split())
  assert "(default: None)" not in text and "(default: 16)" in text
  for option in (
    "--out",
    "--analyses",
    "--data-dir",
    "--max-sentences",
    "--tokenizer",
    "--mesh",
    "--no-plots",
    "--no-progress",
    "RUN@8,16",
  ):
    assert option in text, option


def test_patterns_and_effective_attention_results(tmp_path):
  """The two optional analyses on a tiny random model directory: one file each, holding what
  the library functions give on the job's sentences."""
  import numpy as np

  import bertjax
  from bertjax.analysis import jobs
  from bertjax.analysis.attention import effective as effective_attention_lib
  from bertjax.analysis.attention import patterns as attention_patterns
  from bertjax.data import corpus

  with open(REPO / "bertjax" / "resources" / "sentences.tsv") as f:
    texts = [r["sentence"] for r in csv.DictReader(f, delimiter="\t")]
  tok = bertjax.Tokenizer(corpus.train_wordpiece(texts, 300), 64)
  config = bertjax.BertConfig.preset(
    "tiny",
    vocab_size=300,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
  )
  model = tmp_path / "tiny-seed_2"
  bertjax.to_hf(config, bertjax.init(config, 0), model)
  tok.save_pretrained(model)
  out = tmp_path / "out"
  summary = jobs.analyze_checkpoints(
    [str(model)],
    ["patterns", "effective_attention"],
    out,
    max_sentences=6,
    progress=False,
  )
  assert summary["computed"] == 2
  assert summary["results"] == [
    "results/tiny-seed_2/patterns.json",
    "results/tiny-seed_2/effective_attention.json",
  ]
  patterns = json.loads((out / summary["results"][0]).read_text())
  effective = json.loads((out / summary["results"][1]).read_text())
  assert patterns["checkpoint"]["seed"] == 2

  sentences, _ = jobs.load_sentences(max_sentences=6)
  cfg, params, tok2, _ = jobs.load_checkpoint(jobs.expand_checkpoints([str(model)])[0])
  batches = jobs._unmasked(jobs._Context(params, cfg, tok2, sentences, None, 16))
  counts = attention_patterns.pattern_types(
    params, cfg, batches, special_ids=[tok2.cls_id, tok2.sep_id]
  )
  assert np.asarray(patterns["arrays"]["counts"]).tolist() == counts.counts.tolist()
  assert counts.counts.sum(-1).tolist() == [[6] * 4] * 2  # every head's map of each sentence
  shares = [
    patterns["metrics"][f"share_{t.replace('+', '_')}"] for t in attention_patterns.PATTERN_TYPES
  ]
  np.testing.assert_allclose(shares, counts.overall)
  assert abs(sum(shares) - 1) < 1e-9
  stats = effective_attention_lib.effective_attention_statistics(
    params, cfg, batches, cls_id=tok2.cls_id, sep_id=tok2.sep_id
  )
  for kind in ("raw", "effective"):
    for name, value in stats[kind].items():
      np.testing.assert_allclose(effective["arrays"][kind][name], value, rtol=1e-12)
  assert 0 < effective["metrics"]["raw_cls"] < 1
  assert effective["metrics"]["raw_effective_corr"] == pytest.approx(
    float(np.mean(stats["effective"]["raw_corr"]))
  )


def _result(tmp_path, label, kind, path, step, seed, run, metrics):
  from bertjax.analysis import jobs

  ck = jobs.Checkpoint(label, kind, path, step, seed, run)
  jobs.write_json_atomic(
    tmp_path / "results" / label / "attention.json",
    {"analysis": "attention", "checkpoint": ck.describe(), "metrics": metrics},
  )


def _figures(tmp_path, monkeypatch):
  """results_figures' matplotlib figures (captured at savefig) for the results in tmp_path."""
  from matplotlib.figure import Figure

  from bertjax.plots.jobs import results_figures

  drawn = []
  save = Figure.savefig
  monkeypatch.setattr(
    Figure, "savefig", lambda fig, *a, **k: (drawn.append(fig), save(fig, *a, **k))[1]
  )
  assert results_figures(tmp_path, ["attention"]) == [tmp_path / "figures" / "attention.png"]
  assert len(drawn) == 1
  return drawn[0]


def _legend_texts(fig):
  legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
  return [t.get_text() for legend in legends for t in legend.get_texts()]


def test_figures_join_only_one_run_s_steps(tmp_path, monkeypatch):
  """Runs and hub models mixed (the README's own `bertjax analyze` example): a run's steps are
  one line, every other model a point of its own; a legend names each; the x-axis says what it
  is. Before, all four were one line over "seed (or checkpoint)" with no legend."""
  metric = lambda v: {"mean_cls": v, "mean_sep": v / 2}
  _result(tmp_path, "run-step0000002", "orbax", "/x/run/checkpoints", 2, 0, "run", metric(0.1))
  _result(tmp_path, "run-step0000004", "orbax", "/x/run/checkpoints", 4, 0, "run", metric(0.2))
  _result(
    tmp_path,
    "google--multiberts-seed_0-step_20k",
    "hf",
    "google/multiberts-seed_0-step_20k",
    20000,
    0,
    "google/multiberts-seed_0",
    metric(0.5),
  )
  _result(tmp_path, "bert-small", "hf", "models/bert-small", None, None, "bert-small", metric(0.7))
  fig = _figures(tmp_path, monkeypatch)
  texts = _legend_texts(fig)
  assert "run (seed 0): steps 2-4" in texts
  assert {"google/multiberts-seed_0-step_20k", "bert-small"} <= set(texts)
  for ax in fig.axes:
    assert "seed" not in ax.get_xlabel() and "checkpoint" in ax.get_xlabel()
    joined = [line for line in ax.get_lines() if line.get_linestyle() not in ("None", "none", "")]
    assert [line.get_label() for line in joined] == ["run (seed 0): steps 2-4"]
    assert len(joined[0].get_xdata()) == 2
    points = [line for line in ax.get_lines() if line not in joined]
    assert sorted(len(line.get_xdata()) for line in points) == [1, 1]
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks[:2] == ["run@2", "run@4"]  # the run's steps side by side, then the others
    assert sorted(ticks[2:]) == ["bert-small", "google/multiberts-seed_0-step_20k"]


def test_figures_of_runs_with_steps_are_against_the_step(tmp_path, monkeypatch):
  for run, seed in (("run-a", 0), ("run-b", 1)):
    for step in (10, 20, 30):
      _result(
        tmp_path,
        f"{run}-step{step:07d}",
        "orbax",
        f"/x/{run}",
        step,
        seed,
        run,
        {"mean_cls": step / 100 + seed},
      )
  fig = _figures(tmp_path, monkeypatch)
  (ax,) = fig.axes
  assert ax.get_xlabel() == "training step"
  assert sorted(_legend_texts(fig)) == [
    "run-a (seed 0): steps 10-30",
    "run-b (seed 1): steps 10-30",
  ]
  assert [list(line.get_xdata()) for line in ax.get_lines()] == [[10, 20, 30]] * 2


def test_analyze_keeps_the_order_the_checkpoints_are_given_in(tmp_path, monkeypatch):
  """`bertjax analyze zeta alpha`: the summary, the result list and the figure's x-axis keep
  the order given (they were alphabetical in the figures). The model loading and the analysis
  are stubbed: this is about the job's bookkeeping."""
  from matplotlib.figure import Figure

  from bertjax.analysis import jobs
  from bertjax.cli import analyze

  names = ["zeta-model", "alpha-model", "mid-model"]
  for name in names:
    (tmp_path / name).mkdir()
    (tmp_path / name / "config.json").write_text("{}")
  monkeypatch.setattr(jobs, "load_checkpoint", lambda ck: (None, None, None, ck))
  monkeypatch.setitem(jobs.RUNNERS, "attention", lambda ctx: ({"mean_cls": 0.5}, {}))
  drawn = []
  save = Figure.savefig
  monkeypatch.setattr(
    Figure, "savefig", lambda fig, *a, **k: (drawn.append(fig), save(fig, *a, **k))[1]
  )
  out = tmp_path / "out"
  argv = [*(str(tmp_path / n) for n in names), "--out", str(out), "--analyses", "attention"]
  assert analyze.analyze_main([*argv, "--max-sentences", "5", "--no-progress"]) == 0
  summary = json.loads((out / "summary.json").read_text())
  assert summary["checkpoints"] == names
  assert summary["results"] == [f"results/{n}/attention.json" for n in names]
  assert summary["figures"] == ["figures/attention.png"]
  assert [r["checkpoint"]["label"] for r in jobs.read_results(out, "attention")] == names
  (ax,) = drawn[0].axes
  assert [t.get_text() for t in ax.get_xticklabels()] == names
