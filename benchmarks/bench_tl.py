"""bertjax vs TransformerLens HookedEncoder on the CPU or a GPU: attention maps, ablation, patching.

Run (full, CPU):  JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_tl.py
                  (or ./run.sh bench bench_tl; writes benchmarks/results/bench_tl.{json,md})
Run (GPU):        .venv/bin/python benchmarks/bench_tl.py --device cuda
                  (JAX and the side environments' torch with CUDA; writes
                  bench_tl_gpu_<device>.{json,md}; both sides compute float32 dots at full
                  precision: TF32 off in torch, `jax_default_matmul_precision="highest"`)
Check (tiny):     JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_tl.py --smoke --out /tmp/b

Side environment (once, about 1.5 minutes from PyPI): TransformerLens 3.9.0 is the last
release with `HookedEncoder` (removed in 4.0) and its pins clash with ours, so it lives
in its own virtual environment, which this script runs as a subprocess:

  python3 -m venv .venv/tl && .venv/tl/bin/pip install torch==2.13.0 transformer-lens==3.9.0

(torch pinned to the CPU build this project uses; transformer-lens 3.9.0 needs
transformers >= 5.9 and gets 5.23, as ours.) `--tl-python` points elsewhere.

TransformerLens 4's `TransformerBridge` (hook points inside transformers' own modules; it
supports BERT) runs the same tasks when a second side environment is present (skipped,
with a note, when not; `--bridge-python` points elsewhere):

  python3 -m venv .venv/tl4 && .venv/tl4/bin/pip install torch==2.13.0 transformer-lens==4.3.0

Both sides run the SAME weights: a `transformers.BertForPreTraining` with random
weights in the shapes of BERT-base (12 x 768, 12 heads, FFN 3072) and of
all-MiniLM-L6-v2 (6 x 384, 12 heads, FFN 1536), vocabulary 30522, with every
LayerNorm parameter and every bias randomised too (at their defaults, 1 and 0, a
metric of a normalised state can be constant). bertjax reads the directory
`save_pretrained` writes (`bertjax.from_hf`); TransformerLens converts the same
model's state dict (`convert_bert_weights`, as `HookedEncoder.from_pretrained`
does). Input: batch 8 x 128 random tokens, [CLS] first, [SEP] last, one [MASK] per
sequence; the corrupted twin resamples 16 other tokens per sequence. Metric:
the MLM logit difference between an answer and a distractor token at the [MASK]
position, averaged over the batch.

Tasks, each timed warmed up (the first call, with any compile, apart) and checked for equal
numbers; on each side the single passes run side by side in rotating rounds, and so do the
sweeps (`bertjax.timing.interleaved`; the TransformerLens side loads that file by its path):

* forward: one forward pass (no logits) on each side: the unit.
* (a) every attention map: `bertjax.forward(..., output_attentions=True)` vs
  `run_with_cache` (as the docs show it: every activation and the logits; and lean:
  `names_filter` for `hook_pattern` only, `return_type=None`).
* (b) the 144 single-head ablations + baseline: `ablation_sweep` (prefix reuse) vs
  the hook loop of the TransformerLens docs (a hook zeroing the head's `hook_v`).
* (c) (layer, head) activation patching of `head_out` (TransformerLens `hook_z`),
  clean into corrupted: `patching.head_patching` vs the docs' hook loop
  (`run_with_cache` on the clean input, then one hooked run per head).
* attribution patching for all heads: `patching.attribution_patching` (its ratio
  to one forward pass from rounds of interleaved calls, before the sweeps; timed once more
  after them; agreement with (c)), beside TransformerLens's
  (cache + backward hooks on `hook_z`, as its attribution-patching demo).

TransformerLens runs each task in two variants: "docs" (`run_with_hooks` /
`run_with_cache` as its documentation shows them; `HookedEncoder.forward` computes
the logits over the whole vocabulary, even with `return_type=None`) and "lean" (the
same hooks around `encoder_output`, caching only what is needed, the MLM head
applied at the [MASK] rows only, as bertjax's metric does; with the Bridge, around
the wrapped model's `bert` encoder, then its `cls` head at those rows). Speed-ups
are against the faster variant. The forward-pass unit is `encoder_output` (no logits) against
`bertjax.forward`.
Full run: about 25 minutes on a quiet 2-core machine (`--models bert-base` alone
about 20; 35 with the TransformerBridge side too); on an H200 about 2 minutes per shape with
`XLA_FLAGS=--xla_gpu_autotune_level=0` (XLA's GEMM autotuning makes compiling the bertjax
side's programs take minutes). Writes `bench_tl.json` and `bench_tl.md` under `--out`
(`bench_tl_smoke.*` with `--smoke`), rewritten after each side, so a stopped run keeps
what it measured; progress lines give each bertjax task's first-call and steady time.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import pathlib
import statistics
import subprocess
import tempfile
import time

import common
import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
TL_PYTHON = REPO / ".venv" / "tl" / "bin" / "python"
BRIDGE_PYTHON = REPO / ".venv" / "tl4" / "bin" / "python"
SHAPES = {
  "bert-base": {
    "num_hidden_layers": 12,
    "hidden_size": 768,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
  },
  "minilm": {
    "num_hidden_layers": 6,
    "hidden_size": 384,
    "num_attention_heads": 12,
    "intermediate_size": 1536,
  },
  "smoke": {
    "num_hidden_layers": 2,
    "hidden_size": 32,
    "num_attention_heads": 4,
    "intermediate_size": 64,
  },
}


def parse_args(argv=None):
  parser = argparse.ArgumentParser(
    description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
  )
  parser.add_argument("--out", type=pathlib.Path, default=RESULTS, help="output directory")
  parser.add_argument("--smoke", action="store_true", help="a 2-layer model on 2 x 16 tokens")
  parser.add_argument("--models", default="bert-base,minilm", help="comma list of shapes")
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--seq", type=int, default=128)
  parser.add_argument(
    "--repeats",
    type=int,
    default=5,
    help="timed repeats of the single passes (forward, maps, attribution)",
  )
  parser.add_argument("--sweep-repeats", type=int, default=1, help="timed repeats of each sweep")
  parser.add_argument(
    "--tl-python",
    type=pathlib.Path,
    default=TL_PYTHON,
    help="the side environment's interpreter (transformer-lens 3.9.0)",
  )
  parser.add_argument(
    "--bridge-python",
    type=pathlib.Path,
    default=BRIDGE_PYTHON,
    help="the interpreter of a second side environment with transformer-lens "
    "4.3 (its TransformerBridge); skipped when absent",
  )
  parser.add_argument(
    "--device",
    choices=("cpu", "cuda"),
    default="cpu",
    help="where TransformerLens runs (torch); bertjax runs on JAX's default "
    "backend. On a GPU both sides compute float32 matrix products in "
    "full precision (no TF32), as on the CPU",
  )
  parser.add_argument("--tl-peer", type=pathlib.Path, default=None, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.smoke:
    args.models, args.batch, args.seq, args.repeats, args.sweep_repeats = "smoke", 2, 16, 2, 1
  return args


# Timing -----------------------------------------------------------------------


@functools.cache
def _peer_timing():
  """`bertjax/timing.py` loaded by its path: the TransformerLens side's environment has
  neither JAX nor bertjax, and the module needs neither (the side waits on torch itself)."""
  spec = importlib.util.spec_from_file_location("bertjax_timing", REPO / "bertjax" / "timing.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _entries(times: dict) -> dict:
  """`timing.interleaved`'s records as this report keeps them: first call and rounds."""
  return {k: {"first_s": t["first_call_s"], "times_s": t["times_s"]} for k, t in times.items()}


