"""A study's result file: every number, its settings, the machine, and the claims' rows."""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import platform
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from bertjax.study.command import DEFAULT_MODEL, log

HOLDS = ("yes", "partly", "no", "n/a")


def model_tag(model: str | os.PathLike | None) -> str:
  """The short name of a `--model` value that result files carry: the last part of the hub id
  or directory ("all-mpnet-base-v2"); "" for None and all-MiniLM-L6-v2 (the default model)."""
  if model is None:
    return ""
  import bertjax

  path = pathlib.Path(str(model))
  if path.exists() and path.resolve() == bertjax.minilm_path().resolve():
    return ""  # the built-in checkpoint's own directory
  tag = pathlib.PurePath(str(model).rstrip("/\\")).name
  return "" if tag.lower() == DEFAULT_MODEL.lower() else tag


def results_stem(name: str, model: str | os.PathLike | None) -> str:
  """The result files' stem of experiment `name` on `model` (`--model`; None: the default
  model): `name` for all-MiniLM-L6-v2, else `name_TAG` (`model_tag`), so each (experiment,
  model) writes its own `STEM.json` and `STEM_*.png` beside the others.

  Raises:
    ValueError: the tag has characters a file name should not (spaces, slashes, ...).
  """
  tag = model_tag(model)
  if tag and not all(c.isalnum() or c in "-_." for c in tag):
    raise ValueError(
      f"model {str(model)!r} gives the file-name tag {tag!r}: only letters, "
      "digits, '-', '_' and '.' may be in it"
    )
  return f"{name}_{tag}" if tag else name


def to_json(x: Any) -> Any:
  """`x` as plain JSON values, NaN as None (`bertjax.utils.to_json`, imported when called)."""
  from bertjax.utils import to_json as convert

  return convert(x)


def from_json(x: Any) -> Any:
  """`x` read back from a result file with every None (a NaN or inf written as null) as NaN,
  so a script's `findings(results, settings)` computes the same from the file as in the run."""
  if isinstance(x, dict):
    return {k: from_json(v) for k, v in x.items()}
  if isinstance(x, list):  # leaves inline: the Findings' bootstraps convert results 1000s of times
    nan = float("nan")
    return [from_json(v) if isinstance(v, (dict, list)) else nan if v is None else v for v in x]
  return float("nan") if x is None else x


def machine() -> dict[str, Any]:
  """Where the numbers came from: platform, CPU model and ISA (`bertjax.utils.cpu_info`), JAX
  backend and devices."""
  import jax

  from bertjax.utils import cpu_info

  return {
    "platform": platform.platform(),
    "machine": platform.machine(),
    **cpu_info(),
    "python": platform.python_version(),
    "jax": jax.__version__,
    "backend": jax.default_backend(),
    "devices": [d.device_kind for d in jax.devices()],
  }


def write_results(
  name: str,
  out: str | os.PathLike,
  results: dict[str, Any],
  *,
  findings: Sequence[dict[str, str]] | Callable[[dict, dict], Sequence[dict[str, str]]],
  settings: dict[str, Any],
  smoke: bool,
  seconds: float,
  figures: Sequence[str] = (),
  stem: str | None = None,
  model: str | os.PathLike | None = None,
) -> pathlib.Path:
  """Writes `out/STEM.json` and returns its path.

  Args:
    name: the experiment's name (its script's stem).
    out: the output directory (created if missing).
    results: every measured number (NumPy arrays become lists; NaN/inf become null).
    findings: rows made with `bertjax.claims.Claim.row`, or the script's `findings(results,
      settings)`: then the rows are made from the results and settings as the JSON holds them,
      as `python -m experiments.findings --refresh` makes them, and logged.
    settings: the run's settings (sizes, steps, model), so the run can be repeated.
    smoke: whether this was a `--smoke` run (such files never reach the README).
    seconds: the wall time of the whole run.
    figures: the PNG file names written beside the JSON; each must start with the stem.
    stem: the file's name without `.json` when not `results_stem(name, model)` (a second
      scale of one experiment).
    model: `--model` (None: the default all-MiniLM-L6-v2): the file is `results_stem(name,
      model)`, and `model_tag(model)` is recorded ("" for the default; the Findings table puts
      each model in its column).

  Raises:
    ValueError: a malformed finding, or a figure whose name does not start with the stem
      (it would be another model's or run's file).
  """
  out = pathlib.Path(out)
  out.mkdir(parents=True, exist_ok=True)
  if callable(findings):
    findings = findings(to_json(results), to_json(settings))
    for f in findings:
      log(f"[{f['holds']}] {f['claim']} -- {f['measured']}")
  for f in findings:
    if (
      set(f) - {"short", "value"} != {"paper", "claim", "measured", "holds"}
      or f["holds"] not in HOLDS
    ):
      raise ValueError(f"malformed finding {f!r}: make it with bertjax.claims.Claim.row")
  stem = stem or results_stem(name, model)
  wrong = [f for f in figures if not f.startswith(f"{stem}_")]
  if wrong:
    raise ValueError(f"figures {wrong} must be named {stem}_*.png for the results {stem}.json")
  doc = {
    "experiment": name,
    "smoke": smoke,
    "model_tag": model_tag(model),
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "command": " ".join([pathlib.Path(sys.argv[0]).name, *sys.argv[1:]]),
    "machine": machine(),
    "seconds": seconds,
    "settings": settings,
    "findings": list(findings),
    "figures": list(figures),
    "results": results,
  }
  from bertjax.utils import write_json

  path = write_json(out / f"{stem}.json", doc)
  log(f"wrote {path}")
  return path


def finish(
  name: str,
  args: argparse.Namespace,
  results: dict[str, Any],
  settings: dict[str, Any],
  *,
  findings: Callable[[dict, dict], Sequence[dict[str, str]]],
  started: float,
  figures: Sequence[str] = (),
  stem: str | None = None,
) -> pathlib.Path:
  """`write_results` for a study's parsed `args` (`--out`, `--smoke`, `--model`): the rows
  are made by `findings(results, settings)` (the study's claims) from the numbers as written,
  and the run took from `started` (a `time.perf_counter()` value) until now."""
  return write_results(
    name,
    args.out,
    results,
    findings=findings,
    settings=settings,
    smoke=args.smoke,
    seconds=time.perf_counter() - started,
    figures=figures,
    stem=stem,
    model=getattr(args, "model", None),
  )
