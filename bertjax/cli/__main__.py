"""`python -m bertjax.cli COMMAND ...`: the `bertjax` command (what `./run.sh` runs)."""

import sys

from bertjax.cli import main

if __name__ == "__main__":
  sys.exit(main())
