"""Fine-tuning: metrics, data loaders (tables, BLiMP, UD POS, GLUE via tfds), training, the CLI."""

import json

import numpy as np
import pytest

import bertjax
from bertjax.cli import train
from bertjax.training import finetune as F


def test_metrics_against_reference_formulas():
  rng = np.random.default_rng(0)
  y, p = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
  m = F.classification_metrics(p, y, 2)
  tp, tn = np.sum((p == 1) & (y == 1)), np.sum((p == 0) & (y == 0))
  fp, fn = np.sum((p == 1) & (y == 0)), np.sum((p == 0) & (y == 1))
  assert m["accuracy"] == pytest.approx((tp + tn) / 200)
  assert m["f1"] == pytest.approx(2 * tp / (2 * tp + fp + fn))
  mcc = (tp * tn - fp * fn) / np.sqrt(float((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)))
  assert m["matthews"] == pytest.approx(mcc)
  x = rng.normal(size=50)
  r = F.regression_metrics(x, 2 * x + rng.normal(scale=0.1, size=50))
  assert r["pearson"] > 0.99 and r["spearman"] > 0.98
  assert F.spearman([1, 2, 2, 3], [1, 2, 2, 3]) == pytest.approx(1.0)
  try:
    from scipy import stats
  except ImportError:
    return
  a, b = rng.normal(size=30), rng.integers(0, 5, 30)
  assert F.spearman(a, b) == pytest.approx(stats.spearmanr(a, b).statistic)
  assert F.pearson(a, b) == pytest.approx(stats.pearsonr(a, b).statistic)


def test_load_tables(tmp_path):
  tsv = tmp_path / "d.tsv"
  tsv.write_text("sentence1\tsentence2\tlabel\nA cat.\tA dog.\t1\nHi there\tBye\t0\n")
  texts, pairs, labels = F.load_table(tsv, "sentence1", "label", "sentence2")
  assert texts == ["A cat.", "Hi there"] and pairs == ["A dog.", "Bye"]
  assert labels.tolist() == [1, 0]
  jl = tmp_path / "d.jsonl"
  jl.write_text('{"text": "good", "score": 0.5}\n{"text": "bad", "score": 1.5}\n')
  texts, pairs, labels = F.load_table(jl, "text", "score", regression=True)
  assert pairs is None and labels.dtype == np.float32 and labels.tolist() == [0.5, 1.5]
  with pytest.raises(ValueError, match="column 'nope'"):
    F.load_table(jl, "nope", "score")


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
  return bertjax.Tokenizer.from_pretrained(minilm_dir)


def test_blimp_loader(data_dir, tokenizer):
  texts, pairs, labels = F.load_blimp(data_dir / "blimp" / "anaphor_number_agreement.jsonl")
  assert len(texts) == 2000 and labels[:4].tolist() == [1, 0, 1, 0] and pairs is None
  data = F.encode_classification(tokenizer, texts[:96], None, labels[:96], max_len=32)
  assert data["input_ids"].shape[0] == 96 and data["input_ids"].shape[1] <= 32
  # Sentence pairs get segment ids 1 on the second sentence.
  pair = F.encode_classification(tokenizer, ["a b"], ["c d"], [1], max_len=16)
  assert pair["token_type_ids"][0].max() == 1
  train, evaluation = F.split(data, 0.25, seed=0)
  assert len(train["labels"]) == 72 and len(evaluation["labels"]) == 24


def test_ud_pos_first_subword_labels_and_training(data_dir, tokenizer):
  path = data_dir / "ud_english_ewt" / "en_ewt-ud-dev.conllu"
  train, evaluation, tags = F.load_ud_pos(path, tokenizer, max_len=64, max_sentences=80)
  assert "NOUN" in tags
  from bertjax.data import conllu

  sents = [s for s in conllu.read_conllu(path, max_sentences=80)]
  # Every labelled position is a word's first subword; counts match the words.
  labelled = (train["labels"] != -100).sum() + (evaluation["labels"] != -100).sum()
  kept_words = sum(s.num_words for s in sents)
  assert 0.9 * kept_words <= labelled <= kept_words
  assert (train["labels"][:, 0] == -100).all()  # [CLS]
  cfg = bertjax.BertConfig.preset("tiny", vocab_size=tokenizer.vocab_size, num_hidden_layers=1)
  config, params = F.prepare_model("token_classification", len(tags), config=cfg)
  assert params["token_classifier"]["dense"]["kernel"].shape == (64, len(tags))
  hp = F.FinetuneConfig(steps=20, batch_size=8, learning_rate=3e-3)
  out = F.finetune(config, params, train, evaluation, task="token_classification", hp=hp)
  assert out["history"][-1]["loss"] < out["history"][0]["loss"]
  assert 0 <= out["metrics"]["accuracy"] <= 1


