"""What every experiment script shares: arguments, the model, the data, the result file.

Each experiment in this directory is one script answering one question from the
BERTology literature. They all:

* take `--out DIR`, `--update-results`, `--seed`, `--smoke` (a tiny model and tiny data:
  what the tests run, about 9-45 s each on a 2-core AMD EPYC Zen 4 with other work running,
  about 6 minutes for all) and, those that read a data set (all but attribution),
  `--data-dir DIR`; those that analyse a trained model take `--model DIR_OR_ID` too: any
  Hugging Face checkpoint of a family with a tokenizer (`MODEL_FAMILIES`; a directory or a
  hub id) instead of all-MiniLM-L6-v2 (with `--smoke`: instead of the tiny random model, on
  the smoke run's small data);
* write `STEM.json` (every number, the settings, the machine, the time taken, and the
  `findings` rows that feed the README's Findings table) and `STEM_*.png` figures, into a
  scratch directory (`out/experiments` under the working directory, printed) unless
  `--out DIR` is given; only `--update-results` (or `--out experiments/results`) writes
  the committed results, and never with `--smoke`. STEM is the experiment's NAME for
  all-MiniLM-L6-v2 and `NAME_MODEL` for any other `--model` (`results_stem`: MODEL is the
  last part of the hub id or directory, e.g. `what_bert_looks_at_all-mpnet-base-v2.json`),
  so each (experiment, model) has one result file;
* find the real data sets through the one lookup of `bertjax.data.fetch`: `--data-dir`,
  else `$BERTJAX_DATA_DIR` (or the user cache that `bertjax data fetch` fills), else
  `../shared/data` beside the repository; `--smoke` reads the small samples shipped in
  `bertjax/resources/smoke/` instead (unless `--data-dir` is given), so it needs no data;
* print progress lines to stderr.

Those that train models size a run with a `Scale` subclass (the budget: steps, batch, learning
rate, warm-up; `Scale.with_steps` applies `--steps`), those that pre-train a BERT on WikiText-2
with a `PretrainScale` (the model's and the data's sizes too). The sizes themselves, of the
full, smoke and GPU runs, are data in `experiments/sizes.toml` (`sizes`).

`write_results` (through `finish`, which takes the rows from the script's rules module) puts
the Findings rows in a fixed shape: the paper, its headline claim, what we measured, and
whether the claim holds here ("yes", "partly", "no", or "n/a").
`experiments/findings.py` turns the committed full (non-smoke) JSON files into the table.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import importlib
import os
import pathlib
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import tomllib

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "experiments" / "results"
HOLDS = ("yes", "partly", "no", "n/a")


SCRATCH = pathlib.Path("out") / "experiments"  # relative to the working directory
DEFAULT_MODEL = "all-MiniLM-L6-v2"  # what the experiments analyse without --model
MPNET = "sentence-transformers/all-mpnet-base-v2"  # `bertjax models install` puts it in the cache
MODEL_FAMILIES = (
  "BERT, ALBERT, RoBERTa, XLM-R, ELECTRA, DistilBERT, MPNet, NomicBERT, "
  "ModernBERT or EuroBERT"
)  # every family with a tokenizer


def model_tag(model: str | os.PathLike | None) -> str:
  """The short name of a `--model` value that result files carry: the last part of the hub id
  or directory ("all-mpnet-base-v2"); "" for None and all-MiniLM-L6-v2 (the default model)."""
  if model is None:
    return ""
  import bertjax

  path = pathlib.Path(str(model))
  if path.exists() and path.resolve() == bertjax.minilm_path().resolve():
    return ""  # the built-in checkpoint's own directory
  tag = pathlib.PurePath(str(model).rstrip("/\\")).name
  return "" if tag.lower() == DEFAULT_MODEL.lower() else tag


def results_stem(name: str, model: str | os.PathLike | None) -> str:
  """The result files' stem of experiment `name` on `model` (`--model`; None: the default
  model): `name` for all-MiniLM-L6-v2, else `name_TAG` (`model_tag`), so each (experiment,
  model) writes its own `STEM.json` and `STEM_*.png` beside the others.

  Raises:
    ValueError: the tag has characters a file name should not (spaces, slashes, ...).
  """
  tag = model_tag(model)
  if tag and not all(c.isalnum() or c in "-_." for c in tag):
    raise ValueError(
      f"model {str(model)!r} gives the file-name tag {tag!r}: only letters, "
      "digits, '-', '_' and '.' may be in it"
    )
  return f"{name}_{tag}" if tag else name


def special_tokens(tok) -> dict[str, str]:
  """The tokens that play BERT's [CLS], [SEP] and [MASK] in `tok`'s vocabulary (MPNet's
  `<s>`, `</s>`, `<mask>`): the experiments find them by role (`tok.cls_id`, ...), never by
  BERT's strings."""
  inverse = {i: t for t, i in tok.tokenizer.get_vocab().items()}
  roles = {"[CLS]": tok.cls_id, "[SEP]": tok.sep_id, "[MASK]": tok.mask_id}
  return {role: inverse.get(i, "") for role, i in roles.items() if i is not None}


