"""Every backticked `bertjax.…` name the docs name resolves: in the docstrings of every module,
class and function under bertjax/ (the kernels in bertjax/kernels/ too), in every
Markdown file under docs/ and in the README. A name resolves when the longest importable
module prefix imports and getattr finds the rest. Cheap: the docstrings are read with ast,
and only the named modules are imported (nothing is compiled)."""

import ast
import importlib
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
SOURCES = (REPO / "bertjax",)
MARKDOWN = (REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")))

# A single-backtick code span on one line; fences (```) are not spans.
_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_NAME = re.compile(r"(?<![\w.])bertjax(?:\.\w+)+")

# Names a file records on purpose as no longer there: (file, name) -> why.
GONE_ON_PURPOSE = {
  ("docs/testing.md", "bertjax.utils.interleaved_times"): "the table of removed tests names it",
}


def names_in(text: str, first_line: int = 1):
  """(name, line) for each `bertjax.…` name inside a backticked span of `text`."""
  for span in _SPAN.finditer(text):
    line = first_line + text.count("\n", 0, span.start())
    for name in _NAME.findall(span[1]):
      yield name, line


def docstring_names(path: pathlib.Path):
  """(name, line) for each name in the docstrings of a module, its classes and functions."""
  tree = ast.parse(path.read_text(), filename=str(path))
  kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
  for node in ast.walk(tree):
    if isinstance(node, kinds) and ast.get_docstring(node, clean=False):
      string = node.body[0].value
      yield from names_in(string.value, string.lineno)


def documented_names() -> dict[str, list[str]]:
  """Each name -> the places (`file:line`) that name it."""
  found: dict[str, list[str]] = {}
  places = [(p, docstring_names(p)) for root in SOURCES for p in sorted(root.rglob("*.py"))]
  places += [(p, names_in(p.read_text())) for p in MARKDOWN]
  for path, names in places:
    for name, line in names:
      found.setdefault(name, []).append(f"{path.relative_to(REPO)}:{line}")
  return found


def resolves(name: str) -> bool:
  """Whether `name` is an object: the longest importable module prefix, then getattr."""
  parts = name.split(".")
  for i in range(len(parts), 0, -1):
    module_name = ".".join(parts[:i])
    try:
      obj = importlib.import_module(module_name)
    except ModuleNotFoundError as e:  # only the missing module itself; a missing dependency
      if e.name is not None and (module_name + ".").startswith(e.name + "."):  # is an error
        continue
      raise
    for attr in parts[i:]:
      if not hasattr(obj, attr):
        return False
      obj = getattr(obj, attr)
    return True
  return False


def unresolved(found: dict[str, list[str]]) -> list[str]:
  """`name (file:line, ...)` for each name that does not resolve."""
  problems = []
  for name, where in sorted(found.items()):
    where = [w for w in where if (w.rsplit(":", 1)[0], name) not in GONE_ON_PURPOSE]
    if where and not resolves(name):
      problems.append(f"{name} ({', '.join(where)})")
  return problems


def test_every_documented_bertjax_name_resolves():
  found = documented_names()
  assert len(found) > 50  # the scan reads the docstrings and pages at all
  problems = unresolved(found)
  assert not problems, "unresolved names:\n" + "\n".join(problems)


def test_the_check_finds_a_broken_name_and_where():
  doc = 'def f():\n  """Calls `bertjax.model.forward.forwrd` and `bertjax.forward(params)`."""\n'
  names = list(names_in(ast.parse(doc).body[0].body[0].value.value, 2))
  assert names == [("bertjax.model.forward.forwrd", 2), ("bertjax.forward", 2)]
  assert not resolves("bertjax.model.forward.forwrd")
  assert not resolves("bertjax.no_such_module.thing")
  assert resolves("bertjax.model.forward.forward") and resolves("bertjax.Packing.of")
  assert resolves("bertjax.kernels.attention")
  problems = unresolved({"bertjax.model.functional": ["bertjax/x.py:3", "docs/y.md:9"]})
  assert problems == ["bertjax.model.functional (bertjax/x.py:3, docs/y.md:9)"]
  # Outside a code span, or in a fenced block, a name is prose, not checked.
  assert not list(names_in("bertjax.nothing\n```python\nbertjax.nothing()\n```\n"))
