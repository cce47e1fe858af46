"""Everything downstream of the encoder on ModernBERT, EuroBERT, MPNet, NomicBERT, DeBERTa,
UltraBERT, EmbeddingGemma, NeoBERT.

Each family gets a random model (ModernBERT with a 4-token window in two of three layers,
EuroBERT with grouped key/value heads) with an MLM head, saved with `to_hf` beside a
tokenizer trained here in the family's own files: a byte-level BPE `tokenizer.json` for
ModernBERT (`[CLS] A [SEP]`) and EuroBERT (`<|begin_of_text|> A <|end_of_text|>`), WordPiece
`vocab.txt` for MPNet (its `<s> A </s></s> B </s>` template) and NomicBERT, SentencePiece
`spm.model` for DeBERTa-v3 (disentangled statistics, log buckets, shared keys). The checks of
`test_families_downstream` run on each: sweeps equal loops of masked forwards, importance is
the mask gradient, pruning equals masking, Clark's statistics on both paths equal NumPy on
the maps (windows included), word features align to transformers' subwords, cloze and PLL
come from the MLM head (EmbeddingGemma has none: its importance reads each token's
reconstruction through the tied embeddings, its gradients and patching a probe on the final
states, and cloze refuses it); then token attribution (norm analysis and ALTI decompose pre-norm
blocks, GlobEnc refuses them by family, integrated gradients is complete), attribution
patching against exact patching, and, in subprocesses, `finetune`, an experiment and the
report on ModernBERT.
"""

import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pyrunner
import pytest
from conftest import FAST_COMPILE
from test_families_downstream import SENTENCES, _mlm_batches, _pairs, _texts, _ud

import bertjax
from bertjax.analysis.attention import statistics
from bertjax.analysis.attribution import gradients, propagation
from bertjax.analysis.interventions import ablation, metrics, patching
from bertjax.analysis.representations import cloze, features
from bertjax.kernels import ABLATIONS

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

pytestmark = pytest.mark.hf

REPO = pathlib.Path(__file__).resolve().parents[1]
FAMILIES = (
  "modernbert",
  "eurobert",
  "mpnet",
  "nomic_bert",
  "deberta-v2",
  "ultrabert",
  "gemma3_text",
  "neobert",
)
SIZES = dict(
  hidden_size=40,
  num_hidden_layers=3,
  num_attention_heads=5,
  intermediate_size=48,
  initializer_range=0.3,
  max_position_embeddings=128,
)
EXTRA = {
  "modernbert": dict(
    sliding_window=4,
    norm_bias=True,
    layer_types=("full_attention", "sliding_attention", "sliding_attention"),
  ),
  "eurobert": dict(
    num_attention_heads=4, num_key_value_heads=2, hidden_size=48, classifier_pooling="mean"
  ),
  "ultrabert": dict(
    num_attention_heads=4,
    num_key_value_heads=2,
    hidden_size=48,
    sliding_window=4,
    layer_types=("sliding_attention", "full_attention", "sliding_attention"),
    classifier_pooling="mean",
    prediction_head_size=20,
  ),
  "gemma3_text": dict(
    num_attention_heads=4,
    num_key_value_heads=2,
    hidden_size=48,
    sliding_window=4,
    layer_types=("sliding_attention", "full_attention", "sliding_attention"),
    query_pre_attn_scalar=10,
  ),
  "mpnet": dict(pad_token_id=1, max_position_embeddings=130, type_vocab_size=0),
  "nomic_bert": dict(),
  "neobert": dict(intermediate_size=72),  # a SwiGLU 48 wide
  "deberta-v2": dict(
    relative_attention=True,
    pos_att_type=("p2c", "c2p"),
    position_buckets=8,
    max_relative_positions=64,
    share_att_key=True,
    norm_rel_ebd="layer_norm",
    position_biased_input=False,
    type_vocab_size=0,
    # Three score terms: at 0.3 the logits are so peaked that attribution
    # patching's linearisation breaks down (Pearson -0.40 against exact
    # patching; 0.99997 with every matrix scaled by 0.3).
    initializer_range=0.15,
  ),
}
SPECIALS = {
  "modernbert": ("[CLS]", "[SEP]", "[MASK]"),
  "eurobert": ("<|begin_of_text|>", "<|end_of_text|>", "<|mask|>"),
  "ultrabert": ("<s>", "</s>", "<mask>"),
  "gemma3_text": ("<bos>", "<eos>", "<mask>"),
  "mpnet": ("<s>", "</s>", "<mask>"),
  "nomic_bert": ("[CLS]", "[SEP]", "[MASK]"),
  "neobert": ("[CLS]", "[SEP]", "[MASK]"),
  "deberta-v2": ("[CLS]", "[SEP]", "[MASK]"),
}
CLASSES = {
  "modernbert": "ModernBertForSequenceClassification",
  "eurobert": "EuroBertForSequenceClassification",
  "ultrabert": "UltrabertForSequenceClassification",
}