# The shared model and inputs ------------------------------------------------


def make_model(shape: dict, directory: pathlib.Path, seed: int = 0) -> None:
  """A random BertForPreTraining, LayerNorms and biases randomised, saved by transformers."""
  import torch
  import transformers

  torch.manual_seed(seed)
  vocab = 30522
  config = transformers.BertConfig(vocab_size=vocab, max_position_embeddings=512, **shape)
  model = transformers.BertForPreTraining(config).eval()
  gen = torch.Generator().manual_seed(seed + 1)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "LayerNorm.weight" in name:
        p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen))
      elif name.endswith("bias"):
        p.copy_(0.05 * torch.randn(p.shape, generator=gen))
  model.save_pretrained(directory)


# bertjax --------------------------------------------------------------------


def mlm_logit_diff_sum(params, config, batch, last_hidden_state, pooled):
  """The ablation sweep's metric: (sum over the batch of the [MASK] logit difference, count)."""
  import jax.numpy as jnp

  import bertjax

  b = jnp.arange(last_hidden_state.shape[0])
  logits = bertjax.mlm_logits(params, config, last_hidden_state[b, batch["position"]])
  diff = logits[b, batch["answer"]] - logits[b, batch["distractor"]]
  return diff.sum(), jnp.asarray(diff.shape[0], diff.dtype)


