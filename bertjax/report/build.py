"""`build_report`: loads the model and the text, runs the sections in page order, and writes
`report.json`, the figures and `index.html`.

The stages are timed one by one (`report.json`'s `timing`) and, with `progress`, logged
as they finish.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import Any

import jax

import bertjax
from bertjax import utils
from bertjax.analysis.attention import patterns as attention_patterns
from bertjax.hub import DEFAULT_MODEL
from bertjax.report import figures, graph_page, inputs, page, reading, sections
from bertjax.report.settings import LAYER_NUMBERING, ReportSettings
from bertjax.tasks import passages as tasks_passages
from bertjax.tasks import text_batches
from bertjax.tasks.negation_probe import fit_task
from bertjax.tasks.sentences import Sentence, builtin_text, load_sentences

# The sections `build_report` computes (page ids; section 5, pruning, is computed with 4,
# ablation), and the sections each one reads: asking for one computes what it needs too.
COMPUTED = (
  "task",
  "clark",
  "patterns",
  "ablation",
  "anisotropy",
  "pos",
  "effective",
  "attribution",
  "circuit",
  "outliers",
  "sae",
  "disentangled",
)
NEEDS = {
  "ablation": ("task",),
  "attribution": ("task",),
  "circuit": ("task",),
  "disentangled": ("clark", "patterns"),
}


def chosen_sections(names: Sequence[str] | None) -> frozenset[str] | None:
  """The sections to compute for `names` (page ids, `pruning` meaning `ablation`), with the
  sections they read; None (all) for None.

  Raises:
    ValueError: a name is not a section the report computes, or none is given.
  """
  if names is None:
    return None
  names = [{"pruning": "ablation"}.get(n, n) for n in (x.strip() for x in names) if n]
  unknown = [n for n in names if n not in COMPUTED]
  if unknown or not names:
    raise ValueError(
      f"sections={', '.join(unknown) or '(none)'!s} not understood: expected one or more of "
      f"{', '.join(COMPUTED)} (and pruning, computed with ablation)"
    )
  return frozenset(names).union(*(NEEDS.get(n, ()) for n in names))


def skipped(section) -> bool:
  """Whether a section was left out by `build_report(sections=...)`
  (`{"skipped": True, "reason": ...}`)."""
  return isinstance(section, dict) and bool(section.get("skipped"))


class _Clock:
  """Progress lines (`log`) and the seconds each stage took (`lap`, into `timing`)."""

  def __init__(self, progress: bool):
    self.progress = progress
    self.start = self.last = time.perf_counter()
    self.timing: dict[str, float] = {}
    # XLA programs each stage compiled: inputs are padded to a few widths, so this stays
    # a handful per stage however many sentence lengths the text has.
    self.compiles: dict[str, int] = {}
    self.last_compiles = utils.compiled_programs()

  def log(self, message: str) -> None:
    if self.progress:
      print(f"[report {time.perf_counter() - self.start:6.1f}s] {message}", flush=True)

  def lap(self, name: str) -> None:
    now = time.perf_counter()
    self.timing[name] = now - self.last
    self.last = now
    count = utils.compiled_programs()
    self.compiles[name], self.last_compiles = count - self.last_compiles, count
    self.log(f"{name} done ({self.timing[name]:.1f}s, {self.compiles[name]} XLA programs compiled)")


@dataclasses.dataclass(frozen=True)
class _Run:
  """What every stage of one report run reads: the model, its tokenizer, sizes and clock."""

  params: Any
  config: bertjax.BertConfig
  tok: bertjax.Tokenizer
  settings: ReportSettings
  clock: _Clock
  progress: bool
  sections: frozenset[str] | None = None  # None: every section

  @property
  def max_len(self) -> int:
    """The longest input the model reads whole."""
    return min(self.config.max_length, self.tok.model_max_length)


def _resolve_model(model_dir: str | os.PathLike | None) -> tuple[pathlib.Path, str]:
  """The checkpoint's directory and the name the page gives it."""
  if model_dir is None:
    return bertjax.minilm_path(), DEFAULT_MODEL
  from bertjax.model.hf import resolve_model_path

  model_path = resolve_model_path(model_dir)  # a directory or a hub id in the cache
  return model_path, inputs.model_name(model_path, str(model_dir))


