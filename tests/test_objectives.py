"""Objectives as components: MLM/NSP/SOP bitwise as before, SpanBERT's SBO, StructBERT's
word order, ELECTRA (RTD against transformers, export, kill and resume)."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference_numpy as ref  # float64 NumPy LayerNorm and GELU (tests/reference_numpy.py)
from conftest import CHEAP_COMPILE, FAST_COMPILE

import bertjax
from bertjax.data import corpus as C
from bertjax.data import pretraining as P
from bertjax.data import pretraining_examples as PE
from bertjax.training import electra as E
from bertjax.training import objectives as O
from bertjax.training import span_objectives as S
from bertjax.training import step as St
from bertjax.training.loop import init_for_objectives

REPO = pathlib.Path(__file__).resolve().parents[1]
SMOKE_TEXT = REPO / "bertjax" / "resources" / "smoke" / "wikitext2_tokens" / "valid.txt"


def _tiny(model_type="bert", **kw):
  extra = {"embedding_size": 16} if model_type == "albert" else {}
  extra.update(kw)
  return bertjax.BertConfig.preset(
    f"{model_type}-base",
    num_hidden_layers=2,
    hidden_size=32,
    num_attention_heads=4,
    intermediate_size=64,
    vocab_size=97,
    max_position_embeddings=32,
    **extra,
  )


def _batch(objective, seed=0, b=4, t=16, p=4, vocab=97):
  r = np.random.default_rng(seed)
  ids = r.integers(5, vocab, (b, t)).astype(np.int32)
  mask = np.ones((b, t), np.int32)
  mask[1, 12:] = 0
  mask[3, 9:] = 0
  types = np.zeros((b, t), np.int32)
  types[:, 8:] = 1
  pos = np.stack([np.sort(r.choice(np.arange(1, 8), p, replace=False)) for _ in range(b)])
  w = np.ones((b, p), np.float32)
  w[2, 3] = 0
  w[0, 2:] = 0
  out = {
    "input_ids": ids,
    "attention_mask": mask,
    "token_type_ids": types,
    "mlm_positions": pos.astype(np.int32),
    "mlm_ids": r.integers(5, vocab, (b, p)).astype(np.int32),
    "mlm_weights": w,
  }
  if objective == "nsp":
    out["next_sentence_labels"] = r.integers(0, 2, b).astype(np.int32)
  if objective == "sop":
    out["sop_labels"] = r.integers(0, 2, b).astype(np.int32)
  return out


# Recorded with the committed string-matched step (HEAD before the objectives refactor,
# `git show a98095f:bertjax/training/step.py`) on exactly these models and batches:
# (model_type, objective, accumulation_steps, deterministic) -> (metrics, grad global norm).
# When the model's LayerNorm became two-pass with matrix-vector row sums on the CPU and its
# GELU took PyTorch's erf formula (bertjax/model.py), every metric kept its bits and the two
# MLM-only gradient norms moved by one ulp (0x1.58d712p+1 -> 0x1.58d710p+1 and
# 0x1.4fc836p+1 -> 0x1.4fc838p+1); those two are re-recorded with the new model.
# When the block became data (bertjax/model/: norms, projections and the attention scale
# as the family's row says), every metric again kept its bits and two gradient norms moved
# by one ulp (ALBERT sop k=1: 0x1.35c868p+1 -> 0x1.35c866p+1; BERT MLM-only k=1:
# 0x1.58d710p+1 -> 0x1.58d712p+1); those two are re-recorded.
# Four of the six recorded cases are kept (each compiles for ~13 s under XLA's default
# options): every objective, accumulation 1 and 2, deterministic and not; BERT NSP with 2
# steps and BERT MLM-only with 1 step were dropped.
BEFORE = {
  ("bert", "nsp", 1, True): (
    {
      "loss": "0x1.533bac0000000p+2",
      "mlm_loss": "0x1.2702140000000p+2",
      "nsp_accuracy": "0x1.8000000000000p-1",
      "nsp_loss": "0x1.61ccbe0000000p-1",
    },
    "0x1.5a1b240000000p+1",
  ),
  ("albert", "sop", 1, True): (
    {
      "loss": "0x1.50d36c0000000p+2",
      "mlm_loss": "0x1.2463be0000000p+2",
      "sop_accuracy": "0x1.0000000000000p-1",
      "sop_loss": "0x1.637d700000000p-1",
    },
    "0x1.35c8660000000p+1",
  ),
  ("albert", "sop", 2, False): (
    {
      "loss": "0x1.50f7580000000p+2",
      "mlm_loss": "0x1.2463be0000000p+2",
      "sop_accuracy": "0x1.0000000000000p-1",
      "sop_loss": "0x1.649cca0000000p-1",
    },
    "0x1.3590bc0000000p+1",
  ),
  ("bert", "none", 2, False): (
    {"loss": "0x1.2781480000000p+2", "mlm_loss": "0x1.2781480000000p+2"},
    "0x1.4fc8380000000p+1",
  ),
}


@pytest.mark.slow
def test_mlm_nsp_sop_losses_bitwise_as_before_components():
  """BEFORE was recorded under XLA's default CPU options; `import bertjax` changes one of
  them (bertjax/xla_options.py), which moves some sums by an ulp, and the suite compiles
  cheaply (conftest). So the bits are checked in a process that keeps XLA's defaults, for
  every recorded case."""
  from bertjax import xla_options

  flags = xla_options.without_cpu_options(os.environ.get("XLA_FLAGS", ""))
  flags = " ".join(f for f in flags.split() if f not in CHEAP_COMPILE.split())
  # BERTJAX_TEST_XLA: importing test_objectives imports conftest, which would add them back.
  env = {
    **os.environ,
    xla_options.OPT_OUT: "0",
    "XLA_FLAGS": flags,
    "BERTJAX_TEST_XLA": "default",
    "JAX_DISABLE_MOST_OPTIMIZATIONS": "0",
  }
  code = (
    "import sys; sys.path.insert(0, 'tests'); import test_objectives as t\n"
    "for key in t.BEFORE: t.check_bitwise_as_before(key)\nprint('ok', len(t.BEFORE))"
  )
  run = subprocess.run(
    [sys.executable, "-c", code],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=900,
    check=False,
  )
  assert run.returncode == 0 and f"ok {len(BEFORE)}" in run.stdout, run.stderr[-3000:]


def _ulps(value, recorded: str) -> int:
  """How many float32 steps apart `value` and a recorded float's hex are."""
  a, b = np.float32(value), np.float32(float.fromhex(recorded))
  return abs(int(a.view(np.int32)) - int(b.view(np.int32)))


