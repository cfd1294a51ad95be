"""Sizes and flags that the kernels are compiled with and the builders lay arrays out by.

A leaf: the kernels (``_numba_*.py``) and the builders (:mod:`.attention`,
:mod:`.dispatch`) both import from here and from nothing above them. It is one of the
sources the kernels' cache is keyed on (:data:`.kernel_identity.SOURCES`): a change here
is a change to the compiled code.
"""

from __future__ import annotations

from collections.abc import Mapping

from tensorplug.types import Type

__all__ = ["DOT_LANES", "FLASH_TILE_KV", "FLASH_TILE_Q", "HALF_PRODUCTS", "INT8_ROWS",
           "LANES_MASK", "NARROW_SCORES", "TINYBLAS_LANES"]  # fmt: skip

#: Lanes of ggml's ``ggml_vec_dot_f32`` on AVX-512: four registers of 16 floats.
DOT_LANES = 64
#: Lanes of tinyBLAS's AVX-512 float product (one ``__m512``), which ggml takes for the
#: weights·V product of two query rows or more (llamafile ``sgemm``, ``n ≥ 2``)
TINYBLAS_LANES = 16


#: The exact kernel's ``lanes`` (:func:`products`): the weights·V lanes in its low byte,
#: and two flags above them
LANES_MASK = 0xFF
#: The scores in tinyBLAS's order (16 fused lanes, then the 8-4-2-1 tree), as ggml's
#: F16 K·Q product of two query rows or more (llamafile ``sgemm`` on the F16 query)
NARROW_SCORES = 1 << 8
#: The query and the softmax's weights rounded to f16 before their products with K and
#: V, as an F16 cache makes ggml do (``vec_dot_type`` F16: ``mul_mat`` converts its
#: float32 operand to F16 first)
HALF_PRODUCTS = 1 << 9


#: Query rows from which ggml's flash attention takes its tiled way (``GGML_FA_TILE_Q``),
#: and the cells of one of its tiles (``GGML_FA_TILE_KV``)
FLASH_TILE_Q, FLASH_TILE_KV = 64, 64


#: Weight rows each integer kernel takes at a time (``rows{n}_dot_{type}`` of
#: :mod:`._numba_introw`); its keys are the types that have one. Q8_0 and Q6_K carry the
#: most bytes per value and the least unpacking: four rows streamed side by side come
#: from memory slower than one row read straight through, so their kernels take one.
INT8_ROWS: Mapping[Type, int] = {
    Type.Q4_0: 4, Type.Q4_1: 4, Type.Q5_0: 4, Type.Q5_1: 4, Type.Q8_0: 1, Type.Q4_K: 4,
    Type.Q6_K: 1,
}  # fmt: skip
