"""Configs grouped by concern: how a model runs in `config.runtime`, its task heads in
`config.task`, a family's own options in `config.options`; what the trainers and the heads
may do with a family in its row; and no branch on a family's name outside the table.
"""

import dataclasses
import json
import pathlib
import re

import pytest

import bertjax
from bertjax.model import options
from bertjax.model.config import config_from_json, config_to_json
from bertjax.model.families import FAMILIES
from bertjax.model.settings import GROUP_OF, Runtime, TaskHeads
from bertjax.training import compression, electra, stacking

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_a_config_carries_only_its_own_familys_options():
  fields = {f.name for f in dataclasses.fields(bertjax.BertConfig)}
  assert not fields & set(options.OWNER), "an option of one family is a field of every config"
  for name, row in FAMILIES.items():
    config = bertjax.BertConfig.for_family(name)
    if row.options is None:
      assert config.options is None
    else:
      assert row.options in options.OPTION_CLASSES and isinstance(config.options, row.options)
  bert = bertjax.BertConfig.preset("tiny")
  with pytest.raises(AttributeError, match="'pos_att_type' is a DeBERTa option; a bert config"):
    _ = bert.pos_att_type
  with pytest.raises(AttributeError, match="has no attribute 'nonsense'"):
    _ = bert.nonsense
  with pytest.raises(ValueError, match="share_att_key=True is a DeBERTa option"):
    bertjax.BertConfig(share_att_key=True)
  with pytest.raises(ValueError, match="sinusoidal_positions=True is a DistilBERT option"):
    bert.replace(sinusoidal_positions=True)
  with pytest.raises(ValueError, match="a bert config holds None"):
    bertjax.BertConfig(options=options.MPNetOptions())
  with pytest.raises(TypeError, match=r"unknown fields \['nonsense'\]"):
    bertjax.BertConfig(nonsense=1)


def test_runtime_and_task_fields_live_in_their_groups():
  fields = {f.name for f in dataclasses.fields(bertjax.BertConfig)}
  assert not fields & set(GROUP_OF)
  assert {"dtype", "attention_impl", "scan_unroll", "num_labels", "classifier_pooling"} <= set(
    GROUP_OF
  )
  config = bertjax.BertConfig.preset("tiny", attention_impl="pallas", num_labels=3)
  assert config.runtime == Runtime(attention_impl="pallas") and config.attention_impl == "pallas"
  assert config.task == TaskHeads(num_labels=3) and config.num_labels == 3
  again = config.replace(dtype="bfloat16", label_names=("a", "b", "c"))
  assert again.runtime == Runtime(dtype="bfloat16", attention_impl="pallas")
  assert again.task.label_names == ("a", "b", "c") and again.options is None
  assert bertjax.BertConfig(runtime=Runtime(scan_unroll=2)).scan_unroll == 2
  assert config_from_json(json.loads(json.dumps(config_to_json(again)))) == again
  with pytest.raises(ValueError, match="dtype='float16' must be one of"):
    bertjax.BertConfig(dtype="float16")
  with pytest.raises(ValueError, match="label_names=\\('a',\\) must name num_labels=2"):
    bertjax.BertConfig(label_names=("a",))


def test_options_are_given_and_read_flat_on_their_family():
  deberta = bertjax.BertConfig.preset("deberta-v3-base", num_hidden_layers=2)
  assert deberta.options == options.DebertaOptions(
    relative_attention=True,
    pos_att_type=("p2c", "c2p"),
    position_buckets=256,
    share_att_key=True,
    norm_rel_ebd="layer_norm",
    position_biased_input=False,
  )
  assert deberta.pos_att_type == ("p2c", "c2p") and deberta.position_table is None
  changed = deberta.replace(share_att_key=False, pos_att_type="c2p")
  assert changed.options.share_att_key is False and changed.pos_att_type == ("c2p",)
  assert changed.num_hidden_layers == 2 and hash(changed) != hash(deberta)
  whole = bertjax.BertConfig.for_family("deberta-v2", options=changed.options)
  assert whole.options == changed.options
  with pytest.raises(ValueError, match="pos_att_type=.*p2p"):
    deberta.replace(pos_att_type=("p2p",))
  with pytest.raises(ValueError, match="relative_attention_num_buckets=16 must be an int >= 32"):
    bertjax.BertConfig.for_family("mpnet", relative_attention_num_buckets=16)
  distil = bertjax.BertConfig.preset("distilbert-base", sinusoidal_positions=True)
  assert distil.position_table == "sinusoidal"
  assert bertjax.BertConfig.preset("tiny").position_table == "learned"
  assert bertjax.BertConfig.preset("modernbert-base").position_table is None


def test_configs_round_trip_through_json_old_and_new():
  for config in (
    bertjax.BertConfig.preset("tiny"),
    bertjax.BertConfig.preset("deberta-v3-base"),
    bertjax.BertConfig.preset("distilbert-base", sinusoidal_positions=True),
    bertjax.BertConfig.preset("mpnet-base"),
  ):
    written = json.loads(json.dumps(config_to_json(config)))
    assert config_from_json(written) == config
    hf = config.to_hf_dict()
    assert bertjax.BertConfig.from_hf_dict(hf) == config
  # A JSON written before the grouping carries every option flat, at its default on BERT.
  old = {k: v for k, v in config_to_json(bertjax.BertConfig.preset("tiny")).items()}
  old.pop("options")
  old.update({f.name: f.default for k in options.OPTION_CLASSES for f in dataclasses.fields(k)})
  old["pos_att_type"] = []
  assert config_from_json(old) == bertjax.BertConfig.preset("tiny")


def test_what_a_family_is_trained_for_is_in_its_row():
  assert stacking.stacking_families() == ["bert"]
  roberta = bertjax.BertConfig.preset("roberta-base", num_hidden_layers=2)
  with pytest.raises(ValueError, match=r"needs one parameter set per layer \(\['bert'\]\)"):
    stacking.grow(roberta, {}, None, 4)
  assert compression.can_share(bertjax.BertConfig.preset("tiny"))
  assert not compression.can_share(bertjax.BertConfig.preset("mpnet-base"))
  gen = bertjax.BertConfig.preset("electra-small", num_hidden_layers=1)
  assert electra.sharing(gen, gen) == "tables"
  deb = bertjax.BertConfig.preset("deberta-v3-base", num_hidden_layers=1)
  assert electra.sharing(deb, deb) == "gdes"
  with pytest.raises(ValueError, match=r"trained for \['deberta-v2', 'electra'\]"):
    electra.sharing(roberta, roberta)
  with pytest.raises(
    ValueError, match=r"classifier_pooling='bos' must be one of \('cls', 'mean'\)"
  ):
    bertjax.BertConfig.for_family("modernbert", classifier_pooling="bos")


def test_no_library_code_branches_on_a_familys_name():
  literal = re.compile(
    r"model_type\s*(==|!=)\s*[\"']|model_type\s+(not\s+)?in\s*[\(\[\{]\s*[\"']|"
    r"\{\s*[\"'](bert|albert|roberta|electra|distilbert|mpnet|modernbert|eurobert|"
    r"nomic_bert|deberta-v2|ultrabert)[\"']\s*:"
  )
  found = [
    f"{path.relative_to(REPO)}:{i}: {line.strip()}"
    for root in ("bertjax",)
    for path in sorted((REPO / root).rglob("*.py"))
    if path.name != "families.py"
    for i, line in enumerate(path.read_text().splitlines(), 1)
    if literal.search(line)
  ]
  assert not found, "branches on a family's name belong in its row:\n" + "\n".join(found)
