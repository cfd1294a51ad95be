"""The context: its default (trained length capped by memory), -c past the trained length,
the end of the context (a clear stop, or llama.cpp's context shift) and -n -1."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tensorplug.cli import main
from tensorplug.gguf import GGUFFile
from tensorplug.types import Type
from tensorplug_llm.context import (
    FIT_MARGIN,
    MIN_FITTED_CONTEXT,
    bytes_per_position,
    choose_context,
    generate_with_shift,
)
from tensorplug_llm.model import LlamaConfig
from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.runner import ModelRunner
from tensorplug_llm.sampling import Sampler
from tensorplug_llm.tiny import write_tiny_llama

MiB = 1 << 20


class _Device:
    """A device whose free memory the test sets."""

    def __init__(self, name: str, free: int) -> None:
        self.name, self.free = name, free

    def memory(self) -> tuple[int, int]:
        return self.free, 2 * self.free


@pytest.fixture(scope="module")
def long_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny llama trained (by its metadata) on 32768 positions."""
    path = tmp_path_factory.mktemp("ctx") / "tiny-32k.gguf"
    return write_tiny_llama(path, "f32", 5, n_ctx=32768)


def _placement(*devices: _Device, n_layer: int = 2) -> Any:
    layers = [devices[i * len(devices) // n_layer] for i in range(n_layer)]
    return SimpleNamespace(input=devices[0], layers=layers, output=devices[-1])


def test_bytes_per_position_counts_kv_rows_and_attention_scores(long_model: Path) -> None:
    cfg = LlamaConfig.from_gguf(GGUFFile(long_model))
    # tiny: n_embd 64, 4 heads of 16, 2 KV heads -> K and V rows of 32 values per block
    assert (cfg.n_embd_kv, cfg.n_head) == (32, 4)
    assert bytes_per_position(cfg, Type.F16, 2, 256) == 2 * 2 * 32 * 2 + 256 * (2 * 4 * 4 + 2)
    assert bytes_per_position(cfg, Type.F32, 1, 8) == 2 * 1 * 32 * 4 + 8 * (2 * 4 * 4 + 2)


def test_the_default_is_the_trained_length_capped_by_free_memory(long_model: Path) -> None:
    f = GGUFFile(long_model)
    cfg = LlamaConfig.from_gguf(f)
    weights = sum(t.nbytes for t in f.tensors.values())
    roomy = _Device("Big0", 64 << 30)
    choice = choose_context(f, cfg, _placement(roomy), Type.F16, 256)
    assert choice.n_ctx == 32768 and "trained length" in choice.reason
    # room for exactly 5000 positions after the weights and the margin
    per = bytes_per_position(cfg, Type.F16, 2, 256)
    tight = _Device("Small0", weights + FIT_MARGIN + 5000 * per + per // 2)
    choice = choose_context(f, cfg, _placement(tight), Type.F16, 256)
    assert choice.n_ctx == 5000
    assert "capped by memory" in choice.reason and "Small0" in choice.reason
    # two devices: the one with less room decides (each holds one block)
    per_one = bytes_per_position(cfg, Type.F16, 1, 256)
    a = _Device("A0", 64 << 30)
    b = _Device("B0", FIT_MARGIN + 3000 * per_one + 40 * MiB)  # B0 also holds the output
    held = sum(t.nbytes for n, t in f.tensors.items() if not n.startswith(("blk.0.", "token")))
    choice = choose_context(f, cfg, _placement(a, b), Type.F16, 256)
    assert choice.n_ctx == (b.free - held - FIT_MARGIN) // per_one and "B0" in choice.reason
    # too little for anything: the old default is tried, and the reason says it may not fit
    starved = _Device("Tiny0", 10 * MiB)
    choice = choose_context(f, cfg, _placement(starved), Type.F16, 256)
    assert choice.n_ctx == MIN_FITTED_CONTEXT and "may not fit" in choice.reason
    # a device that cannot tell its memory caps nothing
    unknown = _Device("Mystery0", 0)
    assert choose_context(f, cfg, _placement(unknown), Type.F16, 256).n_ctx == 32768
    # -c wins
    assert choose_context(f, cfg, _placement(starved), Type.F16, 256, requested=64).n_ctx == 64


def test_the_run_header_says_what_context_was_chosen_and_why(
    long_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", str(long_model), "--device", "CPU", "--tokens", "1", "-n", "1"]) == 0
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("context: "))
    n_ctx = int(line.split()[1])
    assert 512 <= n_ctx <= 32768  # the trained length, or what this machine's memory holds
    assert ("trained length, which fits" in line) == (n_ctx == 32768), line
    assert "capped by memory" in line or n_ctx == 32768


@pytest.mark.parametrize(
    ("scaling", "said"),
    [
        (None, "the file has no rope scaling"),
        (("linear", 4.0), "the file's rope scaling applies (linear, factor 4)"),
        (("yarn", 4.0), "the file's rope scaling applies (YaRN, factor 4 from 64)"),
    ],
)
def test_a_context_past_the_trained_length_warns(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    scaling: tuple[str, float] | None,
    said: str,
) -> None:
    path = write_tiny_llama(tmp_path / "m.gguf", "f32", 1, rope_scaling=scaling)
    args = ["run", str(path), "--device", "CPU", "-c", "512", "--tokens", "1", "-n", "1"]
    assert main(args) == 0
    err = capsys.readouterr().err
    warning = [x for x in err.splitlines() if x.startswith("warning: ")]
    assert len(warning) == 1 and "longer than the trained 256" in warning[0]
    assert said in warning[0]
    assert "context: 512 tokens" in err
    assert main(["run", str(path), "--device", "CPU", "-c", "256", "--tokens", "1", "-n", "1"]) == 0
    assert "warning: " not in capsys.readouterr().err


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("shift") / "tiny.gguf", "f32", 7)


def _generated(err: str) -> int:
    """Tokens evaluated one at a time (the runner's generation count)."""
    m = re.search(r"generation:\s+(\d+) tokens", err)
    return int(m[1]) if m else 0


def test_minus_one_runs_until_the_context_is_full_and_says_so(
    small: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["run", str(small), "--device", "CPU", "-c", "32", "--tokens", "1,300", "-n", "-1"]
    assert main([*args, "--ignore-eos"]) == 0
    err = capsys.readouterr().err
    assert "(stopped: the context is full (32 tokens); -c enlarges it, --context-shift" in err
    # 2 prompt tokens + 30 evaluated fill the 32 positions; a 31st token is sampled, not read
    assert _generated(err) == 30


def test_context_shift_keeps_the_first_tokens_and_drops_half_of_the_rest(small: Path) -> None:
    m = ModelRunner(small, placement=Placement.on(host_cpu(), 2), n_ctx=32, warmup=False)
    try:
        prompt = [1, 300, 301, 302, 303]
        shifts: list[tuple[int, int]] = []
        gen = generate_with_shift(
            m, prompt, 60, Sampler(), n_keep=3, stop_at_eos=False,
            on_shift=lambda kept, dropped: shifts.append((kept, dropped)),
        )  # fmt: skip
        assert len(gen.tokens) == 60
        # llama.cpp: n_discard = (n_past - n_keep) / 2 when the 32 positions are full
        assert shifts[0] == (3, (32 - 3) // 2)
        # independently: a fresh context given the shortened text continues the same way
        m.reset()
        first = m.generate(prompt, 60, stop_at_eos=False).tokens
        assert first == gen.tokens[: len(first)] and len(first) == 32 - len(prompt) + 1
        history = prompt + first
        shortened = history[:3] + history[3 + shifts[0][1] :]
        m.reset()
        after = m.generate(shortened, 5, stop_at_eos=False).tokens
        assert gen.tokens[len(first) : len(first) + 5] == after
    finally:
        m.close()


def test_run_with_context_shift_generates_past_the_context(
    small: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["run", str(small), "--device", "CPU", "-c", "32", "--tokens", "1,300", "-n", "80"]
    assert main([*args, "--ignore-eos", "--context-shift", "--keep", "1"]) == 0
    err = capsys.readouterr().err
    assert "(context shifted" in err and "kept the first 2 tokens" in err  # BOS + 1
    assert "context is full" not in err
