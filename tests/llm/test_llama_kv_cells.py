"""KV cell bookkeeping against an independent model: a dict of cell -> (pos, set of seqs).

Every operation is checked by replaying it on plain Python sets and comparing the
resulting membership, positions and the attention mask written from first principles
(a token sees a cell iff they share a sequence and the cell's position is not after
the token's, and within the window)."""

from __future__ import annotations

import numpy as np
import pytest

from tensorplug.errors import RunError
from tensorplug_llm.batch import Batch, BatchBuilder
from tensorplug_llm.kv_cells import ContextFullError, KVCells

Model = dict[int, tuple[int, set[int]]]  # cell -> (position, sequences)


def _fill(kv: KVCells, model: Model, n: int, seq: int, pos0: int) -> np.ndarray:
    cells = kv.find_slot(n)
    kv.assign(cells, np.arange(pos0, pos0 + n), [(seq,)] * n)
    for c, p in zip(cells.tolist(), range(pos0, pos0 + n), strict=True):
        model[c] = (p, {seq})
    return cells


def _same(kv: KVCells, model: Model) -> None:
    for c in range(kv.n_ctx):
        if c in model and model[c][1]:
            p, seqs = model[c]
            assert kv.pos[c] == p, c
            assert {s for s in range(64) if int(kv.seqs[c]) >> s & 1} == seqs, c
        else:
            assert kv.pos[c] == -1 and kv.seqs[c] == 0, c
    assert kv.n_used == sum(1 for _, s in model.values() if s)


def _mask(
    model: Model, pos: list[int], seqs: list[tuple[int, ...]], n_kv: int, window: int
) -> np.ndarray:
    out = np.full((len(pos), n_kv), -np.inf, dtype=np.float16)
    for i, (p, ids) in enumerate(zip(pos, seqs, strict=True)):
        for c in range(n_kv):
            if c in model:
                cp, cs = model[c]
                if cs & set(ids) and cp <= p and (not window or p - cp < window):
                    out[i, c] = 0
    return out


def test_cells_follow_an_independent_model_through_the_memory_api() -> None:
    kv, model = KVCells(32), Model()
    _fill(kv, model, 6, 0, 0)  # seq 0: positions 0..5 in cells 0..5
    _fill(kv, model, 4, 1, 0)  # seq 1: cells 6..9
    _same(kv, model)
    assert kv.seq_pos_max(0) == 5 and kv.seq_pos_max(1) == 3 and kv.seq_pos_max(2) == -1

    kv.seq_cp(0, 2, 0, 3)  # seq 2 shares seq 0's first three cells: a forked prefix
    for c in range(3):
        model[c][1].add(2)
    _same(kv, model)
    assert kv.n_used == 10  # sharing costs no cells

    kv.seq_rm(0, 2)  # seq 0 keeps positions 0, 1
    for c in range(2, 6):
        model[c][1].discard(0)
    _same(kv, model)  # cell 2 survives for seq 2; cells 3..5 are free
    assert kv.seq_pos_max(0) == 1 and kv.seq_pos_max(2) == 2

    cells = _fill(kv, model, 4, 3, 0)
    assert cells.tolist() == [3, 4, 5, 10]  # freed cells are reused, lowest first
    _same(kv, model)

    kv.seq_keep(1)
    model = {c: (p, s & {1}) for c, (p, s) in model.items() if 1 in s}
    _same(kv, model)
    assert kv.used_max == 10

    kv.seq_rm(-1)
    _same(kv, {})
    assert kv.used_max == 0


def test_seq_add_moves_positions_and_records_the_k_shift() -> None:
    kv, model = KVCells(16), Model()
    _fill(kv, model, 8, 0, 0)
    kv.seq_rm(0, 2, 4)  # llama.cpp's context shift: drop positions 2..3, move 4.. back
    kv.seq_add(0, 4, None, -2)
    assert kv.pos[:8].tolist() == [0, 1, -1, -1, 2, 3, 4, 5]
    cells, deltas = kv.take_shift()
    assert cells.tolist() == [4, 5, 6, 7] and deltas.tolist() == [-2] * 4
    assert not kv.has_shift
    kv.seq_add(0, 0, 2, -1)  # position 0 goes below 0: its cell is freed
    assert kv.pos[:2].tolist() == [-1, 0]


