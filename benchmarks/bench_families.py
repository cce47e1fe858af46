"""Forward pass on the CPU by family: bertjax vs KerasHub (JAX backend) vs transformers PyTorch.

Run: ./run.sh bench bench_families           (writes benchmarks/results/bench_families.{json,md})
     ./run.sh bench bench_families --smoke   (tiny shapes, one round; checks the script runs)

BERT-base-shaped (12 x 768, vocab 30522) and RoBERTa-base-shaped (12 x 768, vocab 50265,
514 positions) models with random weights, float32, batches of 8 x 128 and 32 x 128
tokens (no padding), side by side in one run:

* bertjax: `jax.jit` of `bertjax.forward` (the model's own config; XLA attention);
* KerasHub with the JAX backend: `keras_hub.models.BertBackbone` / `RobertaBackbone`,
  random init at the same sizes, timed as `jax.jit` of `stateless_call`. KerasHub's
  pins clash with ours, so it runs in its own interpreter (`.venv/keras`, made by
  `python3 -m venv .venv/keras && .venv/keras/bin/pip install "keras-hub==0.32.*"
  jax==0.10.2 jaxlib==0.10.2`; `--keras-python` or `$BERTJAX_KERAS_PYTHON` point
  elsewhere) as a worker process that times one call per request, so its calls
  interleave with the others'; without that interpreter the column is skipped and
  the reason printed and recorded;
* transformers PyTorch: `BertModel` / `RobertaModel` with `attn_implementation="sdpa"`
  under `torch.inference_mode`, loaded from bertjax's `to_hf` export of the same random
  weights (so the two must agree; the difference is recorded).

Every implementation is called once first (its compile time, or PyTorch's first call, is
reported apart), then warmed up; the timed rounds interleave the implementations, one
call each per round in a rotating order, so machine noise falls on all of them alike.
Results name the CPU model, its ISA flags (avx2, avx512*, amx*) and the thread counts.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import common
import jax.numpy as jnp
import numpy as np

import bertjax
from bertjax import timing, xla_options

REPO, RESULTS = common.REPO, common.RESULTS
KERAS_PYTHON = REPO / ".venv" / "keras" / "bin" / "python"
IMPLS = ("bertjax", "keras_hub", "torch_sdpa")

# model name -> (bertjax preset, sizes; KerasHub class).
MODELS = {
  "bert-base": ("bert-base", {}, "BertBackbone"),
  "roberta-base": ("roberta-base", {}, "RobertaBackbone"),
}
SMOKE_SIZES = dict(
  hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=1000
)

# The KerasHub worker, run by the side interpreter: one JSON request per stdin line, one JSON
# answer per stdout line. "setup" builds and compiles a model; "run" times one forward call.
_KERAS_WORKER = r"""
import json, os, sys, time
os.environ.setdefault("KERAS_BACKEND", "jax")
import jax, numpy as np, keras, keras_hub
state = {}
def answer(obj):
  sys.stdout.write(json.dumps(obj) + "\n"); sys.stdout.flush()
answer({"ready": True, "keras": keras.__version__, "keras_hub": keras_hub.__version__,
        "jax": jax.__version__, "backend": keras.backend.backend(),
        "devices": [d.device_kind for d in jax.devices()]})
for line in sys.stdin:
  req = json.loads(line)
  if req["cmd"] == "quit":
    break
  if req["cmd"] == "setup":
    s = req["sizes"]
    keras.utils.set_random_seed(0)
    cls = getattr(keras_hub.models, req["cls"])
    model = cls(vocabulary_size=s["vocab_size"], num_layers=s["num_hidden_layers"],
                num_heads=s["num_attention_heads"], hidden_dim=s["hidden_size"],
                intermediate_dim=s["intermediate_size"], dropout=0.0,
                max_sequence_length=s["max_sequence_length"], dtype="float32")
    ids = np.asarray(req["ids"], np.int32)
    inputs = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    if "segment_ids" in [i.name for i in model.inputs]:
      inputs["segment_ids"] = np.zeros_like(ids)
    trainable = [v.value for v in model.trainable_variables]
    frozen = [v.value for v in model.non_trainable_variables]
    def seq_out(t, f, x):  # BertBackbone returns a dict, RobertaBackbone the sequence
      out = model.stateless_call(t, f, x)[0]
      return out["sequence_output"] if isinstance(out, dict) else out
    fwd = jax.jit(seq_out)
    t0 = time.perf_counter()
    jax.block_until_ready(fwd(trainable, frozen, inputs))
    compile_s = time.perf_counter() - t0
    state["call"] = lambda: jax.block_until_ready(fwd(trainable, frozen, inputs))
    answer({"compile_s": compile_s, "params": int(model.count_params())})
  elif req["cmd"] == "run":
    t0 = time.perf_counter()
    state["call"]()
    answer({"seconds": time.perf_counter() - t0})
