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

cupy refuses cuBLAS inside a CUDA-graph capture (NotImplementedError), so plans with
such nodes are never captured (:mod:`.plan`). Where cuBLAS cannot be loaded (its wheel
missing) or its temporaries do not fit, the node falls back to the shared kernels.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from tensorplug.errors import TensorplugError
from tensorplug.opcodes import Op
from tensorplug.tensor import Tensor, new_tensor
from tensorplug.transfer import tensor_alloc
from tensorplug.types import Type
from tensorplug_kernels.launch import nrows, round_up, row_launch, tensor_arg
from tensorplug_kernels.source import QUANT

from .buffer import CUDABuffer
from .errors import OutOfMemoryError, cuda_errors, is_out_of_memory, translate
from .settings import CUBLAS, CUBLAS_F16

if TYPE_CHECKING:
    from .backend import CUDABackend

__all__ = ["FLOAT_MIN_TOKENS", "QUANT_MIN_TOKENS", "CublasMatmul", "min_tokens"]

log = logging.getLogger(__name__)

#: Tokens from which float weights go to cuBLAS (ggml's mat-vec kernels take up to 8).
FLOAT_MIN_TOKENS = 9
#: Quantized weights are converted in full first: worth it only for long batches.
QUANT_MIN_TOKENS = 64

_FLOAT = frozenset({Type.F32, Type.F16, Type.BF16})
#: Scratch regions start at this alignment (cuBLAS wants 16 bytes; the kernels 256).
_ALIGN = 256


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


class CublasMatmul:
    """The cuBLAS path of one backend, with its scratch buffer for converted weights."""

    def __init__(self, backend: CUDABackend) -> None:
        self.backend = backend
        self.enabled = CUBLAS.get()
        self.half = CUBLAS_F16.get()  # F16 operands (tensor cores) for F16/quantized weights
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

    def half_precision(self, weights: Tensor) -> bool:
        """True when a product with ``weights`` runs on F16 operands (tensor cores)."""
        return self.half and weights.type is not Type.BF16 and weights.type is not Type.F32

    def run(self, node: Tensor) -> bool:
        """Compute ``node`` on the backend's stream; False when it must fall back to the
        kernels (no cuBLAS here, or no memory for its temporaries)."""
        backend = self.backend
        cp = backend.device.cp
        a, b = node.src
        try:
            with backend.stream:
                if self.half_precision(a):
                    self._run_half(cp, a, b, node)
                else:
                    weights = a if a.type == Type.F32 else self._as_f32(a, node)
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

    def _run_half(self, cp: Any, a: Tensor, b: Tensor, node: Tensor) -> None:
        """``node`` from F16 copies of its operands: the weights (unless already F16) and
        the activations in scratch, an F16 result there too, widened into ``node``."""
        sizes = [0 if a.type == Type.F16 else a.nelements * 2, b.nelements * 2, node.nelements * 2]
        starts = [0]
        for size in sizes[:-1]:
            starts.append(starts[-1] + round_up(size, _ALIGN))
        scratch = self._scratch(starts[-1] + sizes[-1])
        weights = a if a.type == Type.F16 else self._convert_into(scratch, starts[0], a, node)
        acts = self._convert_into(scratch, starts[1], b, node)
        result = new_tensor(Type.F16, node.shape, f"{node.name}:f16")
        tensor_alloc(scratch, result, starts[2])
        wa, ba, ra = batched_views(cp, weights, acts, result)
        cp.matmul(ba, wa.swapaxes(-1, -2), out=ra)
        batched_views(cp, weights, acts, node)[2][...] = ra  # F16 -> F32, on the stream

    def _scratch(self, nbytes: int) -> CUDABuffer:
        """The backend's scratch buffer for converted operands, at least ``nbytes``."""
        if self.scratch is None or self.scratch.size < nbytes:
            if self.scratch is not None:
                self.backend.stream.synchronize()  # queued work may still read the old one
                self.scratch.free()
                self.scratch = None
            buf = self.backend.device.buffer_type().alloc_buffer(nbytes)
            assert isinstance(buf, CUDABuffer)
            self.scratch = buf
        return self.scratch

    def _as_f32(self, a: Tensor, node: Tensor) -> Tensor:
        """``a`` as F32 at the start of the scratch buffer (queued on the stream)."""
        return self._convert_into(self._scratch(a.nelements * 4), 0, a, node, Type.F32)

    def _convert_into(
        self, scratch: CUDABuffer, offset: int, src: Tensor, node: Tensor, to: Type = Type.F16
    ) -> Tensor:
        """A contiguous ``to`` copy of ``src`` at ``offset`` in ``scratch``, by ``k_cpy``."""
        t = new_tensor(to, src.shape, f"{src.name}:{to.name.lower()}")
        tensor_alloc(scratch, t, offset)
        backend = self.backend
        for launch in row_launch(
            "k_cpy", nrows(src), backend.device.limits, s=tensor_arg(src), d=tensor_arg(t),
            reshape=0,
        ):  # fmt: skip
            backend.issue(backend.bind(launch, node, backend.runtime_buffers(launch.scratch)))
        return t

    def free(self) -> None:
        if self.scratch is not None:
            self.scratch.free()
            self.scratch = None