def test_prepare_model_from_hf_adds_fresh_head(minilm_dir):
  config, params = F.prepare_model("classification", 3, init_from=minilm_dir, seed=1)
  assert config.num_labels == 3
  assert params["classifier"]["dense"]["kernel"].shape == (config.hidden_size, 3)
  assert "mlm" not in params
  with pytest.raises(ValueError, match="exactly one"):
    F.prepare_model("classification", 2)


@pytest.mark.parametrize("task, pair", [("sst2", False), ("mrpc", True)])
def test_glue_through_tfds_mock_data(tokenizer, task, pair):
  """The real tfds GLUE builder, offline: `mock_data` fakes the records, not the loader."""
  tfds = pytest.importorskip("tensorflow_datasets")
  pytest.importorskip("tensorflow", reason="tfds's GLUE builder reads through tf.data")
  with tfds.testing.mock_data(num_examples=12):
    train, evaluation, labels = F.load_glue(task, tokenizer, max_len=32)
  cls, sep = (tokenizer.tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]"))
  for data in (train, evaluation):
    ids, mask, types = data["input_ids"], data["attention_mask"], data["token_type_ids"]
    assert ids.shape[0] == 12 and 4 <= ids.shape[1] <= 32
    assert mask.shape == types.shape == ids.shape
    assert (ids[:, 0] == cls).all()
    lengths = mask.sum(1)
    assert (ids[np.arange(12), lengths - 1] == sep).all()  # every row ends in [SEP]
    assert ((ids == sep) & (mask > 0)).sum(1).tolist() == [2 if pair else 1] * 12
    assert set(np.unique(types[mask > 0])) == ({0, 1} if pair else {0})
    assert set(np.unique(data["labels"])) <= {0, 1} and data["labels"].shape == (12,)
  # The class names come from the task's tfds metadata (they become the export's id2label).
  assert (
    labels == {"sst2": ["negative", "positive"], "mrpc": ["not_equivalent", "equivalent"]}[task]
  )


def test_finetune_help_lists_options(capsys):
  with pytest.raises(SystemExit) as e:
    train.finetune_main(["--help"])
  assert e.value.code == 0
  out = capsys.readouterr().out
  for opt in (
    "--table",
    "--blimp",
    "--ud",
    "--glue",
    "--init-from",
    "--lr",
    "--steps",
    "--pair-column",
    "(default: 2e-05)",
  ):
    assert opt in out, opt


def test_finetune_main_blimp_from_random_init(tmp_path, minilm_dir, data_dir):
  cfg = tmp_path / "cfg.json"
  cfg.write_text(
    json.dumps(
      dict(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
      )
    )
  )
  assert (
    train.finetune_main(
      [
        "--blimp",
        str(data_dir / "blimp" / "anaphor_number_agreement.jsonl"),
        "--max-examples",
        "64",
        "--eval-fraction",
        "0.25",
        "--vocab",
        str(minilm_dir),
        "--config-json",
        str(cfg),
        "--steps",
        "6",
        "--batch-size",
        "8",
        "--lr",
        "1e-3",
        "--max-len",
        "24",
        "--output-dir",
        str(tmp_path / "out"),
      ]
    )
    == 0
  )
  metrics = json.loads((tmp_path / "out" / "summary.json").read_text())
  assert set(metrics["metrics"]) == {"accuracy", "f1", "matthews"}
  assert metrics["labels"] == ["bad", "good"] and np.isfinite(metrics["final_loss"])
  assert len((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()) == 6 + 1
  config, params = bertjax.from_hf(tmp_path / "out" / "model")
  assert config.num_hidden_layers == 1 and "classifier" in params
  assert config.label_names == ("bad", "good")