def _byte_level(texts, specials, single, pair, roles):
  from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors, trainers

  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(
    texts,
    trainers.BpeTrainer(
      vocab_size=700,
      special_tokens=specials,
      show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    ),
  )
  tok.post_processor = processors.TemplateProcessing(
    single=single,
    pair=pair,
    special_tokens=[(t, tok.token_to_id(t)) for t in (roles["cls"], roles["sep"])],
  )
  tok.add_special_tokens([AddedToken(roles["mask"], lstrip=True, normalized=False)])
  return tok


def _build(family: str, directory: pathlib.Path, texts) -> pathlib.Path:
  """A random model with an MLM head and a tokenizer in the family's own files."""
  directory.mkdir(parents=True)
  if family in ("modernbert", "eurobert", "ultrabert", "gemma3_text"):
    cls, sep, mask = SPECIALS[family]
    pad, unk = {
      "modernbert": ("[PAD]", "[UNK]"),
      "ultrabert": ("<pad>", "<unk>"),
      "gemma3_text": ("<pad>", "<unk>"),
    }.get(family, ("<|pad|>", "<|unk|>"))
    roles = dict(cls=cls, sep=sep, mask=mask, pad=pad, unk=unk)
    tok = _byte_level(
      texts, [cls, sep, pad, mask, unk], f"{cls} $A {sep}", f"{cls} $A {sep} $B:1 {sep}:1", roles
    )
    tok.save(str(directory / "tokenizer.json"))
    settings = {f"{k}_token": v for k, v in roles.items()}
    settings.update(tokenizer_class="PreTrainedTokenizerFast", model_max_length=128)
    (directory / "tokenizer_config.json").write_text(json.dumps(settings))
    vocab, pad_id = tok.get_vocab_size(), tok.token_to_id(pad)
  elif family == "deberta-v2":  # DeBERTa-v3's spm.model: [PAD] 0, [CLS] 1, [SEP] 2, [UNK] 3
    spm = pytest.importorskip("sentencepiece")
    spm.SentencePieceTrainer.train(
      sentence_iterator=iter(texts),
      model_prefix=str(directory / "spm"),
      vocab_size=700,
      pad_id=0,
      bos_id=1,
      eos_id=2,
      unk_id=3,
      pad_piece="[PAD]",
      bos_piece="[CLS]",
      eos_piece="[SEP]",
      unk_piece="[UNK]",
      user_defined_symbols=["[MASK]"],
      model_type="unigram",
      minloglevel=2,
    )
    vocab, pad_id = 700, 0
  else:
    specials = (
      ["<s>", "<pad>", "</s>", "[UNK]", "<mask>"]
      if family == "mpnet"
      else ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    )
    tok = tokenizers.BertWordPieceTokenizer(lowercase=True)
    tok.train_from_iterator(texts, vocab_size=600, show_progress=False, special_tokens=specials)
    tok.save_model(str(directory))
    settings = {"do_lower_case": True}
    if family == "neobert":  # bert-base-uncased's tokenizer; transformers has no NeoBERT
      settings["tokenizer_class"] = "BertTokenizer"
    if family == "mpnet":
      settings.update(
        bos_token="<s>",
        eos_token="</s>",
        cls_token="<s>",
        sep_token="</s>",
        pad_token="<pad>",
        unk_token="[UNK]",
        mask_token="<mask>",
      )
    (directory / "tokenizer_config.json").write_text(json.dumps(settings))
    vocab, pad_id = tok.get_vocab_size(), tok.token_to_id(specials[1 if family == "mpnet" else 0])
  config = bertjax.BertConfig.for_family(
    family, vocab_size=vocab, use_pooler=False, **{**SIZES, "pad_token_id": pad_id, **EXTRA[family]}
  )
  heads = ("mlm",) if "mlm" in config.family.heads else ()  # EmbeddingGemma: the encoder only
  bertjax.to_hf(config, bertjax.init(config, 3, heads=heads), directory)
  return directory


