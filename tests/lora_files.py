"""LoRA adapter files for tests, as llama.cpp's ``convert_lora_to_gguf.py`` writes them:
``general.type = adapter``, ``adapter.type = lora``, ``adapter.lora.alpha``, and per
adapted weight ``W`` the tensors ``W.lora_a`` ``(r, n_in)`` and ``W.lora_b``
``(n_out, r)``, with deterministic random values sized to move the logits."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import gguf
import numpy as np

from tensorplug.gguf import GGUFFile

__all__ = ["write_lora"]


def write_lora(
    path: Path,
    base: Path,
    targets: Sequence[str],
    *,
    rank: int = 4,
    alpha: float | None = 8.0,
    seed: int = 0,
    dtype: type = np.float32,
    kind: str = "adapter",
    extra: Mapping[str, np.ndarray] | None = None,
) -> Path:
    """An adapter of ``base`` (a GGUF model) for the weights named in ``targets``;
    ``kind``: its ``general.type``; ``extra``: more tensors, as given."""
    f = GGUFFile(base)
    arch = str(f.get("general.architecture"))
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_string("general.type", kind)
    w.add_string("adapter.type", "lora")
    if alpha is not None:
        w.add_float32("adapter.lora.alpha", alpha)
    for name in targets:
        n_out, n_in = f.tensor_info(name).shape
        a = rng.standard_normal((rank, n_in)) / np.sqrt(n_in)
        b = rng.standard_normal((n_out, rank)) * 0.5
        w.add_tensor(name + ".lora_a", a.astype(dtype))
        w.add_tensor(name + ".lora_b", b.astype(dtype))
    for name, values in (extra or {}).items():
        w.add_tensor(name, values)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
