"""The tensor: a typed, strided description of memory plus the op that produces it.

Shapes are outermost-first like numpy (``shape[-1]`` is ggml's ``ne[0]``) and strides
are in bytes. For a block-quantized type the last axis counts elements while its stride
is the size of one block, exactly as ggml's ``nb[0]``; rows therefore hold whole blocks.

Building a tensor never allocates: it gets memory later, when an allocator (or
:func:`tensorplug.tensor_alloc`) places it in a :class:`~tensorplug.Buffer` at a byte
offset. A view shares the memory of its *base* tensor: ``view_src`` always names the
base (views of views are flattened, like ggml) and ``view_offs`` is the byte offset
into it.
"""

from __future__ import annotations

import enum
import math
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .errors import NotAllocatedError, ShapeError
from .opcodes import Op
from .types import Type, row_size

if TYPE_CHECKING:
    from .buffer import Buffer

__all__ = ["MAX_DIMS", "Tensor", "TensorFlag", "contiguous_strides", "new_tensor",
           "placement_epoch"]  # fmt: skip

MAX_DIMS = 4


class TensorFlag(enum.IntFlag):
    NONE = 0
    INPUT = 1
    OUTPUT = 2
    PARAM = 4


def contiguous_strides(t: Type, shape: Sequence[int]) -> tuple[int, ...]:
    """Byte strides of a C-ordered tensor of type ``t`` (``ggml_new_tensor``'s nb)."""
    strides = [0] * len(shape)
    if not shape:
        return ()
    strides[-1] = t.type_size
    if len(shape) > 1:
        strides[-2] = row_size(t, shape[-1])
        for i in range(len(shape) - 3, -1, -1):
            strides[i] = strides[i + 1] * shape[i + 1]
    return tuple(strides)


#: Bytes a tensor may span: byte offsets and sizes are signed 64-bit everywhere else.
MAX_TENSOR_BYTES = 2**63 - 1


def _whole(value: object) -> int:
    """``value`` as an int if it is a whole number (an int or numpy integer, not a bool, a
    float or a string); raises TypeError otherwise."""
    if isinstance(value, bool):
        raise TypeError("a bool is not a size")
    return operator.index(value)  # type: ignore[arg-type]


def _check_shape(shape: Sequence[int], what: str) -> tuple[int, ...]:
    if type(shape) is tuple and 1 <= len(shape) <= MAX_DIMS:
        # what the ops build: a tuple of plain non-negative ints, taken as it is (each
        # op makes a tensor or two, and a new prompt length's step graph ~230 of them)
        for d in shape:
            if type(d) is not int or d < 0:
                break
        else:
            return shape
    try:
        if isinstance(shape, (str, bytes)):
            raise TypeError
        dims = tuple(_whole(d) for d in shape)
    except TypeError:
        raise ShapeError(
            f"{what}: shape must be a sequence of whole numbers, got {shape!r}"
        ) from None
    if not 1 <= len(dims) <= MAX_DIMS:
        raise ShapeError(
            f"{what}: tensors have 1 to {MAX_DIMS} dimensions, got shape {dims} "
            f"(reshape to at most {MAX_DIMS} axes)"
        )
    if any(d < 0 for d in dims):
        raise ShapeError(f"{what}: negative dimension in shape {dims}")
    return dims


class OpParams(dict):  # type: ignore[type-arg]
    """An op's parameters, fixed when the op is built.

    Backends compile a node once (the CPU backend's plans, GPU kernels' bound arguments,
    a remote description) and reuse it while the graph is unchanged, so a parameter
    changed in place later would be silently ignored. It is refused instead: build the
    op again with the new value.
    """

    def _fixed(self, *args: Any, **kwargs: Any) -> None:
        from .errors import OpParamError

        raise OpParamError(
            "op params are fixed when the op is built (backends compile them into plans); "
            "build the op again with the new value"
        )

    def __reduce__(self) -> tuple[type, tuple[dict[str, Any]]]:
        return (OpParams, (dict(self),))  # copies and pickles rebuild it whole

    __setitem__ = __delitem__ = _fixed
    clear = pop = popitem = setdefault = update = _fixed  # type: ignore[assignment]
    __ior__ = _fixed  # type: ignore[assignment]


_epoch = [0]


def placement_epoch() -> int:
    """A number that changes whenever any tensor's ``buffer``, ``offset`` or ``src`` is
    assigned: a backend that prepared work for a graph (the CPU backend's plans) may
    skip re-reading every node while it is unchanged and the graph has the same nodes."""
    return _epoch[0]


