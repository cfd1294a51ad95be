"""Model files whose hyper-parameters are impossible: each is refused when the model loads,
with a GGUFError naming the GGUF key (or tensor), the value and what it may be — never a
ZeroDivisionError, an op's error that names no key, or a model that runs on a NaN."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensorplug.gguf import GGUFError, GGUFFile
from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.runner import ModelRunner
from tensorplug_llm.tiny import write_tiny_llama

NAN = float("nan")


def _load(path: Path) -> None:
    with ModelRunner(path, placement=Placement.on(host_cpu(), 2), warmup=True) as model:
        model.eval([1, 5, 6])  # never reached: it would run on the bad value


@pytest.mark.parametrize(
    ("arch", "metadata", "match"),
    [
        (
            "llama",
            {"llama.rope.freq_base": 0.0},
            r"llama.rope.freq_base = 0.0; it must be a finite number > 0",
        ),
        (
            "llama",
            {"llama.rope.freq_base": NAN},
            r"llama.rope.freq_base = nan; it must be a finite",
        ),
        ("llama", {"llama.rope.freq_base": -1.0}, r"llama.rope.freq_base = -1.0; it must be"),
        (
            "llama",
            {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": -2.0},
            r"llama.rope.scaling.factor = -2.0; it must be a finite number >= 0",
        ),
        (
            "llama",
            {"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": NAN},
            r"llama.rope.scaling.factor = nan; it must be a finite number >= 0",
        ),
        (
            "gemma3",
            {"gemma3.attention.sliding_window": 0},
            r"gemma3.attention.sliding_window = 0; it must be at least 1",
        ),
        (
            "gemma3",
            {"gemma3.attention.sliding_window": -3},
            r"sliding_window = -3; it must be at least 1",
        ),
        (
            "llama",
            {"llama.block_count": 1},
            r"llama.block_count = 1, but the file holds tensors for 2 blocks",
        ),
        (
            "llama",
            {"llama.attention.key_length": 0},
            r"llama.attention.key_length = 0; it must be between 1 and 65536",
        ),
        (
            "llama",
            {"llama.attention.key_length": 2**31},
            r"llama.attention.key_length = 2147483648; it must be",
        ),
        (
            "llama",
            {"llama.attention.value_length": 0},
            r"llama.attention.value_length = 0; it must be between 1",
        ),
        (
            "llama",
            {"llama.attention.layer_norm_rms_epsilon": NAN},
            r"layer_norm_rms_epsilon = nan; it must be a finite number >= 0",
        ),
        (
            "llama",
            {"llama.attention.layer_norm_rms_epsilon": -1.0},
            r"layer_norm_rms_epsilon = -1.0; it must be",
        ),
        (
            "llama",
            {"llama.feed_forward_length": 0},
            r"llama.feed_forward_length = 0; it must be at least 1",
        ),
    ],
)
def test_impossible_hyper_parameters_are_refused_naming_the_key(
    tmp_path: Path, arch: str, metadata: dict[str, Any], match: str
) -> None:
    path = write_tiny_llama(tmp_path / "bad.gguf", arch=arch, metadata=metadata)
    with pytest.raises(GGUFError, match=match):
        _load(path)


@pytest.mark.parametrize("values", [0.0, NAN, -1.0])
def test_rope_freqs_that_would_divide_by_zero_are_refused(tmp_path: Path, values: float) -> None:
    path = write_tiny_llama(tmp_path / "freqs.gguf", rope_freqs=True)
    info = GGUFFile(path).tensors["rope_freqs.weight"]
    data = bytearray(path.read_bytes())
    zeros = np.full(info.nbytes // 4, values, np.float32).tobytes()
    data[info.offset : info.offset + info.nbytes] = zeros
    path.write_bytes(bytes(data))
    with pytest.raises(
        GGUFError, match=r"'rope_freqs.weight' holds .* it must hold finite numbers"
    ):
        _load(path)