def _mlm(config) -> bool:
  return "mlm" in config.family.heads


def _state_target(config):
  """A gradient target on the final states (families without an MLM head): token 1's state
  on a fixed direction."""
  d = jnp.asarray(np.random.default_rng(5).standard_normal(config.hidden_size), jnp.float32)
  return lambda params, out: out.last_hidden_state[:, 1] @ d.astype(out.last_hidden_state.dtype)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
  root = tmp_path_factory.mktemp("modern")
  texts = _texts()
  return {f: _build(f, root / f, texts) for f in FAMILIES}


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, model_dirs):
  directory = model_dirs[request.param]
  config, params = bertjax.from_hf(directory)
  tok = bertjax.Tokenizer.from_pretrained(directory)
  return request.param, directory, config, params, tok


def _types(config, batch):
  return batch.token_type_ids if config.type_vocab_size else None


def test_models_are_what_the_family_ships(family):
  name, directory, config, params, tok = family
  assert config.model_type == name and ("mlm" in params) == _mlm(config)
  assert tuple(tok.convert_ids_to_tokens([tok.cls_id, tok.sep_id, tok.mask_id])) == SPECIALS[name]
  theirs = transformers.AutoTokenizer.from_pretrained(str(directory))
  b = _pairs(tok)[0]
  for i in range(2):
    n = int(b.attention_mask[i].sum())
    want = theirs(SENTENCES[i], SENTENCES[2 + i])["input_ids"]
    assert b.input_ids[i, :n].tolist() == want
  bertjax.forward(params, config, b.input_ids, b.attention_mask, _types(config, b))


def test_ablation_sweep_equals_loop_of_masked_forwards(family):
  _, _, config, params, tok = family
  batches = [tok.encode(SENTENCES, SENTENCES[::-1])]
  got = ablation.ablation_sweep(
    params, config, batches, ablation.mean_embedding_cosine, include=("heads", "layer_skip")
  )
  masks = ablation.sweep_masks(config, ("heads", "layer_skip"))
  b = batches[0]
  real = b.attention_mask[..., None]
  pooled = lambda h: (np.asarray(h) * real).sum(1) / real.sum(1)
  base = pooled(
    bertjax.forward(
      params, config, b.input_ids, b.attention_mask, _types(config, b)
    ).last_hidden_state
  )
  for kind in ABLATIONS:
    want = []
    for hm, lm in zip(*masks["heads"]):
      x = pooled(
        bertjax.forward(
          params,
          config,
          b.input_ids,
          b.attention_mask,
          _types(config, b),
          head_mask=hm,
          head_ablation=kind,
          layer_mask=lm,
        ).last_hidden_state
      )
      cos = (x * base).sum(-1) / np.linalg.norm(x, axis=-1) / np.linalg.norm(base, axis=-1)
      want.append(cos.mean())
    np.testing.assert_allclose(got[kind].heads.ravel(), want, atol=2e-5)
    assert got[kind].heads.min() < 0.999


