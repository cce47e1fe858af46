"""The README's API tour runs as written."""

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks():
  return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_the_two_setup_commands():
  text = README.read_text()
  assert "./run.sh demo" in text and "./run.sh test" in text


@pytest.mark.hf
def test_api_tour_runs(minilm_dir, capsys):
  blocks = _python_blocks()
  assert blocks, "README has no python block"
  namespace = {}
  exec(compile(blocks[0], str(README), "exec"), namespace)  # noqa: S102
  printed = capsys.readouterr().out.split("\n")
  assert printed[0] == "(7, 2, 12, 384)" and printed[1] == "(6, 2, 12, 12, 12)"
  assert printed[2] == "(6, 2, 12)"
  import numpy as np

  same, out = namespace["same"], namespace["out"]
  m = namespace["batch"].attention_mask.astype(bool)
  assert np.abs(np.asarray(same.last_hidden_state)[m] - np.asarray(out.last_hidden_state)[m]).max() < 1e-4
  assert namespace["sweep"].shape == (12, 2, 384)
