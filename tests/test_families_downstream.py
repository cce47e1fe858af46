"""Everything downstream of the encoder on RoBERTa, ELECTRA and DistilBERT (random, tiny).

Each family gets a random 3-layer model with 5 heads of 8 (ELECTRA with E=24 != H=40,
DistilBERT with sinusoidal positions) and an MLM head, saved with `to_hf` beside a
tokenizer trained here on the project's sentences in the family's own files: byte-level
BPE `vocab.json` + `merges.txt` for RoBERTa (`<s>`, `</s>`, `<pad>` = 1, `<mask>`),
WordPiece `vocab.txt` for ELECTRA and DistilBERT. Batches are sentence pairs, so
DistilBERT's tokenizer marks a second segment the model has no embedding for.

Checked on each: an ablation sweep equals a loop of masked forward passes; head
importance equals |d loss / d xi| and is finite and nonzero; pruning equals masking and
exports; Clark's statistics on both paths equal NumPy on the maps; word features align
to transformers' subwords (byte-level BPE with `add_prefix_space=True`); cloze scores and
PLL come from the MLM head, with the blank as the family's mask token; `bertjax finetune
--init-from` trains and exports a model transformers loads (label names in `id2label`; RoBERTa
by hub id from a cache laid out in the test, as ELECTRA's report); `pretrain` names the
family it refuses; two experiments' `--smoke` runs take `--model DIR`.
"""

import csv
import json
import os
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pyrunner
import pytest
from conftest import FAST_COMPILE

import bertjax
from bertjax.analysis.attention import patterns, statistics
from bertjax.analysis.interventions import ablation
from bertjax.analysis.representations import cloze, features
from bertjax.data import conllu
from bertjax.kernels import ABLATIONS
from bertjax.tasks import negation

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

pytestmark = pytest.mark.hf

REPO = pathlib.Path(__file__).resolve().parents[1]
FAMILIES = ("roberta", "electra", "distilbert")
SIZES = dict(
  hidden_size=40,
  num_hidden_layers=3,
  num_attention_heads=5,
  intermediate_size=48,
  initializer_range=0.3,
)  # wide enough init for peaked, head-specific attention
EXTRA = {
  "roberta": dict(
    max_position_embeddings=130, type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5
  ),
  "electra": dict(max_position_embeddings=128, embedding_size=24),
  "distilbert": dict(max_position_embeddings=128, type_vocab_size=0, sinusoidal_positions=True),
}
HF_TOKENIZER = {
  "roberta": "RobertaTokenizerFast",
  "electra": "ElectraTokenizerFast",
  "distilbert": "DistilBertTokenizerFast",
}
SENTENCES = [
  "The keys to the cabinet are on the table.",
  "Is it raining?",
  "She did not like it, did she?",
  "Nobody has ever seen it.",
]


def _texts():
  with open(REPO / "bertjax" / "resources" / "sentences.tsv", encoding="utf-8") as f:
    texts = [r["sentence"] for r in csv.DictReader(f, delimiter="\t")]
  # The negation cues' affirmative twins, so that the tiny vocabularies hold them as single
  # tokens and the report's attribution section (negated sentence vs twin) runs on each family.
  twins = " ".join(sorted(set(negation.TWINS.values()) - {"s", "'s"}))
  return texts + [" ".join(s.forms) for s in _ud()] + [twins, twins.capitalize()] * 3


def _ud():
  path = next((REPO / "bertjax" / "resources" / "smoke" / "ud_english_ewt").glob("*.conllu"))
  return conllu.read_conllu(path)


def _build(family: str, directory: pathlib.Path, texts) -> pathlib.Path:
  """A random model with an MLM head and a tokenizer in the family's own files."""
  directory.mkdir(parents=True)
  if family == "roberta":
    tok = tokenizers.ByteLevelBPETokenizer()
    tok.train_from_iterator(
      texts,
      vocab_size=600,
      min_frequency=2,
      show_progress=False,
      special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
    )
  else:
    tok = tokenizers.BertWordPieceTokenizer(lowercase=True)
    tok.train_from_iterator(
      texts,
      vocab_size=600,
      show_progress=False,
      special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
    )
    (directory / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
  tok.save_model(str(directory))
  config = bertjax.BertConfig(
    model_type=family, vocab_size=tok.get_vocab_size(), use_pooler=False, **SIZES, **EXTRA[family]
  )
  bertjax.to_hf(config, bertjax.init(config, 3, heads=("mlm",)), directory)
  return directory


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
  root = tmp_path_factory.mktemp("families")
  texts = _texts()
  return {f: _build(f, root / f, texts) for f in FAMILIES}


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, model_dirs):
  """(name, directory, config, params, tokenizer) of one family's random model."""
  directory = model_dirs[request.param]
  config, params = bertjax.from_hf(directory)
  tok = bertjax.Tokenizer.from_pretrained(directory)
  return request.param, directory, config, params, tok


