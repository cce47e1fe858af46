"""Cloze probes: PLL against a one-mask-at-a-time loop, scoring on hand-built inputs, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax.analysis.representations import cloze


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
  return bertjax.Tokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def tiny_mlm():
  config = bertjax.BertConfig.preset("tiny", vocab_size=30522)
  return config, bertjax.init(config, 0, heads=("mlm",))


def _pll_loop(params, config, tokenizer, sentence):
  """Reference: one forward pass per masked position, full-vocabulary logits."""
  ids = tokenizer.encode([sentence]).input_ids  # (1, T)
  total = 0.0
  for t in range(ids.shape[1]):
    if int(ids[0, t]) in tokenizer.special_ids:
      continue
    masked = ids.copy()
    masked[0, t] = tokenizer.mask_id
    hidden = bertjax.forward(params, config, masked).last_hidden_state  # (1, T, H)
    logp = jax.nn.log_softmax(bertjax.mlm_logits(params, config, hidden)[0, t])
    total += float(logp[ids[0, t]])
  return total


def test_pll_matches_one_mask_at_a_time(tiny_mlm, tokenizer):
  config, params = tiny_mlm
  sentences = [
    "The cat sat on the mat.",
    "Susan revealed herself.",
    "Unbelievably, hypothesized transformations were reconfigured yesterday!",
    "Hi",
  ]
  # max_rows=16 forces several packed batches, one sentence longer than a batch.
  pll, per_token = cloze.pseudo_log_likelihood(
    (config, params), tokenizer, sentences, max_rows=16, return_tokens=True
  )
  for s, got, toks in zip(sentences, pll, per_token):
    assert len(toks) == len(tokenizer.encode([s]).input_ids[0]) - 2
    np.testing.assert_allclose(got, _pll_loop(params, config, tokenizer, s), atol=1e-4, rtol=0)


def test_blimp_accuracy_uses_pll(tiny_mlm, tokenizer):
  config, params = tiny_mlm
  records = [
    {"sentence_good": "Susan revealed herself.", "sentence_bad": "Susan revealed themselves."},
    {"sentence_good": "Paula references Robert.", "sentence_bad": "Paula reference Robert."},
  ]
  out = cloze.blimp_probe((config, params), tokenizer, records)
  pll = cloze.pseudo_log_likelihood(
    (config, params), tokenizer, [r[k] for k in ("sentence_good", "sentence_bad") for r in records]
  )
  np.testing.assert_allclose(out["pll_good"], pll[:2], atol=1e-5)
  assert out["accuracy"] == np.mean(pll[:2] > pll[2:])
  assert cloze.minimal_pair_accuracy([1.0, 2.0, 3.0], [0.0, 2.0, 4.0]) == pytest.approx(1 / 3)
  with pytest.raises(ValueError, match="shape"):
    cloze.minimal_pair_accuracy([1.0], [1.0, 2.0])


def _bigram_lm(vocab_size, favourites):
  """A fake masked LM: the distribution at the blank depends only on the token before it."""
  prevs = np.asarray(list(favourites), np.int32)
  bonus = np.zeros((len(prevs), vocab_size), np.float32)  # (P, V)
  for p, ranked in enumerate(favourites.values()):
    for r, tok in enumerate(ranked):
      bonus[p, tok] = 15.0 - r

  def fn(params, ids, mask, types, positions):
    prev = jnp.take_along_axis(ids, jnp.maximum(positions - 1, 0)[:, None], 1)[:, 0]  # (B,)
    hit = (prev[:, None] == params["prevs"][None]).astype(jnp.float32)  # (B, P)
    return jax.nn.log_softmax(hit @ params["bonus"], -1)  # (B, V)

  return cloze.MaskedLM(fn, {"prevs": jnp.asarray(prevs), "bonus": jnp.asarray(bonus)})


def test_score_queries_and_lama_on_a_fake_lm(tokenizer):
  tid = lambda w: cloze.single_token_id(tokenizer, w)
  lm = _bigram_lm(
    tokenizer.vocab_size,
    {tid("in"): [tid("paris"), tid("london")], tid("the"): [tid("cat"), tid("dog"), tid("gold")]},
  )
  records = [
    {"masked_sentences": ["He was born in [MASK] ."], "obj_label": "Paris"},  # P@1 hit
    {"masked_sentences": ["She lives in [MASK] ."], "obj_label": "London"},  # P@10 hit only
    {
      "masked_sentences": ["It is the [MASK] color, a long sentence to get another width."],
      "obj_label": "gold",
    },  # rank 3: P@10 hit
    {"masked_sentences": ["the [MASK] ."], "obj_label": "cat"},  # P@1 hit
    {"masked_sentences": ["A [MASK] ."], "obj_label": "zzzqqxlinebackerz"},  # not one token
  ]
  out = cloze.lama_probe(lm, tokenizer, records, batch_size=2)
  assert out == {"P@1": 0.5, "P@10": 1.0, "n": 4, "skipped": 1}
  s = cloze.score_queries(lm, tokenizer, ["in [MASK]", "the [MASK]"], [["paris"], ["dog"]], k=3)
  np.testing.assert_array_equal(s.topk[1], [tid("cat"), tid("dog"), tid("gold")])
  assert s.target_logprob[0, 0] > s.target_logprob[1, 0]
  with pytest.raises(ValueError, match="exactly one"):
    cloze.score_queries(lm, tokenizer, ["no blank here"])
  assert cloze.fill_template("[X] was born in [Y] .", "Dante") == "Dante was born in [MASK] ."


def test_lama_and_topk_scoring():
  topk = np.asarray([[5, 1, 2], [3, 5, 9], [7, 8, 4]])
  out = cloze.lama_scores(topk, [5, 5, None], ks=(1, 3))
  assert out == {"P@1": 0.5, "P@3": 1.0, "n": 2, "skipped": 1}
  assert cloze.topk_accuracy(topk, [[9, 8], [1], [4]], 2) == pytest.approx(0.0)
  assert cloze.topk_accuracy(topk, [[2], [1], [4]], 3) == pytest.approx(2 / 3)


def _lookup(table):
  """A fake lookup(context, word) -> (logprob, topk ids, word id); word ids are hashes."""
  ids = {w: i for i, w in enumerate(sorted({w for _, w in table}))}

  def lookup(context, word):
    ranked = sorted((w for c, w in table if c == context), key=lambda w: -table[(context, w)])
    return table[(context, word)], np.asarray([ids[w] for w in ranked]), ids[word]

  return lookup


def test_neg136_scoring():
  items = [
    {
      "context_aff": "A trout is (a|an)",
      "context_neg": "A trout is not (a|an)",
      "target_aff": "fish",
      "target_neg": "tool",
    },
    {
      "context_aff": "An ant is (a|an)",
      "context_neg": "An ant is not (a|an)",
      "target_aff": "insect",
      "target_neg": "vegetable",
    },
  ]
  table = {  # the model ignores negation: the true-in-affirmative word always wins
    ("A trout is a", "fish"): -1.0,
    ("A trout is a", "tool"): -3.0,
    ("A trout is not a", "fish"): -1.5,
    ("A trout is not a", "tool"): -3.5,
    ("An ant is an", "insect"): -1.0,
    ("An ant is a", "vegetable"): -4.0,
    ("An ant is not an", "insect"): -0.5,
    ("An ant is not a", "vegetable"): -4.5,
    ("An ant is not a", "insect"): -0.6,
  }
  out = cloze.neg136_scores(items, _lookup(table), ks=(1,), simp=True)
  assert out["aff_top1"] == 1.0 and out["aff_sensitivity"] == 1.0
  assert out["neg_top1"] == 0.0 and out["neg_sensitivity"] == 0.0
  assert out["negation_shift"] == 0.5  # fish drops after "not", insect rises


def test_role88_and_cprag_scoring():
  role = [
    {
      "item": "1-a",
      "context": "which customer the waitress had",
      "expected": "served|seen",
      "target": "served",
    },
    {
      "item": "1-b",
      "context": "which waitress the customer had",
      "expected": "tipped",
      "target": "served",
    },
  ]
  table = {
    ("which customer the waitress had", "served"): -1.0,
    ("which customer the waitress had", "seen"): -2.0,
    ("which waitress the customer had", "tipped"): -3.0,
    ("which waitress the customer had", "served"): -0.5,  # reversed roles still prefer served
  }
  out = cloze.role88_scores(role, _lookup(table), ks=(1,))
  assert out["top1"] == 0.5 and out["sensitivity"] == 0.0 and out["pairs"] == 1
  cprag = [
    {
      "context_s1": "Checkmate.",
      "context_s2": "She was good at",
      "expected": "chess",
      "within_category": "monopoly",
      "between_category": "football",
      "constraint": "H",
    }
  ]
  ctx = "Checkmate. She was good at"
  table = {(ctx, "chess"): -2.0, (ctx, "monopoly"): -1.0, (ctx, "football"): -3.0}
  out = cloze.cprag102_scores(cprag, _lookup(table), ks=(1, 2))
  assert out["top1"] == 0.0 and out["top2"] == 1.0
  assert out["sensitivity"] == 0.0 and out["within_over_between"] == 1.0


def test_ettinger_probe_runs_on_the_real_files(tiny_mlm, tokenizer, data_dir):
  config, params = tiny_mlm
  out = cloze.ettinger_probe((config, params), tokenizer, data_dir / "lm_diagnostics" / "datasets")
  assert set(out) == {"NEG-136-SIMP", "NEG-136-NAT", "ROLE-88", "CPRAG-102"}
  assert out["ROLE-88"]["pairs"] > 30 and out["NEG-136-SIMP"]["aff_n"] > 10
  for scores in out.values():
    assert all(np.isnan(v) or 0.0 <= v for v in scores.values())


def test_model_without_mlm_head_gets_a_clear_error(minilm_dir, tokenizer):
  config, params = bertjax.from_hf(minilm_dir)
  with pytest.raises(ValueError, match="no 'mlm' head"):
    cloze.masked_lm(params, config)
  with pytest.raises(ValueError, match="masked-LM head"):
    cloze.blimp_probe((config, params), tokenizer, [{"sentence_good": "a", "sentence_bad": "b"}])
  with pytest.raises(TypeError, match="swap them"):  # a whole model is (config, params)
    cloze.blimp_probe((params, config), tokenizer, [{"sentence_good": "a", "sentence_bad": "b"}])
