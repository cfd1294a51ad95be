"""Nodes a vendor library computes instead of the shared kernels (CUDA's cuBLAS GEMM;
MPS or CLBlast would be the same shape).

A :class:`LibraryOp` is one such path of one backend. The backend lists its library ops
in ``library_ops``; the base claims the nodes one of them takes (``GPUBackend.claims``:
they stay nodes in a bound graph, and plans holding them are never captured) and computes
them through it (``GPUBackend.compute_node``). A node the library cannot do after all
falls back to the shared kernels, so a library never makes a compute fail that the
kernels would do:

* no memory for the library's temporaries (a :class:`DeviceOutOfMemoryError`, or a
  driver error the device translates into one): logged, the kernels compute the node;
* the library missing or unusable when first called (``unavailable_errors``, as a wheel
  without its shared library raises): ``unavailable`` says why, one warning is logged,
  and the path takes no node again;
* any other driver error is raised as the device translates it, naming the node.

Operands the library cannot read as they are (quantized weights, F32 activations for an
F16 product) are converted by the shared ``k_cpy`` kernel into a scratch buffer the path
keeps (:meth:`LibraryOp.scratch_for`, :meth:`LibraryOp.converted`), queued before the
library call on the same queue.

A runtime fills in ``library`` (its name in messages), ``_takes(node)`` and
``_run(node)`` (queue the node's work on the backend's queue, the device current).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

from tensorplug.errors import TensorplugError
from tensorplug.tensor import Tensor, new_tensor
from tensorplug.transfer import tensor_alloc
from tensorplug.types import Type

from ..launch import nrows, round_up, row_launch, tensor_arg
from .errors import DeviceOutOfMemoryError

if TYPE_CHECKING:
    from tensorplug.buffer import Buffer

    from .backend import GPUBackend

__all__ = ["LibraryOp"]


class LibraryOp(ABC):
    """A vendor library's path for some nodes, on one backend (see the module docstring).

    ``enabled``: False turns the path off (a setting); ``unavailable``: why the library
    could not be used, once it failed to load ("" until then).
    """

    #: the library, in messages ("cuBLAS")
    library: ClassVar[str]
    #: what calling a library that is missing or unusable raises
    unavailable_errors: ClassVar[tuple[type[BaseException], ...]] = (ImportError, OSError)
    #: scratch regions start at this alignment (the kernels' 256 covers every library's)
    align: ClassVar[int] = 256

    def __init__(self, backend: GPUBackend, enabled: bool = True) -> None:
        self.backend = backend
        self.enabled = enabled
        self.unavailable = ""
        self.scratch: Buffer | None = None
        self.log = logging.getLogger(type(self).__module__)

    # -- hooks ---------------------------------------------------------------------------

    @abstractmethod
    def _takes(self, node: Tensor) -> bool:
        """True for a node this path computes (the switches are checked already)."""

    @abstractmethod
    def _run(self, node: Tensor) -> None:
        """Queue ``node``'s work on the backend's queue (the device current)."""

    # -- written once ----------------------------------------------------------------------

    def takes(self, node: Tensor) -> bool:
        """True when this path computes ``node``."""
        return self.enabled and not self.unavailable and self._takes(node)

    def run(self, node: Tensor) -> bool:
        """Queue ``node``'s work through the library; False when the kernels must compute
        it instead (nothing of it was queued, or only conversions nobody reads)."""
        backend = self.backend
        device = backend.device
        try:
            self._run(node)
        except NotImplementedError:  # a call the API refuses now (inside a capture)
            raise
        except DeviceOutOfMemoryError as e:
            return self._no_memory(node, e)
        except TensorplugError:
            raise
        except device.driver_errors as e:
            what = f"{backend.name}: {self.library} {node.op.value} {node.describe()}"
            err = device.translate(e, what)
            if isinstance(err, DeviceOutOfMemoryError):
                return self._no_memory(node, err)
            raise err from e
        except self.unavailable_errors as e:
            self.unavailable = f"{type(e).__name__}: {e}"
            self.log.warning(
                "%s: %s is unavailable (%s); %s uses the shared kernels",
                backend.name, self.library, self.unavailable, node.op.value,
            )  # fmt: skip
            return False
        return True

    def _no_memory(self, node: Tensor, err: Exception) -> bool:
        self.log.info(
            "%s: no memory for %s's temporaries for %s, using the kernels: %s",
            self.backend.name, self.library, node.describe(), err,
        )  # fmt: skip
        return False

    # -- converted operands ----------------------------------------------------------------

    def scratch_for(self, sizes: list[int]) -> tuple[Buffer, list[int]]:
        """The scratch buffer, grown to hold regions of ``sizes`` bytes one after another,
        and where each region starts (at multiples of ``align``). Growing replaces the
        buffer once the queue has finished the work that may read the old one."""
        starts = [0]
        for size in sizes[:-1]:
            starts.append(starts[-1] + round_up(size, self.align))
        nbytes = starts[-1] + sizes[-1]
        if self.scratch is None or self.scratch.size < nbytes:
            if self.scratch is not None:
                with self.backend.device.driver("waiting for queued work"):
                    self.backend._synchronize()  # not synchronize: no error word mid-compute
                self.free()
            self.scratch = self.backend.device.buffer_type().alloc_buffer(nbytes)
        return self.scratch, starts

    def converted(
        self, src: Tensor, node: Tensor, scratch: Buffer, offset: int, to: Type = Type.F16
    ) -> Tensor:
        """A contiguous ``to`` copy of ``src`` at ``offset`` in ``scratch``, queued by the
        shared ``k_cpy`` kernel (launches of ``node``, in messages)."""
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
        """Give the scratch buffer back (at the backend's ``free``, or to grow it)."""
        if self.scratch is not None:
            self.scratch.free()
            self.scratch = None
