"""The CPU kernels' caches are untrusted files: numba's cache is pickles and the fast
launch's kept code is machine code, so neither is read from a folder that someone else
can write, and the runtime library kept beside the kernels is never unpickled."""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba")

from tensorplug_cpu.kernels import cache_folder
from tensorplug_cpu.kernels._numba_cache import kernel
from tensorplug_cpu.kernels.numba_internals import kept_code, kept_kernels, runtime_library
from tensorplug_cpu.kernels.numba_internals.kept_code import CALLABLE, Entry

POSIX_ONLY = pytest.mark.skipif(os.name != "posix", reason="folder modes are POSIX")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """numba's cache folder for this test, as a user would set it."""
    root = tmp_path / "numba-cache"
    root.mkdir(mode=0o700)
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(root))
    monkeypatch.setattr(cache_folder, "_warned", set())
    monkeypatch.setattr(cache_folder, "_checked", set())
    return root


@POSIX_ONLY
def test_a_kernel_cache_others_can_write_is_not_used(
    cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = cache_folder.kernel_folder()
    assert folder is not None and folder.parent == cache / "tensorplug-cpu"
    assert folder.stat().st_mode & 0o777 == 0o700  # made the user's alone
    folder.chmod(0o777)
    cache_folder._checked.clear()  # as a later process finds it: checked once a process
    with caplog.at_level(logging.WARNING, "tensorplug_cpu"):
        assert cache_folder.kernel_folder() is None

        @kernel()
        def doubled(x: np.ndarray) -> np.ndarray:
            return x * 2

        assert doubled(np.arange(3.0)).tolist() == [0.0, 2.0, 4.0]  # compiled, uncached
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "can be written by others" in said[0] and str(folder) in said[0]
    assert not list(folder.rglob("*.nbi")) and not list(folder.rglob("*.nbc"))


@POSIX_ONLY
def test_kept_code_in_a_folder_others_can_write_is_never_loaded(
    cache: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A kept entry whose digest was recomputed by whoever wrote it is whole: what
    keeps it from running is where it lies."""
    loaded: list[Entry] = []
    monkeypatch.setattr(kept_code, "load", lambda entry, runtime: loaded.append(entry) or None)
    monkeypatch.setattr(kept_kernels, "_by_folder", {})
    kept = kept_kernels.kept_in()
    assert kept is not None
    entry = Entry(CALLABLE, "_ZN7cpython4evil", "evil", "evil", b"\x7fELF not really")
    path = kept.path("identity", ("int64",))
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.write_bytes(entry.to_bytes())
    assert kept.load("identity", ("int64",)) is None and len(loaded) == 1  # safe: read

    monkeypatch.setattr(kept_kernels, "_by_folder", {})
    kept = kept_kernels.kept_in()
    assert kept is not None
    kept.folder.chmod(0o777)
    with caplog.at_level(logging.WARNING):
        assert kept.load("identity", ("int64",)) is None
    assert len(loaded) == 1  # never handed to the loader
    assert any("can be written by others" in r.getMessage() for r in caplog.records)


class _Marks:
    """Unpickled, it would leave a file behind."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, ...]:
        return (Path.touch, (self.path,))


def test_the_kept_runtime_library_is_never_unpickled(cache: Path, tmp_path: Path) -> None:
    folder = cache / "tensorplug-cpu" / "kept"
    folder.mkdir(parents=True, mode=0o700)
    marker = tmp_path / "ran"
    payload = pickle.dumps(("nrt", "object", (_Marks(marker), b"")))
    runtime_library.runtime_file(folder).write_bytes(hashlib.sha256(payload).digest() + payload)
    assert runtime_library.stored_code(folder) is None
    assert not marker.exists()


def test_the_runtime_library_reads_back_what_was_written(cache: Path) -> None:
    folder = cache / "tensorplug-cpu" / "kept"
    folder.mkdir(parents=True, mode=0o700)
    data = runtime_library.to_bytes(("nrt", "object", (b"\x7fELF code", b"bitcode")))
    assert data is not None
    runtime_library.runtime_file(folder).write_bytes(data)
    assert runtime_library.stored_code(folder) == b"\x7fELF code"
    for cut in (10, 40, len(data) - 1):
        runtime_library.runtime_file(folder).write_bytes(data[:cut])
        assert runtime_library.stored_code(folder) is None


@pytest.mark.skipif(sys.platform != "linux", reason="the fast launch is Linux's")
def test_a_kernel_cache_of_another_shape_is_refused_not_followed(
    cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A link where the cache folder should be (to a folder someone else controls) is
    not followed: the kernels compile uncached."""
    elsewhere = cache.parent / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (cache / "tensorplug-cpu").mkdir(mode=0o700)
    (cache / "tensorplug-cpu" / cache_folder.folder_key()).symlink_to(elsewhere)
    with caplog.at_level(logging.WARNING, "tensorplug_cpu"):
        assert cache_folder.kernel_folder() is None
    assert any("is a link" in r.getMessage() or "not a folder" in r.getMessage()
               for r in caplog.records)  # fmt: skip
