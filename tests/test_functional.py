"""The pure API: interventions, structure, bad input, numerics; checked against independent references."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference_numpy as ref  # the float64 NumPy encoder block (tests/reference_numpy.py)

import bertjax

CONFIG = bertjax.BertConfig.preset(
  "tiny",
  num_hidden_layers=3,
  vocab_size=101,
  hidden_dropout_prob=0.1,
  attention_probs_dropout_prob=0.1,
)


@pytest.fixture(scope="module")
def params():
  p = bertjax.init(CONFIG, 7, heads=("mlm", "classifier"))
  # Non-trivial LayerNorm/bias values, so a dropped bias cannot pass.
  leaves, tree = jax.tree.flatten(p)
  keys = jax.random.split(jax.random.key(1), len(leaves))
  return jax.tree.unflatten(
    tree, [x + 0.05 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
  )


def _batch(seed=0, batch=3, seq=10):
  rng = np.random.default_rng(seed)
  ids = rng.integers(1, CONFIG.vocab_size, (batch, seq)).astype(np.int32)
  mask = np.ones((batch, seq), np.int32)
  mask[1, 6:] = 0
  mask[2, 2:] = 0
  types = (np.arange(seq) >= seq // 2).astype(np.int32)[None].repeat(batch, 0) * mask
  return ids, mask, types


def test_numpy_reference_layer_matches(params):
  ids, mask, types = _batch()
  x = bertjax.embed(params, CONFIG, ids, types)
  out = bertjax.forward(
    params, CONFIG, ids, mask, types, output_hidden_states=True, output_attentions=True
  )
  h = np.asarray(x, np.float64)
  m = mask.astype(bool)
  for i in range(CONFIG.depth):
    h, probs = ref.encoder_layer(ref.layer_params(params, i), h, mask, CONFIG.layer_norm_eps)
    np.testing.assert_allclose(np.asarray(out.hidden_states[i + 1])[m], h[m], atol=2e-5)
    got = np.moveaxis(np.asarray(out.attentions[i]), 1, 2)[m]
    np.testing.assert_allclose(got, np.moveaxis(probs, 1, 2)[m], atol=2e-6)


def test_scale_zero_equals_removing_head_by_hand(params):
  ids, mask, types = _batch(1)
  layer, head = 1, 2
  xi = np.ones((CONFIG.depth, CONFIG.num_attention_heads), np.float32)
  xi[layer, head] = 0
  masked = bertjax.forward(params, CONFIG, ids, mask, types, head_mask=xi).last_hidden_state
  # Surgery: zero the head's slice of the output projection's input.
  kernel = params["encoder"]["layers"]["attention"]["output"]["kernel"]  # (L, N, D, H)
  surgery = jax.tree.map(lambda a: a, params)
  surgery["encoder"]["layers"]["attention"]["output"]["kernel"] = kernel.at[layer, head].set(0)
  cut = bertjax.forward(surgery, CONFIG, ids, mask, types).last_hidden_state
  m = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(masked)[m], np.asarray(cut)[m], atol=1e-5)
  plain = bertjax.forward(params, CONFIG, ids, mask, types).last_hidden_state
  assert np.abs(np.asarray(plain)[m] - np.asarray(cut)[m]).max() > 1e-3  # the head mattered


@pytest.mark.parametrize("ablation", ["scale", "uniform"])
def test_head_mask_matches_numpy_reference(params, ablation):
  """Fractional and zero mask values; uniform = attention replaced by a uniform map by hand."""
  ids, mask, types = _batch(2)
  rng = np.random.default_rng(3)
  xi = rng.uniform(0, 1, (CONFIG.depth, CONFIG.num_attention_heads)).astype(np.float32)
  xi[0, 1] = 0.0
  out = bertjax.forward(
    params, CONFIG, ids, mask, types, head_mask=xi, head_ablation=ablation, output_attentions=True
  )
  h = np.asarray(bertjax.embed(params, CONFIG, ids, types), np.float64)
  for i in range(CONFIG.depth):
    h, _probs = ref.encoder_layer(
      ref.layer_params(params, i),
      h,
      mask,
      CONFIG.layer_norm_eps,
      xi[i].astype(np.float64),
      ablation,
    )
  m = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(out.last_hidden_state)[m], h[m], atol=2e-5)
  if ablation == "uniform":
    # The returned map of the zeroed head is exactly uniform over real keys.
    a = np.asarray(out.attentions[0, :, 1])  # (B, Tq, Tk)
    for b in range(len(ids)):
      n = mask[b].sum()
      np.testing.assert_allclose(a[b, :n, :n], 1.0 / n, atol=1e-6)
      np.testing.assert_array_equal(a[b, :n, n:], 0.0)


def test_per_example_head_mask(params):
  ids, mask, types = _batch(4)
  rng = np.random.default_rng(5)
  xi = rng.uniform(size=(len(ids), CONFIG.depth, CONFIG.num_attention_heads)) > 0.5
  xi = xi.astype(np.float32)
  together = bertjax.forward(params, CONFIG, ids, mask, types, head_mask=xi).last_hidden_state
  for b in range(len(ids)):
    alone = bertjax.forward(
      params, CONFIG, ids[b : b + 1], mask[b : b + 1], types[b : b + 1], head_mask=xi[b]
    ).last_hidden_state
    np.testing.assert_allclose(np.asarray(together)[b], np.asarray(alone)[0], atol=1e-5)


@pytest.mark.parametrize("ablation", ["scale", "uniform"])
def test_head_mask_gradient_matches_finite_differences(params, ablation):
  """jax.grad through the head mask vs central differences, both in float64."""
  ids, mask, types = _batch(6)
  with jax.enable_x64(True):
    config = CONFIG.replace(dtype="float64")
    p64 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), params)
    direction = jax.random.normal(
      jax.random.key(0), (len(ids), ids.shape[1], CONFIG.hidden_size), jnp.float64
    )
    weight = jnp.asarray(mask, jnp.float64)[..., None] * direction

    def f(xi):
      out = bertjax.forward(p64, config, ids, mask, types, head_mask=xi, head_ablation=ablation)
      return jnp.sum(out.last_hidden_state * weight)

    xi0 = jnp.asarray(
      np.random.default_rng(7).uniform(0.3, 1.0, (CONFIG.depth, CONFIG.num_attention_heads))
    )
    grad = np.asarray(jax.jit(jax.grad(f))(xi0))
    f_jit = jax.jit(f)
    eps = 1e-5
    fd = np.zeros_like(grad)
    for idx in np.ndindex(grad.shape):
      e = np.zeros(grad.shape)
      e[idx] = eps
      fd[idx] = (float(f_jit(xi0 + e)) - float(f_jit(xi0 - e))) / (2 * eps)
  assert np.abs(fd).max() > 1e-3  # the heads matter
  rel = np.linalg.norm(grad - fd) / np.linalg.norm(fd)
  assert rel < 1e-6, rel


def test_layer_mask_skips_blocks_and_run_layers_compose(params):
  ids, mask, types = _batch(8)
  x = bertjax.embed(params, CONFIG, ids, types)
  # Skipping block 1 == running block 0, then block 2 on its output.
  skip = bertjax.forward(
    params, CONFIG, ids, mask, types, layer_mask=jnp.array([1.0, 0.0, 1.0])
  ).last_hidden_state
  h0 = bertjax.run_layers(params, CONFIG, x, mask, start=0, stop=1).last
  h2 = bertjax.run_layers(params, CONFIG, h0, mask, start=2, stop=3).last
  np.testing.assert_allclose(np.asarray(skip), np.asarray(h2), atol=1e-5)
  # Resuming from a stored prefix gives the full forward exactly.
  full = bertjax.forward(params, CONFIG, ids, mask, types).last_hidden_state
  h1 = bertjax.run_layers(params, CONFIG, h0, mask, start=1).last
  np.testing.assert_allclose(np.asarray(full), np.asarray(h1), atol=1e-6)
  ones = bertjax.forward(params, CONFIG, ids, mask, types, layer_mask=jnp.ones(3))
  np.testing.assert_allclose(np.asarray(ones.last_hidden_state), np.asarray(full), atol=1e-5)
  assert np.abs(np.asarray(skip) - np.asarray(full)).max() > 1e-2


def test_forward_jits_with_static_config_and_vmaps_over_masks(params):
  ids, mask, types = _batch(9)
  fwd = jax.jit(bertjax.forward, static_argnums=1)
  a = fwd(params, CONFIG, ids, mask, types).last_hidden_state
  b = bertjax.forward(params, CONFIG, ids, mask, types).last_hidden_state
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
  masks = jnp.stack([jnp.ones((3, 4)), jnp.ones((3, 4)).at[0, 0].set(0)])
  sweep = jax.vmap(
    lambda xi: bertjax.forward(params, CONFIG, ids, mask, types, head_mask=xi).last_hidden_state
  )(masks)
  np.testing.assert_allclose(np.asarray(sweep[0]), np.asarray(b), atol=1e-5)
  single = bertjax.forward(params, CONFIG, ids, mask, types, head_mask=masks[1])
  np.testing.assert_allclose(np.asarray(sweep[1]), np.asarray(single.last_hidden_state), atol=1e-5)


def test_scan_unroll_changes_nothing_but_the_program(params):
  # Unrolled blocks compute the same function: outputs, every hidden state, dropout draws
  # (per-block keys) and the head-mask gradient; a partial range runs with any unroll.
  ids, mask, types = _batch(11)
  key = jax.random.key(3)
  xi = jnp.ones((3, 4)).at[1, 2].set(0.5)

  def run(config):
    out = bertjax.forward(
      params,
      config,
      ids,
      mask,
      types,
      head_mask=xi,
      output_hidden_states=True,
      deterministic=False,
      rng=key,
    )
    grad = jax.grad(
      lambda m: jnp.sum(
        bertjax.forward(params, config, ids, mask, types, head_mask=m).last_hidden_state ** 2
      )
    )(xi)
    x = bertjax.embed(params, config, ids, types)
    tail = bertjax.run_layers(params, config, x, mask, start=1, stop=3)[0]
    return out.hidden_states, grad, tail

  rolled = run(CONFIG)
  # 2: a remainder block on the 3-block model; 8: more than the depth (clipped to it).
  for unroll in (2, 8):
    for a, b in zip(rolled, run(CONFIG.replace(scan_unroll=unroll))):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="scan_unroll"):
    CONFIG.replace(scan_unroll=0)


def test_dropout():
  config = CONFIG
  params = bertjax.init(config, 0)
  ids, mask, types = _batch(10)
  run = lambda key: (
    bertjax.forward(
      params, config, ids, mask, types, deterministic=False, rng=key
    ).last_hidden_state
  )
  a, b = run(jax.random.key(1)), run(jax.random.key(2))
  assert np.abs(np.asarray(a) - np.asarray(b)).max() > 1e-3
  np.testing.assert_array_equal(np.asarray(a), np.asarray(run(jax.random.key(1))))
  with pytest.raises(ValueError, match="rng"):
    bertjax.forward(params, config, ids, mask, types, deterministic=False)
  no_dropout = config.replace(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  c = bertjax.forward(
    params, no_dropout, ids, mask, types, deterministic=False, rng=jax.random.key(1)
  ).last_hidden_state
  d = bertjax.forward(params, no_dropout, ids, mask, types).last_hidden_state
  np.testing.assert_allclose(np.asarray(c), np.asarray(d), atol=1e-6)


def test_param_counts_match_published_models():
  count = lambda name, **kw: bertjax.count_params(
    jax.eval_shape(lambda: bertjax.init(bertjax.BertConfig.preset(name, **kw), 0))
  )
  assert count("bert-base") == 109_482_240  # bert-base-uncased BertModel
  assert count("bert-large") == 335_141_888  # bert-large-uncased BertModel
  assert count("albert-base") == 11_683_584  # albert-base-v2 AlbertModel
  assert count("albert-large") == 17_683_968  # albert-large-v2 AlbertModel


def test_albert_group_to_layer_rule():
  c = bertjax.BertConfig(
    model_type="albert", num_hidden_layers=12, num_hidden_groups=3, inner_group_num=2
  )
  # int(i / (12 / 3)): layers 0-3 -> group 0, 4-7 -> 1, 8-11 -> 2; 2 blocks per layer.
  assert c.layer_param_index == tuple(
    g * 2 + j for g in (0, 1, 2) for _ in range(4) for j in (0, 1)
  )
  assert c.depth == 24 and c.num_param_layers == 6


def test_hf_config_round_trip():
  for name in ("bert-base", "albert-large", "tiny"):
    config = bertjax.BertConfig.preset(name)
    again = bertjax.BertConfig.from_hf_dict(json.loads(json.dumps(config.to_hf_dict())))
    assert again == config.replace(num_hidden_groups=again.num_hidden_groups)
    assert again.layer_param_index == config.layer_param_index


def test_bfloat16_within_documented_tolerance(minilm_dir):
  """bf16 compute (float32 params, LayerNorm statistics and softmax) stays within 3% of float32."""
  config, params = bertjax.from_hf(minilm_dir)
  tok = bertjax.Tokenizer.from_pretrained(minilm_dir)
  batch = tok.encode(
    [
      "A sentence about cats and dogs.",
      "Another, much longer sentence that talks about the weather in the mountains.",
    ]
  )
  f32 = bertjax.forward(params, config, batch.input_ids, batch.attention_mask).last_hidden_state
  bf16 = bertjax.forward(
    params, config.replace(dtype="bfloat16"), batch.input_ids, batch.attention_mask
  ).last_hidden_state
  m = batch.attention_mask.astype(bool)
  a, b = np.asarray(f32)[m], np.asarray(bf16, np.float32)[m]
  rel = np.linalg.norm(a - b) / np.linalg.norm(a)
  assert rel < 3e-2, rel
  assert rel > 1e-4  # really computed in bfloat16
  cos = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
  assert cos.min() > 0.995


# Bad input --------------------------------------------------------------------


@pytest.mark.parametrize(
  "kwargs, match",
  [
    (dict(input_ids=np.array([[1, 2, 101]])), r"token ids \[101\] are outside the vocabulary"),
    (dict(input_ids=np.array([[1, -1, 2]])), r"token ids \[-1\]"),
    (dict(input_ids=np.ones((1, 129), np.int32)), "seq_len=129 must be <= max_position"),
    (dict(input_ids=np.ones((3,), np.int32)), r"must be \(batch, seq\)"),
    (dict(input_ids=np.ones((1, 3), np.float32)), "must be integers"),
    (dict(attention_mask=np.ones((1, 4))), r"attention_mask shape \(1, 4\) must equal"),
    (dict(attention_mask=np.array([[1, 1, -1]])), r"attention_mask values \[-1\] must be 0"),
    (dict(attention_mask=np.array([[1, 0.5, 0]])), r"attention_mask values \[0.5\] must be 0"),
    (dict(token_type_ids=np.array([[0, 2, 0]])), "token_type_ids in .* must lie in"),
    (dict(head_mask=np.ones((3, 5))), r"head_mask shape \(3, 5\) must be"),
    (dict(layer_mask=np.ones((2,))), r"layer_mask shape \(2,\) must be"),
    (dict(head_ablation="zero"), "head_ablation='zero' must be one of"),
  ],
)
def test_bad_input_is_named(params, kwargs, match):
  args = dict(input_ids=np.array([[1, 2, 3]], np.int32))
  args.update(kwargs)
  ids = args.pop("input_ids")
  with pytest.raises(ValueError, match=match):
    bertjax.forward(params, CONFIG, ids, **args)


def test_bad_config_and_checkpoint(tmp_path):
  with pytest.raises(ValueError, match="model_type='gpt2'"):
    bertjax.BertConfig.from_hf_dict({"model_type": "gpt2"})
  with pytest.raises(ValueError, match="divisible"):
    bertjax.BertConfig(hidden_size=100, num_attention_heads=12)
  with pytest.raises(ValueError, match="no layer sharing"):
    bertjax.BertConfig(num_hidden_groups=1)
  with pytest.raises(ValueError, match="preset"):
    bertjax.BertConfig.preset("bert-huge")
  # A checkpoint with a missing, an unexpected and a mis-shaped tensor: all listed.
  config = bertjax.BertConfig.preset("tiny")
  bertjax.to_hf(config, bertjax.init(config, 0), tmp_path)
  from safetensors.numpy import load_file, save_file

  state = load_file(tmp_path / "model.safetensors")
  del state["encoder.layer.1.output.dense.bias"]
  state["encoder.layer.0.extra.weight"] = np.ones(3, np.float32)
  state["pooler.dense.weight"] = np.ones((5, 5), np.float32)
  save_file(state, tmp_path / "model.safetensors")
  with pytest.raises(ValueError) as e:
    bertjax.from_hf(tmp_path)
  msg = str(e.value)
  assert "missing (1): ['bert.encoder.layer.1.output.dense.bias']" in msg
  assert "unexpected (1): ['bert.encoder.layer.0.extra.weight']" in msg
  assert "bert.pooler.dense.weight: (5, 5) != expected (64, 64)" in msg
  with pytest.raises(ValueError, match="no 'mlm' head"):
    bertjax.mlm_logits(bertjax.init(config, 0), config, jnp.zeros((1, 2, 64)))


# Tokenizer alignment ----------------------------------------------------------


def test_tokenizer_word_alignment(minilm_dir):
  tok = bertjax.Tokenizer.from_pretrained(minilm_dir)
  words = [["Unbelievably", ",", "the", "tokenization", "worked", "."], ["Hi"]]
  batch = tok.encode_words(words)
  assert batch.input_ids.shape[0] == 2
  assert batch.input_ids[0, 0] == tok.cls_id and batch.word_ids[0, 0] == -1
  spans = batch.word_spans(0)
  assert len(spans) == len(words[0])
  for (start, end), word in zip(spans, words[0]):
    pieces = tok.convert_ids_to_tokens(batch.input_ids[0, start:end])
    assert "".join(p.removeprefix("##") for p in pieces) == word.lower()
  assert any(end - start > 1 for start, end in spans)  # some words split into several subwords
  first = batch.first_subword()
  assert first[0].tolist() == [s for s, _ in spans]
  assert first[1, 0] == 1 and (first[1, 1:] == -1).all()
  assert batch.attention_mask[1].sum() == 3  # [CLS] hi [SEP]
  with pytest.raises(ValueError, match="max_length=4"):
    tok.encode(["a rather long sentence indeed"], max_length=4)


@pytest.mark.hf
def test_albert_sentencepiece_tokenizer_matches_transformers(tmp_path, data_dir):
  """A SentencePiece model trained here; ids and word alignment as transformers' AlbertTokenizer."""
  spm = pytest.importorskip("sentencepiece")
  transformers = pytest.importorskip("transformers")
  lines = (data_dir / "tinyshakespeare" / "input.txt").read_text().splitlines()[:3000]
  (tmp_path / "corpus.txt").write_text("\n".join(t for t in lines if t.strip()))
  spm.SentencePieceTrainer.train(
    input=str(tmp_path / "corpus.txt"),
    model_prefix=str(tmp_path / "spiece"),
    vocab_size=500,
    user_defined_symbols=["[CLS]", "[SEP]", "[MASK]"],
    pad_id=0,
    unk_id=1,
    bos_id=-1,
    eos_id=-1,
    pad_piece="<pad>",
    unk_piece="<unk>",
    minloglevel=2,
  )
  tok = bertjax.Tokenizer.from_pretrained(tmp_path)
  text = ["First Citizen: before we proceed any further, hear me speak.", "All: Speak, speak."]
  ours = tok.encode(text)
  theirs = transformers.AlbertTokenizer.from_pretrained(str(tmp_path))(text)["input_ids"]
  for row, ids in zip(ours.input_ids, theirs):
    assert row[: len(ids)].tolist() == ids
  assert tok.pad_id == 0 and tok.mask_id is not None
  words = tok.encode_words([["First", "Citizen", "speaks"]])
  spans = words.word_spans(0)
  assert len(spans) == 3 and spans[0][0] == 1 and any(e - s > 1 for s, e in spans)


