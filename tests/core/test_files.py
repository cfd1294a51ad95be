"""replace_file: a cache file is replaced whole or left as it was; FileRange: a file's
bytes read in pieces."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tensorplug.files import FileRange, replace_file


def test_a_file_is_written_whole_in_a_folder_made_for_it(tmp_path: Path) -> None:
    path = tmp_path / "new" / "kept.bin"
    replace_file(path, b"first")
    replace_file(path, b"second, longer")
    assert path.read_bytes() == b"second, longer"
    assert [p.name for p in path.parent.iterdir()] == ["kept.bin"]  # no temporary left


def test_a_failed_write_leaves_the_old_file_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "kept.bin"
    replace_file(path, b"old")

    def refuse(src: str, dst: str) -> None:
        raise OSError("no room")

    monkeypatch.setattr("os.replace", refuse)
    with pytest.raises(OSError, match="no room"):
        replace_file(path, b"new")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["kept.bin"]


def test_a_folder_below_a_file_is_an_os_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(OSError):
        replace_file(tmp_path / "file" / "kept.bin", b"x")


def test_a_file_range_reads_its_bytes_from_its_own_descriptor(tmp_path: Path) -> None:
    """FileRange reads with pread from a duplicate of the descriptor it was given: the
    bytes of the file that was opened, even after that descriptor is closed."""
    path = tmp_path / "model.bin"
    path.write_bytes(bytes(range(256)) * 4)
    fd = os.open(path, os.O_RDONLY)
    rows = FileRange(fd, 100, 500, str(path))
    os.close(fd)
    into = bytearray(8)
    rows.read(memoryview(into), 10)
    assert bytes(into) == bytes(range(110, 118))
    with pytest.raises(ValueError, match="outside the range's 500"):
        rows.read(memoryview(into), 495)


def test_a_file_range_of_a_file_cut_short_says_so(tmp_path: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(bytes(1024))
    fd = os.open(path, os.O_RDONLY)
    rows = FileRange(fd, 0, 1024, str(path))
    os.close(fd)
    os.truncate(path, 100)
    with pytest.raises(OSError, match="changed or was truncated while in use"):
        rows.read(memoryview(bytearray(16)), 512)
