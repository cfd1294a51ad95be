"""LLVM's code pages given back after numba's import and after kernels load
(``tensorplug_cpu.kernels.numba_internals.llvm_pages``): the resident pages go, the ones the dynamic
loader wrote stay, and numba still compiles and runs afterwards."""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from test_cpu_helpers import backend_for, place

import tensorplug as tp
from tensorplug import ops
from tensorplug_cpu.kernels import jit, jit_calls
from tensorplug_cpu.kernels.numba_internals import llvm_pages

LINUX = sys.platform.startswith("linux")


def _elf(path: Path, loads: list[tuple[int, int, int, int]]) -> Path:
    """A 64-bit little-endian ELF file with only program headers: ``(flags, offset,
    vaddr, memsz)`` per PT_LOAD."""
    phoff, phentsize = 64, 56
    head = bytearray(64)
    head[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", head, 32, phoff)
    struct.pack_into("<HH", head, 54, phentsize, len(loads))
    table = b"".join(
        struct.pack("<IIQQQQQQ", 1, flags, off, vaddr, vaddr, memsz, memsz, 0x1000)
        for flags, off, vaddr, memsz in loads
    )
    path.write_bytes(bytes(head) + table)
    return path


def test_only_pages_never_written_are_dropped(tmp_path: Path) -> None:
    # R (headers, rodata) at 0, R+X code at 0x2000, then R+W at 0x5000: its first page is
    # RELRO (written by relocation, then made read-only), its second the data
    lib = _elf(tmp_path / "libx.so", [(4, 0, 0, 0x2000), (5, 0x2000, 0x2000, 0x3000),
                                      (6, 0x5000, 0x5000, 0x2000)])  # fmt: skip
    base = 0x7F0000000000
    maps = [
        [f"{base:x}-{base + 0x2000:x}", "r--p", "00000000", "08:01", "1", str(lib)],
        [f"{base + 0x2000:x}-{base + 0x5000:x}", "r-xp", "00002000", "08:01", "1", str(lib)],
        [f"{base + 0x5000:x}-{base + 0x6000:x}", "r--p", "00005000", "08:01", "1", str(lib)],
        [f"{base + 0x6000:x}-{base + 0x7000:x}", "rw-p", "00006000", "08:01", "1", str(lib)],
        [f"{base + 0x9000:x}-{base + 0xA000:x}", "r-xp", "00000000", "08:01", "2", "/other.so"],
    ]
    assert llvm_pages._droppable(maps, "libx.so") == [(base, base + 0x2000),
                                                      (base + 0x2000, base + 0x5000)]  # fmt: skip
    # a read-only mapping straddling the writable segment keeps only its outside part
    maps[1][0] = f"{base + 0x2000:x}-{base + 0x6000:x}"
    assert llvm_pages._droppable(maps[1:2] + maps[:1], "libx.so") == [
        (base + 0x2000, base + 0x5000), (base, base + 0x2000)]  # fmt: skip


def test_a_file_it_cannot_read_as_elf_drops_nothing(tmp_path: Path) -> None:
    odd = tmp_path / "libodd.so"
    odd.write_bytes(b"not an ELF file at all" * 4)
    maps = [["1000-2000", "r-xp", "00000000", "08:01", "1", str(odd)]]
    assert llvm_pages._droppable(maps, "libodd.so") == []
    gone = [["1000-2000", "r-xp", "00000000", "08:01", "1", str(tmp_path / "libgone.so")]]
    assert llvm_pages._droppable(gone, "libgone.so") == []
    assert llvm_pages._droppable(maps, "libnotmapped.so") == []


def test_nothing_is_done_off_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llvm_pages.sys, "platform", "darwin")
    assert llvm_pages.release() == 0


@pytest.mark.skipif(not LINUX, reason="madvise and /proc/self/smaps are Linux's")
def test_after_numbas_import_llvm_pages_go_and_numba_still_compiles() -> None:
    code = textwrap.dedent("""
        import re, numba
        from tensorplug_cpu.kernels.numba_internals import llvm_pages
        def llvm():  # (resident KiB, of them anonymous) of libllvmlite's mappings
            rows, cur = [], None
            for line in open("/proc/self/smaps"):
                m = re.match(r"^[0-9a-f]+-[0-9a-f]+ \\S+ \\S+ \\S+ \\S+\\s*(.*)$", line)
                if m:
                    cur = [0, 0] if m.group(1).endswith("libllvmlite.so") else None
                    if cur is not None:
                        rows.append(cur)
                elif cur is not None and line.startswith(("Rss:", "Anonymous:")):
                    cur[line.startswith("Anonymous:")] += int(line.split()[1])
            return sum(r[0] for r in rows), sum(r[1] for r in rows)
        before = llvm()
        advised = llvm_pages.release()
        after = llvm()
        f = numba.njit(lambda x: x * 3 + 1)
        print(before[0], before[1], advised, after[0], after[1], f(41))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    rss0, anon0, advised, rss1, anon1, result = map(int, out.stdout.split())
    assert advised > 0 and result == 124
    assert rss0 - anon0 > 8 * 1024  # the import made megabytes of the file resident...
    assert rss1 - anon1 < 512  # ...all gone
    assert anon1 == anon0 > 0  # and what the loader wrote (RELRO, data) is untouched


def test_a_compute_that_loaded_a_kernel_gives_llvms_pages_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kernels = jit.load_jit()
    if kernels is None:
        pytest.skip(f"no numba kernels here: {jit.jit_status()}")
    calls: list[int] = []

    def counted() -> int:
        calls.append(1)
        return 0

    monkeypatch.setattr(jit_calls, "release_llvm_pages", counted)
    be = backend_for()
    x = tp.new_tensor("f32", (4, 32), "x")
    y = ops.rms_norm(x, 1e-6)
    g = tp.Graph(y)
    place(g)
    values = np.linspace(-1, 1, 128, dtype=np.float32).reshape(4, 32)
    tp.set_array(x, values)
    kernels.called.discard("rms_norm kernel")  # as if this process had not run it yet
    be.graph_compute(g)
    assert calls == [1]
    be.graph_compute(g)  # nothing loaded this time
    assert calls == [1]
    want = values / np.sqrt((values.astype(np.float64) ** 2).mean(axis=1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(tp.get_array(y), want, rtol=1e-6)


def test_a_compile_of_a_known_kernel_counts_too() -> None:
    # a kernel whose name has run already but meets new argument types compiles again:
    # numba's compile event marks it, not only a kernel's first call
    kernels = jit.load_jit()
    if kernels is None:
        pytest.skip(f"no numba kernels here: {jit.jit_status()}")
    import numba

    kernels.settle()
    assert not kernels._llvm_ran
    numba.njit(lambda x: x + 1)(np.int16(3))  # a compile anywhere in the process
    assert kernels._llvm_ran
    kernels.settle()
    assert not kernels._llvm_ran
