"""Every experiment script's `--smoke` run, and the README's Findings table.

Each script in `experiments/` (other than the shared `common.py` and `findings.py`) is run
as its users run it, in a subprocess with `--smoke`, and must write a well-formed
`NAME.json` (finite numbers, Findings rows of the right shape, `smoke: true`) and valid PNG
figures. Script-specific consistency checks live in `tests/test_experiment_NAME.py`.
"""

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest
from test_report import _check_png, _numbers

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.stem for p in (REPO / "experiments").glob("*.py")
                 if p.stem not in ("common", "findings") and not p.stem.startswith("_"))

sys.path.insert(0, str(REPO / "experiments"))
import findings


def run_smoke(name: str, out: pathlib.Path, data_dir: pathlib.Path, *extra: str) -> dict:
  """Runs `experiments/NAME.py --smoke` and returns its JSON document."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
             MPLBACKEND="Agg")
  cmd = [sys.executable, str(REPO / "experiments" / f"{name}.py"), "--smoke", "--out", str(out),
         "--data-dir", str(data_dir), *extra]
  proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 0, f"{name} --smoke failed:\n{proc.stderr[-4000:]}"
  return json.loads((out / f"{name}.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_smoke_run_writes_valid_results(name, tmp_path, data_dir):
  doc = run_smoke(name, tmp_path, data_dir)
  assert doc["experiment"] == name and doc["smoke"] is True
  assert doc["seconds"] > 0 and doc["settings"]
  assert doc["findings"], "an experiment must state at least one finding"
  for f in doc["findings"]:
    assert set(f) == {"paper", "claim", "measured", "holds"}
    assert f["holds"] in ("yes", "partly", "no", "n/a")
  bad = [(w, v) for w, v in _numbers(doc["results"]) if not math.isfinite(v)]
  assert not bad, bad[:5]
  assert doc["figures"], "an experiment must draw at least one figure"
  for fig in doc["figures"]:
    _check_png(tmp_path / fig)


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_names_the_run_command(name):
  proc = subprocess.run([sys.executable, str(REPO / "experiments" / f"{name}.py"), "--help"],
                        cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
  assert proc.returncode == 0, proc.stderr
  assert "--smoke" in proc.stdout and f"{name}.py" in proc.stdout


def test_readme_findings_table_is_generated_from_committed_results():
  readme = (REPO / "README.md").read_text()
  table = findings.render(findings.load(REPO / "experiments" / "results"))
  assert findings.update(readme, table) == readme, "run experiments/findings.py"


def test_findings_render_and_ignore_smoke_runs(tmp_path):
  row = {"paper": "P 2020", "claim": "a | b", "measured": "0.5", "holds": "partly"}
  (tmp_path / "x.json").write_text(json.dumps({"experiment": "x", "smoke": False, "findings": [row]}))
  (tmp_path / "y.json").write_text(json.dumps({"experiment": "y", "smoke": True, "findings": [row]}))
  table = findings.render(findings.load(tmp_path))
  assert "[`x`](experiments/x.py)" in table and "`y`" not in table
  assert "a \\| b" in table and "◐ partly" in table
  text = f"intro\n{findings.START}\nold\n{findings.END}\nrest\n"
  assert findings.update(text, table) == f"intro\n{findings.START}\n{table}\n{findings.END}\nrest\n"
  with pytest.raises(ValueError, match="markers"):
    findings.update("no markers", table)
