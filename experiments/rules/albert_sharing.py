"""The Findings rules of `experiments/albert_sharing.py` (ALBERT's two parameter reductions vs
BERT: parameters, MLM loss and step time): the claims, the measured quantities and their
thresholds, and `findings(results, settings)`, the rows from a results JSON."""

from __future__ import annotations

import common
import numpy as np

from bertjax import claims
from bertjax.claims import Claim, Test

PAPER = "Lan et al. 2020"


# Lan et al. 2020, Table 1 (millions): BERT-base 108M, ALBERT-base 12M.
PAPER_BASE_RATIO = 12 / 108


BASE = "ALBERT-base's parameters over BERT-base's"
BASE_ERROR = "the distance of ALBERT-base's parameters over BERT-base's from 12/108"
SMALL = "ALBERT's share of BERT's parameters here"
LEAD = "the best model's lead over the unigram loss (nats)"
ALBERT_COST = "ALBERT's held-out loss minus BERT's"
SHARING_EXTRA = "sharing's cost minus factorising's"
STEP = "the sharing-only step time over BERT's"
PARAMS = Claim(
  PAPER,
  "ALBERT has far fewer parameters than BERT of the same depth and width "
  "(ALBERT-base 12M vs BERT-base 108M, ~1/9).",
  yes=(Test(BASE_ERROR, "<=", 0.02), Test(SMALL, "<", 1)),
  partly=(Test(BASE, "<", 0.5),),
  partly_if="all",
)
QUALITY = Claim(
  PAPER,
  "At the same depth and width ALBERT is somewhat worse than BERT; sharing "
  "layers costs more than factorising the embedding (Tables 3-4).",
  yes=(Test(ALBERT_COST, ">", 0), Test(SHARING_EXTRA, ">", 0)),
  applies=(Test(LEAD, ">=", 0.1),),  # before that, the models know only token frequencies
  short="ALBERT is somewhat worse than BERT at the same size; sharing layers costs more than factorising embeddings.",
)
COMPUTE = Claim(
  PAPER,
  "Sharing parameters does not reduce per-step compute (every layer still runs).",
  yes=(Test(STEP, ">=", 0.85),),
  partly=(Test(STEP, ">=", 0.7),),
)


def quality_quantities(heldout: dict[str, float], unigram: float) -> dict[str, float]:
  """What `QUALITY` reads from the held-out MLM losses and the unigram loss."""
  return {
    LEAD: unigram - min(heldout.values()),
    ALBERT_COST: heldout["albert"] - heldout["bert"],
    SHARING_EXTRA: heldout["shared_only"] - heldout["factorized_only"],
  }


def findings(r: dict, s: dict) -> list[dict]:
  """The Findings rows from the results as written to JSON (`r`) and the settings `s`.

  Each `holds` follows the stated rule; the quality row says how this small, short run differs
  from Lan et al.'s comparison and what that can do to the order of the two costs.
  """
  r = common.from_json(r)
  base, params, data = r["base_size"], r["params"], r["data"]
  heldout = {v: h["mlm_loss"] for v, h in r["heldout"].items()}
  d, step = r["heldout_minus_bert"], r["median_step_s"]
  small_ratio = params["albert"]["total"] / params["bert"]["total"]
  shared_step = step["shared_only"] / step["bert"]
  unigram = data["unigram_heldout_mlm_loss"]
  load = r["loadavg"]
  early = unigram - heldout["bert"]
  return [
    PARAMS.row(
      f"presets: ALBERT-base {base['albert_base'] / 1e6:.1f}M vs BERT-base "
      f"{base['bert_base'] / 1e6:.1f}M = 1/{1 / base['ratio']:.1f}; here ({s['layers']} "
      f"layers x {s['hidden']}, vocab {data['vocab_size']}, with MLM head): ALBERT "
      f"{params['albert']['total'] / 1e6:.2f}M vs BERT {params['bert']['total'] / 1e6:.2f}M "
      f"= 1/{1 / small_ratio:.1f} (sharing only {params['shared_only']['total'] / 1e6:.2f}M, "
      f"factorising only {params['factorized_only']['total'] / 1e6:.2f}M).",
      {
        BASE: base["ratio"],
        BASE_ERROR: abs(base["ratio"] - PAPER_BASE_RATIO),
        SMALL: small_ratio,
      },
    ),
    QUALITY.row(
      f"held-out MLM loss after {s['steps']} steps (fixed masks): BERT {heldout['bert']:.3f}, "
      f"ALBERT {heldout['albert']:.3f} ({d['albert']:+.3f}), sharing only "
      f"{heldout['shared_only']:.3f} ({d['shared_only']:+.3f}), factorising only "
      f"{heldout['factorized_only']:.3f} ({d['factorized_only']:+.3f}); token frequencies "
      f"alone give {unigram:.3f}, BERT's accuracy {r['heldout']['bert']['mlm_accuracy']:.1%}. "
      f"Differs from Lan et al.: {s['steps']} steps from scratch at {s['layers']} x "
      f"{s['hidden']} (E = {s['embedding']}) on {data['train_tokens']:,} WikiText-2 tokens, "
      "scored by held-out MLM loss; Lan et al. compare base-size models (E = 128) after 125k "
      f"steps on downstream tasks. BERT is only {early:.2f} nats past the unigram loss: at "
      "this early stage what the models have learned is mostly token statistics, which a "
      "narrow embedding limits more than shared layers do, so the order of the two costs "
      "need not carry over to trained models.",
      quality_quantities(heldout, unigram),
    ),
    COMPUTE.row(
      f"median train step: BERT {step['bert'] * 1e3:.0f} ms, sharing only "
      f"{step['shared_only'] * 1e3:.0f} ms ({shared_step:.2f}x), ALBERT "
      f"{step['albert'] * 1e3:.0f} ms ({step['albert'] / step['bert']:.2f}x), factorising "
      f"only {step['factorized_only'] * 1e3:.0f} ms; shared CPU, load "
      f"{load['start'][0]:.1f}->{load['end'][0]:.1f}.",
      {STEP: shared_step},
    ),
  ]


# How sure each row is ------------------------------------------------------------------------


def uncertainty(r: dict, s: dict) -> list[claims.Judgement]:
  """Parameter counts are exact; the step-time ratio over the runs' steps."""
  steps = np.asarray(
    [r["runs"][k]["loop_step_s"][1:] for k in ("bert", "shared_only")], float
  ).T  # (steps, 2); the first step compiles
  step = findings(r, s)[2]["value"]["value"]  # the row's own ratio, of the runs' medians
  ratio = lambda t: {STEP: np.median(t[..., 1], 1) / np.median(t[..., 0], 1)}
  return [
    claims.note("exact: parameter counts, nothing sampled"),
    claims.rerun_needed("per-token held-out losses"),
    COMPUTE.judge(
      steps, ratio, point={STEP: step}, over=f"{len(steps)} steps", shown={STEP: "{:.2f}"}
    ),
  ]