def run_bertjax(directory: pathlib.Path, inputs: dict, args) -> tuple[dict, dict]:
  """Timings and results of every task on the bertjax side."""
  import jax

  import bertjax
  from bertjax import timing
  from bertjax.analysis.interventions import ablation as interventions_ablation
  from bertjax.analysis.interventions import metrics
  from bertjax.analysis.interventions import patching as interventions_patching

  if jax.default_backend() == "gpu":
    # XLA:GPU runs float32 dots as TF32 by default; TransformerLens (torch) does not.
    jax.config.update("jax_default_matmul_precision", "highest")
  config, params = bertjax.from_hf(directory)
  ids, corrupted, mask = (jax.numpy.asarray(inputs[k]) for k in ("clean", "corrupted", "mask"))
  targets = {k: inputs[k] for k in ("position", "answer", "distractor")}
  clean = {"input_ids": ids, "attention_mask": mask}
  corr = {"input_ids": corrupted, "attention_mask": mask}
  metric = metrics.LogitDiff("mlm")
  results, outputs = {}, {}
  say = lambda line: print(f"  bertjax {line}", flush=True)

  # The single passes side by side (`bertjax.timing.interleaved`): bertjax.forward as users
  # call it (input checks, then its jitted program), every attention map, the clean run
  # alone (what attribution patching adds to the gradient pass; exact patching needs it
  # too) and attribution patching, all before the sweeps.
  fwd = lambda: bertjax.forward(params, config, ids, mask).last_hidden_state
  attr = lambda: interventions_patching.attribution_patching(
    params, config, clean, corr, metric, targets=targets
  )
  single = {
    "forward": fwd,
    "attention_maps": lambda: (
      bertjax.forward(params, config, ids, mask, output_attentions=True).attentions
    ),
    "capture_forward": lambda: (
      bertjax.forward(params, config, ids, mask, capture=("head_out",)).cache
    ),
    "attribution": attr,
  }
  times = _entries(timing.interleaved(single, args.repeats, warmup=0, outputs=outputs, log=say))
  results["attention_maps"] = np.asarray(outputs["attention_maps"])
  approx = outputs["attribution"]
  results["attribution"] = approx.values
  # Its ratio to one forward pass from more rounds of the two alone: the median of the
  # per-round ratios (`compare`).
  pair = timing.interleaved(
    {"forward": fwd, "attribution": attr}, 2 * args.repeats + 1, warmup=0, first_call=False
  )
  times["attribution_rounds"] = {
    "first_s": float("nan"),
    "times_s": pair["attribution"]["times_s"],
    "forward_s": pair["forward"]["times_s"],
  }

  batch = {**clean, **targets}
  sweeps = {
    "ablation_sweep": lambda: interventions_ablation.ablation_sweep(
      params, config, [batch], mlm_logit_diff_sum, head_ablations=("scale",), include=("heads",)
    )["scale"],
    "patching_sweep": lambda: interventions_patching.head_patching(
      params, config, clean, corr, metric, targets=targets
    ),
  }
  times |= _entries(
    timing.interleaved(sweeps, args.sweep_repeats, warmup=0, outputs=outputs, log=say)
  )
  res, exact = outputs["ablation_sweep"], outputs["patching_sweep"]
  results["ablation"] = res.heads
  results["ablation_baseline"] = np.asarray(res.baseline)
  results["patching"] = exact.values
  results["patching_clean_corrupted"] = np.asarray([exact.clean, exact.corrupted])

  # Attribution patching again after the sweeps, in the process state they leave (the same
  # program measured slower there: 3.75x a forward pass on the MiniLM shape against 3.14x
  # in a fresh process, 2026-11-25).
  after = timing.interleaved({"attribution_after_sweeps": attr}, args.repeats, warmup=0)
  times |= _entries(after)
  info = {
    "agreement": metrics.agreement(exact, approx),
    "clean": exact.clean,
    "corrupted": exact.corrupted,
    "jax": jax.__version__,
    "backend": jax.default_backend(),
  }
  return {"times": times, "info": info}, results


# TransformerLens (runs in the side environment) --------------------------------


def _bridge_model(model_dir: str, device: str):
  """`(bridge, missing, unexpected)`: TransformerLens 4.3's `TransformerBridge` around the
  `BertForMaskedLM` (encoder and MLM head) of the `BertForPreTraining` in `model_dir`."""
  import transformers
  from transformer_lens.model_bridge import TransformerBridge

  hf, info = transformers.BertForMaskedLM.from_pretrained(model_dir, output_loading_info=True)
  bridge = TransformerBridge.boot_transformers(
    model_dir, hf_model=hf.eval().to(device), device=device
  )
  bridge.eval()
  return bridge, info["missing_keys"], info["unexpected_keys"]


def _tl_model(model_dir: str, device: str):
  """`(model, missing, unexpected)`: a HookedEncoder with the weights of the
  `BertForPreTraining` in `model_dir`, and the weights its state dict missed or did not use."""
  import torch
  import transformers
  from transformer_lens import HookedEncoder
  from transformer_lens.pretrained.weight_conversions.bert import convert_bert_weights

  hf = transformers.BertForPreTraining.from_pretrained(model_dir).eval()
  c = hf.config
  cfg = {
    "d_model": c.hidden_size,
    "d_head": c.hidden_size // c.num_attention_heads,
    "n_heads": c.num_attention_heads,
    "d_mlp": c.intermediate_size,
    "n_layers": c.num_hidden_layers,
    "n_ctx": c.max_position_embeddings,
    "eps": c.layer_norm_eps,
    "d_vocab": c.vocab_size,
    "act_fn": "gelu",
    "attention_dir": "bidirectional",
    "original_architecture": "BertForMaskedLM",
    "device": device,
    "dtype": torch.float32,
  }
  model = HookedEncoder(cfg, move_to_device=True)
  missing, unexpected = model.load_state_dict(convert_bert_weights(hf, model.cfg), strict=False)
  parameters = {name for name, _ in model.named_parameters()}
  missing = [k for k in missing if k in parameters]  # buffers (causal masks) are not weights
  model.eval()
  return model, missing, unexpected