def test_seq_add_refuses_cells_shared_with_another_sequence() -> None:
    kv, model = KVCells(8), Model()
    _fill(kv, model, 4, 0, 0)
    kv.seq_cp(0, 5)
    with pytest.raises(RunError, match=r"shared with sequences \[5\]"):
        kv.seq_add(0, 0, None, 3)
    assert kv.pos[:4].tolist() == [0, 1, 2, 3]  # nothing moved


@pytest.mark.parametrize("window", [0, 3])
def test_mask_matches_membership_and_positions(window: int) -> None:
    rng = np.random.default_rng(0)
    kv, model = KVCells(40), Model()
    for seq, n in ((0, 7), (1, 5), (2, 9), (0, 3)):
        _fill(kv, model, n, seq, kv.seq_pos_max(seq) + 1)
    kv.seq_cp(2, 3, 0, 4)
    for c, (_, s) in model.items():
        if 2 in s and model[c][0] < 4:
            s.add(3)
    kv.seq_rm(2, 6)
    for c in list(model):
        if 2 in model[c][1] and model[c][0] >= 6:
            model[c][1].discard(2)
    _same(kv, model)
    b = BatchBuilder()
    for _ in range(12):
        seqs = tuple(sorted(set(rng.choice(4, size=rng.integers(1, 3)).tolist())))
        b.add(int(rng.integers(0, 300)), int(rng.integers(0, 12)), seqs)
    batch = b.build()
    n_kv = 32
    got = kv.mask(batch.pos, batch.seq_ids, n_kv, window)
    want = _mask(model, batch.pos.tolist(), list(batch.seq_ids), n_kv, window)
    assert got.dtype == np.float16 and np.array_equal(got, want)
    assert (got == 0).sum() > 10  # the random batch sees something


def test_find_slot_says_how_full_the_cache_is() -> None:
    kv = KVCells(8)
    _fill(kv, {}, 6, 0, 0)
    with pytest.raises(ContextFullError, match="2 free cells of n_ctx = 8 and a step needs 3"):
        kv.find_slot(3)
    assert kv.find_slot(2).tolist() == [6, 7]


def test_batches_are_checked_and_chunked() -> None:
    b = Batch.single([5, 6, 7, 8, 9], 3, seq=2)
    assert b.pos.tolist() == [3, 4, 5, 6, 7] and b.logits.tolist() == [0, 0, 0, 0, 1]
    assert [len(c) for c in b.chunks(2)] == [2, 2, 1]
    assert [c.n_outputs for c in b.chunks(2)] == [0, 0, 1]
    with pytest.raises(RunError, match="sequence id 64 is out of range"):
        Batch.single([1], 0, seq=64)
    with pytest.raises(RunError, match="one entry per token"):
        Batch(np.array([1, 2]), np.array([0]), ((0,), (0,)), np.array([True, True]))
    with pytest.raises(RunError, match="at least one sequence id"):
        Batch(np.array([1]), np.array([0]), ((),), np.array([True]))


