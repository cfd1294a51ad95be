"""The CUDA plugin's own program text and options compile with NVRTC — no GPU needed.

The kernel gate (``python -m tensorplug_kernels check``) compiles the library's CUDA
text for every architecture. This compiles exactly what the plugin hands to
``cupy.RawModule`` — its rendered text, its options, and the two options cupy adds
itself (``-arch=sm_XX`` from the GPU, ``--device-as-default-execution-space``) — for the
GPU ``scripts/gpu-check.sh`` targets first (H100/H200), through cupy's NVRTC binding,
which needs no driver. It stops at PTX (``compute_90``; cupy asks for ``sm_90``, whose
last step, ptxas, the kernel gate already runs on the same text), halving the time.
It proves the source compiles, not that it runs.
"""

from __future__ import annotations

import os

import pytest

from tensorplug_cuda.device import DEFAULT_WG
from tensorplug_cuda.program import compile_options
from tensorplug_kernels import kernel_abis, render

pytestmark = pytest.mark.slow

#: What cupy's compile_using_nvrtc adds to the options (cupy/cuda/compiler.py), with
#: the architecture as PTX rather than sm_90 (see above).
CUPY_ADDS = ("-arch=compute_90", "--device-as-default-execution-space")


def test_the_plugins_program_compiles_with_nvrtc_as_cupy_would() -> None:
    try:
        from cupy.cuda import nvrtc

        nvrtc.getVersion()
    except Exception as e:  # cupy or the NVRTC library missing
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            raise AssertionError(f"CI=true but NVRTC is unavailable: {e}") from e
        pytest.skip(f'NVRTC is not available ({e}); pip install -e "plugins/kernels[check]"')
    options = [*compile_options(DEFAULT_WG), *CUPY_ADDS]
    prog = nvrtc.createProgram(render("cuda").text, "tensorplug_kernels.cu", [], [])
    try:
        nvrtc.compileProgram(prog, options)
        log = nvrtc.getProgramLog(prog)
        ptx = nvrtc.getPTX(prog)
    finally:
        nvrtc.destroyProgram(prog)
    assert "warning" not in log and "error" not in log, log
    missing = [k for k in kernel_abis() if f".entry {k}(".encode() not in ptx]
    assert missing == []
