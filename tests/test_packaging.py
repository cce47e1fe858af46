"""Installed layout: the top-level kernels/ directory is the package bertjax.kernels."""

import subprocess
import sys


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
