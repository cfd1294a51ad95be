"""tensorplug's CPU backend, registered through the ``tensorplug.backends`` entry point.

This module is what discovery imports for every candidate, so it holds only the cheap
:data:`registration`: the kernels, numba and threadpoolctl load when the registry
initialises the backend (``tensorplug_cpu.device:create_reg``).
"""

from __future__ import annotations

import importlib.util

from tensorplug.registration import Registration

__all__ = ["registration"]


def _score() -> tuple[int, str]:
    """How well this machine runs the backend, judged by what numpy detected at run time.

    numpy dispatches its loops on the SIMD features it finds on this very CPU, so its
    own report is the honest measure: 0 when numpy cannot be imported (its compiled
    baseline is missing, or it is not installed), more for wider vectors, and more again
    when numba is installed for the fused quantized kernels.
    """
    try:
        import numpy as np
    except Exception as e:  # an import failure is exactly "cannot run here"
        return 0, f"numpy cannot be imported ({type(e).__name__}: {e}); pip install numpy"
    from .system import simd_features

    features = simd_features()
    have = [name for name, on in features.items() if on]
    score, notes = 16, [f"numpy {np.__version__}"]
    if (features.get("AVX2") and features.get("FMA3")) or features.get("ASIMD"):
        score += 4
    if features.get("AVX512F") or features.get("SVE"):
        score += 8
    simd = [f for f in ("AVX512F", "AVX2", "FMA3", "F16C", "ASIMD", "SVE") if f in have]
    notes.append("SIMD " + (" ".join(simd) if simd else "baseline only"))
    if importlib.util.find_spec("numba") is not None:
        score += 8
        notes.append("numba JIT for quantized kernels")
    else:
        notes.append("no numba (pip install -e 'plugins/cpu[numba]' for faster quantized matvec)")
    return score, "; ".join(notes)


registration = Registration(
    name="CPU",
    api_version=(1, 4),
    init="tensorplug_cpu.device:create_reg",
    score=_score,
    description="numpy/BLAS kernels for every tensorplug op, with graph plans",
)
