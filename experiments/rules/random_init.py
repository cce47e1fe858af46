"""The Findings rules of `experiments/random_init.py` (Fine-tuning from random initialisation vs
pre-trained weights (Kovaleva et al. 2019)): the claims, the measured quantities and their
thresholds, and `findings(results, settings)`, the rows from a results JSON."""

from __future__ import annotations

from bertjax import claims
from bertjax.claims import Claim, Test

PAPER = "Kovaleva et al. 2019"


R = "r"  # random's share of the pre-trained gain over the majority class (`gain_ratio`)
LEXICAL = Claim(
  PAPER,
  "Fine-tuning the same architecture from random initialisation does disturbingly well "
  "next to the pre-trained weights on tasks with lexical cues (their Table 2, GLUE).",
  yes=(Test(R, ">=", 0.75),),
  partly=(Test(R, ">=", 0.4),),
  missing="n/a",
  missing_when="the pre-trained model does not beat the majority class",
  short="Fine-tuning from random initialisation does disturbingly well on tasks with lexical cues.",
)
# The control: Kovaleva et al. put the random model's success down to lexical cues, so where
# no lexical cue decides the task it should fall far short. Its row holds when r is low.
CONTROL_TASKS = ("blimp",)
CONTROL = Claim(
  PAPER,
  "(control for the row above) Where no lexical cue decides the task, random "
  "initialisation falls far short of the pre-trained weights, as the paper's "
  "explanation (lexical cues) implies.",
  yes=(Test(R, "<", 0.4),),
  partly=(Test(R, "<", 0.75),),
  missing="n/a",
  missing_when="the pre-trained model does not beat the majority class",
  short="(control) Without a lexical cue, random initialisation falls far short of the pre-trained weights.",
)


def findings(results: dict, settings: dict) -> list[dict[str, str]]:
  """The Findings rows, one per task, from the numbers as written to the JSON."""
  return [_finding(name, res, settings) for name, res in results["tasks"].items()]


def _finding(name: str, res: dict, size: dict) -> dict[str, str]:
  """The Findings row of one task."""
  s = res["summary"]
  n = len(res["runs"])
  pct = lambda x: f"{100 * x:.1f}"
  conv = s["converged"]
  ratio = "n/a" if s["gain_ratio"] is None else f"{s['gain_ratio']:.2f}"
  if n > 1:
    scores = (
      f"random init {pct(s['random'])} ± {pct(s['random_sd'])} vs pre-trained "
      f"{pct(s['pretrained'])} ± {pct(s['pretrained_sd'])} (mean ± sd, {n} seeds; gap "
      f"{pct(s['gap'])}, range {pct(s['gap_min'])} to {pct(s['gap_max'])})"
    )
  else:
    scores = (
      f"random init {pct(s['random'])} vs pre-trained {pct(s['pretrained'])} (1 seed; gap "
      f"{pct(s['gap'])})"
    )
  if "random_se" in s:  # runs since the standard errors were added
    items = "/".join(str(x["test_items"]) for x in res["splits"])
    scores += (
      f"; test-sampling SE {pct(s['random_se'])} and {pct(s['pretrained_se'])} "
      f"(binomial, {items} test {'tokens' if res['kind'] == 'token_classification' else 'sentences'})"
    )
  measured = (
    f"{name}: {res['what']}, test: {scores}; majority "
    f"{pct(s['majority'])}, lexical baseline {pct(s['lexical_baseline'])}; r = {ratio}; "
    f"early stopping on dev within {size['max_steps']} steps x {size['batch_size']} "
    f"(converged: pre-trained {conv['pretrained']}/{n}, random {conv['random']}/{n})."
  )
  if name in CONTROL_TASKS:
    measured += " (The task's summary in the JSON applies the row above's rule.)"
  return (CONTROL if name in CONTROL_TASKS else LEXICAL).row(measured, {R: s["gain_ratio"]})


# How sure each row is ------------------------------------------------------------------------


def uncertainty(r: dict, s: dict) -> list[claims.Judgement]:
  """One judgement per row: none has an interval yet, as the JSON keeps no per-item values."""
  what = (
    "per-example predictions; 1-2 seeds are too few to resample; a row gives its "
    "test-sampling SE where the run recorded it"
  )
  return [claims.rerun_needed(what)] * len(findings(r, s))
