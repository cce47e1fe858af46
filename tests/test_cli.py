"""The `bertjax` command as a user runs it: subprocesses in fresh directories, no ../shared.

Covers issue #14's points on the command line: `pretrain --train-vocab` is reproducible
(7); `bertjax export` turns a mid-run checkpoint into a Hugging Face directory that
`bertjax report` and transformers load (8); user errors are one line, tracebacks only
behind `--debug`, help texts are clean, and a closed pipe ends quietly (9); `finetune`
shows progress, prints a short summary, writes metrics.jsonl and keeps label names (4).
"""

import fcntl
import json
import os
import pathlib
import pty
import select
import struct
import subprocess
import sys
import termios

import numpy as np
import pyrunner
import pytest

import bertjax
from bertjax.data import fetch

REPO = pathlib.Path(__file__).resolve().parents[1]
CORPUS = fetch.smoke_dir() / "wikitext2_tokens" / "valid.txt"  # shipped: no data download


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  """The user's environment, with no ../shared data and one JAX compilation cache."""
  cache = tmp_path_factory.mktemp("jax_cache")
  return dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    HF_HUB_OFFLINE="1",
    TRANSFORMERS_OFFLINE="1",
    BERTJAX_NO_SHARED_DATA="1",
    BERTJAX_DATA_DIR=str(cache / "no-data"),
    JAX_COMPILATION_CACHE_DIR=str(cache),
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
  )


def bertjax_cmd(*args, cwd, env, timeout=600, extra_env=None):
  """`bertjax ARGS` in `cwd`, as the console script runs it."""
  return pyrunner.run(
    [sys.executable, "-m", "bertjax.cli", *map(str, args)],
    cwd=cwd,
    env=dict(env, **(extra_env or {})),
    capture_output=True,
    text=True,
    timeout=timeout,
    check=False,
  )


def _ok(proc):
  assert proc.returncode == 0, (
    f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
  )
  return proc


# Pretraining, a reproducible vocabulary, and export --------------------------------------------


def _pretrain(cwd, env, hash_seed):
  cwd.mkdir(parents=True, exist_ok=True)
  return _ok(
    bertjax_cmd(
      "pretrain",
      "--corpus",
      CORPUS,
      "--corpus-format",
      "wikitext",
      "--train-vocab",
      300,
      "--preset",
      "tiny",
      "--seq-len",
      32,
      "--batch-size",
      4,
      "--steps",
      2,
      "--checkpoint-every",
      1,
      "--output-dir",
      "run",
      "--no-progress",
      cwd=cwd,
      env=env,
      extra_env={"PYTHONHASHSEED": str(hash_seed)},
    )
  )


@pytest.fixture(scope="module")
def pretrain_runs(tmp_path_factory, env):
  """Two identical `bertjax pretrain --train-vocab` runs in two fresh directories."""
  root = tmp_path_factory.mktemp("pretrain")
  procs = [_pretrain(root / f"user{i}", env, hash_seed=i) for i in (1, 2)]
  return [root / f"user{i}" / "run" for i in (1, 2)], procs


