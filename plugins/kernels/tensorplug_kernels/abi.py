"""The kernels' calling convention, read from the kernel sources themselves.

Every kernel is declared as::

    typedef struct { tp_tensor a; tp_tensor d; int fn; float p0; } k_unary_args;
    TP_KERNEL k_unary(TP_ARGS(k_unary_args), TP_BUFFER(a, 1), TP_BUFFER(d, 2) TP_IDS)

one arguments struct, then one buffer per ``tp_tensor`` field in field order, then
optional extra buffers the runtime supplies (``err``: the error word; ``scratch``: the
runtime's scratch memory). This module parses those
declarations into a :class:`KernelABI` per kernel — the struct's exact C layout as a
numpy dtype, and the buffer list — so the host packs what the kernel reads from the
one declaration, and a kernel whose buffers do not match its struct is refused when
the package is checked, not when a result comes out wrong.
"""

from __future__ import annotations

import functools
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .source import Source, body_sources

__all__ = ["EXTRA_BUFFERS", "TENSOR_DTYPE", "KernelABI", "TensorArg", "kernel_abis"]

#: Buffers a kernel may take beyond its tensors, supplied by the runtime: ``err`` is
#: the two-int error word kernels that index by data report bad indices in; ``scratch``
#: is device memory for what one node's launches hand each other (at least
#: ``Launch.scratch`` bytes; see :class:`~tensorplug_kernels.launch.Launch`).
EXTRA_BUFFERS = frozenset({"err", "scratch"})

#: The ``tp_tensor`` struct of ``common.tpk``.
TENSOR_DTYPE = np.dtype(
    [("off", "<u8"), ("type", "<i4"), ("pad_", "<i4"), ("ne", "<i4", (4,)), ("nb", "<u8", (4,))],
    align=True,
)

_SCALARS = {"int": "<i4", "uint": "<u4", "float": "<f4", "tp_i64": "<i8", "tp_u64": "<u8"}
_STRUCT = re.compile(r"typedef struct \{([^{}]*)\} (\w+_args);")
_FIELD = re.compile(r"^\s*(\w+)\s+(\w+);\s*$")
_KERNEL = re.compile(
    r"TP_KERNEL\s+(?:TP_REQD_GROUP\([^)]*\)\s*)?(\w+)\s*\(\s*TP_ARGS\((\w+)\)((?:\s*,\s*TP_BUFFER\(\s*\w+\s*,\s*\d+\s*\))*)\s*TP_IDS\s*\)"
)
_BUFFER = re.compile(r"TP_BUFFER\(\s*(\w+)\s*,\s*(\d+)\s*\)")


@dataclass(frozen=True)
class TensorArg:
    """A tensor operand as a kernel sees it: which tensor's memory (the runtime finds
    its buffer), the byte offset in that buffer, the type id, extents and byte strides
    (innermost first; strides of extent-1 axes are 0, which broadcasts)."""

    tensor: Any
    offset: int
    type_id: int
    ne: tuple[int, int, int, int]
    nb: tuple[int, int, int, int]


