"""The CPU kernels' disk cache depends on every kernel source, not only each kernel's own
file: an edit to the IR a kernel inlines must not leave stale machine code running."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

pytest.importorskip("numba")

from numba.core.caching import FunctionCache
from numba.core.registry import CPUDispatcher

from tensorplug_cpu import kernels
from tensorplug_cpu.kernels import cache_folder, numba_internals
from tensorplug_cpu.kernels._numba_cache import SOURCES_HASH, kernel

#: the fast launch's cache is checked where the fast launch is on (an allowed numba)
fast_launch = pytest.mark.skipif(not numba_internals.enabled(), reason="fast launch off here")


def _cached_kernels() -> list[tuple[str, CPUDispatcher]]:
    found = []
    for info in pkgutil.iter_modules(kernels.__path__):
        if info.name.startswith("_numba_"):
            module = importlib.import_module(f"{kernels.__name__}.{info.name}")
            for name, value in vars(module).items():
                cache = getattr(value, "_cache", None)  # numba's: a helper has none
                if isinstance(value, CPUDispatcher) and isinstance(cache, FunctionCache):
                    found.append((f"{info.name}.{name}", value))
    return found


def test_every_kernel_is_cached_in_the_folder_of_these_sources() -> None:
    cached = _cached_kernels()
    assert len(cached) >= 20  # the quantized, int8, row, attention and decoding kernels
    folder = cache_folder.kernel_folder()
    assert folder is not None
    elsewhere = [n for n, d in cached if not Path(str(d.stats.cache_path)).is_relative_to(folder)]
    assert not elsewhere, f"use _numba_cache.kernel(...), not njit(cache=True): {elsewhere}"


def test_the_folder_is_named_by_the_sources_and_the_instruction_forms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An edit to any kernel source, or another host's instruction forms (as the tests
    build, setting the flags before compiling), is a folder of its own: the shared cache
    never hands stale code, or another form, to a later run here."""
    from tensorplug_cpu.kernels import _numba_ir

    here = cache_folder.folder_key()
    assert here == cache_folder.folder_key()
    monkeypatch.setattr(cache_folder, "sources_hash", lambda: "0" * 64)
    assert cache_folder.folder_key() != here
    monkeypatch.undo()
    monkeypatch.setattr(_numba_ir, "HAS_VNNI", not _numba_ir.HAS_VNNI)
    assert cache_folder.folder_key() != here
    monkeypatch.setattr(_numba_ir, "HAS_VNNI", not _numba_ir.HAS_VNNI)
    monkeypatch.setattr(_numba_ir, "ON_ZEN", not _numba_ir.ON_ZEN)  # another core's tiles
    assert cache_folder.folder_key() != here


@fast_launch
def test_every_kernel_caches_through_the_fast_launch_where_it_is_on() -> None:
    from tensorplug_cpu.kernels.numba_internals.numba_private import uses_kernel_cache

    plain = [n for n, d in _cached_kernels() if not uses_kernel_cache(d)]
    assert not plain, f"use _numba_cache.kernel(...), not njit(cache=True): {plain}"


@fast_launch
def test_the_index_key_holds_the_hash_of_the_sources() -> None:
    @kernel()
    def twice(x: float) -> float:
        return 2 * x

    assert twice(1.5) == 3.0
    sig = twice.signatures[0]
    key = twice._cache._index_key(sig, twice.targetctx.codegen())
    assert key[-2] == SOURCES_HASH and len(SOURCES_HASH) == 64
    plain = FunctionCache(twice.py_func)._index_key(sig, twice.targetctx.codegen())
    assert key[:-2] == plain  # numba's own key, with the hash and the forms added


@fast_launch
def test_the_index_key_holds_the_instruction_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that builds another host's form keys what it compiles apart from this
    host's kernels, so the shared cache never hands that form to a later run here."""
    from tensorplug_cpu.kernels import _numba_ir

    @kernel()
    def thrice(x: float) -> float:
        return 3 * x

    assert thrice(1.0) == 3.0
    sig, codegen = thrice.signatures[0], thrice.targetctx.codegen()
    here = thrice._cache._index_key(sig, codegen)
    assert here[-1] == (_numba_ir.HAS_AVX2, _numba_ir.HAS_F16C, _numba_ir.HAS_VNNI,
                        _numba_ir.HAS_32_REGS, _numba_ir.ON_ZEN)  # fmt: skip
    monkeypatch.setattr(_numba_ir, "HAS_VNNI", not _numba_ir.HAS_VNNI)
    assert thrice._cache._index_key(sig, codegen) != here
    monkeypatch.setattr(_numba_ir, "HAS_VNNI", not _numba_ir.HAS_VNNI)
    monkeypatch.setattr(_numba_ir, "ON_ZEN", not _numba_ir.ON_ZEN)  # another core's tiles
    assert thrice._cache._index_key(sig, codegen) != here


def test_no_kernel_takes_its_callers_fast_math_flags() -> None:
    """numba lets a callee that sets no ``fastmath`` inherit its caller's: every kernel
    sets it (``kernel`` makes it ``False`` unless told otherwise)."""
    unset = [name for name, d in _cached_kernels() if "fastmath" not in d.targetoptions]
    assert not unset, f"these kernels would take a caller's fast-math flags: {unset}"


def test_every_kernel_releases_the_gil() -> None:
    """A kernel that held the GIL (numba's parallel ones do unless told) stalled every
    other thread of the process while it ran: a server's HTTP handlers and the streaming
    of tokens already sampled waited for the whole step."""
    holding = [name for name, d in _cached_kernels() if not d.targetoptions.get("nogil")]
    assert not holding, f"these kernels hold the GIL while they run: {holding}"


def test_the_compile_ahead_process_takes_every_instruction_form_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The child of ``kernels/ahead.py`` builds its parent's forms from the tuple it is
    handed: each flag lands where the kernels read it, and a tuple of another length
    (a parent of another version) is refused rather than half applied (four names
    unpacked from five values failed every child at its start: each run compiled
    nothing ahead, the helpers' jobs were never made, and two threads ran as one)."""
    from tensorplug_cpu.kernels import _numba_ir
    from tensorplug_cpu.kernels._numba_cache import use_instruction_forms
    from tensorplug_cpu.kernels.kernel_identity import FORM_FLAGS, instruction_forms

    for name in FORM_FLAGS:
        monkeypatch.setattr(_numba_ir, name, getattr(_numba_ir, name))  # restored after
    flipped = tuple(not f for f in instruction_forms())
    use_instruction_forms(flipped)
    assert instruction_forms() == flipped
    with pytest.raises(ValueError, match="instruction-form flags"):
        use_instruction_forms(flipped[:-1])