def check_bitwise_as_before(key):
  """The string-matched and the component objectives give BEFORE's bits for one case."""
  import optax

  model_type, objective, k, det = key
  cfg = _tiny(model_type)
  heads = ("mlm",) + ((objective,) if objective != "none" else ())
  params = bertjax.init(cfg, 0, heads)
  assert O.heads_of(O.resolve(objective)) == heads
  f = St.make_loss_and_grad(cfg, objective=objective, accumulation_steps=k, deterministic=det)
  _, metrics, grads = jax.jit(f)(params, _batch(objective), jax.random.key(3))
  expected, grad_norm = BEFORE[key]
  for name, value in expected.items():
    assert float(metrics[name]).hex() == value, name
  # The gradient's norm, within one float32 ulp: XLA:CPU's backward code depends on the ISA.
  # BEFORE was recorded on an Intel Sapphire Rapids; on an AMD Zen 4 two cases (albert/sop/1
  # and bert/none/1, since dropped) land one ulp away, while every metric keeps its bits.
  assert _ulps(optax.global_norm(grads), grad_norm) <= 1, (key, grad_norm)
  # The same objectives given as components (with a weight of 1) give the same bits.
  comps = (O.MaskedLM(),) + ((O.SentencePair(objective),) if objective != "none" else ())
  f2 = St.make_loss_and_grad(cfg, objective=comps, accumulation_steps=k, deterministic=det)
  _, metrics2, _ = jax.jit(f2)(params, _batch(objective), jax.random.key(3))
  assert float(metrics2["loss"]).hex() == expected["loss"]


