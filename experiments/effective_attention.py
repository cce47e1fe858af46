"""Are attention weights identifiable? Raw vs effective attention in all-MiniLM-L6-v2.

Run:
  ./run.sh experiment effective_attention            # the full run (~1.5 min CPU; 3-6 min wall)
  .venv/bin/python experiments/effective_attention.py [--smoke] [--model DIR_OR_HUB_ID]

What it measures, on which model and data, and why:
  Brunner et al. (2020, "On Identifiability in Transformers") show that a head's output
  `A_h T_h` (T_h = (E W_V^h + b_V^h) W_O^h, an n x H matrix of rank <= d_head) does not
  determine its attention map A_h once the sequence is longer than the head dimension:
  any component of a row of A_h in the left null space of T_h (dimension n - rank(T_h))
  changes nothing. Removing it gives "effective attention", which they find puts far less
  weight on [SEP], [CLS] and punctuation than raw attention, so raw attention weights are a
  poor account of what a head uses. This script, on the real all-MiniLM-L6-v2 (6 layers x
  12 heads, d_head = 32), measures for every layer and head:

  * the null-space dimension as a function of sequence length n = 8..256: dim = n -
    rank(T_h), checked against max(0, n - d_head) (`effective.left_null_space`), and the
    null basis checked to annihilate T_h;
  * that effective attention gives the same head output as raw attention (A_eff T = A T)
    and, with every block's maps replaced by their effective attention through the model's
    `probs` site, the model's own hidden states;
  * the Pearson correlation of raw and effective attention per passage, against its length
    (Brunner et al. Fig. 3a), and that of the attention a token receives with its position;
  * the attention mass on [CLS], [SEP] and punctuation, raw vs effective
    (`effective.effective_attention_statistics`, plus punctuation here).

  Data: passages of consecutive sentences of UD English EWT v2.16 dev (their word forms,
  re-tokenised by MiniLM's WordPiece), cut to exactly n tokens including [CLS] at the start
  and [SEP] at the end, so that every passage of the main set (n = 128) is longer than
  d_head.

  `--smoke` uses a tiny random-weight model (2 heads of 16) and a handful of short passages;
  its numbers are not findings.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

import common
import numpy as np
from findings import Rule, Test

from bertjax.analysis.attention import effective as effective_attention_lib

NAME = "effective_attention"
PAPER = "Brunner et al. 2020"
CLASS_NAMES = {"cls": "[CLS]", "sep": "[SEP]", "punct": "punctuation"}


def token_stream(tok, sentences) -> list[np.ndarray]:
  """Each sentence's WordPiece ids, without [CLS]/[SEP]."""
  out = []
  for start in range(0, len(sentences), 256):
    batch = tok.encode_words([s.forms for s in sentences[start : start + 256]])
    for ids, mask in zip(batch.input_ids, batch.attention_mask):
      out.append(np.asarray(ids[1 : int(mask.sum()) - 1], np.int32))
  return out


def make_passages(
  stream: Sequence[np.ndarray], length: int, count: int, cls_id: int, sep_id: int, seed: int = 0
) -> np.ndarray:
  """`count` passages of exactly `length` tokens: [CLS], consecutive sentences, [SEP].

  Each starts at a random sentence (seeded) and takes the following sentences until
  `length - 2` word pieces are filled (the last one is cut).

  Returns:
    (count, length) int32 ids.
  """
  if length < 3:
    raise ValueError(f"{length=} must be >= 3 ([CLS], a token, [SEP])")
  total = sum(len(s) for s in stream)
  if total < length:
    raise ValueError(f"the sentences hold {total} tokens, fewer than {length=}")
  rng = np.random.default_rng(seed)
  out = np.empty((count, length), np.int32)
  for c in range(count):
    i, body = int(rng.integers(len(stream))), []
    while sum(len(b) for b in body) < length - 2:
      body.append(stream[i % len(stream)])
      i += 1
    out[c] = np.concatenate([[cls_id], np.concatenate(body)[: length - 2], [sep_id]])
  return out


