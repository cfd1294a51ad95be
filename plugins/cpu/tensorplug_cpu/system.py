"""What this machine offers the CPU backend: its name, memory, SIMD and BLAS.

The CPU's features are asked in one place, here, from the two sources that matter:
numpy's run-time detection (:func:`simd_features`: what its loops dispatch on, and what
the plugin's score and ``get_features`` report) and what numba's LLVM compiles for
(:func:`kernel_features`: the host, unless numba's ``NUMBA_CPU_FEATURES`` or
``NUMBA_CPU_NAME=generic`` name another target; the IR kernels may use only
instructions LLVM will emit for it).
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorplug.host import host_memory

__all__ = [
    "AVX2_FEATURES",
    "KernelFeatures",
    "blas_info",
    "cpu_name",
    "features",
    "kernel_features",
    "llvm_cpu_name",
    "llvm_features",
    "memory",
    "numba_target_features",
    "simd_features",
]

_SIMD_SHOWN = (
    "SSE3", "SSSE3", "SSE41", "SSE42", "AVX", "F16C", "FMA3", "AVX2",
    "AVX512F", "AVX512BW", "AVX512_SPR", "ASIMD", "ASIMDHP", "SVE",
)  # fmt: skip


def cpu_name() -> str:
    """The processor's model name, as the OS reports it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def memory() -> tuple[int, int]:
    """``(available, total)`` bytes of system memory (0, 0 when it cannot be known)."""
    return host_memory()


def simd_features() -> dict[str, bool]:
    """The CPU features numpy detected at run time (what its loops really dispatch on)."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as found
    except ImportError:  # numpy < 2
        from numpy.core._multiarray_umath import __cpu_features__ as found  # type: ignore
    return dict(found)


def llvm_features() -> frozenset[str]:
    """The features LLVM, numba's compiler, enables for the code it builds (``"avx2"``,
    ``"f16c"``, …); empty when llvmlite is not installed or LLVM cannot tell, so that
    kernels take their portable form.

    numba compiles for ``NUMBA_CPU_FEATURES`` where it is set (with ``NUMBA_CPU_NAME=generic``
    alone: none), else for the host's features, and the IR kernels may use only what it
    compiles for. So setting ``NUMBA_CPU_FEATURES`` to another machine's list (an AVX2
    host's ``+avx2,+fma,+f16c,-avx512f,…``) builds and runs that machine's forms here: a
    numba cache for it, or its speed measured on this one."""
    return _enabled(numba_target_features())


def numba_target_features() -> str:
    """The feature list numba gives its compiler, as numba's configuration reads it
    (without importing numba): ``NUMBA_CPU_FEATURES``, none with ``NUMBA_CPU_NAME=generic``
    alone, else the host's as LLVM flattens them; empty where llvmlite is not installed
    or LLVM cannot tell."""
    given = os.environ.get("NUMBA_CPU_FEATURES")
    if given is not None:
        return given
    if os.environ.get("NUMBA_CPU_NAME", "").lower() == "generic":
        return ""
    try:
        from llvmlite import binding
    except ImportError:
        return ""
    try:
        return str(binding.get_host_cpu_features().flatten())
    except RuntimeError:  # features unknown on this host
        return ""


def llvm_cpu_name() -> str:
    """The processor LLVM compiles numba's code for: ``NUMBA_CPU_NAME`` where it is set,
    else the host's as LLVM names it (``"znver4"``, ``"emeraldrapids"``); ``"generic"``
    when llvmlite is not installed."""
    given = os.environ.get("NUMBA_CPU_NAME")
    if given:
        return given.lower()
    try:
        from llvmlite import binding
    except ImportError:
        return "generic"
    return str(binding.get_host_cpu_name())


def _enabled(flat: str) -> frozenset[str]:
    return frozenset(f.strip()[1:] for f in flat.split(",") if f.strip().startswith("+"))


#: an AVX2 host's features as ``NUMBA_CPU_FEATURES`` takes them (Haswell to Zen 3: no
#: AVX-512, no VNNI): set on an AVX-512 machine, the kernels compile that host's forms
AVX2_FEATURES = "+avx,+avx2,+fma,+f16c,+bmi2,-avx512f,-avx512vl,-avx512vnni,-avxvnni"

#: instruction levels of the IR kernels, best first (:attr:`KernelFeatures.level`)
LEVELS = ("vnni", "avx2", "portable")


@dataclass(frozen=True)
class KernelFeatures:
    """What the numba IR kernels compile for: each flag picks an instruction form."""

    #: ``vpmaddubsw``/``vpmaddwd`` integer dots, ``vphaddw`` folds
    avx2: bool = False
    #: ``vcvtph2ps``/``vcvtps2ph`` for f16 scales and values (else an f16 → f32 table)
    f16c: bool = False
    #: ``vpdpbusd`` on 256-bit vectors: AVX512-VNNI with AVX512VL, or AVX-VNNI
    vnni: bool = False
    #: 32 vector registers (AVX-512): room for eight activation rows of a repacked tile
    regs32: bool = False
    #: an AMD Zen core (LLVM's target ``znver*``), where some repacked tiles are faster
    #: eight activation rows high than on Intel's cores (:func:`._numba_repack.tile_rows`)
    zen: bool = False

    @property
    def level(self) -> str:
        """The best of :data:`LEVELS` these features reach."""
        return "vnni" if self.vnni else "avx2" if self.avx2 else "portable"


@functools.cache
def kernel_features() -> KernelFeatures:
    """The :class:`KernelFeatures` of numba's compile target (:func:`llvm_features`);
    asked once per process (numba's disk cache keys compiled code by that target too)."""
    found = llvm_features()
    vnni = {"avx512vnni", "avx512vl"} <= found or "avxvnni" in found
    return KernelFeatures(avx2="avx2" in found, f16c="f16c" in found, vnni=vnni,
                          regs32="avx512f" in found,
                          zen=llvm_cpu_name().startswith("znver"))  # fmt: skip


def blas_info() -> list[dict[str, Any]]:
    """threadpoolctl's description of the BLAS libraries numpy loaded."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    return [i for i in threadpool_info() if i.get("user_api") == "blas"]


def features(jit_status: str) -> dict[str, str]:
    """``get_features``: ggml-style name → value pairs worth showing about this CPU."""
    out = {"CPU": cpu_name(), "numpy": np.__version__}
    blas = blas_info()
    if blas:
        b = blas[0]
        out["BLAS"] = f"{b.get('internal_api', '?')} {b.get('version') or ''}".strip()
        if b.get("architecture"):
            out["BLAS_ARCH"] = str(b["architecture"])
        out["BLAS_THREADS"] = str(b.get("num_threads", "?"))
    else:
        out["BLAS"] = "unknown (threadpoolctl not installed or no BLAS found)"
    simd = simd_features()
    out["SIMD"] = " ".join(f for f in _SIMD_SHOWN if simd.get(f)) or "baseline"
    for name in _SIMD_SHOWN:
        if simd.get(name):
            out[name] = "1"
    out["JIT"] = jit_status
    return out
