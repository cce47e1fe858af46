"""Installed layout: the top-level kernels/ directory is the package bertjax.kernels."""

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_kernels_install_as_bertjax_kernels(tmp_path):
  code = ("import importlib.util, bertjax\n"
          "from bertjax import kernels\n"
          "from bertjax.kernels.flash_attention import BlockSizes\n"
          "assert kernels.BlockSizes is BlockSizes\n"
          "print(kernels.__name__, importlib.util.find_spec('kernels'))\n")
  # From a directory outside the checkout, so only the installed mapping can resolve it.
  run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  assert run.stdout.split() == ["bertjax.kernels", "None"]  # no bare `kernels` name claimed


def _import_graph(package_dir, package):
  """Module -> the package's modules it imports (top level or inside functions)."""
  import ast
  import pathlib

  graph = {}
  for path in pathlib.Path(package_dir).rglob("*.py"):
    rel = path.relative_to(package_dir).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    name = ".".join([package, *parts])
    is_pkg = path.name == "__init__.py"
    edges = set()
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.ImportFrom):
        if node.level:
          base = name.split(".")[: len(name.split(".")) - node.level + (1 if is_pkg else 0)]
          target = ".".join(base + ([node.module] if node.module else []))
        else:
          target = node.module or ""
        for alias in node.names:
          edges.add(f"{target}.{alias.name}")
        edges.add(target)
      elif isinstance(node, ast.Import):
        edges.update(a.name for a in node.names)
    graph[name] = edges
  return {m: {e for e in es if e in graph and e != m} for m, es in graph.items()}


def _cycle(graph):
  state, stack = {}, []

  def visit(m):
    state[m] = 1
    stack.append(m)
    for n in sorted(graph[m]):
      if state.get(n) == 1:
        return stack[stack.index(n):] + [n]
      if n not in state:
        found = visit(n)
        if found:
          return found
    state[m] = 2
    stack.pop()
    return None

  for m in sorted(graph):
    if m not in state:
      found = visit(m)
      if found:
        return found
  return None


def test_kernels_have_no_import_cycle():
  import pathlib

  repo = pathlib.Path(__file__).resolve().parents[1]
  graph = _import_graph(repo / "kernels", "bertjax.kernels")
  graph = {m: {e for e in es if not (m == "bertjax.kernels" or e == "bertjax.kernels")}
           for m, es in graph.items()}  # the package's __init__ re-exports its modules
  assert "bertjax.kernels.reference" in graph
  assert _cycle(graph) is None, _cycle(graph)