def test_weights_and_errors():
  cfg = _tiny()
  params = bertjax.init(cfg, 0, ("mlm", "nsp"))
  batch = _batch("nsp")
  f = lambda objs: jax.jit(St.make_loss_and_grad(cfg, objective=objs, deterministic=True))(
    params, batch, jax.random.key(0)
  )[1]
  m = f((O.MaskedLM(weight=0.5), O.SentencePair("nsp", weight=2.0)))
  np.testing.assert_allclose(m["loss"], 0.5 * m["mlm_loss"] + 2.0 * m["nsp_loss"], rtol=1e-6)
  with pytest.raises(ValueError, match="unknown names \\['foo'\\]"):
    O.resolve("mlm+foo")
  with pytest.raises(ValueError, match="term 'mlm' comes from two objectives"):
    O.resolve((O.MaskedLM(), O.MaskedLM()))
  with pytest.raises(ValueError, match="missing \\['span_left', 'span_right'\\]"):
    f((O.MaskedLM(), S.SpanBoundary()))


# SpanBERT and StructBERT ------------------------------------------------------------------


def _np_ce(logits, ids, w):
  logits = logits - logits.max(-1, keepdims=True)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  ce = -np.take_along_axis(logp, ids[..., None], -1)[..., 0]
  return (ce * w).sum() / w.sum()


@pytest.fixture(scope="module")
def smoke_corpus():
  tok = C.load_tokenizer(bertjax.minilm_path() / "vocab.txt")
  return C.load_corpus(SMOKE_TEXT, tok, format="wikitext")


def test_span_boundaries_and_word_order_batches(smoke_corpus):
  pc = PE.PretrainingConfig(max_seq_len=48, objective="none", masking="span", mask_prob=0.2)
  it = P.WordOrderIterator(smoke_corpus, pc, batch_size=8, seed=1, word_order_prob=0.15)
  plain = P.PretrainingIterator(smoke_corpus, pc, batch_size=8, seed=1)
  special = [smoke_corpus.special_ids[t] for t in C.SPECIAL_TOKENS]
  for step in range(3):
    b, ref = it.batch(step), plain.batch(step)
    for key in ("mlm_positions", "mlm_ids", "span_left", "span_right"):
      np.testing.assert_array_equal(b[key], ref[key])
    assert it.num_word_order_slots == 9 and b["word_order_positions"].shape == (8, 9)
    for r in range(8):
      live = ref["mlm_weights"][r] > 0
      pos, left, right = (ref[k][r][live] for k in ("mlm_positions", "span_left", "span_right"))
      masked = set(pos.tolist())
      # Each prediction's boundaries enclose exactly its span, a run of masked positions.
      for l_, r_ in set(zip(left.tolist(), right.tolist(), strict=True)):
        assert l_ >= 0 and r_ < 48
        np.testing.assert_array_equal(pos[(left == l_) & (right == r_)], np.arange(l_ + 1, r_))
      wl = b["word_order_weights"][r] > 0
      wpos, wids = b["word_order_positions"][r][wl], b["word_order_ids"][r][wl]
      assert len(wpos) % 3 == 0 and not (set(wpos.tolist()) & masked)
      np.testing.assert_array_equal(wids, ref["input_ids"][r][wpos])  # the original tokens
      for s in range(0, len(wpos), 3):
        tri = wpos[s : s + 3]
        assert tri[2] - tri[0] == 2 and not np.isin(wids[s : s + 3], special).any()
        assert sorted(b["input_ids"][r][tri]) == sorted(wids[s : s + 3])  # a permutation
      other = np.setdiff1d(np.arange(48), wpos)
      np.testing.assert_array_equal(b["input_ids"][r][other], ref["input_ids"][r][other])
  moved = sum(
    (b["input_ids"] != ref["input_ids"]).sum()
    for b, ref in [(it.batch(s), plain.batch(s)) for s in range(3)]
  )
  assert moved > 0
  state = it.state()
  again = P.WordOrderIterator(smoke_corpus, pc, batch_size=8, seed=1, word_order_prob=0.15)
  again.set_state(state)
  with pytest.raises(ValueError, match="word_order_prob"):
    P.WordOrderIterator(smoke_corpus, pc, batch_size=8, seed=1, word_order_prob=0.1).set_state(
      state
    )


