"""A kernel loaded from numba's disk cache does not parse the bitcode kept for linking
it, until a compile links it (``lazy_linking_classes`` of
tensorplug_cpu.kernels.numba_internals.numba_private). Each case runs in fresh processes
with their own cache folder: a kernel loads once a process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from cached_kernels import kernel_folder, run_script

pytest.importorskip("numba")

from tensorplug_cpu.kernels.numba_internals.elf_symbols import defined_symbols

#: the symbol table read is ELF's; elsewhere kernels load numba's way
ELF_ONLY = pytest.mark.skipif(
    sys.platform != "linux", reason="the symbol table read is ELF's (Linux)"
)

_KERNELS = """
import numpy as np
from tensorplug_cpu.kernels._numba_cache import kernel

@kernel()
def squares_sum(n):
    a = np.empty(n, np.float64)
    for i in range(n):
        a[i] = i * i
    return a.sum()

@kernel()
def plus_one(x):
    return x + 1.0
"""

#: runs both kernels and reports their code libraries; with "link", compiles an uncached
#: caller of one; with "symbols", compares each cache entry's symbol table with the
#: names numba reads from its bitcode
_RUN = """
import json, sys
import numba
import llvmlite.binding as ll
import user_kernels
from tensorplug_cpu.kernels.numba_internals.elf_symbols import defined_symbols

def library(kernel):
    [result] = kernel.overloads.values()
    return result.library

out = {"sum": user_kernels.squares_sum(10), "plus": user_kernels.plus_one(2.0)}
out["hits"] = sum(sum(k.stats.cache_hits.values())
                  for k in (user_kernels.squares_sum, user_kernels.plus_one))
out["classes"] = sorted({type(library(k)).__name__
                         for k in (user_kernels.squares_sum, user_kernels.plus_one)})
out["parsed"] = library(user_kernels.plus_one)._shared_module is not None
if "link" in sys.argv:
    @numba.njit
    def caller(x):
        return user_kernels.plus_one(x) * 2.0
    out["caller"] = caller(4.0)
    out["parsed after"] = library(user_kernels.plus_one)._shared_module is not None
if "symbols" in sys.argv:
    same = []
    for k in (user_kernels.squares_sum, user_kernels.plus_one):
        [sig] = k.overloads
        cache = k._cache
        payload = cache._cache_file.load(cache._index_key(sig, k.targetctx.codegen()))
        name, kind, (code, bitcode) = payload[0]
        module = ll.parse_bitcode(bitcode)
        numbas = {g.name for group in (module.functions, module.global_variables)
                  for g in group if not g.is_declaration}
        same.append(bool(numbas) and defined_symbols(code) == numbas)
    out["same names"] = same
print(json.dumps(out))
"""


def _run(folder: Path, *args: str) -> dict:
    return run_script(folder, _RUN, *args)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return kernel_folder(tmp_path, _KERNELS)


@ELF_ONLY
def test_a_cached_kernel_loads_without_parsing_its_linking_bitcode(folder: Path) -> None:
    compiled = _run(folder)
    assert compiled["hits"] == 0 and compiled["classes"] == ["JITCodeLibrary"]
    loaded = _run(folder)
    assert loaded == {"sum": 285.0, "plus": 3.0, "hits": 2,
                      "classes": ["LazyLinkingLibrary"], "parsed": False}  # fmt: skip


@ELF_ONLY
def test_a_compile_that_calls_a_loaded_kernel_links_it(folder: Path) -> None:
    _run(folder)
    linked = _run(folder, "link")
    assert linked["hits"] == 2 and not linked["parsed"]
    assert linked["caller"] == 10.0 and linked["parsed after"]


@ELF_ONLY
def test_the_symbol_table_names_what_numba_reads_from_the_bitcode(folder: Path) -> None:
    _run(folder)
    assert _run(folder, "symbols")["same names"] == [True, True]


def test_anything_but_a_whole_64_bit_little_endian_elf_object_has_no_names() -> None:
    """None sends a library to numba's own load; an ELF header without sections defines
    nothing."""
    elf = b"\x7fELF\x02\x01\x01" + bytes(57)  # 64 bytes: no section table
    big_endian = b"\x7fELF\x02\x02\x01" + bytes(57)
    for data in (b"", b"MZ\x90\x00" + bytes(60), b"\xcf\xfa\xed\xfe" + bytes(60),
                 big_endian, elf[:40]):  # fmt: skip
        assert defined_symbols(data) is None, data[:8]
    assert defined_symbols(elf) == set()
    cut = elf[:0x28] + (1 << 20).to_bytes(8, "little") + elf[0x30:0x3C] + b"\x01\x00" + bytes(2)
    assert defined_symbols(cut) is None  # a section table past the end
