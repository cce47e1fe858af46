"""Which token-attribution method finds the negation cue, and which heads carry negation?

Run:
  ./run.sh experiment attribution
  .venv/bin/python -m experiments.attribution [--smoke] [--out DIR | --update-results]
      [--model DIR_OR_ID] [--seed N]

The method, the data and what differs from the paper: docs/experiments.md, section
`attribution` (the site's Experiments page).
"""

from __future__ import annotations

import dataclasses
import sys
import time

import numpy as np

from bertjax import claims, stats, study
from bertjax.claims import Claim, Test
from experiments import common

NAME = "attribution"
SMOKE_MODEL = {**study.SMOKE_MODEL, "max_position_embeddings": 128}


@dataclasses.dataclass(frozen=True)
class Settings:
  max_sentences: int | None  # None: every negated sentence with a one-token cue
  ig_steps: int
  flow: bool
  batch: int


FULL = Settings(max_sentences=None, ig_steps=32, flow=True, batch=16)
SMOKE = Settings(max_sentences=6, ig_steps=8, flow=True, batch=6)


def figures(out, res, patch_res, stem: str = NAME) -> list[str]:
  """The methods' cue ranks and the patching heatmaps, named `stem`_*.png."""
  import pathlib

  from bertjax.plots import charts

  out = pathlib.Path(out)
  out.mkdir(parents=True, exist_ok=True)
  a = patch_res["agreement"]
  paths = [
    charts.method_ranks(
      res["stats"],
      res["chance"]["mrr"],
      res["agreement"]["spearman"],
      out / f"{stem}_methods.png",
      title=f"Where does each method put the negation cue? ({len(res['sentences'])} sentences)",
    ),
    charts.patching_heatmaps(
      patch_res["exact"],
      patch_res["attribution"],
      out / f"{stem}_patching.png",
      cbar_label="share of the negation logit restored",
      title=f"Which heads carry negation into the affirmative twin? ({patch_res['pairs']} "
      f"pairs; Pearson {a['pearson']:.2f}, Spearman {a['spearman']:.2f})",
    ),
  ]
  return [p.name for p in paths]