class _TLRuns:
  """The TransformerLens side's hooked runs on the benchmark's batch: the metric (the mean
  logit difference of answer and distractor at each row's position) and the hook_z caches.
  Subclasses say how their API runs the model: `HookedEncoder` (3.9) and `TransformerBridge`
  (4.3) take the same hook names and hook functions."""

  def __init__(self, model, inputs: dict[str, np.ndarray], device: str = "cpu"):
    import torch

    self.model = model
    self.n_layers, self.n_heads = model.cfg.n_layers, model.cfg.n_heads
    tensor = lambda key: torch.tensor(inputs[key]).long().to(device)
    self.ids, self.corrupted, self.mask = tensor("clean"), tensor("corrupted"), tensor("mask")
    self.b = torch.arange(self.ids.shape[0], device=device)
    self.pos, self.answer = tensor("position"), tensor("answer")
    self.distractor = tensor("distractor")
    self.device = device

  def done(self, x):
    """`x` once the GPU has finished computing it (torch launches CUDA work asynchronously;
    a timing must wait for it, as `jax.block_until_ready` does on the bertjax side)."""
    if self.device != "cpu":
      import torch

      torch.cuda.synchronize()
    return x

  def diff(self, logits_at_pos):  # (B, V) -> mean logit difference
    return (logits_at_pos[self.b, self.answer] - logits_at_pos[self.b, self.distractor]).mean()

  def docs_metric(self, logits):  # the model's (B, T, V) logits, as run_with_hooks returns them
    return self.diff(logits[self.b, self.pos])

  def run(self, tokens, hooks, variant):
    """One hooked run and its metric: "docs" (full logits) or "lean" (MLM head at [MASK])."""
    if variant == "docs":
      return self.docs_metric(self.logits_with_hooks(tokens, hooks))
    # The encoder alone under the same hooks, then the MLM head at the [MASK] rows only.
    with self.model.hooks(fwd_hooks=hooks):
      last = self.encoder(tokens)
    return self.diff(self.head(last[self.b, self.pos]))

  def z_cache(self, tokens, variant):
    """Every layer's hook_z by layer: run_with_cache (docs) or caching hooks on the encoder
    (lean)."""
    is_z = lambda name: name.endswith("hook_z")
    if variant == "docs":
      cache = self.cache(tokens, is_z)
      return {l: cache[f"blocks.{l}.attn.hook_z"] for l in range(self.n_layers)}
    cache = {}
    with self.model.hooks(fwd_hooks=[(is_z, lambda x, hook: cache.__setitem__(_layer(hook), x))]):
      self.encoder(tokens)
    return cache


def _layer(hook) -> int:
  """The block of a hook point, from its name ("blocks.{l}....", either API)."""
  return int(hook.name.split(".")[1])


class _HookedEncoderRuns(_TLRuns):
  """TransformerLens 3.9 `HookedEncoder`."""

  def encoder(self, tokens):
    return self.model.encoder_output(tokens, None, self.mask)

  def head(self, x):  # (B, H) -> (B, V)
    return self.model.unembed(self.model.mlm_head(x[:, None]))[:, 0]

  def logits_with_hooks(self, tokens, hooks):
    # HookedEncoder.forward computes the full logits even with return_type=None.
    return self.model.run_with_hooks(tokens, fwd_hooks=hooks, one_zero_attention_mask=self.mask)

  def cache(self, tokens, names_filter=None):
    return self.model.run_with_cache(
      tokens, one_zero_attention_mask=self.mask, names_filter=names_filter
    )[1]


class _BridgeRuns(_TLRuns):
  """TransformerLens 4.3 `TransformerBridge` around transformers' `BertForMaskedLM` (its hook
  points live inside the Hugging Face modules, so the lean runs call the model's encoder)."""

  def encoder(self, tokens):
    return self.model.original_model.bert(
      input_ids=tokens, attention_mask=self.mask
    ).last_hidden_state

  def head(self, x):
    return self.model.original_model.cls(x)

  def logits_with_hooks(self, tokens, hooks):
    return self.model.run_with_hooks(tokens, attention_mask=self.mask, fwd_hooks=hooks)

  def cache(self, tokens, names_filter=None):
    return self.model.run_with_cache(tokens, attention_mask=self.mask, names_filter=names_filter)[1]


