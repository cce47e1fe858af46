"""Are attention weights identifiable? Raw vs effective attention in all-MiniLM-L6-v2.

Run:
  ./run.sh experiment effective_attention            # the full run (~1.5 min CPU; 3-6 min wall)
  .venv/bin/python experiments/effective_attention.py [--smoke] [--model DIR_OR_HUB_ID]

The method, the data and what differs from the paper: docs/experiments.md, section
`effective_attention` (the site's Experiments page).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import common
import numpy as np

from bertjax.analysis.attention import effective

NAME = "effective_attention"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  """The shared experiment options and the passages' sizes."""
  p = common.parser(__doc__)
  p.add_argument("--passages", type=int, help="passages in the main set (default: 32; --smoke: 4)")
  p.add_argument(
    "--length",
    type=int,
    help="tokens per main-set passage, [CLS] and [SEP] included (default: 128; --smoke: 40)",
  )
  p.add_argument(
    "--sweep-passages",
    type=int,
    help="passages per length in the length sweep (default: 3; --smoke: 2)",
  )
  return p.parse_args(argv)


def passage_sizes(args, head_dim: int) -> tuple[list[int], int, int, int]:
  """`(lengths, length, count, per_len)`: the sweep's lengths, the main set's passage length
  and count, and the sweep's passages per length: the run's (`--smoke`: the small one's;
  `experiments/sizes.toml`), with `--length`, `--passages` and `--sweep-passages` where given.

  Raises:
    ValueError: the main set's passages are not longer than `head_dim`.
  """
  size = common.sizes(NAME)["smoke" if args.smoke else "full"]
  given = {k: getattr(args, k) for k in ("length", "passages", "sweep_passages")}
  size.update({k: v for k, v in given.items() if v is not None})
  lengths, length, count, per_len = (size[k] for k in ("lengths", *given))
  if length <= head_dim:
    raise common.UsageError(
      f"--length {length} must exceed d_head={head_dim} (else effective = raw)"
    )
  return lengths, length, count, per_len


@common.one_blas_thread
def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  t_start = time.perf_counter()
  timings: dict[str, float] = {}

  from bertjax.analysis.attention import statistics
  from bertjax.data import conllu
  from bertjax.plots.effective import effective_attention_figures
  from bertjax.tasks import passages

  data = common.data_dir(args.data_dir, "ud_english_ewt")
  path = common.ud_file(data, "dev")
  sentences = conllu.read_conllu(path, max_sentences=60 if args.smoke else None)
  with common.timed(timings, "load model"):
    config, params, tok, model_name = common.load_model(args)
  head_dim = config.head_dim
  lengths, length, count, per_len = passage_sizes(args, head_dim)
  pieces = passages.sentence_pieces(tok, [s.forms for s in sentences])
  cut = lambda n, k, seed: passages.fixed_length(pieces, n, k, tok.cls_id, tok.sep_id, seed)
  kw = {
    "cls_id": tok.cls_id,
    "sep_id": tok.sep_id,
    "punct_ids": statistics.punctuation_ids(tok),
    "rebuild": 1,
  }
  common.log(f"length sweep {lengths}, {per_len} passages each ({model_name}, d_head={head_dim})")
  with common.timed(timings, "length sweep"):
    sweep = {
      n: effective.head_analysis(params, config, cut(n, per_len, args.seed + n), **kw)
      for n in lengths
    }
  common.log(f"main set: {count} passages of {length} tokens")
  ids = cut(length, count, args.seed)
  batches = [
    {"input_ids": b, "attention_mask": np.ones_like(b), "token_type_ids": np.zeros_like(b)}
    for b in np.split(ids, range(8, count, 8))
  ]
  with common.timed(timings, "effective_attention_statistics"):
    lib = effective.effective_attention_statistics(
      params, config, batches, cls_id=tok.cls_id, sep_id=tok.sep_id
    )
  with common.timed(timings, "per-head analysis"):
    main_r = effective.head_analysis(params, config, ids, **kw, null_space=False)
  main_r["length"] = length
  summary = effective.summarise(sweep, main_r, lib, head_dim)

  # An example: the head with the most raw [CLS]+[SEP] mass, on a short passage.
  special = (main_r["raw_cls"] + main_r["raw_sep"]).mean(0)
  layer, head = np.unravel_index(int(np.argmax(special)), special.shape)
  ex_ids = cut(min(48, max(lengths)) if args.smoke else 64, 1, args.seed + 1)
  example = {
    **effective.example_head(params, config, ex_ids, int(layer), int(head)),
    "layer": int(layer),
    "head": int(head),
  }
  stem = common.results_stem(NAME, args.model)
  figs = effective_attention_figures(
    sweep, main_r, lib, example, args.out, stem, model=model_name, head_dim=head_dim
  )
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
    "sweep": effective.sweep_means(sweep),
    "example": {
      "layer": example["layer"] + 1,
      "head": example["head"],
      "tokens": tok.convert_ids_to_tokens(ex_ids[0]),
    },
    "timings": timings,
  }
  common.finish(NAME, args, results, settings, started=t_start, figures=figs)
  return 0


if __name__ == "__main__":
  sys.exit(main())
