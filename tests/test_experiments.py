"""Every experiment script's `--smoke` run, its output directory, and the Findings table.

Each experiment module in `experiments/` (not the shared `common`, `findings` and
`findings_pages`) is run as a new user runs it, `python -m experiments.NAME` with the checkout
on PYTHONPATH (as `./run.sh experiment NAME` runs it), in a fresh directory, with `--smoke` and no data at
all (`$BERTJAX_DATA_DIR` empty, the `../shared/data` fallback turned off), so it reads only
the samples shipped in `bertjax/resources/smoke/`. It must write a well-formed `NAME.json`
(finite numbers, Findings rows of the right shape, `smoke: true`) and valid PNG figures into
the scratch directory `out/experiments`, and leave the committed `experiments/results/`
untouched. Script-specific consistency checks live in `tests/test_experiment_NAME.py`; its
`check_smoke(doc, out)`, where it has one, is run on this same run (one smoke run each).
"""

import argparse
import hashlib
import importlib
import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pyrunner
import pytest
from test_report import _check_png, _numbers

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = sorted(
  p.stem
  for p in (REPO / "experiments").glob("*.py")
  if p.stem not in ("common", "findings", "findings_pages") and not p.stem.startswith("_")
)

from experiments import findings, findings_pages

READ_NO_DATA = {"attribution", "negation_circuit"}  # built with common.parser(data=False)


def no_data_env(cwd: pathlib.Path) -> dict[str, str]:
  """The environment of a machine without data: an empty data directory, no ../shared."""
  empty = cwd / "no-data"
  empty.mkdir(exist_ok=True)
  return dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    HF_HUB_OFFLINE="1",
    TRANSFORMERS_OFFLINE="1",
    MPLBACKEND="Agg",
    BERTJAX_DATA_DIR=str(empty),
    BERTJAX_NO_SHARED_DATA="1",
  )


def run_smoke(name: str, cwd: pathlib.Path, *extra: str) -> tuple[dict, pathlib.Path]:
  """Runs `python -m experiments.NAME --smoke` in `cwd` with no data; returns its JSON and
  folder."""
  cmd = [sys.executable, "-m", f"experiments.{name}", "--smoke", *extra]
  env = {**no_data_env(cwd), "PYTHONPATH": str(REPO)}
  proc = pyrunner.run(
    cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
  )
  assert proc.returncode == 0, f"{name} --smoke failed:\n{proc.stderr[-4000:]}"
  out = cwd / "out" / "experiments"
  assert f"results go to {out}" in proc.stderr
  # Scripts that read a data set read the shipped samples; the others have no --data-dir.
  assert ("bertjax/resources/smoke" in proc.stderr) == (name not in READ_NO_DATA), proc.stderr
  # One result file per (experiment, model): NAME.json, or NAME_MODEL.json with --model.
  written = sorted(out.glob(f"{name}*.json"))
  assert len(written) == 1, written
  return json.loads(written[0].read_text()), out


def _committed() -> dict[str, str]:
  return {
    p.name: hashlib.sha256(p.read_bytes()).hexdigest()
    for p in sorted((REPO / "experiments" / "results").iterdir())
    if p.is_file()
  }


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_smoke_run_without_data_writes_valid_results(name, tmp_path):
  before = _committed()
  doc, out = run_smoke(name, tmp_path)
  assert _committed() == before, "a --smoke run must not touch experiments/results"
  assert doc["experiment"] == name and doc["smoke"] is True
  assert doc["seconds"] > 0 and doc["settings"]
  assert doc["findings"], "an experiment must state at least one finding"
  for f in doc["findings"]:
    assert set(f) == {"paper", "claim", "measured", "holds", "short", "value"}
    assert len(f["short"].split()) <= 20 and set(f["value"]) == {"name", "value"}
    assert f["holds"] in ("yes", "partly", "no", "n/a")
  bad = [(w, v) for w, v in _numbers(doc["results"]) if not math.isfinite(v)]
  assert not bad, bad[:5]
  assert doc["figures"], "an experiment must draw at least one figure"
  for fig in doc["figures"]:
    _check_png(out / fig)
  # A script's own checks of this run, where `tests/test_experiment_NAME.py` has them.
  if (REPO / "tests" / f"test_experiment_{name}.py").exists():
    check = getattr(importlib.import_module(f"test_experiment_{name}"), "check_smoke", None)
    if check is not None:
      check(doc, out)


