"""Checks of `experiments/albert_sharing.py`: parameter counts and the findings' rules."""

import pathlib

import pytest

import bertjax

REPO = pathlib.Path(__file__).resolve().parents[1]
from experiments import albert_sharing as A
from experiments import albert_sharing as rules


def _formula(config) -> int:
  """Embeddings + stored layers + pooler, counted by hand (BERT/ALBERT, no heads)."""
  v, h, e, f = config.vocab_size, config.hidden_size, config.embed_dim, config.intermediate_size
  emb = (v + config.max_position_embeddings + config.type_vocab_size) * e + 2 * e
  if config.has_embedding_projection:
    emb += e * h + h
  attention = 4 * (h * h + h) + 2 * h
  ffn = h * f + f + f * h + h + 2 * h
  return emb + config.num_param_layers * (attention + ffn) + h * h + h


def test_variants_differ_only_in_sharing_and_embedding_width():
  c = A.model_configs(A.FULL, 8000)
  assert list(c) == list(A.VARIANTS)
  for v in A.VARIANTS:
    assert (
      c[v].depth,
      c[v].hidden_size,
      c[v].num_attention_heads,
      c[v].intermediate_size,
      c[v].hidden_act,
      c[v].hidden_dropout_prob,
    ) == (6, 128, 4, 512, "gelu", 0.1)
  assert (c["bert"].embed_dim, c["bert"].num_param_layers) == (128, 6)
  assert (c["albert"].embed_dim, c["albert"].num_param_layers) == (32, 1)
  assert (c["shared_only"].embed_dim, c["shared_only"].num_param_layers) == (128, 1)
  assert (c["factorized_only"].embed_dim, c["factorized_only"].num_param_layers) == (32, 6)


def test_param_counts_match_a_formula_and_the_published_base_sizes():
  for config in A.model_configs(A.FULL, 8000).values():
    assert bertjax.param_counts(config)["model"] == _formula(config)
  base = A.base_size_counts()
  # Hugging Face bert-base-uncased BertModel and albert-base-v2 AlbertModel.
  assert base["bert_base"] == 109_482_240 and base["albert_base"] == 11_683_584
  assert base["ratio"] == pytest.approx(11_683_584 / 109_482_240)


@pytest.mark.hf
def test_param_counts_match_transformers_models_built_from_the_same_configs():
  transformers = pytest.importorskip("transformers")
  pytest.importorskip("torch")
  for config in A.model_configs(A.FULL, 8000).values():
    hf = config.to_hf_dict()
    if config.model_type == "albert":
      model = transformers.AlbertModel(transformers.AlbertConfig(**hf))
    else:
      model = transformers.BertModel(transformers.BertConfig(**hf))
    assert bertjax.param_counts(config)["model"] == sum(p.numel() for p in model.parameters())


def test_mlm_head_is_counted_once_with_its_tied_decoder():
  c = A.model_configs(A.FULL, 8000)["albert"]
  with_head, without = bertjax.param_counts(c, ("mlm",)), bertjax.param_counts(c)
  e, v = c.embed_dim, c.vocab_size
  # dense H -> E, LayerNorm(E), output bias; the decoder is the word embedding matrix.
  assert with_head["mlm"] == c.hidden_size * e + e + 2 * e + v
  assert with_head["total"] == without["model"] + with_head["mlm"]


def test_verdict_rules():
  quality = lambda h, unigram=99.0: rules.QUALITY.verdict(rules.quality_quantities(h, unigram))
  good = {"bert": 6.0, "albert": 6.3, "shared_only": 6.25, "factorized_only": 6.05}
  assert quality(good) == "yes"
  assert quality({**good, "shared_only": 6.0, "factorized_only": 6.1}) == "partly"
  assert quality({**good, "albert": 5.9}) == "partly"
  assert quality({"bert": 6.0, "albert": 5.9, "shared_only": 5.9, "factorized_only": 6.0}) == "no"
  assert quality(good, unigram=6.5) == "yes"
  assert quality(good, unigram=6.05) == "n/a"  # nothing learned beyond frequencies
  compute = lambda ratio: rules.COMPUTE.verdict({rules.STEP: ratio})
  assert compute(1.02) == "yes" and compute(0.8) == "partly" and compute(0.5) == "no"
  params = lambda base, small: rules.PARAMS.verdict(
    {rules.BASE: base, rules.BASE_ERROR: abs(base - rules.PAPER_BASE_RATIO), rules.SMALL: small}
  )
  assert params(0.107, 0.2) == "yes" and params(0.3, 0.5) == "partly"
  assert params(0.9, 0.95) == "no"


def check_smoke(doc: dict, out: pathlib.Path) -> None:
  """The smoke run's programs compiled unoptimised (`study.quick_compiles`; run by
  `test_experiments.py` on its smoke run)."""
  assert doc["settings"]["xla_optimised"] is False
  # The quality row's interval over the held-out sequences, the four models paired.
  quality = rules.uncertainty(doc["results"], doc["settings"])[1]
  assert quality.span is not None and "held-out sequences" in quality.text
  assert quality.values[rules.ALBERT_COST] == pytest.approx(doc["findings"][1]["value"]["value"])
  r = doc["results"]
  for v in A.VARIANTS:  # each model's per-sequence losses add up to its held-out loss
    seq = r["runs"][v]["heldout_sequences"]
    mean = sum(seq["loss_sum"]) / sum(seq["masked"])
    assert mean == pytest.approx(r["heldout"][v]["mlm_loss"], abs=1e-4)
  del r["data"]["heldout_sequence_unigram_loss_sum"]  # as in a run that predates them
  assert "rerun needed" in rules.uncertainty(r, doc["settings"])[1].text
