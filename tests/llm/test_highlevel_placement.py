"""Where ``tensorplug_llm.Llama`` puts the blocks over several accelerators: llama.cpp's
``n_gpu_layers``, ``split_mode``, ``main_gpu`` and ``tensor_split``, checked against the
layer split of the llama.cpp that llama-cpp-python 0.3.36 vendors (``load_tensors``:
``upper_bound`` of a block's position over the cumulative shares), on stand-in devices."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tensorplug_llm.highlevel import llama as llama_module
from tensorplug_llm.highlevel.options import load_options
from tensorplug_llm.placement import Placement, host_cpu


@dataclass(frozen=True)
class _Gpu:
    """A stand-in accelerator: a name and its free memory."""

    name: str
    free: int = 8 << 30

    def memory(self) -> tuple[int, int]:
        return self.free, 16 << 30


def _placed(gpus: list[_Gpu], n_layer: int, **keywords: object) -> Placement:
    o = load_options("model.gguf", keywords)
    placement = llama_module._placement(o, n_layer, None)
    assert isinstance(placement, Placement)
    return placement


def _names(placement: Placement) -> tuple[str, list[str], str]:
    return (placement.input.name, [d.name for d in placement.layers], placement.output.name)


@pytest.fixture
def two(monkeypatch: pytest.MonkeyPatch) -> list[_Gpu]:
    gpus = [_Gpu("GPU0", free=6 << 30), _Gpu("GPU1", free=2 << 30)]
    monkeypatch.setattr("tensorplug_llm.placement.accelerators", lambda: gpus)
    return gpus


def test_a_layer_split_follows_tensor_split_as_llama_cpp_does(two: list[_Gpu]) -> None:
    cpu = host_cpu().name
    # every block and the output: positions i/9 against the cumulative shares 0.75, 1
    placed = _placed(two, 8, n_gpu_layers=-1, tensor_split=[3.0, 1.0])
    assert _names(placed) == (cpu, ["GPU0"] * 7 + ["GPU1"], "GPU1")
    # the last four blocks, even shares: 0, 1/4 on the first; 1/2, 3/4 on the second
    placed = _placed(two, 8, n_gpu_layers=4, tensor_split=[1.0, 1.0])
    assert _names(placed) == (cpu, [cpu] * 4 + ["GPU0"] * 2 + ["GPU1"] * 2, cpu)


def test_without_tensor_split_the_free_memory_decides(two: list[_Gpu]) -> None:
    placed = _placed(two, 8, n_gpu_layers=-1)  # 6 and 2 GiB free: as 3 and 1
    assert _names(placed) == _names(_placed(two, 8, n_gpu_layers=-1, tensor_split=[3.0, 1.0]))


def test_split_mode_none_puts_everything_on_main_gpu(two: list[_Gpu]) -> None:
    placed = _placed(two, 8, n_gpu_layers=-1, split_mode=0, main_gpu=1)
    assert _names(placed) == (host_cpu().name, ["GPU1"] * 8, "GPU1")


def test_a_zero_share_leaves_an_accelerator_out(two: list[_Gpu]) -> None:
    placed = _placed(two, 8, n_gpu_layers=-1, tensor_split=[0.0, 1.0])
    assert set(_names(placed)[1]) == {"GPU1"}


def test_main_gpu_past_the_accelerators_is_refused(two: list[_Gpu]) -> None:
    with pytest.raises(
        ValueError, match=r"main_gpu=2: there are 2 accelerators \(0: GPU0, 1: GPU1\)"
    ):
        _placed(two, 8, n_gpu_layers=-1, main_gpu=2)


def test_a_row_split_needs_every_block_offloaded(two: list[_Gpu]) -> None:
    with pytest.raises(ValueError, match="split_mode=2 .* n_gpu_layers=-1"):
        _placed(two, 8, n_gpu_layers=4, split_mode=2)


def test_without_accelerators_everything_stays_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tensorplug_llm.placement.accelerators", lambda: [])
    cpu = host_cpu().name
    for split_mode in (0, 1, 2):
        placed = _placed([], 4, n_gpu_layers=-1, split_mode=split_mode, main_gpu=1)
        assert _names(placed) == (cpu, [cpu] * 4, cpu)