@pytest.mark.slow
def test_train_vocab_runs_write_identical_vocabularies(pretrain_runs):
  (a, b), procs = pretrain_runs
  assert (a / "vocab" / "vocab.txt").read_bytes() == (b / "vocab" / "vocab.txt").read_bytes()
  assert (a / "vocab" / "tokenizer.json").read_bytes() == (
    b / "vocab" / "tokenizer.json"
  ).read_bytes()
  tokens = (a / "vocab" / "vocab.txt").read_text().splitlines()
  assert len(tokens) == 300 and tokens[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  # Same seed, same run: the losses repeat too.
  losses = [
    [json.loads(r)["loss"] for r in (d / "metrics.jsonl").read_text().splitlines()] for d in (a, b)
  ]
  assert losses[0] == losses[1] and len(losses[0]) == 2
  # The end of the run is a short summary, not a JSON dump.
  out = procs[0].stdout
  assert "pretrain: done" in out and "bertjax export" in out and not out.lstrip().startswith("{")


@pytest.mark.hf
@pytest.mark.slow
def test_export_a_mid_run_checkpoint(pretrain_runs, tmp_path, env):
  (run, _), _ = pretrain_runs
  proc = _ok(bertjax_cmd("export", run, "--step", 1, "--to", "model", cwd=tmp_path, env=env))
  model = tmp_path / "model"
  assert "exported step 1" in proc.stdout and "bertjax report --model" in proc.stdout
  for name in (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "vocab.txt",
    "tokenizer_config.json",
    "special_tokens_map.json",
  ):
    assert (model / name).is_file(), name
    assert (model / name).stat().st_mode & 0o044 == 0o044, f"{name} is not readable by others"
  assert (model / "vocab.txt").read_bytes() == (run / "vocab" / "vocab.txt").read_bytes()
  assert not [p for p in tmp_path.iterdir() if p.name.startswith(".model.")]  # no leftovers
  # Step 1's weights, not the final ones.
  _ok(bertjax_cmd("export", run / "checkpoints", "--to", "final", cwd=tmp_path, env=env))
  _, p1 = bertjax.from_hf(model)
  _, p2 = bertjax.from_hf(tmp_path / "final")
  w1, w2 = (np.asarray(p["embeddings"]["word_embeddings"]["embedding"]) for p in (p1, p2))
  assert w1.shape == w2.shape and not np.allclose(w1, w2)

  # transformers loads the weights and the tokenizer, and agrees with bertjax.
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  hf_tok = transformers.AutoTokenizer.from_pretrained(str(model))
  hf_model = transformers.AutoModelForPreTraining.from_pretrained(str(model)).eval()
  ours = bertjax.Tokenizer.from_pretrained(model)
  text = "The mill was built in 1782 by a local miller."
  batch = ours.encode([text])
  assert hf_tok(text)["input_ids"] == batch.input_ids[0].tolist()
  assert batch.input_ids[0, 0] == ours.cls_id and batch.input_ids[0, -1] == ours.sep_id
  with torch.no_grad():
    want = hf_model.bert(torch.tensor(batch.input_ids.astype(np.int64))).last_hidden_state
  config, params = bertjax.from_hf(model)
  got = bertjax.forward(params, config, batch.input_ids).last_hidden_state
  np.testing.assert_allclose(np.asarray(got), want.numpy(), atol=1e-4)

  # `bertjax report` reads the exported directory as it is.
  rep = _ok(
    bertjax_cmd(
      "report",
      "--model",
      "model",
      "--out",
      "rep",
      "--reduced",
      "--sections",
      "clark",
      "--quiet",
      cwd=tmp_path,
      env=env,
      timeout=900,
    )
  )
  assert "report:" in rep.stdout
  saved = json.loads((tmp_path / "rep" / "report.json").read_text())
  assert saved["model"]["layers"] == 2 and saved["model"]["model_type"] == "bert"


@pytest.mark.slow
def test_export_errors_name_the_problem(pretrain_runs, tmp_path, env):
  (run, _), _ = pretrain_runs
  proc = bertjax_cmd("export", run, "--step", 7, "--to", "m", cwd=tmp_path, env=env)
  _one_line_error(proc, "step 7", "[1, 2]")
  assert not (tmp_path / "m").exists()
  proc = bertjax_cmd("export", "nowhere", "--to", "m", cwd=tmp_path, env=env)
  _one_line_error(proc, "'nowhere'")


def _in_process(capsys, *argv) -> tuple[int, str, str]:
  """`bertjax ARGV` in this process (compilations shared): (status, stdout, stderr)."""
  from bertjax import cli

  code = cli.main([str(a) for a in argv])
  out, err = capsys.readouterr()
  return code, out, err


def _small_pretrain(run, *extra):
  return [
    "pretrain",
    "--corpus",
    CORPUS,
    "--corpus-format",
    "wikitext",
    "--max-lines",
    300,
    "--preset",
    "tiny",
    "--seq-len",
    32,
    "--batch-size",
    4,
    "--checkpoint-every",
    1,
    "--output-dir",
    run,
    "--no-progress",
    *extra,
  ]


def test_a_run_directory_is_never_mixed_with_another(tmp_path, capsys, monkeypatch, minilm_dir):
  # The issue: a second run into D without --resume exited 0, cut metrics.jsonl, replaced
  # vocab/ and left the old checkpoints beside the new; `export --step OLD` then paired the
  # old weights with the new vocabulary.
  monkeypatch.delenv("BERTJAX_DEBUG", raising=False)
  monkeypatch.chdir(tmp_path)
  run = tmp_path / "D"
  code, _, err = _in_process(capsys, *_small_pretrain(run, "--train-vocab", 200, "--steps", 3))
  assert code == 0, err[-3000:]
  kept = {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}
  assert (run / "checkpoints" / "3").is_dir()
  # Again without --resume: refused before anything is read or written, the run untouched.
  code, _, err = _in_process(capsys, *_small_pretrain(run, "--train-vocab", 100, "--steps", 2))
  assert code == 1 and len(err.strip().splitlines()) == 1, err
  for needle in (f"--output-dir {run} is not empty", "checkpoints/", "--resume", "--overwrite"):
    assert needle in err, (needle, err)
  # --resume with another vocabulary than the run's own: refused, naming both.
  code, _, err = _in_process(
    capsys, *_small_pretrain(run, "--vocab", minilm_dir / "vocab.txt", "--steps", 4, "--resume")
  )
  assert code == 1 and "30522 tokens" in err and "200 tokens" in err, err
  assert {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()} == kept
  # --overwrite: the earlier run is deleted first; the new run is alone in D.
  code, out, err = _in_process(
    capsys, *_small_pretrain(run, "--train-vocab", 100, "--steps", 2, "--overwrite")
  )
  assert code == 0, err[-3000:]
  assert f"deleted the earlier run in {run}" in out
  assert len((run / "vocab" / "vocab.txt").read_text().splitlines()) == 100
  assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
  assert sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.isdigit()) == ["1", "2"]
  # --overwrite deletes only a run, and never the directory the user is in.
  (tmp_path / "notes").mkdir()
  (tmp_path / "notes" / "todo.txt").write_text("keep me")
  for where, needle in (
    (tmp_path / "notes", "none of it a run's files"),
    (tmp_path, "holds the current directory"),
  ):
    code, _, err = _in_process(capsys, *_small_pretrain(where, "--train-vocab", 100, "--overwrite"))
    assert code == 1 and needle in err, err
  assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"
  # The first run's checkpoints (vocabulary 200) beside the second run's vocab/ (100), as
  # the run was left: export names both sizes and writes nothing.
  mixed = tmp_path / "E"
  for path, data in kept.items():
    (mixed / path.relative_to(run)).parent.mkdir(parents=True, exist_ok=True)
    (mixed / path.relative_to(run)).write_bytes(data)
  for f in ("vocab.txt", "tokenizer.json"):
    (mixed / "vocab" / f).write_bytes((run / "vocab" / f).read_bytes())
  code, _, err = _in_process(capsys, "export", mixed, "--step", 1, "--to", tmp_path / "model")
  assert code == 1 and "has 100 tokens" in err and "vocab_size=200" in err, err
  assert not (tmp_path / "model").exists()


