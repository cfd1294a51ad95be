"""A saved evaluation state: llama-cpp-python's ``LlamaState``, and the KV cache rows in it.

``Llama.save_state()`` returns the tokens, their logits and the cache's contents, and
``load_state()`` puts them back, so a program can branch a conversation and return to
it (or keep states in a :class:`~.cache.LlamaRAMCache`). As in llama-cpp-python the
cache's part is bytes (``llama_state``, ``llama_state_size``), so states can be
counted against a cache's capacity and pickled; here those bytes are an ``.npz``
archive of plain arrays (the K and V rows of sequence 0 by position), read back
without pickle.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from tensorplug.transfer import get_array, set_array

if TYPE_CHECKING:
    from ..runner import ModelRunner

__all__ = ["LlamaState", "cache_bytes", "restore_cache"]


class LlamaState:
    """llama-cpp-python's ``LlamaState``: what ``save_state`` returns."""

    def __init__(
        self,
        input_ids: npt.NDArray[np.intc],
        scores: npt.NDArray[np.single],
        n_tokens: int,
        llama_state: bytes,
        llama_state_size: int,
        seed: int,
    ) -> None:
        self.input_ids = input_ids
        self.scores = scores
        self.n_tokens = n_tokens
        self.llama_state = llama_state
        self.llama_state_size = llama_state_size
        self.seed = seed


def cache_bytes(runner: ModelRunner, n_tokens: int) -> bytes:
    """Sequence 0's first ``n_tokens`` K and V rows of every block, in position order."""
    kv = runner.kv
    cells = np.flatnonzero((kv.pos >= 0) & (kv.pos < n_tokens) & (kv.seqs & np.uint64(1) != 0))
    cells = cells[np.argsort(kv.pos[cells], kind="stable")]
    if cells.size != n_tokens:
        raise RuntimeError(
            f"the KV cache holds {cells.size} of the {n_tokens} evaluated tokens: "
            "evaluate them again before saving the state"
        )
    arrays = {}
    for i, (k, v) in enumerate(zip(runner.cache.k, runner.cache.v, strict=True)):
        arrays[f"k{i}"] = get_array(k)[cells]
        arrays[f"v{i}"] = get_array(v)[cells]
    out = io.BytesIO()
    np.savez(out, **arrays)  # type: ignore[arg-type]
    return out.getvalue()


def restore_cache(runner: ModelRunner, data: bytes, n_tokens: int) -> None:
    """Clear the runner's cache and write a :func:`cache_bytes` image back as sequence 0
    at positions ``0..n_tokens-1`` (cells in the same order)."""
    try:
        archive = np.load(io.BytesIO(data), allow_pickle=False)
        blocks = len(runner.cache.k)
        rows = [(archive[f"k{i}"], archive[f"v{i}"]) for i in range(blocks)]
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"not a saved state of this model: {e}") from None
    runner.reset()
    if n_tokens == 0:
        return
    for (k_rows, v_rows), k, v in zip(rows, runner.cache.k, runner.cache.v, strict=True):
        for rows_of, tensor in ((k_rows, k), (v_rows, v)):
            full = get_array(tensor)
            if rows_of.shape != (n_tokens, *full.shape[1:]) or rows_of.dtype != full.dtype:
                raise ValueError(
                    f"the saved state's cache rows {rows_of.shape} {rows_of.dtype} do not fit "
                    f"this model's cache ({n_tokens}, {full.shape[1:]}) {full.dtype}: it was "
                    "saved from another model or settings"
                )
            full[:n_tokens] = rows_of
            set_array(tensor, full)
    cells = np.arange(n_tokens, dtype=np.int64)
    runner.kv.assign(cells, cells.copy(), [[0]] * n_tokens)
