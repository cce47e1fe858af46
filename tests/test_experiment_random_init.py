"""Checks of `experiments/random_init.py` (Kovaleva et al. 2019's random-initialisation test).

The verdict rule on synthetic numbers, and `check_smoke` (run by `test_experiments.py` on its
smoke run without data) for the JSON's structure and for verdicts that follow its own numbers. The library pieces it runs
(splits, baselines, accuracy, early stopping) are checked in `test_early_stopping.py`.
"""

import pathlib

import numpy as np
import pytest

from bertjax.tasks import init_control

REPO = pathlib.Path(__file__).resolve().parents[1]
from experiments import random_init as ri
from experiments import random_init as rules


def test_verdict_rule_on_synthetic_numbers():
  def verdict(random, pretrained, majority, rule=rules.LEXICAL):
    r = init_control.gain_ratio(random, pretrained, majority)
    return rule.verdict({rules.R: r}), r

  assert verdict(0.92, 0.98, 0.66) == ("yes", pytest.approx(0.8125))
  assert verdict(0.88, 0.98, 0.66)[0] == "partly"  # r = 0.69
  assert verdict(0.80, 0.98, 0.66)[0] == "partly"  # r = 0.44
  assert verdict(0.78, 0.98, 0.66)[0] == "no"  # r = 0.375
  assert verdict(0.50, 0.92, 0.50) == ("no", 0.0)
  assert verdict(0.60, 0.50, 0.50) == ("n/a", None)
  # The control row (BLiMP) holds where r is low.
  assert [verdict(x, 0.98, 0.66, rules.CONTROL)[0] for x in (0.70, 0.85, 0.95)] == [
    "yes",
    "partly",
    "no",
  ]

  def run(pre, rnd):
    curve = lambda s: {"test": s, "converged": True, "steps": 100}
    return {"pretrained": curve(pre), "random": curve(rnd)}

  runs = [run(0.98, 0.95), run(0.96, 0.90), run(0.97, 0.91)]
  s = ri.summarise(runs, [{"majority": 0.7, "lexical": 0.9}] * 3)
  assert s["pretrained"] == pytest.approx(0.97) and s["random"] == pytest.approx(0.92)
  assert s["gap"] == pytest.approx(0.05) and s["gap_sd"] == pytest.approx(
    np.std([0.03, 0.06, 0.06], ddof=1)
  )
  assert (s["gap_min"], s["gap_max"]) == (pytest.approx(0.03), pytest.approx(0.06))
  assert s["gain_ratio"] == pytest.approx(0.22 / 0.27) and s["holds"] == "yes"
  assert s["converged"] == {"pretrained": 3, "random": 3}
  low = ri.summarise([run(0.97, 0.75)], [{"majority": 0.7, "lexical": 0.9}])
  assert low["holds"] == "no" and low["random_sd"] == 0.0 and "random_se" not in low
  # The test-sampling standard error of the seeds' mean: binomial per seed, independent seeds.
  splits = [{"test_items": n} for n in (100, 400, 50)]
  se = ri.summarise(runs, [{"majority": 0.7, "lexical": 0.9}] * 3, splits)
  p = np.array([0.95, 0.90, 0.91])
  assert se["random_se"] == pytest.approx(np.sqrt(np.sum(p * (1 - p) / [100, 400, 50])) / 3)
  one = ri.summarise([run(0.97, 0.75)], [{"majority": 0.7, "lexical": 0.9}], splits[:1])
  assert one["pretrained_se"] == pytest.approx(np.sqrt(0.97 * 0.03 / 100))
  row = rules.findings(
    {
      "tasks": {
        "upos": {
          "what": "UPOS",
          "kind": "token_classification",
          "summary": one,
          "runs": [run(0.97, 0.75)],
          "splits": splits[:1],
        }
      }
    },
    {"max_steps": 600, "batch_size": 16},
  )[0]["measured"]
  assert "random init 75.0 vs pre-trained 97.0 (1 seed; gap 22.0)" in row
  assert "test-sampling SE 4.3 and 1.7 (binomial, 100 test tokens)" in row


def test_a_12_layer_model_runs_at_its_own_size():
  """MPNet (12 layers) takes [random_init.base]: full's sizes with fewer seeds on the tasks
  whose seeds agreed, so its run fits the hour; MiniLM (6) keeps full's."""
  assert [ri.scale_of(False, n) for n in (6, 12, 24)] == ["full", "base", "base"]
  assert ri.scale_of(True, 12) == "smoke"
  base, full = ri.SIZES["base"], ri.SIZES["full"]
  assert {k: v for k, v in base.items() if k != "task_seeds"} == {
    k: v for k, v in full.items() if k != "task_seeds"
  }
  assert base["task_seeds"] == {"question": 1, "upos": 1} and full["task_seeds"] is None


def check_smoke(doc: dict, out: pathlib.Path) -> None:
  """The smoke run's JSON and verdicts follow its own numbers (run by `test_experiments.py`)."""
  assert doc["smoke"] is True and doc["experiment"] == "random_init"
  assert doc["settings"]["rule"] == ri.RULE
  tasks = doc["results"]["tasks"]
  assert list(tasks) == list(ri.TASKS) and len(doc["findings"]) == len(ri.TASKS)
  for (name, res), f in zip(tasks.items(), doc["findings"]):
    s = res["summary"]
    assert len(res["runs"]) == doc["settings"]["seeds"] == len(res["splits"])
    for run in res["runs"]:
      for init in ("pretrained", "random"):
        r = run[init]
        assert r["steps"] <= doc["settings"]["max_steps"] and 0 <= r["test"] <= 1
        assert r["dev"] == max(p["dev"] for p in r["curve"])
    assert s["pretrained"] == pytest.approx(np.mean([r["pretrained"]["test"] for r in res["runs"]]))
    ratio = init_control.gain_ratio(s["random"], s["pretrained"], s["majority"])
    rule = rules.CONTROL if name in rules.CONTROL_TASKS else rules.LEXICAL
    assert s["holds"] == rules.LEXICAL.verdict({rules.R: ratio}) and s["gain_ratio"] == ratio
    assert f["holds"] == rule.verdict({rules.R: ratio})
    assert f["measured"].startswith(f"{name}: ") and f["paper"] == rules.PAPER
  for fig in doc["figures"]:
    assert (out / fig).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_control_tasks_load_the_sentences_and_name_missing_data():
  """The two sentence tasks from the shipped sentences, each sentence its own group; a task
  without its data, or unknown, is refused by name."""
  import bertjax

  tok = bertjax.Tokenizer.from_pretrained(bertjax.minilm_path())
  size = {"max_len": 32, "sentence_dev": 4, "sentence_test": 6, "sentence_limit": 40}
  tasks = init_control.control_tasks(tok, size, wanted=("negation", "question"))
  assert list(tasks) == ["negation", "question"]
  for t in tasks.values():
    n = len(t["data"]["labels"])
    assert 0 < n <= 40 and t["data"]["input_ids"].shape[0] == n
    assert t["data"]["input_ids"].shape[1] <= 32  # padded to the longest, at most max_len
    assert (t["groups"] == np.arange(n)).all() and (t["strata"] == t["data"]["labels"]).all()
    assert t["counts"] == (4, 6, None) and t["num_labels"] == 2
  with pytest.raises(ValueError, match=r"\['upos'\] need their data"):
    init_control.control_tasks(tok, size, wanted=("upos",))
  with pytest.raises(ValueError, match="'parsing'"):
    init_control.control_tasks(tok, size, wanted=("parsing",))
