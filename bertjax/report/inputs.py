"""What the report reads besides its sentences and batches: the analysed model's name
(`model_name`), the data directory (`default_data_dir`, `ud_files`) and JSON files
(`read_json`). Batches are `bertjax.tasks.text_batches`'."""

from __future__ import annotations

import json
import pathlib

_GENERIC_NAMES = {
  "model",
  "models",
  "hf",
  "export",
  "exported",
  "final",
  "latest",
  "best",
  "output",
  "outputs",
  "out",
  "snapshot",
  "checkpoint",
  "pytorch",
  "weights",
}


def default_data_dir() -> pathlib.Path | None:
  """The data directory holding UD English EWT, by the project's one lookup
  (`bertjax.data.fetch.find_root`: `$BERTJAX_DATA_DIR` or the user cache, then
  `../shared/data`); None when none holds it."""
  from bertjax.data import fetch

  try:
    return fetch.find_root(need=["ud_english_ewt"])
  except fetch.DataNotFoundError:
    return None


def model_name(path: pathlib.Path, given: str | None = None) -> str:
  """A name for the analysed model that means something to its reader.

  A hub id as given (`org/name`); a model in the Hugging Face cache
  (`models--org--name/snapshots/<hash>`) by its hub id; else the directory's name, with
  its parent's before it when the name alone says nothing (`model`, `hf`, a step
  number, a commit hash: `run-7/model`). `config.json`'s `_name_or_path` is not used:
  it records what a checkpoint was trained from (all-MiniLM-L6-v2's says
  `nreimers/MiniLM-L6-H384-uncased`), not what it is.
  """
  if given is not None and not pathlib.Path(given).expanduser().exists():
    return str(given)  # a hub id
  path = pathlib.Path(path).resolve()
  for part in reversed(path.parts):
    if part.startswith("models--") and part.count("--") >= 2:
      return "/".join(part.split("--")[1:])
  name = path.name
  generic = (
    name.lower() in _GENERIC_NAMES
    or name.isdigit()
    or (len(name) == 40 and all(c in "0123456789abcdef" for c in name))
    or name.lower().startswith(("checkpoint", "step"))
  )
  return f"{path.parent.name}/{name}" if generic and path.parent.name else name


def ud_files(data_dir: pathlib.Path) -> list[pathlib.Path]:
  """UD English EWT CoNLL-U files under `data_dir`, train first, then dev, then test."""
  files = sorted((data_dir / "ud_english_ewt").glob("*.conllu")) if data_dir else []
  rank = lambda p: (0 if "train" in p.name else 1 if "dev" in p.name else 2, p.name)
  return sorted(files, key=rank)


def read_json(path: pathlib.Path) -> dict:
  """The JSON object in `path`, or {} when it is missing or not JSON."""
  try:
    return json.loads(path.read_text(encoding="utf-8"))
  except (OSError, ValueError):
    return {}