def _spm_batch(smoke_corpus):
  pc = PE.PretrainingConfig(max_seq_len=32, objective="none", masking="span", mask_prob=0.2)
  it = P.WordOrderIterator(smoke_corpus, pc, batch_size=4, seed=0, word_order_prob=0.2)
  return it.batch(0)


def test_sbo_and_word_order_losses_match_numpy(smoke_corpus):
  batch = _spm_batch(smoke_corpus)
  cfg = bertjax.BertConfig(
    vocab_size=smoke_corpus.vocab_size,
    hidden_size=24,
    num_hidden_layers=2,
    num_attention_heads=3,
    intermediate_size=48,
    max_position_embeddings=64,
  )
  objs = O.resolve("mlm+sbo+word_order")
  params = init_for_objectives(cfg, 0, objs)
  params["sbo"] = jax.tree.map(
    lambda a: a + 0.1 * jax.random.normal(jax.random.key(5), a.shape), params["sbo"]
  )  # non-trivial LayerNorms and biases
  f = jax.jit(St.make_loss_and_grad(cfg, objective=objs, deterministic=True))
  _, m, grads = f(params, batch, jax.random.key(0))
  assert float(jnp.abs(grads["sbo"]["position_embeddings"]).sum()) > 0

  h = np.asarray(
    bertjax.forward(
      params, cfg, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]
    ).last_hidden_state,
    np.float64,
  )
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  word = p["embeddings"]["word_embeddings"]["embedding"]
  rows = np.arange(4)[:, None]
  pos, left, right = batch["mlm_positions"], batch["span_left"], batch["span_right"]
  sbo = p["sbo"]
  x = np.concatenate(
    [h[rows, left], h[rows, right], sbo["position_embeddings"][pos - left - 1]], -1
  )
  eps = cfg.layer_norm_eps
  hh = ref.layer_norm(
    ref.gelu(x @ sbo["dense1"]["kernel"] + sbo["dense1"]["bias"]), sbo["ln1"], eps
  )
  y = ref.layer_norm(
    ref.gelu(hh @ sbo["dense2"]["kernel"] + sbo["dense2"]["bias"]), sbo["ln2"], eps
  )
  want = _np_ce(y @ word.T + sbo["bias"], batch["mlm_ids"], batch["mlm_weights"])
  np.testing.assert_allclose(m["sbo_loss"], want, rtol=1e-5)

  mh = p["mlm"]  # BERT's MLM head: dense, GELU, LayerNorm, tied decoder + bias
  wpos = batch["word_order_positions"]
  t = ref.layer_norm(
    ref.gelu(h[rows, wpos] @ mh["dense"]["kernel"] + mh["dense"]["bias"]), mh["LayerNorm"], eps
  )
  want = _np_ce(t @ word.T + mh["bias"], batch["word_order_ids"], batch["word_order_weights"])
  np.testing.assert_allclose(m["word_order_loss"], want, rtol=1e-5)


# ELECTRA ----------------------------------------------------------------------------------


def _electra_configs(vocab=97, embed=16):
  disc = bertjax.BertConfig(
    model_type="electra",
    vocab_size=vocab,
    embedding_size=embed,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=32,
  )
  gen = disc.replace(hidden_size=16, num_attention_heads=2, intermediate_size=32)
  return gen, disc


