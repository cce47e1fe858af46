"""The Findings: the rules every experiment's verdicts follow, and the tables generated from
the committed experiment results.

A rule is data (`bertjax.claims.Claim`, the engine the report's readings use too): the
paper's claim and the tests its verdict reads, each a measured quantity against a threshold
(`Test`). Each experiment's claims live in `rules/NAME.py`, apart from the script that
measures the quantities they name, and `Claim.row` applies the rule and states it in the row;
the module's `uncertainty` applies the same rules to resampled quantities.

Reads every full (non-smoke) `experiments/results/*.json` written by the experiment
scripts and renders their `findings` rows: between docs/findings.md's
`<!-- findings-summary:start -->` and `<!-- findings-summary:end -->` markers, the table read
in a minute (per claim, in at most 20 words: each model's headline value, its 95% interval
and the verdict, and whether the models agree); between `<!-- findings:start -->` and
`<!-- findings:end -->`, the list of the experiments' pages; and each page,
`docs/findings/NAME.md` (every claim in full, what was measured on each model, the rule, how
sure, the likely cause where the models differ, each run's settings). The uncertainty of
each verdict (`uncertainty`) is computed from the committed numbers by the experiment's own
`rules/NAME.py` `uncertainty(results, settings)` (`bertjax.claims` judgements): a bootstrap
interval where the JSON keeps per-item values (the verdict "inconclusive" where it differs
across the interval), else what the row has instead ("CI: rerun needed" where the experiment
must be rerun to keep those values, or without such a function).

Every experiment's rules module `rules/NAME.py` defines `findings(results, settings)` (rows
from the numbers as written to JSON; a run passes it to `common.write_results`, which calls
it on what it writes),
so committed rows can be recomputed without a rerun, after a change to
a rule or a row's wording: `--refresh NAME` rewrites `NAME.json`'s `findings` (and its
`settings["indexing"]` when the module defines `INDEXING`), recording when under
`findings_refreshed`; the measured numbers are untouched.

Run:
  .venv/bin/python experiments/findings.py            # rewrite the table and the pages
  .venv/bin/python experiments/findings.py --check    # exit 1 if one is stale
  .venv/bin/python experiments/findings.py --refresh sixteen_heads   # rows from the JSON
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib
import json
import pathlib
import sys

from bertjax import claims

REPO = pathlib.Path(__file__).resolve().parents[1]
START, END = "<!-- findings:start -->", "<!-- findings:end -->"  # docs/findings.md
PAGES = "findings"  # each experiment's page, docs/findings/NAME.md
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
)


def _cell(text: str) -> str:
  return " ".join(str(text).split()).replace("|", "\\|")


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

_UNCERTAINTIES: dict[str, list[claims.Judgement]] = {}


def uncertainty(doc: dict) -> list[claims.Judgement]:
  """One `claims.Judgement` per row of a result document: the experiment's own
  `rules/NAME.py` `uncertainty(results, settings)`, applied to the committed numbers.

  Kept per document content for the process: the summary and the pages read the same rows,
  and their bootstrap intervals are most of the time `targets` takes."""
  key = hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()
  if key not in _UNCERTAINTIES:
    try:
      own = getattr(module(doc["experiment"]), "uncertainty", None)
    except ModuleNotFoundError:  # results of an experiment without a rules module
      own = None
    rows = own(doc["results"], doc["settings"]) if own is not None else []
    if len(rows) != len(doc["findings"]):  # a new experiment, or rows added since
      what = "per-item values this table knows how to resample"
      rows = [claims.rerun_needed(what)] * len(doc["findings"])
    _UNCERTAINTIES[key] = rows
  return list(_UNCERTAINTIES[key])


def _holds(holds: str, u: claims.Judgement) -> str:
  return claims.mark(holds, u.span)


# Models ------------------------------------------------------------------------------------
#
# Each claim row has one column group per analysed model: the default run (all-MiniLM-L6-v2,
# or the script's own small models where it pre-trains them) and every `--model` run committed
# as `NAME_TAG.json` (`common.results_stem`). The last column compares the verdicts.

DEFAULT_COLUMN = "all-MiniLM-L6-v2 (default run)"
MODELS = ("all-mpnet-base-v2",)  # the other models' columns, in this order (model tags)
SHORT = {"": "MiniLM", "all-mpnet-base-v2": "MPNet"}

# Why an experiment has no run on a model, with the measurement that says so.
NOT_RUN: dict[tuple[str, str], str] = {
  ("stacking", "all-mpnet-base-v2"): (
    "not run on MPNet: it pre-trains its own BERTs from scratch (progressive stacking), "
    "which no checkpoint's weights enter; at MPNet's size (12 x 768) one forward of 32 x "
    "128 tokens takes ~4 s on this CPU class (BERT-base, Measured results), so each "
    "1,000-step run would take > 3 h and the experiment trains three"
  ),
  ("albert_sharing", "all-mpnet-base-v2"): (
    "not run on MPNet: it pre-trains its own small BERT and ALBERT models from scratch, "
    "which no checkpoint's weights enter (ALBERT's sharing has no MPNet counterpart: "
    "BertConfig refuses num_hidden_groups for model_type mpnet)"
  ),
}

# The likely cause of a difference between the models' verdicts (or of the same verdict for
# different reasons), where the committed numbers show it: (results stem of the default run,
# row index, model tag) -> the sentence. A test requires one for every row whose verdicts
# differ.
CAUSES: dict[tuple[str, int, str], str] = {
  ("anisotropy", 1, "all-mpnet-base-v2"): (
    "the same shape, a different start: both rise up to their second-to-last layer (MiniLM "
    "4 of 4 steps to 0.21, MPNet 10 of 10 to 0.18) and fall at the last, contrastively "
    "trained one (0.03, 0.04); MPNet's layer 1 starts low (0.035, MiniLM's 0.116), so its "
    "last layer ends 0.002 above its first and the rule says yes"
  ),
  ("what_bert_looks_at", 0, "all-mpnet-base-v2"): (
    "depth or distillation: MiniLM's 6 layers put their middle-third mass on [CLS] (0.56; "
    "[SEP] 0.03 in every layer), while MPNet's [SEP] mass rises to 0.29-0.36 in layers 6-11 "
    "as Clark found in BERT-base's layers 6-10; [CLS] dominates MPNet's layers 3-4 (0.62-0.64) "
    "too, so the sink moves from [CLS] to [SEP] with depth"
  ),
  ("what_bert_looks_at", 1, "all-mpnet-base-v2"): (
    "a small margin in both: MPNet's first half exceeds its second by 0.05 nats (1.30 vs "
    "1.25) where MiniLM's falls short by 0.09 (1.39 vs 1.48), while both have layer 1 "
    "highest; MPNet's last layer (1.60) is almost as broad as its first"
  ),
  ("negation_circuit", 1, "all-mpnet-base-v2"): (
    "a wider interval, not another kind of result: MPNet's smallest faithful circuit is 3.0% "
    "of its 32,491 edges (MiniLM's 1.0% of 7,588), and over its 32 pairs (MiniLM 48) the 95% "
    "interval runs to 6.1%, past the 5% line"
  ),
  ("sixteen_heads", 2, "all-mpnet-base-v2"): (
    "the interval, not the point: both points say yes (MiniLM 89% of heads masked within the "
    "2-point tolerance, MPNet 58%), but MPNet's accuracy sits near the tolerance along its "
    "curve, so over the 115 test sentences its share runs from 10% to 78%"
  ),
  ("what_bert_looks_at", 2, "all-mpnet-base-v2"): (
    "a margin at the 2/3 line in both: MiniLM's heads beat the offset in 19 of 24 relations "
    "(0.79, interval 0.63-0.83) and MPNet's in 18 of 24 (0.75, 0.67-0.83); only MiniLM's lower end "
    "falls under the line"
  ),
  ("negation_circuit", 0, "all-mpnet-base-v2"): (
    "EAP leaves no room: on MPNet's 2,000 sampled edges (6% of its 32,491, most with tiny "
    "effects where one gradient is exact) EAP already reaches Pearson 0.99, and EAP-IG's 5 "
    "points give 0.84; on MiniLM, every edge patched, both are near 0.93-0.94. Both pass "
    "the 0.8 bar; only 'better than EAP' fails on MPNet"
  ),
  ("random_init", 2, "all-mpnet-base-v2"): (
    "a margin, not a difference of kind: r = 0.74 on MPNet (1 seed at its committed size; "
    "an earlier 2-seed run also gave 0.74, seed sd 0.5 points) against 0.77 on MiniLM, "
    "either side of the 0.75 line and 1.1 test-sampling standard errors under it (r's SE "
    "0.010); the random models reach 75.3% and 76.5%, the pre-trained ones 95.8% and "
    "94.3%, so the larger pre-trained model widens the gap from 17.8 to 20.6 points"
  ),
  ("probing_layers", 0, "all-mpnet-base-v2"): (
    "one probe: MPNet's four other measures peak in its middle (L4-L6 of 12), but root "
    "accuracy from the depth probe peaks at L1 (0.550, with 0.48-0.52 through L2-L7); "
    "that probe is weak and flat in both models (MiniLM at most 0.53)"
  ),
}


def _groups(docs: list[dict]) -> list[tuple[dict | None, dict[str, dict]]]:
  """The docs paired by experiment run: (the default model's doc or None, tag -> doc)."""
  order, groups = [], {}
  for doc in docs:
    tag = doc.get("model_tag", "")
    stem = doc.get("stem", doc["experiment"])
    key = stem.removesuffix(f"_{tag}") if tag else stem
    if key not in groups:
      order.append(key)
      groups[key] = (None, {})
    if tag:
      groups[key][1][tag] = doc
    else:
      groups[key] = (doc, groups[key][1])
  return [groups[k] for k in order]


def _matched(default: dict | None, others: dict[str, dict]) -> list[dict[str, int]]:
  """Rows across models: per claim row, tag -> that doc's row index ("" the default's). Rows
  match on the claim's text and its occurrence (a claim tested per task repeats)."""
  rows, seen = [], {}
  docs = {"": default, **others} if default is not None else dict(others)
  for tag, doc in docs.items():
    counts: dict[str, int] = {}
    for i, f in enumerate(doc["findings"]):
      k = (f["claim"], counts.get(f["claim"], 0))
      counts[f["claim"]] = k[1] + 1
      if k not in seen:
        seen[k] = len(rows)
        rows.append({})
      rows[seen[k]][tag] = i
  return rows


def _verdict(holds: str, u: claims.Judgement) -> str:
  """The verdict as the table states it: inconclusive where its interval straddles."""
  return holds if u.conclusive else "inconclusive"


def _compare(verdicts: dict[str, str], cause: str | None) -> str:
  """The last column: whether the models' verdicts agree, and the likely cause."""
  if len(verdicts) < 2:
    return cause or "—"
  names = " / ".join(f"{SHORT.get(t, t)} {v}" for t, v in verdicts.items())
  same = len(set(verdicts.values())) == 1
  head = f"agree ({names})" if same else f"**differ** ({names})"
  return f"{head}: {cause}" if cause else head


def _tags(docs: list[dict]) -> list[str]:
  """The model tags of the table's columns: the default run's first, then `MODELS`, then any
  other model's."""
  return [""] + list(MODELS) + sorted({d.get("model_tag", "") for d in docs} - {"", *MODELS})


def _rows(docs: list[dict], tags: list[str]):
  """Per claim row: `(experiment, stem, row index, the first model's finding, {tag: (finding,
  uncertainty)})`, the models that did not measure it absent."""
  for default, others in _groups(docs):
    first = default if default is not None else next(iter(others.values()))
    docs_ = {"": default, **others}
    us = {t: uncertainty(d) for t, d in docs_.items() if d is not None}
    for k, row in enumerate(_matched(default, others)):
      f0 = docs_[next(iter(row))]["findings"][row[next(iter(row))]]
      got = {t: (docs_[t]["findings"][row[t]], us[t][row[t]]) for t in tags if t in row}
      yield first["experiment"], first.get("stem", first["experiment"]), k, f0, got


def _number(x) -> str:
  return "—" if x is None else f"{x:.3g}"


def _value_cell(f: dict, u: claims.Judgement) -> str:
  """A model's cell of the short table: the row's headline statistic with its 95% interval
  (or what stands for one: exact, the rule's own test, no interval yet) and the verdict."""
  value = f.get("value") or {}
  name, x = value.get("name"), value.get("value")
  if f["holds"] == "n/a":
    return claims.MARK["n/a"]
  if name in u.intervals:
    lo, hi = u.intervals[name]
    how = f"[{_number(lo)}, {_number(hi)}]"
  else:
    how = next(
      (
        word
        for start, word in (
          ("exact", "(exact)"),
          ("test the rule applies", "(the rule's test)"),
          ("CI: rerun needed", "(no CI yet)"),
        )
        if u.text.startswith(start)
      ),
      "(CI: see the page)",
    )
  return f"{_number(x)} {how} {_holds(f['holds'], u)}"


def _claim_rows(docs: list[dict], tags: list[str]):
  """Per claim row: `(experiment, stem, row index, the first model's finding, {tag: (finding,
  uncertainty)}, verdicts to compare, the models' comparison)`."""
  for name, stem, k, f0, got in _rows(docs, tags):
    verdicts = {
      t: _verdict(f["holds"], u) for t, (f, u) in got.items() if f["holds"] != "n/a"
    }  # a claim a model cannot test is not a verdict to compare
    cause = CAUSES.get((stem, k, next((t for t in verdicts if t), "")))
    if len(verdicts) < 2 and cause is None:
      cause = next((NOT_RUN[(name, t)] for t in tags if t and (name, t) in NOT_RUN), None)
      cause = "only one model measured" + (f" ({cause.split(':')[0]})" if cause else "")
    yield name, stem, k, f0, got, _compare(verdicts, cause)


def render_summary(docs: list[dict], link_prefix: str = "") -> str:
  """The table read in a minute: per claim, the experiment (linked to its page), the paper,
  the claim in at most 20 words, each model's headline value with its 95% interval and
  verdict, and whether the models agree (the cause where they differ is on the page)."""
  tags = _tags(docs)
  heads = [DEFAULT_COLUMN.split(" (")[0] if t == "" else t for t in tags]
  lines = [
    f"| experiment | paper | claim | value | {' | '.join(heads)} | the models |",
    "|---|---|---|---|" + "---|" * len(tags) + "---|",
  ]
  for name, _, _, f0, got, compared in _claim_rows(docs, tags):
    cells = [_value_cell(*got[t]) if t in got else "—" for t in tags]
    agree = compared.split(" (")[0].replace("**", "") if "(" in compared else compared
    value = (f0.get("value") or {}).get("name", "")
    lines.append(
      f"| [`{name}`]({link_prefix}{PAGES}/{name}.md) | {_cell(f0['paper'])} | "
      f"{_cell(f0.get('short', f0['claim']))} | {_cell(value)} | {' | '.join(cells)} | "
      f"{_cell(agree)} |"
    )
  return "\n".join(lines)


def render(docs: list[dict]) -> str:
  """The list of the experiments' pages (`render_page`), each with its papers and claims."""
  names = list(dict.fromkeys(d["experiment"] for d in docs))
  if not names:
    return "No experiment results committed yet."
  lines = []
  for n in names:
    rows = [
      f for d in docs if d["experiment"] == n and not d.get("model_tag") for f in d["findings"]
    ]
    rows = rows or [f for d in docs if d["experiment"] == n for f in d["findings"]]
    papers = ", ".join(dict.fromkeys(f["paper"] for f in rows))
    lines.append(f"- [`{n}`]({PAGES}/{n}.md) ({papers}): {len(rows)} claims")
  return "\n".join(lines)


def _settings(doc: dict) -> list[str]:
  """A model's run as the page states it: file, machine, time, command and settings."""
  m = doc.get("machine") or {}
  cpu = m.get("cpu") or "a CPU not recorded by this older run"
  if m.get("cpu_family_model_stepping"):
    family, model, _ = m["cpu_family_model_stepping"]
    isa = "AVX-512" if "avx512f" in m.get("isa_flags", ()) else "AVX2"
    cpu += f" (family {family}, model {model}; {isa})"
  lines = [
    (
      f"`experiments/results/{doc['stem']}.json`, {doc.get('date', '')}: {doc.get('seconds', 0):.0f} s "
      f"on {cpu} ({m.get('cpus', '?')} CPUs, jax {m.get('jax', '?')}); "
      f"`{doc.get('command', '')}`"
    ),
    "",
    "| setting | value |",
    "|---|---|",
  ]
  for key, value in doc["settings"].items():
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    lines.append(f"| `{key}` | {_cell(text)} |")
  return lines


def render_page(name: str, docs: list[dict]) -> str:
  """An experiment's page: each claim in full with each model's measurement, rule, interval
  and verdict, the models' comparison with its likely cause, then each run's settings."""
  mine = [d for d in docs if d["experiment"] == name]
  tags = _tags(mine)
  label = {t: DEFAULT_COLUMN if t == "" else t for t in tags}
  papers = ", ".join(dict.fromkeys(f["paper"] for d in mine for f in d["findings"]))
  out = [
    f"# `{name}`: {papers}",
    "",
    (
      f"The claims of `experiments/{name}.py` (its rules: `experiments/rules/{name}.py`; its "
      "method: [Experiments](../experiments.md)), as the [Findings](../findings.md) table sums "
      "them up. Generated by `experiments/findings.py` from the committed results."
    ),
  ]
  for i, (_, _, _, f0, got, compared) in enumerate(_claim_rows(mine, tags), 1):
    brief = f0.get("short", f0["claim"])
    out += [
      "",
      f"## {i}. {brief}",
      "",
      f"{f0['paper']}" + (f": {f0['claim']}" if brief != f0["claim"] else "."),
    ]
    for t in tags:
      if t not in got:
        why = NOT_RUN.get((name, t)) if t else None
        out += ["", f"**{label[t]}**: {why or 'not measured'}."]
        continue
      f, u = got[t]
      out += [
        "",
        f"**{label[t]}**: {_holds(f['holds'], u)}",
        "",
        f"- measured: {f['measured']}",
        f"- how sure: {u.text}",
      ]
    out += ["", f"The models: {compared}"]
  out += ["", "## The runs"]
  for d in mine:
    out += ["", f"### {label.get(d.get('model_tag', ''), d.get('model_tag'))}", "", *_settings(d)]
  return "\n".join(out) + "\n"


def module(name: str):
  """The rules of experiment NAME, `experiments/rules/NAME.py`, as a module (experiments/ is
  first on the path when this file runs as a script, as for every experiment)."""
  return importlib.import_module(f"rules.{name}")


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
      f"experiments/rules/{doc['experiment']}.py defines no findings(results, "
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
  path.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
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
      print(f"{path}: the Findings are stale; run experiments/findings.py", file=sys.stderr)
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
