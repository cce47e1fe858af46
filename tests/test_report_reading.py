"""The report's generated reading (`bertjax.report.reading`): each section's verdict follows its
numbers. A synthetic `report.json` of a 3-layer, 2-head model agrees with every paper; changing
one number turns that section's verdict, and nothing else's."""

import copy

import numpy as np
import pytest

from bertjax.report import reading as rr
from bertjax.report.reading_representations import upper_bound

MODEL = "org/tiny-model"


def _results() -> dict:
  """A report.json whose every section agrees with its paper under the stated rules."""
  return {
    "model": {"name": MODEL, "layers": 3, "heads": 2},
    "text": {"description": "12 sentences", "num_tokens": 99},
    "clark": {
      "by_layer": {
        "cls": [0.1, 0.1, 0.1],
        "sep": [0.2, 0.6, 0.3],
        "punct": [0.05, 0.05, 0.05],
        "entropy": [2.5, 1.5, 1.2],
      }
    },
    "patterns": {"overall": [0.4, 0.1, 0.1, 0.1, 0.3]},
    "task": {"probe_accuracy_by_layer": [0.95, 0.96, 0.9, 0.85], "majority_accuracy": 0.6},
    "ablation": {
      "baseline_loss": 0.3,
      "baseline_accuracy": 0.85,
      "head_loss": [[0.31, 0.29], [0.3, 0.6], [0.3, 0.305]],
      "layer_heads_loss": [0.25, 0.5, 0.4],
      "pruning_fraction": [0.0, 0.2, 0.4, 0.6],
      "pruning_accuracy": [0.85, 0.85, 0.84, 0.7],
      # Ranked as |head_loss - baseline| (ties apart): importance agrees.
      "importance": [[0.5, 0.4], [0.1, 0.9], [0.05, 0.3]],
    },
    "anisotropy": {
      "anisotropy": [0.05, 0.2, 0.3, 0.4],
      "anisotropy_centered": [0.0, 0.01, -0.01, 0.0],
    },
    "pos": {
      "available": True,
      "accuracy": [0.8, 0.93, 0.9, 0.88],
      "selectivity": [0.1, 0.3, 0.25, 0.2],
      "best_layer": 1,
    },
    "effective": {
      "mean_passage_tokens": 70.0,
      "head_dim": 32,
      "stats": {
        "raw": {"cls": [[0.3, 0.2]], "sep": [[0.1, 0.1]]},
        "effective": {"cls": [[0.01, 0.02]], "sep": [[0.01, 0.0]], "raw_corr": [[0.4, 0.5]]},
      },
    },
    # Two of 40 dimensions outlie; disabling them halves the attention on special tokens;
    # layers 2 and 3 hold massive entries.
    "outliers": {
      "dims": [3, 17],
      "hidden_size": 40,
      "tokens": 99,
      "outliers_per_layer": [2, 2, 1],
      "special_mass": {"intact": [0.5, 0.6, 0.4], "disabled": [0.2, 0.3, 0.25]},
      "massive": {
        "count": [0, 3, 2],
        "max_abs": [20.0, 900.0, 800.0],
        "median_abs": [0.5, 0.4, 0.5],
      },
    },
  }


def _verdicts(r: dict) -> dict[str, list[str]]:
  return {k: rr.verdicts(v, MODEL) for k, v in rr.readings(r).items()}


def test_every_section_agrees_and_names_the_model():
  readings = rr.readings(_results())
  assert set(readings) == {
    "text",
    "clark",
    "patterns",
    "task",
    "ablation",
    "pruning",
    "anisotropy",
    "pos",
    "effective",
    "outliers",
  }
  for section, sentences in readings.items():
    assert any(MODEL in s for s in sentences), section
    assert "all-MiniLM" not in " ".join(sentences), section  # never the default's name
    if section != "text":
      assert set(rr.verdicts(sentences, MODEL)) == {"agrees"}, (section, sentences)


def _set(r, path, value):
  *keys, last = path
  for k in keys:
    r = r[k]
  r[last] = value


