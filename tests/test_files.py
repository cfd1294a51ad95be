"""replace_file: a cache file is replaced whole or left as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorplug.files import replace_file


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