"""


class KerasPeer:
  """The KerasHub worker process: `setup(...)` a model, then `call()` times one forward pass."""

  def __init__(self, python: pathlib.Path, xla_flags: str):
    env = {
      **os.environ,
      "KERAS_BACKEND": "jax",
      "TF_CPP_MIN_LOG_LEVEL": "3",
      "XLA_FLAGS": xla_flags,
    }
    env.pop("PYTHONPATH", None)
    self.proc = subprocess.Popen(
      [str(python), "-c", _KERAS_WORKER],
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      env=env,
      cwd=tempfile.gettempdir(),
    )
    self.info = self._read()

  def _read(self) -> dict:
    line = self.proc.stdout.readline()
    if not line:
      err = self.proc.stderr.read()[-3000:]
      raise RuntimeError(f"the KerasHub worker exited (status {self.proc.wait()}):\n{err}")
    return json.loads(line)

  def request(self, **req) -> dict:
    self.proc.stdin.write(json.dumps(req) + "\n")
    self.proc.stdin.flush()
    return self._read()

  def close(self) -> None:
    if self.proc.poll() is None:
      self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
      self.proc.stdin.flush()
      self.proc.wait(timeout=60)


def _config(name: str, smoke: bool) -> bertjax.BertConfig:
  preset, sizes, _ = MODELS[name]
  return bertjax.BertConfig.preset(preset, **sizes, **(SMOKE_SIZES if smoke else {}))


def _sizes(config: bertjax.BertConfig) -> dict:
  """The sizes both libraries take; the sequence length is the usable one (RoBERTa: 512 of
  514 positions, KerasHub adding the offset itself)."""
  sizes = {
    k: getattr(config, k)
    for k in (
      "vocab_size",
      "hidden_size",
      "num_hidden_layers",
      "num_attention_heads",
      "intermediate_size",
    )
  }
  return {**sizes, "max_sequence_length": config.max_length}


def bench_case(
  name: str, batch: int, seq: int, args, keras: KerasPeer | None, keras_reason: str | None
) -> dict:
  """Times one model at one shape with every implementation; returns its row."""
  import torch
  import transformers

  config = _config(name, args.smoke)
  params = bertjax.init(config, 0)
  rng = np.random.default_rng(0)
  # Ids clear of the special tokens, as a real batch would be; no padding.
  ids = rng.integers(5, config.vocab_size, (batch, seq)).astype(np.int32)
  mask = np.ones_like(ids)
  row = {
    "model": name,
    "batch": batch,
    "seq": seq,
    "tokens": batch * seq,
    "family": config.model_type,
    "sizes": _sizes(config),
  }

  fwd = lambda p, x, m: bertjax.forward(p, config, x, m).last_hidden_state
  ours, compile_s = timing.compile_ahead(fwd, params, jnp.asarray(ids), jnp.asarray(mask))
  calls = {"bertjax": ours}
  info = {"bertjax": {"compile_s": compile_s, "params": bertjax.count_params(params)}}

  with tempfile.TemporaryDirectory() as tmp:
    bertjax.to_hf(config, params, tmp)
    cls = getattr(transformers, "BertModel" if config.model_type == "bert" else "RobertaModel")
    model = cls.from_pretrained(tmp, attn_implementation="sdpa").eval()
  ids_t, mask_t = torch.tensor(ids).long(), torch.tensor(mask).long()

  def torch_call():
    with torch.inference_mode():
      return model(input_ids=ids_t, attention_mask=mask_t).last_hidden_state

  info["torch_sdpa"] = {"params": sum(p.numel() for p in model.parameters())}
  calls["torch_sdpa"] = torch_call

  if keras is not None:
    got = keras.request(cmd="setup", cls=MODELS[name][2], sizes=_sizes(config), ids=ids.tolist())
    info["keras_hub"] = {"compile_s": got["compile_s"], "params": got["params"]}
    calls["keras_hub"] = lambda: keras.request(cmd="run")["seconds"]
  else:
    row["keras_hub_skipped"] = keras_reason

  # The worker times its own call; the pipe's round trip is not the model's.
  outputs = {}
  times = timing.interleaved(
    calls,
    args.rounds,
    warmup=args.warmup,
    own_clock=("keras_hub",) if "keras_hub" in calls else (),
    outputs=outputs,
  )
  return common.against_torch(row, times, outputs, f"{name:>12} {batch:>3} x {seq}", **info)


def markdown(r: dict) -> str:
  m = r["machine"]
  isa = ", ".join(m["isa_flags"]) or "none of avx2/avx512/amx"
  fms = "/".join(str(x) for x in m.get("cpu_family_model_stepping", ()) if x is not None)
  lines = [
    f"Forward pass by family on the CPU, float32, random weights, no padding: "
    f"{m['cpu']}{f' (family/model/stepping {fms})' if fms else ''}, "
    f"{m['cpus_usable']} usable of {m['cpus']} CPUs; ISA: {isa}; "
    f"torch threads {m['torch_threads']} (inter-op {m['torch_interop_threads']}); "
    f"jax {m['jax']}, torch {m['torch']}, transformers {r['versions']['transformers']}"
    + (
      f", KerasHub {r['versions']['keras_hub']} (keras {r['versions']['keras']}, "
      f"jax {r['versions']['keras_jax']})"
      if "keras_hub" in r["versions"]
      else ""
    )
    + (
      f"; KerasHub's XLA_FLAGS: `{r['versions']['keras_xla_flags'] or '(none)'}` "
      f"({'the same as bertjax' if r['versions']['keras_xla'] == 'same' else 'XLA defaults'})"
      if "keras_xla" in r["versions"]
      else ""
    )
    + f". Medians of {r['rounds']} interleaved rounds after {r['warmup']} warm-up "
    f"calls; compile (or first call) apart.",
    "",
  ]
  if r.get("keras_hub_skipped"):
    lines += [f"KerasHub skipped: {r['keras_hub_skipped']}", ""]
  lines += [
    (
      "| model | batch x seq | bertjax | KerasHub (JAX, jit stateless_call) | "
      "transformers PyTorch (sdpa) | bertjax vs KerasHub | bertjax vs PyTorch | "
      "compile: bertjax / KerasHub |"
    ),
    "|---|---|---|---|---|---|---|---|",
  ]
  for row in r["rows"]:
    ms = lambda n, row=row: f"{row[n]['median_s'] * 1e3:.0f} ms" if n in row else "-"
    kh = row.get("bertjax_speedup_vs_keras_hub")
    kh_compile = f"{row['keras_hub']['compile_s']:.2f} s" if "keras_hub" in row else "-"
    lines.append(
      f"| {row['model']} | {row['batch']} x {row['seq']} | {ms('bertjax')} | "
      f"{ms('keras_hub')} | {ms('torch_sdpa')} | {f'{kh:.2f}x' if kh else '-'} | "
      f"{row['bertjax_speedup_vs_torch_sdpa']:.2f}x | "
      f"{row['bertjax']['compile_s']:.2f} s / {kh_compile} |"
    )
  lines += [
    "",
    "Speed-ups are the other's median time over bertjax's (> 1: bertjax is "
    "faster). Parameters: bertjax and PyTorch load the same weights; KerasHub's "
    "BertBackbone has as many, its RobertaBackbone a little fewer (no pooler, no "
    "token-type row, 512 positions instead of 514). Max |bertjax - PyTorch| on the "
    "same weights: "
    + ", ".join(
      f"{row['model']} {row['batch']}x{row['seq']} {row['max_abs_diff_bertjax_vs_torch']:.1e}"
      for row in r["rows"]
    )
    + ".",
  ]
  return "\n".join(lines) + "\n"


def keras_xla_flags(mode: str) -> str:
  """XLA_FLAGS for the KerasHub process: bertjax's own, or without bertjax's CPU options."""
  flags = os.environ.get("XLA_FLAGS", "")
  return flags if mode == "same" else xla_options.without_cpu_options(flags)


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(
    description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
  )
  parser.add_argument(
    "--models", default="bert-base,roberta-base", help=f"comma-separated, of {sorted(MODELS)}"
  )
  parser.add_argument("--batches", default="8,32", help="comma-separated batch sizes")
  parser.add_argument("--seq", type=int, default=128)
  parser.add_argument("--rounds", type=int, default=10, help="timed rounds per implementation")
  parser.add_argument("--warmup", type=int, default=2, help="untimed calls after the first")
  parser.add_argument(
    "--keras-python",
    type=pathlib.Path,
    default=pathlib.Path(os.environ.get("BERTJAX_KERAS_PYTHON", KERAS_PYTHON)),
    help="the interpreter with keras-hub (and jax) installed",
  )
  parser.add_argument(
    "--keras-xla",
    choices=("same", "default"),
    default="same",
    help="XLA options of the KerasHub process: 'same' as bertjax's (its "
    "XLA_FLAGS, which `import bertjax` extends, see "
    "bertjax/xla_options.py), or 'default': XLA's own for those "
    "options, as a KerasHub user gets them (results then go to "
    "bench_families_keras_xla_default.*)",
  )
  parser.add_argument(
    "--smoke", action="store_true", help="tiny models (2 x 64), batches 2 and 4 x 16, one round"
  )
  parser.add_argument(
    "--out",
    type=pathlib.Path,
    default=None,
    help="where bench_families.{json,md} go (default: benchmarks/results; "
    "--smoke writes only when given, as bench_families_smoke.*)",
  )
  args = parser.parse_args(argv)
  models = args.models.split(",")
  unknown = [m for m in models if m not in MODELS]
  if unknown:
    parser.error(f"--models {unknown} unknown; expected some of {sorted(MODELS)}")
  batches = [int(b) for b in args.batches.split(",")]
  if args.smoke:
    batches, args.seq, args.rounds, args.warmup = [2, 4], 16, 1, 1
  out = args.out if args.out is not None or args.smoke else RESULTS
  if args.smoke and out is not None and out.resolve() == RESULTS.resolve():
    parser.error(f"--smoke results are not measurements: they must not go to {RESULTS}")

  import torch
  import transformers

  transformers.utils.logging.disable_progress_bar()
  keras, reason = None, None
  if not args.keras_python.exists():
    reason = (
      f"no KerasHub interpreter at {args.keras_python} (python3 -m venv .venv/keras && "
      ".venv/keras/bin/pip install 'keras-hub==0.32.*' jax==0.10.2 jaxlib==0.10.2)"
    )
  else:
    try:
      keras = KerasPeer(args.keras_python, keras_xla_flags(args.keras_xla))
    except (RuntimeError, OSError, json.JSONDecodeError) as e:
      reason = f"the KerasHub worker did not start: {e}"
  if reason:
    print(f"KerasHub column skipped: {reason}", file=sys.stderr, flush=True)
  versions = {"transformers": transformers.__version__, "torch": torch.__version__}
  if keras is not None:
    versions.update(
      keras_hub=keras.info["keras_hub"],
      keras=keras.info["keras"],
      keras_jax=keras.info["jax"],
      keras_backend=keras.info["backend"],
      keras_xla=args.keras_xla,
      keras_xla_flags=keras_xla_flags(args.keras_xla),
    )
  t_start = time.perf_counter()
  try:
    rows = [
      bench_case(name, batch, args.seq, args, keras, reason) for name in models for batch in batches
    ]
  finally:
    if keras is not None:
      keras.close()
  result = {
    "benchmark": "bench_families",
    "smoke": args.smoke,
    "machine": timing.machine(torch=True),
    "versions": versions,
    "dtype": "float32",
    "rounds": args.rounds,
    "warmup": args.warmup,
    "keras_hub_skipped": reason,
    "seconds": time.perf_counter() - t_start,
    "rows": rows,
  }
  print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=2))
  print(markdown(result))
  if out is not None:
    stem = "bench_families_smoke" if args.smoke else "bench_families"
    if args.keras_xla == "default":
      stem += "_keras_xla_default"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"{stem}.md").write_text(markdown(result))
  return result


if __name__ == "__main__":
  main()