HELP_DRIVER = """
import contextlib, io, json, runpy, sys
helps = {}
for name in sys.argv[1:]:
  sys.argv[:] = [f"experiments/{name}.py", "--help"]
  out, code = io.StringIO(), None
  with contextlib.redirect_stdout(out):
    try:
      runpy.run_module(f"experiments.{name}", run_name="__main__", alter_sys=True)
    except SystemExit as e:
      code = e.code
  helps[name] = [code, out.getvalue()]
print(json.dumps(helps))
"""


@pytest.fixture(scope="module")
def helps():
  """Every experiment's `--help`, each run as `__main__` (as `python -m experiments.NAME
  --help` runs it, from the checkout), in one interpreter: 15 interpreters took 24 s."""
  proc = subprocess.run(
    [sys.executable, "-c", HELP_DRIVER, *SCRIPTS],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_names_the_run_command(helps, name):
  code, text = helps[name]
  assert code in (0, None), (name, code)
  assert "--smoke" in text and f"usage: python -m experiments.{name} " in text
  assert "--update-results" in text


def test_output_directory_rules(tmp_path, monkeypatch):
  from bertjax import study
  from experiments import common

  monkeypatch.chdir(tmp_path)
  parse = lambda *a: common.parser(None).parse_args(list(a))
  results = str(common.RESULTS)
  assert parse().out == str(study.SCRATCH)
  assert parse("--out", "mine").out == "mine"
  assert parse("--update-results").out == results
  assert parse("--out", results).out == results  # an explicit --out experiments/results
  assert parse("--smoke").data_dir == str(study.smoke_data_dir())
  assert parse("--smoke", "--data-dir", "d").data_dir == "d"
  assert parse().data_dir is None
  (tmp_path / "afile").write_text("")
  for bad in (
    ["--smoke", "--update-results"],
    ["--smoke", "--out", results],
    ["--update-results", "--out", "elsewhere"],
    ["--out", "afile"],
    ["--out", "afile/below"],
  ):
    with pytest.raises(SystemExit) as e:
      parse(*bad)
    assert e.value.code == 2
  # An experiment that reads no data set has no --data-dir to accept and ignore.
  with pytest.raises(SystemExit):
    common.parser(None, data=False).parse_args(["--data-dir", "d"])
  assert common.parser(None, data=False).parse_args(["--smoke"]).smoke


def test_a_transcoder_read_back_is_not_saved_again(tmp_path):
  from bertjax import study
  from experiments import attribution_graphs

  both = ["--transcoders", str(tmp_path), "--save-transcoders", str(tmp_path)]
  with pytest.raises(study.UsageError, match="not with --transcoders"):
    attribution_graphs.parse_args(both)


def test_a_model_that_cannot_be_loaded_is_a_usage_error(tmp_path):
  from bertjax import study

  with pytest.raises(study.UsageError, match=f"--model {tmp_path / 'none'}: "):
    study.pretrained(tmp_path / "none")
  args = argparse.Namespace(model=str(tmp_path / "none"), smoke=True)
  with pytest.raises(study.UsageError, match=f"--model {tmp_path / 'none'}: "):
    study.finetune_model(args, "classification", 2, smoke={}, seed=0)
  # Without --model: all-MiniLM-L6-v2 with a fresh head, or with --smoke the tiny random BERT.
  args = argparse.Namespace(model=None, smoke=False)
  config, params, _, name = study.finetune_model(
    args, "token_classification", 3, smoke={}, seed=0, label_names=["a", "b", "c"]
  )
  assert name == "all-MiniLM-L6-v2" and config.depth == 6
  assert params["token_classifier"]["dense"]["kernel"].shape == (384, 3)
  args.smoke = True
  config, _, tok, name = study.finetune_model(
    args, "classification", 2, smoke=study.SMOKE_MODEL, seed=0
  )
  assert (config.depth, config.hidden_size, config.vocab_size) == (2, 32, tok.vocab_size)
  assert "smoke" in name


@pytest.mark.slow
def test_smoke_refuses_to_write_committed_results(tmp_path):
  before = _committed()
  proc = pyrunner.run(
    [sys.executable, "-m", "experiments.probing_layers", "--smoke", "--update-results"],
    cwd=tmp_path,
    env={**no_data_env(tmp_path), "PYTHONPATH": str(REPO)},
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert proc.returncode == 2 and "--smoke results are not findings" in proc.stderr
  assert "Traceback" not in proc.stderr and _committed() == before


@pytest.mark.slow
def test_missing_data_is_a_one_line_error(tmp_path):
  proc = pyrunner.run(
    [sys.executable, "-m", "experiments.probing_layers"],
    cwd=tmp_path,
    env={**no_data_env(tmp_path), "PYTHONPATH": str(REPO)},
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert proc.returncode == 1 and "Traceback" not in proc.stderr
  line = proc.stderr.strip().splitlines()[-1]
  assert line.startswith("error: data set ud_english_ewt not found (looked in ")
  assert str(tmp_path / "no-data") in line and "`bertjax data fetch ud_english_ewt`" in line


def test_smoke_samples_parse_with_the_project_readers():
  """The shipped samples have the layout and formats of the real sets."""
  from bertjax.analysis.representations import cloze
  from bertjax.data import conllu, fetch
  from bertjax.data import corpus as C
  from bertjax.training import finetune as ft

  root = fetch.smoke_dir()
  assert sorted(p.name for p in root.iterdir() if p.is_dir()) == sorted(fetch.DATASETS)
  ud = conllu.read_conllu(root / "ud_english_ewt" / "en_smoke-ud-dev.conllu")
  assert len(ud) == 40 and all((s.heads_array() == 0).sum() == 1 for s in ud)
  for split in ("valid", "test"):
    docs = C.read_documents(root / "wikitext2_tokens" / f"{split}.txt", format="wikitext")
    assert len(docs) == 2 and sum(len(d) for d in docs) > 20
  names = [f.path for f in fetch.DATASETS["blimp"].files if f.path.endswith(".jsonl")]
  for name in names:
    texts, _, labels = ft.load_blimp(root / "blimp" / name)
    assert len(texts) == 32 and labels.tolist() == [1, 0] * 16
  columns = {
    "NEG-136/NEG-136-SIMP.tsv": "context_aff context_neg target_aff target_neg",
    "NEG-136/NEG-136-NAT.tsv": "context_aff context_neg target_aff target_neg",
    "ROLE-88/ROLE-88.tsv": "item context expected target",
    "CPRAG-102/CPRAG-102.tsv": "context_s1 context_s2 expected within_category between_category",
  }
  for rel, cols in columns.items():
    rows = cloze.read_tsv(root / "lm_diagnostics" / "datasets" / rel)
    assert rows and all(set(cols.split()) <= set(r) for r in rows), rel
  records = cloze.load_jsonl(root / "lama_squad" / "test.jsonl")
  assert all("[MASK]" in r["masked_sentences"][0] and r["obj_label"] for r in records)
  assert cloze.load_jsonl(root / "lama_squad" / "relations.jsonl")[0]["template"]
  assert (root / "tinyshakespeare" / "input.txt").read_text().count("\n") > 10


def test_findings_tables_are_generated_from_committed_results():
  """docs/findings.md's short table and its list of pages, and each experiment's page
  (docs/findings/NAME.md), are what the results give."""
  got = findings.targets(REPO / "experiments" / "results", REPO / "docs" / "findings.md")
  names = {d["experiment"] for d in findings.load(REPO / "experiments" / "results")}
  assert [p.name for p, _, _ in got] == ["findings.md", *sorted(f"{n}.md" for n in names)]
  for path, text, new in got:
    assert new == text, f"{path} is stale: run python -m experiments.findings"
  text = got[0][1]
  summary = text[text.index(findings.SUMMARY_START) : text.index(findings.SUMMARY_END)]
  assert "| [`sixteen_heads`](findings/sixteen_heads.md) | Michel et al. 2019 |" in summary
  full = text[text.index(findings.START) : text.index(findings.END)]
  assert "- [`sixteen_heads`](findings/sixteen_heads.md) (Michel et al. 2019): 5 claims" in full
  for line in summary.splitlines()[3:]:  # every claim in at most 20 words
    assert len(line.split(" | ")[2].split()) <= 20, line
  assert "(CI: see the page)" not in summary  # every sampled value's interval is in its cell


def test_findings_render_and_ignore_smoke_runs(tmp_path):
  row = {"paper": "P 2020", "claim": "a | b", "measured": "0.5", "holds": "partly"}
  (tmp_path / "x.json").write_text(
    json.dumps({"experiment": "x", "smoke": False, "findings": [row], "settings": {"k": 1}})
  )
  (tmp_path / "y.json").write_text(
    json.dumps({"experiment": "y", "smoke": True, "findings": [row], "settings": {}})
  )
  docs = findings.load(tmp_path)
  listed = findings_pages.render(docs)
  assert listed == "- [`x`](findings/x.md) (P 2020): 1 claims"
  text = f"intro\n{findings.START}\nold\n{findings.END}\nrest\n"
  assert (
    findings.update(text, listed) == f"intro\n{findings.START}\n{listed}\n{findings.END}\nrest\n"
  )
  with pytest.raises(ValueError, match="markers"):
    findings.update("no markers", listed)
  summary = findings_pages.render_summary(docs)
  assert summary.splitlines()[2] == (
    "| [`x`](findings/x.md) | P 2020 | a \\| b |  | — (no CI yet) ◐ partly | — | "
    "only one model measured |"
  )
  page = findings_pages.render_page("x", docs)
  assert page.startswith("# `x`: P 2020\n") and "## 1. a | b" in page and "◐ partly" in page
  assert "| `k` | 1 |" in page  # the run's settings


def test_findings_state_each_verdict_s_uncertainty():
  """Issue #36: every Findings row says how sure its verdict is: a bootstrap interval over the
  items the JSON keeps, the test the rule applies, "exact", or "CI: rerun needed" where the
  JSON lacks the per-item values; a verdict whose interval straddles its rule's threshold is
  "inconclusive"."""
  docs = findings.load(REPO / "experiments" / "results")
  pages = {n: findings_pages.render_page(n, docs) for n in {d["experiment"] for d in docs}}
  sure = [line for page in pages.values() for line in page.splitlines() if "how sure:" in line]
  assert len(sure) == sum(len(d["findings"]) for d in docs)
  prefixes = ("95% CI", "CI: rerun needed", "exact", "test the rule applies", "n/a: ")
  assert all(line.removeprefix("- how sure: ").startswith(prefixes) for line in sure), sure
  # Every committed row of every model is on its experiment's page, under its model.
  for doc in docs:
    for f in doc["findings"]:
      assert f"- measured: {f['measured']}" in pages[doc["experiment"]], doc["stem"]
  assert (
    "95% CI over the 72 heads: attribution vs exact patching Pearson [0.99, 1.00]"
    in (pages["attribution"])
  )
  # The same patching row with a weaker agreement (Pearson ~0.8 over 72 heads): its interval
  # straddles the rule's 0.8, so the verdict is inconclusive, whatever the point value says.
  doc = json.loads((REPO / "experiments" / "results" / "attribution.json").read_text())
  rng = np.random.default_rng(0)
  exact = rng.normal(size=(6, 12))
  doc["results"]["patching"]["exact"] = exact.tolist()
  doc["results"]["patching"]["attribution"] = (exact + 0.75 * rng.normal(size=(6, 12))).tolist()
  u = findings_pages.uncertainty(doc)[1]
  assert u.span == ("partly", "yes"), u
  assert findings_pages._holds("yes", u) == "❔ inconclusive (partly to yes within the CI)"
  doc = {**doc, "stem": "attribution", "model_tag": ""}
  row = findings_pages.render_summary([doc]).splitlines()[3]
  assert row.split(" | ")[4].endswith("❔ inconclusive (partly to yes within the CI)"), row


@pytest.mark.parametrize(
  "stem", [p.stem for p in sorted((REPO / "experiments" / "results").glob("*.json"))]
)
def test_committed_rows_follow_the_current_rules(stem):
  """Every script makes its rows from the JSON (`findings(results, settings)`), and the
  committed rows (of every model's run: `NAME.json`, `NAME_all-mpnet-base-v2.json`,
  `stacking_gpu.json`) are what its current rules and wording give on the committed numbers."""
  doc = json.loads((REPO / "experiments" / "results" / f"{stem}.json").read_text())
  make_rows = getattr(findings.module(doc["experiment"]), "findings", None)
  assert make_rows is not None, f"experiments/{doc['experiment']}.py has no findings(r, s)"
  assert make_rows(doc["results"], doc["settings"]) == doc["findings"], (
    f"run python -m experiments.findings --refresh {stem}"
  )


def test_refresh_rewrites_rows_from_the_numbers(tmp_path):
  committed = REPO / "experiments" / "results" / "sixteen_heads.json"
  doc = json.loads(committed.read_text())
  doc["findings"][0]["holds"] = "no"  # a stale verdict
  doc["results"]["ablation"]["heads_removable_alone"] = 30  # 42% of 72: below both thresholds
  path = tmp_path / "sixteen_heads.json"
  path.write_text(json.dumps(doc))
  assert findings.refresh(path)
  new = json.loads(path.read_text())
  assert (
    new["findings"][0]["holds"] == "no" and "30 of 72 heads (42%)" in new["findings"][0]["measured"]
  )
  assert new["results"] == doc["results"] and new["findings_refreshed"]
  doc["results"]["ablation"]["heads_removable_alone"] = 60  # 83%: yes
  path.write_text(json.dumps(doc))
  assert findings.refresh(path) and json.loads(path.read_text())["findings"][0]["holds"] == "yes"
  assert not findings.refresh(path)  # already current


def test_sizes_are_data_with_none_where_a_scale_leaves_one_out():
  """`experiments/sizes.toml`: one table per (experiment, scale), for scripts that exist; a size
  one scale gives and another leaves out is None in the latter (TOML has no null)."""
  import tomllib

  from experiments import common

  tables = tomllib.loads((REPO / "experiments" / "sizes.toml").read_text())
  assert set(tables) <= set(SCRIPTS)
  for name, scales in tables.items():
    sizes = common.sizes(name)
    assert set(sizes) == set(scales) and {"full", "smoke"} <= set(scales), name
    # A `like = "other"` table is that table with its own sizes over it.
    scales = {s: {**scales[t["like"]], **t} if "like" in t else t for s, t in scales.items()}
    keys = {k for table in scales.values() for k in table} - {"like"}
    for scale, table in scales.items():
      assert sizes[scale] == {k: table.get(k) for k in keys}, (name, scale)
  stacking = common.sizes("stacking")
  assert stacking["full"]["max_lines"] is None and stacking["smoke"]["max_lines"] == 400
  with pytest.raises(KeyError):
    common.sizes("no_such_experiment")


def test_an_experiment_is_one_module_of_at_most_300_lines():
  """Issue #59: each experiment is one module, its measurement (`main`) and its claims
  (`findings`, `uncertainty`); no file in experiments/ passes 300 lines; no module imports
  another experiment or touches sys.path; each runs as `python -m experiments.NAME`."""
  import ast

  long = {
    p.name: n
    for p in (REPO / "experiments").glob("*.py")
    if (n := len(p.read_text().splitlines())) > 300
  }
  assert not long, f"over 300 lines: {long}"
  assert not (REPO / "experiments" / "rules").exists()
  for name in SCRIPTS:
    tree = ast.parse((REPO / "experiments" / f"{name}.py").read_text())
    top = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert {"main", "findings", "uncertainty"} <= top, name
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | {
      f"{n.module}.{a.name}"
      for n in ast.walk(tree)
      if isinstance(n, ast.ImportFrom) and n.module
      for a in n.names
    }
    others = {f"experiments.{s}" for s in SCRIPTS} - {f"experiments.{name}"}
    assert not imported & others, f"{name}.py imports another experiment"
    assert "sys.path" not in ast.unparse(tree), f"{name}.py touches sys.path"
