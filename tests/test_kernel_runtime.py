"""The GPU runtime base (``tensorplug_kernels.runtime``) where no single runtime's tests
reach: one rule for graph plans across every backend, a program whose kernels are not
the shared dialect (as WebGPU's WGSL will be), and the one registration per process.

OpenCL runs on PoCL; CUDA and Metal run over their fakes (``fake_cupy``, ``fake_metal``),
whose launches run the same kernels on PoCL.
"""

from __future__ import annotations

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
    KernelBuildError,
    KernelLaunchError,
    KernelProgram,
    process_wide,
)
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
