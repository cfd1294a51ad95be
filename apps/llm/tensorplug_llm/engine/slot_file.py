"""A slot's state in a file (llama-server's ``/slots/{id}?action=save|restore``): the
tokens a sequence holds and the K and V rows of its cells, so a long prompt evaluated
once can be served again after a restart.

The file is numpy's ``.npz`` (uncompressed): ``format`` (:data:`FORMAT`), ``model`` (what
the rows belong to: the architecture, the file's name and size, the blocks, the row
width, the vocabulary and the cache's types), ``tokens`` (int32), ``k`` and ``v``
(``(n_layer, n_tokens, n_embd_kv)`` of an F16 or F32 cache's dtype; a BF16 or quantized
cache's raw rows, ``(n_layer, n_tokens, row_bytes)`` of uint8). It is not llama.cpp's
state file: the two servers' files do not load into each other.

A file under the save folder is untrusted: it is read with ``allow_pickle=False`` (no
code runs), each member's size is checked against what the model allows before it is
read (no member can make the server allocate more than a full context's rows), and the
tokens, shapes and types must be the model's, else :class:`SlotFileError` says what
differs. A save is written beside its target and renamed over it: a failed save leaves
the file that was there."""

from __future__ import annotations

import os
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tensorplug import tensor_get, tensor_set
from tensorplug.quants import row_size
from tensorplug.types import Type

if TYPE_CHECKING:
    from ..runner import ModelRunner

__all__ = ["FORMAT", "SlotFileError", "SlotState", "read_rows", "read_slot_file", "write_rows",
           "write_slot_file"]  # fmt: skip

#: the format's name and version, the file's first member
FORMAT = "tensorplug-slot/1"
#: bytes a member's header may take beyond its data (numpy's .npy header)
_HEADER_BYTES = 4096


class SlotFileError(ValueError):
    """A slot file that is not one this model can restore; the message says why."""


@dataclass(frozen=True)
class SlotState:
    """A sequence's tokens and its cells' rows, block by block: ``k[i]`` and ``v[i]``
    are ``(n_tokens, n_embd_kv)``, row ``p`` position ``p``'s."""

    tokens: np.ndarray
    k: np.ndarray
    v: np.ndarray


def model_key(llama: ModelRunner) -> str:
    """What a state's rows belong to; a file made for another model is refused."""
    cfg, cache = llama.config, llama.cache
    path = llama.file.path
    types = cache.type_k.name
    if cache.type_v != cache.type_k:
        types += f"/{cache.type_v.name}"
    return (
        f"{cfg.arch.name};{path.name};{path.stat().st_size};n_layer={cfg.n_layer};"
        f"n_embd_kv={cfg.n_embd_kv};n_vocab={cfg.n_vocab};cache={types}"
    )


def row_layout(t: Type, n_embd_kv: int) -> tuple[np.dtype, int]:
    """How a cache row of type ``t`` is kept in a file: F16 and F32 as their values, any
    other type as its raw bytes; and the row's width in that dtype."""
    if t == Type.F16:
        return np.dtype(np.float16), n_embd_kv
    if t == Type.F32:
        return np.dtype(np.float32), n_embd_kv
    return np.dtype(np.uint8), row_size(t, n_embd_kv)


def _runs(cells: np.ndarray) -> list[tuple[int, int, int]]:
    """``(first cell, count, index in cells)`` of each run of consecutive cells."""
    runs: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, cells.size + 1):
        if i == cells.size or cells[i] != cells[i - 1] + 1:
            runs.append((int(cells[start]), i - start, start))
            start = i
    return runs