def _pairs(tok):
  """Two batches of sentence pairs (segments 0 and 1 where the tokenizer numbers them)."""
  return [tok.encode(SENTENCES[:2], SENTENCES[2:]), tok.encode(SENTENCES[2:], SENTENCES[:2])]


def _types(config, batch):
  return batch.token_type_ids if config.type_vocab_size else None


def test_models_are_what_the_family_ships(family):
  name, _, config, params, tok = family
  assert config.model_type == name and "mlm" in params and not config.has_pooler
  first = tok.convert_ids_to_tokens([tok.cls_id, tok.sep_id, tok.mask_id])
  assert first == (["<s>", "</s>", "<mask>"] if name == "roberta" else ["[CLS]", "[SEP]", "[MASK]"])
  batch = _pairs(tok)[0]
  assert (batch.input_ids[:, 0] == tok.cls_id).all()
  # WordPiece numbers a pair's segments (ELECTRA); DistilBERT has no token types, so its
  # tokenizer gives all zeros, as transformers' DistilBERT tokenizer gives none.
  assert (batch.token_type_ids.max() > 0) == (name == "electra")
  bertjax.forward(params, config, batch.input_ids, batch.attention_mask, batch.token_type_ids)
  if name == "distilbert":
    with pytest.raises(ValueError, match="no token types"):
      bertjax.forward(
        params, config, batch.input_ids, batch.attention_mask, np.ones_like(batch.token_type_ids)
      )


# Ablation, importance, pruning ------------------------------------------------------------


def test_ablation_sweep_equals_loop_of_masked_forwards(family):
  _, _, config, params, tok = family
  batches = [tok.encode(SENTENCES, SENTENCES[::-1])]
  got = ablation.ablation_sweep(
    params, config, batches, ablation.mean_embedding_cosine, include=("heads", "layer_skip")
  )
  masks = ablation.sweep_masks(config, ("heads", "layer_skip"))

  def loop(kind, head_masks, layer_masks):
    out = []
    for hm, lm in zip(head_masks, layer_masks):
      total = count = 0.0
      for b in batches:
        run = lambda b=b, **kw: (
          bertjax.forward(
            params, config, b.input_ids, b.attention_mask, _types(config, b), **kw
          ).last_hidden_state
        )
        real = b.attention_mask[..., None]
        pooled = lambda h, real=real: (np.asarray(h) * real).sum(1) / real.sum(1)
        x, y = pooled(run(head_mask=hm, head_ablation=kind, layer_mask=lm)), pooled(run())
        cos = (x * y).sum(-1) / np.linalg.norm(x, axis=-1) / np.linalg.norm(y, axis=-1)
        total, count = total + cos.sum(), count + len(cos)
      out.append(total / count)
    return np.asarray(out)

  for kind in ABLATIONS:
    res = got[kind]
    assert res.baseline == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(res.heads.ravel(), loop(kind, *masks["heads"]), atol=2e-5)
    assert res.heads.min() < 0.999  # the ablations change the model
  np.testing.assert_allclose(
    got["scale"].layer_skip, loop("scale", *masks["layer_skip"]), atol=2e-5
  )


def _mlm_batches(tok):
  """Pairs whose labels are every real non-special token: MLM reconstruction."""
  out = []
  for b in _pairs(tok):
    keep = (b.attention_mask > 0) & ~np.isin(b.input_ids, list(tok.special_ids))
    labels = np.where(keep, b.input_ids, -100)
    out.append(
      {
        "input_ids": b.input_ids,
        "attention_mask": b.attention_mask,
        "token_type_ids": b.token_type_ids,
        "labels": labels,
      }
    )
  return out


