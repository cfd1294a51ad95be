"""A step's tokens, each with its position, its sequences and whether it wants logits.

:class:`Batch` is llama.cpp's ``llama_batch``: one step of the model can carry the
prompt chunk of one sequence and the next token of several others at once, because
every token says where it goes (position, sequence ids) and the attention mask is
built from that, not from the token's place in the batch. ``logits`` flags the tokens
whose logits the caller reads (a prompt needs only its last); only those rows go
through the output layer.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from tensorplug.errors import RunError

from .kv_cells import check_seq

__all__ = ["Batch", "BatchBuilder"]


@dataclass(frozen=True)
class Batch:
    """``tokens`` int64 ``(T,)`` (``decode`` checks them against the vocabulary),
    ``pos`` int32 ``(T,)``, ``seq_ids`` the sequences of each token (usually one),
    ``logits`` bool ``(T,)``: which tokens get logits."""

    tokens: np.ndarray
    pos: np.ndarray
    seq_ids: tuple[tuple[int, ...], ...]
    logits: np.ndarray

    def __post_init__(self) -> None:
        tokens = np.asarray(self.tokens).reshape(-1)
        pos = np.asarray(self.pos).reshape(-1)
        flags = np.asarray(self.logits, dtype=bool).reshape(-1)
        n = tokens.size
        if n == 0:
            raise RunError("a batch needs at least one token")
        if not (pos.size == flags.size == len(self.seq_ids) == n):
            raise RunError(
                f"a batch's fields must have one entry per token: {n} tokens, {pos.size} "
                f"positions, {len(self.seq_ids)} sequence-id tuples, {flags.size} logits flags"
            )
        if pos.min() < 0 or pos.max() >= 2**31:
            raise RunError(
                f"positions must be in 0..2**31-1, got {int(pos.min())}..{int(pos.max())}"
            )
        for ids in self.seq_ids:
            if not ids:
                raise RunError("every token of a batch needs at least one sequence id")
            for s in ids:
                check_seq(s)
        object.__setattr__(self, "tokens", tokens.astype(np.int64))  # checked by decode
        object.__setattr__(self, "pos", pos.astype(np.int32))
        object.__setattr__(self, "logits", flags)
        object.__setattr__(self, "seq_ids", tuple(tuple(int(s) for s in i) for i in self.seq_ids))

    def __len__(self) -> int:
        return int(self.tokens.size)

    @property
    def n_outputs(self) -> int:
        return int(np.count_nonzero(self.logits))

    @classmethod
    def single(
        cls,
        tokens: Sequence[int] | np.ndarray,
        pos0: int,
        seq: int = 0,
        logits_last: bool = True,
        *,
        all_logits: bool = False,
    ) -> Batch:
        """Consecutive ``tokens`` of sequence ``seq`` from position ``pos0``; logits for
        the last token (``logits_last``), or for every token (``all_logits``)."""
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        flags = np.full(ids.size, all_logits, dtype=bool)
        if logits_last and ids.size:
            flags[-1] = True
        if ids.size and pos0 >= 0 and pos0 + ids.size <= 2**31:
            # valid as made: set without __post_init__'s checks and conversions (a
            # generated token's batch, each step, with the caches cold after the model)
            batch = object.__new__(cls)
            for name, value in (
                ("tokens", ids), ("pos", np.arange(pos0, pos0 + ids.size, dtype=np.int32)),
                ("seq_ids", ((check_seq(seq),),) * ids.size), ("logits", flags),
            ):  # fmt: skip
                object.__setattr__(batch, name, value)
            return batch
        pos = np.arange(pos0, pos0 + ids.size, dtype=np.int64)  # refused with the numbers
        return cls(ids, pos, ((seq,),) * ids.size, flags)

    def slice(self, start: int, stop: int) -> Batch:
        """Tokens ``[start, stop)`` as a batch of their own (a chunk)."""
        return Batch(
            self.tokens[start:stop],
            self.pos[start:stop],
            self.seq_ids[start:stop],
            self.logits[start:stop],
        )

    def chunks(self, size: int) -> Iterator[Batch]:
        """Consecutive batches of at most ``size`` tokens (``n_batch``)."""
        for s in range(0, len(self), size):
            yield self if s == 0 and size >= len(self) else self.slice(s, s + size)


@dataclass
class BatchBuilder:
    """Collects tokens one by one into a :class:`Batch` (``common_batch_add``)."""

    tokens: list[int] = field(default_factory=list)
    pos: list[int] = field(default_factory=list)
    seq_ids: list[tuple[int, ...]] = field(default_factory=list)
    logits: list[bool] = field(default_factory=list)

    def add(self, token: int, pos: int, seq_ids: Sequence[int], logits: bool = False) -> int:
        """Append one token; returns its index in the batch."""
        self.tokens.append(int(token))
        self.pos.append(int(pos))
        self.seq_ids.append(tuple(seq_ids))
        self.logits.append(logits)
        return len(self.tokens) - 1

    def __len__(self) -> int:
        return len(self.tokens)

    def build(self) -> Batch:
        return Batch(
            np.asarray(self.tokens, dtype=np.int64),
            np.asarray(self.pos, dtype=np.int64),
            tuple(self.seq_ids),
            np.asarray(self.logits, dtype=bool),
        )
