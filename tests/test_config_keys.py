"""A `config.json` key bertjax does not know is refused by name (issue #60).

`BertConfig.from_hf_dict` (and so `from_hf`) reads some keys of a family's `config.json`,
knows others change nothing (`families.IGNORED_CONFIG_KEYS`, the row's `ignored_keys`) and
refuses the rest, naming them and the family, so a checkpoint whose block differs from its
row never loads without a word; `allow_unknown_keys` loads it anyway. Every config that
transformers writes for the families' reference classes, every family's own export and the
real checkpoints still load. No JAX program is compiled.
"""

import json
import shutil

import pytest

import bertjax
from bertjax import hub
from bertjax.model.families import FAMILIES, IGNORED_CONFIG_KEYS, MODEL_TYPES

# The transformers config class of each family's reference models (tests/test_families.py,
# tests/test_modern_families.py, tests/test_deberta.py), with the options those tests set.
REFERENCE_CONFIGS = {
  "bert": ("BertConfig", {}),
  "albert": ("AlbertConfig", dict(num_hidden_groups=2, inner_group_num=2)),
  "roberta": ("RobertaConfig", {}),
  "xlm-roberta": ("XLMRobertaConfig", {}),
  "electra": ("ElectraConfig", dict(embedding_size=24)),
  "distilbert": ("DistilBertConfig", dict(sinusoidal_pos_embds=True)),
  "mpnet": ("MPNetConfig", {}),
  "nomic_bert": ("NomicBertConfig", {}),
  "modernbert": ("ModernBertConfig", dict(global_attn_every_n_layers=2, local_attention=4)),
  "eurobert": ("EuroBertConfig", dict(num_key_value_heads=2, mask_token_id=3)),
  "ultrabert": ("UltrabertConfig", dict(num_key_value_heads=2, sliding_window=2)),
  # Remote code only: the config.json its released code writes (tests/reference_neobert.py).
  "neobert": ("reference_neobert", {}),
  "gemma3_text": (
    "Gemma3TextConfig",
    # head_dim = hidden / heads, as EmbeddingGemma's (Gemma 3's default 256 is not)
    dict(num_key_value_heads=2, head_dim=288, sliding_window=4, use_bidirectional_attention=True),
  ),
  "deberta-v2": (
    "DebertaV2Config",
    dict(relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=8, legacy=False),
  ),
}


def _exported(model_type: str) -> dict:
  """The `config.json` bertjax's own export writes for a family's default config."""
  config = bertjax.BertConfig.for_family(model_type)
  return json.loads(json.dumps(config.to_hf_dict([config.family.architecture(())])))


def test_every_family_has_a_reference_config():
  assert set(REFERENCE_CONFIGS) == set(MODEL_TYPES)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_an_unknown_key_is_refused_naming_it_and_the_family(model_type):
  hf = _exported(model_type)
  assert bertjax.BertConfig.from_hf_dict(hf).model_type == model_type  # the export loads
  with pytest.raises(ValueError) as e:
    bertjax.BertConfig.from_hf_dict(dict(hf, use_fancy_norm=True, zeta_scale=2))
  message = str(e.value)
  assert "['use_fancy_norm', 'zeta_scale']" in message and repr(model_type) in message
  assert "allow_unknown_keys" in message
  config = bertjax.BertConfig.from_hf_dict(
    dict(hf, use_fancy_norm=True, zeta_scale=2), allow_unknown_keys=["use_fancy_norm", "zeta_scale"]
  )
  assert config == bertjax.BertConfig.from_hf_dict(hf)


def test_a_key_is_known_only_to_the_families_that_read_or_ignore_it():
  bert = _exported("bert")
  # A rotary theta (the older layout), MPNet's buckets, DeBERTa's terms, ELECTRA's
  # multiple-choice summary, ModernBERT's sparse MLM loss: read or ignored by their own
  # family, refused on BERT.
  for key, value, family in (
    ("rope_theta", 10000.0, "nomic_bert"),
    ("relative_attention_num_buckets", 64, "mpnet"),
    ("pos_att_type", ["c2p"], "deberta-v2"),
    ("summary_type", "first", "electra"),
    ("sparse_prediction", True, "modernbert"),
  ):
    with pytest.raises(ValueError, match=key):
      bertjax.BertConfig.from_hf_dict(dict(bert, **{key: value}))
    own = {k: v for k, v in _exported(family).items() if k != "rope_parameters"}
    bertjax.BertConfig.from_hf_dict(dict(own, **{key: value}))
  # A key the layout read instead makes redundant is refused too: which one would win?
  nomic = dict(_exported("nomic_bert"), rope_theta=10000.0)
  with pytest.raises(ValueError, match=r"'nomic_bert' family does not know: \['rope_theta'\]"):
    bertjax.BertConfig.from_hf_dict(nomic)
  # A key transformers' PretrainedConfig carries loads on every family.
  for model_type in MODEL_TYPES:
    bertjax.BertConfig.from_hf_dict(dict(_exported(model_type), problem_type="regression"))
  assert "problem_type" in IGNORED_CONFIG_KEYS
  assert "summary_type" in FAMILIES["electra"].ignored_keys


