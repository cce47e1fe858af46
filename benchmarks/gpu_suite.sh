#!/usr/bin/env bash
# The GPU checks of the modern kernels in one device call (on an H200 the compiled kernel tests
# alone took more than 3 minutes; the whole suite has not yet run to its end there):
#   OUT=/path bash benchmarks/gpu_suite.sh           (on the device: writes everything under $OUT)
#   OUT=/tmp/s bash benchmarks/gpu_suite.sh --smoke  (anywhere: tiny sizes, kernels in interpret
#                                                     mode on a CPU; checks the script runs)
# 0. the bf16 matmul peak, which stops the script below half the device's datasheet figure;
# 1. the compiled kernel tests (every variant: windows, position biases, grouped heads, dropout,
#    head masks; the fused-kernel sites); 2. fwd and fwd+bwd at 256 x 128 and 64 x 512, full and
#    padded, against cuDNN (and XLA, JAX's Pallas mha); 3. windowed attention at 8 x 8192
#    (w = 128; cuDNN refuses a window that is not causal), and DeBERTa-v3's disentangled
#    attention (fused against bertjax's XLA path; the kernel tests compile it too); 4. the
#    BERT-base train step's MFU with BERT's dropout (hidden 0.1 and attention 0.1) beside
#    hidden-only; 5. a ModernBERT-base train step; 6. EAP and EAP-IG against a forward pass and
#    their floor (BERT-base, 8 x 128).
# Each step's log is $OUT/<step>.log; a failed step is reported and the next one still runs.
# STEP_TIMEOUT (seconds, default 900) stops a step that runs longer, so one slow compile cannot
# spend a short device lease: the step is reported as failed and the next one runs.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to the folder for the results}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
SMOKE=()
TEST_FILTER=(-m "not slow")
if [ "${1:-}" = "--smoke" ]; then
  SMOKE=(--smoke)
  TEST_FILTER=(-k "window_tiles or refuse")
fi
# bertjax from this checkout (on PYTHONPATH below): the device machine has JAX and Flax but no
# install of this repository.
# XLA's GEMM autotuning stays on: with --xla_gpu_autotune_level=0 (jax 0.11.2, an H200,
# 2026-11-29) an 8192^3 bf16 product ran at 10.5 TFLOP/s against 789 with the default.
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0
step() {  # step NAME COMMAND...: runs it, its output in $OUT/NAME.log, and times it
  local name=$1 t=$SECONDS
  shift
  echo "== $name: $*"
  if timeout "${STEP_TIMEOUT:-900}" "$@" >"$OUT/$name.log" 2>&1; then
    echo "   ok in $((SECONDS - t)) s"
  else
    echo "   FAILED in $((SECONDS - t)) s; the end of $OUT/$name.log:"
    tail -n 15 "$OUT/$name.log" | sed 's/^/     /'
    status=1
  fi
}
step peak "$PY" benchmarks/bench_attention.py "${SMOKE[@]}" --peak-only --out "$OUT"
if [ $status -ne 0 ]; then  # a slow device would spend the lease on tables that mean nothing
  echo "stopped: the peak step failed (a bf16 matmul peak below half the datasheet figure, or an error: $OUT/peak.log)"
  exit 1
fi
step kernel_tests "$PY" -m pytest -q -p no:cacheprovider "${TEST_FILTER[@]}" \
  tests/test_kernel_variants.py
step attention "$PY" benchmarks/bench_attention.py "${SMOKE[@]}" --out "$OUT"
step attention_window "$PY" benchmarks/bench_attention.py "${SMOKE[@]}" --window 128 --out "$OUT"
step attention_deberta "$PY" benchmarks/bench_attention.py "${SMOKE[@]}" --deberta --out "$OUT"
step mfu_bert_base "$PY" benchmarks/bench_train_step.py "${SMOKE[@]}" --mfu --out "$OUT" \
  --variants pallas:threefry:256,pallas:threefry:256:attndrop
step mfu_modernbert_base "$PY" benchmarks/bench_train_step.py "${SMOKE[@]}" --mfu --out "$OUT" \
  --preset modernbert-base --seq 512 --variants pallas:threefry:64,xla:threefry:64
step edges "$PY" benchmarks/bench_edges.py "${SMOKE[@]}" --out "$OUT"
exit $status