class Tensor:
    """A node of a compute graph: type, layout, producing op and (later) its memory.

    What a backend reads, and how to read it:

    * ``shape`` is numpy order (outermost first); ``ne()`` is ggml's order (innermost
      first), padded to 4. ``strides`` (and ``nb()``) are in **bytes**, like ggml's
      ``nb``; for a quantized type the innermost stride steps one block, not one element.
    * ``op`` and ``op_params`` (read-only after building; the keys per op are listed in
      docs/ops.md). ``src``: the operands in order; an optional operand (rope's
      frequency factors, a soft_max or flash_attn_ext mask) is in ``src`` only when it
      was given, so check ``len(node.src)``.
    * ``view_src``: for a view, always the tensor that owns the memory (never another
      view), and ``view_offs`` the cumulative byte offset into it. ``buffer``/``offset``:
      where the tensor's first byte is (a view's are set by ``view_init``).
    * ``flags``: ``INPUT``, ``OUTPUT`` (``set_output()``: its value is read after the
      graph, so it must be written to memory), ``PARAM``.
    * In host memory, ``tensorplug.host.tensor_array(t)`` is a numpy view with the
      tensor's shape and strides; BF16 shows as ``uint16`` (numpy has no bfloat16) and a
      quantized type as raw ``uint8`` blocks.
    """

    __slots__ = (
        "__weakref__",
        "_buffer",
        "_offset",
        "_src",
        "extra",
        "flags",
        "name",
        "op",
        "op_params",
        "shape",
        "strides",
        "type",
        "view_offs",
        "view_src",
    )

    def __init__(
        self,
        type: Type | str,
        shape: Sequence[int],
        *,
        strides: Sequence[int] | None = None,
        op: Op = Op.NONE,
        op_params: dict[str, Any] | None = None,
        src: Sequence[Tensor] = (),
        name: str = "",
        view_src: Tensor | None = None,
        view_offs: int = 0,
    ) -> None:
        self.type: Type = Type.parse(type)
        self.shape: tuple[int, ...] = _check_shape(shape, name or "tensor")
        if self.type.is_quantized and self.shape[-1] % self.type.block_size:
            bs = self.type.block_size
            raise ShapeError(
                f"{name or 'tensor'}: the last dimension of a {self.type.name} tensor must be a "
                f"multiple of its block size {bs}, got shape {self.shape}"
            )
        if strides is None:
            self.strides: tuple[int, ...] = contiguous_strides(self.type, self.shape)
            # C order: the outermost stride times its extent is every byte (a 1-d
            # quantized tensor's one stride is a block's, not an element's)
            spanned = self.strides[0] * self.shape[0] if len(self.shape) > 1 else self.nbytes
        else:
            self.strides = tuple(int(s) for s in strides)
            if len(self.strides) != len(self.shape):
                raise ShapeError(
                    f"{name or 'tensor'}: {len(self.strides)} strides given for a "
                    f"{len(self.shape)}-d shape {self.shape}"
                )
            if any(s < 0 for s in self.strides):
                raise ShapeError(f"{name or 'tensor'}: negative strides {self.strides}")
            spanned = self.nbytes
        if spanned > MAX_TENSOR_BYTES:
            raise ShapeError(
                f"{name or 'tensor'}: shape {self.shape} of {self.type.name} spans "
                f"{self.nbytes} bytes, more than any memory can hold (2^63 - 1); "
                "check the shape"
            )
        self.op: Op = op
        self.op_params: dict[str, Any] = OpParams(op_params or {})
        self._src: tuple[Tensor, ...] = tuple(src)  # new: no prepared work can read it
        for s in self.src:
            if not isinstance(s, Tensor):
                from .errors import TypeMismatchError

                raise TypeMismatchError(
                    f"{name or op.value}: a source is {type(s).__name__} {s!r}, not a Tensor; "
                    "make constants tensors first (e.g. new_tensor + set_array)"
                )
        self.flags: TensorFlag = TensorFlag.NONE
        self.name: str = name
        if view_src is not None and view_src.view_src is not None:
            view_offs += view_src.view_offs
            view_src = view_src.view_src
        self.view_src: Tensor | None = view_src
        self.view_offs: int = view_offs
        self._buffer: Buffer | None = None
        self._offset: int = 0
        self.extra: Any = None

    # -- what a backend's cached work depends on -------------------------------------------

    @property
    def buffer(self) -> Buffer | None:
        return self._buffer

    @buffer.setter
    def buffer(self, buffer: Buffer | None) -> None:
        _epoch[0] += 1
        self._buffer = buffer

    @property
    def offset(self) -> int:
        return self._offset

    @offset.setter
    def offset(self, offset: int) -> None:
        _epoch[0] += 1
        self._offset = offset

    @property
    def src(self) -> tuple[Tensor, ...]:
        return self._src

    @src.setter
    def src(self, src: tuple[Tensor, ...]) -> None:
        _epoch[0] += 1
        self._src = src

    # -- geometry ---------------------------------------------------------------------

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nelements(self) -> int:
        return math.prod(self.shape)

    @property
    def nrows(self) -> int:
        return math.prod(self.shape[:-1])

    @property
    def row_bytes(self) -> int:
        return row_size(self.type, self.shape[-1])

    @property
    def nbytes(self) -> int:
        """Bytes spanned from the first to the last element (``ggml_nbytes``)."""
        if any(d == 0 for d in self.shape):
            return 0
        bs = self.type.block_size
        if bs == 1:
            n = self.type.type_size
            for d, s in zip(self.shape, self.strides, strict=True):
                n += (d - 1) * s
            return n
        n = self.shape[-1] * self.strides[-1] // bs
        for d, s in zip(self.shape[:-1], self.strides[:-1], strict=True):
            n += (d - 1) * s
        return n

    def ne(self) -> tuple[int, int, int, int]:
        """ggml's ``ne``: innermost-first extents padded to four dimensions."""
        padded = (1,) * (MAX_DIMS - self.ndim) + self.shape
        return (padded[3], padded[2], padded[1], padded[0])

    def nb(self) -> tuple[int, int, int, int]:
        """ggml's ``nb``: innermost-first byte strides padded to four dimensions."""
        outer = self.strides[0] * self.shape[0] if self.strides else 0
        padded = (outer,) * (MAX_DIMS - self.ndim) + self.strides
        return (padded[3], padded[2], padded[1], padded[0])

    @property
    def is_contiguous(self) -> bool:
        """True when the elements are C-ordered with no gaps (dims of size 1 are ignored)."""
        expected = contiguous_strides(self.type, self.shape)
        return self.strides == expected or all(  # the first test decides most tensors
            d == 1 or s == e for d, s, e in zip(self.shape, self.strides, expected, strict=True)
        )

    @property
    def rows_contiguous(self) -> bool:
        """True when each row is dense (``nb[0]`` is one element or block)."""
        return self.shape[-1] == 1 or self.strides[-1] == self.type.type_size

    # -- identity and memory ------------------------------------------------------------

    @property
    def is_view(self) -> bool:
        return self.view_src is not None

    @property
    def base(self) -> Tensor:
        """The tensor that owns the memory: ``view_src`` for a view, else itself."""
        return self.view_src if self.view_src is not None else self

    @property
    def is_allocated(self) -> bool:
        return self.buffer is not None

    def require_allocated(self) -> Buffer:
        if self.buffer is None:
            raise NotAllocatedError(
                f"tensor {self.describe()} has no memory yet: allocate it with a "
                "GraphAllocator, alloc_tensors() or tensor_alloc() before reading or writing it"
            )
        if self.buffer.is_freed:
            from .errors import BufferFreedError

            raise BufferFreedError(
                f"tensor {self.describe()} lives in buffer {self.buffer.name!r}, which was freed"
            )
        return self.buffer

    # -- flags --------------------------------------------------------------------------

    def set_input(self) -> Tensor:
        self.flags |= TensorFlag.INPUT
        return self

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """Share this tensor's host memory with another library without copying
        (``np.from_dlpack(t)``, ``torch.from_dlpack(t)``); see :mod:`tensorplug.dlpack`
        for what is refused and what to do instead."""
        from .dlpack import export

        return export(self, stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        from .dlpack import device

        return device(self)

    def set_output(self) -> Tensor:
        self.flags |= TensorFlag.OUTPUT
        return self

    def set_param(self) -> Tensor:
        self.flags |= TensorFlag.PARAM
        return self

    def set_name(self, name: str) -> Tensor:
        self.name = name
        return self

    # -- conveniences -------------------------------------------------------------------

    def __add__(self, other: Tensor) -> Tensor:
        from .ops import add

        return add(self, other)

    def __sub__(self, other: Tensor) -> Tensor:
        from .ops import sub

        return sub(self, other)

    def __mul__(self, other: Tensor) -> Tensor:
        from .ops import mul

        return mul(self, other)

    def __truediv__(self, other: Tensor) -> Tensor:
        from .ops import div

        return div(self, other)

    def describe(self) -> str:
        label = f"'{self.name}'" if self.name else f"<{self.op.value}>"
        return f"{label} ({self.type.name}{list(self.shape)})"

    def __repr__(self) -> str:
        where = ""
        if self.buffer is not None:
            where = f", buffer={self.buffer.name!r}@{self.offset}"
        view = ", view" if self.view_src is not None else ""
        return (
            f"Tensor({self.name!r}, {self.type.name}, shape={self.shape}, "
            f"op={self.op.value}{view}{where})"
        )


def new_tensor(type: Type | str, shape: Sequence[int], name: str = "") -> Tensor:
    """A fresh leaf tensor (``ggml_new_tensor``): contiguous, no op, no memory yet."""
    return Tensor(type, shape, name=name)
