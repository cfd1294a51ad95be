"""The GPU runtime base (``tensorplug_kernels.runtime``) where no single runtime's tests
reach: one rule for graph plans across every backend, a program whose kernels are not
the shared dialect (as WebGPU's WGSL will be), the one registration per process, and
the base's captured plans, library ops and mapped views on a runtime of their own (a
toy over OpenCL) rather than only through CUDA's and Metal's.

OpenCL runs on PoCL; CUDA and Metal run over their fakes (``fake_cupy``, ``fake_metal``),
whose launches run the same kernels on PoCL.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fake_cupy import FakeCupy, FakeGPU
from fake_metal import FakeMetal, FakeObjC

import tensorplug as tp
from tensorplug import ops
from tensorplug_kernels.emulate import PoclEmulator, pocl_emulator
from tensorplug_kernels.runtime import (
    BuildFailed,
    CapturedPlan,
    DeviceOutOfMemoryError,
    KernelBuildError,
    KernelLaunchError,
    KernelProgram,
    LibraryOp,
    ReplayingBackend,
    process_wide,
)
from tensorplug_kernels.runtime.mapped import MappedBuffer
from tensorplug_kernels.source import Source


@pytest.fixture(scope="module")
def emulator() -> PoclEmulator:
    pytest.importorskip("pyopencl", reason="the kernels run on PoCL: pip install pyopencl")
    try:
        return pocl_emulator(128)
    except tp.BackendUnavailableError as e:
        pytest.skip(str(e))


@pytest.fixture
def backends(emulator: PoclEmulator) -> Iterator[dict[str, Any]]:
    """A backend of every runtime on the base, two on one OpenCL device, and the CPU's."""
    from tensorplug_cuda.reg import CUDAReg
    from tensorplug_metal.reg import MetalReg
    from tensorplug_opencl.reg import create_reg

    objc = FakeObjC()
    opencl = create_reg().devices()[0]
    made = {
        "OpenCL": opencl.init_backend(),
        "OpenCL, another queue": opencl.init_backend(),
        "CUDA": CUDAReg(FakeCupy(emulator, FakeGPU())).devices()[0].init_backend(),
        "Metal": MetalReg(FakeMetal(emulator, objc), objc).devices()[0].init_backend(),
        "CPU": tp.registry.init_by_name("CPU"),
    }
    yield made
    for backend in made.values():
        backend.free()


def test_a_plan_belongs_to_the_backend_that_made_it_on_every_runtime(
    backends: dict[str, Any],
) -> None:
    """Another backend's plan is a TypeMismatchError wherever it is handed (the CPU
    backend's rule, now every GPU runtime's); a freed plan is an UnsupportedError."""
    for maker_name, maker in backends.items():
        a = tp.new_tensor("f32", (4, 32), "a")
        y = ops.scale(a, 2.0)
        graph = tp.Graph(y)
        tp.alloc_tensors([a, *graph.nodes], maker.buffer_type())
        tp.set_array(a, np.ones((4, 32), np.float32))
        plan = maker.graph_plan_create(graph)
        for other in backends.values():
            if other is not maker:
                with pytest.raises(tp.TypeMismatchError, match="another backend|not created by"):
                    other.graph_plan_compute(plan)
        maker.graph_plan_compute(plan)
        maker.synchronize()
        np.testing.assert_array_equal(tp.get_array(y), np.full((4, 32), 2.0), err_msg=maker_name)
        maker.graph_plan_free(plan)
        with pytest.raises(tp.UnsupportedError, match="freed"):
            maker.graph_plan_compute(plan)


class _OwnKernels(KernelProgram):
    """A program of a runtime whose kernels are its own (no shared dialect): each kernel
    compiled from its own text, by name, when first asked for."""

    runtime, compiler = "Toy", "toyc"

    def __init__(self, sources: tuple[Source, ...]) -> None:
        self.compiled: list[str | None] = []
        super().__init__("Toy0", sources)

    @property
    def kernel_names(self) -> set[str]:
        return {"k_one", "k_bad"}

    def _compile(self, text: str, name: str | None) -> Any:
        self.compiled.append(name)
        if "oops" in text:
            raise BuildFailed("src/toy.tpk:3:5: error: use of undeclared identifier 'oops'")
        return ("module", name)

    def _kernel(self, name: str) -> Any:
        return self.compile("oops" if name == "k_bad" else f"// the text of {name}", name)


