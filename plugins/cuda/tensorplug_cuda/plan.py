"""Graph plans replayed as captured CUDA graphs.

A plan is the runtime base's (:class:`~tensorplug_kernels.runtime.GPUGraphPlan`: every
node encoded and every launch bound once). Computing it the first time launches them
one by one (a warm-up, as ggml's: kernels load, and a plan computed once gains nothing
from capture). From the second compute on, the launches are captured on the stream
(``Stream.begin_capture``/``end_capture``) into a CUDA graph, and every compute after
that is one ``Graph.launch``: the Python and driver cost of hundreds of launches
becomes one call. That is what decode steps, the same small graph every token, need.
``graph_compute`` makes the same plans itself for the graphs it sees again
(:mod:`.replay`), so callers that never make a plan (the scheduler) get them too.

Capture needs stable addresses and values that come from memory, not from arguments:
a plan refers to the tensors' memory as it was when it was bound (re-allocating means
``graph_plan_update``, which rebinds and drops the captured graph), and positions or
cache rows are read from tensors by the kernels. A plan is launched eagerly, never
captured, when it holds a cuBLAS node (cupy refuses cuBLAS during a capture), when
``TENSORPLUG_CUDA_GRAPHS=0``, on GPUs older than Volta (as in ggml), and, with the
reason logged, when a capture fails: the work is then launched eagerly at once, so a
compute never fails because of capture.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from tensorplug.graph import Graph
from tensorplug.tensor import Tensor
from tensorplug_kernels.runtime import GPUGraphPlan

from .errors import KernelLaunchError, cuda_errors
from .settings import GRAPHS

if TYPE_CHECKING:
    from .backend import CUDABackend

__all__ = ["CUDAGraphPlan", "graphs_refused"]

log = logging.getLogger(__name__)

_FAILED = "capture failed"

#: Computes launched eagerly before a plan is captured.
WARM_UP = 1


def graphs_refused(backend: CUDABackend) -> str:
    """Why ``backend`` never captures CUDA graphs, "" when it may (read at each call:
    the setting is an environment variable a user may change between computes)."""
    if not GRAPHS.get():
        return "TENSORPLUG_CUDA_GRAPHS=0"
    if backend.device.info.major < 7:
        return "CUDA graphs are used from Volta (compute capability 7.0) on"
    return ""


class CUDAGraphPlan(GPUGraphPlan):
    """A graph bound for repeated computes on one backend, captured once warm.

    ``label`` names what the plan serves in the log line of a failed capture: a user's
    graph plan, or ``graph_compute``'s own cache of plans (:mod:`.replay`).
    """

    backend: CUDABackend

    def __init__(self, backend: CUDABackend, graph: Graph, label: str = "graph plan") -> None:
        self.label = label
        self.replays = 0
        super().__init__(backend, graph)

    def bind(self, graph: Graph) -> None:
        super().bind(graph)
        self.cuda_graph: Any = None
        self.computes = 0
        self.not_captured = self._capture_refused()  # why it is never captured; "" if it may be

    def _capture_refused(self) -> str:
        if why := graphs_refused(self.backend):
            return why
        if any(isinstance(s, Tensor) for s in self.steps):
            return "the plan has cuBLAS nodes, which cupy cannot capture"
        if not self.steps:
            return "the plan launches nothing"  # only views: nothing worth a CUDA graph
        return ""

    @property
    def capture_failed(self) -> bool:
        """A capture was tried and failed (the plan launches eagerly from then on)."""
        return self.not_captured.startswith(_FAILED)

    def _capture(self) -> Any:
        stream = self.backend.stream
        stream.begin_capture()
        try:
            self.backend.run(self.steps)
        except BaseException:
            try:
                stream.end_capture()  # leave capture mode; the partial graph is dropped
            except Exception as e:  # an invalidated capture reports itself here too
                log.debug("ending a failed capture: %s", e)
            raise
        return stream.end_capture()

    def _compute(self) -> None:
        backend = self.backend
        capture_errors: tuple[type[BaseException], ...] = (
            KernelLaunchError, NotImplementedError, *cuda_errors(backend.cp)
        )  # fmt: skip
        if self.cuda_graph is None and not self.not_captured and self.computes >= WARM_UP:
            try:
                self.cuda_graph = self._capture()
            except capture_errors as e:
                self.not_captured = f"{_FAILED} ({type(e).__name__}: {e})"
                log.info("%s: %s launched without a CUDA graph: %s",
                         backend.name, self.label, self.not_captured)  # fmt: skip
        if self.cuda_graph is not None:
            self.cuda_graph.launch(backend.stream)
            self.replays += 1
        else:
            backend.run(self.steps)
        self.computes += 1

    def release(self) -> None:
        super().release()
        self.cuda_graph = None
