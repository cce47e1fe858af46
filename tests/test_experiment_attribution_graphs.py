"""Checks of `experiments/attribution_graphs.py`: its verdict rule, and its smoke run's graphs
and intervention pairs (`check_smoke`, run by `test_experiments.py` on that run)."""

import json
import pathlib

import numpy as np
import pytest

from experiments import attribution_graphs as A


def test_verdict_rule():
  share = lambda p, r: A.SIGNS.verdict(A.sign_share(np.asarray(p), np.asarray(r)))
  assert share([1, -1, 2], [0.5, -2, 1]) == "yes"
  assert share([1, -1, 2], [-0.5, 2, 1]) == "no"


def test_bad_transcoder_folder_is_named(tmp_path):
  with pytest.raises(A.study.UsageError, match="no saved transcoder there"):
    A.parse_args(["--transcoders", str(tmp_path)])


def check_smoke(doc: dict, out: pathlib.Path) -> None:
  """Every worked example has its graph (kept nodes, edges between them, the target last),
  its scores in [0, 1], and one (predicted, real) pair per feature and factor."""
  r, s = doc["results"], doc["settings"]
  assert list(r["examples"]) == [e[0] for e in A.EXAMPLES]
  for e in r["examples"].values():
    g = e["graph"]
    assert 0 <= e["replacement"] <= 1 and 0 <= e["completeness"] <= 1
    assert g["scores"] == {"replacement": e["replacement"], "completeness": e["completeness"]}
    assert g["nodes"][-1]["kind"] == "target" and g["nodes"][-1]["value"] == e["value"]
    assert all(0 <= a < len(g["nodes"]) and 0 <= b < len(g["nodes"]) for a, b, _ in g["edges"])
    assert len(e["predicted"]) == len(e["real"]) == len(e["top"]) * len(e["factors"])
    assert len(e["top"]) == min(s["top"], e["features"])
  assert doc["findings"] == A.findings(r, s)
  assert (out / "attribution_graphs_checks.png").is_file()
  # One interactive page per example (`bertjax.report.graph_page`), its features' contexts in.
  assert len(r["pages"]) == len(A.EXAMPLES) and len(set(r["pages"])) == len(r["pages"])
  for page, e in zip(r["pages"], r["examples"].values()):
    text = (out / page).read_text()
    assert page.startswith("attribution_graphs_") and page.endswith(".html")
    assert text.count('class="node ') == len(e["graph"]["nodes"])
    blob = text[text.index('"application/json">') + 19 : text.index("</script>")]
    drawn = json.loads(blob.replace("<\\/", "</"))["nodes"]
    assert all(isinstance(n["contexts"], list) for n in drawn)
    assert all(n["kind"] == "feature" for n in drawn if n["contexts"])