def describe_model(model: str, depth: int) -> str:
  """What the analysed model is, for a row's "differs from the paper" note: how it was
  trained and how it differs from BERT-base (which the papers measured)."""
  low = model.lower()
  if "minilm" in low:
    return (
      f"{model} is a {depth}-layer model distilled from a larger one (MiniLM) and "
      "trained further for sentence embeddings (a contrastive loss on its mean-pooled "
      "last layer), not BERT-base"
    )
  if "mpnet" in low:
    return (
      f"{model} has BERT-base's shape ({depth} layers x 12 heads) but is not BERT: "
      "MPNet, pre-trained by permuted language modelling with a relative-position bias "
      "in every layer's attention, then trained further for sentence embeddings (a "
      "contrastive loss on its mean-pooled last layer)"
    )
  if "bert-base" in low:
    return ""
  return f"{model} is a different model ({depth} layers), not BERT-base"


class _Parser(argparse.ArgumentParser):
  """The experiments' parser: resolves `--out` and `--data-dir` once the arguments are read."""

  def parse_known_args(self, args=None, namespace=None):
    ns, rest = super().parse_known_args(args, namespace)
    if hasattr(ns, "smoke") and hasattr(ns, "update_results"):
      ns.out = self._out(ns)
      if ns.smoke and getattr(ns, "data_dir", "") is None:
        ns.data_dir = str(smoke_data_dir())
        log(f"--smoke: reading the samples in {ns.data_dir} (no real data needed)")
    return ns, rest

  def _out(self, ns) -> str:
    if ns.update_results:
      if ns.out is not None and pathlib.Path(ns.out).resolve() != RESULTS:
        self.error(f"--update-results writes {RESULTS}; it cannot be combined with --out {ns.out}")
      out = RESULTS
    elif ns.out is not None:
      out = pathlib.Path(ns.out)
    else:
      out = SCRATCH
      log(
        f"results go to {out.resolve()} (a scratch directory; --update-results writes the "
        f"committed {RESULTS.relative_to(REPO)})"
      )
    if ns.smoke and out.resolve() == RESULTS:
      self.error(
        f"--smoke results are not findings: they must not overwrite {RESULTS}; "
        "leave out --update-results / --out, or pass another --out DIR"
      )
    # Checked now, not after the run: the nearest existing folder on the way must be a folder.
    here = out.resolve()
    while not here.exists():
      here = here.parent
    if not here.is_dir():
      self.error(f"--out {out}: {here} is a file, not a folder; pass a folder to write to")
    return str(out)


def parser(
  doc: str | None, *, model: bool = True, data: bool = True, steps: int | None = None
) -> argparse.ArgumentParser:
  """An argument parser with the shared options; the script's docstring is its help text.

  After parsing, `args.out` is the output directory (the scratch directory when neither
  `--out` nor `--update-results` is given) and, for `--smoke` without `--data-dir`,
  `args.data_dir` is the shipped samples' directory.

  Args:
    doc: the help text.
    model: add `--model DIR_OR_ID` (`args.model`, None when not given; see `load_model`);
      False for experiments that train their own models from scratch.
    data: add `--data-dir DIR`; False for experiments that read no data set.
    steps: the default optimizer steps of each model a script trains: add `--steps N`
      (`args.steps`, None when not given; see `Scale.with_steps`).
  """
  sys.excepthook = _excepthook
  p = _Parser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument(
    "--out",
    default=None,
    metavar="DIR",
    help=f"where NAME.json and the PNG figures go (default: {SCRATCH}, a scratch "
    "directory under the working directory)",
  )
  p.add_argument(
    "--update-results",
    action="store_true",
    help=f"write the committed results in {RESULTS.relative_to(REPO)} (what the "
    "README's Findings table is generated from); not with --smoke",
  )
  if steps is not None:
    p.add_argument(
      "--steps",
      type=int,
      default=None,
      help=f"optimizer steps of each trained model (default: {steps}; warm-up: 10%% of them)",
    )
  if data:
    p.add_argument(
      "--data-dir",
      default=None,
      metavar="DIR",
      help="the real data sets (ud_english_ewt/, wikitext2_tokens/, blimp/, ...) "
      "(default: $BERTJAX_DATA_DIR or the user cache that `bertjax data fetch` "
      "fills, then ../shared/data beside the repository; with --smoke: the "
      "samples shipped in bertjax/resources/smoke)",
    )
  if model:
    p.add_argument(
      "--model",
      default=None,
      metavar="DIR_OR_ID",
      help=f"a Hugging Face model directory or hub id ({MODEL_FAMILIES}, with its "
      "tokenizer) to analyse instead of all-MiniLM-L6-v2, e.g. "
      f"{MPNET}; its results are NAME_MODEL.json and NAME_MODEL_*.png (MODEL: "
      "the id's or directory's last part); with --smoke, instead of the tiny "
      "random model",
    )
  p.add_argument("--seed", type=int, default=0, help="seed of every split and sample (default: 0)")
  p.add_argument(
    "--smoke",
    action="store_true",
    help="a tiny model and the shipped sample data, for the tests (results are not findings)",
  )
  return p