def _load_model(model_path: pathlib.Path):
  """`(params, config, tokenizer)` of an unpruned checkpoint."""
  config, params = bertjax.from_hf(model_path)
  if config.is_pruned:
    raise ValueError(
      f"{model_path} is a pruned checkpoint (pruned_heads={config.pruned_heads});"
      " the report needs every head"
    )
  return params, config, bertjax.Tokenizer.from_pretrained(model_path)


def fitting(run: _Run, sentences: Sequence[Sentence]) -> list[Sentence]:
  """The sentences the model reads whole (`_Run.max_len`: `config.max_length` and the
  tokenizer's limit), as the UD text is chosen; the others are left out, and logged."""
  lengths = run.tok.encode(
    [s.text for s in sentences], truncation=False, max_length=10**6
  ).attention_mask.sum(-1)
  if (lengths > run.max_len).any():
    run.clock.log(
      f"{int((lengths > run.max_len).sum())} of the {len(sentences)} sentences are "
      f"longer than the {run.max_len} tokens the model reads; left out"
    )
  return [s for s, n in zip(sentences, lengths) if n <= run.max_len]


def _read_text(run: _Run, own: Sequence[Sentence], ud_files: Sequence[pathlib.Path]):
  """The text the attention and geometry sections read: the first UD file's sentences when
  `ud_files` is given, else `own`. Returns `(texts, batches, the text section)`."""
  settings = run.settings
  if ud_files:
    from bertjax.data import conllu

    ud = conllu.read_conllu(ud_files[0], max_sentences=settings.max_text_sentences)
    ud = [ud[i] for i in text_batches.fitting(run.tok, [s.forms for s in ud], run.max_len)]
    words = [list(s.forms) for s in ud]
    texts = [" ".join(w) for w in words]
    batches = text_batches.batches(
      run.tok, words=words, batch_size=settings.batch_size, max_length=run.max_len
    )
    text = {
      "source": "ud",
      "num_sentences": len(ud),
      "description": f"{len(ud)} UD English EWT sentences ({ud_files[0].name})",
    }
  else:
    texts = [s.text for s in own]
    batches = text_batches.batches(
      run.tok, texts, batch_size=settings.batch_size, max_length=run.max_len
    )
    text = builtin_text(own)
  text["num_tokens"] = int(sum(b["attention_mask"].sum() for _, b in batches))
  return texts, batches, text


def _patterns(run: _Run, texts: Sequence[str]) -> dict:
  """Section 2 on consecutive sentences of the text as pairs (so blocks can occur)."""
  pair_batches = text_batches.batches(
    run.tok,
    texts[:-1],
    pairs=texts[1:],
    batch_size=run.settings.batch_size,
    max_length=run.max_len,
    truncation=True,
  )
  patterns = sections.pattern_section(run.params, run.config, run.tok, pair_batches)
  patterns["num_inputs"] = len(texts) - 1
  patterns["thresholds"] = ", ".join(
    f"{k} {v}" for k, v in dataclasses.asdict(attention_patterns.PatternThresholds()).items()
  )
  return patterns


def _pos(run: _Run, ud_files: Sequence[pathlib.Path], data_dir, data_path) -> dict:
  """Section 7 when UD files are present, else why not (`available` says which)."""
  if ud_files:
    run.clock.log(f"POS probe on {ud_files[0].parent}")
    return {
      "available": True,
      **sections.pos_section(run.params, run.config, run.tok, ud_files, run.settings, run.progress),
    }
  from bertjax.data import fetch

  try:
    fetch.find_root(data_dir, need=["ud_english_ewt"])
    reason = f"no CoNLL-U files in {data_path}/ud_english_ewt"
  except fetch.DataNotFoundError as e:
    reason = str(e)
  run.clock.log(f"POS probe skipped: {reason}")
  return {"available": False, "reason": reason}