def _tl_forward_and_maps(t: _TLRuns, repeats: int, times: dict, results: dict) -> None:
  """One forward pass, and (a) every attention map: run_with_cache (docs) or pattern hooks."""
  import torch

  model, ids = t.model, t.ids

  def maps_docs():
    cache = t.cache(ids)
    return torch.stack([cache[f"blocks.{l}.attn.hook_pattern"] for l in range(t.n_layers)])

  def maps_lean():  # only the patterns cached, and no logits
    cache = {}
    keep = lambda x, hook: cache.__setitem__(_layer(hook), x)
    with model.hooks(fwd_hooks=[(lambda name: name.endswith("hook_pattern"), keep)]):
      t.encoder(ids)
    return torch.stack([cache[l] for l in range(t.n_layers)])

  calls = {
    "forward": lambda: t.encoder(ids),
    "attention_maps_docs": maps_docs,
    "attention_maps_lean": maps_lean,
  }
  outputs = {}
  times |= _entries(
    _peer_timing().interleaved(calls, repeats, warmup=0, wait=t.done, outputs=outputs)
  )
  results["attention_maps"] = outputs["attention_maps_docs"].cpu().numpy()


def _sweeps(t: _TLRuns, calls: dict, sweep_repeats: int, outputs: dict) -> dict:
  """The docs and lean variants of one sweep side by side: `sweep_repeats` rounds, no call
  apart (eager torch compiles nothing, and a sweep is too slow to run more often)."""
  took = _peer_timing().interleaved(
    calls, sweep_repeats, warmup=0, first_call=False, wait=t.done, outputs=outputs
  )
  return _entries(took)


def _tl_ablation(t: _TLRuns, sweep_repeats: int, times: dict, results: dict) -> None:
  """(b) single-head ablation: the docs' hook zeroing one head's values."""

  def ablate_head(v, hook, head):
    v[:, :, head, :] = 0.0
    return v

  def ablation(variant):
    values = np.zeros((t.n_layers, t.n_heads))
    base = float(t.run(t.ids, [], variant))
    for layer in range(t.n_layers):
      for head in range(t.n_heads):
        hook = (f"blocks.{layer}.attn.hook_v", functools.partial(ablate_head, head=head))
        values[layer, head] = float(t.run(t.ids, [hook], variant))
    return base, values

  calls = {f"ablation_sweep_{v}": functools.partial(ablation, v) for v in ("docs", "lean")}
  outputs = {}
  times |= _sweeps(t, calls, sweep_repeats, outputs)
  for variant in ("docs", "lean"):
    base, results[f"ablation_{variant}"] = outputs[f"ablation_sweep_{variant}"]
    results["ablation_baseline"] = np.asarray(base)


def _tl_patching(t: _TLRuns, sweep_repeats: int, times: dict, results: dict) -> None:
  """(c) activation patching of each head's z, clean into corrupted (the docs' loop)."""

  def patch_head(z, hook, head, clean_cache):
    z[:, :, head, :] = clean_cache[_layer(hook)][:, :, head, :]
    return z

  def patching(variant):
    clean_cache = t.z_cache(t.ids, variant)
    clean_m = float(t.run(t.ids, [], variant))
    corrupted_m = float(t.run(t.corrupted, [], variant))
    values = np.zeros((t.n_layers, t.n_heads))
    for layer in range(t.n_layers):
      for head in range(t.n_heads):
        hook = (
          f"blocks.{layer}.attn.hook_z",
          functools.partial(patch_head, head=head, clean_cache=clean_cache),
        )
        values[layer, head] = float(t.run(t.corrupted, [hook], variant))
    return clean_m, corrupted_m, values

  calls = {f"patching_sweep_{v}": functools.partial(patching, v) for v in ("docs", "lean")}
  outputs = {}
  times |= _sweeps(t, calls, sweep_repeats, outputs)
  for variant in ("docs", "lean"):
    cm, xm, results[f"patching_{variant}"] = outputs[f"patching_sweep_{variant}"]
    results["patching_clean_corrupted"] = np.asarray([cm, xm])


def _tl_attribution(t: _TLRuns, repeats: int, times: dict, results: dict) -> None:
  """Attribution patching as TransformerLens's demo does it: cache clean z; cache corrupted
  z and its gradient (backward hooks), then (clean - corrupted) . grad per head."""
  import torch

  model = t.model

  def attribution():
    with torch.no_grad():
      clean_cache = t.z_cache(t.ids, "lean")
    acts, grads = {}, {}
    model.reset_hooks()
    for layer in range(t.n_layers):
      name = f"blocks.{layer}.attn.hook_z"
      model.add_hook(name, lambda x, hook: acts.__setitem__(_layer(hook), x.detach()), "fwd")
      model.add_hook(name, lambda g, hook: grads.__setitem__(_layer(hook), g.detach()), "bwd")
    value = t.run(t.corrupted, [], "lean")
    value.backward()
    model.reset_hooks()
    model.zero_grad(set_to_none=True)
    return (
      torch.stack(
        [((clean_cache[l] - acts[l]) * grads[l]).sum((0, 1, 3)) for l in range(t.n_layers)]
      )
      .cpu()
      .numpy()
    )

  outputs = {}
  took = _peer_timing().interleaved(
    {"attribution": attribution}, repeats, warmup=0, wait=t.done, outputs=outputs
  )
  times |= _entries(took)
  results["attribution_delta"] = outputs["attribution"]


