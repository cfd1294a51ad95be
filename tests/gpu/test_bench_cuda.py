"""benchmarks/bench_cuda.py: its arguments, its refusal without a GPU, and its measuring
code driven once through the fake of cupy (values checked, timings meaningless: the
fake is NOT CUDA). The figures themselves come only from a GPU (scripts/gpu-check.sh)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from fake_cupy import FakeCupy

import tensorplug as tp
import tensorplug_cuda
from tensorplug_cuda.reg import CUDAReg
from tensorplug_kernels.emulate import pocl_emulator

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_cuda.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_cuda", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(SCRIPT.parent))  # as when run: it imports its sibling bench_opencl
    sys.modules["bench_cuda"] = module
    spec.loader.exec_module(module)
    return module


def test_arguments_and_their_checks(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    args = bench.parse_args([])
    assert args.device == "CUDA0" and args.matmul == [(4096, 4096, 512), (11008, 4096, 512)]
    assert args.decode == [(4096, 4096), (14336, 4096)] and args.nodes == 300
    quick = bench.parse_args(["--quick", "--device", "CUDA1"])
    assert quick.matmul == [(1024, 1024, 128)] and quick.time == 0.2 and quick.device == "CUDA1"
    for bad in (["--matmul", "4096xfour"], ["--decode", "0x8"], ["--nodes", "2"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
    assert "sizes like 4096x4096x512" in capsys.readouterr().err


def test_without_a_gpu_it_says_why_and_exits_2(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    value, reason = tensorplug_cuda.score()
    if value:
        pytest.skip("a GPU is here: the benchmark would run")
    assert bench.main(["--quick"]) == 2
    assert capsys.readouterr().err.strip() == f"bench_cuda: no GPU to measure on: {reason}"


def test_the_measurements_run_end_to_end_on_the_fake(bench: ModuleType) -> None:
    pytest.importorskip("pyopencl", reason="the fake runs kernels on PoCL")
    try:
        fake = FakeCupy(pocl_emulator(128))
    except tp.BackendUnavailableError as e:
        pytest.skip(str(e))
    backend = CUDAReg(fake).devices()[0].init_backend()
    b = bench.Bench(backend, 0.0)
    results = {
        "device": "fake",
        "matmul": [b.matmul(t, 48, 64, 16) for t in ("f32", "f16")],
        "decode": [b.decode(t, 64, 64) for t in ("q4_0", "q8_0")],
        "replay": b.replay(12),
    }
    assert all(r["nmse_vs_cupy"] < 1e-6 for r in results["matmul"])  # the same product
    assert all(r["captured"] for r in results["decode"])
    assert results["replay"]["nodes"] >= 12 and results["replay"]["captured"]
    assert results["replay"]["graph_compute_replays"] >= 1  # graph_compute replays it too
    text = bench.report(results)
    assert text.count("mul_mat") == 2 and text.count("decode") == 2 and "CUDA graph" in text