def test_head_importance_is_the_mask_gradient(family):
  _, _, config, params, tok = family
  batches = _mlm_batches(tok)[:1]
  got = ablation.head_importance(
    params, config, batches, ablation.mlm_batch_loss, per_example=False, normalize_layers=False
  )
  assert got.shape == (config.depth, config.num_attention_heads)
  assert np.isfinite(got).all() and (got > 0).all()

  def loss(xi, b):
    out = bertjax.forward(
      params,
      config,
      b["input_ids"],
      b["attention_mask"],
      b["token_type_ids"] if config.type_vocab_size else None,
      head_mask=xi,
    )
    logp = jax.nn.log_softmax(bertjax.head_logits(params, config, out, "mlm"))
    keep = b["labels"] >= 0
    nll = -jnp.take_along_axis(logp, np.where(keep, b["labels"], 0)[..., None], -1)[..., 0]
    return jnp.where(keep, nll, 0).sum() / keep.sum()

  ones = jnp.ones((config.depth, config.num_attention_heads))
  want = np.mean([np.abs(jax.grad(loss)(ones, b)) for b in batches], 0)
  # float32 gradients summed in another order: a small head's can differ by a few 1e-6 of the
  # largest, as seen for ELECTRA on two CPUs (1.07e-7 at 1.8e-5 with the largest 0.48; 1.3e-6
  # at 6.5e-3 with the largest 0.56), so atol scales with the largest. A wrong definition
  # (no absolute value, another loss, the mask in another place) moves heads by far more.
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_pruning_equals_masking_and_exports(family, tmp_path):
  _, _, config, params, tok = family
  prune = {0: [1, 3], 2: [0, 2, 4]}
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
  want = np.asarray(masked.last_hidden_state)[real]
  diff = np.abs(np.asarray(pruned.last_hidden_state)[real] - want)
  # float32 rounding of sums that drop the pruned heads' zero terms, relative to the scale of
  # the states (CI's CPU reached 1.1e-5 on ELECTRA's states, up to ~4 in size); a wrong prune
  # differs by O(1)
  assert diff.max() < 1e-5 * max(1.0, np.abs(want).max()), (diff.max(), np.abs(want).max())
  logits = [
    np.asarray(bertjax.head_logits(p, c, o, "mlm"))[real]
    for p, c, o in ((params, config, masked), (pparams, pconfig, pruned))
  ]
  np.testing.assert_allclose(logits[0], logits[1], atol=1e-4)
  bertjax.to_hf(pconfig, pparams, tmp_path, pruned="remove")
  assert json.loads((tmp_path / "config.json").read_text())["pruned_heads"] == {
    "0": [1, 3],
    "2": [0, 2, 4],
  }
  again_config, again = bertjax.from_hf(tmp_path)
  assert again_config.pruned_heads == pconfig.pruned_heads
  for a, c in zip(jax.tree.leaves(again), jax.tree.leaves(pparams)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(c))


# Attention statistics and patterns ---------------------------------------------------------


@pytest.mark.parametrize("smoothing", [0.0, 1e-4])  # the kernel statistics path; the maps path
def test_clark_statistics_equal_numpy_on_the_maps(family, smoothing):
  name, _, config, params, tok = family
  batches = _pairs(tok)
  punct = statistics.clark_punctuation_ids(tok)
  assert len(punct) >= 2
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
      assert ids[0] == tok.cls_id and (ids == tok.sep_id).sum() == (3 if name == "roberta" else 2)
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
  assert got["sep"].max() > 0.05 and got["punct"].max() > 0.01


def test_attention_statistics_kernel_path_and_patterns(family):
  _, _, config, params, tok = family
  b = _pairs(tok)[0]
  special = np.isin(b.input_ids, [tok.cls_id, tok.sep_id])
  stats = bertjax.attention_statistics(
    params, config, b.input_ids, b.attention_mask, _types(config, b), special_mask=special
  )
  maps = np.asarray(
    bertjax.forward(
      params, config, b.input_ids, b.attention_mask, _types(config, b), output_attentions=True
    ).attentions
  )
  real = b.attention_mask > 0
  rows = real[None, :, None, :] / real.sum(-1)[None, :, None, None]
  np.testing.assert_allclose(stats["first"], (maps[..., 0] * rows).sum(-1), atol=1e-5)
  np.testing.assert_allclose(
    stats["special"], ((maps * special[None, :, None, None]).sum(-1) * rows).sum(-1), atol=1e-5
  )
  counts = patterns.pattern_types(params, config, _pairs(tok), special_ids=[tok.cls_id, tok.sep_id])
  assert counts.counts.sum() == 4 * config.depth * config.num_attention_heads
  feats = patterns.pattern_features(maps, special, b.attention_mask, b.token_type_ids)
  # Block features need segments: RoBERTa's and DistilBERT's tokenizers give pairs none.
  assert np.isnan(feats["block"]).all() == (family[0] in ("roberta", "distilbert"))