def test_head_importance_is_the_mask_gradient(family):
  _, _, config, params, tok = family
  batches = _mlm_batches(tok)[:1]
  mlm = _mlm(config)  # without an MLM head: each real token from its own state, tied decoder
  loss_fn = ablation.mlm_batch_loss if mlm else ablation.token_reconstruction_loss
  got = ablation.head_importance(
    params, config, batches, loss_fn, per_example=False, normalize_layers=False
  )
  b = batches[0]

  def loss(xi):
    out = bertjax.forward(
      params,
      config,
      b["input_ids"],
      b["attention_mask"],
      b["token_type_ids"] if config.type_vocab_size else None,
      head_mask=xi,
    )
    if mlm:
      logits, labels = bertjax.head_logits(params, config, out, "mlm"), b["labels"]
    else:
      word = params["embeddings"]["word_embeddings"]["embedding"]
      logits = out.last_hidden_state @ word.T
      labels = np.where(b["attention_mask"] > 0, b["input_ids"], -100)
    logp = jax.nn.log_softmax(logits)
    keep = labels >= 0
    nll = -jnp.take_along_axis(logp, np.where(keep, labels, 0)[..., None], -1)[..., 0]
    return jnp.where(keep, nll, 0).sum() / keep.sum()

  want = np.abs(jax.grad(loss)(jnp.ones((config.depth, config.num_attention_heads))))
  # Float32 rounding of a gradient is absolute on the scale of the largest entries: a head
  # with a tiny importance (2.4e-3 beside 0.84 on NomicBERT) once differed by 3.4e-7.
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6 * np.abs(want).max())
  assert (got > 0).all()


def test_pruning_equals_masking(family):
  _name, _, config, params, tok = family
  prune = {0: [1, 3], 2: [0, 2]}
  if config.kv_heads != config.num_attention_heads:  # grouped heads: masks, not pruning
    with pytest.raises(ValueError, match="grouped key/value heads"):
      bertjax.prune_heads(config, params, prune)
    return
  pconfig, pparams = bertjax.prune_heads(config, params, prune)
  mask = np.ones((config.depth, config.num_attention_heads), np.float32)
  for layer, heads in prune.items():
    mask[layer, heads] = 0
  b = _pairs(tok)[0]
  real = b.attention_mask > 0
  masked = bertjax.forward(
    params, config, b.input_ids, b.attention_mask, _types(config, b), head_mask=mask
  )
  pruned = bertjax.forward(pparams, pconfig, b.input_ids, b.attention_mask, _types(config, b))
  diff = np.abs(np.asarray(pruned.last_hidden_state) - np.asarray(masked.last_hidden_state))
  # Pruned matmuls sum in another order, and random 0.3-std weights give large, peaked
  # activations (|h| up to 3): NomicBERT's largest difference is 2e-5 on the Intel Xeon and
  # went past 3e-5 on CI's CPU; a real difference (a head left in) is of order 1.
  assert diff[real].max() < 1e-4


@pytest.mark.parametrize("smoothing", [0.0, 1e-4])  # the kernel statistics path; the maps path
def test_clark_statistics_equal_numpy_on_the_maps(family, smoothing):
  _, _, config, params, tok = family
  batches = _pairs(tok)
  punct = statistics.clark_punctuation_ids(tok)
  got = statistics.clark_statistics(
    params,
    config,
    batches,
    sep_id=tok.sep_id,
    punct_ids=punct,
    weighting="token",
    entropy_smoothing=smoothing,
  )
  sums, count = {k: 0.0 for k in statistics.CLARK_NAMES}, 0
  for b in batches:
    maps = np.asarray(
      bertjax.forward(
        params, config, b.input_ids, b.attention_mask, _types(config, b), output_attentions=True
      ).attentions
    )
    for i in range(len(b.input_ids)):
      n = int(b.attention_mask[i].sum())
      a = maps[:, i, :, :n, :n].astype(np.float64)
      ids = b.input_ids[i, :n]
      sums["cls"] += a[..., 0].sum(-1)
      sums["sep"] += a[..., ids == tok.sep_id].sum((-1, -2))
      sums["punct"] += a[..., np.isin(ids, punct)].sum((-1, -2))
      sums["self"] += np.trace(a, axis1=-2, axis2=-1)
      sums["prev"] += np.trace(a, offset=-1, axis1=-2, axis2=-1)
      sums["next"] += np.trace(a, offset=1, axis1=-2, axis2=-1)
      p = (1 - smoothing) * a + smoothing / n
      sums["entropy"] += -(p * np.log(np.where(p > 0, p, 1))).sum((-1, -2))
      count += n
  for key in statistics.CLARK_NAMES:
    np.testing.assert_allclose(got[key], sums[key] / count, atol=2e-5, err_msg=key)


