"""What every experiment script shares: arguments, the model, the data, the result file.

Each experiment in this directory is one script answering one question from the
BERTology literature. They all:

* take `--out DIR` (default `experiments/results`), `--data-dir DIR` (default
  `../shared/data` beside the repository), `--seed`, and `--smoke` (a tiny model and
  tiny data, seconds not minutes: what the tests run);
* write `NAME.json` (every number, the settings, the machine, the time taken, and the
  `findings` rows that feed the README's Findings table) and `NAME_*.png` figures;
* print progress lines to stderr.

`write_results` puts the Findings rows in a fixed shape: the paper, its headline claim,
what we measured, and whether the claim holds here ("yes", "partly", "no", or "n/a").
`experiments/findings.py` turns the committed full (non-smoke) JSON files into the table.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import pathlib
import platform
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "experiments" / "results"
HOLDS = ("yes", "partly", "no", "n/a")


def parser(doc: str | None) -> argparse.ArgumentParser:
  """An argument parser with the shared options; the script's docstring is its help text."""
  p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", default=str(RESULTS), metavar="DIR",
                 help=f"where NAME.json and the PNG figures go (default: {RESULTS.relative_to(REPO)})")
  p.add_argument("--data-dir", default=None, metavar="DIR",
                 help="the real data sets (ud_english_ewt/, wikitext2_tokens/, ...) "
                      "(default: $BERTJAX_DATA_DIR or ../shared/data beside the repository)")
  p.add_argument("--seed", type=int, default=0, help="seed of every split and sample (default: 0)")
  p.add_argument("--smoke", action="store_true",
                 help="a tiny model and tiny data, for the tests (results are not findings)")
  return p


def data_dir(arg: str | None) -> pathlib.Path:
  """The data directory: the argument, else $BERTJAX_DATA_DIR, else ../shared/data.

  Raises:
    FileNotFoundError: the directory does not exist (names it and how to point elsewhere).
  """
  path = pathlib.Path(arg or os.environ.get("BERTJAX_DATA_DIR") or REPO.parent / "shared" / "data")
  if not path.is_dir():
    raise FileNotFoundError(f"data directory {path} does not exist; pass --data-dir DIR "
                            "(the directory holding ud_english_ewt/, wikitext2_tokens/, ...)")
  return path


def ud_file(data: pathlib.Path, split: str = "dev") -> pathlib.Path:
  """UD English EWT's `.conllu` file for `split` ("train", "dev" or "test")."""
  hits = sorted((data / "ud_english_ewt").rglob(f"*-ud-{split}.conllu"))
  if not hits:
    raise FileNotFoundError(f"no *-ud-{split}.conllu under {data / 'ud_english_ewt'}")
  return hits[0]


def minilm():
  """(config, params, tokenizer) of the built-in real checkpoint, all-MiniLM-L6-v2."""
  import bertjax

  path = bertjax.minilm_path()
  config, params = bertjax.from_hf(path)
  return config, params, bertjax.Tokenizer.from_pretrained(path)


def log(*parts: Any) -> None:
  """A progress line on stderr."""
  print("[{}]".format(time.strftime("%H:%M:%S")), *parts, file=sys.stderr, flush=True)


@contextlib.contextmanager
def timed(timings: dict[str, float], key: str) -> Iterator[None]:
  """Adds the wall time of the block to `timings[key]` (seconds) and logs it."""
  t0 = time.perf_counter()
  yield
  timings[key] = timings.get(key, 0.0) + time.perf_counter() - t0
  log(f"{key}: {timings[key]:.1f}s")


def finding(paper: str, claim: str, measured: str, holds: str) -> dict[str, str]:
  """One row of the README's Findings table.

  Args:
    paper: short citation, e.g. "Michel et al. 2019".
    claim: the paper's headline claim, in a sentence.
    measured: what this run measured, with numbers.
    holds: "yes", "partly", "no" or "n/a".
  """
  if holds not in HOLDS:
    raise ValueError(f"holds must be one of {HOLDS}, got {holds!r}")
  return {"paper": paper, "claim": claim, "measured": measured, "holds": holds}


def _jsonable(x: Any) -> Any:
  if isinstance(x, dict):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  if hasattr(x, "tolist") and not isinstance(x, (str, bytes)):
    return _jsonable(x.tolist())
  if isinstance(x, (np.floating, float)):
    return float(x) if math.isfinite(x) else None
  if isinstance(x, np.integer):
    return int(x)
  if isinstance(x, pathlib.Path):
    return str(x)
  return x


def machine() -> dict[str, Any]:
  """Where the numbers came from: platform, CPU count, JAX backend and devices."""
  import jax

  return {"platform": platform.platform(), "machine": platform.machine(),
          "cpus": os.cpu_count(), "python": platform.python_version(),
          "jax": jax.__version__, "backend": jax.default_backend(),
          "devices": [d.device_kind for d in jax.devices()]}


def write_results(name: str, out: str | os.PathLike, results: dict[str, Any], *,
                  findings: Sequence[dict[str, str]], settings: dict[str, Any], smoke: bool,
                  seconds: float, figures: Sequence[str] = (), stem: str | None = None
                  ) -> pathlib.Path:
  """Writes `out/NAME.json` and returns its path.

  Args:
    name: the experiment's name (its script's stem).
    out: the output directory (created if missing).
    results: every measured number (NumPy arrays become lists; NaN/inf become null).
    findings: rows made with `finding`.
    settings: the run's settings (sizes, steps, model), so the run can be repeated.
    smoke: whether this was a `--smoke` run (such files never reach the README).
    seconds: the wall time of the whole run.
    figures: the PNG file names written beside the JSON.
    stem: the file's name without `.json` when not `name` (a second scale of one experiment).
  """
  out = pathlib.Path(out)
  out.mkdir(parents=True, exist_ok=True)
  for f in findings:
    if set(f) != {"paper", "claim", "measured", "holds"} or f["holds"] not in HOLDS:
      raise ValueError(f"malformed finding {f!r}: make it with common.finding")
  doc = {"experiment": name, "smoke": smoke,
         "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
         "command": " ".join([pathlib.Path(sys.argv[0]).name, *sys.argv[1:]]),
         "machine": machine(), "seconds": seconds, "settings": settings,
         "findings": list(findings), "figures": list(figures), "results": results}
  path = out / f"{stem or name}.json"
  tmp = path.with_suffix(".json.tmp")
  tmp.write_text(json.dumps(_jsonable(doc), indent=1, allow_nan=False) + "\n")
  tmp.replace(path)
  log(f"wrote {path}")
  return path


def savefig(fig, out: str | os.PathLike, name: str) -> str:
  """Saves a matplotlib figure as `out/NAME.png`, closes it, and returns the file name."""
  import matplotlib.pyplot as plt

  out = pathlib.Path(out)
  out.mkdir(parents=True, exist_ok=True)
  fig.savefig(out / f"{name}.png", dpi=110, bbox_inches="tight")
  plt.close(fig)
  return f"{name}.png"
