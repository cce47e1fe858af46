"""The training loop end to end: WikiText-2 pretraining, kill and resume, NaN stop, sharding, CLI.

The expensive runs happen in subprocesses sharing one persistent compilation
cache, so each distinct program is compiled once.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from conftest import FAST_COMPILE

REPO = pathlib.Path(__file__).resolve().parents[1]

RUNNER = textwrap.dedent('''
    import json, sys, time
    import bertjax
    from bertjax.data import corpus as C, pretraining as P, pretraining_examples as PE
    from bertjax.training import loop

    args = json.loads(sys.argv[1])
    tok = C.load_tokenizer(args["vocab"])
    corpus = C.load_corpus(args["text"], tok, format="wikitext", max_lines=args["max_lines"])
    pc = PE.PretrainingConfig(max_seq_len=args["seq_len"], objective=args["objective"])

    class Data(P.PretrainingIterator):
      """Optionally slow after a step (to be killed there) or poisoned with NaN at one step."""
      def batch(self, step):
        b = super().batch(step)
        if args.get("slow_after") is not None and step >= args["slow_after"]:
          time.sleep(0.5)
        if args.get("nan_at") == step:
          b["mlm_weights"] = b["mlm_weights"] * float("nan")
        return b

    data = Data(corpus, pc, batch_size=args["batch"], seed=0)
    cfg = bertjax.BertConfig.preset("tiny", vocab_size=corpus.vocab_size,
                                    num_hidden_layers=args["layers"])
    train = loop.TrainConfig(steps=args["steps"], batch_size=args["batch"], learning_rate=1e-3,
                             warmup_steps=3, output_dir=args["out"],
                             checkpoint_every=args["every"], stacking=args.get("stacking"),
                             progress=False, mesh_shape=args.get("mesh"))
    try:
      summary = loop.pretrain(cfg, data, train, resume=args.get("resume", False))
      summary.pop("history")
      print("SUMMARY " + json.dumps(summary))
    except FloatingPointError as e:
      print("NANERROR " + str(e))
''')


@pytest.fixture(scope="module")
def setup(tmp_path_factory, data_dir):
  from bertjax.data import corpus as C

  root = tmp_path_factory.mktemp("loop")
  text = data_dir / "wikitext2_tokens" / "valid.txt"
  docs = C.read_documents(text, format="wikitext", max_lines=400)
  C.train_wordpiece((s for d in docs for s in d), 1000, save_dir=root / "vocab")
  (root / "runner.py").write_text(RUNNER)
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    JAX_COMPILATION_CACHE_DIR=str(root / "jax_cache"),
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    XLA_FLAGS=FAST_COMPILE,
  )
  return root, text, env


def _args(setup, out, **kw):
  root, text, _ = setup
  args = dict(
    vocab=str(root / "vocab"),
    text=str(text),
    max_lines=400,
    seq_len=32,
    objective="nsp",
    batch=8,
    layers=2,
    steps=16,
    every=4,
    stacking="1:6,2",
    out=str(out),
  )
  args.update(kw)
  return args


def _run(setup, args, timeout=300):
  proc = subprocess.run(
    [sys.executable, str(setup[0] / "runner.py"), json.dumps(args)],
    env=setup[2],
    cwd=REPO,
    check=False,
    capture_output=True,
    text=True,
    timeout=timeout,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stdout


def _losses(out):
  return [
    (r["step"], r["loss"], r["mlm_loss"], r["layers"])
    for r in map(json.loads, (pathlib.Path(out) / "metrics.jsonl").read_text().splitlines())
  ]


@pytest.mark.slow
def test_kill_and_resume_is_bitwise_identical_across_stacking(setup):
  root = setup[0]
  ref_out, run_out = root / "ref", root / "killed"
  stdout = _run(setup, _args(setup, ref_out))
  summary = json.loads(stdout.split("SUMMARY ", 1)[1])
  assert summary["steps"] == 16 and summary["num_hidden_layers"] == 2
  ref = _losses(ref_out)
  assert [r[0] for r in ref] == list(range(1, 17))
  assert [r[3] for r in ref] == [1] * 6 + [2] * 10

  # Killed with SIGKILL once the step-4 checkpoint is on disk (before the stacking boundary).
  args = _args(setup, run_out, slow_after=5)
  proc = subprocess.Popen(
    [sys.executable, str(root / "runner.py"), json.dumps(args)],
    env=setup[2],
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
  )
  deadline = time.time() + 240
  while not (run_out / "checkpoints" / "4").is_dir():
    assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
    assert time.time() < deadline, "no checkpoint appeared"
    time.sleep(0.1)
  time.sleep(1.0)
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  assert proc.returncode == -signal.SIGKILL
  partial = _losses(run_out)
  assert 4 <= len(partial) < 16

  stdout = _run(setup, _args(setup, run_out, resume=True))
  summary = json.loads(stdout.split("SUMMARY ", 1)[1])
  assert summary["resumed_from"] in (4, 8) and summary["steps"] == 16
  resumed = _losses(run_out)
  assert resumed == ref  # bitwise: JSON keeps every bit of a float


@pytest.mark.slow
def test_nan_stops_with_clear_error_and_keeps_last_checkpoint(setup):
  out = setup[0] / "nan"
  # Also runs the loop's sharded path (a 1x1 mesh: shardings, sharded batches).
  stdout = _run(setup, _args(setup, out, steps=10, every=2, nan_at=4, mesh=[1, 1]))
  assert "NANERROR" in stdout, stdout
  msg = stdout.split("NANERROR ", 1)[1]
  assert "non-finite loss=nan" in msg and "at step 5" in msg
  assert "last good checkpoint is step 4" in msg
  steps = sorted(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit())
  assert steps[-1] == 4
  assert len(_losses(out)) == 4


@pytest.mark.optimized
@pytest.mark.slow
def test_short_wikitext_pretraining_lowers_mlm_loss(setup, tmp_path):
  import bertjax
  from bertjax.data import corpus as C
  from bertjax.data import pretraining as P
  from bertjax.data import pretraining_examples as PE
  from bertjax.training import loop

  text = setup[1]
  docs = C.read_documents(text, format="wikitext", max_lines=600)
  tok = C.train_wordpiece((s for d in docs for s in d), 200)
  corpus = C.tokenize_documents(docs, tok)
  data = P.PretrainingIterator(
    corpus, PE.PretrainingConfig(max_seq_len=64, objective="none"), batch_size=16, seed=0
  )
  cfg = bertjax.BertConfig.preset("tiny", vocab_size=corpus.vocab_size)
  train = loop.TrainConfig(
    steps=200,
    batch_size=16,
    learning_rate=3e-3,
    warmup_steps=20,
    progress=False,
    output_dir=str(tmp_path),
    checkpoint_every=0,
  )
  summary = loop.pretrain(cfg, data, train)
  mlm = [r["mlm_loss"] for r in summary["history"]]
  first, last = np.mean(mlm[:3]), np.mean(mlm[-20:])
  assert last < 0.9 * first, (first, last)
  assert (tmp_path / "metrics.jsonl").is_file()
  events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
  assert events and events[0].stat().st_size > 1000
  assert summary["last_checkpoint"] == 200 and summary["tokens_per_s"] > 0


SHARDED = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import json, jax, numpy as np, bertjax
    from bertjax import mesh as mesh_lib
    from bertjax.training import optim, state as ts, step as tstep
    assert jax.device_count() == 8
    cfg = bertjax.BertConfig.preset("tiny", hidden_dropout_prob=0.0,
                                    attention_probs_dropout_prob=0.0, num_hidden_layers=1)
    rs = np.random.default_rng(0)
    B, T, P = 16, 16, 3
    def batch():
      return dict(input_ids=rs.integers(5, 1000, (B, T)).astype(np.int32),
                  attention_mask=np.ones((B, T), np.int32),
                  token_type_ids=np.zeros((B, T), np.int32),
                  mlm_positions=np.tile(np.arange(1, 1 + P), (B, 1)).astype(np.int32),
                  mlm_ids=rs.integers(5, 1000, (B, P)).astype(np.int32),
                  mlm_weights=np.ones((B, P), np.float32),
                  next_sentence_labels=rs.integers(0, 2, B).astype(np.int32))
    batches = [batch() for _ in range(3)]
    tx = optim.make_optimizer("adamw", 1e-3)
    params = bertjax.init(cfg, 0, heads=("mlm", "nsp"))
    single = ts.create_train_state(params, tx, 0)
    step = tstep.make_train_step(cfg, tx)
    ref = []
    for b in batches:
      single, m = step(single, b)
      ref.append(float(m["loss"]))
    mesh = mesh_lib.make_mesh(data=4, fsdp=2)
    state, shard = mesh_lib.shard_state(ts.create_train_state(params, tx, 0), mesh)
    specs = {str(s.spec) for s in jax.tree.leaves(shard)}
    word = state.params["embeddings"]["word_embeddings"]["embedding"]
    sstep = tstep.make_train_step(cfg, tx, state_sharding=shard,
                                  batch_sharding=mesh_lib.batch_sharding(mesh))
    got = []
    for b in batches:
      state, m = sstep(state, mesh_lib.shard_batch(b, mesh))
      got.append(float(m["loss"]))
    print("RESULT " + json.dumps(dict(ref=ref, got=got, specs=sorted(specs),
                                      word_spec=str(word.sharding.spec),
                                      devices=len(word.sharding.device_set))))
""")


