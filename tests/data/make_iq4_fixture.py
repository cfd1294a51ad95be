"""Writes iq4_ggml.npz: the awkward rows of make_kquants_fixture.py and the bytes ggml's
IQ4_NL and IQ4_XS quantizers make of them (``quantize_iq4_nl`` / ``quantize_iq4_xs``
without an importance matrix, reached through ``ggml_quantize_chunk``: what
llama.cpp's ``llama-quantize`` writes). gguf has no IQ4 encoder, so these bytes are
what tests/core/test_iquants.py holds tensorplug's encoder to.

ggml is the libggml-base shipped inside llama-cpp-python, called through ctypes.
Regenerate (a developer step, not part of the tests) with llama-cpp-python installed::

    python tests/data/make_iq4_fixture.py
"""

from __future__ import annotations

import ctypes
import importlib.util
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
TYPES = {"IQ4_NL": (20, 32, 18), "IQ4_XS": (23, 256, 136)}  # ggml id, block, bytes


def libggml() -> ctypes.CDLL:
    """llama-cpp-python's libggml-base, with ``ggml_quantize_chunk``'s signature."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        sys.exit("llama-cpp-python is not installed: pip install llama-cpp-python")
    lib = ctypes.CDLL(str(next((Path(spec.origin).parent / "lib").glob("libggml-base.so*"))))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                        ctypes.c_void_p]  # fmt: skip
    return lib


def ggml_bytes(lib: ctypes.CDLL, x: np.ndarray, name: str) -> np.ndarray:
    type_id, block, nbytes = TYPES[name]
    rows, n = x.shape
    out = np.zeros(rows * n // block * nbytes, np.uint8)
    lib.ggml_quantize_init(type_id)
    lib.ggml_quantize_chunk(type_id, x.ctypes.data, out.ctypes.data, 0, rows, n, None)
    return out.reshape(rows, -1)


def main() -> None:
    sys.path.insert(0, str(HERE))
    from make_kquants_fixture import awkward_rows

    lib = libggml()
    x = np.ascontiguousarray(awkward_rows())
    rng = np.random.default_rng(11)  # plus rows with many exact ties between levels
    ties = (np.round(rng.standard_normal((16, 512)) * 4) / 4).astype(np.float32)
    x = np.concatenate([x, ties])
    arrays = {"x": x, **{name: ggml_bytes(lib, x, name) for name in TYPES}}
    np.savez_compressed(HERE / "iq4_ggml.npz", **arrays)


if __name__ == "__main__":
    main()