def test_finetune_refuses_an_earlier_run_directory(tmp_path, capsys, monkeypatch, minilm_dir):
  monkeypatch.delenv("BERTJAX_DEBUG", raising=False)
  monkeypatch.chdir(tmp_path)
  _reviews(tmp_path / "reviews.tsv", 2)
  (tmp_path / "tiny.json").write_text(
    json.dumps(
      {
        "vocab_size": 30522,
        "hidden_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 32,
        "max_position_embeddings": 16,
      }
    )
  )
  argv = [
    "finetune",
    "--table",
    "reviews.tsv",
    "--vocab",
    minilm_dir,
    "--config-json",
    "tiny.json",
    "--steps",
    2,
    "--batch-size",
    8,
    "--max-len",
    16,
    "--no-progress",
    "--output-dir",
    "mine",
  ]
  (tmp_path / "mine" / "model").mkdir(parents=True)
  (tmp_path / "mine" / "model" / "vocab.txt").write_text("[PAD]\n")  # an earlier model's
  code, _, err = _in_process(capsys, *argv)
  assert code == 1 and "--output-dir mine is not empty (model/)" in err, err
  assert "--overwrite" in err and "--resume" not in err
  code, out, err = _in_process(capsys, *argv, "--overwrite")
  assert code == 0, err[-3000:]
  assert "deleted the earlier run in mine" in out
  assert (tmp_path / "mine" / "model" / "vocab.txt").read_text().count("\n") == 30522