def test_electra_shares_embeddings_and_samples_inside_the_step():
  gen, disc = _electra_configs()
  params = E.init_electra(gen, disc, 0)
  assert set(E.shared_tables(gen, disc)) == set(E.SHARED_TABLES)
  assert set(params["generator"]["embeddings"]) == {"LayerNorm"}
  assert E.shared_tables(gen.replace(embedding_size=8), disc) == ()
  el = E.Electra(gen)
  batch = _batch("none", p=4)
  f = jax.jit(St.make_loss_and_grad(disc, objective=(el,), deterministic=False))
  loss, m, grads = f(params, batch, jax.random.key(1))
  np.testing.assert_allclose(loss, m["mlm_loss"] + 50 * m["rtd_loss"], rtol=1e-6)
  # The shared word embeddings learn from both models' losses.
  gm = jax.jit(
    St.make_loss_and_grad(disc, objective=(E.Electra(gen, rtd_weight=0.0),), deterministic=False)
  )(params, batch, jax.random.key(1))[2]
  w = lambda g: g["discriminator"]["embeddings"]["word_embeddings"]["embedding"]
  assert float(jnp.abs(w(gm)).sum()) > 0 and not np.allclose(w(gm), w(grads))
  run = jax.jit(el.run, static_argnums=(1, 4))(params, disc, batch, jax.random.key(7), True)
  live = batch["mlm_weights"] > 0
  rows = np.nonzero(live)[0]
  np.testing.assert_array_equal(
    np.asarray(run["original"])[rows, batch["mlm_positions"][live]], batch["mlm_ids"][live]
  )
  np.testing.assert_array_equal(
    np.asarray(run["corrupted"])[rows, batch["mlm_positions"][live]],
    np.asarray(run["sampled"])[live],
  )
  sel = np.zeros(batch["input_ids"].shape, bool)
  sel[rows, batch["mlm_positions"][live]] = True
  np.testing.assert_array_equal(np.asarray(run["corrupted"])[~sel], batch["input_ids"][~sel])
  np.testing.assert_array_equal(run["labels"], np.asarray(run["corrupted"] != run["original"]))
  again = jax.jit(el.run, static_argnums=(1, 4))(params, disc, batch, jax.random.key(8), True)
  assert not np.array_equal(again["sampled"], run["sampled"])  # drawn with the step's key


@pytest.mark.hf
def test_rtd_loss_matches_transformers_and_export_loads_strict(tmp_path):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  gen, disc = _electra_configs()
  params = E.init_electra(gen, disc, 0)
  params = jax.tree.map(lambda a: a + 0.02 * jax.random.normal(jax.random.key(2), a.shape), params)
  el = E.Electra(gen)
  batch = _batch("none", p=4)
  metrics = jax.jit(St.make_loss_and_grad(disc, objective=(el,), deterministic=True))(
    params, batch, jax.random.key(4)
  )[1]
  run = el.run(params, disc, batch, jax.random.key(4), True)
  labels = np.asarray(run["labels"])
  assert 0 < labels.sum() < labels.size
  gen_dir, disc_dir = E.save_electra(params, gen, disc, tmp_path)
  d = transformers.ElectraForPreTraining.from_pretrained(disc_dir).eval()
  g = transformers.ElectraForMaskedLM.from_pretrained(gen_dir).eval()
  for model, d_ in ((d, disc_dir), (g, gen_dir)):  # strict keys: nothing missing or unexpected
    _, info = type(model).from_pretrained(d_, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
  t = lambda a: torch.tensor(np.asarray(a), dtype=torch.long)
  with torch.no_grad():
    hf = d(
      input_ids=t(run["corrupted"]),
      attention_mask=t(batch["attention_mask"]),
      token_type_ids=t(batch["token_type_ids"]),
      labels=t(labels),
    )
  np.testing.assert_allclose(float(metrics["rtd_loss"]), float(hf.loss), rtol=1e-5)
  real = batch["attention_mask"] > 0  # padding positions are not compared (nor in the loss)
  np.testing.assert_allclose(
    np.asarray(run["rtd_logits"])[real], hf.logits.numpy()[real], atol=1e-5
  )
  # The generator's export carries the shared tables: its MLM logits match ours.
  full = E.generator_params(params, gen, disc)
  ours = bertjax.head_logits(
    full, gen, bertjax.forward(full, gen, batch["input_ids"], batch["attention_mask"]), "mlm"
  )
  with torch.no_grad():
    theirs = g(input_ids=t(batch["input_ids"]), attention_mask=t(batch["attention_mask"])).logits
  np.testing.assert_allclose(np.asarray(ours)[real], theirs.numpy()[real], atol=1e-4)


RUNNER = textwrap.dedent("""
    import json, sys, time
    import bertjax
    from bertjax.data import corpus as C, pretraining as P, pretraining_examples as PE
    from bertjax.training import electra as E, loop

    args = json.loads(sys.argv[1])
    tok = C.load_tokenizer(bertjax.minilm_path() / "vocab.txt")
    corpus = C.load_corpus(args["text"], tok, format="wikitext")
    pc = PE.PretrainingConfig(max_seq_len=24, objective="none", mask_token_prob=1.0,
                             random_token_prob=0.0)

    class Data(P.PretrainingIterator):
      def batch(self, step):
        if args.get("slow_after") is not None and step >= args["slow_after"]:
          time.sleep(0.5)
        return super().batch(step)

    data = Data(corpus, pc, batch_size=4, seed=0)
    if args.get("family") == "deberta-v2":  # DeBERTa-v3's RTD with GDES: half the depth
      disc = bertjax.BertConfig.for_family(
          "deberta-v2", vocab_size=corpus.vocab_size, hidden_size=32, num_hidden_layers=2,
          num_attention_heads=4, intermediate_size=64, max_position_embeddings=32,
          position_buckets=8, max_relative_positions=16, type_vocab_size=0, use_pooler=False)
      gen = disc.replace(num_hidden_layers=1)
    else:
      disc = bertjax.BertConfig(model_type="electra", vocab_size=corpus.vocab_size,
                                embedding_size=16, hidden_size=32, num_hidden_layers=2,
                                num_attention_heads=4, intermediate_size=64,
                                max_position_embeddings=32)
      gen = disc.replace(hidden_size=16, num_attention_heads=2, intermediate_size=32)
    train = loop.TrainConfig(steps=args["steps"], batch_size=4, learning_rate=1e-3,
                             output_dir=args["out"], checkpoint_every=2, progress=False)
    summary = loop.pretrain(disc, data, train, resume=args.get("resume", False),
                            objective=E.Electra(gen))
    summary.pop("history")
    print("SUMMARY " + json.dumps(summary))
""")


def _records(out):
  return [
    (r["step"], r["loss"], r["mlm_loss"], r["rtd_loss"])
    for r in map(json.loads, (pathlib.Path(out) / "metrics.jsonl").read_text().splitlines())
  ]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["electra", "deberta-v2"])