MATCH = "the share of heads x passages whose null-space dimension is max(0, n - d_head)"
LONG_NULL = "the share with n > d_head that have a null space"
OUTPUT_ERROR, BLOCK_ERROR = "the head outputs' relative error", "the block outputs' error"
SPECIAL_RATIO = "effective over raw mass on [CLS] and [SEP]"
NULL_SPACE = Rule(
  PAPER,
  "Attention weights are not identifiable once the sequence is longer than the head "
  "dimension: the left null space of T_h has dimension n - rank(T_h) = n - d_head > 0.",
  yes=(Test(MATCH, ">=", 1),),
  partly=(Test(LONG_NULL, ">=", 1),),
)
SAME_OUTPUT = Rule(
  PAPER,
  "Attention can change without changing the output: effective attention (raw minus "
  "its null-space part) gives the same head output.",
  yes=(Test(OUTPUT_ERROR, "<", 1e-4), Test(BLOCK_ERROR, "<", 1e-4)),
  partly_if="never",
)
SPECIAL = Rule(
  PAPER,
  "Effective attention puts much less weight on [CLS] and [SEP] than raw attention.",
  yes=(Test(SPECIAL_RATIO, "<=", 0.5),),
  partly=(Test(SPECIAL_RATIO, "<", 1),),
)


def null_space_quantities(
  lengths: Sequence[int], null_dims: dict[int, np.ndarray], head_dim: int
) -> dict[str, float]:
  """What `NULL_SPACE` reads from each length's null-space dimensions (heads x passages);
  with no length above `head_dim`, no head has a null space to show (0)."""
  expected = effective_attention_lib.expected_null_dim
  match = np.concatenate([np.ravel(null_dims[n] == expected(n, head_dim)) for n in lengths])
  longer = [np.ravel(null_dims[n] > 0) for n in lengths if n > head_dim]
  return {
    MATCH: float(match.mean()),
    LONG_NULL: float(np.concatenate(longer).mean()) if longer else 0.0,
  }


def _figure_null_space(plt, out, stem, sweep, lengths, head_dim, depth, model_name) -> str:
  """Null-space dimension and raw/effective correlation against the sequence length."""
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
  ax = axes[0]
  dims = [sweep[n]["null_dim"].ravel() for n in lengths]
  ax.plot(lengths, [d.mean() for d in dims], "o", ms=7, label="measured (mean over heads)")
  ax.vlines(
    lengths,
    [d.min() for d in dims],
    [d.max() for d in dims],
    color="tab:blue",
    label="min-max over heads and passages",
  )
  grid = np.arange(0, max(lengths) + 1)
  ax.plot(
    grid,
    [effective_attention_lib.expected_null_dim(n, head_dim) for n in grid],
    "k--",
    lw=1,
    label=f"max(0, n - d_head), d_head = {head_dim}",
  )
  ax.set(
    xlabel="sequence length n (tokens)",
    ylabel="dim of left null space of T_h",
    title="Null-space dimension: non-identifiable when n > d_head",
  )
  ax.legend(fontsize=8)
  ax = axes[1]
  for d in range(depth):
    ax.plot(
      lengths, [sweep[n]["corr"][:, d].mean() for n in lengths], marker="o", label=f"layer {d + 1}"
    )
  ax.axvline(head_dim, color="gray", ls=":", label="n = d_head")
  ax.set(
    xlabel="sequence length n (tokens)",
    ylabel="Pearson r (mean over heads, passages)",
    title="Correlation of raw and effective attention vs length",
  )
  ax.legend(fontsize=7, ncol=2)
  for ax in axes:
    ax.grid(alpha=0.3)
  fig.suptitle(f"Brunner et al. (2020) on {model_name}")
  return common.savefig(fig, out, f"{stem}_null_space")


