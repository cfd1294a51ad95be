"""Which KV cache rows hold which sequences at which positions: llama.cpp's KV cells.

One KV cache serves every sequence (llama.cpp's unified cache): a cache row, a *cell*,
holds the K and V of one token at one position, and belongs to one or more sequences.
A prefix two sequences share is stored once and belongs to both (``seq_cp`` costs no
compute and no memory), which is what forking a conversation or reusing a system
prompt needs. This module is bookkeeping only — numpy arrays, no tensors: the runner
asks it for free cells (``find_slot``), records what a step wrote there (``assign``)
and builds the step's attention mask from it (``mask``).

A token attends to a cell iff the cell holds one of the token's sequences at a position
``<=`` the token's own (and fewer than ``window`` positions back on a sliding-window
layer). Cells are picked lowest first, so the rows a step reads, ``[0, n_kv)``, stay as
few as the sequences allow, and a single sequence fills rows ``0, 1, 2, ...`` exactly
as the one-sequence runner did (row = position).

Shifting a sequence's positions (``seq_add``, llama.cpp's context shift) changes only
numbers here; the K rows, roped at their old positions, must be rotated by the same
delta before the next step reads them. The cells remember the pending delta
(``take_shift``) and the runner applies it with a small graph (``ModelRunner.apply_shift``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from tensorplug.errors import RunError

__all__ = ["MAX_SEQUENCES", "ContextFullError", "KVCells"]

#: Sequence ids a cell can belong to: the bits of its ``uint64`` membership mask.
MAX_SEQUENCES = 64


#: Cells :meth:`KVCells.find_slot` tries one by one from its hint before it scans them
#: all with numpy: a generated token's cell is the first it tries.
_NEAR = 8


class ContextFullError(RunError):
    """More tokens than the context (``n_ctx``) holds."""


def seq_bits(seq_ids: Iterable[int]) -> np.uint64:
    """The membership mask of ``seq_ids`` (bit ``s`` for sequence ``s``)."""
    bits = 0
    for s in seq_ids:
        bits |= 1 << check_seq(s)
    return np.uint64(bits)


def check_seq(seq: int) -> int:
    """``seq`` if it is a valid sequence id, else a RunError saying the range."""
    if not isinstance(seq, (int, np.integer)) or not 0 <= seq < MAX_SEQUENCES:
        raise RunError(f"sequence id {seq!r} is out of range: ids are 0..{MAX_SEQUENCES - 1}")
    return int(seq)


class KVCells:
    """The cells of a KV cache of ``n_ctx`` rows: per cell its position (-1: free), the
    sequences it belongs to (a bitmask) and the position shift its K row still needs.

    ``pos``, ``seqs`` and ``shift`` are for reading: the methods here change them, and
    keep what a generated token asks of them every step (a sequence's last position,
    whether any shift is pending, how many cells are used and up to where, where the
    first free cell may be) without a pass over every cell. Each such pass is a few
    numpy calls that run with the caches cold after a step of the model (the weights
    streamed through them), a visible share of a small model's token, and the
    used-cell counts and the free-cell search would add to it."""

    def __init__(self, n_ctx: int) -> None:
        if n_ctx < 1:
            raise RunError(f"a KV cache needs at least one cell, got n_ctx = {n_ctx}")
        self.n_ctx = n_ctx
        self.pos = np.full(n_ctx, -1, dtype=np.int64)
        self.seqs = np.zeros(n_ctx, dtype=np.uint64)
        self.shift = np.zeros(n_ctx, dtype=np.int64)
        self._pos_max: dict[int, int] = {}  # seq_pos_max's answers since the last change
        self._extent: dict[int, int] = {}  # per sequence, extent's answer, kept the same way
        self._shifted = False  # whether some cell's shift may be non-zero
        # n_used and used_max while known (None: count again), and a cell at or below
        # the first free one (every cell below it is used)
        self._n_used: int | None = 0
        self._used_max: int | None = 0
        self._free_from = 0
        # per sequence, while nothing but assign's taking of free cells changed since it
        # was made: the F16 mask row of a token at or past the sequence's last position
        # (0 at every cell the sequence holds, -inf elsewhere), kept up to date by assign
        self._visible: dict[int, np.ndarray] = {}

    # -- what is where -------------------------------------------------------------------------

    @property
    def n_used(self) -> int:
        """Cells that hold some sequence."""
        if self._n_used is None:
            self._n_used = int(np.count_nonzero(self.pos >= 0))
        return self._n_used

    @property
    def used_max(self) -> int:
        """One past the highest used cell (0 when the cache is empty): a step must read
        rows ``[0, used_max)``."""
        if self._used_max is None:
            used = np.flatnonzero(self.pos >= 0)
            self._used_max = int(used[-1]) + 1 if used.size else 0
        return self._used_max

    def _held_by(self, seq: int) -> np.ndarray:
        """Boolean (n_ctx,): the cells ``seq`` holds (any sequence's when ``seq < 0``)."""
        if seq < 0:
            return self.pos >= 0
        return (self.seqs & np.uint64(1 << check_seq(seq))) != 0

    def _in_range(self, seq: int, p0: int, p1: int | None) -> np.ndarray:
        held = self._held_by(seq) & (self.pos >= p0)
        return held if p1 is None else held & (self.pos < p1)

    def seq_pos_min(self, seq: int) -> int:
        """The lowest position ``seq`` holds, -1 when it holds none."""
        pos = self.pos[self._held_by(seq)]
        return int(pos.min()) if pos.size else -1

    def seq_pos_max(self, seq: int) -> int:
        """The highest position ``seq`` holds, -1 when it holds none."""
        known = self._pos_max.get(seq)
        if known is None:
            pos = self.pos[self._held_by(seq)]
            known = self._pos_max[seq] = int(pos.max()) if pos.size else -1
        return known

    def extent(self, seqs: Iterable[int]) -> int:
        """One past the last cell any of ``seqs`` holds (0: none): the rows a step of
        theirs reads. Each sequence's is kept while only taken free cells changed the
        cache (a generated token asks it every step, with the caches cold); a sequence's
        is searched for down from :attr:`used_max` a block at a time (the sequences
        that run are mostly near the top), not over every cell."""
        known, end = self._extent, 0
        for s in seqs:
            mine = known.get(s)
            if mine is None:
                mine = known[s] = self._search_extent(seq_bits((s,)))
            end = max(end, mine)
        return end

    def _search_extent(self, bits: np.uint64) -> int:
        block = 256
        for end in range(self.used_max, 0, -block):
            start = max(end - block, 0)
            held = np.flatnonzero(self.seqs[start:end] & bits)
            if held.size:
                return start + int(held[-1]) + 1
        return 0

    def seq_n_cells(self, seq: int) -> int:
        """How many cells ``seq`` holds (shared ones included)."""
        return int(np.count_nonzero(self._held_by(seq)))

    def n_held_only_by(self, seqs: Iterable[int], p0: int = 0) -> int:
        """Used cells at positions ``>= p0`` that no sequence outside ``seqs`` holds:
        the cells removing ``seqs`` would free."""
        allowed = seq_bits(seqs)
        used = (self.pos >= p0) & (self.seqs != 0)
        return int(np.count_nonzero(used & ((self.seqs & ~allowed) == 0)))

    # -- writing a step -------------------------------------------------------------------------

    def find_slot(self, n: int) -> np.ndarray:
        """``n`` free cells, lowest first (int64, ascending); ContextFullError when fewer
        are free. Nothing is taken until :meth:`assign`."""
        lo = self._free_from
        if n == 1 and self.n_used < self.n_ctx:  # a generated token: look from the hint
            for cell in range(lo, min(lo + _NEAR, self.n_ctx)):
                if self.pos[cell] < 0:
                    self._free_from = cell
                    return np.array([cell], dtype=np.int64)
        free = np.flatnonzero(self.pos[lo:] < 0) + lo
        if free.size:
            self._free_from = int(free[0])
        if free.size < n:
            raise ContextFullError(
                f"the KV cache has {free.size} free cells of n_ctx = {self.n_ctx} and a step "
                f"needs {n}: use a larger context (--ctx-size), fewer parallel sequences or "
                "shorter prompts, or remove sequences (seq_rm) first"
            )
        return free[:n].astype(np.int64)

    def assign(self, cells: np.ndarray, pos: np.ndarray, seq_ids: Sequence[Sequence[int]]) -> None:
        """Record that ``cells[i]`` now holds position ``pos[i]`` of the sequences
        ``seq_ids[i]`` (what a step's ``set_rows`` writes there)."""
        if cells.size == 1 and len(seq_ids) == 1:  # a generated token's cell
            cell, p = int(cells.reshape(-1)[0]), int(np.asarray(pos).reshape(-1)[0])
            if self.pos[cell] < 0 and p >= 0:
                self._take(cell, p, seq_ids[0])
                return
            was_free = bool(self.pos[cell] < 0)
        else:
            was_free = bool((self.pos[cells] < 0).all())
        self.pos[cells] = pos
        self.seqs[cells] = [seq_bits(ids) for ids in seq_ids]
        self.shift[cells] = 0
        positions = np.asarray(pos).reshape(-1).tolist()
        if not was_free or (positions and min(positions) < 0):
            # a sequence may have lost its last cell; a cell given no position is free
            self._forget_counts()
            return
        self._visible.clear()  # (a batch's cells: made again when next asked for)
        if positions:
            if self._n_used is not None:
                self._n_used += _distinct(cells)
            if self._used_max is not None:
                self._used_max = max(self._used_max, int(cells.max()) + 1)
        known, extent = self._pos_max, self._extent
        for cell, p, ids in zip(cells.reshape(-1).tolist(), positions, seq_ids, strict=True):
            for s in ids:
                if s in known:
                    known[s] = max(known[s], p)
                if s in extent:
                    extent[s] = max(extent[s], cell + 1)

    def _take(self, cell: int, p: int, ids: Sequence[int]) -> None:
        """:meth:`assign` of one free cell, in Python scalars: what every generated token
        does, with the caches cold after the model's step (no numpy call over the cells)."""
        self.pos[cell] = p
        self.seqs[cell] = seq_bits(ids)
        self.shift[cell] = 0
        if self._n_used is not None:
            self._n_used += 1
        if self._used_max is not None:
            self._used_max = max(self._used_max, cell + 1)
        known, extent, visible = self._pos_max, self._extent, self._visible
        for s in ids:
            if s in known:
                known[s] = max(known[s], p)
            if s in extent:
                extent[s] = max(extent[s], cell + 1)
            row = visible.get(s)
            if row is not None:
                row[cell] = 0

    # -- llama.cpp's memory API ----------------------------------------------------------------

    def clear(self) -> None:
        """Every cell free."""
        self.pos[:] = -1
        self.seqs[:] = 0
        self.shift[:] = 0
        self._pos_max.clear()
        self._extent.clear()
        self._visible.clear()
        self._shifted = False
        self._n_used = self._used_max = self._free_from = 0

    def seq_rm(self, seq: int, p0: int = 0, p1: int | None = None) -> None:
        """``seq`` lets go of its positions in ``[p0, p1)`` (p1 None: to the end; ``seq
        < 0``: every sequence); a cell no sequence holds any more is free."""
        cells = self._in_range(seq, p0, p1)
        if seq < 0:
            self.seqs[cells] = 0
        else:
            self.seqs[cells] &= ~np.uint64(1 << seq)
        self._free_empty()  # (forgets the last positions)

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int | None = None) -> None:
        """``dst`` shares ``src``'s cells of positions ``[p0, p1)``: the same K and V
        rows, no copy (a fork of a prefix costs nothing)."""
        check_seq(dst)
        if src == dst:
            return
        self.seqs[self._in_range(src, p0, p1)] |= np.uint64(1 << dst)
        self._pos_max.pop(dst, None)
        self._extent.pop(dst, None)
        self._visible.pop(dst, None)

    def seq_keep(self, seq: int) -> None:
        """Free every cell ``seq`` does not hold; the cells it holds become its alone."""
        held = self._held_by(seq)
        self.seqs[held] = np.uint64(1 << seq)
        self.seqs[~held] = 0
        self._free_empty()

    def seq_add(self, seq: int, p0: int, p1: int | None, delta: int) -> None:
        """Move ``seq``'s positions in ``[p0, p1)`` by ``delta`` (llama.cpp's context
        shift); cells moved below position 0 are freed. The moved K rows need
        re-roping by ``delta`` (:meth:`take_shift`). A cell the sequence shares with
        another cannot move for one of them: that is refused (remove the other
        sequence's hold on it, or copy, first)."""
        if delta == 0:
            return
        cells = self._in_range(check_seq(seq), p0, p1)
        shared = cells & (self.seqs != np.uint64(1 << seq))
        if shared.any():
            others = _seq_ids(int(np.bitwise_or.reduce(self.seqs[shared])) & ~(1 << seq))
            raise RunError(
                f"seq_add: {int(shared.sum())} cells of sequence {seq} in positions "
                f"[{p0}, {p1}) are shared with sequences {others}; shifting them would move "
                "those sequences too. Remove the other sequences' hold on them first"
            )
        self.pos[cells] += delta
        self.shift[cells] += delta
        self._shifted = True
        gone = cells & (self.pos < 0)
        self.seqs[gone] = 0
        self._free_empty()

    def is_shared(self, seq: int, p0: int, p1: int | None) -> bool:
        """Whether another sequence holds one of ``seq``'s cells of positions
        ``[p0, p1)``: such cells cannot move for ``seq`` alone (:meth:`seq_add`)."""
        cells = self._in_range(check_seq(seq), p0, p1)
        return bool((cells & (self.seqs != np.uint64(1 << seq))).any())

    def take_shift(self) -> tuple[np.ndarray, np.ndarray]:
        """The cells whose K rows still need re-roping and by how much (int64 each),
        forgotten here: the caller applies them now."""
        cells = np.flatnonzero(self.shift != 0)
        deltas = self.shift[cells].copy()
        self.shift[cells] = 0
        self._shifted = False
        return cells.astype(np.int64), deltas

    @property
    def has_shift(self) -> bool:
        if self._shifted:
            self._shifted = bool(np.any(self.shift != 0))
        return self._shifted

    def _free_empty(self) -> None:
        """Free the cells no sequence holds; every sequence's last position is
        forgotten (each caller changed which cells hold what)."""
        empty = self.seqs == 0
        self.pos[empty] = -1
        self.shift[empty] = 0
        self._forget_counts()

    def _forget_counts(self) -> None:
        """Forget every sequence's last position and the used-cell counts (cells were
        freed, or taken that were not free); the next question counts them again."""
        self._pos_max.clear()
        self._extent.clear()
        self._visible.clear()
        self._n_used = self._used_max = None
        self._free_from = 0

    # -- attention ---------------------------------------------------------------------------

    def position_order(self, n_kv: int, end: int | None = None) -> np.ndarray:
        """Cells ``[0, n_kv)`` sorted by position (I32; free cells first, ties in cell
        order), the cells from ``end`` on (which no token of the step sees) last, in
        cell order: the order attention sums a token's visible cells in. A token sees at
        most one cell per position, so its cells come in position order however the
        cache is fragmented, and one sequence in cells ``0…n`` keeps cache order. With
        the hidden cells last, attention's walk of the order stops before them (the
        CPU's flash attention does): a step wider than its sequences costs no more."""
        pos = self.pos[:n_kv]
        if end is not None and end < n_kv:
            pos = pos.copy()
            pos[end:] = np.iinfo(pos.dtype).max
        return np.argsort(pos, kind="stable").astype(np.int32)

    def mask(
        self, pos: np.ndarray, seq_ids: Sequence[Sequence[int]], n_kv: int, window: int = 0
    ) -> np.ndarray:
        """The F16 attention mask ``(T, n_kv)`` of tokens at ``pos`` of sequences
        ``seq_ids``: 0 where the token sees the cell (the cell holds one of its sequences
        at a position ``<=`` its own, fewer than ``window`` back when ``window > 0``:
        llama.cpp's standard SWA), -inf elsewhere."""
        if len(seq_ids) == 1 and len(seq_ids[0]) == 1:
            # one token of one sequence at or past its last position (a generated one)
            # sees every cell the sequence holds, less those a window leaves behind: a
            # kept row, not seven passes over the cells
            seq, p = seq_ids[0][0], int(np.asarray(pos).reshape(-1)[0])
            if p >= self.seq_pos_max(seq):
                row = self._visible_row(seq)[None, :n_kv].copy()
                if window:
                    row[0, self.pos[:n_kv] <= p - window] = -np.inf
                return row
        tok_bits = np.array([seq_bits(ids) for ids in seq_ids], dtype=np.uint64)
        cell_pos = self.pos[:n_kv]
        back = np.asarray(pos, dtype=np.int64)[:, None] - cell_pos[None, :]
        seen = ((tok_bits[:, None] & self.seqs[None, :n_kv]) != 0) & (back >= 0)
        if window:
            seen &= back < window
        return np.where(seen, np.float16(0), np.float16(-np.inf))

    def _visible_row(self, seq: int) -> np.ndarray:
        """The kept mask row of ``seq`` (``_visible``), made now if there is none."""
        row = self._visible.get(seq)
        if row is None:
            row = np.where(self._held_by(seq), np.float16(0), np.float16(-np.inf))
            self._visible[seq] = row
        return row


def _seq_ids(bits: int) -> list[int]:
    return [s for s in range(MAX_SEQUENCES) if bits >> s & 1]


def _distinct(cells: np.ndarray) -> int:
    """How many different cells ``cells`` names. Not ``np.unique``: its first call
    imports ``numpy.ma``, which would be paid at every launch, by the warm-up's
    first step."""
    if cells.size <= 1:
        return int(cells.size)
    ordered = np.sort(cells, axis=None)
    return int(np.count_nonzero(ordered[1:] != ordered[:-1])) + 1