class UsageError(ValueError):
  """A bad command-line value (`--steps`, `--shared-layer`, ...): one line, no traceback."""


def _excepthook(kind, value, tb) -> None:
  """User errors (missing data, a bad option value) print one line on stderr, no traceback."""
  from bertjax.data.fetch import DataError

  if issubclass(kind, (DataError, UsageError)):
    print(f"error: {value}", file=sys.stderr)
    sys.exit(1)
  sys.__excepthook__(kind, value, tb)


def smoke_data_dir() -> pathlib.Path:
  """The small samples shipped in the package for `--smoke` runs, laid out as a data directory."""
  from bertjax.data.fetch import smoke_dir

  return smoke_dir()


def data_dir(arg: str | None, *need: str) -> pathlib.Path:
  """The data directory holding the sets in `need` (folder names such as "blimp").

  Looks in `arg` (`--data-dir`) alone when given, else in `$BERTJAX_DATA_DIR` (or the user
  cache), then `../shared/data` (`bertjax.data.fetch.find_root`).

  Raises:
    bertjax.data.fetch.DataNotFoundError: no directory holds them (a FileNotFoundError whose
      message names where it looked and the `bertjax data fetch NAME` command).
  """
  from bertjax.data.fetch import find_root

  return find_root(arg, need)


def ud_file(data: pathlib.Path, split: str = "dev") -> pathlib.Path:
  """UD English EWT's `.conllu` file for `split` ("train", "dev" or "test")."""
  from bertjax.data.fetch import DataNotFoundError

  hits = sorted((data / "ud_english_ewt").rglob(f"*-ud-{split}.conllu"))
  if not hits:
    raise DataNotFoundError(
      f"no *-ud-{split}.conllu under {data / 'ud_english_ewt'}; run `bertjax data fetch "
      f"ud_english_ewt` (the dev split) or pass --data-dir DIR"
    )
  return hits[0]


def minilm():
  """(config, params, tokenizer) of the built-in real checkpoint, all-MiniLM-L6-v2."""
  import bertjax

  path = bertjax.minilm_path()
  config, params = bertjax.from_hf(path)
  return config, params, bertjax.Tokenizer.from_pretrained(path)


def pretrained(model: str | os.PathLike):
  """(config, params, tokenizer, name) of a Hugging Face directory or hub id, any family."""
  import bertjax

  try:
    config, params = bertjax.from_hf(model)
    tok = bertjax.Tokenizer.from_pretrained(model)
  except (OSError, ValueError) as e:  # no such directory, no network, an unknown family, ...
    raise UsageError(f"--model {model}: {e}") from e
  if tok.vocab_size > config.vocab_size:
    raise UsageError(
      f"--model {model}: its tokenizer has {tok.vocab_size} tokens but the "
      f"model's vocab_size={config.vocab_size}"
    )
  log(
    f"model: {model} ({config.model_type}, {config.depth} layers x "
    f"{config.num_attention_heads} heads, hidden {config.hidden_size})"
  )
  return config, params, tok, str(model)


# The tiny random model that stands in for a trained one in `--smoke` runs.
SMOKE_MODEL = {
  "hidden_size": 32,
  "num_hidden_layers": 2,
  "num_attention_heads": 2,
  "intermediate_size": 64,
}


