"""Forward pass of every encoder family on the CPU: bertjax vs transformers PyTorch (sdpa).

Run: ./run.sh bench bench_modern            (writes benchmarks/results/bench_modern.{json,md})
     ./run.sh bench bench_modern --only bert-base,albert-base --tag zen4
                                            (those models; bench_modern_zen4.{json,md})
     ./run.sh bench bench_modern --smoke    (tiny shapes, each model once, one round)

ModernBERT-base (22 x 768, a 128-token window in two of every three layers),
MPNet-base (12 x 768, the relative-position bias on every layer), DeBERTa-v3-base (12 x
768, disentangled attention: c2p and p2c with 256 log buckets), UltraBERT at
EuroBERT-210m's sizes (12 x 768, 4 key/value heads, a window of radius 128 in two of every
three layers), EmbeddingGemma-300m's and NeoBERT's shapes, and the base sizes of BERT,
RoBERTa, XLM-RoBERTa, ALBERT, ELECTRA, DistilBERT, EuroBERT-210m and NomicBERT, with
random weights, float32, no padding, batches of 8 x 128 and 8 x 512; and ModernBERT-base at
8 x 2048, where a window layer's cost should grow with T x window: bertjax as the model is,
bertjax with every layer global (the same weights, `layer_types` all full), and PyTorch on
the same windows. Side by side in one run:

* bertjax: `jax.jit` of `bertjax.forward` (XLA attention; window layers banded);
* transformers PyTorch: each family's `...Model` with `attn_implementation="sdpa"`, but
  `MPNetModel` and `DebertaV2Model` with their only implementation ("eager": transformers
  has no sdpa for them) and NeoBERT as its released code computes it (transformers has
  none), under `torch.inference_mode`, loaded from bertjax's `to_hf` export of the same
  weights (the difference of the outputs is recorded).

bertjax's programs are compiled ahead (compile time apart); each implementation is called once
first (first call reported apart), warmed up, then timed in interleaved rounds with a rotating
order (`bertjax.timing`). Results name the CPU and its ISA.
"""

from __future__ import annotations

import pathlib
import tempfile

import common
import jax.numpy as jnp
import numpy as np

import bertjax
from bertjax import timing