# Probing features ---------------------------------------------------------------------------


def test_word_features_align_as_transformers_tokenizers(family):
  name, directory, config, params, tok = family
  sentences = [list(s.forms) for s in _ud()[:12]]
  theirs = getattr(transformers, HF_TOKENIZER[name]).from_pretrained(
    str(directory), **({"add_prefix_space": True} if name == "roberta" else {})
  )
  got = {
    p: features.extract_word_features(
      params, config, tok, sentences, pooling=p, length_multiple=64, progress=False
    )
    for p in features.POOLINGS
  }
  enc = theirs(sentences, is_split_into_words=True, padding=True, return_tensors="np")
  ours = tok.encode_words(sentences)
  np.testing.assert_array_equal(ours.input_ids, enc["input_ids"])
  hidden = np.asarray(
    bertjax.forward(
      params, config, enc["input_ids"], enc["attention_mask"], output_hidden_states=True
    ).hidden_states
  )
  for i, words in enumerate(sentences):
    word_ids = np.asarray([-1 if w is None else w for w in enc.word_ids(i)])
    np.testing.assert_array_equal(ours.word_ids[i], word_ids)
    for w in range(len(words)):
      where = np.flatnonzero(word_ids == w)
      np.testing.assert_allclose(got["first"].sentence(i)[:, w], hidden[:, i, where[0]], atol=1e-5)
      np.testing.assert_allclose(
        got["mean"].sentence(i)[:, w], hidden[:, i, where].mean(1), atol=1e-5
      )
  assert got["first"].features.shape == (
    config.depth + 1,
    sum(map(len, sentences)),
    config.hidden_size,
  )


# Cloze --------------------------------------------------------------------------------------


def _hf_cloze_tokenizer(name, directory):
  cls = getattr(transformers, HF_TOKENIZER[name])
  if name == "roberta":  # what roberta-base's tokenizer.json declares: <mask> takes the space
    return cls.from_pretrained(
      str(directory), mask_token=tokenizers.AddedToken("<mask>", lstrip=True)
    )
  return cls.from_pretrained(str(directory))


def test_cloze_scores_come_from_the_mlm_head(family):
  name, directory, config, params, tok = family
  texts = ["The keys to the [MASK] are on the table.", "She did not like [MASK] ."]
  words = [["table", "cabinet"], ["it", "the"]]
  scores = cloze.score_queries((config, params), tok, texts, words, k=5, batch_size=4)
  theirs = _hf_cloze_tokenizer(name, directory)
  enc = theirs(
    [t.replace("[MASK]", theirs.mask_token) for t in texts], padding=True, return_tensors="np"
  )
  out = bertjax.forward(params, config, enc["input_ids"], enc["attention_mask"])
  logps = np.asarray(jax.nn.log_softmax(bertjax.head_logits(params, config, out, "mlm")))
  for i, text in enumerate(texts):
    ids = enc["input_ids"][i][enc["attention_mask"][i] > 0].tolist()
    assert tok.encode([cloze.mask_text(tok, text)]).input_ids[0].tolist() == ids
    # Candidates: the word as the blank's slot holds it (after a space: "Ġtable").
    cand = [
      theirs(" " + w if name == "roberta" else w, add_special_tokens=False)["input_ids"]
      for w in words[i]
    ]
    np.testing.assert_array_equal(scores.target_ids[i], [c[0] if len(c) == 1 else -1 for c in cand])
    logp = logps[i]
    at = ids.index(theirs.mask_token_id)
    assert set(scores.topk[i].tolist()) == set(np.argsort(-logp[at])[:5].tolist())
    for j, t in enumerate(scores.target_ids[i]):
      if t >= 0:
        assert scores.target_logprob[i, j] == pytest.approx(logp[at, t], abs=1e-4)
  assert (scores.target_ids >= 0).sum() >= 2