def test_word_features_align_as_transformers_tokenizers(family):
  _name, directory, config, params, tok = family
  sentences = [list(s.forms) for s in _ud()[:8]]
  theirs = transformers.AutoTokenizer.from_pretrained(str(directory))
  got = features.extract_word_features(
    params, config, tok, sentences, pooling="first", length_multiple=64, progress=False
  )
  # Byte-level BPE: every word starts with a space, as RoBERTa's add_prefix_space=True does
  # (transformers' generic fast tokenizer leaves that to the caller).
  words = [[" " + w for w in s] for s in sentences] if tok.byte_level else sentences
  enc = theirs(words, is_split_into_words=True, padding=True, return_tensors="np")
  ours = tok.encode_words(sentences)
  np.testing.assert_array_equal(ours.input_ids, enc["input_ids"])
  hidden = np.asarray(
    bertjax.forward(
      params, config, enc["input_ids"], enc["attention_mask"], output_hidden_states=True
    ).hidden_states
  )
  for i in range(len(sentences)):
    word_ids = np.asarray([-1 if w is None else w for w in enc.word_ids(i)])
    np.testing.assert_array_equal(ours.word_ids[i], word_ids)
    first = [np.flatnonzero(word_ids == w)[0] for w in range(len(sentences[i]))]
    np.testing.assert_allclose(got.sentence(i), hidden[:, i, first], rtol=1e-5, atol=1e-4)


def test_cloze_and_pll_come_from_the_mlm_head(family):
  _, _, config, params, tok = family
  if not _mlm(config):
    with pytest.raises(ValueError, match="mlm"):  # refused by name, not run on another head
      cloze.score_queries((config, params), tok, ["The [MASK] ."], [["table"]], k=5)
    return
  texts = ["The keys to the [MASK] are on the table."]
  scores = cloze.score_queries((config, params), tok, texts, [["table", "keys"]], k=5)
  enc = tok.encode([cloze.mask_text(tok, texts[0])])
  out = bertjax.forward(params, config, enc.input_ids, enc.attention_mask)
  logp = np.asarray(jax.nn.log_softmax(bertjax.head_logits(params, config, out, "mlm")))[0]
  at = enc.input_ids[0].tolist().index(tok.mask_id)
  assert set(scores.topk[0].tolist()) == set(np.argsort(-logp[at])[:5].tolist())
  got, per_token = cloze.pseudo_log_likelihood(
    (config, params), tok, [SENTENCES[0]], return_tokens=True
  )
  assert np.isfinite(per_token[0]).all() and got[0] == pytest.approx(per_token[0].sum(), abs=1e-3)


# Attribution and patching -------------------------------------------------------------------