@pytest.mark.slow
def test_sharded_training_matches_single_device(tmp_path):
  script = tmp_path / "sharded.py"
  script.write_text(SHARDED)
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  proc = subprocess.run(
    [sys.executable, str(script)],
    env=env,
    cwd=REPO,
    check=False,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  res = json.loads(proc.stdout.split("RESULT ", 1)[1])
  np.testing.assert_allclose(res["got"], res["ref"], atol=1e-5, rtol=0)
  assert res["devices"] == 8
  assert res["word_spec"].endswith("('fsdp', None)")  # (1000, 64): largest divisible axis
  assert {"P()", "PartitionSpec()"} & set(res["specs"])  # e.g. the (2,)-shaped NSP bias: replicated


def test_mesh_and_shardings_helpers():
  import jax

  from bertjax import mesh as mesh_lib

  assert mesh_lib._leaf_spec((1000, 64), 2) == jax.sharding.PartitionSpec("fsdp", None)
  assert mesh_lib._leaf_spec((3, 64), 2) == jax.sharding.PartitionSpec(None, "fsdp")
  assert mesh_lib._leaf_spec((3, 5), 2) == jax.sharding.PartitionSpec()
  # `pretrain --mesh-shape` reads DATAxFSDP; the training mesh is the one mesh, interventions 1.
  assert mesh_lib.parse_mesh("4x2", ("data", "fsdp")) == (4, 2)
  with pytest.raises(ValueError, match="'4by2'.*'DATAxFSDP'"):
    mesh_lib.parse_mesh("4by2", ("data", "fsdp"))
  with pytest.raises(ValueError, match="'4x2x2'"):
    mesh_lib.parse_mesh("4x2x2", ("data", "fsdp"))
  with pytest.raises(ValueError, match="fsdp=3"):
    mesh_lib.make_mesh(fsdp=3, devices=jax.devices()[:1])
  one = mesh_lib.make_mesh(devices=jax.devices()[:1])
  assert one.axis_names == ("data", "interventions", "fsdp")
  assert mesh_lib.batch_sharding(one).spec == jax.sharding.PartitionSpec(("data", "fsdp"))
  assert not mesh_lib.initialize_distributed()  # no coordinator variables here


def test_pretrain_help_lists_options(capsys):
  from bertjax.cli import train

  with pytest.raises(SystemExit) as e:
    train.pretrain_main(["--help"])
  assert e.value.code == 0
  out = capsys.readouterr().out
  for opt in (
    "--corpus",
    "--train-vocab",
    "--preset",
    "--config-json",
    "--init-from",
    "--objective",
    "--masking",
    "--seq-len",
    "--batch-size",
    "--grad-accum",
    "--optimizer",
    "--lr",
    "--warmup",
    "--decay",
    "--clip",
    "--weight-decay",
    "--dtype",
    "--steps",
    "--stacking",
    "--reset-moments",
    "--output-dir",
    "--checkpoint-every",
    "--keep",
    "--resume",
    "--seed",
    "--mesh-shape",
    "--scan-unroll",
    "--attention-impl",
    "(default: 0.0001)",
    "(default: nsp)",
  ):
    assert opt in out, opt


@pytest.mark.slow
def test_pretrain_main_end_to_end(setup):
  root, text, env = setup
  out = root / "cli"
  code = (
    "import sys; from bertjax.cli.train import pretrain_main; sys.exit(pretrain_main(sys.argv[1:]))"
  )
  argv = [
    "--corpus",
    str(text),
    "--corpus-format",
    "wikitext",
    "--max-lines",
    "400",
    "--vocab",
    str(root / "vocab"),
    "--preset",
    "tiny",
    "--seq-len",
    "32",
    "--batch-size",
    "8",
    "--lr",
    "1e-3",
    "--warmup",
    "3",
    "--steps",
    "16",
    "--stacking",
    "1:6,2",
    "--checkpoint-every",
    "8",
    "--output-dir",
    str(out),
    "--export-hf",
    str(out / "hf"),
    "--no-progress",
    "--scan-unroll",
    "2",
  ]
  proc = subprocess.run(
    [sys.executable, "-c", code, *argv],
    env=env,
    cwd=REPO,
    check=False,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  summary = json.loads((out / "summary.json").read_text())
  assert summary["steps"] == 16 and summary["last_checkpoint"] == 16
  assert sorted(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit()) == [8, 16]
  assert len((out / "metrics.jsonl").read_text().splitlines()) == 16
  config, params = __import__("bertjax").from_hf(out / "hf")
  assert config.num_hidden_layers == 2 and "mlm" in params


def _free_port() -> int:
  import socket

  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


@pytest.mark.slow
def test_multihost_pretrain_matches_single_process(setup):
  """`bertjax pretrain` as two processes (jax.distributed over localhost, 2 CPU devices
  each, mesh 2x2, stacking, an Orbax checkpoint) gives the single process's losses."""
  root, text, env = setup
  code = (
    "import sys; from bertjax.cli.train import pretrain_main; sys.exit(pretrain_main(sys.argv[1:]))"
  )
  common = [
    "--corpus",
    str(text),
    "--corpus-format",
    "wikitext",
    "--max-lines",
    "400",
    "--vocab",
    str(root / "vocab"),
    "--preset",
    "tiny",
    "--seq-len",
    "32",
    "--batch-size",
    "8",
    "--lr",
    "1e-3",
    "--warmup",
    "2",
    "--steps",
    "6",
    "--stacking",
    "1:3,2",
    "--checkpoint-every",
    "3",
    "--no-progress",
  ]
  single = root / "single"
  proc = subprocess.run(
    [sys.executable, "-c", code, *common, "--output-dir", str(single)],
    env=env,
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  multi = root / "multi"
  port = _free_port()
  procs = [
    subprocess.Popen(
      [sys.executable, "-c", code, *common, "--output-dir", str(multi), "--mesh-shape", "2x2"],
      env=dict(
        env,
        JAX_COORDINATOR_ADDRESS=f"localhost:{port}",
        JAX_NUM_PROCESSES="2",
        JAX_PROCESS_ID=str(i),
        XLA_FLAGS=f"--xla_force_host_platform_device_count=2 {FAST_COMPILE}",
      ),
      cwd=REPO,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for i in range(2)
  ]
  outs = [p.communicate(timeout=400) for p in procs]
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, err[-3000:]
  want = _read_losses(single / "metrics.jsonl")
  got = _read_losses(multi / "metrics.jsonl")
  assert len(got) == len(want) == 6
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  summary = json.loads((multi / "summary.json").read_text())
  assert summary["num_hidden_layers"] == 2 and summary["last_checkpoint"] == 6
  assert sorted(int(p.name) for p in (multi / "checkpoints").iterdir() if p.name.isdigit()) == [
    3,
    6,
  ]


def _read_losses(path) -> list[float]:
  return [json.loads(line)["loss"] for line in path.read_text().splitlines()]
