"""The CUDA plugin's environment settings, declared once with their help text."""

from __future__ import annotations

from tensorplug.settings import Setting, parse_flag

__all__ = ["CUBLAS", "CUBLAS_F16", "GRAPHS"]

GRAPHS: Setting[bool] = Setting(
    "TENSORPLUG_CUDA_GRAPHS",
    True,
    parse_flag,
    "0 to never replay graphs as captured CUDA graphs, neither graph plans nor the "
    "graphs graph_compute has seen before (every compute then launches each kernel); "
    "graphs with cuBLAS nodes are never captured either way.",
    example="0",
)

CUBLAS: Setting[bool] = Setting(
    "TENSORPLUG_CUDA_CUBLAS",
    True,
    parse_flag,
    "0 to compute every mul_mat with the shared kernels instead of cuBLAS (through "
    "cupy.matmul) for batches of many tokens.",
    example="0",
)

CUBLAS_F16: Setting[bool] = Setting(
    "TENSORPLUG_CUDA_CUBLAS_F16",
    True,
    parse_flag,
    "0 to keep cuBLAS products of F16 and quantized weights exact: the weights are "
    "converted to F32 and multiplied by SGEMM, instead of multiplying F16 weights by "
    "activations rounded to F16 on the tensor cores (F32 accumulation, F16 result, as "
    "ggml-cuda does).",
    example="0",
)
