"""benchmarks/bench_metal.py: its arguments, its refusal without a Mac, and its measuring
code driven once through the fake of Metal (values checked, timings meaningless: the
fake is NOT Metal). The figures themselves come only from a Mac (scripts/metal-check.sh)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from fake_metal import FakeMetal, FakeObjC

import tensorplug as tp
import tensorplug_metal
from tensorplug_kernels.emulate import pocl_emulator
from tensorplug_metal.reg import MetalReg

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_metal.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_metal", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(SCRIPT.parent))  # as when run: it imports its sibling scripts
    sys.modules["bench_metal"] = module
    spec.loader.exec_module(module)
    return module


def test_arguments_and_their_checks(bench: ModuleType) -> None:
    args = bench.parse_args([])
    assert args.device == "Metal0" and args.matmul == [(4096, 4096, 512)]
    assert args.decode == [(4096, 4096), (14336, 4096)] and args.nodes == 300
    quick = bench.parse_args(["--quick", "--device", "Metal1"])
    assert quick.matmul == [(1024, 1024, 128)] and quick.time == 0.2 and quick.device == "Metal1"
    for bad in (["--decode", "0x8"], ["--nodes", "2"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_without_metal_it_says_why_and_exits_2(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    value, reason = tensorplug_metal.score()
    if value:
        pytest.skip("a Metal device is here: the benchmark would run")
    assert bench.main(["--quick"]) == 2
    assert (
        capsys.readouterr().err.strip() == f"bench_metal: no Metal device to measure on: {reason}"
    )


def test_the_measurements_run_end_to_end_on_the_fake(bench: ModuleType) -> None:
    pytest.importorskip("pyopencl", reason="the fake runs kernels on PoCL")
    try:
        emulator = pocl_emulator(128)
    except tp.BackendUnavailableError as e:
        pytest.skip(str(e))
    objc = FakeObjC()
    backend = MetalReg(FakeMetal(emulator, objc), objc).devices()[0].init_backend()
    b = bench.Bench(backend, tp.init_by_name("CPU"), 0.0)
    results = {
        "device": "fake",
        "matmul": [b.matmul(t, 48, 64, 16) for t in ("f32", "f16")],
        "decode": [b.decode(t, 64, 64) for t in ("q4_0", "q8_0")],
        "replay": b.replay(12),
    }
    assert all(r["nmse_vs_numpy"] < 1e-10 for r in results["matmul"])  # the same product
    assert all(r["weights_gb_s"] > 0 and r["cpu_gb_s"] > 0 for r in results["decode"])
    assert results["replay"]["nodes"] >= 12
    text = bench.report(results)
    assert "mul_mat f16 48x64x16" in text and "decode q8_0 64x64" in text and "replay: " in text