def _effective(run: _Run, texts: Sequence[str]) -> dict:
  """Section 8 on passages of consecutive sentences of the text."""
  # Longer than the head dimension, or effective attention equals raw attention.
  target = min(max(run.settings.passage_tokens, 2 * run.config.head_dim), run.max_len - 16)
  passages = tasks_passages.joined(texts, run.tok, target, run.settings.passages)
  return sections.effective_section(run.params, run.config, run.tok, passages, run.settings)


def failed(section) -> bool:
  """Whether a section's results say it failed (`{"failed": True, "error": ...}`)."""
  return isinstance(section, dict) and bool(section.get("failed"))


def _guarded(run: _Run, name: str, what: str, compute, needs: dict[str, Any] | None = None) -> dict:
  """Runs one stage, logging `what` first; a failure becomes `{"failed": True, "error": ...}`
  for that section, so that every other section and the page are still written. A stage
  whose inputs (`needs`: name -> results) failed does not run and says which; one not among
  `run.sections` does not run either (`{"skipped": True, "reason": ...}`, untimed)."""
  if run.sections is not None and name not in run.sections:
    asked = ", ".join(s for s in COMPUTED if s in run.sections)
    return {"skipped": True, "reason": f"not asked for: this report was run for {asked} only"}
  if what:
    run.clock.log(what)
  broken = [k for k, v in (needs or {}).items() if failed(v) or v is None]
  if broken:
    out = {
      "failed": True,
      "error": f"not run: it needs the {', '.join(broken)} section, which failed",
    }
  else:
    try:
      out = compute()
    except Exception as e:  # noqa: BLE001 (one analysis failing must not lose the others)
      out = {"failed": True, "error": f"{type(e).__name__}: {e}"}
  if failed(out):
    print(f"[report] section {name!r} failed: {out['error']}", file=sys.stderr, flush=True)
  run.clock.lap(name)
  return out


def _stages(run: _Run, own, texts, batches, ud_files, data_dir, data_path, found: dict):
  """The sections after the task, in page order: (id, progress line, how it is computed).
  Each reads `found` (the task, and the sections before it) when it runs."""
  params, config, tok, settings = run.params, run.config, run.tok, run.settings
  task = lambda: found["task_state"]
  heads = config.depth * config.num_attention_heads
  stages = [
    (
      "clark",
      "Clark et al. attention statistics",
      lambda: sections.clark_section(params, config, tok, batches),
    ),
    ("patterns", "Kovaleva et al. pattern types", lambda: _patterns(run, texts)),
    (
      "ablation",
      f"ablation sweeps ({heads} heads, {config.depth} layers), importance and pruning",
      lambda: sections.ablation_section(task(), config, settings, run.clock.log),
    ),
    (
      "anisotropy",
      "anisotropy",
      lambda: sections.anisotropy_section(params, config, tok, batches, settings),
    ),
    ("pos", "", lambda: _pos(run, ud_files, data_dir, data_path)),
    ("effective", "effective attention", lambda: _effective(run, texts)),
    (
      "attribution",
      "token attribution and head patching on the negated sentences",
      lambda: sections.attribution_section(params, config, tok, own, task(), settings),
    ),
    (
      "circuit",
      "the negation circuit: EAP, EAP-IG, exact edge patching, faithfulness",
      lambda: sections.circuit_section(params, config, tok, own, task(), settings),
    ),
    (
      "outliers",
      "outlier dimensions and massive activations",
      lambda: sections.outlier_section(params, config, tok, batches, settings),
    ),
    (
      "sae",
      "a sparse autoencoder on the middle layer",
      lambda: sections.sae_section(params, config, tok, batches, settings),
    ),
  ]
  if config.family.position_bias == "disentangled":  # DeBERTa: section 13; absent elsewhere
    stages.append(
      (
        "disentangled",
        "DeBERTa's score terms: content vs position",
        lambda: sections.disentangled_section(
          params, config, batches, found["clark"], found["patterns"]
        ),
      )
    )
  return stages


