"""Attribution graphs on an encoder: worked examples of agreement and negation (Ameisen et
al. 2025, "Circuit Tracing", on a sentence encoder with a fitted masked-LM head).

Run:
  ./run.sh experiment attribution_graphs
  .venv/bin/python -m experiments.attribution_graphs [--smoke] [--transcoders DIR]

The method, the data and what differs from the paper: docs/experiments.md, section
`attribution_graphs` (the site's Experiments page).
"""

from __future__ import annotations

import pathlib
import sys
import time
from collections.abc import Sequence

import numpy as np

from bertjax import claims, study
from bertjax.claims import Claim, Test
from experiments import common

NAME = "attribution_graphs"
# Worked examples: (name, sentence with one [MASK], the token the target favours, the one
# it is measured against). The target is the difference of their masked-LM logits.
EXAMPLES = (
  ("agreement (plural)", "The keys to the old wooden cabinet [MASK] on the table.", "are", "is"),
  ("agreement (singular)", "The key to the old wooden cabinets [MASK] on the table.", "is", "are"),
  ("negation", "A robin is not a [MASK].", "tree", "bird"),
  ("affirmation", "A robin is a [MASK].", "bird", "tree"),
)
MAX_EDGES = 3000  # the edges a graph's page draws and its JSON keeps (the rest are counted)
OPTIONS = (  # --name, its default and help
  ("top", 20, "features of most influence ablated one at a time per example (default: 20)"),
  ("steps", 400, ("training steps of the CLT when --transcoders is not given (default: 400; "
                 "--smoke: 10)")),
  ("batch-tokens", 1024, "tokens per step of that training (default: 1024; --smoke: 128)"),
  ("expansion", 4, "its latents per layer per model dimension (default: 4)"),
  ("k", 32, "its latents kept per token and layer (default: 32)"),
  ("mlm-windows", 3000, ("128-token windows an MLM head is fitted on when the checkpoint has "
                        "none (default: 3000; --smoke: 16)")),
  ("mlm-steps", 600, "optimiser steps of that fit (default: 600; --smoke: 20)"),
)  # fmt: skip


def parse_args(argv: Sequence[str] | None = None):
  p = common.parser(__doc__)
  for name, default, text in OPTIONS:
    p.add_argument(f"--{name}", type=int, default=default, help=text)
  p.add_argument(
    "--transcoders",
    metavar="DIR",
    help="a cross-layer transcoder saved by `transcoders.save` (experiments.transcoders "
    "--save-transcoders writes NAME_CLT there); default: train one on WikiText-2",
  )
  p.add_argument(
    "--save-transcoders",
    metavar="DIR",
    help="save the CLT trained here in DIR, under the name experiments.transcoders gives it "
    "(a later run's --transcoders reads it back)",
  )
  args = p.parse_args(argv)
  for name, _, _ in OPTIONS:
    if getattr(args, name.replace("-", "_")) < 1:
      raise study.UsageError(f"--{name}={getattr(args, name.replace('-', '_'))} must be >= 1")
  if args.transcoders and args.save_transcoders:
    raise study.UsageError("--save-transcoders saves a CLT trained here: not with --transcoders")
  if args.transcoders and not (pathlib.Path(args.transcoders) / "transcoder.json").is_file():
    raise study.UsageError(f"--transcoders={args.transcoders}: no saved transcoder there")
  if args.smoke:
    args.steps, args.batch_tokens = min(args.steps, 10), min(args.batch_tokens, 128)
    args.mlm_windows, args.mlm_steps = min(args.mlm_windows, 16), min(args.mlm_steps, 20)
    args.top = min(args.top, 4)
  return args


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  with study.quick_compiles(args.smoke):
    return run_experiment(args)


def transcoder(args, params, config, tok, data, timings):
  """(params, config, how): the CLT given, or one trained here on WikiText-2 validation."""
  from bertjax.analysis.circuits import transcoders as tcs
  from bertjax.tasks import passages

  if args.transcoders:
    tc, cfg = tcs.load(args.transcoders)
    return tc, cfg, f"read from {pathlib.Path(args.transcoders).name}"
  texts = passages.wikitext_paragraphs(data / "wikitext2_tokens" / "valid.txt")
  batches = [
    tok.encode(texts[i : i + 32], max_length=64, truncation=True) for i in range(0, len(texts), 32)
  ]
  with study.timed(timings, "activations"):
    x, y = tcs.activations(params, config, batches)
  d = config.hidden_size
  cfg = tcs.TranscoderConfig(
    d_model=d,
    layers=config.depth,
    latents=args.expansion * d,
    k=min(args.k, args.expansion * d),
    cross_layer=True,
    dead_tokens=100 * args.batch_tokens,
  )
  with study.timed(timings, "train CLT"):
    state, _ = tcs.train(
      x, y, cfg, steps=args.steps, batch_tokens=args.batch_tokens, seed=args.seed,
      progress=sys.stderr.isatty(),
    )  # fmt: skip
  if args.save_transcoders:  # saved before the graphs, so a crash there loses no training
    stem = study.results_stem("transcoders", args.model)
    tcs.save(pathlib.Path(args.save_transcoders) / f"{stem}_CLT", state.params, cfg)
  return state.params, cfg, f"trained here: {args.steps} steps x {args.batch_tokens} tokens"