# Errors, help, pipes ----------------------------------------------------------------------------


def _one_line_error(proc, *needles):
  err = proc.stderr.strip()
  assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
  assert "Traceback" not in err and len(err.splitlines()) == 1, err
  assert err.startswith("bertjax: error: ") and "--debug" in err
  for needle in needles:
    assert needle in err, (needle, err)


@pytest.mark.slow
def test_user_errors_are_one_line_naming_the_value(tmp_path, env, minilm_dir):
  table = tmp_path / "reviews.tsv"
  table.write_text("sentence\tlabel\nGreat fun.\tpositive\nDull.\tnegative\n")
  cases = [
    (["finetune", "--table", "missing.tsv", "--vocab", minilm_dir], ["missing.tsv"]),
    (
      ["finetune", "--table", table, "--label-column", "stars", "--vocab", minilm_dir],
      ["'stars'", "'label'"],
    ),
    (["report", "--model", "no-such-model"], ["no-such-model"]),
    (
      ["pretrain", "--corpus", "missing.txt", "--train-vocab", 100, "--output-dir", "o"],
      ["missing.txt"],
    ),
  ]
  for argv, needles in cases:
    _one_line_error(bertjax_cmd(*argv, cwd=tmp_path, env=env), *needles)
  debug = bertjax_cmd(
    "finetune", "--table", "missing.tsv", "--vocab", minilm_dir, "--debug", cwd=tmp_path, env=env
  )
  assert debug.returncode == 1 and "Traceback" in debug.stderr and "missing.tsv" in debug.stderr


@pytest.mark.slow
def test_bad_option_values_are_named_by_argparse(tmp_path, env):
  proc = bertjax_cmd(
    "pretrain",
    "--corpus",
    CORPUS,
    "--preset",
    "bert-huge",
    "--output-dir",
    "o",
    cwd=tmp_path,
    env=env,
  )
  assert proc.returncode == 2 and "Traceback" not in proc.stderr
  assert "'bert-huge'" in proc.stderr and "bert-base" in proc.stderr


@pytest.mark.parametrize(
  "argv",
  [
    ["pretrain"],
    ["finetune"],
    ["export"],
    ["analyze"],
    ["report"],
    ["data", "list"],
    ["data", "fetch"],
    ["models", "list"],
    ["models", "install"],
    ["pretrain", "--corpus", "c.txt", "--output-dir", "o"],
  ],
  ids=lambda a: " ".join(a),
)
def test_unknown_options_are_named(argv, capsys):
  # argparse named the missing required options and never the unknown one.
  from bertjax import cli

  with pytest.raises(SystemExit) as e:
    cli.main([*argv, "--nonsense-flag"])
  err = capsys.readouterr().err
  assert e.value.code == 2 and "unrecognized arguments: --nonsense-flag" in err, err
  assert "required" not in err and "Traceback" not in err