# (section, path in report.json, new value, the verdicts that section then gives)
FLIPS = [
  # [CLS] becomes the sink: over half still goes to special tokens, but not to [SEP].
  ("clark", ("clark", "by_layer", "cls"), [0.1, 0.7, 0.1], ["partly agrees", "agrees"]),
  # Nothing much goes to the special tokens in the middle layer.
  ("clark", ("clark", "by_layer", "sep"), [0.2, 0.1, 0.3], ["disagrees", "agrees"]),
  # The last layer attends most broadly.
  ("clark", ("clark", "by_layer", "entropy"), [1.2, 1.5, 2.5], ["agrees", "disagrees"]),
  ("patterns", ("patterns", "overall"), [0.1, 0.05, 0.05, 0.1, 0.7], ["partly agrees"]),
  ("patterns", ("patterns", "overall"), [0.1, 0.2, 0.05, 0.05, 0.6], ["disagrees"]),
  # The embeddings read the cue badly and the final layer is the best.
  ("task", ("task", "probe_accuracy_by_layer"), [0.6, 0.7, 0.8, 0.9], ["disagrees"]),
  ("task", ("task", "probe_accuracy_by_layer"), [0.95, 0.95, 0.95, 0.95], ["partly agrees"]),
  # Most heads move the loss (ranked as importance ranks them, so section 5 is unchanged).
  (
    "ablation",
    ("ablation", "head_loss"),
    [[0.55, 0.5], [0.35, 0.6], [0.32, 0.4]],
    ["disagrees", "agrees"],
  ),
  ("ablation", ("ablation", "layer_heads_loss"), [0.35, 0.5, 0.4], ["agrees", "disagrees"]),
  ("pruning", ("ablation", "pruning_accuracy"), [0.85, 0.8, 0.8, 0.7], ["disagrees", "agrees"]),
  (
    "pruning",
    ("ablation", "pruning_accuracy"),
    [0.85, 0.84, 0.8, 0.7],
    ["partly agrees", "agrees"],
  ),
  # Importance ranked against the size of the loss change: the verdict turns.
  (
    "pruning",
    ("ablation", "importance"),
    [[0.1, 0.2], [0.9, 0.05], [0.8, 0.3]],
    ["agrees", "disagrees"],
  ),
  (
    "anisotropy",
    ("anisotropy", "anisotropy"),
    [0.05, 0.2, 0.3, 0.05],
    ["partly agrees", "disagrees"],
  ),
  ("anisotropy", ("anisotropy", "anisotropy"), [0.05, 0.02, 0.03, 0.04], ["disagrees", "agrees"]),
  ("pos", ("pos", "best_layer"), 3, ["disagrees", "agrees"]),
  ("pos", ("pos", "selectivity"), [0.1, 0.1, 0.25, 0.2], ["agrees", "partly agrees"]),
  ("effective", ("effective", "stats", "effective", "cls"), [[0.2, 0.2]], ["partly agrees"]),
  ("effective", ("effective", "stats", "effective", "cls"), [[0.5, 0.4]], ["disagrees"]),
  # No dimension outlies: nothing to disable, so the second sentence has no verdict.
  ("outliers", ("outliers", "dims"), [], ["disagrees", "agrees"]),
  ("outliers", ("outliers", "dims"), list(range(5)), ["partly agrees", "agrees", "agrees"]),
  (
    "outliers",
    ("outliers", "special_mass", "disabled"),
    [0.45, 0.55, 0.35],
    ["agrees", "partly agrees", "agrees"],
  ),
  ("outliers", ("outliers", "massive", "count"), [0, 0, 2], ["agrees", "agrees", "partly agrees"]),
]


@pytest.mark.parametrize(("section", "path", "value", "expected"), FLIPS)
def test_a_changed_number_turns_its_section_s_verdict(section, path, value, expected):
  base = _verdicts(_results())
  r = copy.deepcopy(_results())
  _set(r, path, value)
  got = _verdicts(r)
  assert got[section] == expected, rr.readings(r)[section]
  assert {k: v for k, v in got.items() if k != section} == {
    k: v for k, v in base.items() if k != section
  }


def test_odd_results_get_their_likely_cause():
  r = _results()
  # The pruning curve rises above the intact model while the final layer's probe is weaker
  # than an earlier layer's: the reading names that as the likely cause.
  r["ablation"]["pruning_accuracy"] = [0.85, 0.88, 0.92, 0.9]
  text = " ".join(rr.readings(r)["pruning"])
  assert "The curve rises, to 0.920 with 40% of heads masked" in text
  assert "weaker than on layer 1 (0.960)" in text
  # No cause is claimed when the final layer is the best place to read the task.
  r["task"]["probe_accuracy_by_layer"] = [0.6, 0.7, 0.8, 0.9]
  text = " ".join(rr.readings(r)["pruning"])
  assert "The curve rises" in text and "likely cause" not in text
  # A final-layer probe no better than the majority class is flagged.
  r["task"]["probe_accuracy_by_layer"] = [0.6, 0.7, 0.8, 0.62]
  assert "barely beats the majority class" in " ".join(rr.readings(r)["task"])