def run_experiment(args) -> int:
  """The experiment on parsed arguments."""
  t_start = time.perf_counter()
  timings: dict[str, float] = {}
  from bertjax.analysis.circuits import graphs as G

  data = study.data_dir(args.data_dir, "wikitext2_tokens")
  with study.timed(timings, "load model"):
    config, params, tok, name = study.load_model(args)
  params, head = study.with_mlm_head(
    args, params, config, tok, data, timings, windows=args.mlm_windows, steps=args.mlm_steps
  )
  tc, tc_cfg, how = transcoder(args, params, config, tok, data, timings)
  stem = study.results_stem(NAME, args.model)
  out_dir = pathlib.Path(args.out)
  r = {"model": name, "head": head, "transcoder": how, "examples": {}, "timings": timings}
  views = []
  for label, text, good, bad in EXAMPLES:
    text = text.replace("[MASK]", tok.mask_token)  # MPNet's is <mask>
    ids = np.asarray(tok.encode([text]).input_ids)[0]
    mask = int(np.nonzero(ids == tok.convert_tokens_to_ids([tok.mask_token])[0])[0][0])
    a, b = tok.convert_tokens_to_ids([good, bad])
    target = G.Logit(mask, a, minus=b, label=f"logit({good}) - logit({bad})")
    started = time.perf_counter()
    graph = G.attribute(params, config, tc, tc_cfg, ids, [target], progress=sys.stderr.isatty())
    seconds = time.perf_counter() - started
    pruned = G.prune(graph)
    top = np.argsort(-G.node_influence(graph)[: graph.n_features], kind="stable")[: args.top]
    predicted, real = [], []
    for i in top:
      for factor in (0.0, 2.0):
        predicted.append(float(G.predict(graph, [i], factor)[0]))
        real.append(float(G.steer(params, config, tc, graph, [i], factor)[0]))
    r["examples"][label] = {
      "text": text,
      "tokens": tok.convert_ids_to_tokens(ids),
      "target": target.label,
      "value": float(graph.target_values[0]),
      "seconds": seconds,
      "features": graph.n_features,
      "kept_features": int(pruned.node_mask[: graph.n_features].sum()),
      "kept_edges": int(pruned.edge_mask.sum()),
      **G.scores(graph),
      "top": graph.features[top].tolist(),
      "factors": [0.0, 2.0],
      "predicted": predicted,
      "real": real,
      "graph": G.view(graph, pruned, tok.convert_ids_to_tokens(ids), max_edges=MAX_EDGES),
    }
    study.log(
      f"{label}: {graph.n_features} features in {seconds:.1f} s; "
      f"{r['examples'][label]['kept_features']} kept; scores {G.scores(graph)}"
    )
    if label in ("agreement (plural)", "negation"):
      views.append((label, r["examples"][label]["graph"]))
  with study.timed(timings, "graph pages"):
    r["pages"] = pages(params, config, tok, tc, tc_cfg, data, r["examples"], out_dir, stem, args)
  settings = {
    "model": name,
    "depth": config.depth,
    "hidden_size": config.hidden_size,
    "transcoder": {"latents": tc_cfg.latents, "k": tc_cfg.k, "cross_layer": tc_cfg.cross_layer},
    **{k.replace("-", "_"): getattr(args, k.replace("-", "_")) for k, _, _ in OPTIONS},
    "seed": args.seed,
    "pruning": {"node_threshold": 0.8, "edge_threshold": 0.98, "drawn_edges": MAX_EDGES},
    "xla_optimised": not args.smoke,
  }
  from bertjax.plots import graphs as plots

  figure = plots.checks(r["examples"], out_dir / f"{stem}_checks.png", views=views, title=name)
  study.finish(NAME, args, r, settings, findings=findings, started=t_start, figures=[figure.name])
  return 0