def test_a_runtime_with_kernels_of_its_own_compiles_them_one_by_one() -> None:
    toy = Source("src/toy.tpk", "// toy\nTP_KERNEL k_bad(TP_ARGS(x) TP_IDS) {\n    oops;\n}\n")
    program = _OwnKernels((toy,))
    assert program.module is None and program.text == "" and program.compiled == []
    assert program.kernel("k_one") is program.kernel("k_one") == ("module", "k_one")
    assert program.compiled == ["k_one"]  # once, by name
    with pytest.raises(KernelLaunchError, match="no kernel 'k_two'.*tensorplug-toy"):
        program.kernel("k_two")
    with pytest.raises(KernelBuildError) as info:
        program.kernel("k_bad")
    err = info.value
    assert err.kernel == "k_bad" and "oops" in err.log
    assert "Toy0: toyc could not compile" in str(err) and "TENSORPLUG_DISABLE=Toy" in str(err)


def test_the_registration_is_made_once_whatever_thread_asks_first() -> None:
    made: list[object] = []

    def make() -> Any:
        time.sleep(0.01)  # long enough for every thread to be waiting
        made.append(object())
        return made[-1]

    create_reg = process_wide(make)
    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(create_reg())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and got == made * 8


# -- captured plans (runtime/replay.py), over OpenCL on PoCL -------------------------------


class _Recording(CapturedPlan):
    """A capture that records the bound steps as a list; a replay runs them again."""

    captured_as = "a recording"
    backend: Any  # _replaying_backend's Replaying: refuse, replayed and released besides

    def _capture(self) -> Any:
        if self.backend.refuse:
            raise KernelLaunchError("the queue refused to record")
        return list(self.steps)

    def _replay(self, handle: Any) -> None:
        self.backend.replayed.append(handle)
        self.backend.run(handle)

    def _release(self, handle: Any) -> None:
        self.backend.released.append(handle)


def _replaying_backend() -> Any:
    """An OpenCL backend that captures its plans (as a WebGPU runtime will record them)."""
    from tensorplug_opencl.backend import OpenCLBackend
    from tensorplug_opencl.reg import create_reg

    class Replaying(ReplayingBackend, OpenCLBackend):
        plan_class = _Recording

        def __init__(self, device: Any) -> None:
            self.refuse, self.off = False, ""
            self.replayed: list[Any] = []
            self.released: list[Any] = []
            super().__init__(device)

        def capture_refused(self) -> str:
            return self.off

    return Replaying(create_reg().devices()[0])


def _scale_graph(backend: Any, rows: int = 4) -> tuple[tp.Graph, tp.Tensor, tp.Buffer]:
    a = tp.new_tensor("f32", (rows, 32), "a")
    y = ops.scale(ops.scale(a, 2.0), 3.0)
    graph = tp.Graph(y)
    buf = tp.alloc_tensors([a, *graph.nodes], backend.buffer_type())
    assert buf is not None
    tp.set_array(a, np.arange(rows * 32, dtype=np.float32).reshape(rows, 32))
    return graph, y, buf


def _expect(y: tp.Tensor, rows: int = 4) -> None:
    want = 6 * np.arange(rows * 32, dtype=np.float32).reshape(rows, 32)
    np.testing.assert_array_equal(tp.get_array(y), want)


def test_a_captured_plan_warms_up_captures_replays_and_releases(emulator: PoclEmulator) -> None:
    backend = _replaying_backend()
    graph, y, buf = _scale_graph(backend)
    plan = backend.graph_plan_create(graph)
    for _ in range(3):  # eager, captured then replayed, replayed
        backend.graph_plan_compute(plan)
        backend.synchronize()
        _expect(y)
    assert plan.replays == 2 and len(backend.replayed) == 2 and not plan.not_captured
    handle = plan.captured
    backend.graph_plan_update(plan, graph)  # rebinding drops what was captured
    assert plan.captured is None and backend.released == [handle]
    backend.graph_plan_free(plan)
    buf.free()
    backend.free()


def test_graph_compute_replays_graphs_seen_before_and_forgets_freed_memory(
    emulator: PoclEmulator,
) -> None:
    backend = _replaying_backend()
    graph, y, buf = _scale_graph(backend)
    for _ in range(3):
        backend.graph_compute(graph)
        _expect(y)
    cache = backend.graphs
    assert (cache.bound, cache.captures, cache.replays) == (1, 1, 2)
    buf.free()  # the cached plan refers to it: dropped, its capture released
    assert not cache.plans and len(backend.released) == 1
    backend.off = "switched off"  # a refusal: every graph is launched eagerly
    graph, y, buf = _scale_graph(backend)
    backend.graph_compute(graph)
    _expect(y)
    assert cache.bound == 1 and not cache.plans
    backend.free()