def test_pseudo_log_likelihood_masks_each_token_in_turn(family):
  _, _, config, params, tok = family
  sentence = SENTENCES[0]
  got, per_token = cloze.pseudo_log_likelihood(
    (config, params), tok, [sentence], return_tokens=True
  )
  ids = tok.encode([sentence]).input_ids[0]
  where = np.arange(1, len(ids) - 1)  # every token between the two special ones
  masked = np.repeat(ids[None], len(where), 0)
  masked[np.arange(len(where)), where] = tok.mask_id  # copy r has token where[r] masked
  out = bertjax.forward(params, config, masked)
  logp = jax.nn.log_softmax(bertjax.head_logits(params, config, out, "mlm"))
  want = np.asarray(logp)[np.arange(len(where)), where, ids[where]]
  np.testing.assert_allclose(per_token[0], want, atol=1e-4)
  assert got[0] == pytest.approx(want.sum(), abs=1e-3)


# Fine-tuning through the command line, export -----------------------------------------------

CLASSES = {
  "roberta": "RobertaForSequenceClassification",
  "electra": "ElectraForSequenceClassification",
  "distilbert": "DistilBertForSequenceClassification",
}


def _env(**extra):
  return dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    HF_HUB_OFFLINE="1",
    TRANSFORMERS_OFFLINE="1",
    XLA_FLAGS=FAST_COMPILE,
    **extra,
  )


def _hub_cache(directory: pathlib.Path, hf_home: pathlib.Path, repo_id: str) -> None:
  """Places a model directory in a `huggingface_hub` cache under `hf_home`, as the hub's own
  download would lay it out (a snapshot per commit, `refs/main` naming it)."""
  import shutil

  commit = "0123456789abcdef0123456789abcdef01234567"
  repo = hf_home / "hub" / ("models--" + repo_id.replace("/", "--"))
  shutil.copytree(directory, repo / "snapshots" / commit)
  (repo / "refs").mkdir()
  (repo / "refs" / "main").write_text(commit)