def _run_sections(
  run: _Run,
  own: Sequence[Sentence],
  texts: Sequence[str],
  batches,
  ud_files: Sequence[pathlib.Path],
  data_dir,
  data_path,
  graph=None,
) -> dict:
  """Sections 1-12, and 13 on DeBERTa (timed and logged one by one), keyed as in
  `report.json`; a section that fails is `{"failed": True, "error": ...}` and the others
  still run (`_guarded`); one left out by `run.sections` is `{"skipped": True, ...}`.
  `graph(task, fitted task)`, when given, is the last stage: "graph"."""
  params, config, tok = run.params, run.config, run.tok
  fitted = _guarded(
    run,
    "task",
    f"negation task: fitting probes on {len(own)} sentences",
    lambda: fit_task(params, config, tok, own, run.settings.task, run.clock.log),
  )
  found = {}
  found["task"], found["task_state"] = (
    (fitted, None) if failed(fitted) or skipped(fitted) else fitted
  )
  stages = _stages(run, own, texts, batches, ud_files, data_dir, data_path, found)
  for name, what, compute in stages:
    # Only the task is a hard need: section 13 still runs when 1 or 2 failed (it says so).
    needs = {"task": found["task"]} if "task" in NEEDS.get(name, ()) else None
    found[name] = _guarded(run, name, what, compute, needs)
  if graph is not None:
    found["graph"] = graph(found["task"], found["task_state"])
  # report.json's order: sections 1-2, then the task, then the rest.
  keys = ("clark", "patterns", "task", *(s[0] for s in stages[2:]), "graph")
  return {k: found[k] for k in keys if k in found}


def _graph(run: _Run, transcoders, own, out: pathlib.Path, data_path):
  """The attribution graph page's stage (`graph_page.report_graph`), guarded as a section
  is: it reads the fitted task's probe, so it runs where the task ran."""

  def stage(task: dict, fitted: dict | None) -> dict:
    if skipped(task):
      return {"skipped": True, "reason": "not run: it reads the task section, not asked for"}
    return _guarded(
      dataclasses.replace(run, sections=None),
      "graph",
      "attribution graph",
      lambda: graph_page.report_graph(
        run.params, run.config, run.tok, transcoders, fitted, own, out, data_dir=data_path
      ),
      needs={"task": task},
    )

  return stage


def _model_section(run: _Run, model_path: pathlib.Path, name: str) -> dict:
  """The analysed model as the page's header names it."""
  origin = inputs.read_json(model_path / "config.json").get("_name_or_path")
  return {
    "name": name,
    "path": str(model_path),
    "model_type": run.config.model_type,
    "name_or_path": origin if isinstance(origin, str) and origin else None,
    "layers": run.config.depth,
    "heads": run.config.num_attention_heads,
    "hidden_size": run.config.hidden_size,
    "parameters": int(bertjax.count_params(run.params)),
  }