def read_rows(llama: ModelRunner, cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The K and V rows of ``cells`` (in that order), every block's."""
    cache = llama.cache
    out = []
    for tensors, kind in ((cache.k, cache.type_k), (cache.v, cache.type_v)):
        dtype, width = row_layout(kind, llama.config.n_embd_kv)
        rows = np.empty((len(tensors), cells.size, width), dtype=dtype)
        for layer, t in enumerate(tensors):
            row_bytes = t.nbytes // cache.n_ctx
            for cell, n, at in _runs(cells):
                got = tensor_get(t, cell * row_bytes, n * row_bytes)
                rows[layer, at : at + n] = np.frombuffer(got, dtype=dtype).reshape(n, width)
        out.append(rows)
    return out[0], out[1]


def write_rows(llama: ModelRunner, cells: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    """Write ``k`` and ``v`` (as :func:`read_rows` gives them) into ``cells``."""
    cache = llama.cache
    for tensors, rows in ((cache.k, k), (cache.v, v)):
        for layer, t in enumerate(tensors):
            row_bytes = t.nbytes // cache.n_ctx
            for cell, n, at in _runs(cells):
                tensor_set(t, np.ascontiguousarray(rows[layer, at : at + n]), cell * row_bytes)


def write_slot_file(path: Path, llama: ModelRunner, state: SlotState) -> int:
    """Write ``state`` to ``path`` (atomically); the bytes written."""
    folder = path.parent
    fd, tmp = tempfile.mkstemp(prefix=".slot-", suffix=".npz", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(
                f, format=np.array(FORMAT), model=np.array(model_key(llama)),
                tokens=state.tokens.astype(np.int32), k=state.k, v=state.v,
            )  # fmt: skip
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path.stat().st_size


def read_slot_file(path: Path, llama: ModelRunner, max_tokens: int) -> tuple[SlotState, int]:
    """The state in ``path`` (at most ``max_tokens`` tokens), checked against the model;
    and the file's size."""
    cache, cfg = llama.cache, llama.config
    layouts = {"k": row_layout(cache.type_k, cfg.n_embd_kv),
               "v": row_layout(cache.type_v, cfg.n_embd_kv)}  # fmt: skip
    rows_bytes = {name: cfg.n_layer * max_tokens * width * dtype.itemsize
                  for name, (dtype, width) in layouts.items()}  # fmt: skip
    limits = {"format": _HEADER_BYTES, "model": _HEADER_BYTES,
              "tokens": _HEADER_BYTES + 4 * max_tokens, "k": _HEADER_BYTES + rows_bytes["k"],
              "v": _HEADER_BYTES + rows_bytes["v"]}  # fmt: skip
    try:
        size = path.stat().st_size
        with np.load(path, allow_pickle=False) as npz:
            members = {Path(i.filename).stem: i.file_size for i in npz.zip.infolist()}
            if set(members) != set(limits):
                raise SlotFileError(f"not a slot file (its members: {sorted(members)})")
            for name, limit in limits.items():
                if members[name] > limit:
                    raise SlotFileError(
                        f"its {name} takes {members[name]} bytes; a slot of this model holds "
                        f"at most {max_tokens} tokens ({limit} bytes)"
                    )
            if str(npz["format"]) != FORMAT:
                raise SlotFileError(f"format {str(npz['format'])[:40]!r}, not {FORMAT!r}")
            made_for, ours = str(npz["model"]), model_key(llama)
            if made_for != ours:
                raise SlotFileError(f"saved for another model ({made_for}); this one is {ours}")
            tokens, k, v = npz["tokens"], npz["k"], npz["v"]
    except (OSError, zipfile.BadZipFile, ValueError, EOFError) as e:
        if isinstance(e, SlotFileError):
            raise
        raise SlotFileError(f"unreadable: {e}") from None
    n = tokens.size
    if tokens.dtype != np.int32 or tokens.ndim != 1 or not 0 < n <= max_tokens:
        raise SlotFileError(f"its tokens must be 1 to {max_tokens} int32 ids")
    if tokens.min() < 0 or tokens.max() >= cfg.n_vocab:
        raise SlotFileError(f"a token id is outside the vocabulary (0..{cfg.n_vocab - 1})")
    for name, rows in (("k", k), ("v", v)):
        dtype, width = layouts[name]
        shape = (cfg.n_layer, n, width)
        if rows.dtype != dtype or rows.shape != shape:
            raise SlotFileError(f"its {name} rows are {rows.dtype}{rows.shape}, not {dtype}{shape}")
    return SlotState(tokens, k, v), size