def test_token_attribution_methods(family):
  name, _, config, params, tok = family
  b = tok.encode(SENTENCES[:3])
  args = (params, config, b.input_ids, b.attention_mask, _types(config, b))
  real = b.attention_mask > 0
  pairs = real[:, :, None] & real[:, None, :]
  if config.family.norm == "sandwich":  # the attention output is normed before the residual
    for method in (propagation.alti, propagation.norm_analysis):
      with pytest.raises(ValueError, match=f"a {name} block norms that output"):
        method(*args)
  else:
    alti = propagation.alti(*args)
    rows = np.asarray(alti.layer).sum(-1)[:, real]
    np.testing.assert_allclose(rows, 1.0, atol=1e-5)  # shares of each real token
    norms = propagation.norm_analysis(*args)
    assert ("attnresln" in norms) == (config.family.norm == "post")
    assert np.isfinite(np.asarray(norms["attn"])[:, pairs]).all()
  if config.family.norm == "post":
    assert np.isfinite(np.asarray(propagation.globenc(*args).rollout)).all()
  else:
    with pytest.raises(ValueError, match=f"a {name} block is {config.family.norm}-norm"):
      propagation.globenc(*args)
  rollout = propagation.attention_rollout(*args)
  np.testing.assert_allclose(np.asarray(rollout).sum(-1)[:, real], 1.0, atol=1e-5)
  vz = propagation.value_zeroing(*args)
  assert np.isfinite(np.asarray(vz.rollout)).all()
  target = (
    gradients.mlm_target(config, np.array([1, 2, 1]), np.array([7, 9, 11]))
    if _mlm(config)
    else _state_target(config)
  )
  grads = gradients.gradient_x_input(*args, target_fn=target)
  assert np.isfinite(np.asarray(grads)).all()


def test_gradients_through_the_block_match_finite_differences(family):
  """d(MLM logit)/d(embeddings) in float64 against central differences: the block's
  gradient (rotary, windows, grouped heads, the position bias, gated FFNs) is right."""
  _, _, config, params, tok = family
  b = tok.encode(SENTENCES[:2])
  with jax.enable_x64(True):
    c64 = config.replace(dtype="float64")
    p64 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), params)
    x = bertjax.embed(p64, c64, b.input_ids)
    probe = jax.random.normal(jax.random.key(3), x.shape, jnp.float64)

    def f(eps):
      out = bertjax.forward(
        p64, c64, b.input_ids, b.attention_mask, patch={"embeddings": (x + eps * probe, 1.0)}
      )
      if not _mlm(c64):  # the final states themselves
        return out.last_hidden_state[:, 1, 7].sum()
      return bertjax.head_logits(p64, c64, out, "mlm")[:, 1, 7].sum()

    # Fourth-order central differences: truncation ~h^4, and these random models are peaked
    # (EuroBERT: |fd - grad| 3e-6 at h = 1e-4, 3e-8 at 3e-5, 7e-10 at 1e-5 of 11.8).
    h = 1e-5
    f, grad = jax.jit(f), jax.jit(jax.grad(f))  # two programs, not one per operation
    fd = (8 * (f(h) - f(-h)) - (f(2 * h) - f(-2 * h))) / (12 * h)
    np.testing.assert_allclose(grad(0.0), fd, rtol=1e-7)


