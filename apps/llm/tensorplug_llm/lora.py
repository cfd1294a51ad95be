"""LoRA adapters in GGUF (llama.cpp's ``convert_lora_to_gguf.py``), applied as llama.cpp
applies them: at run time, beside the product they adapt, never merged into the
weights (a quantized matrix keeps its bytes).

An adapter file holds, for a weight ``W`` of the model (``blk.3.attn_q.weight``), the
pair ``W.lora_a`` ``(r, n_in)`` and ``W.lora_b`` ``(n_out, r)``; a product ``W·x`` of
the model becomes ``W·x + s·B·(A·x)``, with ``s = scale · alpha / r`` where the file
gives ``adapter.lora.alpha``, else ``scale`` (llama.cpp's ``build_lora_mm``). The file
must say ``general.type = adapter`` and ``adapter.type = lora`` and name the model's
architecture; its norm vectors are skipped, as llama.cpp skips them.

Adapted here: the attention's and the dense FFN's matrices and the output layer (what
llama.cpp's decoders adapt). A pair for a tensor the model does not have, or of the
wrong shape, is refused with llama.cpp's hint (a wrong base model); one for the token
embeddings or a mixture of experts' matrices is refused as not supported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tensorplug import Tensor
from tensorplug.errors import RunError
from tensorplug.gguf import GGUFError, GGUFFile

if TYPE_CHECKING:
    from .model import LlamaWeights

__all__ = ["ADAPTED", "LoraAdapter", "LoraError", "LoraPair", "pair_scale"]

#: the weights of a block an adapter may adapt (``LayerWeights``' fields)
ADAPTED = ("wq", "wk", "wv", "wqkv", "wo", "w_gate", "w_up", "w_down")


class LoraError(RunError):
    """An adapter file this model cannot take; the message says which and why."""


@dataclass(eq=False)
class LoraPair:
    """One adapted weight's ``A`` ``(r, n_in)``, ``B`` ``(n_out, r)`` and the scale its
    product is multiplied by (the adapter's, times ``alpha / r``)."""

    a: Tensor
    b: Tensor
    scale: float


def pair_scale(scale: float, alpha: float, rank: int) -> float:
    """llama.cpp's ``get_scale`` in its float32 arithmetic: ``scale · alpha / rank``,
    or ``scale`` where the file gives no alpha."""
    f32 = np.float32
    return float(f32(f32(scale) * f32(alpha)) / f32(rank) if alpha else f32(scale))


@dataclass
class LoraAdapter:
    """An adapter file read and checked against a model: the pairs it gives each
    adapted weight (by the weight's GGUF name), their tensors unallocated until the
    runner places them beside the weights."""

    path: Path
    file: GGUFFile
    alpha: float
    pairs: dict[str, LoraPair]
    #: the scale it is applied at (llama-server's ``/lora-adapters`` changes it)
    scale: float

    def rescale(self, scale: float) -> None:
        """Apply the adapter at ``scale`` from now on (graphs built before keep the
        old one: the runner builds its graphs again)."""
        self.scale = scale
        for pair in self.pairs.values():
            pair.scale = pair_scale(scale, self.alpha, pair.b.shape[1])

    @classmethod
    def open(
        cls, path: str | os.PathLike[str], weights: LlamaWeights, arch: str, scale: float
    ) -> LoraAdapter:
        """Read ``path`` for a model of ``arch`` whose tensors are ``weights``."""
        where = Path(path)
        try:
            f = GGUFFile(where)
        except (GGUFError, OSError) as e:
            raise LoraError(f"LoRA adapter {where}: {e}") from None
        kind = f.get("general.type", "")
        if kind != "adapter":
            raise LoraError(f"{where}: expect general.type to be 'adapter', but got: {kind!r}")
        if f.get("adapter.type", "") != "lora":
            raise LoraError(
                f"{where}: expect adapter.type to be 'lora', but got: {f.get('adapter.type')!r}"
            )
        if f.get("general.architecture", "") != arch:
            raise LoraError(
                f"{where}: model arch and LoRA arch mismatch (the model is {arch!r}, the "
                f"adapter {f.get('general.architecture')!r})"
            )
        alpha = float(f.get("adapter.lora.alpha", 0.0) or 0.0)
        by_gguf = {name: t for t, name in weights.by_name.items()}
        halves: dict[str, dict[str, str]] = {}
        for name in f.tensors:
            base, dot, which = name.rpartition(".lora_")
            if dot and which in ("a", "b"):
                halves.setdefault(base, {})[which] = name
            elif not name.endswith("_norm.weight"):
                raise LoraError(f"{where}: LoRA tensor '{name}' has unexpected suffix")
        adaptable = weights.adaptable()
        pairs: dict[str, LoraPair] = {}
        for base, half in sorted(halves.items()):
            if set(half) != {"a", "b"}:
                raise LoraError(f"{where}: LoRA tensor pair for '{base}' is missing one component")
            w = by_gguf.get(base)
            if w is None:
                raise LoraError(
                    f"{where}: LoRA tensor '{base}' does not exist in base model (hint: maybe "
                    "wrong base model?)"
                )
            if w not in adaptable:
                raise LoraError(
                    f"{where}: a LoRA of '{base}' is not supported (tensorplug adapts the "
                    "attention's and the dense FFN's matrices and the output layer)"
                )
            a, b = f.new_tensor(half["a"]), f.new_tensor(half["b"])
            if len(w.shape) != 2 or a.shape[1:] != w.shape[1:] or b.shape[:1] != w.shape[:1]:
                raise LoraError(
                    f"{where}: tensor '{base}' has incorrect shape (hint: maybe wrong base "
                    f"model?): the weight is {w.shape}, A {a.shape}, B {b.shape}"
                )
            if a.shape[0] != b.shape[1]:
                raise LoraError(
                    f"{where}: lora_a tensor is not transposed (A {a.shape}, B {b.shape}: "
                    "an adapter from llama.cpp's old finetune example is no longer supported)"
                )
            pairs[base] = LoraPair(a, b, pair_scale(scale, alpha, b.shape[1]))
        return cls(where, f, alpha, pairs, scale)

    def tensors(self) -> list[tuple[str, Tensor]]:
        """Every tensor of the adapter with its name in the file (to upload)."""
        out: list[tuple[str, Tensor]] = []
        for pair in self.pairs.values():
            out += [(pair.a.name, pair.a), (pair.b.name, pair.b)]
        return out
