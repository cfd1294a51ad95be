"""Element types and their storage geometry, exactly as ggml and GGUF lay them out.

The enum values are ggml's own type ids (``enum ggml_type``), so a GGUF file's type
field maps onto :class:`Type` without a translation table. Block-quantized types pack
``block_size`` consecutive elements of a row into ``type_size`` bytes; a row of a
quantized tensor therefore always holds a whole number of blocks.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from .errors import ShapeError, TypeMismatchError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Type", "TypeTraits", "row_size"]


class Type(enum.IntEnum):
    """A tensor element type; the value is ggml's ``ggml_type`` id."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    IQ4_NL = 20
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    BF16 = 30

    @property
    def block_size(self) -> int:
        return _TRAITS[self].block_size

    @property
    def type_size(self) -> int:
        return _TRAITS[self].type_size

    @property
    def is_quantized(self) -> bool:
        return _TRAITS[self].block_size > 1

    @property
    def is_float(self) -> bool:
        return self in (Type.F32, Type.F16, Type.BF16)

    @property
    def is_integer(self) -> bool:
        return self in (Type.I8, Type.I16, Type.I32, Type.I64)

    @property
    def numpy_dtype(self) -> np.dtype:
        """The numpy dtype of one element; BF16 is stored as raw ``uint16``."""
        return _TRAITS[self].numpy_dtype

    @staticmethod
    def known(type_id: int) -> bool:
        """Whether ``type_id`` (a ggml type id read from a file) is one of these types."""
        return type_id in _IDS

    @classmethod
    def parse(cls, value: Type | str | int) -> Type:
        """Accept a :class:`Type`, its name in any case (``"q8_0"``) or its ggml id."""
        if isinstance(value, Type):
            return value
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError:
                pass
        elif isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls(value)
            except ValueError:
                pass
        known = ", ".join(t.name for t in cls)
        raise TypeMismatchError(f"unknown tensor type {value!r}; known types are {known}")


#: every type's ggml id
_IDS = frozenset(t.value for t in Type)


@dataclass(frozen=True)
class TypeTraits:
    """Storage geometry of a type: ``block_size`` elements take ``type_size`` bytes."""

    name: str
    block_size: int
    type_size: int
    _dtype_name: str

    @cached_property
    def numpy_dtype(self) -> np.dtype:
        import numpy as np

        return np.dtype(self._dtype_name)


_TRAITS: dict[Type, TypeTraits] = {
    Type.F32: TypeTraits("f32", 1, 4, "float32"),
    Type.F16: TypeTraits("f16", 1, 2, "float16"),
    Type.BF16: TypeTraits("bf16", 1, 2, "uint16"),
    Type.I8: TypeTraits("i8", 1, 1, "int8"),
    Type.I16: TypeTraits("i16", 1, 2, "int16"),
    Type.I32: TypeTraits("i32", 1, 4, "int32"),
    Type.I64: TypeTraits("i64", 1, 8, "int64"),
    # block layouts (ggml-common.h): d is an f16 scale, m an f16 minimum,
    # qs the packed quants, qh the fifth bits of the 5-bit types.
    Type.Q4_0: TypeTraits("q4_0", 32, 2 + 16, "uint8"),
    Type.Q4_1: TypeTraits("q4_1", 32, 2 + 2 + 16, "uint8"),
    Type.Q5_0: TypeTraits("q5_0", 32, 2 + 4 + 16, "uint8"),
    Type.Q5_1: TypeTraits("q5_1", 32, 2 + 2 + 4 + 16, "uint8"),
    Type.Q8_0: TypeTraits("q8_0", 32, 2 + 32, "uint8"),
    # K-quants: 256-element super-blocks of 16- or 32-element sub-blocks whose scales
    # (and mins) are themselves quantized against d (dmin); see tensorplug.kquants
    Type.Q2_K: TypeTraits("q2_k", 256, 16 + 64 + 2 + 2, "uint8"),
    Type.Q3_K: TypeTraits("q3_k", 256, 32 + 64 + 12 + 2, "uint8"),
    Type.Q4_K: TypeTraits("q4_k", 256, 2 + 2 + 12 + 128, "uint8"),
    Type.Q5_K: TypeTraits("q5_k", 256, 2 + 2 + 12 + 32 + 128, "uint8"),
    Type.Q6_K: TypeTraits("q6_k", 256, 128 + 64 + 16 + 2, "uint8"),
    # 4-bit indices into a fixed non-linear table; IQ4_XS adds 6-bit block scales
    # (scales_h, scales_l) under one f16 d per super-block; see tensorplug.iquants
    Type.IQ4_NL: TypeTraits("iq4_nl", 32, 2 + 16, "uint8"),
    Type.IQ4_XS: TypeTraits("iq4_xs", 256, 2 + 2 + 4 + 128, "uint8"),
}


def row_size(t: Type, n: int) -> int:
    """Bytes taken by ``n`` consecutive elements of type ``t`` (``ggml_row_size``)."""
    bs = _TRAITS[t].block_size
    if n % bs:
        raise ShapeError(
            f"a row of {n} elements cannot be stored as {t.name}: quantized rows must hold "
            f"a whole number of {bs}-element blocks (pad or reshape the last axis to a multiple "
            f"of {bs}, or keep the tensor in F16/F32)"
        )
    return n // bs * _TRAITS[t].type_size