def pages(params, config, tok, tc, tc_cfg, data, examples, out_dir, stem, args) -> list[str]:
  """Each example's pruned graph as an interactive page (`bertjax.report.graph_page`), every
  feature with its top contexts in WikiText-2's validation paragraphs (128 tokens each)."""
  from bertjax.report import graph_page
  from bertjax.tasks import passages

  texts = passages.wikitext_paragraphs(data / "wikitext2_tokens" / "valid.txt")
  texts = texts[: 16 if args.smoke else 512]
  batches = [
    tok.encode(texts[i : i + 32], max_length=128, truncation=True) for i in range(0, len(texts), 32)
  ]
  feats = {label: graph_page.view_features(ex["graph"]) for label, ex in examples.items()}
  wanted = sorted({f for by_node in feats.values() for f in by_node.values()})
  found = graph_page.feature_contexts(params, config, tc, tc_cfg, tok, batches, wanted)
  by_feature = dict(zip(wanted, found))
  written = []
  for label, ex in examples.items():
    contexts = {i: by_feature[f] for i, f in feats[label].items()}
    slug = "_".join("".join(c if c.isalnum() else " " for c in label).split())
    path = graph_page.write(
      out_dir / f"{stem}_{slug}.html", ex["graph"], contexts, title=f"{label}: {ex['text']}",
      note=f"Target: {ex['target']}. Contexts: {len(texts)} paragraphs of WikiText-2 validation.",
    )  # fmt: skip
    written.append(path.name)
  return written


# The likely cause where the models' verdicts differ, as the committed numbers show it: (row
# index, model tag) -> the sentence on the Findings page.
CAUSES = {
  (0, "all-mpnet-base-v2"): (
    "MPNet's CLT, trained for the same 400 steps, is short of converged (held-out FVU up to "
    "1.15 at layer 12: the transcoders run); its graph predicts single-feature changes of up "
    "to 51 where the model moves by at most 5.5 (median ratio of the model's change to the "
    "graph's 0.06; MiniLM's 1.05), as if the frozen linear path through twelve layers of this "
    "CLT's features amplified what the model's own FFNs and norms damp (not measured apart)"
  )
}

# The claims ---------------------------------------------------------------------------------------

PAPER = "Ameisen et al. 2025"
SIGN = "the share of single-feature interventions the graph gets the sign of"
SIGNS = Claim(
  PAPER,
  "Intervening on a feature of an attribution graph moves the target in the direction the "
  "graph predicts.",
  yes=(Test(SIGN, ">", 0.5),),
  partly_if="never",
  short="Ablating or doubling a graph's features moves the target the way the graph predicts.",
)


def pairs(r: dict) -> tuple[np.ndarray, np.ndarray]:
  """Every example's (predicted, real) target changes, concatenated."""
  ex = r["examples"].values()
  return (np.concatenate([np.asarray(e[k], float) for e in ex]) for k in ("predicted", "real"))


def sign_share(predicted, real):
  return {SIGN: (np.sign(predicted) == np.sign(real)).mean(-1)}


def findings(r: dict, s: dict) -> list[dict]:
  """The row, from the results and settings as written to JSON."""
  r = study.from_json(r)
  predicted, real = pairs(r)
  corr = float(np.corrcoef(predicted, real)[0, 1]) if len(real) > 2 else float("nan")
  ex = r["examples"]
  per = "; ".join(
    f"{k}: {e['features']} features, replacement {e['replacement']:.2f}, completeness "
    f"{e['completeness']:.2f}" for k, e in ex.items()
  )  # fmt: skip
  text = (
    f"{len(ex)} worked examples ({per}); the {s['top']} features of most influence on each "
    f"target ablated and doubled one at a time in the model itself: Pearson r {corr:.2f} "
    f"between the graph's predicted and the model's change. Differs from the paper: a "
    f"{s['depth']}-layer sentence encoder with a fitted MLM head, a CLT trained briefly, "
    "single features rather than supernodes."
  )
  return [SIGNS.row(text, sign_share(predicted, real))]


def uncertainty(r: dict, s: dict) -> list[claims.Judgement]:
  """The row over the interventions (each a (predicted, real) pair), resampled together."""
  r = study.from_json(r)
  predicted, real = pairs(r)
  over = f"the {len(real)} single-feature interventions, one transcoder"
  point = {SIGN: findings(r, s)[0]["value"]["value"]}
  return [
    SIGNS.judge((predicted, real), sign_share, point=point, over=over, shown={SIGN: "{:.2f}"})
  ]


if __name__ == "__main__":
  sys.exit(main())
