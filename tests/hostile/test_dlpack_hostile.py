"""DLPack from hostile or careless producers: an error that says what the producer got
wrong, never numpy's bare ValueError or an AttributeError; and memory that was shared
read-only is refused where a graph would write it, naming the tensor."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest

import tensorplug as tp
from tensorplug import ops
from tensorplug.dlpack import DLPackError


class _Producer:
    """Whatever ``__dlpack__`` and ``__dlpack_device__`` return, it returns."""

    def __init__(self, capsule: Any, device: Any = (1, 0)) -> None:
        self.capsule, self.device = capsule, device

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.capsule

    def __dlpack_device__(self) -> Any:
        return self.device


def _capsule(name: bytes) -> Any:
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new(8, name, None)


@pytest.mark.parametrize("obj", [np.float32(1.0), [1.0, 2.0], None, "abc"])
def test_something_that_is_no_producer_is_a_type_error_saying_so(obj: Any) -> None:
    with pytest.raises(tp.TypeMismatchError, match="not a DLPack producer.*np.asarray"):
        tp.from_dlpack(obj)


@pytest.mark.parametrize(
    ("producer", "match"),
    [
        (_Producer("a string"), "must return a DLPack capsule"),
        (_Producer(None), "must return a DLPack capsule"),
        (_Producer(_capsule(b"not_dltensor")), "must return a DLPack capsule"),
        (_Producer(_capsule(b"used_dltensor")), "must return a DLPack capsule"),
        (_Producer(None, "xx"), "pair of ints"),
        (_Producer(None, ()), "pair of ints"),
        (_Producer(None, None), "pair of ints"),
        (_Producer(None, (1,)), "pair of ints"),
        (_Producer(None, ("cpu", 0)), "pair of ints"),
    ],
    ids=[
        "str",
        "None",
        "wrong-name",
        "used",
        "dev-str",
        "dev-empty",
        "dev-None",
        "dev-one",
        "dev-words",
    ],
)
def test_a_producer_returning_garbage_is_a_dlpack_error(producer: _Producer, match: str) -> None:
    with pytest.raises(DLPackError, match=match):
        tp.from_dlpack(producer)


@pytest.mark.parametrize("op", ["cpy", "set_rows"])
def test_a_read_only_source_used_as_a_destination_is_refused_by_name(op: str) -> None:
    be = tp.dev_by_name("CPU").init_backend()  # type: ignore[union-attr]
    cache = np.zeros((4, 8), np.float32)
    cache.flags.writeable = False
    dst = tp.from_dlpack(cache, "frozen")
    if op == "cpy":
        src = tp.new_tensor("f32", (4, 8), "src")
        out, inputs = ops.cpy(src, dst), [src]
    else:
        rows, idx = tp.new_tensor("f32", (1, 8), "rows"), tp.new_tensor("i32", (1,), "idx")
        out, inputs = ops.set_rows(dst, rows, idx), [rows, idx]
    tp.alloc_tensors(inputs, be.buffer_type())
    for t in inputs:
        tp.set_array(t, np.ones(t.shape, t.type.numpy_dtype))
    tp.view_init(out)
    with pytest.raises(tp.UnsupportedError, match="writes into 'frozen'.*read-only"):
        be.graph_compute(tp.Graph(out))
    np.testing.assert_array_equal(cache, 0)


@pytest.mark.parametrize("strided", [False, True])
def test_set_array_into_read_only_memory_is_refused_alike(strided: bool) -> None:
    frozen = np.zeros((3, 4), np.float32)
    frozen.flags.writeable = False
    t = tp.from_dlpack(frozen[:, ::2] if strided else frozen, "frozen")
    with pytest.raises(tp.UnsupportedError, match="read-only"):
        tp.set_array(t, np.ones(t.shape, np.float32))
    np.testing.assert_array_equal(frozen, 0)