@dataclass(frozen=True)
class KernelABI:
    """How to call one kernel: its arguments struct and its buffers, in order."""

    kernel: str
    struct_name: str
    dtype: np.dtype
    buffers: tuple[str, ...]

    @functools.cached_property
    def _packer(self) -> tuple[struct.Struct, tuple[tuple[str, bool], ...]]:
        fmt, fields, pos = "<", [], 0
        for name in self.dtype.names or ():
            sub, offset = self.dtype.fields[name][:2]  # type: ignore[index]
            fmt += "x" * (offset - pos)
            if sub == TENSOR_DTYPE:
                fmt += "QiiiiiiQQQQ"
                fields.append((name, True))
            else:
                fmt += sub.char
                fields.append((name, False))
            pos = offset + sub.itemsize
        fmt += "x" * (self.dtype.itemsize - pos)
        return struct.Struct(fmt), tuple(fields)

    def pack(self, args: Mapping[str, Any]) -> tuple[bytes, tuple[TensorArg | str, ...]]:
        """The struct's bytes for ``args`` (every field, by name) and what each buffer
        parameter takes: a :class:`TensorArg`, or the name of an extra buffer."""
        packer, fields = self._packer
        values: list[Any] = []
        try:
            for name, is_tensor in fields:
                v = args[name]
                if is_tensor:
                    values += (v.offset, v.type_id, 0, *v.ne, *v.nb)
                else:
                    values.append(v)
            data = packer.pack(*values)
        except KeyError as e:
            raise KeyError(f"{self.kernel}: no value for argument {e.args[0]!r}") from None
        except struct.error as e:
            raise ValueError(f"{self.kernel}: arguments do not fit {self.struct_name}: {e}") from e
        if len(args) != len(fields):
            extra = sorted(set(args) - {n for n, _ in fields})
            raise KeyError(f"{self.kernel}: {self.struct_name} has no field(s) {extra}")
        buffers = tuple(b if b in EXTRA_BUFFERS else args[b] for b in self.buffers)
        return data, buffers


def _struct_dtype(name: str, body: str) -> np.dtype:
    fields = []
    for line in body.splitlines():
        if not line.strip() or line.strip().startswith("//"):
            continue
        m = _FIELD.match(line)
        if m is None:
            raise ValueError(f"{name}: cannot read field declaration {line.strip()!r}")
        ctype, field = m.groups()
        if ctype == "tp_tensor":
            fields.append((field, TENSOR_DTYPE))
        elif ctype in _SCALARS:
            fields.append((field, np.dtype(_SCALARS[ctype])))
        else:
            raise ValueError(f"{name}: field {field!r} has type {ctype!r}, not one of "
                             f"tp_tensor, {', '.join(_SCALARS)}")  # fmt: skip
    return np.dtype(fields, align=True)


def _substitute(text: str, macros: tuple[tuple[str, str], ...]) -> str:
    for k, v in macros:
        text = re.sub(rf"\b{k}\b", v, text)
    return text


def parse(sources: tuple[Source, ...]) -> dict[str, KernelABI]:
    """Every kernel declared in ``sources``, checked against its arguments struct."""
    structs: dict[str, np.dtype] = {}
    abis: dict[str, KernelABI] = {}
    for src in sources:
        text = _substitute(src.text, src.macros)
        for m in _STRUCT.finditer(text):
            structs[m.group(2)] = _struct_dtype(m.group(2), m.group(1))
        for m in _KERNEL.finditer(text):
            kernel, struct_name, params = m.groups()
            if struct_name not in structs:
                raise ValueError(f"{src.name}: kernel {kernel} takes {struct_name}, "
                                 "which is not declared before it")  # fmt: skip
            dtype = structs[struct_name]
            buffers = _BUFFER.findall(params)
            names = tuple(b for b, _ in buffers)
            tensors = tuple(n for n in dtype.names or () if dtype.fields[n][0] == TENSOR_DTYPE)  # type: ignore[index]
            expected = tuple(str(i + 1) for i in range(len(buffers)))
            numbers = [i for _, i in buffers]
            if tuple(numbers) != expected:
                raise ValueError(
                    f"{src.name}: kernel {kernel} numbers its buffers {numbers}, "
                    f"expected {list(expected)}"
                )
            extras = set(names[len(tensors) :])
            if names[: len(tensors)] != tensors or not extras <= EXTRA_BUFFERS:
                raise ValueError(
                    f"{src.name}: kernel {kernel} takes buffers {list(names)}, but "
                    f"{struct_name} describes tensors {list(tensors)}: one buffer per "
                    f"tensor field, in field order, then only {sorted(EXTRA_BUFFERS)}"
                )
            if kernel in abis:
                raise ValueError(f"{src.name}: kernel {kernel} is declared twice")
            abis[kernel] = KernelABI(kernel, struct_name, dtype, names)
    return abis


@functools.cache
def kernel_abis() -> dict[str, KernelABI]:
    """The calling convention of every packaged kernel, by kernel name."""
    return parse(body_sources())