def tiny_model(
  seed: int = 0, name: str = "random 2x32 (smoke)", *, preset: str | None = None, **config: Any
):
  """(config, params, tokenizer, name): a random-weight BERT over all-MiniLM-L6-v2's vocabulary.

  Args:
    seed: the parameters' seed.
    name: what the results call the model.
    preset: a `BertConfig.preset` name to start from; None: `BertConfig`'s defaults.
    **config: `BertConfig` fields (default: `SMOKE_MODEL`, 2 layers of width 32).
  """
  import bertjax

  tok = bertjax.Tokenizer.from_pretrained(bertjax.minilm_path())
  fields = {"vocab_size": tok.vocab_size, **(config or ({} if preset else SMOKE_MODEL))}
  cfg = bertjax.BertConfig.preset(preset, **fields) if preset else bertjax.BertConfig(**fields)
  return cfg, bertjax.init(cfg, seed), tok, name


def tiny_stand_in(name: str) -> Callable[[], tuple]:
  """`load_model`'s `smoke` for analyses that read a grid of heads: `tiny_model` of the "tiny"
  preset (4 heads, 64 wide) at 2 layers and 512 positions, called `name`."""
  return lambda: tiny_model(
    0, name, preset="tiny", num_hidden_layers=2, max_position_embeddings=512
  )


def finetune_model(
  args,
  task: str,
  num_labels: int,
  *,
  smoke: dict[str, Any],
  seed: int,
  label_names=None,
  tok=None,
):
  """(config, params, tokenizer, name): the model a fine-tuning experiment starts from, with a
  fresh `task` head of `num_labels` outputs (`finetune.prepare_model`): `--model` when given,
  else with `--smoke` a random BERT of the `smoke` fields over all-MiniLM-L6-v2's vocabulary,
  else all-MiniLM-L6-v2. `tok`: that model's tokenizer when the caller has already loaded it.

  Raises:
    UsageError: `--model` cannot be loaded.
  """
  import bertjax
  from bertjax.training import finetune as ft

  source = args.model or bertjax.minilm_path()
  kw = {"seed": seed, "label_names": label_names}
  try:
    tok = bertjax.Tokenizer.from_pretrained(source) if tok is None else tok
    if args.smoke and not args.model:
      tiny = bertjax.BertConfig(vocab_size=tok.vocab_size, **smoke)
      config, params = ft.prepare_model(task, num_labels, config=tiny, **kw)
      return config, params, tok, "tiny random BERT (smoke stand-in)"
    config, params = ft.prepare_model(task, num_labels, init_from=source, **kw)
  except (OSError, ValueError) as e:  # no such directory, no network, an unknown family, ...
    raise UsageError(f"--model {args.model}: {e}") from e
  if tok.vocab_size > config.vocab_size:  # as `pretrained` checks
    raise UsageError(
      f"--model {args.model}: its tokenizer has {tok.vocab_size} tokens but the "
      f"model's vocab_size={config.vocab_size}"
    )
  return config, params, tok, str(args.model or DEFAULT_MODEL)


def load_model(args, smoke=None):
  """(config, params, tokenizer, name): the model an experiment analyses.

  `--model DIR_OR_ID` when given (`pretrained`); else, for `--smoke`, `smoke()` (returning
  the same four; default: `tiny_model(args.seed)`); else the built-in all-MiniLM-L6-v2.
  """
  if getattr(args, "model", None):
    return pretrained(args.model)
  if args.smoke:
    return smoke() if smoke is not None else tiny_model(args.seed)
  return (*minilm(), "all-MiniLM-L6-v2")


def sizes(name: str) -> dict[str, dict[str, Any]]:
  """The sizes of experiment `name`'s runs, by scale ("full", "smoke", maybe "gpu"), read
  from `experiments/sizes.toml`. A table with `like = "other"` takes every size it leaves out
  from that scale's table; a size that another of its scales gives and this one leaves out
  is None (TOML has no null).

  Raises:
    KeyError: `sizes.toml` has no table for `name`, or a `like` names no scale of it.
  """
  with open(pathlib.Path(__file__).with_name("sizes.toml"), "rb") as f:
    tables = tomllib.load(f)[name]
  tables = {
    scale: {**tables[table["like"]], **table} if "like" in table else table
    for scale, table in tables.items()
  }
  tables = {scale: {k: v for k, v in t.items() if k != "like"} for scale, t in tables.items()}
  keys = dict.fromkeys(k for table in tables.values() for k in table)
  return {scale: {k: table.get(k) for k in keys} for scale, table in tables.items()}


