"""The Findings as pages: the short table, the list of the experiments' pages, and each
experiment's page, from the committed result documents and each experiment's own claims
(`uncertainty`, `CAUSES`, `NOT_RUN`). `experiments.findings` writes them."""

from __future__ import annotations

import hashlib
import importlib
import json

from bertjax import claims

PAGES = "findings"  # each experiment's page, docs/findings/NAME.md


def _cell(text: str) -> str:
  return " ".join(str(text).split()).replace("|", "\\|")


def module(name: str):
  """Experiment NAME's module, `experiments/NAME.py`: its measurement and its claims."""
  return importlib.import_module(f"experiments.{name}")


def _known(name: str, what: str) -> dict:
  """What experiment NAME's module says of its models (`CAUSES`: (row, model tag) -> the
  likely cause of their difference; `NOT_RUN`: model tag -> why it has no run); {} without."""
  try:
    return getattr(module(name), what, {})
  except ModuleNotFoundError:  # results of an experiment no module makes any more
    return {}


_UNCERTAINTIES: dict[str, list[claims.Judgement]] = {}


def uncertainty(doc: dict) -> list[claims.Judgement]:
  """One `claims.Judgement` per row of a result document: the experiment's own
  `experiments/NAME.py` `uncertainty(results, settings)`, applied to the committed numbers.

  Kept per document content for the process: the summary and the pages read the same rows,
  and their bootstrap intervals are most of the time `targets` takes."""
  key = hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()
  if key not in _UNCERTAINTIES:
    try:
      own = getattr(module(doc["experiment"]), "uncertainty", None)
    except ModuleNotFoundError:  # results of an experiment no module makes any more
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
    causes = _known(name, "CAUSES") if stem == name else {}
    cause = causes.get((k, next((t for t in verdicts if t), "")))
    if len(verdicts) < 2 and cause is None:
      not_run = _known(name, "NOT_RUN")
      cause = next((not_run[t] for t in tags if t and t in not_run), None)
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
      f"The claims of `experiments/{name}.py` (its method: [Experiments](../experiments.md)), "
      "as the [Findings](../findings.md) table sums them up. Generated by "
      "`python -m experiments.findings` from the committed results."
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
        why = _known(name, "NOT_RUN").get(t) if t else None
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