def test_checked_forward_raises_under_jit_what_eager_raises(params):
  ids = np.array([[1, 2, 3]], np.int32)
  got = bertjax.checked_forward(params, CONFIG, ids, output_hidden_states=True)
  np.testing.assert_allclose(
    got.hidden_states,
    bertjax.forward(params, CONFIG, ids, output_hidden_states=True).hidden_states,
    atol=1e-6,
  )
  with pytest.raises(ValueError, match=r"token ids in \[1, 101\] are outside the vocabulary"):
    bertjax.checked_forward(params, CONFIG, np.array([[1, 2, 101]], np.int32))
  with pytest.raises(ValueError, match=r"token_type_ids in \[0, 5\] must lie in"):
    bertjax.checked_forward(params, CONFIG, ids, token_type_ids=np.array([[0, 5, 0]]))
  # Unchecked under the user's jit, an out-of-range id gives NaN (documented).
  jitted = jax.jit(lambda i: bertjax.forward(params, CONFIG, i).last_hidden_state)
  assert np.isnan(np.asarray(jitted(np.array([[1, 2, 101]], np.int32)))).any()


def test_broken_files_are_named(tmp_path):
  """A truncated model.safetensors, a broken config.json and a file given for a model
  directory are errors that name the file, not raw library errors."""
  config = bertjax.BertConfig.preset("tiny")
  bertjax.to_hf(config, bertjax.init(config, 0), tmp_path)
  weights = tmp_path / "model.safetensors"
  with pytest.raises(FileNotFoundError, match="is a file; a model is its folder"):
    bertjax.from_hf(tmp_path / "config.json")
  weights.write_bytes(weights.read_bytes()[:1000])
  with pytest.raises(ValueError, match=f"{weights} cannot be read as safetensors"):
    bertjax.from_hf(tmp_path)
  (tmp_path / "config.json").write_text('{"model_type": "bert", ')
  with pytest.raises(ValueError, match="config.json is not valid JSON"):
    bertjax.from_hf(tmp_path)


def test_checked_forward_names_bad_attention_mask_values(params):
  with pytest.raises(ValueError, match="attention_mask values in .* must be 0"):
    bertjax.checked_forward(
      params, CONFIG, np.array([[1, 2, 3]], np.int32), np.array([[1, 1, -1]], np.int32)
    )