def tl_peer(spec_path: pathlib.Path) -> None:
  """The TransformerLens side: reads a spec, times every task, writes JSON and NPZ."""
  import importlib.metadata
  import warnings

  import torch
  import transformers

  warnings.filterwarnings("ignore")
  spec = json.loads(spec_path.read_text())
  inputs = dict(np.load(spec["inputs"]))
  repeats, sweep_repeats = spec["repeats"], spec["sweep_repeats"]
  device = spec["device"]
  if device == "cuda":
    torch.backends.cuda.matmul.allow_tf32 = False  # full float32, as the bertjax side
    torch.backends.cudnn.allow_tf32 = False
  if spec["api"] == "bridge":
    model, missing, unexpected = _bridge_model(spec["model_dir"], device)
    t = _BridgeRuns(model, inputs, device)
  else:
    model, missing, unexpected = _tl_model(spec["model_dir"], device)
    t = _HookedEncoderRuns(model, inputs, device)
  times, results = {}, {}
  with torch.no_grad():
    _tl_forward_and_maps(t, repeats, times, results)
    _tl_ablation(t, sweep_repeats, times, results)
    _tl_patching(t, sweep_repeats, times, results)
  _tl_attribution(t, repeats, times, results)
  info = {
    "torch": torch.__version__,
    "torch_threads": torch.get_num_threads(),
    "torch_interop_threads": torch.get_num_interop_threads(),
    "transformer_lens": importlib.metadata.version("transformer-lens"),
    "transformers": transformers.__version__,
    "device": device,
    "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
    "missing_keys": list(missing),
    "unexpected_keys": list(unexpected),
  }
  np.savez(spec["results"], **results)
  pathlib.Path(spec["timings"]).write_text(json.dumps({"times": times, "info": info}))


def run_tl(
  args,
  directory: pathlib.Path,
  inputs_path: pathlib.Path,
  work: pathlib.Path,
  api: str = "hooked_encoder",
):
  """The TransformerLens side in its environment: `api` "hooked_encoder" (3.9, `--tl-python`)
  or "bridge" (4.3's TransformerBridge, `--bridge-python`)."""
  python = args.bridge_python if api == "bridge" else args.tl_python
  spec = {
    "model_dir": str(directory),
    "inputs": str(inputs_path),
    "repeats": args.repeats,
    "sweep_repeats": args.sweep_repeats,
    "results": str(work / f"{api}_results.npz"),
    "timings": str(work / f"{api}_timings.json"),
    "api": api,
    "device": args.device,
  }
  (work / "spec.json").write_text(json.dumps(spec))
  env = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "PYTHONWARNINGS": "ignore",
  }
  env.pop("PYTHONPATH", None)
  proc = subprocess.run(
    [str(python), str(pathlib.Path(__file__).resolve()), "--tl-peer", str(work / "spec.json")],
    env=env,
    capture_output=True,
    text=True,
    check=False,
  )
  if proc.returncode != 0:
    raise RuntimeError(f"the TransformerLens side failed ({python}):\n{proc.stderr[-4000:]}")
  return (json.loads(pathlib.Path(spec["timings"]).read_text()), dict(np.load(spec["results"])))


# Report ---------------------------------------------------------------------


def median(entry: dict) -> float:
  return statistics.median(entry["times_s"])


def compare(ours: dict, ours_res: dict, theirs: dict, theirs_res: dict, inputs: dict) -> dict:
  """Speed-ups (against TransformerLens's faster variant) and max differences per task."""
  t, u = theirs["times"], ours["times"]
  fastest = lambda *keys: min(median(t[k]) for k in keys)
  rows = {
    "forward": (median(u["forward"]), median(t["forward"])),
    "attention_maps": (
      median(u["attention_maps"]),
      fastest("attention_maps_docs", "attention_maps_lean"),
    ),
    "ablation_sweep": (
      median(u["ablation_sweep"]),
      fastest("ablation_sweep_docs", "ablation_sweep_lean"),
    ),
    "patching_sweep": (
      median(u["patching_sweep"]),
      fastest("patching_sweep_docs", "patching_sweep_lean"),
    ),
    "attribution": (median(u["attribution"]), median(t["attribution"])),
  }
  clean_m, corrupted_m = ours_res["patching_clean_corrupted"]
  diffs = {
    "attention_maps": float(
      np.abs(ours_res["attention_maps"] - theirs_res["attention_maps"]).max()
    ),
    "ablation": float(
      max(
        np.abs(ours_res["ablation"] - theirs_res[f"ablation_{v}"]).max() for v in ("docs", "lean")
      )
    ),
    "ablation_baseline": float(
      abs(ours_res["ablation_baseline"] - theirs_res["ablation_baseline"])
    ),
    "patching": float(
      max(
        np.abs(ours_res["patching"] - theirs_res[f"patching_{v}"]).max() for v in ("docs", "lean")
      )
    ),
    "patching_clean_corrupted": float(
      np.abs(ours_res["patching_clean_corrupted"] - theirs_res["patching_clean_corrupted"]).max()
    ),
    "attribution": float(
      np.abs((ours_res["attribution"] - corrupted_m) - theirs_res["attribution_delta"]).max()
    ),
  }
  scale = {
    "patching_effect_range": float(np.ptp(ours_res["patching"])),
    "clean_minus_corrupted": float(clean_m - corrupted_m),
  }
  return {
    "seconds": {k: {"bertjax": a, "transformer_lens": b} for k, (a, b) in rows.items()},
    "speedup": {k: b / a for k, (a, b) in rows.items()},
    "attribution_over_forward": statistics.median(
      a / f
      for a, f in zip(u["attribution_rounds"]["times_s"], u["attribution_rounds"]["forward_s"])
    ),
    "gradient_pass_over_forward": (
      (median(u["attribution"]) - median(u["capture_forward"])) / median(u["forward"])
    ),
    "attribution_after_sweeps_over_forward": (
      median(u["attribution_after_sweeps"]) / median(u["forward"])
    ),
    "max_abs_diff": diffs,
    "scale": scale,
  }


