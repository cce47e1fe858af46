"""bertjax.tasks.negation: cue, twins, ranks, the fitted probe as a metric."""

import jax
import numpy as np
import pytest

import bertjax
from bertjax import stats
from bertjax.tasks import negation


@pytest.fixture(scope="module")
def tok(minilm_dir):
  return bertjax.Tokenizer.from_pretrained(minilm_dir)


def test_cue_twin_and_rank(tok):
  batch = tok.encode(["She did not like it.", "He didn't go.", "No, never, not."])
  pos = negation.cue_position(tok, batch, 0)
  assert tok.convert_ids_to_tokens([batch.input_ids[0, pos]]) == ["not"]
  twin = negation.twin_ids(tok, batch, 0, pos)
  assert tok.decode(twin[batch.attention_mask[0] > 0][1:-1]) == "she did also like it."
  pos = negation.cue_position(tok, batch, 1)  # the "t" of "n't"
  assert tok.convert_ids_to_tokens(batch.input_ids[1, pos - 2 : pos + 1]) == ["didn", "'", "t"]
  assert negation.cue_position(tok, batch, 2) is None  # three cues: ambiguous
  real = np.array([False, True, True, True, False])
  assert negation.cue_rank(np.array([9.0, 0.5, 0.7, 0.1, 9.0]), 2, real) == 1
  assert negation.cue_rank(np.array([9.0, 0.5, 0.7, 0.7, 9.0]), 2, real) == 2  # ties pessimistic


def test_pairs_keep_the_first_sentences_with_a_cue(tok):
  texts = ["No, never, not.", "She did not like it.", "He didn't go.", "I never ran."]
  clean, corrupted, kept = negation.pairs(tok, texts)
  assert kept == texts[1:]
  first, _, kept2 = negation.pairs(tok, texts, limit=2)
  assert kept2 == texts[1:3] and len(first.input_ids) == 2
  real = first.attention_mask > 0
  np.testing.assert_array_equal(
    first.input_ids[real], clean.input_ids[:2, : first.input_ids.shape[1]][real]
  )
  assert (corrupted.input_ids != clean.input_ids).sum(1).tolist() == [1, 1, 1]


def test_probe_fit_and_two_class_metric_equal_the_logistic_logit():
  from bertjax.analysis.interventions import metrics

  rng = np.random.default_rng(0)
  x = rng.normal(size=(200, 6))
  y = (x[:, 0] - 0.5 * x[:, 3] > 0).astype(int)
  w, b, mu, sd = negation.fit_probe(x, y)
  from sklearn.linear_model import LogisticRegression

  ref = LogisticRegression(C=1 / (2 * 1e-2 * 200), max_iter=1000).fit((x - mu) / sd, y)
  np.testing.assert_allclose(w, ref.coef_[0], rtol=2e-3, atol=2e-3)
  np.testing.assert_allclose(b, ref.intercept_[0], rtol=2e-3, atol=2e-3)
  # The experiment's metric: the binary probe as two classes on mean-pooled states.
  metric = metrics.ProbeLogitDiff(*negation.probe_weights(w, b, mu, sd), "mean")
  hidden = rng.normal(size=(3, 4, 6)).astype(np.float32)
  mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
  out = bertjax.BertOutput(last_hidden_state=hidden)
  batch = {
    "attention_mask": mask,
    "answer": np.ones(3, np.int32),
    "distractor": np.zeros(3, np.int32),
  }
  pooled = stats.mean_pool(hidden.astype(np.float64), mask)
  want = (((pooled - mu) / sd) @ w + b).mean()
  np.testing.assert_allclose(float(metric(None, None, out, batch)), want, rtol=1e-5)


def test_token_scores_and_statistics_on_a_tiny_model(tok):
  config = bertjax.BertConfig(
    vocab_size=tok.vocab_size,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
  )
  # Random biases too: with the zero biases of a fresh init, a post-LN model is scale
  # invariant along the path from the zero baseline and integrated gradients cannot complete.
  rng = np.random.default_rng(2)
  params = jax.tree.map(
    lambda a: a + 0.1 * rng.normal(size=a.shape).astype(a.dtype), bertjax.init(config, 0)
  )
  probe = (np.random.default_rng(1).normal(size=(32, 2)), np.array([0.1, -0.2]))
  texts = ["She did not like it.", "He never came back.", "Nobody saw the cat."]
  res = negation.cue_statistics(
    params,
    config,
    tok,
    texts,
    probe,
    methods=("attention", "alti", "integrated_gradients"),
    ig_steps=64,
  )
  assert [s["cue"] for s in res["sentences"]] == ["not", "never", "nobody"]
  for st in res["stats"].values():
    assert 0 < st["mrr"] <= 1 and 1 <= st["mean_rank"] <= 7
  agree = np.asarray(res["agreement"]["spearman"])
  np.testing.assert_allclose(np.diag(agree), 1.0)
  # Integrated gradients explains the probe logit: completeness against a zero baseline.
  batch = tok.encode(texts)
  scores = negation.token_scores(
    params, config, batch, probe, methods=("integrated_gradients",), ig_steps=64
  )
  out = bertjax.forward(params, config, batch.input_ids, batch.attention_mask)
  m = batch.attention_mask[..., None]
  pooled = (np.asarray(out.last_hidden_state) * m).sum(1) / m.sum(1)
  logit = pooled @ (probe[0][:, 1] - probe[0][:, 0]) + probe[1][1] - probe[1][0]
  zero = bertjax.forward(
    params, config, batch.input_ids, batch.attention_mask, patch={"embeddings": (0.0, 1.0)}
  ).last_hidden_state
  base = (
    ((np.asarray(zero) * m).sum(1) / m.sum(1)) @ (probe[0][:, 1] - probe[0][:, 0])
    + probe[1][1]
    - probe[1][0]
  )
  np.testing.assert_allclose(
    scores["integrated_gradients"].sum(1), logit - base, rtol=0.01, atol=1e-3
  )


