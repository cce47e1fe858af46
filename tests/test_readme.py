"""The README's API tour runs as written, its comments number layers by the README's own rule,
and every `./run.sh` command it shows is one run.sh runs."""

import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
README = REPO / "README.md"
# The README's layer numbering: array indices are positions, layer numbers start at 1.
RULE = "index l is layer l + 1"


def _python_blocks(text=None):
  return re.findall(r"```python\n(.*?)```", text or README.read_text(), flags=re.DOTALL)


def _run_sh_commands() -> set[str]:
  """The commands run.sh accepts: the labels of its `case "$cmd" in ... esac` and the bertjax
  commands it passes on (`BERTJAX_COMMANDS`)."""
  text = (REPO / "run.sh").read_text()
  body = text[text.index('case "$cmd" in') :]
  body = body[: body.index("\nesac")]
  labels = re.findall(r"^\s*([\w|\s-]+)\)", body, flags=re.MULTILINE)
  passed = re.search(r'^BERTJAX_COMMANDS="([^"]*)"', text, flags=re.MULTILINE)
  return {c.strip() for label in labels for c in label.split("|")} | set(
    passed[1].split() if passed else ()
  )


def readme_command_problems(text: str) -> list[str]:
  """What is wrong with the `./run.sh` commands `text` shows: the setup block must hold exactly
  the two commands `demo` and `test`, every command must be one run.sh accepts, and every
  experiment or benchmark named must exist."""
  problems = []
  setup = re.search(r"## Set up and run\n+```bash\n(.*?)```", text, flags=re.DOTALL)
  lines = [] if setup is None else [ln.split("#")[0].strip() for ln in setup[1].splitlines()]
  if [ln for ln in lines if ln] != ["./run.sh demo", "./run.sh test"]:
    problems.append(f"the setup block runs {lines}, not ./run.sh demo and ./run.sh test")
  known = _run_sh_commands()
  shown = set(re.findall(r"\./run\.sh ([a-z][\w-]*)", text))  # NAME, COMMAND: placeholders
  for command in sorted(shown - known):
    problems.append(f"./run.sh {command}: run.sh has no such command (it has {sorted(known)})")
  for kind, folder in (("experiment", "experiments"), ("bench", "benchmarks")):
    for name in set(re.findall(rf"\./run\.sh {kind} ([a-z_0-9]+)", text)):
      if not (REPO / folder / f"{name}.py").is_file():
        problems.append(f"./run.sh {kind} {name}: no {folder}/{name}.py")
  return problems


def test_readme_commands_are_ones_run_sh_runs():
  assert not readme_command_problems(README.read_text())
  # The check sees a wrong command, a missing experiment and a changed setup block.
  text = README.read_text()
  assert any("./run.sh demos" in p for p in readme_command_problems(text + " `./run.sh demos`"))
  assert any(
    "no experiments/nothing_here.py" in p
    for p in readme_command_problems(text + " `./run.sh experiment nothing_here`")
  )
  changed = text.replace("./run.sh test   # set up", "./run.sh bench  # set up", 1)
  assert changed != text and any("setup block" in p for p in readme_command_problems(changed))


def tour_layer_problems(block: str) -> list[str]:
  """Comments of a tour `block` that break the layer numbering: each `layer N` a comment names
  must say the index it stands for, `layer N (index l)`, with N = l + 1, and l must be an index
  in the code the comment describes (the statement lines after a comment line, or its own
  line for a comment at a line's end)."""
  lines = block.split("\n")
  described = []  # (comment, the code it describes)
  i = 0
  while i < len(lines):
    stripped = lines[i].strip()
    if stripped.startswith("#"):
      j = i
      while j < len(lines) and lines[j].strip().startswith("#"):
        j += 1
      k = j
      while k < len(lines) and not lines[k].strip().startswith("#"):
        k += 1
      comment = " ".join(ln.strip().lstrip("#").strip() for ln in lines[i:j])
      described.append((comment, "\n".join(ln.split("  # ")[0] for ln in lines[j:k])))
      i = j
      continue
    if "  # " in lines[i]:
      code, comment = lines[i].split("  # ", 1)
      described.append((comment, code))
    i += 1
  problems = []
  for comment, code in described:
    for m in re.finditer(r"\blayer (\d+)\b( \(index (\d+)\))?", comment):
      layer, index = int(m[1]), m[3]
      if index is None:
        problems.append(f"{comment!r}: names layer {layer} without its index")
      elif layer != int(index) + 1:
        problems.append(f"{comment!r}: layer {layer} is index {layer - 1} ({RULE}), not {index}")
      elif not re.search(rf"[\[{{,]\s*{index}\s*[,\]:]", code):
        problems.append(f"{comment!r}: index {index} is not in the code it describes:\n{code}")
  return problems


def test_api_tour_comments_follow_the_layer_numbering():
  text = README.read_text()
  lines = len(text.splitlines())
  assert lines <= 300, f"the README is {lines} lines; the front door keeps to 300 (docs/ has room)"
  assert RULE in " ".join(text.split()), "the README no longer states its layer numbering"
  tour = _python_blocks(text)[0]
  assert not tour_layer_problems(tour)
  assert len(re.findall(r"\(index \d+\)", tour)) >= 6  # the tour's layer references
  # The check catches the errors issue #36 found: a layer named by its index, a layer without
  # its index, an index the code does not use.
  assert tour_layer_problems("xi = ones.at[2, 3].set(0)  # head 3 of layer 2 (index 2)")
  assert tour_layer_problems("# ablate head 3 of layer 2\nxi = ones.at[2, 3].set(0)")
  assert tour_layer_problems("# skip layer 5 (index 4)\nm = ones.at[3].set(0)")
  assert not tour_layer_problems("# skip layer 5 (index 4)\nm = ones.at[4].set(0)")


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
  assert (
    np.abs(np.asarray(same.last_hidden_state)[m] - np.asarray(out.last_hidden_state)[m]).max()
    < 1e-4
  )
  assert namespace["sweep"].shape == (12, 2, 384)
  # The patching pair is token-for-token: both runs have the same padding.
  np.testing.assert_array_equal(
    namespace["clean"].attention_mask, namespace["negated"].attention_mask
  )