def _secs(seconds: float) -> str:
  """A time as the table shows it: milliseconds under a second (GPU passes), else seconds."""
  return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _table(r: dict, side: str, cmp: str, title: str, heads: int) -> list[str]:
  """One model's task table against one TransformerLens side."""
  s, tl, bj = r[cmp]["seconds"], r[side]["times"], r["bertjax"]["times"]
  d = r[cmp]["max_abs_diff"]
  lines = [
    (f"| task | bertjax | {title} (docs / lean) | speed-up | bertjax compile | max abs diff |"),
    "|---|---:|---:|---:|---:|---:|",
  ]
  rows = [
    ("one forward pass", "forward", None, "-"),
    ("(a) every attention map", "attention_maps", "attention_maps", f"{d['attention_maps']:.1e}"),
    (
      f"(b) {heads} single-head ablations + baseline",
      "ablation_sweep",
      "ablation_sweep",
      f"{d['ablation']:.1e}",
    ),
    (
      "(c) (layer, head) patching of head_out / hook_z",
      "patching_sweep",
      "patching_sweep",
      f"{d['patching']:.1e}",
    ),
    ("attribution patching, all heads", "attribution", None, f"{d['attribution']:.1e}"),
  ]
  for label, key, tl_key, diff in rows:
    theirs = (
      f"{_secs(median(tl[tl_key + '_docs']))} / {_secs(median(tl[tl_key + '_lean']))}"
      if tl_key
      else _secs(s[key]["transformer_lens"])
    )
    compile_s = max(bj[key]["first_s"] - median(bj[key]), 0.0)
    lines.append(
      f"| {label} | {_secs(s[key]['bertjax'])} | {theirs} | "
      f"**{r[cmp]['speedup'][key]:.2f}x** | {compile_s:.1f} s | {diff} |"
    )
  return lines


def markdown(report: dict) -> str:
  m, tli = report["machine"], report["tl_info"]
  cpu = (
    f"{m.get('cpu', '?')}, {m['cpus']} CPUs ({m['cpus_usable']} usable), ISA "
    f"{' '.join(m.get('isa_flags', [])) or '?'}"
  )
  flags = f"; XLA_FLAGS={m['xla_flags']}" if m.get("xla_flags") else ""
  if "accelerator" in m:  # both sides on the GPU; the CPU only drives them
    title = m["accelerator"]
    where = (
      f"{m['accelerator']} (host: {cpu}); jax {report['bertjax_info']['jax']} "
      f"(XLA:GPU, float32 dots at full precision{flags}), torch {tli['torch']} on "
      f"{tli.get('gpu')} (TF32 off)"
    )
  else:
    title = "CPU"
    where = (
      f"{cpu}; jax {report['bertjax_info']['jax']} (XLA:CPU, {m['cpus_usable']} threads"
      f"{flags}), "
      f"torch {tli['torch']} ({tli['torch_threads']} threads)"
    )
  lines = [
    f"# bertjax vs TransformerLens HookedEncoder ({title})",
    "",
    (
      f"{where}, transformer-lens {tli['transformer_lens']}, transformers "
      f"{tli['transformers']}. Batch {report['batch']} x {report['seq']}, float32, random "
      "weights shared by both sides (LayerNorms and biases randomised). Medians; compile "
      "(bertjax) and first-call time apart; TransformerLens's faster variant (docs / lean) "
      "is the reference."
    ),
    "",
  ]
  for name, r in report["models"].items():
    shape = r["shape"]
    heads = shape["num_hidden_layers"] * shape["num_attention_heads"]
    lines += [
      (
        f"## {name} ({shape['num_hidden_layers']} x {shape['hidden_size']}, "
        f"{shape['num_attention_heads']} heads)"
      ),
      "",
    ]
    lines += _table(r, "transformer_lens", "compare", "TransformerLens HookedEncoder", heads)
    if "compare_bridge" in r:
      version = report["bridge_info"]["transformer_lens"]
      lines += [
        "",
        (
          f"Against TransformerLens {version}'s `TransformerBridge` (its hooks "
          "inside transformers' `BertForMaskedLM`), the same bertjax times:"
        ),
        "",
      ]
      lines += _table(r, "transformer_bridge", "compare_bridge", "TransformerBridge", heads)
    agree, info = r["bertjax"]["info"]["agreement"], r["bertjax"]["info"]
    lines += [
      "",
      (
        f"Attribution patching for all {heads} heads takes "
        f"**{r['compare']['attribution_over_forward']:.2f}x** one bertjax forward "
        "pass (the median ratio over rounds of interleaved calls: a source forward, "
        "a destination forward and one backward; "
        f"{r['compare']['gradient_pass_over_forward']:.2f}x without the clean run, "
        "which exact patching needs as well; timed again after the sweeps, in the "
        "same process: "
        f"{r['compare']['attribution_after_sweeps_over_forward']:.2f}x); against "
        f"exact patching (c): Pearson {agree['pearson']:.3f}, Spearman "
        f"{agree['spearman']:.3f} over the normalised values. Metric clean "
        f"{info['clean']:.4f}, corrupted {info['corrupted']:.4f}; patching effects "
        f"span {r['compare']['scale']['patching_effect_range']:.2e}."
      ),
      "",
    ]
  return "\n".join(lines)