def test_sections_that_did_not_run_say_so():
  r = _results()
  r["pos"] = {"available": False, "reason": "no UD data under /x"}
  r["attribution"] = {"available": False, "reason": "no single-token cues"}
  readings = rr.readings(r)
  assert "did not run (no UD data under /x)" in readings["pos"][0]
  assert "no single-token cues" in readings["attribution"][0]
  assert not rr.verdicts(readings["pos"] + readings["attribution"], MODEL)


def test_layer_numbers_are_blocks_from_one():
  r = _results()
  # The most harmful head sits in the second block: layer 2 on the page.
  assert "the most harmful is layer 2 head 1 (+0.300)" in rr.readings(r)["ablation"][0]
  assert "middle layer 2" in rr.readings(r)["clark"][0]
  assert np.argmax(r["clark"]["by_layer"]["sep"]) == 1
  assert "[SEP] peaks at layer 2 (0.60)" in rr.readings(r)["clark"][0]


def test_importance_is_compared_with_the_size_of_the_loss_change():
  """Importance is unsigned (E|dL/dxi|): the verdict ranks it against |delta L|, not the signed
  delta L (issue #36: -0.03 signed, +0.26 unsigned on MiniLM). Here importance ranks |delta L|
  exactly while the signed change runs the other way."""
  r = _results()
  r["ablation"]["head_loss"] = [[0.0, 0.1], [0.2, 0.29], [0.315, 0.33]]  # baseline 0.3
  r["ablation"]["importance"] = [[0.9, 0.7], [0.5, 0.1], [0.2, 0.3]]
  rho = rr.importance_vs_ablation(r["ablation"])
  assert rho["spearman_abs"] == pytest.approx(1.0)
  assert rho["spearman_signed"] < -0.7
  text = rr.readings(r)["pruning"][-1]
  assert "|delta L| of the single-head ablation, is 1.00 over all heads" in text
  assert "against the signed delta L, which importance does not estimate, -0.77" in text
  assert rr.verdicts([text], MODEL) == ["agrees"]


def test_a_stated_bound_holds_for_the_unrounded_value():
  """ "within 0.01 of 0" was printed for 0.014: a bound is rounded up, never to the nearest."""
  assert upper_bound(0.014) == "0.02" and upper_bound(0.01) == "0.01"
  assert upper_bound(0.07) == "0.07" and upper_bound(0.0) == "0.00"
  assert upper_bound(0.1234, 3) == "0.124"
  r = _results()
  r["anisotropy"]["anisotropy_centered"] = [0.0, 0.014, -0.003, 0.0]
  text = rr.readings(r)["anisotropy"][1]
  assert "every layer is within 0.02 of 0" in text


def test_a_gain_is_never_called_a_negative_cost():
  """On a near-random model masking any layer (or head) can lower the loss: the reading names
  the smallest gain as a gain, never "costs most at layer 3 (-0.005)"."""
  r = _results()
  r["ablation"]["layer_heads_loss"] = [0.29, 0.28, 0.295]
  r["ablation"]["head_loss"] = [[0.29, 0.28], [0.3, 0.299], [0.25, 0.2995]]
  first, second = rr.readings(r)["ablation"]
  assert "costs most" not in second and "(-" not in second.split("so it costs nothing")[0]
  assert "so it costs nothing in any layer (the smallest gain: layer 3, -0.005)" in second
  assert "most harmful" not in first
  assert "none raises the loss (the smallest gain: layer 2 head 0, +0.000)" in first