def _write(results: dict, figs: dict[str, str], out: pathlib.Path, clock: _Clock) -> dict:
  """Adds the timing and the readings to `results`; writes `report.json` and `index.html`."""
  clock.timing["total_seconds"] = time.perf_counter() - clock.start
  results["timing"] = clock.timing
  results["compiled_programs"] = clock.compiles
  results["run"]["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
  results["figures"] = figs
  results = utils.to_json(results, digits=6)
  # Each section's reading of its numbers, computed from the JSON as written (so a reader can
  # recompute it from report.json alone).
  results["readings"] = reading.readings(results)
  utils.write_json(out / "report.json", results)
  (out / "index.html").write_text(page.render_html(results, figs), encoding="utf-8")
  results["files"] = [
    str(out / "index.html"),
    str(out / "report.json"),
    *(str(out / f) for f in figs.values()),
  ]
  clock.log(f"wrote {out / 'index.html'} ({clock.timing['total_seconds']:.1f}s)")
  return results


def build_report(
  model_dir: str | os.PathLike | None = None,
  out_dir: str | os.PathLike = "out/report",
  data_dir: str | os.PathLike | None = None,
  reduced: bool = False,
  progress: bool = True,
  settings: ReportSettings | None = None,
  sections: Sequence[str] | None = None,
  transcoders: str | os.PathLike | None = None,
) -> dict:
  """Analyses a checkpoint of any family and writes the HTML report.

  Args:
    model_dir: a Hugging Face model directory of any family (weights, config and
      tokenizer files) or a hub id in the local cache; None means the built-in
      all-MiniLM-L6-v2. The page names it by `model_name`.
    out_dir: where `index.html`, `report.json` and the PNG figures go (created).
    data_dir: the real data sets (`ud_english_ewt/*.conllu` ...). Given, the
      attention and geometry analyses read UD sentences instead of the project's
      own; None looks for them (`default_data_dir`) only for the POS probe.
    reduced: a small, fast run (`ReportSettings.reduced()`), for tests.
    progress: print progress lines.
    settings: explicit sizes (overrides `reduced`).
    sections: compute only these sections (`COMPUTED` ids; `pruning` is computed with
      `ablation`) and the sections they read (`NEEDS`); the others are on the page and in
      `report.json` as not run (`{"skipped": True, "reason": ...}`). None: every section.
    transcoders: a transcoder of this model saved by `transcoders.save`: the report then
      also writes `graph.html`, the interactive attribution graph of a negated sentence for
      the task's probe (`bertjax.report.graph_page.report_graph`), linked from the page.

  Returns:
    The results (as written to `report.json`), with `files`: the paths written.

  Raises:
    FileNotFoundError: `model_dir` or an explicit `data_dir` does not exist.
    ValueError: the checkpoint is physically pruned (the analyses need every head), or
      `sections` names a section the report does not compute.
  """
  chosen = chosen_sections(sections)
  if transcoders is not None and not (pathlib.Path(transcoders) / "transcoder.json").is_file():
    raise FileNotFoundError(f"transcoders={str(transcoders)!r}: no saved transcoder there")
  clock = _Clock(progress)
  settings = settings or (ReportSettings.reduced() if reduced else ReportSettings())
  model_path, name = _resolve_model(model_dir)
  explicit_data = data_dir is not None
  if explicit_data and not pathlib.Path(data_dir).is_dir():
    raise FileNotFoundError(f"data_dir={str(data_dir)!r} is not a directory")
  data_path = pathlib.Path(data_dir) if explicit_data else inputs.default_data_dir()
  ud_files = inputs.ud_files(data_path) if data_path is not None else []
  out = pathlib.Path(out_dir)

  with utils.single_thread_blas():
    clock.log(f"loading {name} from {model_path}")
    run = _Run(*_load_model(model_path), settings, clock, progress, chosen)
    if chosen and "disentangled" in chosen and run.config.family.position_bias != "disentangled":
      raise ValueError(
        f"sections=disentangled: {name} is a {run.config.model_type} model; only DeBERTa "
        "models (disentangled attention) have that section"
      )
    own = load_sentences()
    own = [own[i] for i in text_batches.spread(len(own), settings.max_sentences)]
    own = fitting(run, own)
    if explicit_data and not ud_files:
      clock.log(f"no ud_english_ewt/*.conllu under {data_path}; using the built-in sentences")
    texts, batches, text = _read_text(run, own, ud_files if explicit_data else [])
    clock.lap("setup")
    graph = None if transcoders is None else _graph(run, transcoders, own, out, data_path)
    found = _run_sections(run, own, texts, batches, ud_files, data_dir, data_path, graph)
    results = {
      "layer_numbering": LAYER_NUMBERING,
      "model": _model_section(run, model_path, name),
      "text": text,
      "settings": dataclasses.asdict(settings),
      **found,
      "run": {
        "mode": "reduced" if reduced or settings.max_sentences else "full",
        "sections": None if chosen is None else [s for s in COMPUTED if s in chosen],
        "backend": jax.default_backend(),
        "jax_version": jax.__version__,
      },
    }
    figure_errors: dict[str, str] = {}
    figs = figures.write_figures(results, out, errors=figure_errors)
    results["figure_errors"] = figure_errors
    for section, error in figure_errors.items():
      print(f"[report] the figures of section {section!r} failed: {error}", file=sys.stderr)
    clock.lap("figures")
  return _write(results, figs, out, clock)
