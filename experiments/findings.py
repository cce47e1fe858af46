"""The Findings: the tables generated from the committed experiment results.

Each experiment's claims are data (`bertjax.claims.Claim`, the engine the report's readings
use too), at the end of its own module `experiments/NAME.py`: `findings(results, settings)`
makes its rows from the numbers as written to JSON (a run passes it to `bertjax.study.finish`,
which calls it on what it writes), and `uncertainty(results, settings)` applies the same rules
to resampled quantities: a 95% percentile bootstrap interval where the JSON keeps per-item
values (the verdict "inconclusive" where it differs across the interval), the rule's own test,
"exact" where nothing was sampled, else "CI: rerun needed".

Reads every full (non-smoke) `experiments/results/*.json` and renders
(`experiments.findings_pages`): between docs/findings.md's `<!-- findings-summary:start -->`
and `<!-- findings-summary:end -->` markers, the table read in a minute (per claim, in at
most 20 words: each model's headline value, its 95% interval and the verdict, and whether
the models agree); between `<!-- findings:start -->` and `<!-- findings:end -->`, the list of
the experiments' pages; and each page, `docs/findings/NAME.md` (every claim in full, what was
measured on each model, the rule, how sure, the likely cause where the models differ, each
run's settings).

Committed rows can be recomputed without a rerun, after a change to a rule or a row's wording:
`--refresh NAME` rewrites `NAME.json`'s `findings` (and its `settings["indexing"]` when the
module defines `INDEXING`), recording when under `findings_refreshed`; the measured numbers
are untouched.

Run (from the checkout):
  .venv/bin/python -m experiments.findings            # rewrite the table and the pages
  .venv/bin/python -m experiments.findings --check    # exit 1 if one is stale
  .venv/bin/python -m experiments.findings --refresh sixteen_heads   # rows from the JSON
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys

from bertjax.utils import json_text
from experiments.findings_pages import PAGES, module, render, render_page, render_summary

REPO = pathlib.Path(__file__).resolve().parents[1]
START, END = "<!-- findings:start -->", "<!-- findings:end -->"  # docs/findings.md
SUMMARY_START, SUMMARY_END = "<!-- findings-summary:start -->", "<!-- findings-summary:end -->"
# The order of the experiments in the table (the order); others follow by name.
ORDER = (
  "dark_secrets",
  "random_init",
  "sixteen_heads",
  "what_bert_looks_at",
  "probing_layers",
  "anisotropy",
  "effective_attention",
  "attribution",
  "negation_circuit",
  "outlier_dimensions",
  "tuned_lens",
  "stacking",
  "albert_sharing",
  "model_compression",
  "causal_variables",
  "transcoders",
  "attribution_graphs",
)


def load(results_dir: pathlib.Path) -> list[dict]:
  """The full-run result documents in `results_dir`, in the table's order (each with its
  file's stem as `"stem"`, and `"model_tag"`: "" for the default model's run)."""
  docs = []
  for path in sorted(results_dir.glob("*.json")):
    doc = json.loads(path.read_text())
    if not isinstance(doc, dict) or "findings" not in doc or doc.get("smoke"):
      continue
    docs.append({**doc, "stem": path.stem, "model_tag": doc.get("model_tag", "")})
  rank = {name: i for i, name in enumerate(ORDER)}
  return sorted(
    docs, key=lambda d: (rank.get(d["experiment"], len(ORDER)), d["experiment"], d["stem"])
  )


# Uncertainty -------------------------------------------------------------------------------
#
# Every row states the uncertainty of its verdict: a 95% percentile bootstrap interval
# (`bertjax.stats.bootstrap_ci`, seed 0) over the items the committed JSON keeps one value per
# (sentences, arcs, timing rounds or steps; heads where the statistic is a correlation across
# heads), the test the rule itself applies, "exact" where nothing was sampled, or "CI: rerun
# needed" where the JSON lacks the per-item values (no interval is made up). The rule is applied
# to every resample (through the experiment's own `findings` or its `Claim`); where the
# verdicts at the two ends of the interval differ, the row's verdict is "inconclusive".


def refresh(path: pathlib.Path) -> bool:
  """Recomputes the `findings` of a result file from its own numbers; True if they changed.

  Raises:
    ValueError: the experiment's module has no `findings(results, settings)`.
  """
  doc = json.loads(path.read_text())
  mod = module(doc["experiment"])
  make_rows = getattr(mod, "findings", None)
  if make_rows is None:
    raise ValueError(
      f"experiments/{doc['experiment']}.py defines no findings(results, "
      f"settings); rerun it to change {path.name}'s rows"
    )
  rows = make_rows(doc["results"], doc["settings"])
  settings = dict(doc["settings"])
  if hasattr(mod, "INDEXING"):
    settings["indexing"] = mod.INDEXING
  if rows == doc["findings"] and settings == doc["settings"]:
    return False
  doc["findings"], doc["settings"] = rows, settings
  doc["findings_refreshed"] = datetime.datetime.now(datetime.timezone.utc).isoformat(
    timespec="seconds"
  )
  path.write_text(json_text(doc) + "\n")
  return True


def update(text: str, table: str, markers: tuple[str, str] = (START, END)) -> str:
  """`text` with what lies between the `markers` replaced by `table`.

  Raises:
    ValueError: the text lacks the markers (or has them out of order).
  """
  start, end = markers
  i, j = text.find(start), text.find(end)
  if i < 0 or j < i:
    raise ValueError(f"the file needs the markers {start} ... {end} (in that order)")
  return text[: i + len(start)] + "\n" + table + "\n" + text[j:]


def targets(results: pathlib.Path, findings_page: pathlib.Path):
  """`[(file, its text now, its text generated from the results)]`: docs/findings.md with its
  short table and the list of pages, and each experiment's page beside it (`docs/findings/`;
  a page no experiment has any more is generated as "" and removed)."""
  docs = load(results)
  text = findings_page.read_text()
  new = update(text, render_summary(docs), (SUMMARY_START, SUMMARY_END))
  new = update(new, render(docs), (START, END))
  folder = findings_page.parent / PAGES
  pages = {
    folder / f"{n}.md": render_page(n, docs) for n in dict.fromkeys(d["experiment"] for d in docs)
  }
  pages.update({p: "" for p in folder.glob("*.md") if p not in pages})
  now = lambda p: p.read_text() if p.exists() else None
  return [(findings_page, text, new), *((p, now(p), t) for p, t in sorted(pages.items()))]


def main(argv=None) -> int:
  p = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument(
    "--results",
    default=str(REPO / "experiments" / "results"),
    metavar="DIR",
    help="directory of the experiments' JSON files (default: experiments/results)",
  )
  p.add_argument(
    "--findings",
    default=str(REPO / "docs" / "findings.md"),
    metavar="FILE",
    help="the Findings page, with the experiments' pages in findings/ beside it (default: docs/findings.md)",
  )
  p.add_argument(
    "--check", action="store_true", help="do not write; exit 1 if a table differs from the results"
  )
  p.add_argument(
    "--refresh",
    nargs="+",
    default=(),
    metavar="NAME",
    help="first recompute these experiments' rows from their committed numbers "
    "(their modules' findings(results, settings)); no rerun",
  )
  args = p.parse_args(argv)
  for name in args.refresh:
    path = pathlib.Path(args.results) / f"{name}.json"
    if not path.exists():
      p.error(f"--refresh {name}: no {path}")
    if refresh(path):
      print(f"refreshed the findings of {path}")
  stale = 0
  for path, text, new in targets(pathlib.Path(args.results), pathlib.Path(args.findings)):
    if new == text:
      continue
    if args.check:
      print(f"{path}: the Findings are stale; run python -m experiments.findings", file=sys.stderr)
      stale = 1
    elif not new:
      path.unlink()
      print(f"removed {path}: no experiment's results name it")
    else:
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_text(new)
      print(f"updated the Findings in {path}")
  return stale


if __name__ == "__main__":
  sys.exit(main())