def main(argv=None) -> int:
  args = common.parser(__doc__, data=False).parse_args(argv)
  t0 = time.perf_counter()
  from bertjax.tasks import negation
  from bertjax.tasks.sentences import load_sentences

  settings = SMOKE if args.smoke else FULL
  timings: dict[str, float] = {}
  with study.timed(timings, "load"):
    config, params, tok, name = study.load_model(
      args, smoke=lambda: study.tiny_model(0, "tiny random BERT (smoke stand-in)", **SMOKE_MODEL)
    )
    sentences = load_sentences()
  with study.timed(timings, "probe"):
    feats, labels = negation.pooled_features(params, config, tok, sentences)
    rng = np.random.default_rng(args.seed)
    test = rng.permutation(len(labels))[: len(labels) // 5]
    train = np.setdiff1d(np.arange(len(labels)), test)
    probe = negation.fit_probe(feats[train], labels[train])
    w, b, mu, sd = probe
    acc = float((((feats[test] - mu) / sd @ w + b > 0) == labels[test]).mean())
  negated = [s.text for s in sentences if s.negated]
  methods = tuple(m for m in negation.methods_for(config) if settings.flow or m != "flow")
  with study.timed(timings, "attribution"):
    res = negation.cue_statistics(
      params,
      config,
      tok,
      negated,
      negation.probe_weights(*probe),
      methods=methods,
      ig_steps=settings.ig_steps,
      batch_size=settings.batch,
      max_sentences=settings.max_sentences,
    )
  with study.timed(timings, "patching"):
    patch_res = negation.head_patching(params, config, tok, negated, negation.probe_weights(*probe))
  figs = figures(args.out, res, patch_res, study.results_stem(NAME, args.model))
  results = {"model": name, "probe_test_accuracy": acc, **res, "patching": patch_res}
  study.finish(
    NAME, args, results, dataclasses.asdict(settings), findings=findings, started=t0, figures=figs
  )
  return 0


# The claims ---------------------------------------------------------------------------------------
# `findings(results, settings)`: the Findings rows, made from the numbers as the JSON holds
# them; `uncertainty(results, settings)`: each claim's interval and verdict.

PAPER_NORM = "Kobayashi et al. 2020; Ferrando et al. 2022; Mohebbi et al. 2023"
PAPER_PATCH = "Nanda 2023; Syed et al. 2023"
PAPER_DECOMP = "Modarressi et al. 2023; Achtibat et al. 2024"
GRADIENT_METHODS = ("grad_x_input", "integrated_gradients")
DECOMPOSITIONS = ("decompx", "attnlrp")


WORST_MIXING = "the lowest value-counting method's MRR minus the best attention-weight method's"
BEST_MIXING = "the highest's"
PEARSON = "attribution vs exact patching Pearson"
WORST_DECOMP = "the lower decomposition's MRR minus the best other method's"
BEST_DECOMP = "the higher's"
VALUE_COUNTING = Claim(
  PAPER_NORM,
  "Attention weights alone misplace token importance; methods that also "
  "count value vectors, the residual and LayerNorm (norm-based, GlobEnc, ALTI, value "
  "zeroing) attribute to the tokens that matter",
  yes=(Test(WORST_MIXING, ">", 0),),
  partly=(Test(BEST_MIXING, ">", 0),),
  short="Counting value vectors, residual and LayerNorm finds the tokens that matter better than attention weights alone.",
)
PATCHING = Claim(
  PAPER_PATCH,
  "Attribution patching (a first-order gradient estimate) approximates "
  "activation patching of attention heads well enough to rank them",
  yes=(Test(PEARSON, ">", 0.8),),
  partly=(Test(PEARSON, ">", 0.5),),
)
DECOMPOSITION = Claim(
  PAPER_DECOMP,
  "Decomposing the whole model (every block with its FFN and norms, to "
  "the output) attributes more faithfully than attention-level methods and gradients",
  yes=(Test(WORST_DECOMP, ">", 0),),
  partly=(Test(BEST_DECOMP, ">", 0),),
  short="Decomposing the whole model to its output attributes more faithfully than attention-level methods and gradients.",
)


def findings(r: dict, s: dict) -> list[dict]:
  """The Findings rows from the results as written to JSON (`r`) and the settings `s`.

  The first row's rule compares the methods that count value vectors (the claim's four: norm,
  GlobEnc, ALTI, value zeroing) with the best of the attention-weight methods (raw attention,
  rollout); the second's, attribution with exact patching; the third's (where the results
  have them), the whole-model decompositions (DecompX, AttnLRP) with every other method.
  """
  return rows_of(study.from_json(r), s)


def rows_of(r: dict, s: dict) -> list[dict]:
  """`findings` on results already read back (`study.from_json`); the Findings' bootstrap
  intervals call it once per resample."""
  name, stats = r["model"], r["stats"]
  mixing = {k: stats[k]["mrr"] for k in ("norm", "globenc", "alti", "value_zeroing") if k in stats}
  weights = {k: stats[k]["mrr"] for k in ("attention", "rollout") if k in stats}
  best_weight = max(weights.values())
  above = [k for k, v in mixing.items() if v > best_weight]
  measured = (
    f"{name}, {len(r['sentences'])} negated sentences, MRR of the negation cue: "
    + ", ".join(f"{k} {v['mrr']:.2f}" for k, v in stats.items())
    + f" (chance {r['chance']['mrr']:.2f}); the probe reads negation with held-out "
    f"accuracy {r['probe_test_accuracy']:.2f}; {len(above)} of the {len(mixing)} "
    f"value-counting methods ({', '.join(above) or 'none'}) rank the cue above the "
    f"best attention-weight method ({best_weight:.2f}). Differs from the papers: they "
    "score faithfulness (agreement with gradient or erasure attributions, deletion "
    "curves) of fine-tuned classifiers; here the known cue's rank for a linear probe "
    "on a frozen sentence encoder."
  )
  margins = [v - best_weight for v in mixing.values()]
  rows = [VALUE_COUNTING.row(measured, {WORST_MIXING: min(margins), BEST_MIXING: max(margins)})]
  p = r["patching"]
  a = p["agreement"]
  exact = np.asarray(p["exact"], float)
  top = np.unravel_index(np.nanargmax(exact), exact.shape)
  rows.append(
    PATCHING.row(
      f"{name}, every head's output patched from {p['pairs']} negated sentences into "
      f"their affirmative twins (probe logit {p['clean_logit']:.2f} vs "
      f"{p['corrupted_logit']:.2f}): attribution vs exact patching Pearson "
      f"{a['pearson']:.2f}, Spearman {a['spearman']:.2f}; the strongest head, layer "
      f"{top[0] + 1} head {top[1]}, restores {exact[top]:.2f} of the logit.",
      {PEARSON: a["pearson"]},
    )
  )
  decomp = {k: stats[k]["mrr"] for k in DECOMPOSITIONS if k in stats}
  if decomp:
    others = {k: v["mrr"] for k, v in stats.items() if k not in DECOMPOSITIONS}
    grads = max(others[k] for k in GRADIENT_METHODS if k in others)
    best_other = max(others, key=others.get)
    margins = [v - others[best_other] for v in decomp.values()]
    rows.append(
      DECOMPOSITION.row(
        f"{name}, the same {len(r['sentences'])} negated sentences and probe logit: MRR of the "
        "cue "
        + ", ".join(f"{k} {v:.2f}" for k, v in decomp.items())
        + f" against the best other method ({best_other} {others[best_other]:.2f}) and the "
        f"best gradient method ({grads:.2f}). Differs from the papers: they score deletion "
        "faithfulness of fine-tuned classifiers; here the known cue's rank for a probe on "
        "a frozen encoder.",
        {WORST_DECOMP: min(margins), BEST_DECOMP: max(margins)},
      )
    )
  return rows


# How sure each row is ------------------------------------------------------------------------


def uncertainty(r: dict, s: dict) -> list[claims.Judgement]:
  """Over the sentences, each method's cue ranks (MRR per method, every rule on every
  resample); over the heads, exact against attribution patching (paired)."""
  r = study.from_json(r)
  rows = rows_of(r, s)
  names = list(r["ranks"])
  ranks = np.asarray([r["ranks"][k] for k in names], float).T  # (sentences, methods)
  over = f"the {len(ranks)} sentences"

  def margins(these, rest, worst, best):  # each of `these` methods' MRR minus the best of
    def of(rr):  # the `rest`'s, on (R, sentences, methods) resamples
      mrr = (1 / rr).mean(-2)
      m = mrr[..., these] - mrr[..., rest].max(-1, keepdims=True)
      return {
        worst: m.min(-1),
        best: m.max(-1),
        **{names[i]: m[..., j] for j, i in enumerate(these)},
      }

    return of

  def judged(claim, row, these, rest, worst, best):
    shown = {worst: "{:+.3f}", best: "{:+.3f}", **{names[i]: "{:+.2f}" for i in these}}
    q = row["value"]["value"]
    return claim.judge(
      ranks, margins(these, rest, worst, best), point={worst: q}, over=over, shown=shown
    )

  mixing = [names.index(k) for k in ("norm", "globenc", "alti", "value_zeroing") if k in names]
  weights = [names.index(k) for k in ("attention", "rollout") if k in names]
  out = [judged(VALUE_COUNTING, rows[0], mixing, weights, WORST_MIXING, BEST_MIXING)]
  p = r["patching"]
  pairs = (np.ravel(p["exact"]).astype(float), np.ravel(p["attribution"]).astype(float))
  ok = np.isfinite(pairs[0]) & np.isfinite(pairs[1])
  out.append(
    PATCHING.judge(
      tuple(a[ok] for a in pairs),
      lambda x, y: {PEARSON: stats.pearson_rows(x, y)},
      point={PEARSON: rows[1]["value"]["value"]},
      over=f"the {int(ok.sum())} heads",
    )
  )
  decomp = [names.index(k) for k in DECOMPOSITIONS if k in names]
  if decomp:
    others = [i for i in range(len(names)) if i not in decomp]
    out.append(judged(DECOMPOSITION, rows[2], decomp, others, WORST_DECOMP, BEST_DECOMP))
  return out


if __name__ == "__main__":
  sys.exit(main())
