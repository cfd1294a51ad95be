"""The prompt cache: earlier requests' prompts kept in the KV cache beyond what the
slots hold, so a prompt seen before is found again however many others came between
(llama-server's ``--cache-ram``).

llama-server copies a slot's K/V rows out to host memory and back in. Here the KV cache
is one pool of cells that sequences share (``seq_cp`` adds a sequence to a cell, nothing
is copied), so an entry of this cache is a sequence id of its own, beyond the slots',
holding the cells of a prompt a slot held: *saving* a slot's prompt is one ``seq_cp``,
*loading* it into a slot another, and both are free. Entries live in the cells the
running requests do not need: when those are short, the scheduler evicts entries and
idle slots alike, least recently used first, and an entry never holds a cell a
running request needs. ``max_cells`` bounds the cells only entries hold (what the cache
costs beyond the slots; llama-server's MiB, divided by a cell's bytes).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..kv_cells import KVCells
from ..prefix import common_prefix
from .state import Slot

__all__ = ["PromptCache"]


class PromptCache:
    """Entries on the sequence ids ``seqs`` of ``kv``, at most ``max_cells`` cells held
    by entries alone (None: as many as the cache has spare)."""

    def __init__(self, kv: KVCells, seqs: Sequence[int], max_cells: int | None) -> None:
        self.kv = kv
        self.max_cells = max_cells
        #: the prompts kept: ``Slot`` records that never run a job (``seq``, ``cached``,
        #: ``last_used``), so the scheduler ranks them beside idle slots
        self.entries: list[Slot] = []
        self._free_seqs = sorted(seqs, reverse=True)
        #: the sequence ids entries hold now (none of them a slot's)
        self._held: set[int] = set()

    def __len__(self) -> int:
        return len(self.entries)

    def holds(self, record: Slot) -> bool:
        """Whether ``record`` is one of this cache's entries (not a slot): its sequence
        id is an entry's (asked for every candidate at each admission: a set, not a
        walk over the entries)."""
        return record.seq in self._held

    def n_tokens(self) -> int:
        """Tokens the entries hold (a cell two entries share counts twice)."""
        return sum(len(e.cached) for e in self.entries)

    def save(self, slot: Slot) -> bool:
        """Keep what ``slot`` holds as an entry, sharing its cells. An entry whose tokens
        begin what the slot holds is replaced by it; nothing is saved when an entry
        already holds all of it (it is then counted as used now). Returns whether an
        entry was made. The entry's cells are the slot's too until the slot lets go of
        them: call :meth:`trim` then."""
        tokens = slot.cached
        if not tokens or self.max_cells == 0:
            return False
        for entry in list(self.entries):
            shared = common_prefix(entry.cached, tokens)
            if shared == len(tokens):
                entry.last_used = max(entry.last_used, slot.last_used)
                return False
            if shared == len(entry.cached):
                self.drop(entry)
        if not self._free_seqs:
            self.drop(min(self.entries, key=lambda e: e.last_used))
        if not self._free_seqs:  # no sequence id beyond the slots: no cache
            return False
        entry = Slot(self._free_seqs.pop(), list(tokens), last_used=slot.last_used)
        self.kv.seq_cp(slot.seq, entry.seq)
        self.entries.append(entry)
        self._held.add(entry.seq)
        return True

    def drop(self, entry: Slot) -> None:
        """Forget ``entry``: its cells no other sequence holds are free."""
        self.entries.remove(entry)
        self._held.discard(entry.seq)
        self.kv.seq_rm(entry.seq)
        entry.cached.clear()
        self._free_seqs.append(entry.seq)

    def clear(self) -> None:
        for entry in list(self.entries):
            self.drop(entry)

    def trim(self) -> None:
        """Drop the least recently used entries while the cells only entries hold are
        more than ``max_cells`` (a new entry too, if it alone is more)."""
        if self.max_cells is None:
            return
        while self.entries and self.cells_alone() > self.max_cells:
            self.drop(min(self.entries, key=lambda e: e.last_used))

    def cells_alone(self) -> int:
        """Cells only entries hold: what freeing the whole cache would give back."""
        return self.kv.n_held_only_by([e.seq for e in self.entries])
