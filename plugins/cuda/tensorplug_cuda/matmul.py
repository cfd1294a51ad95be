"""mul_mat through cuBLAS for batches of many tokens, by way of ``cupy.matmul``.

For one to eight tokens the shared library's matrix-vector kernels read each weight
once and win; for prompt batches a GEMM does. The path here wraps the tensors' own
memory in cupy arrays (no copies: ``cupy.ndarray`` over a ``MemoryPointer`` into the
tensorplug buffer) and calls ``cupy.matmul``, which runs cuBLAS on the current stream
— the backend's, made current around the call.

F32 weights go straight in (SGEMM). F16 and quantized weights take ggml's tensor-core
path: quantized weights are dequantized to F16 and the activations rounded to F16 by
the shared library's ``k_cpy`` kernel into a scratch buffer the backend keeps, cuBLAS
multiplies the F16 operands with F32 accumulation (cupy's ``gemmEx``,
``CUBLAS_COMPUTE_32F``, tensor-core algorithms from Volta on) into an F16 result, and
that is widened into the F32 output. As in ggml, activations or results beyond F16's
range (65504) become infinite there; ``TENSORPLUG_CUDA_CUBLAS_F16=0`` converts the
weights to F32 instead and keeps the product exact (SGEMM, several times slower on
tensor-core GPUs). BF16 weights always take the F32 conversion: F16 cannot hold
their range. ggml's broadcast of the weights over the batch axes (``r2``, ``r3``: each weight
matrix serves consecutive batches) becomes numpy-style broadcasting over 6-D views.

The path is a library op of the runtime base (:mod:`tensorplug_kernels.runtime.library`):
the base claims the nodes it takes, never captures plans holding them (cupy refuses
cuBLAS inside a CUDA-graph capture), keeps the scratch buffer for converted operands,
and falls back to the shared kernels where cuBLAS cannot be loaded (its wheel missing)
or its temporaries do not fit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tensorplug.opcodes import Op
from tensorplug.tensor import Tensor, new_tensor
from tensorplug.transfer import tensor_alloc
from tensorplug.types import Type
from tensorplug_kernels.runtime import LibraryOp
from tensorplug_kernels.source import QUANT

from .buffer import CUDABuffer
from .settings import CUBLAS, CUBLAS_F16

if TYPE_CHECKING:
    from .backend import CUDABackend

__all__ = ["FLOAT_MIN_TOKENS", "QUANT_MIN_TOKENS", "CublasMatmul", "min_tokens"]

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
    """A cupy array (float32 or float16, as ``t``) over ``t``'s bytes in its CUDA buffer."""
    buf = t.buffer
    assert isinstance(buf, CUDABuffer)
    memptr = cp.cuda.MemoryPointer(buf.mem, t.offset)
    return cp.ndarray(shape, dtype=t.type.numpy_dtype, memptr=memptr, strides=strides)


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


class CublasMatmul(LibraryOp):
    """The cuBLAS path of one backend."""

    library = "cuBLAS"
    # libcublas missing or unusable: cupy raises these when it first loads it
    unavailable_errors = (ImportError, OSError, RuntimeError)
    backend: CUDABackend

    def __init__(self, backend: CUDABackend) -> None:
        super().__init__(backend, enabled=CUBLAS.get())
        self.half = CUBLAS_F16.get()  # F16 operands (tensor cores) for F16/quantized weights

    def _takes(self, node: Tensor) -> bool:
        if node.op is not Op.MUL_MAT:
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

    def half_precision(self, weights: Tensor) -> bool:
        """True when a product with ``weights`` runs on F16 operands (tensor cores)."""
        return self.half and weights.type is not Type.BF16 and weights.type is not Type.F32

    def _run(self, node: Tensor) -> None:
        cp = self.backend.cp
        a, b = node.src
        with self.backend.stream:  # cupy.matmul runs cuBLAS on the current stream
            if self.half_precision(a):
                self._run_half(cp, a, b, node)
                return
            if a.type != Type.F32:  # weights widened to F32 at the start of scratch
                scratch, _ = self.scratch_for([a.nelements * 4])
                a = self.converted(a, node, scratch, 0, Type.F32)
            wa, ba, da = batched_views(cp, a, b, node)
            cp.matmul(ba, wa.swapaxes(-1, -2), out=da)

    def _run_half(self, cp: Any, a: Tensor, b: Tensor, node: Tensor) -> None:
        """``node`` from F16 copies of its operands: the weights (unless already F16) and
        the activations in scratch, an F16 result there too, widened into ``node``."""
        sizes = [0 if a.type == Type.F16 else a.nelements * 2, b.nelements * 2, node.nelements * 2]
        scratch, starts = self.scratch_for(sizes)
        weights = a if a.type == Type.F16 else self.converted(a, node, scratch, starts[0])
        acts = self.converted(b, node, scratch, starts[1])
        result = new_tensor(Type.F16, node.shape, f"{node.name}:f16")
        tensor_alloc(scratch, result, starts[2])
        wa, ba, ra = batched_views(cp, weights, acts, result)
        cp.matmul(ba, wa.swapaxes(-1, -2), out=ra)
        batched_views(cp, weights, acts, node)[2][...] = ra  # F16 -> F32, on the stream
