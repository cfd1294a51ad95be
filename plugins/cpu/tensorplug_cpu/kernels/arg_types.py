"""The types numba's ``typeof`` gives a kernel's arguments, told apart without numba.

A call through a kernel reference (:mod:`.kernel_refs`) picks the machine code for its
arguments' types before numba is imported, and a step binds a kernel once for arguments
of fixed types (:class:`.jit.KernelCall`); both key on :func:`arg_key`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["arg_key"]

#: Python ints numba types as int64, and as uint64 above that
_INT64 = (-(1 << 63), 1 << 63)
_UINT64_END = 1 << 64
_INT64_STR, _UINT64_STR = np.dtype(np.int64).str, np.dtype(np.uint64).str
#: the numpy scalar type numba types each other Python number as
_PYTHON_SCALARS = {bool: np.dtype(np.bool_).str, float: np.dtype(np.float64).str,
                   complex: np.dtype(np.complex128).str}  # fmt: skip


def arg_key(args: Sequence[Any]) -> tuple[Any, ...] | None:
    """What numba's ``typeof`` makes of ``args``, as a hashable value that tells every
    two of its types apart and no more: an array's dtype, dimensions, layout (numba's:
    C, else F, else A), whether it is writeable and aligned; a number's numpy type (a
    Python number's as numba types it: an int by its range); a tuple's items. None where
    an argument is anything else (records, strings, another byte order, a subclass of
    ``ndarray``): that call is numba's to type, or to refuse."""
    key: list[Any] = []
    for a in args:
        kind = type(a)
        if kind is np.ndarray:
            if a.dtype.kind not in "biufc" or not a.dtype.isnative:  # numba's to type, or refuse
                return None
            flags = a.flags
            layout = "C" if flags.c_contiguous else "F" if flags.f_contiguous else "A"
            key.append(("array", a.dtype.str, a.ndim, layout, flags.writeable, flags.aligned))
        elif kind in _PYTHON_SCALARS:
            key.append(("scalar", _PYTHON_SCALARS[kind]))
        elif kind is int:
            if _INT64[0] <= a < _INT64[1]:
                key.append(("scalar", _INT64_STR))
            elif 0 <= a < _UINT64_END:
                key.append(("scalar", _UINT64_STR))
            else:
                return None
        elif isinstance(a, np.generic) and a.dtype.kind in "biufc" and a.dtype.isnative:
            key.append(("scalar", a.dtype.str))
        elif kind is tuple:
            items = arg_key(a)
            if items is None:
                return None
            key.append(("tuple", items))
        else:
            return None
    return tuple(key)