def main(argv=None) -> dict:
  args = parse_args(argv)
  if args.tl_peer is not None:
    tl_peer(args.tl_peer)
    return {}
  if not args.tl_python.exists():
    raise SystemExit(
      f"the TransformerLens side environment {args.tl_python} is missing; set "
      "it up with: python3 -m venv .venv/tl && .venv/tl/bin/pip install "
      "torch==2.13.0 transformer-lens==3.9.0"
    )
  import jax

  from bertjax import timing

  backend = jax.default_backend()
  if (backend == "gpu") != (args.device == "cuda") or backend not in ("cpu", "gpu"):
    # Both sides on the same kind of device, or the comparison means nothing.
    raise SystemExit(
      f"--device {args.device} but JAX runs on {backend!r}: use --device cuda "
      "with a CUDA jax, or --device cpu with JAX_PLATFORMS=cpu"
    )
  report = {
    "machine": timing.machine(),
    "batch": args.batch,
    "seq": args.seq,
    "models": {},
    "repeats": args.repeats,
    "sweep_repeats": args.sweep_repeats,
  }
  start = time.perf_counter()
  for name in args.models.split(","):
    if name not in SHAPES:
      raise SystemExit(f"--models entry {name!r} must be one of {sorted(SHAPES)}")
    with tempfile.TemporaryDirectory() as tmp:
      work = pathlib.Path(tmp)
      make_model(SHAPES[name], work / "model")
      inputs = common.make_inputs(args.batch, args.seq)
      np.savez(work / "inputs.npz", **inputs)
      ours, ours_res = run_bertjax(work / "model", inputs, args)
      print(f"[{name}] bertjax done at {time.perf_counter() - start:.0f} s", flush=True)
      theirs, theirs_res = run_tl(args, work / "model", work / "inputs.npz", work)
      print(f"[{name}] TransformerLens done at {time.perf_counter() - start:.0f} s", flush=True)
      report["models"][name] = {
        "shape": SHAPES[name],
        "bertjax": ours,
        "transformer_lens": theirs,
        "compare": compare(ours, ours_res, theirs, theirs_res, inputs),
      }
      report["bertjax_info"], report["tl_info"] = ours["info"], theirs["info"]
      write_report(args, report, start)  # kept should a later side fail or be stopped
      if args.bridge_python.exists():
        bridge, bridge_res = run_tl(args, work / "model", work / "inputs.npz", work, "bridge")
        print(f"[{name}] TransformerBridge done at {time.perf_counter() - start:.0f} s", flush=True)
        report["models"][name].update(
          transformer_bridge=bridge,
          compare_bridge=compare(ours, ours_res, bridge, bridge_res, inputs),
        )
        report["bridge_info"] = bridge["info"]
        write_report(args, report, start)
      else:
        print(
          f"[{name}] TransformerBridge skipped: {args.bridge_python} is absent (python3 -m "
          "venv .venv/tl4 && .venv/tl4/bin/pip install torch==2.13.0 "
          "transformer-lens==4.3.0)",
          flush=True,
        )
  print(write_report(args, report, start).read_text())
  return report


def write_report(args, report: dict, start: float) -> pathlib.Path:
  """Writes (or rewrites) the JSON and Markdown of what is measured so far; the Markdown's
  path."""
  report["wall_s"] = time.perf_counter() - start
  args.out.mkdir(parents=True, exist_ok=True)
  stem = "bench_tl_smoke" if args.smoke else "bench_tl"
  if "accelerator" in report["machine"]:
    stem += "_gpu_" + common.slug(report["machine"]["accelerator"])
  (args.out / f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
  page = args.out / f"{stem}.md"
  page.write_text(markdown(report))
  return page


if __name__ == "__main__":
  main()
