"""The types a KV cache is kept in: llama.cpp's ``-ctk``/``-ctv`` choices.

A module of its own so that the command line, the Python API's keywords and the model
name one list, without the command line importing the model's graph code to parse its
flags.
"""

from __future__ import annotations

from tensorplug.types import Type

__all__ = ["CACHE_TYPES"]

#: F16 (the default), the other floats, and the quantized types llama.cpp allows for a
#: cache (32-value blocks, which any head of a multiple of 32 values holds whole)
CACHE_TYPES: tuple[Type, ...] = (
    Type.F16, Type.F32, Type.BF16, Type.Q8_0, Type.Q4_0, Type.Q4_1, Type.IQ4_NL, Type.Q5_0,
    Type.Q5_1,
)  # fmt: skip