HELP = [
  ["--help"],
  ["pretrain", "--help"],
  ["finetune", "--help"],
  ["export", "--help"],
  ["report", "--help"],
  ["data", "fetch", "--help"],
  ["data", "list", "--help"],
]


@pytest.mark.slow
@pytest.mark.parametrize("argv", HELP, ids=lambda a: " ".join(a))
def test_help_texts_are_clean(argv, tmp_path, env):
  proc = _ok(bertjax_cmd(*argv, cwd=tmp_path, env=env, timeout=120))
  text = proc.stdout
  assert "(default: None)" not in text and "(default: False)" not in text
  assert text.count("(default:") == sum(line.count("(default:") for line in text.splitlines())
  for line in " ".join(text.split()).split("(default:")[1:]:
    assert "(default:" not in line.split(")")[0]
  import re

  assert not re.search(r"\(default: [^)]*\)\s*\(default:", " ".join(text.split())), text
  if argv[0] == "pretrain":
    from bertjax.model.config import PRESETS

    flat = " ".join(text.split())
    assert all(name in flat for name in PRESETS)
    assert "corpus formats" in text and "wikitext" in text and "<unk> becomes [UNK]" in flat
    assert "--output-dir DIR" in text and "(default: 0.0001)" in text
  if argv[0] == "finetune":
    flat = " ".join(text.split())
    assert "universal part-of-speech tags" in flat and "dependency relation" in flat
    assert "(default: 2e-05)" in text and "out/finetune" in flat
  if argv[0] == "--help":
    for command in ("report", "data", "pretrain", "finetune", "export"):
      assert command in text


@pytest.mark.slow
@pytest.mark.parametrize("reader", ["head -n 2", "true"])
def test_data_list_into_a_closed_pipe_ends_quietly(reader, tmp_path, env):
  proc = subprocess.run(
    ["bash", "-c", f"{sys.executable} -m bertjax.cli data list | {reader}"],
    cwd=tmp_path,
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
    check=False,
  )
  assert proc.returncode == 0
  assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
  if reader.startswith("head"):
    assert proc.stdout.startswith("data directories")


# Fine-tuning --------------------------------------------------------------------------------------

POSITIVE = [
  "a great film",
  "I loved it",
  "wonderful acting",
  "a joy to watch",
  "truly moving",
  "brilliant and funny",
  "superb story",
  "a delight",
]
NEGATIVE = [
  "a dull film",
  "I hated it",
  "terrible acting",
  "a chore to watch",
  "truly boring",
  "flat and humourless",
  "awful story",
  "a mess",
]


def _reviews(path: pathlib.Path, repeat: int) -> None:
  rows = [(t, "positive") for t in POSITIVE] + [(t, "negative") for t in NEGATIVE]
  path.write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows * repeat))


@pytest.fixture()
def tiny_finetune(tmp_path, minilm_dir):
  _reviews(tmp_path / "reviews.tsv", 3)
  _reviews(tmp_path / "dev.tsv", 1)
  (tmp_path / "tiny.json").write_text(
    json.dumps(
      {
        "vocab_size": 30522,
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 64,
      }
    )
  )
  return [
    "finetune",
    "--table",
    "reviews.tsv",
    "dev.tsv",
    "--vocab",
    str(minilm_dir),
    "--config-json",
    "tiny.json",
    "--steps",
    8,
    "--batch-size",
    8,
    "--lr",
    1e-3,
    "--max-len",
    16,
    "--eval-every",
    4,
  ]