def test_attribution_patching_tracks_exact_patching(family):
  _, _, config, params, tok = family
  clean = tok.encode(["She did not like it at all .", "The keys to the cabinet are here ."])
  corrupted = dataclasses_replace(clean, 3)
  targets = {
    "position": np.array([2, 4]),
    "answer": np.array([7, 8]),
    "distractor": np.array([9, 10]),
  }
  if _mlm(config):
    metric = metrics.LogitDiff("mlm")
  else:  # a linear probe on the mean final state, over 11 classes
    rng = np.random.default_rng(2)
    metric = metrics.ProbeLogitDiff(
      rng.standard_normal((config.hidden_size, 11)).astype(np.float32),
      np.zeros(11, np.float32),
      pooling="mean",
    )
    targets = {k: v for k, v in targets.items() if k != "position"}
  exact = patching.head_patching(params, config, clean, corrupted, metric, targets=targets)
  approx = patching.attribution_patching(params, config, clean, corrupted, metric, targets=targets)
  assert np.asarray(exact.values).shape == (config.depth, config.num_attention_heads)
  assert np.isfinite(np.asarray(approx.values)).all()
  # Attribution patching is the first-order term of exact patching: a patch of weight +-eps
  # of one head's clean output into the corrupted run, by central differences. (How well
  # the full patch is tracked depends on the random model -- its tokenizer's vocabulary
  # order varies between processes -- so it is no test of the code.)
  batch = {"input_ids": corrupted.input_ids, "attention_mask": corrupted.attention_mask, **targets}
  own = bertjax.forward(
    params,
    config,
    clean.input_ids,
    clean.attention_mask,
    _types(config, clean),
    capture=("head_out",),
  ).cache["head_out"]
  eps = 2e-3

  def patched(weight):
    out = bertjax.forward(
      params,
      config,
      corrupted.input_ids,
      corrupted.attention_mask,
      _types(config, corrupted),
      patch={"head_out": (own, weight)},
    )
    return float(metric(params, config, out, batch))

  linear = np.zeros((config.depth, config.num_attention_heads))
  for layer in range(config.depth):
    for head in range(config.num_attention_heads):
      w = np.zeros((config.depth, 1, 1, config.num_attention_heads, 1), np.float32)
      w[layer, :, :, head] = eps
      linear[layer, head] = (patched(w) - patched(-w)) / (2 * eps)
  base = patched(np.zeros((config.depth, 1, 1, config.num_attention_heads, 1), np.float32))
  np.testing.assert_allclose(
    np.asarray(approx.values) - base,
    linear,  # values: base + term
    atol=3e-3 * max(np.abs(linear).max(), 1e-3),
  )


def dataclasses_replace(batch, position):
  """`batch` with the token at `position` replaced by a different word (same length)."""
  import dataclasses

  ids = batch.input_ids.copy()
  ids[:, position] = ids[:, position + 1]
  return dataclasses.replace(batch, input_ids=ids)


# The command line on the new families ---------------------------------------------------------


def _env(**extra):
  import os

  return dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    HF_HUB_OFFLINE="1",
    TRANSFORMERS_OFFLINE="1",
    XLA_FLAGS=FAST_COMPILE,
    **extra,
  )


@pytest.mark.slow
@pytest.mark.parametrize("name", ["modernbert", "eurobert", "ultrabert"])
def test_finetune_exports_what_transformers_loads(model_dirs, name, tmp_path):
  import csv

  directory = model_dirs[name]
  with open(REPO / "bertjax" / "resources" / "sentences.tsv", encoding="utf-8") as f:
    rows = list(csv.DictReader(f, delimiter="\t"))[:32]
  table = tmp_path / "train.tsv"
  table.write_text(
    "sentence\tlabel\n"
    + "".join(f"{r['sentence']}\t{'negated' if r['negated'] == '1' else 'plain'}\n" for r in rows)
  )
  out = tmp_path / "run"
  proc = pyrunner.run(
    [
      sys.executable,
      "-m",
      "bertjax.cli",
      "finetune",
      "--init-from",
      str(directory),
      "--table",
      str(table),
      "--steps",
      "3",
      "--batch-size",
      "8",
      "--lr",
      "1e-3",
      "--max-len",
      "64",
      "--output-dir",
      str(out),
    ],
    cwd=tmp_path,
    env=_env(),
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
  model_dir = out / "model"
  hf = json.loads((model_dir / "config.json").read_text())
  assert hf["architectures"] == [CLASSES[name]] and hf["model_type"] == name
  config2, params2 = bertjax.from_hf(model_dir)
  model, info = getattr(transformers, CLASSES[name]).from_pretrained(
    str(model_dir), output_loading_info=True, attn_implementation="eager"
  )
  assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
  tok2 = bertjax.Tokenizer.from_pretrained(model_dir)
  b = tok2.encode(SENTENCES)
  ours = bertjax.head_logits(
    params2,
    config2,
    bertjax.forward(params2, config2, b.input_ids, b.attention_mask),
    "classifier",
    attention_mask=b.attention_mask,
  )
  with torch.no_grad():
    theirs = model.eval()(
      input_ids=torch.tensor(b.input_ids).long(),
      attention_mask=torch.tensor(b.attention_mask).long(),
    ).logits
  np.testing.assert_allclose(np.asarray(ours), theirs.numpy(), atol=1e-4)


@pytest.mark.slow
def test_experiment_smoke_runs_on_modernbert(model_dirs, tmp_path):
  from test_experiments import run_smoke

  directory = model_dirs["modernbert"]
  doc, _ = run_smoke("what_bert_looks_at", tmp_path, "--model", str(directory))
  sep = np.asarray(doc["results"]["clark"]["sep"])
  assert sep.shape == (3, 5) and np.isfinite(sep).all()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["modernbert", "ultrabert", "gemma3_text", "neobert"])