# (model, bertjax preset, batch, seq, variant): "model" as it is, "global" every layer full.
CASES = [
  ("modernbert-base", "modernbert-base", 8, 128, "model"),
  ("modernbert-base", "modernbert-base", 8, 512, "model"),
  ("mpnet-base", "mpnet-base", 8, 128, "model"),
  ("mpnet-base", "mpnet-base", 8, 512, "model"),
  ("modernbert-base", "modernbert-base", 8, 2048, "model+global"),
  ("deberta-v3-base", "deberta-v3-base", 8, 128, "model"),
  ("deberta-v3-base", "deberta-v3-base", 8, 512, "model"),
  ("ultrabert-12x768", "ultrabert-12x768", 8, 128, "model"),
  ("ultrabert-12x768", "ultrabert-12x768", 8, 512, "model"),
  ("embeddinggemma-300m", "embeddinggemma-300m", 8, 128, "model"),
  ("embeddinggemma-300m", "embeddinggemma-300m", 8, 512, "model"),
  ("neobert", "neobert", 8, 128, "model"),
  ("neobert", "neobert", 8, 512, "model"),
  *(
    (name, name, 8, seq, "model")
    for name in (
      "bert-base",
      "roberta-base",
      "albert-base",
      "electra-base",
      "distilbert-base",
      "eurobert-210m",
      "nomic-bert",
      "xlm-roberta-base",
    )
    for seq in (128, 512)
  ),
]
# Shapes that are no preset: UltraBERT at EuroBERT-210m's sizes (12 x 768, SwiGLU 3072, 4 key/
# value heads), with its own windows (radius 128) in two of every three layers.
SHAPES = {
  "ultrabert-12x768": dict(
    model_type="ultrabert",
    vocab_size=32000,
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    num_key_value_heads=4,
    intermediate_size=3072,
    max_position_embeddings=8192,
    layer_types=tuple("sliding_attention" if (i + 1) % 3 else "full_attention" for i in range(12)),
    sliding_window=256,
  ),
  # EmbeddingGemma-300m's shape (google/embeddinggemma-300m's config.json): 24 x 768, 3 heads
  # of 256 on 1 key/value head, GeGLU 1152, windows of 512 (|q - k| <= 256) in five of six
  # layers, the 262,144-token vocabulary.
  # NeoBERT's released shape (chandar-lab/NeoBERT's config.json): 28 x 768, SwiGLU 2048.
  "neobert": dict(
    model_type="neobert",
    hidden_size=768,
    num_hidden_layers=28,
    num_attention_heads=12,
    intermediate_size=3072,
    max_position_embeddings=4096,
    layer_norm_eps=1e-5,
  ),
  "embeddinggemma-300m": dict(
    model_type="gemma3_text",
    vocab_size=262144,
    hidden_size=768,
    num_hidden_layers=24,
    num_attention_heads=3,
    num_key_value_heads=1,
    intermediate_size=1152,
    max_position_embeddings=2048,
    query_pre_attn_scalar=256,
    layer_types=tuple("sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(24)),
    sliding_window=512,
  ),
  # XLM-RoBERTa-base (FacebookAI/xlm-roberta-base's config.json): RoBERTa-base's block, a
  # 250,002-token SentencePiece vocabulary.
  "xlm-roberta-base": dict(
    model_type="xlm-roberta",
    vocab_size=250002,
    max_position_embeddings=514,
    layer_norm_eps=1e-5,
    type_vocab_size=1,
  ),
}
SMOKE = dict(
  vocab_size=1000,
  hidden_size=64,
  num_hidden_layers=3,
  num_attention_heads=4,
  intermediate_size=96,
  pad_token_id=1,
)
HF_CLASS = {
  "modernbert": "ModernBertModel",
  "mpnet": "MPNetModel",
  "deberta-v2": "DebertaV2Model",
  "ultrabert": "UltrabertModel",
  "gemma3_text": "Gemma3TextModel",
  "bert": "BertModel",
  "roberta": "RobertaModel",
  "albert": "AlbertModel",
  "electra": "ElectraModel",
  "distilbert": "DistilBertModel",
  "eurobert": "EuroBertModel",
  "nomic_bert": "NomicBertModel",
  "xlm-roberta": "XLMRobertaModel",
}
# transformers' attention for each: sdpa where it has one (MPNet and DeBERTa have only eager).
HF_ATTENTION = {
  "modernbert": "sdpa",
  "mpnet": "eager",
  "deberta-v2": "eager",
  "ultrabert": "sdpa",
  "gemma3_text": "sdpa",
  "neobert": "sdpa",  # its released code's path: scaled_dot_product_attention, a boolean mask
  **dict.fromkeys(("bert", "roberta", "xlm-roberta", "albert", "electra", "distilbert"), "sdpa"),
  **dict.fromkeys(("eurobert", "nomic_bert"), "sdpa"),
}


def _neobert_reference(config: bertjax.BertConfig, directory: str):
  """NeoBERT's released computation in PyTorch (`tests/reference_neobert.py`; transformers
  has no NeoBERT), loaded strictly from the `to_hf` export."""
  import sys

  import safetensors.torch

  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
  import reference_neobert as ref

  model = ref.NeoBERT(
    ref.NeoBERTConfig(
      hidden_size=config.hidden_size,
      num_hidden_layers=config.num_hidden_layers,
      num_attention_heads=config.num_attention_heads,
      intermediate_size=config.intermediate_size,
      vocab_size=config.vocab_size,
      pad_token_id=config.pad_token_id,
      max_length=config.max_position_embeddings,
      norm_eps=config.layer_norm_eps,
    )
  )
  model.load_state_dict(
    safetensors.torch.load_file(pathlib.Path(directory) / "model.safetensors"), strict=True
  )
  return model.eval()


def _config(preset: str, smoke: bool, seq: int) -> bertjax.BertConfig:
  sizes = dict(SMOKE) if smoke else {}
  if smoke and preset.startswith(("modernbert", "ultrabert", "embeddinggemma")):
    sizes.update(
      layer_types=("full_attention", "sliding_attention", "sliding_attention"), sliding_window=16
    )
  if preset in SHAPES:
    fields = {**SHAPES[preset], **sizes}
    if smoke:
      fields.pop("num_key_value_heads", None)
      fields.pop("query_pre_attn_scalar", None)
    config = bertjax.BertConfig.for_family(fields.pop("model_type"), **fields)
  else:
    config = bertjax.BertConfig.preset(preset, **sizes)
  if config.max_length < seq:
    config = config.replace(max_position_embeddings=seq + config.position_offset)
  return config


def bench_case(name, preset, batch, seq, variant, args) -> dict:
  import torch
  import transformers

  config = _config(preset, args.smoke, seq)
  params = bertjax.init(config, 0)
  rng = np.random.default_rng(0)
  ids = rng.integers(5, config.vocab_size, (batch, seq)).astype(np.int32)
  ids[:, 0] = 1  # a first token that is not padding
  mask = np.ones_like(ids)
  row = {
    "model": name,
    "batch": batch,
    "seq": seq,
    "tokens": batch * seq,
    "family": config.model_type,
    "layers": config.depth,
    "windows": sorted({w for w in config.layer_windows if w}),
  }
  ids_j, mask_j = jnp.asarray(ids), jnp.asarray(mask)
  calls, compile_s, outputs = {}, {}, {}
  configs = {"bertjax": config}
  if "global" in variant:
    configs["bertjax_global"] = config.replace(layer_types=None, local_rope_theta=None)
  for key, c in configs.items():
    fwd = lambda p, x, m, c=c: bertjax.forward(p, c, x, m).last_hidden_state
    calls[key], compile_s[key] = timing.compile_ahead(fwd, params, ids_j, mask_j)

  with tempfile.TemporaryDirectory() as tmp:
    bertjax.to_hf(config, params, tmp)
    if config.model_type == "neobert":
      model = _neobert_reference(config, tmp)
    else:
      model = (
        getattr(transformers, HF_CLASS[config.model_type])
        .from_pretrained(tmp, attn_implementation=HF_ATTENTION[config.model_type])
        .eval()
      )
  row["torch_attention"] = HF_ATTENTION[config.model_type]
  ids_t, mask_t = torch.tensor(ids).long(), torch.tensor(mask).long()

  def torch_call():
    with torch.inference_mode():
      out = model(input_ids=ids_t, attention_mask=mask_t)
      return out["last_hidden_state"] if isinstance(out, dict) else out.last_hidden_state

  calls["torch_sdpa"] = torch_call
  times = common.interleaved(calls, args, outputs=outputs)
  info = {n: {"compile_s": seconds} for n, seconds in compile_s.items()}
  return common.against_torch(row, times, outputs, f"{name:>16} {batch} x {seq}", **info)


def markdown(r: dict) -> str:
  m = r["machine"]
  lines = [
    (
      f"Forward pass of encoder families on the CPU, float32, random weights, no "
      f"padding: {m['cpu']}, {m['cpus_usable']} usable CPUs; ISA: "
      f"{', '.join(m['isa_flags'])}; torch threads {m['torch_threads']}; jax {m['jax']}, "
      f"torch {m['torch']}, transformers {r['transformers']}. Medians of {r['rounds']} "
      f"interleaved rounds after {r['warmup']} warm-up calls; compile (or first call) "
      "apart."
    ),
    "",
    (
      "| model | batch x seq | bertjax | bertjax, every layer global | PyTorch | "
      "bertjax vs PyTorch | windows vs global | compile |"
    ),
    "|---|---|---|---|---|---|---|---|",
  ]
  for row in r["rows"]:
    ms = lambda n, row=row: f"{row[n]['median_s'] * 1e3:.0f} ms" if n in row else "-"
    glob = row.get("bertjax_speedup_vs_bertjax_global")
    lines.append(
      f"| {row['model']} | {row['batch']} x {row['seq']} | {ms('bertjax')} | "
      f"{ms('bertjax_global')} | {ms('torch_sdpa')} ({row['torch_attention']}) | "
      f"{row['bertjax_speedup_vs_torch_sdpa']:.2f}x | "
      f"{f'{glob:.2f}x' if glob else '-'} | {row['bertjax']['compile_s']:.1f} s |"
    )
  lines += [
    "",
    "Speed-ups are the other's median time over bertjax's (> 1: bertjax is "
    "faster). Max |bertjax - PyTorch| on the same weights: "
    + ", ".join(
      f"{row['model']} {row['batch']}x{row['seq']} {row['max_abs_diff_bertjax_vs_torch']:.1e}"
      for row in r["rows"]
    )
    + ".",
  ]
  return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
  p = common.parser(__doc__, rounds=5, warmup=1)
  p.add_argument(
    "--only",
    default=None,
    metavar="MODEL[,MODEL...]",
    help=f"only the cases of these models ({', '.join(dict.fromkeys(c[0] for c in CASES))}); "
    "results go to bench_modern_MODEL[+MODEL...].{json,md}",
  )
  p.add_argument("--tag", default=None, help="name the results bench_modern_TAG.{json,md} instead")
  args = p.parse_args(argv)
  only = args.only.split(",") if args.only else None
  unknown = sorted(set(only or ()) - {c[0] for c in CASES})
  if unknown:
    p.error(f"--only: unknown models {unknown}; expected some of {sorted({c[0] for c in CASES})}")
  if args.smoke:
    args.rounds, args.warmup = 1, 0
  import transformers

  cases = [c for c in CASES if only is None or c[0] in only]
  if args.smoke:  # each model once (its first length) and the every-layer-global variant
    first = {c[0]: c for c in reversed(cases)}
    cases = [c for c in cases if c is first[c[0]] or "global" in c[4]]
    cases = [(n, pr, 2, {128: 16, 512: 24, 2048: 40}[s], v) for n, pr, _, s, v in cases]
  rows = [bench_case(*case, args) for case in cases]
  result = {
    "machine": timing.machine(torch=True),
    "transformers": transformers.__version__,
    "rows": rows,
    "rounds": args.rounds,
    "warmup": args.warmup,
    "smoke": args.smoke,
  }
  stem = "bench_modern"
  if args.tag or only:
    stem += f"_{args.tag or '+'.join(only)}"
  common.write(result, markdown(result), args.out, stem, files=not args.smoke)
  return result


if __name__ == "__main__":
  main()