def test_electra_kill_and_resume_is_bitwise(tmp_path, family):
  """ELECTRA, and DeBERTa-v3's RTD with GDES (the residual tables in the checkpoint)."""
  (tmp_path / "runner.py").write_text(RUNNER)
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    HF_HUB_OFFLINE="1",
    JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax_cache"),
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    XLA_FLAGS=FAST_COMPILE,
  )

  def run(**kw):
    args = {"text": str(SMOKE_TEXT), "steps": 8, "family": family, **kw}
    proc = subprocess.run(
      [sys.executable, str(tmp_path / "runner.py"), json.dumps(args)],
      env=env,
      cwd=REPO,
      check=False,
      capture_output=True,
      text=True,
      timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.split("SUMMARY ", 1)[1])

  run(out=str(tmp_path / "ref"))
  ref = _records(tmp_path / "ref")
  assert [r[0] for r in ref] == list(range(1, 9))
  killed = tmp_path / "killed"
  args = {
    "text": str(SMOKE_TEXT),
    "steps": 8,
    "out": str(killed),
    "slow_after": 3,
    "family": family,
  }
  proc = subprocess.Popen(
    [sys.executable, str(tmp_path / "runner.py"), json.dumps(args)],
    env=env,
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
  )
  deadline = time.time() + 240
  while not (killed / "checkpoints" / "2").is_dir():
    assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
    assert time.time() < deadline, "no checkpoint appeared"
    time.sleep(0.1)
  time.sleep(1.0)
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  assert proc.returncode == -signal.SIGKILL
  assert 2 <= len(_records(killed)) < 8
  summary = run(out=str(killed), resume=True)
  assert summary["resumed_from"] in (2, 4, 6) and summary["steps"] == 8
  assert _records(killed) == ref  # bitwise: JSON keeps every bit of a float
