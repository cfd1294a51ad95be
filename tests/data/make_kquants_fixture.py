"""Writes kquants_ggml.npz: rows of awkward floats and the bytes ggml's reference
K-quant quantizers (``quantize_row_q*_K_ref``, reached through ``ggml_quantize_chunk``
without an importance matrix) make of them. gguf has no K-quant encoder, so these bytes
are what tests/core/test_kquants.py holds tensorplug's encoder to.

Regenerate (a developer step, not part of the tests) with ggml-python installed::

    pip install ggml-python && python tests/data/make_kquants_fixture.py
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

TYPES = {"Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
BLOCK_BYTES = {"Q2_K": 84, "Q3_K": 110, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}


def awkward_rows(n_rows: int = 48, width: int = 512, seed: int = 7) -> np.ndarray:
    """Gaussian rows at scales from 1e-6 to 1e3, and the cases the scale searches
    branch on: one sign, integers, zero and constant blocks, spikes, heavy tails."""
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(n_rows):
        r = rng.standard_normal(width) * 10.0 ** rng.uniform(-6, 3)
        kind = k % 8
        if kind == 1:
            r = np.abs(r)
        elif kind == 2:
            r = -np.abs(r)
        elif kind == 3:
            r[:256] = 0.0
            r[300:316] = 7.0
        elif kind == 4:
            r = np.round(r)
        elif kind == 5:
            r = r**3
        elif kind == 6:
            r[::7] = 0.0
        elif kind == 7:
            r[rng.integers(0, width, 5)] *= 1000.0
        rows.append(r.astype(np.float32))
    return np.stack(rows)


def ggml_bytes(x: np.ndarray, type_id: int, block_bytes: int) -> np.ndarray:
    import ggml

    rows, n = x.shape
    out = np.zeros(rows * n // 256 * block_bytes, np.uint8)
    ggml.ggml_quantize_init(type_id)
    ggml.ggml_quantize_chunk(
        type_id,
        x.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
        out.ctypes.data_as(ctypes.c_void_p),
        0,
        rows,
        n,
        None,
    )
    return out.reshape(rows, -1)


def main() -> None:
    x = np.ascontiguousarray(awkward_rows())
    arrays = {"x": x}
    for name, type_id in TYPES.items():
        arrays[name] = ggml_bytes(x, type_id, BLOCK_BYTES[name])
    np.savez_compressed(Path(__file__).with_name("kquants_ggml.npz"), **arrays)


if __name__ == "__main__":
    main()
