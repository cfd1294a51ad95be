"""The CUDA plugin's environment settings, declared once with their help text."""

from __future__ import annotations

from tensorplug.settings import Setting, _flag

__all__ = ["CUBLAS", "GRAPHS"]

GRAPHS: Setting[bool] = Setting(
    "TENSORPLUG_CUDA_GRAPHS",
    True,
    _flag,
    "0 to never replay graphs as captured CUDA graphs, neither graph plans nor the "
    "graphs graph_compute has seen before (every compute then launches each kernel); "
    "graphs with cuBLAS nodes are never captured either way.",
    example="0",
)

CUBLAS: Setting[bool] = Setting(
    "TENSORPLUG_CUDA_CUBLAS",
    True,
    _flag,
    "0 to compute every mul_mat with the shared kernels instead of cuBLAS (through "
    "cupy.matmul) for batches of many tokens.",
    example="0",
)
