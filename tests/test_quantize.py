"""Dynamic int8 linear layers (`BertConfig(quantize="int8")`, `bertjax.quantize`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax import quantize as Q


def _np_quant(x, axes):
  amax = np.abs(x).max(axis=axes, keepdims=True)
  scale = np.where(amax > 0, amax * np.float32(1 / 127), np.float32(1)).astype(np.float32)
  return np.clip(np.round(x / scale), -127, 127).astype(np.int8), scale


def test_int8_matmul_equals_numpy_integer_computation():
  r = np.random.default_rng(0)
  x = (r.standard_normal((3, 7, 48)) * r.uniform(0.1, 4, (3, 7, 1))).astype(np.float32)
  w = (r.standard_normal((48, 20)) * r.uniform(0.01, 0.2, (1, 20))).astype(np.float32)
  x[1, 2] = 0.0  # an all-zero token gets scale 1 and gives 0
  qx, sx = _np_quant(x, (2,))
  qw, sw = _np_quant(w, (0,))
  acc = qx.astype(np.int64) @ qw.astype(np.int64)  # exact integers
  assert np.abs(acc).max() < 2**31
  lq, ls = Q.quantize_symmetric(jnp.asarray(x), (2,))
  np.testing.assert_array_equal(lq, qx)
  np.testing.assert_array_equal(ls, sx)
  rq, rs = Q.quantize_symmetric(jnp.asarray(w), (0,))
  np.testing.assert_array_equal(rq, qw)
  np.testing.assert_array_equal(rs, sw)
  acc_jax = jax.lax.dot_general(
    lq, jnp.asarray(qw), (((2,), (0,)), ((), ())), preferred_element_type=jnp.int32
  )
  np.testing.assert_array_equal(acc_jax, acc)
  # Dequantised in float32: equal up to the rounding of the two scale products (XLA may
  # fuse or reorder them).
  want = acc.astype(np.float32) * sx * sw
  got = jax.jit(Q.int8_matmul)(jnp.asarray(x), jnp.asarray(w))
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  assert not np.asarray(got[1, 2]).any()
  np.testing.assert_allclose(got, x @ w, atol=0.05 * np.abs(x @ w).max())
  # The int8 product is in the program: int8 operands, int32 accumulation.
  text = jax.jit(Q.int8_matmul).lower(jnp.asarray(x), jnp.asarray(w)).as_text()
  assert "xi8>" in text and "-> tensor<3x7x20xi32>" in text


def test_dense_general_contracting_two_axes():
  r = np.random.default_rng(1)
  x = r.standard_normal((2, 5, 4, 6)).astype(np.float32)  # (B, T, heads, head_dim)
  w = r.standard_normal((4, 6, 9)).astype(np.float32)  # attention output kernel
  dn = (((2, 3), (0, 1)), ((), ()))
  qx, sx = _np_quant(x, (2, 3))
  qw, sw = _np_quant(w, (0, 1))
  acc = np.einsum("btnd,ndh->bth", qx.astype(np.int64), qw.astype(np.int64))
  want = acc.astype(np.float32) * sx[:, :, 0] * sw[0]
  got = Q.int8_dot_general(jnp.asarray(x), jnp.asarray(w), dn)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  with pytest.raises(ValueError, match="no batch dimensions"):
    Q.int8_dot_general(jnp.asarray(x), jnp.asarray(x), (((3,), (3,)), ((0,), (0,))))


def test_config_rejects_unknown_mode():
  with pytest.raises(ValueError, match="quantize='int4'"):
    bertjax.BertConfig(quantize="int4")


# The int8 forward on the real MiniLM, on three sentences: at every real token the final
# hidden state has cosine >= 0.99 with float32's, the mean-pooled sentence embedding >= 0.995,
# and the relative Frobenius error is below 0.1 (measured: 0.995, 0.997, 0.074 on these
# sentences). Over more text some tokens fall below 0.99: the README states what was measured
# there (`test_readme_states_the_measured_int8_cosine`), not a bound for every token.
def test_int8_forward_within_tolerance_on_minilm(minilm_dir):
  config, params = bertjax.from_hf(minilm_dir)
  tok = bertjax.Tokenizer.from_pretrained(minilm_dir)
  batch = tok.encode(
    [
      "The keys to the cabinet are on the table.",
      "Is it raining?",
      "He did not go to the party because he was tired.",
    ]
  )
  f = jax.jit(bertjax.forward, static_argnames=("config",))
  o = f(params, config, batch.input_ids, batch.attention_mask).last_hidden_state
  q = f(
    params, config.replace(quantize="int8"), batch.input_ids, batch.attention_mask
  ).last_hidden_state
  m = np.asarray(batch.attention_mask, bool)
  a, b = np.asarray(o, np.float64), np.asarray(q, np.float64)
  assert not np.array_equal(a[m], b[m])  # the quantised path really ran
  cos = lambda u, v: (u * v).sum(-1) / np.linalg.norm(u, axis=-1) / np.linalg.norm(v, axis=-1)
  assert cos(a[m], b[m]).min() >= 0.99
  pool = lambda h: (h * m[..., None]).sum(1) / m.sum(1, keepdims=True)
  assert cos(pool(a), pool(b)).min() >= 0.995
  assert np.linalg.norm(a[m] - b[m]) / np.linalg.norm(a[m]) < 0.1
  # Parameters are unchanged: the same tree serves both modes.
  assert jax.tree.structure(params) == jax.tree.structure(bertjax.init(config, 0))


def test_readme_states_the_measured_int8_cosine(minilm_dir):
  """The manual (docs/manual.md), "Int8": the minimum cosine and the share of tokens >= 0.99 over the project's 385
  sentences, as measured here. It used to say "cosine >= 0.99 at every token", which fails
  for some tokens (22 of 4,523 here; 1 of 719 in issue #36's sentences)."""
  import pathlib
  import re

  from bertjax.tasks.sentences import load_sentences

  readme = pathlib.Path(__file__).resolve().parents[1] / "docs" / "manual.md"
  text = " ".join(readme.read_text().split())
  claim = re.search(
    r"over the project's (\d+) sentences \(([\d,]+) real tokens\) the final "
    r"states' cosine with float32's is at least ([\d.]+) at every token and at "
    r"least 0\.99 at ([\d.]+)% of them",
    text,
  )
  assert claim, "the manual's int8 sentence changed; keep it stating what this test measures"
  config, params = bertjax.from_hf(minilm_dir)
  tok = bertjax.Tokenizer.from_pretrained(minilm_dir)
  texts = [s.text for s in load_sentences()]
  f = jax.jit(bertjax.forward, static_argnames=("config",))
  cos = []
  for start in range(0, len(texts), 64):
    b = tok.encode(texts[start : start + 64])
    m = np.asarray(b.attention_mask, bool)
    a, q = (
      np.asarray(f(params, c, b.input_ids, b.attention_mask).last_hidden_state, np.float64)[m]
      for c in (config, config.replace(quantize="int8"))
    )
    cos.append((a * q).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(q, axis=-1))
  cos = np.concatenate(cos)
  assert (len(texts), cos.size) == (int(claim[1]), int(claim[2].replace(",", "")))
  assert float(claim[3]) <= cos.min() < float(claim[3]) + 0.001  # the minimum, rounded down
  assert abs(100 * np.mean(cos >= 0.99) - float(claim[4])) < 0.1
  assert cos.min() < 0.99  # so "at every token" would be false


@pytest.mark.slow
def test_int8_benchmark_smoke():
  import json
  import os
  import pathlib
  import subprocess
  import sys

  repo = pathlib.Path(__file__).resolve().parents[1]
  proc = subprocess.run(
    [sys.executable, str(repo / "benchmarks" / "bench_int8.py"), "--smoke"],
    env=dict(os.environ, JAX_PLATFORMS="cpu"),
    cwd=repo,
    check=False,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  doc = json.loads(proc.stdout[proc.stdout.index("{") :])
  assert doc["smoke"] and doc["machine"]["cpu"] and isinstance(doc["machine"]["isa_flags"], list)
  assert doc["forward"][0]["int8"]["median_s"] > 0
  assert doc["accuracy"]["accuracy_float32"] >= 0.8
  assert doc["accuracy"]["embedding_cosine_min"] > 0.99


def test_weight_bytes_count_int8_kernels_and_their_scales():
  config = bertjax.BertConfig(
    vocab_size=120,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=48,
    num_labels=5,
    use_pooler=False,
  )
  params = bertjax.init(config, 3, heads=("token_classifier",))
  h, f, n = 32, 48, bertjax.count_params(params)
  assert Q.weight_bytes(params) == 4 * n
  # Per layer: q, k, v, out (h x h, h scales each), FFN in (h x f, f scales), out (f x h, h);
  # the token classifier (h x 5, 5 scales). All else stays float32.
  kernels = 2 * (4 * h * h + 2 * h * f) + h * 5
  scales = 2 * (4 * h + f + h) + 5
  assert Q.weight_bytes(params, int8=True) == 4 * (n - kernels) + kernels + 4 * scales