def _figure_special(plt, out, stem, main, lib, layers, model_name) -> str:
  """Mass on [CLS], [SEP] and punctuation, and the position correlation, by layer."""
  fig, axes = plt.subplots(1, 4, figsize=(19, 4.3), layout="constrained")
  for ax, c in zip(axes, ("cls", "sep", "punct")):
    for kind, style in (("raw", "-o"), ("effective", "--s")):
      ax.plot(layers, main[f"{kind}_{c}"].mean((0, 2)), style, label=kind)
    ax.axhline(0, color="k", lw=0.8)
    ax.set(xlabel="layer", title=f"attention mass on {CLASS_NAMES[c]}", xticks=layers)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  axes[0].set_ylabel("mean mass per query (mean over heads)")
  ax = axes[3]
  for kind, style in (("raw", "-o"), ("effective", "--s")):
    ax.plot(layers, np.nanmean(lib[kind]["position_corr"], -1), style, label=kind)
  ax.axhline(0, color="k", lw=0.8)
  ax.set(
    xlabel="layer",
    ylabel="Pearson r (mean over heads)",
    xticks=layers,
    title="corr(attention received, token position)",
  )
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.suptitle(
    f"Raw vs effective attention by layer ({model_name}, "
    f"{main['raw_cls'].shape[0]} passages of {main['length']} tokens)"
  )
  return common.savefig(fig, out, f"{stem}_special")


