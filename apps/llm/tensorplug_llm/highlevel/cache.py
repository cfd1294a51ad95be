"""Prompt caches: saved states found by the longest common prefix of token ids
(llama-cpp-python's ``LlamaRAMCache``, alias ``LlamaCache``, and ``LlamaDiskCache``).

``llm.set_cache(LlamaRAMCache())`` makes each completion save its state under its
tokens, and a later prompt that shares a longer prefix with a saved state than with
what the model holds starts from that state. The disk cache keeps each state as an
``.npz`` archive of plain arrays in a folder of the user's own (created 0700), read
back without pickle: a file there can at worst be refused, never run
(llama-cpp-python's pickles through ``diskcache``).
"""

from __future__ import annotations

import hashlib
import os
import stat
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..prefix import common_prefix
from .state import LlamaState

__all__ = ["BaseLlamaCache", "LlamaCache", "LlamaDiskCache", "LlamaRAMCache"]


class BaseLlamaCache(ABC):
    """States by token prefix, up to ``capacity_bytes`` of saved cache rows."""

    def __init__(self, capacity_bytes: int = 2 << 30) -> None:
        self.capacity_bytes = capacity_bytes

    @property
    @abstractmethod
    def cache_size(self) -> int: ...

    @abstractmethod
    def _keys(self) -> list[tuple[int, ...]]: ...

    def _find_longest_prefix_key(self, key: tuple[int, ...]) -> tuple[int, ...] | None:
        best, best_len = None, 0
        for k in self._keys():
            n = common_prefix(k, key)
            if n > best_len:
                best, best_len = k, n
        return best

    def __contains__(self, key: Sequence[int]) -> bool:
        return self._find_longest_prefix_key(tuple(key)) is not None

    @abstractmethod
    def __getitem__(self, key: Sequence[int]) -> LlamaState: ...

    @abstractmethod
    def __setitem__(self, key: Sequence[int], value: LlamaState) -> None: ...


class LlamaRAMCache(BaseLlamaCache):
    """States in memory; the least recently used go first when over capacity."""

    def __init__(self, capacity_bytes: int = 2 << 30) -> None:
        super().__init__(capacity_bytes)
        self.cache_state: OrderedDict[tuple[int, ...], LlamaState] = OrderedDict()

    @property
    def cache_size(self) -> int:
        return sum(state.llama_state_size for state in self.cache_state.values())

    def _keys(self) -> list[tuple[int, ...]]:
        return list(self.cache_state)

    def __getitem__(self, key: Sequence[int]) -> LlamaState:
        found = self._find_longest_prefix_key(tuple(key))
        if found is None:
            raise KeyError("Key not found")
        self.cache_state.move_to_end(found)
        return self.cache_state[found]

    def __setitem__(self, key: Sequence[int], value: LlamaState) -> None:
        k = tuple(int(t) for t in key)
        self.cache_state.pop(k, None)
        self.cache_state[k] = value
        while self.cache_size > self.capacity_bytes and self.cache_state:
            self.cache_state.popitem(last=False)


LlamaCache = LlamaRAMCache


class LlamaDiskCache(BaseLlamaCache):
    """States as files in ``cache_dir``; the oldest go first when over capacity."""

    def __init__(
        self, cache_dir: str = ".cache/llama_cache", capacity_bytes: int = 2 << 30
    ) -> None:
        super().__init__(capacity_bytes)
        self.cache_dir = Path(cache_dir)
        self.cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = self.cache_dir.stat()
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or info.st_uid != os.getuid():
            raise ValueError(
                f"{self.cache_dir} can be written by other users: a prompt cache must be a "
                f"folder only you can write (chmod 700 {self.cache_dir})"
            )

    def _files(self) -> list[Path]:
        return sorted(self.cache_dir.glob("*.npz"), key=lambda p: p.stat().st_mtime)

    @property
    def cache_size(self) -> int:
        return sum(p.stat().st_size for p in self._files())

    def _keys(self) -> list[tuple[int, ...]]:
        keys = []
        for path in self._files():
            state = self._read(path)
            if state is not None:
                keys.append(tuple(state.input_ids[: state.n_tokens].tolist()))
        return keys

    def _path(self, key: tuple[int, ...]) -> Path:
        digest = hashlib.sha256(np.asarray(key, dtype=np.int64).tobytes()).hexdigest()
        return self.cache_dir / f"{digest[:32]}.npz"

    @staticmethod
    def _read(path: Path) -> LlamaState | None:
        """The state in ``path``, or None for anything that is not one (left alone)."""
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                return None
            with np.load(path, allow_pickle=False) as f:
                n = int(f["n_tokens"])
                data = f["llama_state"].tobytes()
                return LlamaState(
                    f["input_ids"].astype(np.intc), f["scores"].astype(np.single), n,
                    data, len(data), int(f["seed"]),
                )  # fmt: skip
        except (OSError, ValueError, KeyError):
            return None

    def __getitem__(self, key: Sequence[int]) -> LlamaState:
        found = self._find_longest_prefix_key(tuple(key))
        state = None if found is None else self._read(self._path(found))
        if state is None:
            raise KeyError("Key not found")
        return state

    def __setitem__(self, key: Sequence[int], value: LlamaState) -> None:
        k = tuple(int(t) for t in key)
        path = self._path(k)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            np.savez(
                f,
                input_ids=value.input_ids,
                scores=value.scores,
                n_tokens=np.int64(value.n_tokens),
                llama_state=np.frombuffer(value.llama_state, dtype=np.uint8),
                seed=np.int64(value.seed),
            )
        tmp.replace(path)
        files = self._files()
        while files and sum(p.stat().st_size for p in files) > self.capacity_bytes:
            files.pop(0).unlink(missing_ok=True)
