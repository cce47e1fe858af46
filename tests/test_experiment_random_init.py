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
    # The per-example correctness the interval resamples gives the summary's numbers.
    for split, run, base in zip(res["splits"], res["runs"], res["baselines"]):
      n = split["test_items"]
      assert sum(split["test_scored"]) == n and len(split["test_groups"]) == split["test"]
      assert base["majority"] == pytest.approx(base["majority_correct"].count("1") / n)
      for init in ("pretrained", "random"):
        marks = run[init]["test_correct"]
        assert len(marks) == n and run[init]["test"] == pytest.approx(marks.count("1") / n)
    pooled = init_control.pooled_scores(init_control.pooled_counts(res))
    for k in ("pretrained", "random", "majority"):
      assert pooled[k] == pytest.approx(s[k])
  judged = ri.uncertainty(doc["results"], doc["settings"])
  assert len(judged) == len(doc["findings"])
  assert all(j.text.startswith(("95% CI over the ", "exact: ")) for j in judged)
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


def _synthetic_task(rng):
  """Two seeds' test splits from one pool of 10 groups, overlapping, with 1-3 scored items a
  row and two rows in some groups (as BLiMP's pairs), and random correctness strings."""
  groups = [np.array([0, 1, 2, 3, 4, 5, 5, 6, 7]), np.array([2, 3, 4, 6, 6, 7, 8, 9])]
  scored = [rng.integers(1, 4, len(g)) for g in groups]
  mark = lambda n, p: "".join("1" if x else "0" for x in rng.random(n) < p)
  splits, runs, base = [], [], []
  for g, n in zip(groups, scored):
    k = int(n.sum())
    splits.append({"test_items": k, "test_groups": g.tolist(), "test_scored": n.tolist()})
    runs.append(
      {"pretrained": {"test_correct": mark(k, 0.9)}, "random": {"test_correct": mark(k, 0.6)}}
    )
    base.append({"majority_correct": mark(k, 0.3)})
  return {"splits": splits, "runs": runs, "baselines": base}


def _r_by_hand(task, drawn):
  """r on the groups `drawn` (with repeats), from the rows' marks one item at a time."""
  acc = {"pretrained": [], "random": [], "majority": []}
  for split, run, b in zip(task["splits"], task["runs"], task["baselines"]):
    ends = np.cumsum([0, *split["test_scored"]])
    marks = {
      "pretrained": run["pretrained"]["test_correct"],
      "random": run["random"]["test_correct"],
    }
    marks["majority"] = b["majority_correct"]
    for init, m in marks.items():
      items = [
        int(c)
        for g in drawn
        for row, gr in enumerate(split["test_groups"])
        if gr == g
        for c in m[ends[row] : ends[row + 1]]
      ]
      acc[init].append(np.mean(items))
  pre, rnd, maj = (np.mean(acc[k]) for k in ("pretrained", "random", "majority"))
  return (rnd - maj) / (pre - maj)


def test_pooled_counts_give_r_and_its_bootstrap_interval():
  """`pooled_counts` pools the seeds' overlapping test splits by group; `pooled_scores` gives
  the seeds' mean accuracies and r as counting the marks by hand does, on all the groups and
  on a resample with repeats; a row's interval is SciPy's percentile bootstrap over the groups
  of r computed by hand."""
  import scipy.stats

  task = _synthetic_task(np.random.default_rng(0))
  counts = init_control.pooled_counts(task)
  assert counts.shape == (10, 4, 2)
  assert (counts[:, 0].sum(0) == [s["test_items"] for s in task["splits"]]).all()
  scores = init_control.pooled_scores(counts)
  for k, init in ((1, "pretrained"), (2, "random")):
    per_seed = [np.mean([int(c) for c in r[init]["test_correct"]]) for r in task["runs"]]
    assert scores[init] == pytest.approx(np.mean(per_seed))
  maj = np.mean([np.mean([int(c) for c in b["majority_correct"]]) for b in task["baselines"]])
  assert scores["majority"] == pytest.approx(maj)
  assert scores["r"] == pytest.approx(_r_by_hand(task, range(10)))
  assert scores["r"] == pytest.approx(
    init_control.gain_ratio(scores["random"], scores["pretrained"], maj)
  )
  drawn = [3, 3, 5, 6, 0, 9, 9, 9, 1, 4]
  assert init_control.pooled_scores(counts[drawn])["r"] == pytest.approx(_r_by_hand(task, drawn))
  # No gain over the majority class: no r.
  flat = counts.copy()
  flat[:, 3] = flat[:, 1]
  assert np.isnan(init_control.pooled_scores(flat)["r"])
  # A seed none of whose test groups was drawn has no accuracy: no r.
  assert np.isnan(init_control.pooled_scores(counts[[0, 1, 0]])["random"])
  # The row's judgement: SciPy's percentile bootstrap of r by hand, on the same draws.
  task["summary"] = {"gain_ratio": float(scores["r"])}
  j = ri._judged("negation", task)
  ref = scipy.stats.bootstrap(
    (np.arange(10),),
    lambda idx: _r_by_hand(task, idx),
    n_resamples=2000,
    method="percentile",
    vectorized=False,
    rng=np.random.default_rng(0),
  ).confidence_interval
  np.testing.assert_allclose(j.intervals[ri.R], (ref.low, ref.high), rtol=1e-9)
  assert j.values[ri.R] == pytest.approx(scores["r"])
  assert j.text.startswith("95% CI over the 10 test sentences of the 2 seeds' splits, pooled")
  with pytest.raises(ValueError, match="correctness marks"):
    task["runs"][0]["random"]["test_correct"] += "1"
    init_control.pooled_counts(task)
  old = {"splits": [{"test_items": 5}], "runs": [], "baselines": [], "summary": task["summary"]}
  assert ri._judged("negation", old).text.startswith("CI: rerun needed")


def test_each_lexical_row_names_its_task():
  shorts = [ri.claim_of(t).brief for t in ri.TASKS]
  assert len(set(shorts)) == len(shorts) and "UPOS tagging" in shorts[2]
  assert ri.claim_of("blimp") is ri.CONTROL and ri.claim_of("upos").yes == ri.LEXICAL.yes


def test_majority_correct_marks_the_items_majority_accuracy_averages():
  from bertjax.tasks import baselines

  train = {"labels": np.array([[-100, 2, 2], [1, 2, -100]])}
  test = {"labels": np.array([[2, -100, 1], [-100, 2, 2]])}
  right = init_control.majority_correct(train, test)
  assert right.tolist() == [True, False, True, True]
  assert right.mean() == baselines.majority_accuracy(train, test)
  assert init_control.bits(right) == "1011"
