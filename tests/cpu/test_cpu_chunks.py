"""How the CPU's parallel products share their rows out (``_numba_quant.chunk_span``).

numba runs a ``prange`` in equal runs of iterations a thread, so every one of the 64
chunks must hold the same number of rows, give or take one unit: with ``ceil(n / 64)``
rows a chunk, a 768-row product left chunks 48-63 empty, and of two threads the first
did twice the second's work (a 256-row product: all of it).
"""

from __future__ import annotations

from itertools import pairwise

import pytest

pytest.importorskip("numba", reason="numba is not installed: the CPU backend's numpy kernels run")

from tensorplug_cpu.kernels._numba_quant import ROW_CHUNKS, chunk_span


@pytest.mark.parametrize("unit", [1, 4])
@pytest.mark.parametrize("n", [1, 3, 8, 63, 64, 65, 96, 256, 258, 768, 2048, 6144, 32000])
def test_chunks_cover_the_rows_once_in_whole_units_and_as_evenly_as_units_allow(
    n: int, unit: int
) -> None:
    spans = [tuple(chunk_span(c, n, unit)) for c in range(ROW_CHUNKS)]
    assert spans[0][0] == 0 and spans[-1][1] == n
    assert all(a[1] == b[0] for a, b in pairwise(spans))  # once, in order
    assert all(lo % unit == 0 and lo <= hi for lo, hi in spans)
    units = [-(-(hi - lo) // unit) for lo, hi in spans]
    assert max(units) - min(units) <= 1
    for threads in (2, 4, 8):  # numba's static split of the 64 chunks
        run = ROW_CHUNKS // threads
        shares = [sum(units[i : i + run]) for i in range(0, ROW_CHUNKS, run)]
        assert max(shares) - min(shares) <= 1, shares
