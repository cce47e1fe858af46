#!/usr/bin/env bash
# bertjax entry point. Usage: ./run.sh {setup|demo|test|bench|report|pretrain|finetune|experiment} [args]
#   ./run.sh demo        set up, then run the main job (a BERTology report on all-MiniLM-L6-v2)
#   ./run.sh test        set up, then run the test suite (pytest; extra args go to pytest)
#   ./run.sh bench NAME  run benchmarks/NAME.py (e.g. bench_forward)
set -euo pipefail
cd "$(dirname "$0")"
VENV=${BERTJAX_VENV:-.venv}
PY="$VENV/bin/python"

setup() {
  if [ ! -x "$PY" ]; then
    python3 -m venv "$VENV"
  fi
  # Reinstall only when the package metadata changed.
  local stamp="$VENV/.bertjax-installed"
  local want
  want=$(sha256sum pyproject.toml | cut -d' ' -f1)
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "[setup] installing bertjax and its dependencies into $VENV ..." >&2
    "$PY" -m pip install -q --upgrade pip >&2
    # The CPU build of torch first, pinned, so nothing pulls the CUDA wheels.
    "$PY" -m pip install -q "torch==2.13.0" >&2
    "$PY" -m pip install -q -e ".[hf,data,plots,models,dev]" >&2
    # transformers 4.57 (the last with head pruning and Flax BERT) beside it, for
    # the pruned-checkpoint test and the Flax peer benchmark; not on sys.path.
    "$PY" -m pip install -q --no-deps --upgrade --target "$VENV/hf4" \
      "transformers==4.57.1" "huggingface_hub==0.36.0" "tokenizers==0.22.1" >&2
    echo "$want" > "$stamp"
  fi
  export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
}

cmd=${1:-help}
shift || true
case "$cmd" in
  setup) setup ;;
  test) setup; exec "$PY" -m pytest -q -n "${BERTJAX_TEST_WORKERS:-2}" "$@" ;;
  demo) setup; exec "$PY" -m bertjax.cli report "$@" ;;
  report|pretrain|finetune) setup; exec "$PY" -m bertjax.cli "$cmd" "$@" ;;
  bench) setup; name=${1:?usage: ./run.sh bench NAME}; shift; exec "$PY" "benchmarks/$name.py" "$@" ;;
  experiment) setup; name=${1:?usage: ./run.sh experiment NAME}; shift; exec "$PY" "experiments/$name.py" "$@" ;;
  help|-h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//' ;;
  *) echo "unknown command: $cmd (expected setup, demo, test, bench, report, pretrain, finetune, experiment)" >&2; exit 2 ;;
esac
