"""Optional extras stay optional: every `bertjax` module imports without the `plots` extra."""

import subprocess
import sys

import pytest

# A finder that refuses matplotlib, as if the `plots` extra were not installed; then every
# module of the installed package (bertjax.kernels included) is imported.
_CODE = """
import importlib, importlib.abc, pkgutil, sys

class NoMatplotlib(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path=None, target=None):
    if name == "matplotlib" or name.startswith("matplotlib."):
      raise ImportError(f"{name} is blocked: the plots extra is not installed")
    return None

sys.meta_path.insert(0, NoMatplotlib())
import bertjax
from bertjax import kernels  # bertjax/kernels/

names = sorted({m.name for pkg in (bertjax, kernels)
                for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")})
for name in names:
  importlib.import_module(name)
assert not any(m == "matplotlib" or m.startswith("matplotlib.") for m in sys.modules)
print(len(names), " ".join(names))
"""


@pytest.mark.slow
def test_every_module_imports_without_matplotlib(tmp_path):
  run = subprocess.run(
    [sys.executable, "-c", _CODE],
    check=False,
    cwd=tmp_path,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  count, *names = run.stdout.split()
  assert int(count) == len(names) > 40
  for name in (
    "bertjax.analysis.representations.probing_run",
    "bertjax.plots.probing",
    "bertjax.plots.charts",
    "bertjax.report",
    "bertjax.kernels.attention",
    "bertjax.training.loop",
  ):
    assert name in names