def test_a_failed_capture_launches_eagerly_and_turns_capture_off(
    emulator: PoclEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    backend = _replaying_backend()
    backend.refuse = True
    graph, y, _ = _scale_graph(backend)
    with caplog.at_level(logging.INFO, logger=__name__):
        for _ in range(3):
            backend.graph_compute(graph)
            _expect(y)  # right numbers whatever happened
    assert backend.graphs.off.startswith("capture failed (KernelLaunchError")
    assert not backend.graphs.plans and not backend.replayed
    lines = [r.getMessage() for r in caplog.records if "without a recording" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("OpenCL0: graph_compute launched")
    a = tp.new_tensor("f32", (4, 8))
    tp.alloc_tensors([a], backend.buffer_type())
    plan = backend.graph_plan_create(tp.Graph(ops.reshape(a, (8, 4))))
    assert plan.not_captured == "the plan launches nothing"
    backend.free()


# -- library ops (runtime/library.py), over OpenCL on PoCL ---------------------------------


class _Library(LibraryOp):
    """A "library" for dup: the source copied to scratch (second region) by the shared
    k_cpy kernel, then into the node; ``fail`` makes its next call raise."""

    library = "toylib"

    def __init__(self, backend: Any) -> None:
        super().__init__(backend)
        self.fail: BaseException | None = None
        self.ran = 0

    def _takes(self, node: tp.Tensor) -> bool:
        return node.op is tp.Op.DUP

    def _run(self, node: tp.Tensor) -> None:
        if self.fail is not None:
            fail, self.fail = self.fail, None
            raise fail
        (src,) = node.src
        scratch, starts = self.scratch_for([64, src.nelements * 2])
        tmp = self.converted(src, node, scratch, starts[1])  # contiguous F16
        assert self.backend.cpy_tensor_async(self.backend, tmp, node)
        self.ran += 1


def test_a_library_op_computes_what_it_takes_and_falls_back_to_the_kernels(
    emulator: PoclEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    from tensorplug_opencl.backend import OpenCLBackend
    from tensorplug_opencl.reg import create_reg

    backend = create_reg().devices()[0].init_backend()
    assert isinstance(backend, OpenCLBackend)
    library = _Library(backend)
    backend.library_ops = (library,)

    def dup(rows: int) -> None:
        a = tp.new_tensor("f16", (rows, 32), "a")
        y = ops.dup(a)
        tp.alloc_tensors([a, y], backend.buffer_type())
        values = np.arange(rows * 32).reshape(rows, 32).astype(np.float16)
        tp.set_array(a, values)
        backend.graph_compute(tp.Graph(y))
        np.testing.assert_array_equal(tp.get_array(y), values)

    dup(2)
    assert library.ran == 1 and library.scratch is not None
    small = library.scratch
    dup(64)  # more than the scratch holds: grown, the old one freed
    assert library.ran == 2 and library.scratch is not small and small.is_freed
    plan = backend.graph_plan_create(tp.Graph(ops.dup(tp.new_tensor("f16", (2, 32)))))
    assert any(isinstance(s, tp.Tensor) for s in plan.steps)  # claimed: stays a node
    library.fail = DeviceOutOfMemoryError("no room")
    dup(2)  # the kernels computed it
    assert library.ran == 2 and not library.unavailable
    library.fail = OSError("libtoy.so: cannot open shared object file")
    with caplog.at_level(logging.WARNING):
        dup(2)
    assert "libtoy.so" in library.unavailable
    assert not backend.claims(ops.dup(tp.new_tensor("f16", (2,))))
    assert sum("toylib is unavailable" in r.getMessage() for r in caplog.records) == 1
    library.fail, library.unavailable = KernelLaunchError("the library crashed"), ""
    with pytest.raises(KernelLaunchError, match="crashed"):
        dup(2)
    library.fail = ValueError("a driver refused an argument")  # pyopencl's: translated
    with pytest.raises(KernelLaunchError, match="OpenCL0: toylib dup .*refused an argument"):
        dup(2)
    backend.free()
    assert library.scratch is None


# -- mapped views (runtime/mapped.py) -------------------------------------------------------


def test_a_tensor_across_views_is_refused_with_the_reason(emulator: PoclEmulator) -> None:
    """A mapped buffer's tensor must lie whole in one view (max_tensor_size says how big
    they may be); one that does not is refused before any kernel sees it."""
    import mmap

    from fake_metal import FakeDeviceSpec

    from tensorplug_metal.reg import MetalReg

    page = mmap.PAGESIZE
    objc = FakeObjC()
    metal = FakeMetal(emulator, objc, FakeDeviceSpec(max_buffer=4 * page))
    dev = MetalReg(metal, objc).devices()[0]
    buf = dev.buffer_from_host_ptr(np.zeros(8 * page, np.uint8), 64)
    assert isinstance(buf, MappedBuffer) and len(buf.views) >= 3
    with pytest.raises(tp.UnsupportedError, match="lie in no single Metal view"):
        buf.binding(page, 3 * page)  # views: [0, 3), [2, 5), [4, 7), [6, 8) pages
    assert buf.binding(0, 64) == (buf.views[0].handle, buf.views[0].shift)
    buf.free()
    assert buf.views == []