def test_report_runs_on_a_modern_family(model_dirs, name, tmp_path):
  """`bertjax report --model DIR --reduced` on a random ModernBERT (windows, pre-LN, GeGLU),
  UltraBERT (windows by radius, grouped heads, SwiGLU, its two-layer MLM head),
  EmbeddingGemma (sandwich norms, QK-norm, no MLM head) and NeoBERT (interleaved rotary)."""
  out = tmp_path / "report"
  proc = pyrunner.run(
    [
      sys.executable,
      "-m",
      "bertjax.cli",
      "report",
      "--model",
      str(model_dirs[name]),
      "--reduced",
      "--sections",
      "clark,attribution",
      "--out",
      str(out),
    ],
    cwd=tmp_path,
    env=_env(),
    capture_output=True,
    text=True,
    timeout=900,
    check=False,
  )
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
  doc = json.loads((out / "report.json").read_text())
  assert doc["model"]["model_type"] == name and doc["model"]["layers"] == 3
  assert np.isfinite(np.asarray(doc["clark"]["sep"], float)).all()
  assert doc["attribution"]["available"], doc["attribution"].get("reason")
  page = (out / "index.html").read_text()
  assert "Traceback" not in page and "failed" not in page.lower(), page[:2000]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["modernbert", "mpnet"])
def test_pretrain_continues_mlm_and_exports(model_dirs, name, tmp_path):
  """`pretrain --init-from DIR --objective none` continues a new family's MLM head with its
  own special tokens; the export loads in transformers and tokenises as transformers does.
  The default NSP objective is refused by name (the family has no NSP head)."""
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("\n".join(SENTENCES * 8) + "\n")
  run = lambda *extra: pyrunner.run(
    [
      sys.executable,
      "-m",
      "bertjax.cli",
      "pretrain",
      "--corpus",
      str(corpus),
      "--init-from",
      str(model_dirs[name]),
      "--steps",
      "2",
      "--batch-size",
      "4",
      "--seq-len",
      "32",
      "--output-dir",
      str(tmp_path / "run"),
      *extra,
    ],
    cwd=tmp_path,
    env=_env(),
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  refused = run()
  assert refused.returncode != 0 and "no NSP head" in refused.stderr, refused.stderr[-2000:]
  proc = run("--objective", "none")
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
  exported = pyrunner.run(
    [
      sys.executable,
      "-m",
      "bertjax.cli",
      "export",
      str(tmp_path / "run"),
      "--to",
      str(tmp_path / "model"),
    ],
    cwd=tmp_path,
    env=_env(),
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert exported.returncode == 0, exported.stderr[-3000:]
  cls = {"modernbert": "ModernBertForMaskedLM", "mpnet": "MPNetForMaskedLM"}[name]
  _model, info = getattr(transformers, cls).from_pretrained(
    str(tmp_path / "model"), output_loading_info=True
  )
  assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
  theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "model"))
  ours = bertjax.Tokenizer.from_pretrained(tmp_path / "model")
  pair = ours.encode(SENTENCES[:1], SENTENCES[1:2]).input_ids[0].tolist()
  assert pair == theirs(SENTENCES[0], SENTENCES[1])["input_ids"]
  config, params = bertjax.from_hf(tmp_path / "model")
  assert config.model_type == name and "mlm" in params
