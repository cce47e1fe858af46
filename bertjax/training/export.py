"""`bertjax export`, and writing Hugging Face model directories whole.

`export_checkpoint` turns any saved step of a `bertjax pretrain` run into a Hugging Face
directory with the run's tokenizer files (checked against the checkpoint's vocabulary);
`save_hf_model` writes a model and its tokenizer (what `bertjax finetune` saves). Both write
into a temporary folder and move the files into place only when complete.

    bertjax export runs/mini --step 500 --to runs/mini-500
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys
import tempfile
import warnings


def _write_whole(directory: pathlib.Path, fill) -> None:
  """Runs `fill(tmp)` on a temporary folder beside `directory`, then moves its files in:
  a failure leaves no half-written model (files already in `directory` are replaced)."""
  directory.parent.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
  try:
    fill(tmp)
    directory.mkdir(exist_ok=True)
    for f in sorted(tmp.iterdir()):
      if f.is_dir() and (directory / f.name).is_dir():  # a model folder (ELECTRA's pair)
        shutil.rmtree(directory / f.name)
      os.replace(f, directory / f.name)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def _as_tokenizer(tokenizer, config):
  """A `bertjax.Tokenizer` (wrapping a bare `tokenizers.Tokenizer`) that fits `config`."""
  import bertjax

  if not isinstance(tokenizer, bertjax.Tokenizer):
    tokenizer = bertjax.Tokenizer(tokenizer, config.max_position_embeddings)
  if tokenizer.vocab_size > config.vocab_size:
    raise ValueError(
      f"the tokenizer has {tokenizer.vocab_size} tokens but the model's "
      f"vocab_size={config.vocab_size}"
    )
  return tokenizer


def save_hf_model(config, params, tokenizer, directory: str | os.PathLike) -> pathlib.Path:
  """Writes a Hugging Face model directory whole: config, weights and tokenizer files.

  Everything goes into a temporary folder beside `directory` first and is moved into
  place only when complete, so a failure leaves no half-written model.

  Args:
    config, params: the model (`bertjax.to_hf`; `config.label_names` become `id2label`).
    tokenizer: a `bertjax.Tokenizer` or a `tokenizers.Tokenizer` (saved with
      `Tokenizer.save_pretrained`: `tokenizer.json`, `vocab.txt` for WordPiece,
      `tokenizer_config.json`, `special_tokens_map.json`).
    directory: the model directory (created; files already there are replaced).

  Returns:
    The directory.
  """
  import bertjax

  tokenizer = _as_tokenizer(tokenizer, config)
  directory = pathlib.Path(directory)

  def fill(tmp):
    bertjax.to_hf(config, params, tmp)
    tokenizer.save_pretrained(tmp)

  _write_whole(directory, fill)
  return directory


def export_checkpoint(
  checkpoint_dir: str | os.PathLike,
  to: str | os.PathLike,
  *,
  step: int | None = None,
  tokenizer=None,
):
  """A training checkpoint as a Hugging Face directory with the run's tokenizer files.

  An ELECTRA run (a generator and a discriminator) becomes two model directories,
  ``to/generator`` (`ElectraForMaskedLM`) and ``to/discriminator``
  (`ElectraForPreTraining`), each with the tokenizer files.

  Args:
    checkpoint_dir: a `pretrain` output folder or its `checkpoints/` folder.
    to: the model directory to write (whole, or not at all).
    step: the step; None means the newest readable one.
    tokenizer: a tokenizer path (directory, tokenizer.json or vocab.txt); None means the
      run's `vocab/` folder. Its size must equal the checkpoint's vocab_size (else a
      ValueError naming both: the vocabulary is not the one the weights were trained with).

  Returns:
    `(config, step, tokenizer)`: what was written (ELECTRA: the discriminator's config).
  """
  from bertjax.data import corpus as C
  from bertjax.training import checkpoint as K
  from bertjax.training.electra import ROLES

  ckpt_dir, run = _checkpoint_dirs(pathlib.Path(checkpoint_dir))
  source = pathlib.Path(tokenizer) if tokenizer else run / "vocab"
  if not source.exists():
    raise FileNotFoundError(
      f"no tokenizer at {source} (the run's vocab/ folder); pass --tokenizer PATH"
    )
  backend = C.load_tokenizer(source)
  steps = K.Checkpointer(ckpt_dir, max_to_keep=None, async_save=False).all_steps()
  if not steps:
    raise FileNotFoundError(f"no finished checkpoint step in {ckpt_dir}")
  if step is not None and step not in steps:
    raise ValueError(f"step {step} is not a saved step; {ckpt_dir} has steps {steps}")
  written = {}

  def fill(tmp):
    errors = []
    for s in [step] if step is not None else sorted(steps, reverse=True):
      try:  # newest first: a corrupt step falls back to the one before, as `--resume` does
        with warnings.catch_warnings():
          warnings.simplefilter("ignore", RuntimeWarning)
          config = K.export_hf(ckpt_dir, tmp, step=s)
        break
      except K.CorruptCheckpointError as e:
        errors.append(f"step {s}: {e}")
        if step is None:
          print(
            f"export: checkpoint step {s} is unreadable; trying the one before", file=sys.stderr
          )
    else:
      raise K.CorruptCheckpointError(f"no readable checkpoint in {ckpt_dir}: {'; '.join(errors)}")
    n = backend.get_vocab_size(with_added_tokens=True)
    if n != config.vocab_size:  # a model that tokenises to the wrong rows is worse than none
      raise ValueError(
        f"the tokenizer {source} has {n} tokens but step {s} of {ckpt_dir} has "
        f"word embeddings for vocab_size={config.vocab_size}: it is not the "
        "vocabulary these weights were trained with; pass the run's own with "
        "--tokenizer PATH"
      )
    tok = _as_tokenizer(backend, config)
    for model_dir in [tmp / r for r in ROLES if (tmp / r).is_dir()] or [tmp]:
      tok.save_pretrained(model_dir)
    written.update(config=config, step=s, tokenizer=tok)

  _write_whole(pathlib.Path(to), fill)
  return written["config"], written["step"], written["tokenizer"]


def _checkpoint_dirs(path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
  """`(checkpoints, run)` for a `pretrain --output-dir` folder or its `checkpoints/` folder."""
  if not path.is_dir():
    raise FileNotFoundError(f"checkpoint directory {str(path)!r} does not exist")
  if (path / "checkpoints").is_dir():
    return path / "checkpoints", path
  if any(p.name.isdigit() for p in path.iterdir() if p.is_dir()):
    return path, path.parent
  raise FileNotFoundError(
    f"{str(path)!r} holds no training checkpoints (expected a `bertjax "
    "pretrain --output-dir` folder, with checkpoints/<step>/, or its "
    "checkpoints/ folder)"
  )