def _itemized(r: dict, n: int = 60, seed: int = 0) -> dict:
  """`_results()` with the per-item values a real report.json keeps (sentences, inputs,
  passages), drawn so that their means are the section's numbers."""
  rng = np.random.default_rng(seed)
  r = copy.deepcopy(r)

  def around(mean, size, sd):  # items whose mean is exactly `mean` (per column)
    x = rng.normal(0, sd, (size, *np.shape(mean)))
    return np.asarray(mean) + x - x.mean(0)

  def bits(p, size):  # 0/1 items with (about) the share p, exactly round(p * size) ones
    out = np.zeros(size)
    out[: round(p * size)] = 1
    return rng.permutation(out)

  c = r["clark"]["by_layer"]
  r["clark"]["per_sentence"] = {
    k: around(c[k], n, 0.05).tolist() for k in ("cls", "sep", "punct", "entropy")
  }
  r["patterns"]["per_input"] = around(r["patterns"]["overall"], n, 0.02).tolist()
  r["task"]["probe_accuracy_by_layer"][0] = max(r["task"]["probe_accuracy_by_layer"])  # (a tie
  # is robust; 0.95 against 0.96 on 60 sentences would rightly be inconclusive)
  order = rng.permutation(n)  # one ordering of the sentences: a layer reads a subset of those
  correct = np.stack([order < round(a * n) for a in r["task"]["probe_accuracy_by_layer"]])  # a
  # better layer reads ("nested" correctness: layers agree on the sentences, as real ones do)
  r["task"]["probe_accuracy_by_layer"] = correct.mean(1).tolist()
  r["task"]["probe_correct_by_layer"] = correct.astype(int).tolist()
  ab = r["ablation"]
  ab["pruning_accuracy"] = [0.85, 0.85, 0.85, 0.7]  # (0.84 against 0.85 on 60 sentences would
  # straddle the 0.02 tolerance)
  base = around(ab["baseline_loss"], n, 0.05)
  ab["per_example"] = {
    "loss_baseline": base.tolist(),
    "loss_heads": (
      base + around(np.asarray(ab["head_loss"]) - ab["baseline_loss"], n, 0.005).transpose(1, 2, 0)
    ).tolist(),
    "loss_layers": (
      base + around(np.asarray(ab["layer_heads_loss"]) - ab["baseline_loss"], n, 0.005).T
    ).tolist(),
    "correct_baseline": (order < round(ab["baseline_accuracy"] * n)).astype(int).tolist(),
    "correct_pruning": [
      (order < round(a * n)).astype(int).tolist() for a in ab["pruning_accuracy"]
    ],
  }
  a = np.asarray(r["anisotropy"]["anisotropy"])
  r["anisotropy"]["ci"] = {
    "sentences": n,
    "anisotropy": [(a - 0.02).tolist(), (a + 0.02).tolist()],
    "rise": [a[-1] - a[1] - 0.03, a[-1] - a[1] + 0.03],
  }
  o = r["outliers"]
  o["count_ci"] = [len(o["dims"]), len(o["dims"])]
  o["special_mass"] = {
    k: around(np.mean(v), n, 0.02).tolist() for k, v in o["special_mass"].items()
  }
  o["massive"]["by_sentence"] = [[0, 1, 1] if i % 2 else [0, 0, 1] for i in range(n)]
  acc, sel = np.asarray(r["pos"]["accuracy"]), np.asarray(r["pos"]["selectivity"])
  rows = np.full(n, 10)
  r["pos"]["test_by_sentence"] = {
    "rows": rows.tolist(),
    "correct": [(bits(x, n * 10).reshape(n, 10).sum(1)).tolist() for x in acc],
    "control_correct": [(bits(x, n * 10).reshape(n, 10).sum(1)).tolist() for x in acc - sel],
  }
  st = r["effective"]["stats"]
  raw = np.mean(st["raw"]["cls"]) + np.mean(st["raw"]["sep"])
  eff = np.mean(st["effective"]["cls"]) + np.mean(st["effective"]["sep"])
  r["effective"]["per_passage"] = {
    "tokens": [70] * 8,
    "raw": around(raw, 8, 0.01).tolist(),
    "effective": around(eff, 8, 0.002).tolist(),
  }
  return r


def test_every_verdict_states_its_confidence_interval():
  """Issue #36: each verdict states its 95% bootstrap interval over the items report.json keeps,
  with the rule applied to every resample; without those values it says it has none."""
  r = _itemized(_results())
  readings = rr.readings(r)
  for section, sentences in readings.items():
    if section == "text":
      continue
    text = " ".join(sentences)
    assert set(rr.verdicts(sentences, MODEL)) == {"agrees"}, (section, text)
    assert text.count("95% CI over") == len(rr.verdicts(sentences, MODEL)), (section, text)
    assert "no confidence interval" not in text, (section, text)
  assert "95% CI over the 60 held-out sentences: layer 0 minus the best layer" in " ".join(
    readings["task"]
  )
  assert "95% CI over the 6 heads: Spearman" in readings["pruning"][-1]
  plain = rr.readings(_results())["patterns"][0]
  assert "no confidence interval: report.json keeps no per-item values" in plain


