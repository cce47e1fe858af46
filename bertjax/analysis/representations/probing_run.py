"""The whole probing suite on a model and a UD treebank, in one call.

``run_probing_suite`` extracts word features of every layer once
(``features.extract_word_features``), splits sentences into train / held-out /
test, and then runs, each for all layers at once:

* linear probes for UPOS, XPOS (per word) and dependency relations (per
  (head, dependent) edge, ``[h_head; h_dep]``, edge probing), each with a control
  task (Hewitt & Liang 2019: every word type gets a random label drawn from the
  label distribution; for edges, the dependent's type) and its selectivity;
* optionally an MLP probe for UPOS;
* structural probes (Hewitt & Manning 2019): distance (UUAS, DSpr.) and depth
  (root accuracy, NSpr.), on sentences up to ``structural_max_len`` words;
* anisotropy per layer (Ethayarajh 2019), raw and mean-centred.

It returns a JSON-serialisable dict and, given ``out_dir``, writes
``probing.json`` and PNG figures there.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from bertjax import claims, stats, utils
from bertjax.analysis.representations import features, geometry, probing
from bertjax.analysis.representations import structural as representations_structural
from bertjax.data import conllu

TASKS = ("upos", "xpos", "deprel")
DEFAULT_PROBE = probing.ProbeConfig(
  l2=1e-5, learning_rate=1e-2, max_steps=1500, batch_size=1024, eval_every=50, patience=4
)
DEFAULT_STRUCTURAL = representations_structural.StructuralConfig(
  rank=64, learning_rate=3e-3, max_steps=1500, batch_size=32, eval_every=100, patience=3
)


@dataclasses.dataclass(frozen=True)
class SuiteConfig:
  """What ``run_probing_suite`` runs and how.

  Attributes:
    tasks: any of ``"upos"``, ``"xpos"``, ``"deprel"``.
    pooling: subword pooling, ``"first"`` or ``"mean"``.
    probe: settings of the linear probes (and the MLP probe, with ``kind="mlp"``).
    mlp: also fit an MLP probe for UPOS.
    control: fit control tasks and report selectivity.
    structural: fit distance and depth probes.
    structural_config: their rank and optimisation settings.
    structural_max_len: only sentences with at most this many words (memory is
      quadratic in the padded length).
    structural_max_sentences: at most this many such sentences (None for all).
    anisotropy_pairs: random word pairs for anisotropy.
    val_fraction, test_fraction: shares of sentences held out for early
      stopping and for the reported scores.
    seed: the split and control-task seed.
    max_tokens: the feature-extraction token budget per batch.
    cache_dir: feature cache directory, or None.
  """

  tasks: tuple[str, ...] = TASKS
  pooling: str = "first"
  probe: probing.ProbeConfig = DEFAULT_PROBE
  mlp: bool = False
  control: bool = True
  structural: bool = True
  structural_config: representations_structural.StructuralConfig = DEFAULT_STRUCTURAL
  structural_max_len: int = 40
  structural_max_sentences: int | None = 1200
  anisotropy_pairs: int = 2000
  val_fraction: float = 0.1
  test_fraction: float = 0.2
  seed: int = 0
  max_tokens: int = 4096
  cache_dir: str | None = None

  def __post_init__(self):
    unknown = set(self.tasks) - set(TASKS)
    if unknown:
      raise ValueError(f"tasks {sorted(unknown)} are unknown; expected a subset of {TASKS}")
    if not 0 < self.val_fraction + self.test_fraction < 1:
      raise ValueError(f"{self.val_fraction=} + {self.test_fraction=} must be in (0, 1)")


def sentence_splits(
  num_sentences: int, val_fraction: float, test_fraction: float, seed: int = 0
) -> dict[str, np.ndarray]:
  """Disjoint sorted sentence indices ``{"train", "val", "test"}`` (seeded)."""
  rest, test = probing.split_indices(num_sentences, test_fraction, seed)
  tr, va = probing.split_indices(len(rest), val_fraction / (1 - test_fraction), seed + 1)
  return {"train": rest[tr], "val": rest[va], "test": test}


def _by_sentence(correct, sentence_of_row) -> dict[str, list]:
  """Test rows' correctness (layers, rows) summed per sentence: the items of a bootstrap
  interval that resamples sentences (a sentence's words are not independent)."""
  ids, group = np.unique(sentence_of_row, return_inverse=True)
  sums = np.zeros((correct.shape[0], len(ids)), np.int64)
  np.add.at(sums.T, group, correct.T.astype(np.int64))
  return {
    "sentences": ids.tolist(),
    "rows": np.bincount(group, minlength=len(ids)).tolist(),
    "correct": sums.tolist(),
  }


def _fit_classifier(
  feats, labels, num_classes, split, config, types=None, seed=0, sentence_of_row=None
):
  """Task (and control) probe on rows split by ``split``; test accuracy per layer (and, with
  ``sentence_of_row``, the test rows' correctness per sentence: ``test_by_sentence``)."""
  tr, va, te = split
  fit = lambda y: probing.Probe(config, num_classes).fit(feats[:, tr], y[tr], feats[:, va], y[va])
  probe = fit(labels)
  out = {
    "accuracy": probe.accuracy(feats[:, te], labels[te]).tolist(),
    "train_accuracy": probe.accuracy(feats[:, tr], labels[tr]).tolist(),
    "steps": probe.fit_info.steps_run.tolist(),
  }
  if types is not None:
    mapping = probing.control_task_mapping([types[i] for i in tr], labels[tr], num_classes, seed)
    # Types unseen in training get their own random labels (same distribution).
    unseen = sorted({types[i] for i in np.concatenate([va, te])} - set(mapping))
    rng = np.random.default_rng(seed + 1)
    probs = np.bincount(labels[tr], minlength=num_classes) / len(tr)
    mapping.update(
      {t: int(c) for t, c in zip(unseen, rng.choice(num_classes, len(unseen), p=probs))}
    )
    control = probing.control_labels(types, mapping)
    cprobe = fit(control)
    out["control_accuracy"] = cprobe.accuracy(feats[:, te], control[te]).tolist()
    out["selectivity"] = probing.selectivity(out["accuracy"], out["control_accuracy"]).tolist()
  if sentence_of_row is not None:
    owner = np.asarray(sentence_of_row)[te]
    out["test_by_sentence"] = _by_sentence(probe.predict(feats[:, te]) == labels[te], owner)
    if types is not None:
      out["test_by_sentence"]["control_correct"] = _by_sentence(
        cprobe.predict(feats[:, te]) == control[te], owner
      )["correct"]
  best = int(np.argmax(out["accuracy"]))
  out.update(
    best_layer=best,
    best_accuracy=out["accuracy"][best],
    num_classes=num_classes,
    train_size=len(tr),
    test_size=len(te),
  )
  return out


def _rows_of(split: dict[str, np.ndarray], sentence_of_row: np.ndarray):
  return tuple(np.flatnonzero(np.isin(sentence_of_row, split[k])) for k in ("train", "val", "test"))


def _structural(wf, sentences, split, suite):
  keep = lambda idx: [
    int(i) for i in idx if 2 <= sentences[i].num_words <= suite.structural_max_len
  ]
  chosen = {k: keep(v) for k, v in split.items()}
  if suite.structural_max_sentences is not None:
    cap = suite.structural_max_sentences
    total = sum(len(v) for v in chosen.values())
    chosen = {
      k: v[: max(1, round(len(v) * cap / total))] if total > cap else v for k, v in chosen.items()
    }
  batch = lambda idx: representations_structural.pad_sentences(
    [np.asarray(wf.sentence(i), np.float32) for i in idx], [sentences[i].heads for i in idx]
  )
  train, val, test = (batch(chosen[k]) for k in ("train", "val", "test"))
  punct = representations_structural.punctuation_masks([sentences[i] for i in chosen["test"]])
  out = {"sentences": {k: len(v) for k, v in chosen.items()}, "test_sentences": chosen["test"]}
  for kind in ("distance", "depth"):
    probe = representations_structural.fit_structural_probe(
      kind, train, val, suite.structural_config
    )
    metrics = representations_structural.evaluate(probe, test, punct)
    out[kind] = {k: np.asarray(v).tolist() for k, v in metrics.items()}
    each = representations_structural.per_sentence(probe, test, punct)
    out[kind]["per_sentence"] = {k: np.asarray(v).tolist() for k, v in each.items()}
  return out


def _word_probe(
  field: str,
  feats,
  sentences,
  word_rows,
  types,
  probe: probing.ProbeConfig,
  suite: SuiteConfig,
  sentence_of_row=None,
):
  """A probe of a per-word field ("upos", "xpos") with its control task; and the labels."""
  vocab = conllu.build_vocab(sentences, field)
  labels = conllu.encode_field(sentences, vocab, field)
  return _fit_classifier(
    feats,
    labels,
    len(vocab),
    word_rows,
    probe,
    types if suite.control else None,
    suite.seed,
    sentence_of_row,
  ), vocab


def _edge_probe(feats, wf, sentences, split, types, suite: SuiteConfig):
  """The dependency-relation probe on (head, dependent) edges, ``[h_head; h_dep]``; and the
  labels (relations without subtypes)."""
  vocab = conllu.build_vocab(sentences, "deprels", strip_subtypes=True)
  rel = [vocab.encode(conllu.base_deprel(r) for r in s.deprels) for s in sentences]
  head, dep, labels = probing.dependency_edges(sentences, rel)
  edge_feats = np.asarray(probing.edge_features(feats, head, dep))  # (L+1, edges, 2H)
  rows = _rows_of(split, wf.sentence_index[dep])
  return _fit_classifier(
    edge_feats,
    labels,
    len(vocab),
    rows,
    suite.probe,
    [types[i] for i in dep] if suite.control else None,
    suite.seed,
    wf.sentence_index[dep],
  ), vocab


def run_probing_suite(
  params: Any,
  config: Any,
  tokenizer: Any,
  sentences: Sequence[conllu.Sentence],
  *,
  suite: SuiteConfig = SuiteConfig(),
  model_name: str = "model",
  progress: bool = False,
) -> dict[str, Any]:
  """Runs the probing suite on every layer of a model.

  Args:
    params: model parameters.
    config: the model's ``BertConfig``.
    tokenizer: its ``bertjax.Tokenizer``.
    sentences: UD sentences (``conllu.read_conllu``).
    suite: what to run.
    model_name: recorded in the results and figure titles.
    progress: show the feature-extraction progress bar.

  Returns:
    A JSON-serialisable dict: ``features`` (extraction summary), ``splits``,
    one entry per task (per-layer ``accuracy``, ``control_accuracy``,
    ``selectivity``, ``best_layer`` ..., and ``test_by_sentence``: per test sentence its test
    rows and how many of them the probe and the control probe get right, per layer, for
    confidence intervals over sentences), ``upos_mlp``, ``structural`` (with each probe's
    metrics per test sentence, ``per_sentence``), ``anisotropy``, ``seconds`` per stage and
    ``figures``. ``sentence_items`` lines the per-sentence values up for a bootstrap.
  """
  sentences = list(sentences)
  if len(sentences) < 10:
    raise ValueError(f"need at least 10 sentences to split, got {len(sentences)}")
  seconds: dict[str, float] = {}
  t0 = time.perf_counter()
  wf = features.extract_word_features(
    params,
    config,
    tokenizer,
    sentences,
    pooling=suite.pooling,
    max_tokens=suite.max_tokens,
    cache_dir=suite.cache_dir,
    progress=progress,
  )
  feats = np.asarray(wf.features, np.float32)  # (L+1, n_words, H)
  seconds["features"] = time.perf_counter() - t0
  split = sentence_splits(len(sentences), suite.val_fraction, suite.test_fraction, suite.seed)
  word_rows = _rows_of(split, wf.sentence_index)
  types = [w.lower() for s in sentences for w in s.forms]
  results: dict[str, Any] = {
    "model": model_name,
    "layers": int(feats.shape[0]),
    "features": wf.summary(),
    "splits": {k: len(v) for k, v in split.items()},
    "config": utils.to_json(suite),
  }

  for task in suite.tasks:
    t0 = time.perf_counter()
    if task in ("upos", "xpos"):
      results[task], vocab = _word_probe(
        task, feats, sentences, word_rows, types, suite.probe, suite, wf.sentence_index
      )
    else:
      results[task], vocab = _edge_probe(feats, wf, sentences, split, types, suite)
    results[task]["labels"] = list(vocab.labels)
    seconds[task] = time.perf_counter() - t0

  if suite.mlp:
    t0 = time.perf_counter()
    mlp = dataclasses.replace(suite.probe, kind="mlp")
    results["upos_mlp"], _ = _word_probe(
      "upos", feats, sentences, word_rows, types, mlp, suite, wf.sentence_index
    )
    seconds["upos_mlp"] = time.perf_counter() - t0

  if suite.structural:
    t0 = time.perf_counter()
    results["structural"] = _structural(wf, sentences, split, suite)
    seconds["structural"] = time.perf_counter() - t0

  t0 = time.perf_counter()
  results["anisotropy"] = {
    "raw": geometry.anisotropy(feats, suite.anisotropy_pairs, suite.seed).tolist(),
    "centered": geometry.anisotropy(
      feats, suite.anisotropy_pairs, suite.seed, centered=True
    ).tolist(),
  }
  seconds["anisotropy"] = time.perf_counter() - t0
  results["seconds"] = seconds
  return results


def layer_curves(r: dict[str, Any]) -> dict[str, np.ndarray]:
  """Each measure by layer (0 = embeddings) from `run_probing_suite`'s results with the UPOS
  and dependency-relation probes and the structural probes: `upos` and `deprel` (test
  accuracy), `uuas` and `dspr` (distance probe), `root_acc` and `nspr` (depth probe)."""
  s = r["structural"]
  curves = {
    "upos": r["upos"]["accuracy"],
    "deprel": r["deprel"]["accuracy"],
    "uuas": s["distance"]["uuas"],
    "dspr": s["distance"]["spearman"],
    "root_acc": s["depth"]["root_accuracy"],
    "nspr": s["depth"]["spearman"],
  }
  return {k: np.asarray(v, np.float64) for k, v in curves.items()}


PROBES = ("upos", "deprel", "upos_mlp")  # the classifier probes `sentence_items` lines up


def sentence_items(r: dict[str, Any]) -> dict[str, np.ndarray]:
  """The per-sentence values of `run_probing_suite`'s results, lined up on the test
  sentences (the first axis of every array), so that a bootstrap resamples sentences: per
  classifier probe `TASK/rows`, `TASK/correct` and `TASK/control` (counts; the last two per
  layer), and per structural probe (`distance/...`, `depth/...`) `structural.per_sentence`'s
  arrays. A sentence a probe did not test counts nothing in it. `item_curves` gives the
  per-layer measures back.

  Raises:
    KeyError: results from before the suite kept per-sentence values.
  """
  ids = sorted(
    {i for t in PROBES if t in r for i in r[t]["test_by_sentence"]["sentences"]}
    | set(r["structural"]["test_sentences"])
  )
  where = {s: k for k, s in enumerate(ids)}
  items: dict[str, np.ndarray] = {}
  for t in (t for t in PROBES if t in r):
    each = r[t]["test_by_sentence"]
    at = [where[s] for s in each["sentences"]]
    layers = len(each["correct"])
    kept = {"rows": np.asarray(each["rows"], np.float64)[:, None]}
    kept["correct"] = np.asarray(each["correct"], np.float64).T
    if "control_correct" in each:  # a suite run with control tasks
      kept["control"] = np.asarray(each["control_correct"], np.float64).T
    for key, values in kept.items():
      items[f"{t}/{key}"] = np.zeros((len(ids), values.shape[1]))
      items[f"{t}/{key}"][at] = values
    items[f"{t}/rows"] = np.broadcast_to(items[f"{t}/rows"], (len(ids), layers)).copy()
  at = [where[s] for s in r["structural"]["test_sentences"]]
  for kind in ("distance", "depth"):
    for key, values in r["structural"][kind]["per_sentence"].items():
      values = np.asarray(values, np.float64)
      fill = np.nan if key == "root_hit" else 0.0
      items[f"{kind}/{key}"] = np.full((len(ids), *values.shape[1:]), fill)
      items[f"{kind}/{key}"][at] = values
  return items


def item_curves(items: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """`layer_curves`' measures, with each classifier probe's control accuracy (`TASK_control`;
  `upos_mlp` and its control too where run), from `sentence_items`' arrays, which may carry a
  resample axis in front: each `(..., layers)`."""
  out = {}
  for t in (t for t in PROBES if f"{t}/rows" in items):
    rows = items[f"{t}/rows"].sum(-2)
    out[t] = items[f"{t}/correct"].sum(-2) / rows
    if f"{t}/control" in items:
      out[f"{t}_control"] = items[f"{t}/control"].sum(-2) / rows
  strip = lambda kind: {k.split("/")[1]: v for k, v in items.items() if k.startswith(f"{kind}/")}
  if "distance/length" in items:
    distance = representations_structural.from_per_sentence(strip("distance"))
    out.update(uuas=distance["uuas"], dspr=distance["spearman"])
  if "depth/length" in items:
    depth = representations_structural.from_per_sentence(strip("depth"))
    out.update(root_acc=depth["root_accuracy"], nspr=depth["spearman"])
  return out


def judge_by_sentence(
  claim: claims.Claim,
  items: dict[str, np.ndarray],
  quantities: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
  probes: Sequence[str],
  value: dict[str, Any] | None = None,
) -> claims.Judgement:
  """`claim` judged over the test sentences: `quantities` reads the statistics its rule
  names from `item_curves` of each bootstrap resample of the sentences' `sentence_items`
  values of `probes` (e.g. "upos", "distance"), resampled together.

  Args:
    value: `{"name", "value"}` of a row (`Claim.row`'s), the point the table shows.
  """
  names = [k for k in items if k.split("/")[0] in probes]
  statistics = lambda *arrays: quantities(item_curves(dict(zip(names, arrays))))
  point = {value["name"]: value["value"]} if value and value["value"] is not None else None
  over = f"the {len(items[names[0]])} test sentences"
  return claim.judge(tuple(items[k] for k in names), statistics, over=over, point=point)


def at_best_layer(accuracy: np.ndarray, other: np.ndarray) -> np.ndarray:
  """`other` at the layer where `accuracy` peaks (the first such), both `(..., layers)`: a
  probe's selectivity or control accuracy at its best layer, per resample."""
  best = np.argmax(accuracy, -1)[..., None]
  return np.take_along_axis(np.asarray(other), best, -1)[..., 0]


def middle_layers(num_layers: int) -> tuple[int, int]:
  """The middle third of the transformer blocks 1..L of `num_layers` layers (0 the
  embeddings), as inclusive bounds, at least one layer."""
  last = num_layers - 1
  return max(1, round(last / 3)), max(1, round(2 * last / 3))


def layer_summary(r: dict[str, Any], curves: dict[str, np.ndarray]) -> dict[str, Any]:
  """Where each measure of `curves` (`layer_curves`) peaks (`peak_layer`), its expected layer
  (`expected_layer`, Tenney et al. 2019: `stats.expected_layer`), how far it falls from the
  peak to the last layer, the UPOS and relation probes' selectivity (Hewitt & Liang 2019)
  at their best layer and at most (with the MLP UPOS probe's at its best layer when run), and
  the middle third of the blocks (`middle_layers`)."""

  peaks = {k: int(np.argmax(v)) for k, v in curves.items()}
  probes = ("upos", "deprel")
  out = {
    "peak_layer": peaks,
    "expected_layer": {k: stats.expected_layer(v) for k, v in curves.items()},
    "drop_from_peak_to_last": {k: float(v[peaks[k]] - v[-1]) for k, v in curves.items()},
    "selectivity_at_best_layer": {
      t: float(r[t]["selectivity"][r[t]["best_layer"]]) for t in probes
    },
    "max_selectivity": {t: float(np.max(r[t]["selectivity"])) for t in probes},
    "max_selectivity_layer": {t: int(np.argmax(r[t]["selectivity"])) for t in probes},
    "middle_layers": list(middle_layers(len(curves["upos"]))),
  }
  if "upos_mlp" in r:
    mlp = r["upos_mlp"]
    out["mlp_selectivity_at_best_layer"] = float(mlp["selectivity"][mlp["best_layer"]])
  return out
