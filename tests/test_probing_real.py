"""The probing suite on the real all-MiniLM-L6-v2 and UD English-EWT dev (a 600-sentence subset)."""

import json

import numpy as np
import pytest

import bertjax
from bertjax.analysis.representations import probing_run, structural
from bertjax.data import conllu

# Measured on this subset: layer 0 ~87.7%, best layer (3) ~94.0% UPOS accuracy.
MARGIN = 0.03


@pytest.mark.optimized
@pytest.mark.data
def test_upos_probe_by_layer_on_minilm(minilm_dir, data_dir, tmp_path):
  config, params = bertjax.from_hf(minilm_dir)
  tok = bertjax.Tokenizer.from_pretrained(minilm_dir)
  sents = conllu.read_conllu(data_dir / "ud_english_ewt" / "en_ewt-ud-dev.conllu", 600)
  suite = probing_run.SuiteConfig(
    tasks=("upos",),
    anisotropy_pairs=500,
    structural_max_sentences=150,
    structural_config=structural.StructuralConfig(
      rank=32, learning_rate=3e-3, max_steps=200, batch_size=32, eval_every=100, patience=None
    ),
  )
  res = probing_run.run_probing_suite(
    params, config, tok, sents, suite=suite, model_name="all-MiniLM-L6-v2"
  )
  upos = res["upos"]
  acc = np.asarray(upos["accuracy"])
  assert acc.shape == (config.depth + 1,) == (7,)
  best = upos["best_layer"]
  assert acc[best] - acc[0] >= MARGIN, acc
  assert upos["selectivity"][best] > 0, upos
  assert 0.85 < acc[best] <= 1.0
  # Per test sentence, what a confidence interval over sentences resamples: it adds up.
  by = upos["test_by_sentence"]
  assert sum(by["rows"]) == upos["test_size"] and len(by["correct"]) == 7
  np.testing.assert_allclose(np.sum(by["correct"], 1) / upos["test_size"], acc, atol=1e-6)
  np.testing.assert_allclose(
    np.sum(by["control_correct"], 1) / upos["test_size"], upos["control_accuracy"], atol=1e-6
  )
  assert res["features"]["words"] == sum(s.num_words for s in sents)
  for kind, keys in (("distance", ("uuas", "spearman")), ("depth", ("root_accuracy", "spearman"))):
    for k in keys:
      vals = np.asarray(res["structural"][kind][k])
      assert vals.shape == (7,) and np.all((vals >= -1) & (vals <= 1))
  assert len(res["anisotropy"]["raw"]) == 7
  from bertjax.plots import probing as probing_plots

  files = probing_plots.write_probing_outputs(res, tmp_path)
  assert files[-1] == str(tmp_path / "probing.json")
  written = json.loads((tmp_path / "probing.json").read_text())
  assert written["upos"]["accuracy"] == upos["accuracy"]
  for name in ("probe_upos.png", "structural.png", "anisotropy.png"):
    assert (tmp_path / name).stat().st_size > 1000