def test_a_verdict_whose_interval_straddles_its_threshold_is_inconclusive():
  r = _itemized(_results())
  # Repeated types at 50% of the maps, give or take: the 0.5 threshold lies inside the interval.
  r["patterns"]["overall"] = [0.3, 0.1, 0.05, 0.05, 0.5]
  r["patterns"]["per_input"] = (
    np.asarray(r["patterns"]["overall"]) + np.random.default_rng(1).normal(0, 0.05, (60, 5))
  ).tolist()
  text = rr.readings(r)["patterns"][0]
  assert rr.verdicts([text], MODEL) == ["inconclusive"], text
  assert "the verdict on org/tiny-model is inconclusive (95% CI over the 60 inputs" in text
  assert "from 'partly agrees' to 'agrees' within it" in text
  # A whole layer's masking improving the loss by 0.001 on 60 noisy sentences: not shown.
  r = _itemized(_results())
  ab = r["ablation"]
  ab["layer_heads_loss"] = [ab["baseline_loss"] - 0.001, 0.5, 0.4]
  ex = ab["per_example"]
  rng = np.random.default_rng(2)
  ex["loss_layers"][0] = (
    np.asarray(ex["loss_baseline"]) - 0.001 + rng.normal(0, 0.05, 60)
  ).tolist()
  text = rr.readings(r)["ablation"][1]
  assert rr.verdicts([text], MODEL) == ["inconclusive"], text


def _circuit(n: int = 80, noise: float = 0.1, smallest: int | None = 40) -> dict:
  rng = np.random.default_rng(3)
  exact = rng.normal(0, 1, n)
  return {
    "available": True,
    "pairs": 12,
    "edges": 1000,
    "clean_logit": 4.0,
    "corrupted_logit": -1.0,
    "agreement": {"eap": {"pearson": 0.0, "edges": n}, "eap_ig": {"pearson": 0.0, "edges": n}},
    "exact_scores": exact.tolist(),
    "scores": {
      "eap": (exact + rng.normal(0, 1.0, n)).tolist(),
      "eap_ig": (exact + rng.normal(0, noise, n)).tolist(),
    },
    "smallest": smallest,
  }


def _with_pearsons(c: dict) -> dict:
  ex = np.asarray(c["exact_scores"])
  for k in ("eap", "eap_ig"):
    c["agreement"][k]["pearson"] = float(np.corrcoef(ex, c["scores"][k])[0, 1])
  return c


def test_circuit_reading_follows_its_numbers():
  """Section 10: EAP-IG close to exact patching and better than EAP agrees, with its interval
  over the edges; the circuit's share of the edges sets the second verdict."""
  r = _results()
  r["circuit"] = _with_pearsons(_circuit())
  first, second = rr.readings(r)["circuit"]
  assert rr.verdicts([first], MODEL) == ["agrees"] and "95% CI over the 80 edges" in first
  assert "40 of the 1,000 edges (4.0%)" in second and rr.verdicts([second], MODEL) == ["agrees"]
  r["circuit"] = _with_pearsons(_circuit(noise=3.0, smallest=150))  # EAP-IG no better than EAP
  first, second = rr.readings(r)["circuit"]
  assert rr.verdicts([first], MODEL) in (["disagrees"], ["inconclusive"])
  assert rr.verdicts([second], MODEL) == ["partly agrees"]
  r["circuit"] = _with_pearsons(_circuit(smallest=None))
  assert "no top-k circuit" in rr.readings(r)["circuit"][1]
  assert rr.verdicts([rr.readings(r)["circuit"][1]], MODEL) == ["disagrees"]
  r["circuit"] = {"available": False, "reason": "no single-token cues"}
  text = rr.readings(r)["circuit"]
  assert "did not run (no single-token cues)" in text[0] and not rr.verdicts(text, MODEL)


def test_sae_reading_follows_its_numbers():
  """Section 12: the dead share sets the verdict; the interval runs from the count to the
  bootstrap's upper end, and a verdict that the upper end would turn is inconclusive."""
  r = _results()
  r["sae"] = {
    "available": True,
    "layer": 2,
    "latents": 256,
    "k": 8,
    "steps": 100,
    "train_tokens": 900,
    "held_tokens": 300,
    "held_sentences": 20,
    "fvu": 0.3,
    "l0": 8.0,
    "dead": 0.04,
    "dense": 0.01,
    "dead_ci": [0.05, 0.08],
  }
  text = rr.readings(r)["sae"][0]
  assert rr.verdicts([text], MODEL) == ["agrees"] and "dead share [0.040, 0.080]" in text
  r["sae"]["dead_ci"] = [0.09, 0.2]
  assert rr.verdicts(rr.readings(r)["sae"], MODEL) == ["inconclusive"]
  r["sae"].update(dead=0.3, dead_ci=[0.35, 0.4])
  assert rr.verdicts(rr.readings(r)["sae"], MODEL) == ["partly agrees"]
  r["sae"] = {"available": False, "reason": "1 batch of text: none to hold out"}
  text = rr.readings(r)["sae"]
  assert "did not run (1 batch of text" in text[0] and not rr.verdicts(text, MODEL)
