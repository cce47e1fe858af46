"""Many checkpoints as one job: a set of analyses over a list of checkpoints (`bertjax analyze`).

    bertjax analyze runs/mini google/multiberts-seed_0-step_20k models/bert-small \\
        --analyses head_ablation,attention,probing,anisotropy --out out/analyze

A checkpoint is a Hugging Face model directory, a hub id (the local huggingface_hub cache),
or a `bertjax pretrain` output folder (or its `checkpoints/` folder), which stands for all
its saved steps (``RUN@8`` or ``RUN@8,16`` for some). Each (checkpoint, analysis) result is
one JSON file, ``OUT/results/<checkpoint>/<analysis>.json``, written under a temporary name
and renamed when complete: a job started again skips the results present, so an
interrupted job resumes where it stopped, and a killed one leaves no half-written file.
At the end the figures are drawn (`bertjax analyze` passes `bertjax.plots.jobs.results_figures`:
``OUT/figures/<analysis>.png``, every scalar metric of every checkpoint, a line only over the
steps of one training run; matplotlib, the ``plots`` extra), and ``OUT/summary.json`` lists
the checkpoints and files.

The analyses (`ANALYSES`), all on the same sentences (the shipped UD sample, or UD English
EWT's dev set with ``--data-dir``):

* ``head_ablation``: every single head and every layer masked (`ablation_sweep`), on the
  masked-LM loss (15% of the real tokens masked, fixed) when the checkpoint has an MLM head,
  else on the cosine to the intact mean-pooled embedding;
* ``attention``: Clark et al.'s attention to [CLS], [SEP], "." and "," and entropy (the
  kernel statistics path);
* ``probing``: a linear UPOS probe per layer on first-subword features, held-out accuracy;
* ``anisotropy``: Ethayarajh's mean cosine of random word pairs, per layer;
* ``patterns`` (not in the default set): Kovaleva et al.'s five attention-map types, the
  share of each over every head and sentence (`patterns.pattern_types`);
* ``effective_attention`` (not in the default set): Brunner et al.'s raw vs effective
  attention to [CLS] and [SEP] and their correlation (`effective_attention_statistics`;
  per-sentence SVDs on the host, the slowest analysis here).

With ``--mesh`` every analysis runs on a device mesh (`bertjax.mesh.make_mesh`); with
the multi-host variables of `bertjax pretrain` set, every process runs the job, each feeding
its devices' rows, and process 0 alone writes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

ANALYSES = (
  "head_ablation",
  "attention",
  "probing",
  "anisotropy",
  "patterns",
  "effective_attention",
)
DEFAULT_ANALYSES = ANALYSES[:4]
RESULT_VERSION = 1
PathLike = str | os.PathLike


# Checkpoints ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Checkpoint:
  """One model to analyse.

  Attributes:
    label: its results folder name (unique within a job).
    kind: "hf" (a model directory or hub id) or "orbax" (a step of a pretraining run).
    path: the directory or hub id; for "orbax", the run's checkpoints/ folder.
    step: the training step, from the run or from the name ("step_20k"), else None.
    seed: the seed, from the run's settings or from the name ("seed_3"), else None.
    run: the series it belongs to in the figures: the run folder, or the name without
      its step.
    tokenizer: the tokenizer path (None: the checkpoint's own).
  """

  label: str
  kind: str
  path: str
  step: int | None = None
  seed: int | None = None
  run: str = ""
  tokenizer: str | None = None

  def describe(self) -> dict[str, Any]:
    """The checkpoint's fields as a dict (what a result file records of it)."""
    return dataclasses.asdict(self)


def _name_number(pattern: str, text: str) -> int | None:
  m = re.search(pattern, text, re.IGNORECASE)
  if m is None:
    return None
  return int(m.group(1)) * (1000 if m.group(2) else 1)


def _step_of(name: str) -> int | None:
  """ "multiberts-seed_0-step_20k" -> 20000; None without a step in the name."""
  return _name_number(r"step[_-]?(\d+)(k?)(?![a-z])", name)


def _seed_of(name: str) -> int | None:
  return _name_number(r"seed[_-]?(\d+)()", name)


def _run_dirs(path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path] | None:
  """(checkpoints folder, run folder) of a pretraining output or its checkpoints/ folder."""
  if (path / "checkpoints").is_dir():
    return path / "checkpoints", path
  if any(p.name.isdigit() for p in path.iterdir() if p.is_dir()):
    return path, path.parent
  return None


def _saved_steps(ckpt_dir: pathlib.Path) -> list[int]:
  # Orbax renames a step's temporary folder to "<step>" only once it is complete.
  return sorted(int(p.name) for p in ckpt_dir.iterdir() if p.is_dir() and p.name.isdigit())


def expand_checkpoints(sources: Sequence[str], *, tokenizer: str | None = None) -> list[Checkpoint]:
  """The checkpoints named by `sources`, pretraining runs expanded into their steps.

  Args:
    sources: model directories, hub ids, `bertjax pretrain` output folders (every saved
      step) or ``RUN@STEP[,STEP...]``.
    tokenizer: a tokenizer path for every checkpoint (default: each one's own; a run's
      ``vocab/`` folder).

  Returns:
    The checkpoints, in the order given (a run's steps ascending).

  Raises:
    ValueError, FileNotFoundError: a source that is none of these, or a step not saved.
  """
  if not sources:
    raise ValueError("no checkpoints given")
  out: list[Checkpoint] = []
  for src in sources:
    base, _, steps_text = str(src).partition("@")
    path = pathlib.Path(base).expanduser()
    dirs = _run_dirs(path) if path.is_dir() else None
    if steps_text and dirs is None:
      raise ValueError(
        f"{src!r}: '@STEP' needs a `bertjax pretrain` output folder, and {base!r} is not one"
      )
    if dirs is not None and not (path / "config.json").is_file():
      ckpt_dir, run = dirs
      saved = _saved_steps(ckpt_dir)
      try:
        wanted = [int(s) for s in steps_text.split(",")] if steps_text else saved
      except ValueError:
        raise ValueError(f"{src!r}: steps {steps_text!r} must be integers, e.g. RUN@8,16") from None
      missing = sorted(set(wanted) - set(saved))
      if missing or not wanted:
        raise ValueError(
          f"{src!r}: steps {missing or wanted} are not saved in {ckpt_dir} (saved: {saved})"
        )
      tok = tokenizer or str(run / "vocab")
      out += [
        Checkpoint(f"{run.name}-step{s:07d}", "orbax", str(ckpt_dir), s, None, run.name, tok)
        for s in wanted
      ]
    elif path.is_dir():
      if not (path / "config.json").is_file():
        raise FileNotFoundError(
          f"{str(path)!r} is neither a Hugging Face model directory "
          "(no config.json) nor a `bertjax pretrain` output folder"
        )
      name = path.resolve().name
      out.append(
        Checkpoint(name, "hf", str(path), _step_of(name), _seed_of(name), _series(name), tokenizer)
      )
    elif re.fullmatch(r"[\w.-]+/[\w.-]+", base):
      out.append(
        Checkpoint(
          base.replace("/", "--"),
          "hf",
          base,
          _step_of(base),
          _seed_of(base),
          _series(base),
          tokenizer,
        )
      )
    else:
      raise FileNotFoundError(
        f"checkpoint {src!r} is not a directory, a pretraining run or a hub id (owner/name)"
      )
  seen: dict[str, int] = {}
  unique = []
  for ck in out:  # the same name twice (two runs called "run"): number the later ones
    n = seen.get(ck.label, 0)
    seen[ck.label] = n + 1
    unique.append(ck if n == 0 else dataclasses.replace(ck, label=f"{ck.label}-{n + 1}"))
  return unique


def _series(name: str) -> str:
  """A name without its step: the line a checkpoint joins in the figures."""
  return re.sub(r"[_-]?step[_-]?\d+k?(?![a-z])", "", name, flags=re.IGNORECASE) or name


def load_checkpoint(ck: Checkpoint):
  """`(config, params, tokenizer, checkpoint)`; a run's step gets its seed from the run."""
  import bertjax

  if ck.kind == "orbax":
    from bertjax.data import corpus
    from bertjax.training import checkpoint

    config, params, meta = checkpoint.restore_params(ck.path, ck.step)
    seed = (meta.get("extra") or {}).get("train", {}).get("seed")
    ck = dataclasses.replace(ck, seed=seed if ck.seed is None else ck.seed)
    if ck.tokenizer is None or not pathlib.Path(ck.tokenizer).exists():
      raise FileNotFoundError(f"no tokenizer at {ck.tokenizer} for {ck.label}; pass --tokenizer")
    tok = bertjax.Tokenizer(corpus.load_tokenizer(ck.tokenizer), config.max_position_embeddings)
  else:
    config, params = bertjax.from_hf(ck.path)
    tok = bertjax.Tokenizer.from_pretrained(ck.tokenizer or ck.path)
  if tok.vocab_size > config.vocab_size:
    raise ValueError(
      f"{ck.label}: the tokenizer has {tok.vocab_size} tokens but the model's "
      f"vocab_size={config.vocab_size}"
    )
  return config, params, tok, ck


# Data and the analyses ---------------------------------------------------------------------


def load_sentences(data_dir: PathLike | None = None, max_sentences: int | None = None):
  """UD sentences to analyse: the shipped sample, or UD English EWT dev from `data_dir`.

  Returns:
    `(sentences, source)`: `conllu.Sentence`s and the file read.
  """
  from bertjax.data import conllu, fetch

  if data_dir is None:
    path = fetch.smoke_dir() / "ud_english_ewt" / "en_smoke-ud-dev.conllu"
  else:
    path = fetch.find("ud_english_ewt", data_dir) / "en_ewt-ud-dev.conllu"
  sentences = conllu.read_conllu(path, max_sentences=max_sentences)
  if len(sentences) < 5:
    raise ValueError(f"{path} has {len(sentences)} sentences; the analyses need at least 5")
  return sentences, str(path)


class _Context:
  """One checkpoint's model, data and shared intermediate results (features, batches)."""

  def __init__(self, params, config, tokenizer, sentences, mesh, batch_size):
    self.params, self.config, self.tok = params, config, tokenizer
    self.sentences, self.mesh, self.batch_size = sentences, mesh, batch_size
    self._features = None
    self._batches = None

  def batches(self) -> list[dict[str, np.ndarray]]:
    """The sentences in batches of `batch_size` (the last may be smaller), each padded to
    its `bucket_width`, with MLM labels: 15% of the real, non-special tokens masked (a
    fixed seed)."""
    if self._batches is None:
      from bertjax.analysis.representations.features import bucket_width

      words = [list(s.forms) for s in self.sentences]
      rng = np.random.default_rng(0)
      out = []
      for start in range(0, len(words), self.batch_size):
        chunk = words[start : start + self.batch_size]
        b = self.tok.encode_words(chunk, max_length=self.config.max_length, truncation=True)
        n, t = b.input_ids.shape
        width = min(bucket_width(t), self.config.max_length)
        ids = np.full((n, width), self.tok.pad_id, np.int32)
        mask, types = np.zeros_like(ids), np.zeros_like(ids)
        ids[:, :t], mask[:, :t], types[:, :t] = b.input_ids, b.attention_mask, b.token_type_ids
        candidates = (mask > 0) & ~np.isin(ids, list(self.tok.special_ids))
        chosen = candidates & (rng.random(ids.shape) < 0.15)
        labels = np.where(chosen, ids, -100).astype(np.int32)
        inputs = ids.copy()
        if self.tok.mask_id is not None:
          inputs[chosen] = self.tok.mask_id
        out.append(
          {
            "input_ids": inputs,
            "attention_mask": mask,
            "token_type_ids": types,
            "labels": labels,
            "unmasked_ids": ids,
          }
        )
      self._batches = out
    return self._batches

  def features(self):
    if self._features is None:
      from bertjax.analysis.representations.features import extract_word_features

      self._features = extract_word_features(
        self.params, self.config, self.tok, self.sentences, progress=False, mesh=self.mesh
      )
    return self._features


def _head_ablation(ctx: _Context) -> tuple[dict, dict]:
  from bertjax.analysis.interventions import ablation

  mlm = "mlm" in ctx.params and ctx.tok.mask_id is not None
  metric = ablation.mlm_batch_loss if mlm else ablation.mean_embedding_cosine
  batches = ctx.batches()
  if not mlm:  # the cosine reads the sentences themselves
    batches = [{**b, "input_ids": b["unmasked_ids"]} for b in batches]
  res = ablation.ablation_sweep(
    ctx.params,
    ctx.config,
    batches,
    metric,
    head_ablations=("scale",),
    include=("heads", "layers"),
    mesh=ctx.mesh,
  )["scale"]
  sign = 1.0 if mlm else -1.0  # damage: the loss going up, or the cosine going down
  heads, layers = sign * (res.heads - res.baseline), sign * (res.layers - res.baseline)
  metrics = {
    "baseline": res.baseline,
    "mean_head_damage": float(heads.mean()),
    "max_head_damage": float(heads.max()),
    "max_layer_damage": float(layers.max()),
  }
  arrays = {
    "metric": "mlm_loss" if mlm else "mean_embedding_cosine",
    "heads": res.heads.tolist(),
    "layers": res.layers.tolist(),
  }
  return metrics, arrays


def _unmasked(ctx: _Context) -> list[dict[str, np.ndarray]]:
  """The batches with the sentences' own tokens (no MLM masking)."""
  return [
    {k: b[k] for k in ("attention_mask", "token_type_ids")} | {"input_ids": b["unmasked_ids"]}
    for b in ctx.batches()
  ]


def _attention(ctx: _Context) -> tuple[dict, dict]:
  from bertjax.analysis.attention import statistics

  batches = _unmasked(ctx)
  stats = statistics.clark_statistics(
    ctx.params,
    ctx.config,
    batches,
    sep_id=ctx.tok.sep_id,
    punct_ids=statistics.clark_punctuation_ids(ctx.tok),
    entropy_smoothing=0.0,
    mesh=ctx.mesh,
  )
  metrics = {
    f"mean_{name}": float(stats[name].mean()) for name in ("cls", "sep", "punct", "entropy")
  }
  return metrics, {name: v.tolist() for name, v in stats.items()}


def _probe_split(n: int) -> np.ndarray:
  """Sentence indices held out for testing: a fixed fifth."""
  return np.sort(np.random.default_rng(0).permutation(n)[: max(1, n // 5)])


def _probing(ctx: _Context) -> tuple[dict, dict]:
  from bertjax.analysis.representations import probing
  from bertjax.data import conllu

  wf = ctx.features()
  labels = conllu.encode_field(ctx.sentences, conllu.build_vocab(ctx.sentences, "upos"), "upos")
  test = np.isin(wf.sentence_index, _probe_split(len(ctx.sentences)))
  feats = np.asarray(wf.features, np.float32)
  probe = probing.Probe(probing.ProbeConfig(max_steps=300, eval_every=50, patience=None))
  probe.fit(feats[:, ~test], labels[~test])
  acc = probe.accuracy(feats[:, test], labels[test])
  metrics = {
    "best_accuracy": float(acc.max()),
    "best_layer": int(acc.argmax()),
    "last_layer_accuracy": float(acc[-1]),
  }
  return metrics, {
    "accuracy": acc.tolist(),
    "train_words": int((~test).sum()),
    "test_words": int(test.sum()),
  }


def _anisotropy(ctx: _Context) -> tuple[dict, dict]:
  from bertjax.analysis.representations import geometry

  by_layer = geometry.anisotropy(
    np.asarray(ctx.features().features, np.float32), num_pairs=1000, seed=0
  )
  return (
    {"last_layer": float(by_layer[-1]), "mean": float(by_layer.mean())},
    {"by_layer": by_layer.tolist()},
  )


def _patterns(ctx: _Context) -> tuple[dict, dict]:
  from bertjax.analysis.attention import patterns

  counts = patterns.pattern_types(
    ctx.params,
    ctx.config,
    _unmasked(ctx),
    special_ids=[ctx.tok.cls_id, ctx.tok.sep_id],
    mesh=ctx.mesh,
  )
  names = [t.replace("+", "_") for t in patterns.PATTERN_TYPES]
  metrics = {f"share_{name}": float(v) for name, v in zip(names, counts.overall)}
  return metrics, {
    "types": list(patterns.PATTERN_TYPES),
    "counts": counts.counts.tolist(),
    "per_layer": counts.per_layer.tolist(),
  }


def _effective_attention(ctx: _Context) -> tuple[dict, dict]:
  from bertjax.analysis.attention import effective as effective_attention_lib

  stats = effective_attention_lib.effective_attention_statistics(
    ctx.params,
    ctx.config,
    _unmasked(ctx),
    cls_id=ctx.tok.cls_id,
    sep_id=ctx.tok.sep_id,
    mesh=ctx.mesh,
  )
  metrics = {
    f"{kind}_{name}": float(np.mean(stats[kind][name]))
    for kind in ("raw", "effective")
    for name in ("cls", "sep")
  }
  metrics["raw_effective_corr"] = float(np.mean(stats["effective"]["raw_corr"]))
  return metrics, {
    kind: {name: v.tolist() for name, v in stats[kind].items()} for kind in ("raw", "effective")
  }


RUNNERS: dict[str, Callable[[_Context], tuple[dict, dict]]] = {
  "head_ablation": _head_ablation,
  "attention": _attention,
  "probing": _probing,
  "anisotropy": _anisotropy,
  "patterns": _patterns,
  "effective_attention": _effective_attention,
}


# Files -------------------------------------------------------------------------------------


def write_json_atomic(path: PathLike, obj: Any) -> pathlib.Path:
  """Writes JSON to a temporary file beside `path`, then renames it over `path`."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
  tmp.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n")
  os.replace(tmp, path)
  return path


def result_path(out_dir: PathLike, ck: Checkpoint, analysis: str) -> pathlib.Path:
  """Where analysis `analysis` of checkpoint `ck` writes its JSON:
  `OUT_DIR/results/LABEL/ANALYSIS.json`."""
  return pathlib.Path(out_dir) / "results" / ck.label / f"{analysis}.json"


def _remove_stale_temporaries(out_dir: pathlib.Path) -> None:
  for tmp in out_dir.glob("**/.*.tmp*"):  # left by a killed job
    tmp.unlink(missing_ok=True)


def _check_analyses(analyses: Sequence[str]) -> tuple[str, ...]:
  analyses = tuple(dict.fromkeys(analyses))
  unknown = [a for a in analyses if a not in RUNNERS]
  if unknown or not analyses:
    raise ValueError(
      f"analyses {unknown or list(analyses)} must be a non-empty subset of {ANALYSES}"
    )
  return analyses


def analyze_checkpoints(
  checkpoints: Sequence[str],
  analyses: Sequence[str] = DEFAULT_ANALYSES,
  out_dir: PathLike = "out/analyze",
  *,
  data_dir: PathLike | None = None,
  max_sentences: int | None = None,
  tokenizer: str | None = None,
  mesh=None,
  batch_size: int = 16,
  figures: Callable[[pathlib.Path, Sequence[str]], list[pathlib.Path]] | None = None,
  progress: bool = True,
  callback: Callable[[pathlib.Path], None] | None = None,
) -> dict[str, Any]:
  """Runs `analyses` on every checkpoint, one result file each; skips results already there.

  Args:
    checkpoints: see `expand_checkpoints`.
    analyses: names from `ANALYSES` (default: `DEFAULT_ANALYSES`, the first four).
    out_dir: where ``results/``, ``figures/`` and ``summary.json`` go.
    data_dir: a data directory with UD English EWT (None: the shipped sample).
    max_sentences: only the first sentences.
    tokenizer: one tokenizer for every checkpoint (default: each one's own).
    mesh: a device mesh for every analysis (`bertjax.mesh.make_mesh`), or None.
    batch_size: rows per batch of the ablation and attention analyses.
    figures: draws the figures once the results are written, `figures(out_dir, analyses)`
      returning the files (`bertjax.plots.jobs.results_figures`: ``figures/<analysis>.png``,
      what `bertjax analyze` draws unless ``--no-plots``); None: no figures.
    progress: a progress bar over (checkpoint, analysis) pairs.
    callback: called with each result file's path once it is written.

  Returns:
    The summary also written to ``summary.json``: checkpoints, result files, figures,
    and how many results were computed now and found from before.
  """
  from bertjax import mesh as mesh_lib

  analyses = _check_analyses(analyses)
  if batch_size < 1:
    raise ValueError(f"{batch_size=} must be >= 1")
  specs = expand_checkpoints(checkpoints, tokenizer=tokenizer)
  sentences, source = load_sentences(data_dir, max_sentences)
  out_dir = pathlib.Path(out_dir)
  primary = mesh_lib.is_primary()
  done = _results_present(out_dir, specs, analyses, primary)
  bar = None
  if progress and primary:
    from tqdm.auto import tqdm

    bar = tqdm(
      total=done.size, initial=int(done.sum()), desc="analyze", unit="result", dynamic_ncols=True
    )
  computed = 0
  try:
    for i, ck in enumerate(specs):
      todo = [a for a, d in zip(analyses, done[i]) if not d]
      if not todo:
        continue
      config, params, tok, ck = load_checkpoint(ck)
      ctx = _Context(params, config, tok, sentences, mesh, batch_size)
      for name in todo:
        if bar is not None:
          bar.set_postfix_str(f"{ck.label}: {name}")
        metrics, arrays = RUNNERS[name](ctx)
        computed += 1
        if primary:
          path = write_json_atomic(
            result_path(out_dir, ck, name),
            {
              "version": RESULT_VERSION,
              "analysis": name,
              "checkpoint": ck.describe(),
              "data": {"source": source, "sentences": len(sentences)},
              "metrics": metrics,
              "arrays": arrays,
            },
          )
          if callback is not None:
            callback(path)
        if bar is not None:
          bar.update(1)
  finally:
    if bar is not None:
      bar.close()
  summary = {
    "checkpoints": [ck.label for ck in specs],
    "analyses": list(analyses),
    "data": source,
    "computed": computed,
    "found": int(done.sum()),
    "results": [
      str(result_path(out_dir, ck, a).relative_to(out_dir)) for ck in specs for a in analyses
    ],
    "figures": [],
  }
  if primary:
    _write_summary(out_dir, summary, analyses, figures)
  return summary


def _results_present(
  out_dir: pathlib.Path, specs: Sequence[Checkpoint], analyses: Sequence[str], primary: bool
) -> np.ndarray:
  """bool (checkpoints, analyses): which results are already there, as process 0 sees them
  (so every process runs the same analyses); process 0 first makes `out_dir` and removes the
  temporaries a killed job left."""
  from bertjax import mesh as mesh_lib

  if primary:
    out_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(out_dir)
  done = np.asarray([[result_path(out_dir, ck, a).is_file() for a in analyses] for ck in specs])
  return np.asarray(mesh_lib.broadcast_from_primary(done), bool)


def _write_summary(out_dir: pathlib.Path, summary: dict[str, Any], analyses, figures) -> None:
  """Writes ``summary.json``, then draws the figures with `figures` (which read the job's
  checkpoint order from it, `read_results`) and writes it again listing them."""

  def write():
    kept = {k: v for k, v in summary.items() if k not in ("computed", "found")}
    write_json_atomic(out_dir / "summary.json", kept)

  write()
  if figures is not None:
    summary["figures"] = [str(p.relative_to(out_dir)) for p in figures(out_dir, analyses)]
    write()


# Figures -----------------------------------------------------------------------------------


def read_results(out_dir: PathLike, analysis: str) -> list[dict[str, Any]]:
  """Every result file of one analysis under ``out_dir/results``: the last job's checkpoints
  in the order it was given them (its ``summary.json``), then any others by name."""
  out_dir = pathlib.Path(out_dir)
  summary = out_dir / "summary.json"
  order = json.loads(summary.read_text()).get("checkpoints", []) if summary.is_file() else []
  rank = {label: i for i, label in enumerate(order)}
  files = sorted(
    (out_dir / "results").glob(f"*/{analysis}.json"),
    key=lambda p: (rank.get(p.parent.name, len(rank)), p.parent.name),
  )
  return [json.loads(p.read_text()) for p in files]


def _model_name(ck: dict[str, Any]) -> str:
  """A checkpoint as a legend names it: a hub id as given, a directory by its name, a run's
  step as RUN@STEP."""
  if ck["kind"] == "orbax":
    return f"{ck['run']}@{ck['step']}"
  hub_id = ck["label"] == ck["path"].replace("/", "--") and "/" in ck["path"]
  return ck["path"] if hub_id else ck["label"]


def figure_series(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  """The series a figure draws, in legend order: one per training trajectory (two or more
  checkpoints of one run and seed with known steps: a line over its steps), then one per
  other checkpoint (a point: a hub model, a directory, a run's single step). Unrelated models
  are never joined by a line.

  Returns:
    dicts with `name` (the legend entry), `line` (a trajectory) and `points`: (step or None,
    model name, metrics) in step order.
  """
  runs: dict[tuple, list] = {}
  for r in results:
    ck = r["checkpoint"]
    if ck["step"] is not None:
      runs.setdefault((ck["run"], ck["seed"]), []).append(r)
  series, in_runs = [], set()
  for (run, seed), members in runs.items():
    if len(members) < 2:
      continue
    members.sort(key=lambda r: r["checkpoint"]["step"])
    in_runs.update(id(r) for r in members)
    steps = [r["checkpoint"]["step"] for r in members]
    series.append(
      {
        "name": f"{run}{f' (seed {seed})' if seed is not None else ''}: steps "
        f"{steps[0]}-{steps[-1]}",
        "line": True,
        "points": [
          (r["checkpoint"]["step"], _model_name(r["checkpoint"]), r["metrics"]) for r in members
        ],
      }
    )
  for r in results:
    if id(r) not in in_runs:
      ck = r["checkpoint"]
      series.append(
        {
          "name": _model_name(ck),
          "line": False,
          "points": [(ck["step"], _model_name(ck), r["metrics"])],
        }
      )
  return series
