"""The PoCL emulator the CUDA and Metal fakes run their launches on.

An emulated device here keeps tensors in host memory and computes each node by
encoding it as a GPU backend would and running the launches through
:class:`~tensorplug_kernels.emulate.PoclEmulator`; the conformance kit then judges it
against the CPU backend. This checks the emulator, not CUDA or Metal.
"""

from __future__ import annotations

import numpy as np
import pytest

import tensorplug as tp
from tensorplug.graph import Graph
from tensorplug.host import HostBuffer, HostBufferType, host_memory
from tensorplug.tensor import Tensor
from tensorplug.testing import catalogue, run_cases
from tensorplug_kernels import Limits, encode, supports
from tensorplug_kernels.emulate import HostRuntimeBuffers, PoclEmulator, pocl_emulator

pytest.importorskip("pyopencl", reason="pyopencl is not installed")

LIMITS = Limits(wg=64, local_mem=32 * 1024, gpu=True, scratch=True)


@pytest.fixture(scope="module")
def emulator() -> PoclEmulator:
    try:
        return pocl_emulator(LIMITS.wg)
    except tp.BackendUnavailableError as e:
        pytest.skip(str(e))


class _EmulatedBackend(tp.Backend):
    def __init__(self, device: tp.Device, emulator: PoclEmulator) -> None:
        super().__init__(device)
        self.emulator = emulator
        self.runtime = HostRuntimeBuffers()

    def _memory(self, what: object) -> np.ndarray:
        if isinstance(what, str):
            return self.runtime(what)
        assert isinstance(what, Tensor)
        base = what.view_src if what.view_src is not None else what
        assert isinstance(base.buffer, HostBuffer)
        return base.buffer.data

    def _graph_compute(self, graph: Graph) -> tp.Status:
        for node in graph.nodes:
            launches = encode(node, LIMITS)
            self.runtime.reserve(launches)
            for launch in launches:
                self.emulator.run(launch, self._memory)
        return tp.Status.SUCCESS


class _EmulatedDevice(tp.Device):
    def __init__(self, reg: tp.Reg, emulator: PoclEmulator) -> None:
        super().__init__(reg)
        self.emulator = emulator
        self._buft = HostBufferType(self, name="EMU0")

    name = property(lambda self: "EMU0")
    description = property(lambda self: "shared kernels on PoCL, host memory")
    type = property(lambda self: tp.DeviceType.ACCEL)

    def memory(self) -> tuple[int, int]:
        return host_memory()

    def _init_backend(self, params: str | None) -> _EmulatedBackend:
        return _EmulatedBackend(self, self.emulator)

    def buffer_type(self) -> tp.BufferType:
        return self._buft

    def supports_op(self, op: Tensor) -> bool:
        return supports(op, LIMITS)

    def supports_buft(self, buft: tp.BufferType) -> bool:
        return buft is self._buft


class _EmulatedReg(tp.Reg):
    name = property(lambda self: "EMU")

    def __init__(self, emulator: PoclEmulator) -> None:
        self._devices = [_EmulatedDevice(self, emulator)]

    def devices(self) -> list[tp.Device]:
        return self._devices


@pytest.mark.parametrize(
    "ops", [["mul_mat"], ["soft_max", "rope", "rms_norm"], ["get_rows", "set_rows", "cpy"]],
    ids=lambda ops: "+".join(ops),
)
def test_launches_run_on_the_emulator_agree_with_the_cpu_backend(
    emulator: PoclEmulator, ops: list[str]
) -> None:
    backend = _EmulatedReg(emulator).devices()[0].init_backend()
    cpu = tp.registry.init_by_name("CPU")
    before = emulator.launches
    report = run_cases(catalogue(False, ops), backend, cpu)
    failed = [(r.case, r.message) for r in report.results if r.outcome.name == "FAIL"]
    passed = sum(r.outcome.name == "PASS" for r in report.results)
    assert not failed
    assert passed >= 10 and emulator.launches >= before + passed  # the kernels really ran


def test_a_bad_launch_is_refused_before_it_runs(emulator: PoclEmulator) -> None:
    with pytest.raises(ValueError, match="not a multiple"):
        emulator.launch("k_unary", b"", [], (65,), (64,))
    with pytest.raises(TypeError, match="writable 1-D uint8"):
        emulator.launch("k_unary", b"", [np.zeros(4, np.float32)], (64,), (64,))
