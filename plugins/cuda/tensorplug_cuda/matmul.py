"""mul_mat through cuBLAS for batches of many tokens, by way of ``cupy.matmul``.

For one to eight tokens the shared library's matrix-vector kernels read each weight
once and win; for prompt batches a GEMM does. The path here wraps the tensors' own
memory in cupy arrays (no copies: ``cupy.ndarray`` over a ``MemoryPointer`` into the
tensorplug buffer) and calls ``cupy.matmul``, which runs cuBLAS on the current stream
— the backend's, made current around the call.

F32 weights go straight in. F16, BF16 and quantized weights are first converted to
F32 by the shared library's ``k_cpy`` kernel into a scratch buffer the backend keeps
(ggml converts to F16 and uses tensor cores instead; here the result stays exact).
ggml's broadcast of the weights over the batch axes (``r2``, ``r3``: each weight
matrix serves consecutive batches) becomes numpy-style broadcasting over 6-D views.

cupy refuses cuBLAS inside a CUDA-graph capture (NotImplementedError), so plans with
such nodes are never captured (:mod:`.plan`). Where cuBLAS cannot be loaded (its wheel
missing) or its temporaries do not fit, the node falls back to the shared kernels.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorplug.errors import TensorplugError
from tensorplug.opcodes import Op
from tensorplug.tensor import Tensor, new_tensor
from tensorplug.transfer import tensor_alloc
from tensorplug.types import Type
from tensorplug_kernels.launch import nrows, row_launch, tensor_arg
from tensorplug_kernels.source import QUANT

from .buffer import CUDABuffer, cuda_errors
from .errors import OutOfMemoryError, is_out_of_memory, translate
from .settings import CUBLAS

if TYPE_CHECKING:
    from .backend import CUDABackend

__all__ = ["FLOAT_MIN_TOKENS", "QUANT_MIN_TOKENS", "CublasMatmul", "min_tokens"]

log = logging.getLogger(__name__)

#: Tokens from which float weights go to cuBLAS (ggml's mat-vec kernels take up to 8).
FLOAT_MIN_TOKENS = 9
#: Quantized weights are converted in full first: worth it only for long batches.
QUANT_MIN_TOKENS = 64

_FLOAT = frozenset({Type.F32, Type.F16, Type.BF16})


def min_tokens(weights: Tensor) -> int | None:
    """From how many tokens ``weights`` go through cuBLAS; None when never."""
    if weights.type in _FLOAT:
        return FLOAT_MIN_TOKENS
    if weights.type in QUANT and weights.rows_contiguous:
        return QUANT_MIN_TOKENS
    return None


def _view(cp: Any, t: Tensor, shape: tuple[int, ...], strides: tuple[int, ...]) -> Any:
    """A float32 cupy array over ``t``'s bytes in its CUDA buffer."""
    buf = t.buffer
    assert isinstance(buf, CUDABuffer)
    memptr = cp.cuda.MemoryPointer(buf.mem, t.offset)
    return cp.ndarray(shape, dtype=np.float32, memptr=memptr, strides=strides)


def batched_views(cp: Any, a: Tensor, b: Tensor, d: Tensor) -> tuple[Any, Any, Any]:
    """``(A, B, D)`` with ``D = B @ A^T`` computing ggml's mul_mat over every batch."""
    (k, n, a2, a3), (as0, as1, as2, as3) = a.ne(), a.nb()
    (_, t, b2, b3), (bs0, bs1, bs2, bs3) = b.ne(), b.nb()
    ds0, ds1, ds2, ds3 = d.nb()
    if a2 * a3 == 1 and b2 * b3 == 1:
        return (
            _view(cp, a, (n, k), (as1, as0)),
            _view(cp, b, (t, k), (bs1, bs0)),
            _view(cp, d, (t, n), (ds1, ds0)),
        )
    r2, r3 = b2 // a2, b3 // a3
    outer = (a3, r3, a2, r2)
    return (
        _view(cp, a, (a3, 1, a2, 1, n, k), (as3, 0, as2, 0, as1, as0)),
        _view(cp, b, (*outer, t, k), (r3 * bs3, bs3, r2 * bs2, bs2, bs1, bs0)),
        _view(cp, d, (*outer, t, n), (r3 * ds3, ds3, r2 * ds2, ds2, ds1, ds0)),
    )


class CublasMatmul:
    """The cuBLAS path of one backend, with its scratch buffer for converted weights."""

    def __init__(self, backend: CUDABackend) -> None:
        self.backend = backend
        self.enabled = CUBLAS.get()
        self.unavailable = ""  # why cuBLAS could not be used, once it failed to load
        self.scratch: CUDABuffer | None = None

    def takes(self, node: Tensor) -> bool:
        """True when ``node`` is a mul_mat this path computes."""
        if node.op is not Op.MUL_MAT or not self.enabled or self.unavailable:
            return False
        a, b = node.src
        need = min_tokens(a)
        return (
            need is not None
            and b.type == Type.F32
            and node.type == Type.F32
            and node.ne()[1] >= need
            and node.nelements > 0
        )

    def run(self, node: Tensor) -> bool:
        """Compute ``node`` on the backend's stream; False when it must fall back to the
        kernels (no cuBLAS here, or no memory for its temporaries)."""
        backend = self.backend
        cp = backend.device.cp
        a, b = node.src
        try:
            with backend.stream:
                weights = a if a.type == Type.F32 else self._converted(a, node)
                wa, ba, da = batched_views(cp, weights, b, node)
                cp.matmul(ba, wa.swapaxes(-1, -2), out=da)
        except NotImplementedError:  # cuBLAS inside a stream capture: the plan falls back
            raise
        except OutOfMemoryError as e:
            log.info("%s: no memory for converting %s, using the kernels: %s", backend.name,
                     a.describe(), e)  # fmt: skip
            return False
        except TensorplugError:
            raise
        except cuda_errors(cp) as e:
            if is_out_of_memory(cp, e):
                return False
            raise translate(cp, e, f"{backend.name}: cuBLAS mul_mat {node.describe()}") from e
        except (ImportError, OSError, RuntimeError) as e:  # libcublas missing or unusable
            self.unavailable = f"{type(e).__name__}: {e}"
            log.warning("%s: cuBLAS is unavailable (%s); mul_mat uses the shared kernels",
                        backend.name, self.unavailable)  # fmt: skip
            return False
        return True

    def _converted(self, a: Tensor, node: Tensor) -> Tensor:
        """``a`` as F32 in the scratch buffer (queued on the backend's stream)."""
        backend = self.backend
        dev = backend.device
        nbytes = a.nelements * 4
        if self.scratch is None or self.scratch.size < nbytes:
            if self.scratch is not None:
                backend.stream.synchronize()  # queued work may still read the old one
                self.scratch.free()
                self.scratch = None
            buf = dev.buffer_type().alloc_buffer(nbytes)
            assert isinstance(buf, CUDABuffer)
            self.scratch = buf
        t = new_tensor(Type.F32, a.shape, f"{a.name}:f32")
        tensor_alloc(self.scratch, t, 0)
        for launch in row_launch(
            "k_cpy", nrows(a), dev.limits, s=tensor_arg(a), d=tensor_arg(t), reshape=0
        ):
            backend.launch(launch, node)
        return t

    def free(self) -> None:
        if self.scratch is not None:
            self.scratch.free()
            self.scratch = None