@pytest.mark.parametrize("tokens", [[7], [3, 1, 4], np.array([2, 9], dtype=np.int32)])
@pytest.mark.parametrize("all_logits", [False, True])
def test_a_single_sequence_batch_is_what_the_checked_constructor_makes(
    tokens: list[int] | np.ndarray, all_logits: bool
) -> None:
    """Batch.single skips __post_init__'s checks for what it makes itself: the same
    fields, dtypes and shapes as the checked constructor gives."""
    got = Batch.single(tokens, 11, seq=3, all_logits=all_logits)
    n = len(tokens)
    flags = np.full(n, all_logits) | (np.arange(n) == n - 1)
    want = Batch(np.asarray(tokens), np.arange(11, 11 + n), ((3,),) * n, flags)
    for name in ("tokens", "pos", "logits"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and a.shape == b.shape and (a == b).all(), name
    assert got.seq_ids == want.seq_ids
    for bad, match in (([], "at least one token"), ([1], "positions must be in")):
        with pytest.raises(RunError, match=match):
            Batch.single(bad, 2**31 if bad else 0)


def _recount(kv: KVCells, seq: int) -> int:
    """seq_pos_max from the arrays alone: what the kept answer must equal."""
    held = (kv.seqs & np.uint64(1 << seq)) != 0
    return int(kv.pos[held].max()) if held.any() else -1


@pytest.mark.parametrize("seed", range(4))
def test_kept_last_positions_and_pending_shifts_follow_every_operation(seed: int) -> None:
    """seq_pos_max, extent, has_shift, n_used, used_max, find_slot's hint and a
    sequence's mask row are kept between calls (a generated token asks them every
    step); after any mix of operations they equal a recount from the cells."""
    rng = np.random.default_rng(seed)
    kv = KVCells(48)
    for _ in range(300):
        op = rng.integers(0, 8)
        seq = int(rng.integers(0, 4))
        try:
            if op <= 2:  # a step: new cells continuing one or two sequences
                n = int(rng.integers(1, 5))
                ids = (seq,) if rng.random() < 0.7 else (seq, (seq + 1) % 4)
                start = max(kv.seq_pos_max(s) for s in ids) + 1
                cells = kv.find_slot(n)
                if rng.random() < 0.1:  # over any cells, used ones too (a caller's own)
                    cells = rng.choice(48, size=n, replace=False).astype(np.int64)
                kv.assign(cells, np.arange(start, start + n), [ids] * n)
            elif op == 3:
                kv.seq_rm(seq if rng.random() < 0.9 else -1, int(rng.integers(0, 20)))
            elif op == 4:
                kv.seq_cp(seq, (seq + 1) % 4, 0, int(rng.integers(1, 30)))
            elif op == 5:
                kv.seq_add(seq, int(rng.integers(0, 10)), None, int(rng.integers(-6, 7)))
            elif op == 6:
                if kv.has_shift:
                    kv.take_shift()
            elif rng.random() < 0.2:
                kv.seq_keep(seq) if rng.random() < 0.5 else kv.clear()
        except (ContextFullError, RunError):
            pass  # a full cache or a shared cell that cannot move: nothing changed
        for s in range(4):
            assert kv.seq_pos_max(s) == _recount(kv, s), (seed, s)
            for seqs in ({s}, {s, (s + 1) % 4}):  # one past the last cell they hold
                bits = np.uint64(sum(1 << q for q in seqs))
                held = np.flatnonzero((kv.seqs & bits) != 0)
                assert kv.extent(seqs) == (int(held[-1]) + 1 if held.size else 0), (seed, seqs)
            # a next token's mask (kept between steps for one token of one sequence)
            p, n_kv = kv.seq_pos_max(s) + int(rng.integers(0, 2)), int(rng.integers(1, 49))
            window = int(rng.choice([0, 1, 3, 8]))
            want = ((kv.seqs[:n_kv] & np.uint64(1 << s)) != 0) & (kv.pos[:n_kv] <= p)
            if window:
                want &= kv.pos[:n_kv] > p - window
            got = kv.mask(np.array([p]), [(s,)], n_kv, window)
            assert np.array_equal(got, np.where(want, 0, -np.inf)[None]), (seed, s)
        assert kv.has_shift == bool((kv.shift != 0).any())
        used = np.flatnonzero(kv.pos >= 0)
        assert kv.n_used == used.size, seed
        assert kv.used_max == (int(used[-1]) + 1 if used.size else 0), seed
        free = np.flatnonzero(kv.pos < 0)
        for n in (1, 3):  # the lowest free cells, whatever the hint says
            if free.size >= n:
                assert kv.find_slot(n).tolist() == free[:n].tolist(), seed


def test_position_order_puts_the_cells_past_a_steps_sequences_last() -> None:
    """Cells by position (free ones first, ties in cell order); with ``end``, the cells
    from ``end`` on, which the step's tokens cannot see, after all of them in cell
    order, so a walk of the order stops before them."""
    kv = KVCells(10)
    kv.assign(np.array([0, 1, 2, 5, 6, 8]), np.array([3, 0, 1, 2, 0, 1]),
              [(0,), (1,), (1,), (0,), (2,), (2,)])  # fmt: skip
    assert kv.position_order(10).tolist() == [3, 4, 7, 9, 1, 6, 2, 8, 5, 0]
    assert kv.position_order(10, end=6).tolist() == [3, 4, 1, 2, 5, 0, 6, 7, 8, 9]
    assert kv.position_order(8, end=8).tolist() == kv.position_order(8).tolist()