@pytest.mark.hf
@pytest.mark.slow
def test_finetune_without_a_terminal(tiny_finetune, tmp_path, env):
  proc = _ok(bertjax_cmd(*tiny_finetune, "--log-every", 2, cwd=tmp_path, env=env))
  out, err = proc.stdout, proc.stderr
  # The default output directory, printed before the run.
  first = out.splitlines()[0]
  assert first.startswith("finetune: writing to out/finetune/reviews-"), first
  runs = list((tmp_path / "out" / "finetune").iterdir())
  assert len(runs) == 1 and str(runs[0].relative_to(tmp_path)) in first
  run = runs[0]
  # Plain progress lines (no bar), with loss and examples/s, and the evaluations.
  steps = [line for line in err.splitlines() if line.startswith("step ")]
  assert [s.split()[1] for s in steps] == ["1/8", "2/8", "4/8", "6/8", "8/8"], err
  assert all(" loss " in s and "examples/s" in s for s in steps)
  assert "\r" not in err and "eval at step 4: accuracy" in err
  # A short summary table, not the history as JSON.
  assert len(out.splitlines()) < 20 and "{" not in out
  assert "eval accuracy" in out and "labels         negative, positive" in out
  assert str(run.relative_to(tmp_path) / "model") in out and "metrics.jsonl" in out
  # metrics.jsonl: one line per step, one per evaluation.
  records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
  train = [r for r in records if "loss" in r]
  evals = [r for r in records if "eval_accuracy" in r]
  assert [r["step"] for r in train] == list(range(1, 9)) and [r["step"] for r in evals] == [4, 8]
  assert all(r["examples_per_s"] > 0 for r in train)
  summary = json.loads((run / "summary.json").read_text())
  assert summary["labels"] == ["negative", "positive"] and summary["num_eval"] == 16
  assert set(summary["metrics"]) == {"accuracy", "f1", "matthews"}
  # The label names survive the export (id2label), for bertjax and transformers.
  hf = json.loads((run / "model" / "config.json").read_text())
  assert hf["id2label"] == {"0": "negative", "1": "positive"}
  config, _ = bertjax.from_hf(run / "model")
  assert config.label_names == ("negative", "positive")
  transformers = pytest.importorskip("transformers")
  model = transformers.AutoModelForSequenceClassification.from_pretrained(str(run / "model"))
  assert model.config.id2label == {0: "negative", 1: "positive"}
  tok = transformers.AutoTokenizer.from_pretrained(str(run / "model"))
  assert tok("a great film")["input_ids"][0] == tok.cls_token_id


def _run_on_a_terminal(argv, cwd, env, timeout=600) -> tuple[int, str, str]:
  """Runs with stderr on a pseudo-terminal (as in a user's shell); returns (code, out, err)."""
  master, slave = pty.openpty()
  fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # 40 x 120
  proc = subprocess.Popen(
    [sys.executable, "-m", "bertjax.cli", *map(str, argv)],
    cwd=cwd,
    env=env,
    stdout=subprocess.PIPE,
    stderr=slave,
    text=True,
  )
  os.close(slave)
  chunks = []
  while True:
    ready, _, _ = select.select([master], [], [], timeout)
    if not ready:
      proc.kill()
      raise TimeoutError("no output from the terminal run")
    try:
      data = os.read(master, 4096)
    except OSError:  # the child closed the terminal
      break
    if not data:
      break
    chunks.append(data)
  out = proc.stdout.read()
  code = proc.wait(timeout=60)
  os.close(master)
  return code, out, b"".join(chunks).decode("utf-8", "replace")


@pytest.mark.slow
def test_finetune_on_a_terminal_shows_a_progress_bar(tiny_finetune, tmp_path, env):
  code, out, err = _run_on_a_terminal([*tiny_finetune, "--output-dir", "mine"], tmp_path, env)
  assert code == 0, err[-3000:]
  assert "finetune: writing to mine" in out and "(choose with" not in out
  assert "finetune:" in err and "\r" in err  # tqdm redraws one line
  assert "8/8" in err and "loss=" in err and "ex_s=" in err
  assert "step 1/8" not in err  # no plain lines on a terminal
  assert "eval at step 4: accuracy" in err
  assert (tmp_path / "mine" / "model" / "config.json").is_file()