@dataclasses.dataclass(frozen=True)
class Scale:
  """The training budget of an experiment that trains models; each one's sizes subclass it.

  Attributes:
    steps: optimizer steps of each trained model.
    batch: examples per step.
    lr: peak learning rate.
    warmup: linear warm-up steps.
  """

  steps: int
  batch: int
  lr: float
  warmup: int

  def with_steps(self, steps: int | None, *, minimum: int, min_warmup: int = 1) -> Scale:
    """This scale (of the same class) with `--steps` applied: `steps` steps and 10% of them
    (at least `min_warmup`) of warm-up; unchanged when `steps` is None.

    Raises:
      UsageError: `steps` is below `minimum`.
    """
    if steps is None:
      return self
    if steps < minimum:
      raise UsageError(f"--steps={steps} must be >= {minimum}")
    return dataclasses.replace(self, steps=steps, warmup=max(min_warmup, steps // 10))

  def finetune_config(self, seed: int, **fields: Any):
    """The `finetune.FinetuneConfig` of this budget; `fields` set its other fields."""
    from bertjax.training import finetune

    return finetune.FinetuneConfig(
      steps=self.steps,
      batch_size=self.batch,
      learning_rate=self.lr,
      warmup_steps=self.warmup,
      seed=seed,
      **fields,
    )


@dataclasses.dataclass(frozen=True)
class PretrainScale(Scale):
  """A BERT pre-trained from scratch (MLM only) on WikiText-2: the model, the data, the budget.

  Attributes:
    layers, hidden, heads, ffn: the model's depth, width, heads and feed-forward width.
    vocab: the WordPiece vocabulary trained on the training text.
    seq_len: tokens per segment.
    max_lines: read only the first lines of each file (None: all).
    eval_batches: fixed held-out batches of `batch` segments.
    window: trailing-mean window of the training loss curves.
  """

  layers: int
  hidden: int
  heads: int
  ffn: int
  vocab: int
  seq_len: int
  max_lines: int | None
  eval_batches: int
  window: int

  def bert_config(self, vocab_size: int, **fields: Any):
    """The `BertConfig` of this model over `vocab_size` tokens (its positions: `seq_len`);
    `fields` set the `BertConfig` fields that the scale does not."""
    import bertjax

    return bertjax.BertConfig(
      vocab_size=vocab_size,
      hidden_size=self.hidden,
      num_hidden_layers=self.layers,
      num_attention_heads=self.heads,
      intermediate_size=self.ffn,
      max_position_embeddings=self.seq_len,
      **fields,
    )

  def train_config(self, seed: int):
    """The `loop.TrainConfig` of this budget: AdamW, linear decay after the warm-up."""
    from bertjax.training import loop

    return loop.TrainConfig(
      steps=self.steps,
      batch_size=self.batch,
      learning_rate=self.lr,
      warmup_steps=self.warmup,
      decay="linear",
      seed=seed,
    )


@contextlib.contextmanager
def smoke_compilation_cache(enabled: bool = True):
  """JAX's persistent compilation cache for the duration of a `--smoke` run, in a directory of
  its own that is deleted afterwards, then the process's own settings back.

  The smoke runs train several variants of one shape, so later ones read the first one's
  compiled steps. JAX keeps its cache object once built (restoring the config value alone
  does not turn it off), so it is reset on the way in and out: a script's `main` called
  in-process (a test) leaves no cache on for the rest of that process. A process that has
  a cache already (the test suite's, `bertjax.compile_cache`, or the user's own) keeps it,
  so a later run, or another process, reads this one's programs.
  """
  import jax
  from jax.experimental.compilation_cache import compilation_cache

  names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
  before = {name: getattr(jax.config, name) for name in names}
  if not enabled or before[names[0]]:
    yield
    return
  path = tempfile.mkdtemp(prefix="bertjax-smoke-jax-cache-")
  compilation_cache.reset_cache()
  jax.config.update(names[0], path)
  jax.config.update(names[1], 0.2)
  try:
    yield
  finally:
    for name, value in before.items():
      jax.config.update(name, value)
    compilation_cache.reset_cache()
    shutil.rmtree(path, ignore_errors=True)


def smoke_cached(run):
  """Decorates a script's `run(args)` to run inside `smoke_compilation_cache(args.smoke)`."""

  @functools.wraps(run)
  def wrapper(args, *rest, **kwargs):
    with smoke_compilation_cache(args.smoke):
      return run(args, *rest, **kwargs)

  return wrapper


# What --smoke asks of XLA:CPU (besides `jax_disable_most_optimizations`): its older loop
# emitters instead of its fusion emitters, which compile ~2.5x faster at that setting. XLA reads XLA_FLAGS when it starts, so
# a process that has already compiled keeps its own emitters.
SMOKE_XLA_FLAG = "--xla_cpu_use_fusion_emitters=false"


@contextlib.contextmanager
def quick_compiles(enabled: bool = True):
  """For --smoke: XLA with most optimisations off and `SMOKE_XLA_FLAG`, then the process's
  settings back. Compiling is most of a smoke run (each program runs a few steps or a few
  times); the unoptimised programs give the same numbers to float32 rounding. A script that
  uses it records `"xla_optimised": not args.smoke` in its settings."""
  import jax

  if not enabled:
    yield
    return
  flags, off = os.environ.get("XLA_FLAGS"), jax.config.values["jax_disable_most_optimizations"]
  if SMOKE_XLA_FLAG.split("=")[0] not in (flags or ""):  # the user's setting wins
    os.environ["XLA_FLAGS"] = f"{flags or ''} {SMOKE_XLA_FLAG}".strip()
  jax.config.update("jax_disable_most_optimizations", True)
  log("--smoke: XLA compiles with most optimisations off (the programs run only a few times)")
  try:
    yield
  finally:
    jax.config.update("jax_disable_most_optimizations", off)
    if flags is None:
      os.environ.pop("XLA_FLAGS", None)
    else:
      os.environ["XLA_FLAGS"] = flags


def one_blas_thread(main):
  """Decorates a script's `main` to run with NumPy's BLAS on one thread
  (`bertjax.utils.single_thread_blas`: its pool thrashes small SVDs on a shared machine)."""

  @functools.wraps(main)
  def wrapper(*args, **kwargs):
    from bertjax.utils import single_thread_blas

    with single_thread_blas():
      return main(*args, **kwargs)

  return wrapper


def log(*parts: Any) -> None:
  """A progress line on stderr."""
  print("[{}]".format(time.strftime("%H:%M:%S")), *parts, file=sys.stderr, flush=True)


@contextlib.contextmanager
def timed(timings: dict[str, float], key: str) -> Iterator[None]:
  """Adds the wall time of the block to `timings[key]` (seconds) and logs it."""
  t0 = time.perf_counter()
  yield
  timings[key] = timings.get(key, 0.0) + time.perf_counter() - t0
  log(f"{key}: {timings[key]:.1f}s")


def to_json(x: Any) -> Any:
  """`x` as plain JSON values, NaN as None (`bertjax.utils.to_json`, imported when called)."""
  from bertjax.utils import to_json as convert

  return convert(x)


def from_json(x: Any) -> Any:
  """`x` read back from a result file with every None (a NaN or inf written as null) as NaN,
  so a script's `findings(results, settings)` computes the same from the file as in the run."""
  if isinstance(x, dict):
    return {k: from_json(v) for k, v in x.items()}
  if isinstance(x, list):  # leaves inline: the Findings' bootstraps convert results 1000s of times
    nan = float("nan")
    return [from_json(v) if isinstance(v, (dict, list)) else nan if v is None else v for v in x]
  return float("nan") if x is None else x


def machine() -> dict[str, Any]:
  """Where the numbers came from: platform, CPU model and ISA (`bertjax.utils.cpu_info`), JAX
  backend and devices."""
  import jax

  from bertjax.utils import cpu_info

  return {
    "platform": platform.platform(),
    "machine": platform.machine(),
    **cpu_info(),
    "python": platform.python_version(),
    "jax": jax.__version__,
    "backend": jax.default_backend(),
    "devices": [d.device_kind for d in jax.devices()],
  }


def write_results(
  name: str,
  out: str | os.PathLike,
  results: dict[str, Any],
  *,
  findings: Sequence[dict[str, str]] | Callable[[dict, dict], Sequence[dict[str, str]]],
  settings: dict[str, Any],
  smoke: bool,
  seconds: float,
  figures: Sequence[str] = (),
  stem: str | None = None,
  model: str | os.PathLike | None = None,
) -> pathlib.Path:
  """Writes `out/STEM.json` and returns its path.

  Args:
    name: the experiment's name (its script's stem).
    out: the output directory (created if missing).
    results: every measured number (NumPy arrays become lists; NaN/inf become null).
    findings: rows made with `bertjax.claims.Claim.row`, or the script's `findings(results,
      settings)`: then the rows are made from the results and settings as the JSON holds them,
      as `findings.py --refresh` makes them, and logged.
    settings: the run's settings (sizes, steps, model), so the run can be repeated.
    smoke: whether this was a `--smoke` run (such files never reach the README).
    seconds: the wall time of the whole run.
    figures: the PNG file names written beside the JSON; each must start with the stem.
    stem: the file's name without `.json` when not `results_stem(name, model)` (a second
      scale of one experiment).
    model: `--model` (None: the default all-MiniLM-L6-v2): the file is `results_stem(name,
      model)`, and `model_tag(model)` is recorded ("" for the default; the Findings table puts
      each model in its column).

  Raises:
    ValueError: a malformed finding, or a figure whose name does not start with the stem
      (it would be another model's or run's file).
  """
  out = pathlib.Path(out)
  out.mkdir(parents=True, exist_ok=True)
  if callable(findings):
    findings = findings(to_json(results), to_json(settings))
    for f in findings:
      log(f"[{f['holds']}] {f['claim']} -- {f['measured']}")
  for f in findings:
    if (
      set(f) - {"short", "value"} != {"paper", "claim", "measured", "holds"}
      or f["holds"] not in HOLDS
    ):
      raise ValueError(f"malformed finding {f!r}: make it with bertjax.claims.Claim.row")
  stem = stem or results_stem(name, model)
  wrong = [f for f in figures if not f.startswith(f"{stem}_")]
  if wrong:
    raise ValueError(f"figures {wrong} must be named {stem}_*.png for the results {stem}.json")
  doc = {
    "experiment": name,
    "smoke": smoke,
    "model_tag": model_tag(model),
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "command": " ".join([pathlib.Path(sys.argv[0]).name, *sys.argv[1:]]),
    "machine": machine(),
    "seconds": seconds,
    "settings": settings,
    "findings": list(findings),
    "figures": list(figures),
    "results": results,
  }
  from bertjax.utils import write_json

  path = write_json(out / f"{stem}.json", doc)
  log(f"wrote {path}")
  return path


def finish(
  name: str,
  args: argparse.Namespace,
  results: dict[str, Any],
  settings: dict[str, Any],
  *,
  started: float,
  figures: Sequence[str] = (),
  stem: str | None = None,
) -> pathlib.Path:
  """`write_results` for a script's parsed `args` (`--out`, `--smoke`, `--model`): the rows
  are made by its rules module's `findings` (`experiments/rules/NAME.py`), and the run took
  from `started` (a `time.perf_counter()` value) until now."""
  return write_results(
    name,
    args.out,
    results,
    findings=importlib.import_module(f"rules.{name}").findings,
    settings=settings,
    smoke=args.smoke,
    seconds=time.perf_counter() - started,
    figures=figures,
    stem=stem,
    model=getattr(args, "model", None),
  )


def load_wikitext(args, sc: PretrainScale, timings: dict[str, float]):
  """WikiText-2 for a pretraining experiment at the sizes of `sc`, from `--data-dir` (timed
  as "data"): `bertjax.training.runs.load_wikitext`'s `PretrainingData`."""
  from bertjax.training import runs

  with timed(timings, "data"):
    root = data_dir(args.data_dir, "wikitext2_tokens")
    return runs.load_wikitext(
      root,
      vocab=sc.vocab,
      seq_len=sc.seq_len,
      eval_batches=sc.eval_batches,
      batch=sc.batch,
      seed=args.seed,
      max_lines=sc.max_lines,
    )


def wikitext_windows(
  tok, config, data: pathlib.Path, split: str, limit: int, batch_size: int, length: int = 128
):
  """The first `limit` windows of up to `length` tokens (at most the model's) of WikiText-2's
  `split` ("valid" or "test") paragraphs, in batches (`text_batches.window_batches`)."""
  from bertjax.tasks import passages, text_batches

  texts = passages.wikitext_paragraphs(data / "wikitext2_tokens" / f"{split}.txt")
  return text_batches.window_batches(
    tok, texts, max_length=min(length, config.max_length), batch_size=batch_size, limit=limit
  )


def masked_windows(tok, config, batches, seed: int):
  """BERT's masking of `batches` with the tokenizer's ids (`mlm_head.mask_batches`)."""
  from bertjax.training import mlm_head

  if tok.mask_id is None:
    raise UsageError("the tokenizer has no mask token, so nothing can be masked")
  return mlm_head.mask_batches(
    batches,
    mask_id=tok.mask_id,
    special_ids=tok.special_ids,
    vocab_size=config.vocab_size,
    seed=seed,
  )


def head_source(head: dict) -> str:
  """Which MLM head a result read, in words (`with_mlm_head`'s `head`)."""
  if head["source"] == "the checkpoint's":
    return "the checkpoint's own MLM head"
  stopped = (
    f" and {head['stop_loss']:.2f} on {head['stop_predictions']:,} held out to stop on, step "
    f"{head['best_step']} of {head['steps']} kept"
    if "best_step" in head
    else ""
  )
  return (
    "an MLM head fitted to the frozen body, as the checkpoint ships none: "
    f"{head['fit_predictions']:,} WikiText-2 validation predictions, loss "
    f"{head['fit_loss']:.2f} nats on them{stopped}"
  )


MLM_HEAD_CACHE = 2  # the fitted heads' cache version: raise it when the fit changes


def _mlm_head_cache(args, params, windows: int, steps: int) -> pathlib.Path | None:
  """Where a fitted head of a full run is kept (the user cache), named by the model, a hash
  of its weights and the fit's settings, so the experiments that read the same model's head
  fit it once; None for a smoke run."""
  if args.smoke:
    return None
  import hashlib

  import jax
  import numpy as np

  from bertjax.data.fetch import user_cache_dir

  digest = hashlib.blake2b(digest_size=8)
  for leaf in jax.tree.leaves(params):
    digest.update(np.ascontiguousarray(leaf).tobytes())
  tag = model_tag(args.model) or "all-MiniLM-L6-v2"
  name = f"{tag}-{digest.hexdigest()}-w{windows}-s{steps}-seed{args.seed}-v{MLM_HEAD_CACHE}.npz"
  return user_cache_dir().parent / "mlm_heads" / name


def with_mlm_head(args, params, config, tok, data: pathlib.Path, timings, *, windows, steps):
  """`(params, head)`: the model with the checkpoint's MLM head, or, for a checkpoint that
  ships none, with one fitted to its frozen body (`bertjax.training.mlm_head.fit_mlm_head`,
  timed as "MLM head fit"; a full run's fitted head is kept in the user cache and read back by
  the next run). Of `windows` WikiText-2 validation windows, the last eighth is held out for
  early stopping (the loss checked every 50 of the `steps` steps, the best head kept) and the
  rest is fitted. `head` says which ("source") and, for a fitted one, on how many predictions,
  its loss there and on the held-out ones, and the step kept."""
  import json

  import numpy as np
  from flax import traverse_util

  from bertjax.training import mlm_head

  if "mlm" in params:
    return params, {"source": "the checkpoint's"}
  if "mlm" not in config.family.heads:
    raise UsageError(f"a {config.model_type} model has no masked-LM head")
  cache = _mlm_head_cache(args, params, windows, steps)
  if cache is not None and cache.exists():
    with np.load(cache) as f:
      head = traverse_util.unflatten_dict({tuple(k.split("/")): f[k] for k in f.files if k != "_"})
      info = json.loads(str(f["_"]))
    log(f"MLM head read from {cache}")
    return {**params, "mlm": head}, info
  with timed(timings, "MLM head fit"):
    size = min(32, max(1, windows // 8))  # at least 8 batches, one of them held out
    batches = wikitext_windows(tok, config, data, "valid", windows, size)
    masked = masked_windows(tok, config, batches, args.seed)
    if len(masked) < 2:
      raise UsageError(f"--mlm-windows={windows} leaves no held-out windows to stop on")
    stop = max(1, len(masked) // 8)
    params, fitted = mlm_head.fit_mlm_head(
      params,
      config,
      masked[:-stop],
      held_out=masked[-stop:],
      steps=steps,
      eval_every=min(50, steps),
      seed=args.seed,
      progress=sys.stderr.isatty(),
    )
  info = {
    "source": "fitted to the frozen body",
    "fit_predictions": fitted["fit"]["predictions"],
    "fit_loss": fitted["fit"]["loss"],
    "stop_predictions": fitted["held_out"]["predictions"],
    "stop_loss": fitted["held_out"]["loss"],
    "best_step": fitted["best_step"],
    "steps": steps,
  }
  log(
    f"MLM head fitted: loss {info['fit_loss']:.3f} on {info['fit_predictions']:,} predictions, "
    f"{info['stop_loss']:.3f} on {info['stop_predictions']:,} held out (step "
    f"{info['best_step']} of {steps} kept)"
  )
  if cache is not None:
    cache.parent.mkdir(parents=True, exist_ok=True)
    flat = traverse_util.flatten_dict(params["mlm"], sep="/")
    part = cache.with_suffix(".part.npz")
    np.savez(part, _=json.dumps(info), **{k: np.asarray(v) for k, v in flat.items()})
    os.replace(part, cache)
  return params, info