def _figure_heads(plt, out, stem, main, layers) -> str:
  """Each head's mass on each token class, raw against effective."""
  fig, axes = plt.subplots(1, 3, figsize=(15, 4.5), layout="constrained")
  for ax, c in zip(axes, ("cls", "sep", "punct")):
    raw, eff = main[f"raw_{c}"].mean(0), main[f"effective_{c}"].mean(0)  # (layers, heads)
    sc = ax.scatter(
      raw.ravel(), eff.ravel(), c=np.repeat(layers, raw.shape[1]), cmap="viridis", s=18
    )
    top = max(raw.max(), eff.max(), 1e-3)
    ax.plot([min(0, eff.min()), top], [min(0, eff.min()), top], "k--", lw=0.8, label="y = x")
    ax.set(
      xlabel="raw attention mass",
      ylabel="effective attention mass",
      title=f"mass on {CLASS_NAMES[c]}, one point per head",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
  fig.colorbar(sc, ax=axes, label="layer")
  fig.suptitle("Each head's attention to token classes, raw vs effective (Brunner Fig. 3b/c)")
  return common.savefig(fig, out, f"{stem}_heads")


def _figure_example(plt, out, stem, example) -> str:
  """One head's raw and effective map on one passage, and the attention each position gets."""
  fig, axes = plt.subplots(1, 3, figsize=(16, 4.5), layout="constrained")
  top = float(np.abs(example["effective"]).max())
  im = axes[0].imshow(example["raw"], cmap="Blues", vmin=0)
  fig.colorbar(im, ax=axes[0], shrink=0.8, label="attention weight")
  im = axes[1].imshow(example["effective"], cmap="RdBu_r", vmin=-top, vmax=top)
  fig.colorbar(im, ax=axes[1], shrink=0.8, label="effective weight")
  # Layers 1..L (block index + 1), heads 0..H-1, as everywhere in bertjax.
  axes[0].set_title(f"raw, layer {example['layer'] + 1}, head {example['head']}")
  axes[1].set_title("effective (negative = red)")
  for ax in axes[:2]:
    ax.set(xlabel="key position", ylabel="query position")
  for kind in effective_attention_lib.KINDS:
    axes[2].plot(np.asarray(example[kind]).mean(0), label=kind)
  axes[2].set(
    xlabel="key position ([CLS] = 0, [SEP] = last)",
    ylabel="mean attention received",
    title="attention received by each position",
  )
  axes[2].grid(alpha=0.3)
  axes[2].legend(fontsize=8)
  fig.suptitle(
    f"One passage of {len(example['raw'])} tokens; the head with the most raw [CLS]+[SEP] mass"
  )
  return common.savefig(fig, out, f"{stem}_example")


def _figures(
  out, sweep, lengths, head_dim, main, lib, example, model_name, stem: str = NAME
) -> list[str]:
  """Every figure, named `stem`_*.png (`common.results_stem`)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  depth = main["raw_cls"].shape[1]
  layers = np.arange(1, depth + 1)
  return [
    _figure_null_space(plt, out, stem, sweep, lengths, head_dim, depth, model_name),
    _figure_special(plt, out, stem, main, lib, layers, model_name),
    _figure_heads(plt, out, stem, main, layers),
    _figure_example(plt, out, stem, example),
  ]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  """The shared experiment options and the passages' sizes."""
  p = common.parser(__doc__)
  p.add_argument(
    "--passages", type=int, default=32, help="passages in the main set (default: 32; --smoke: 4)"
  )
  p.add_argument(
    "--length",
    type=int,
    default=128,
    help="tokens per main-set passage, [CLS] and [SEP] included (default: 128)",
  )
  p.add_argument(
    "--sweep-passages",
    type=int,
    default=3,
    help="passages per length in the length sweep (default: 3)",
  )
  return p.parse_args(argv)


def passage_sizes(args, head_dim: int) -> tuple[list[int], int, int, int]:
  """`(lengths, length, count, per_len)`: the sweep's lengths, the main set's passage length
  and count, and the sweep's passages per length.

  Raises:
    ValueError: the main set's passages are not longer than `head_dim`.
  """
  if args.smoke:
    lengths, length, count, per_len = [8, 16, 24, 32, 48], 40, 4, 2
  else:
    lengths = [8, 16, 24, 32, 40, 48, 64, 96, 128, 192, 256]
    length, count, per_len = args.length, args.passages, args.sweep_passages
  if length <= head_dim:
    raise common.UsageError(
      f"--length {length} must exceed d_head={head_dim} (else effective = raw)"
    )
  return lengths, length, count, per_len


def summarise(
  sweep: dict[int, dict], lengths: list[int], head_dim: int, main: dict, lib: dict
) -> dict[str, Any]:
  """The run's summary: null-space dimensions and ranks by length, the checks' largest errors,
  the correlation by length and the attention masses."""
  # The library's [CLS]/[SEP] statistics and ours must agree (same passages, same maps).
  agree = max(
    float(np.abs(lib[k][c] - main[f"{k}_{c}"].mean(0)).max())
    for k in effective_attention_lib.KINDS
    for c in ("cls", "sep")
  )
  null_dims = {n: sweep[n]["null_dim"] for n in lengths}
  all_runs = [sweep[n] for n in lengths] + [main]
  return {
    "head_dim": head_dim,
    "lengths": lengths,
    "rank_min_max": {
      n: (int(sweep[n]["rank"].min()), int(sweep[n]["rank"].max())) for n in lengths
    },
    "null_dim_mean": {n: float(null_dims[n].mean()) for n in lengths},
    "null_dim_expected": {
      n: effective_attention_lib.expected_null_dim(n, head_dim) for n in lengths
    },
    "null_dim_matches": {
      n: float(np.mean(null_dims[n] == effective_attention_lib.expected_null_dim(n, head_dim)))
      for n in lengths
    },
    "max_null_residual": max(float(sweep[n]["null_residual"].max()) for n in lengths),
    "max_relative_head_output_error": max(float(r["output_error"].max()) for r in all_runs),
    "max_block_output_error": {
      k: max(float(r[f"block_error_{k}"].max()) for r in all_runs)
      for k in effective_attention_lib.KINDS
    },
    "corr_raw_effective_by_length": {n: float(sweep[n]["corr"].mean()) for n in lengths},
    "special_mass": {
      k: float((main[f"{k}_cls"] + main[f"{k}_sep"]).mean()) for k in effective_attention_lib.KINDS
    },
    "mass": {
      f"{k}_{c}": float(main[f"{k}_{c}"].mean())
      for k in effective_attention_lib.KINDS
      for c in ("cls", "sep", "punct")
    },
    "heads_with_lower_effective_special": float(
      np.mean(
        (main["effective_cls"] + main["effective_sep"]).mean(0)
        < (main["raw_cls"] + main["raw_sep"]).mean(0)
      )
    ),
    "library_vs_direct_max_difference": agree,
    "position_corr_mean": {
      k: float(np.nanmean(lib[k]["position_corr"])) for k in effective_attention_lib.KINDS
    },
    "raw_effective_corr_mean": float(np.nanmean(lib["effective"]["raw_corr"])),
  }


def finding_rows(
  summary: dict[str, Any], sweep: dict[int, dict], heads: int, count: int, length: int
) -> list[dict]:
  """The Findings rows: the null space, the unchanged output, the mass on [CLS] and [SEP].

  Args:
    summary: `summarise`'s; sweep: per length, the heads' null-space dimensions;
    heads: the model's heads (layers x heads); count, length: the main passages.
  """
  head_dim, lengths = summary["head_dim"], summary["lengths"]
  null_dims = {n: np.asarray(sweep[n]["null_dim"]) for n in lengths}
  ranks, corr_by_len = summary["rank_min_max"], summary["corr_raw_effective_by_length"]
  out_err, block_err = summary["max_relative_head_output_error"], summary["max_block_output_error"]
  special, per_class = summary["special_mass"], summary["mass"]
  heads_lower = summary["heads_with_lower_effective_special"]
  long = [n for n in lengths if n > head_dim]
  null = null_space_quantities(lengths, null_dims, head_dim)
  return [
    NULL_SPACE.row(
      f"d_head {head_dim}; null-space dim = max(0, n - {head_dim}) for {100 * null[MATCH]:.0f}% "
      f"of heads x passages over n = {lengths[0]}..{lengths[-1]} (rank range "
      f"{min(r[0] for r in ranks.values())}-{max(r[1] for r in ranks.values())}); raw/effective "
      f"correlation {corr_by_len[lengths[0]]:.3f} at n={lengths[0]} -> {corr_by_len[long[-1]]:.3f} "
      f"at n={long[-1]}.",
      null,
    ),
    SAME_OUTPUT.row(
      f"max relative |A_eff T - A T| {out_err:.1e} (float64); block outputs with every block's "
      f"effective attention set through the probs site vs the model's hidden states: max abs "
      f"error {block_err['effective']:.1e} (raw: {block_err['raw']:.1e}).",
      {OUTPUT_ERROR: out_err, BLOCK_ERROR: block_err["effective"]},
    ),
    SPECIAL.row(
      f"mean mass per query on [CLS]+[SEP] over {heads} heads, "
      f"{count} passages of {length} tokens: raw {special['raw']:.3f}, effective "
      f"{special['effective']:.3f} ([CLS] {per_class['raw_cls']:.3f} -> "
      f"{per_class['effective_cls']:.3f}, [SEP] {per_class['raw_sep']:.3f} -> "
      f"{per_class['effective_sep']:.3f}; punctuation {per_class['raw_punct']:.3f} -> "
      f"{per_class['effective_punct']:.3f}); lower in {100 * heads_lower:.0f}% of heads.",
      {SPECIAL_RATIO: special["effective"] / special["raw"]},
    ),
  ]


def findings(r: dict, s: dict) -> list[dict]:
  """The Findings rows from the results as written to JSON (`findings.py --refresh`)."""
  summary = dict(r["summary"])
  summary["corr_raw_effective_by_length"] = {
    int(n): v for n, v in summary["corr_raw_effective_by_length"].items()
  }
  sweep = {int(n): v for n, v in r["sweep"].items()}
  heads = int(np.size(r["main_per_head"]["raw_cls"]))
  return finding_rows(summary, sweep, heads, s["main_passages"], s["main_length"])


def example_head(params, config, tok, main: dict, ids: np.ndarray) -> dict[str, Any]:
  """The head with the most raw [CLS]+[SEP] mass in `main`: its raw and effective maps on the
  passage `ids` ((1, n))."""
  import bertjax

  layer, head = divmod(
    int(np.argmax((main["raw_cls"] + main["raw_sep"]).mean(0))), config.num_attention_heads
  )
  o = bertjax.forward(params, config, ids, output_attentions=True, capture=("v",))
  raw = np.asarray(o.attentions)[layer, 0].astype(np.float64)
  t = effective_attention_lib.head_value_outputs(
    params, config, layer, np.asarray(o.cache["v"])[layer, 0]
  )
  return {
    "layer": layer,
    "head": head,
    "raw": raw[head],
    "effective": effective_attention_lib.effective_attention(raw, t)[head],
    "tokens": tok.convert_ids_to_tokens(ids[0]),
  }


@common.one_blas_thread
def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  t_start = time.perf_counter()
  timings: dict[str, float] = {}

  from bertjax.analysis.attention import statistics
  from bertjax.data import conllu

  data = common.data_dir(args.data_dir, "ud_english_ewt")
  path = common.ud_file(data, "dev")
  sentences = conllu.read_conllu(path, max_sentences=60 if args.smoke else None)
  with common.timed(timings, "load model"):
    config, params, tok, model_name = common.load_model(args)
  head_dim = config.head_dim
  lengths, length, count, per_len = passage_sizes(args, head_dim)
  stream = token_stream(tok, sentences)
  punct = statistics.punctuation_ids(tok)
  kw = {"cls_id": tok.cls_id, "sep_id": tok.sep_id, "punct_ids": punct, "rebuild": 1}

  common.log(f"length sweep {lengths}, {per_len} passages each ({model_name}, d_head={head_dim})")
  sweep = {}
  with common.timed(timings, "length sweep"):
    for n in lengths:
      sweep[n] = effective_attention_lib.head_analysis(
        params,
        config,
        make_passages(stream, n, per_len, tok.cls_id, tok.sep_id, args.seed + n),
        **kw,
      )
  common.log(f"main set: {count} passages of {length} tokens")
  ids = make_passages(stream, length, count, tok.cls_id, tok.sep_id, args.seed)
  batches = [
    {
      "input_ids": ids[i : i + 8],
      "attention_mask": np.ones_like(ids[i : i + 8]),
      "token_type_ids": np.zeros_like(ids[i : i + 8]),
    }
    for i in range(0, count, 8)
  ]
  with common.timed(timings, "effective_attention_statistics"):
    lib = effective_attention_lib.effective_attention_statistics(
      params, config, batches, cls_id=tok.cls_id, sep_id=tok.sep_id
    )
  with common.timed(timings, "per-head analysis"):
    main_r = effective_attention_lib.head_analysis(params, config, ids, **kw, null_space=False)
  main_r["length"] = length
  summary = summarise(sweep, lengths, head_dim, main_r, lib)

  # An example: the head with the most raw [CLS]+[SEP] mass, on a short passage.
  ex_ids = make_passages(
    stream, min(48, max(lengths)) if args.smoke else 64, 1, tok.cls_id, tok.sep_id, args.seed + 1
  )
  example = example_head(params, config, tok, main_r, ex_ids)
  heads = config.depth * config.num_attention_heads
  rows = finding_rows(summary, sweep, heads, count, length)
  figures = _figures(
    args.out,
    sweep,
    lengths,
    head_dim,
    main_r,
    lib,
    example,
    model_name,
    common.results_stem(NAME, args.model),
  )
  for f in rows:
    common.log(f"[{f['holds']}] {f['claim']} -- {f['measured']}")
  settings = {
    "model": model_name,
    "data": str(path.relative_to(data)),
    "sentences": len(sentences),
    "main_passages": count,
    "main_length": length,
    "sweep_lengths": lengths,
    "sweep_passages_per_length": per_len,
    "seed": args.seed,
    "null_space_rtol": 1e-10,
    "passages": "[CLS] + consecutive EWT dev sentences' word pieces (cut) + [SEP], one segment",
    "indexing": "layers are numbered 1..L (blocks) and heads 0..H-1; per-layer arrays "
    "hold layers 1..L in order, (L, H) arrays layer by head",
  }
  per_head = lambda r: {k: r[k].mean(0) for k in r if isinstance(r[k], np.ndarray)}
  results = {
    "summary": summary,
    "library_statistics": lib,
    "main_per_head": per_head(main_r),
    "sweep": {
      n: {
        "null_dim": sweep[n]["null_dim"].mean(0),
        "rank": sweep[n]["rank"].mean(0),
        "corr": sweep[n]["corr"].mean(0),
        "special_raw": (sweep[n]["raw_cls"] + sweep[n]["raw_sep"]).mean(0),
        "special_effective": (sweep[n]["effective_cls"] + sweep[n]["effective_sep"]).mean(0),
      }
      for n in lengths
    },
    "example": {
      "layer": example["layer"] + 1,
      "head": example["head"],
      "tokens": example["tokens"],
    },
    "timings": timings,
  }
  common.write_results(
    NAME,
    args.out,
    results,
    findings=rows,
    settings=settings,
    smoke=args.smoke,
    seconds=time.perf_counter() - t_start,
    figures=figures,
    model=args.model,
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