def test_attnlrp_scores_explain_the_probe_logit(tok):
  """The "attnlrp" method is `lrp.attnlrp` of the probe's logit difference on mean-pooled
  final states; with CP-LRP's constant attention the same target's relevance is conserved."""
  from bertjax.analysis.attribution import lrp

  config = bertjax.BertConfig(
    vocab_size=tok.vocab_size,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
  )
  params = bertjax.init(config, 0)
  probe = (np.random.default_rng(1).normal(size=(32, 2)), np.array([0.1, -0.2]))
  batch = tok.encode(["She did not like it.", "Nobody saw the cat."])
  got = negation.token_scores(params, config, batch, probe, methods=("attnlrp",))["attnlrp"]
  m = np.asarray(batch.attention_mask, np.float32)[..., None]
  d = probe[0][:, 1] - probe[0][:, 0]

  def logit(p, c, out):
    return ((out.last_hidden_state * m).sum(1) / m.sum(1)) @ d + probe[1][1] - probe[1][0]

  want = lrp.attnlrp(
    params, config, batch.input_ids, batch.attention_mask, batch.token_type_ids, target_fn=logit
  )
  np.testing.assert_allclose(got, want.tokens, rtol=1e-5, atol=1e-6)
  cp = lrp.attnlrp(
    params,
    config,
    batch.input_ids,
    batch.attention_mask,
    batch.token_type_ids,
    target_fn=logit,
    rules="cp-lrp",
    biases=True,
  )
  offset = probe[1][1] - probe[1][0]  # the probe's own bias, not a model parameter
  np.testing.assert_allclose(
    (cp.tokens + cp.positions + cp.token_types).sum(1) + cp.biases,
    cp.target - offset,
    rtol=1e-4,
    atol=1e-5,
  )


def test_decompx_scores_sum_to_the_probe_logit(tok):
  """The "decompx" method: each token's part of the mean-pooled final state, read by the
  probe; with the biases split among the tokens, the scores sum to the logit difference
  less the probe's own offset."""
  config = bertjax.BertConfig(
    vocab_size=tok.vocab_size,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
  )
  rng = np.random.default_rng(3)
  params = jax.tree.map(
    lambda a: a + 0.1 * rng.normal(size=a.shape).astype(a.dtype), bertjax.init(config, 0)
  )
  probe = (np.random.default_rng(1).normal(size=(32, 2)), np.array([0.1, -0.2]))
  batch = tok.encode(["She did not like it.", "Nobody saw the cat."])
  got = negation.token_scores(params, config, batch, probe, methods=("decompx",))["decompx"]
  out = bertjax.forward(params, config, batch.input_ids, batch.attention_mask)
  m = batch.attention_mask[..., None]
  pooled = (np.asarray(out.last_hidden_state) * m).sum(1) / m.sum(1)
  np.testing.assert_allclose(
    got.sum(1), pooled @ (probe[0][:, 1] - probe[0][:, 0]), rtol=1e-4, atol=1e-5
  )
  assert not got[batch.attention_mask == 0].any()


def test_cues_behind_word_start_markers():
  """Byte-level BPE ("Ġnot", "'t") and SentencePiece ("▁never") cues and their twins."""
  vocab = [
    "<s>",
    "</s>",
    "ĠShe",
    "Ġdid",
    "Ġnot",
    "Ġalso",
    "Ġgo",
    ".",
    "didn",
    "'t",
    "'s",
    "▁never",
    "▁often",
  ]

  class Stub:
    def convert_ids_to_tokens(self, ids):
      return [vocab[int(i)] for i in ids]

    def convert_tokens_to_ids(self, tokens):
      return [vocab.index(t) for t in tokens]

  def batch(*tokens):
    ids = np.asarray([[vocab.index(t) for t in tokens]])
    return bertjax.Batch(ids, np.ones_like(ids), np.zeros_like(ids), np.zeros_like(ids))

  tok = Stub()
  for tokens, cue, twin in (
    (("<s>", "ĠShe", "Ġdid", "Ġnot", "Ġgo", ".", "</s>"), 3, "Ġalso"),
    (("<s>", "ĠShe", "didn", "'t", "Ġgo", "</s>"), 3, "'s"),
    (("<s>", "▁never", "Ġgo", "</s>"), 1, "▁often"),
  ):
    b = batch(*tokens)
    assert negation.cue_position(tok, b, 0) == cue
    assert tok.convert_ids_to_tokens([negation.twin_ids(tok, b, 0, cue)[cue]]) == [twin]