@pytest.mark.slow
def test_finetune_command_from_any_family_exports_for_transformers(family, tmp_path):
  name, directory, _config, _, tok = family
  with open(REPO / "bertjax" / "resources" / "sentences.tsv", encoding="utf-8") as f:
    rows = list(csv.DictReader(f, delimiter="\t"))[:40]
  table = tmp_path / "train.tsv"
  label = lambda r: "negated" if r["negated"] == "1" else "plain"
  table.write_text(
    "sentence\tother\tlabel\n"
    + "".join(
      f"{r['sentence']}\t{rows[-1 - i]['sentence']}\t{label(r)}\n" for i, r in enumerate(rows)
    )
  )
  out = tmp_path / "run"
  # RoBERTa's run names its model by a hub id, read offline from a cache laid out here.
  source, env = str(directory), _env()
  if name == "roberta":
    source = "bertology/tiny-roberta"
    _hub_cache(directory, tmp_path / "hf_home", source)
    env = _env(HF_HOME=str(tmp_path / "hf_home"))
  proc = pyrunner.run(
    [
      sys.executable,
      "-m",
      "bertjax.cli",
      "finetune",
      "--init-from",
      source,
      "--table",
      str(table),
      "--pair-column",
      "other",
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
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
  model_dir = out / "model"
  hf = json.loads((model_dir / "config.json").read_text())
  assert hf["architectures"] == [CLASSES[name]] and hf["model_type"] == name
  assert hf["id2label"] == {"0": "negated", "1": "plain"}
  config2, params2 = bertjax.from_hf(model_dir)
  assert config2.label_names == ("negated", "plain") and "classifier" in params2
  assert "pooler" not in params2 and "mlm" not in params2
  tok2 = bertjax.Tokenizer.from_pretrained(model_dir)
  assert (tok2.cls_id, tok2.sep_id, tok2.pad_id) == (tok.cls_id, tok.sep_id, tok.pad_id)
  # transformers loads the export with no missing or unexpected keys, and agrees.
  model, info = getattr(transformers, CLASSES[name]).from_pretrained(
    str(model_dir), output_loading_info=True, attn_implementation="eager"
  )
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  b = tok2.encode(SENTENCES[:2], SENTENCES[2:])
  ours = bertjax.head_logits(
    params2,
    config2,
    bertjax.forward(params2, config2, b.input_ids, b.attention_mask, _types(config2, b)),
    "classifier",
  )
  kw = {"token_type_ids": torch.tensor(b.token_type_ids).long()} if name == "electra" else {}
  with torch.no_grad():
    theirs = model.eval()(
      input_ids=torch.tensor(b.input_ids).long(),
      attention_mask=torch.tensor(b.attention_mask).long(),
      **kw,
    ).logits
  np.testing.assert_allclose(np.asarray(ours), theirs.numpy(), atol=1e-4)


def test_pretrain_resolves_a_hub_id_and_refuses_a_family_it_cannot_continue(model_dirs, tmp_path):
  """`bertjax pretrain --init-from org/name` reads the hub cache; a RoBERTa model there with
  the default NSP objective gets a one-line error naming the head it lacks and MLM alone."""
  _hub_cache(model_dirs["roberta"], tmp_path / "hf_home", "bertology/tiny-roberta")
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("\n".join(SENTENCES) + "\n")
  run = lambda model: pyrunner.run(
    [
      sys.executable,
      "-m",
      "bertjax.cli",
      "pretrain",
      "--corpus",
      str(corpus),
      "--init-from",
      model,
      "--steps",
      "1",
      "--output-dir",
      str(tmp_path / "run"),
    ],
    cwd=tmp_path,
    env=_env(HF_HOME=str(tmp_path / "hf_home")),
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  refused, missing = run("bertology/tiny-roberta"), run("bertology/not-cached")
  for proc in (refused, missing):
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert "'roberta' model has no NSP head" in refused.stderr
  assert "--objective none" in refused.stderr
  assert "snapshots" in refused.stderr  # the resolved cache directory is named
  assert "'bertology/not-cached'" in missing.stderr and str(tmp_path / "hf_home") in missing.stderr


# Experiments with --model --------------------------------------------------------------------


@pytest.mark.slow  # 6 subprocess runs: about a third of this file's ~4 CPU-minutes
@pytest.mark.parametrize("experiment", ["what_bert_looks_at", "anisotropy"])
def test_experiment_smoke_runs_on_the_family(family, experiment, tmp_path):
  from test_experiments import run_smoke

  _, directory, config, _, _ = family
  doc, _out = run_smoke(experiment, tmp_path, "--model", str(directory))
  assert doc["smoke"] is True and doc["settings"]["model"] == str(directory)
  assert doc["findings"] and all(
    f["holds"] in ("yes", "partly", "no", "n/a") for f in doc["findings"]
  )
  if experiment == "what_bert_looks_at":
    sep = np.asarray(doc["results"]["clark"]["sep"])
    assert sep.shape == (config.depth, config.num_attention_heads) and np.isfinite(sep).all()
  else:
    assert len(doc["results"]["per_layer"]["anisotropy"]) == config.depth + 1


@pytest.mark.slow  # three reduced reports in subprocesses
def test_report_runs_on_the_family(family, tmp_path):
  """`bertjax report --model DIR --reduced` on RoBERTa, ELECTRA (by hub id) and DistilBERT."""
  name, directory, config, _, _tok = family
  out = tmp_path / "report"
  source, env = str(directory), _env()
  if name == "electra":  # by hub id, from a cache laid out here
    source = "bertology/tiny-electra"
    _hub_cache(directory, tmp_path / "hf_home", source)
    env = _env(HF_HOME=str(tmp_path / "hf_home"))
  proc = pyrunner.run(
    [
      sys.executable,
      "-m",
      "bertjax.cli",
      "report",
      "--model",
      source,
      "--reduced",
      "--sections",
      "clark,attribution",  # what it checks; the MiniLM report runs them all
      "--out",
      str(out),
    ],
    cwd=tmp_path,
    env=env,
    capture_output=True,
    text=True,
    timeout=900,
    check=False,
  )
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
  doc = json.loads((out / "report.json").read_text())
  failed = {k: v["error"] for k, v in doc.items() if isinstance(v, dict) and v.get("failed")}
  assert not failed, failed  # a failing section is shown on the page; none may fail here
  assert doc["model"]["model_type"] == name and doc["model"]["layers"] == config.depth
  sep = np.asarray(doc["clark"]["sep"], float)
  assert sep.shape == (config.depth, config.num_attention_heads) and np.isfinite(sep).all()
  assert doc["attribution"]["available"], doc["attribution"].get("reason")
  assert np.asarray(doc["attribution"]["patching"]["exact"]).shape == (
    config.depth,
    config.num_attention_heads,
  )
  page = (out / "index.html").read_text()
  assert "9. Token attribution" in page and "Traceback" not in page
