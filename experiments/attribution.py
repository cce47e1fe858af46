"""Which token-attribution method finds the negation cue, and which heads carry negation?

Run:
  ./run.sh experiment attribution
  .venv/bin/python experiments/attribution.py [--smoke] [--out DIR | --update-results]
      [--model DIR_OR_ID] [--seed N]

The method, the data and what differs from the paper: docs/experiments.md, section
`attribution` (the site's Experiments page).
"""

from __future__ import annotations

import dataclasses
import sys
import time

import common
import numpy as np

NAME = "attribution"
SMOKE_MODEL = {**common.SMOKE_MODEL, "max_position_embeddings": 128}


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
  with common.timed(timings, "load"):
    config, params, tok, name = common.load_model(
      args, smoke=lambda: common.tiny_model(0, "tiny random BERT (smoke stand-in)", **SMOKE_MODEL)
    )
    sentences = load_sentences()
  with common.timed(timings, "probe"):
    feats, labels = negation.pooled_features(params, config, tok, sentences)
    rng = np.random.default_rng(args.seed)
    test = rng.permutation(len(labels))[: len(labels) // 5]
    train = np.setdiff1d(np.arange(len(labels)), test)
    probe = negation.fit_probe(feats[train], labels[train])
    w, b, mu, sd = probe
    acc = float((((feats[test] - mu) / sd @ w + b > 0) == labels[test]).mean())
  negated = [s.text for s in sentences if s.negated]
  methods = tuple(m for m in negation.methods_for(config) if settings.flow or m != "flow")
  with common.timed(timings, "attribution"):
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
  with common.timed(timings, "patching"):
    patch_res = negation.head_patching(params, config, tok, negated, negation.probe_weights(*probe))
  figs = figures(args.out, res, patch_res, common.results_stem(NAME, args.model))
  results = {"model": name, "probe_test_accuracy": acc, **res, "patching": patch_res}
  common.finish(NAME, args, results, dataclasses.asdict(settings), started=t0, figures=figs)
  return 0


if __name__ == "__main__":
  sys.exit(main())