def test_a_value_bertjax_does_not_implement_is_refused_by_name():
  bert = _exported("bert")
  for key in ("is_decoder", "add_cross_attention", "is_encoder_decoder"):
    bertjax.BertConfig.from_hf_dict(dict(bert, **{key: False}))
    with pytest.raises(ValueError, match=f"{key}=True .* 'bert' model"):
      bertjax.BertConfig.from_hf_dict(dict(bert, **{key: True}))
  deberta = dict(_exported("deberta-v2"), pooler_hidden_size=1000)
  with pytest.raises(ValueError, match="pooler_hidden_size=1000 differs from hidden_size=768"):
    bertjax.BertConfig.from_hf_dict(deberta)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_every_config_transformers_writes_for_a_family_loads(model_type, tmp_path):
  transformers = pytest.importorskip("transformers")
  name, options = REFERENCE_CONFIGS[model_type]
  if name == "reference_neobert":
    import reference_neobert

    hf = reference_neobert.config_json(reference_neobert.NeoBERTConfig(num_labels=3), "NeoBERT")
    saved = everything = hf
  else:
    reference = getattr(transformers, name)(num_labels=3, **options)
    reference.save_pretrained(tmp_path)  # transformers' own file: its defaults written out
    saved = json.loads((tmp_path / "config.json").read_text())
    everything = json.loads(json.dumps(reference.to_dict()))  # every attribute it has
  for hf in (saved, everything):
    config = bertjax.BertConfig.from_hf_dict(hf)
    assert (config.model_type, config.num_labels) == (model_type, 3)


def test_the_released_modernbert_layout_loads():
  """ModernBERT's released config.json (older keys, before `layer_types`)."""
  hf = dict(
    _exported("modernbert"),
    global_attn_every_n_layers=3,
    global_rope_theta=160000.0,
    local_rope_theta=10000.0,
    layer_norm_eps=1e-5,
    norm_eps=1e-5,
    reference_compile=True,
    repad_logits_with_grad=False,
    gradient_checkpointing=False,
    position_embedding_type="absolute",
    torch_dtype="float32",
  )
  for key in ("layer_types", "rope_parameters"):
    del hf[key]
  config = bertjax.BertConfig.from_hf_dict(hf)
  assert config.rope_theta == 160000.0 and config.layer_types[:3] == (
    "full_attention",
    "sliding_attention",
    "sliding_attention",
  )


def test_the_real_checkpoints_configs_load(minilm_dir):
  mpnet = hub.installed_path(hub.MODELS["sentence-transformers/all-mpnet-base-v2"])
  for path in [minilm_dir] + ([mpnet] if mpnet is not None else []):
    bertjax.BertConfig.from_hf_dict(json.loads((path / "config.json").read_text()))


def _with_key(source, tmp_path, **keys):
  """A copy of the model directory `source` whose config.json has `keys` added."""
  model = tmp_path / "model"
  shutil.copytree(source, model)
  hf = json.loads((model / "config.json").read_text())
  (model / "config.json").write_text(json.dumps(dict(hf, **keys)))
  return model


def test_from_hf_refuses_an_unknown_key_and_loads_it_when_allowed(minilm_dir, tmp_path):
  model = _with_key(minilm_dir, tmp_path, use_fancy_norm=True)
  with pytest.raises(ValueError, match=r"'bert' family does not know: \['use_fancy_norm'\]"):
    bertjax.from_hf(model)
  config, params = bertjax.from_hf(model, allow_unknown_keys=["use_fancy_norm"])
  plain, _ = bertjax.from_hf(minilm_dir)
  assert config == plain and params["encoder"]


def test_the_cli_prints_the_refusal_as_one_line(minilm_dir, tmp_path, capsys):
  from bertjax import cli

  model = _with_key(minilm_dir, tmp_path, use_fancy_norm=True)
  code = cli.main(["report", "--model", str(model), "--out", str(tmp_path / "out"), "--quiet"])
  err = capsys.readouterr().err.strip()
  assert code == 1 and "Traceback" not in err and len(err.splitlines()) == 1, err
  assert err.startswith("bertjax: error: config.json has keys") and "'use_fancy_norm'" in err
  assert "'bert' family" in err
  assert not (tmp_path / "out").exists()
