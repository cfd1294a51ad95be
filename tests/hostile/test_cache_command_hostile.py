"""``tensorplug cache`` shows, verifies and clears what is kept, whatever a damaged or
hostile cache folder holds: a FIFO is reported, not waited on; a link is removed, not
followed; nothing but tensorplug's kept files is removed."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tensorplug import installed
from tensorplug.cli import main
from tensorplug.gguf import GGUFFile
from tensorplug_llm.tiny import write_tiny_llama


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache folder holding installed metadata, a GGUF header and a device list."""
    kept = tmp_path / "kept"
    monkeypatch.setenv("TENSORPLUG_CACHE", str(kept))
    monkeypatch.setenv("TENSORPLUG_DEVICE_CACHE", str(kept))
    monkeypatch.setattr(installed, "SETTLE_NS", 0)
    installed.forget()
    installed.version("numpy")
    GGUFFile(write_tiny_llama(tmp_path / "tiny.gguf", "f32", 0))
    (kept / "devices").mkdir(mode=0o700)
    (kept / "devices" / "Fake.json").write_text('{"format": 1, "key": "k", "devices": []}')
    yield kept
    installed.forget()


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    status = main(["cache", *argv, "--plain"])
    return status, capsys.readouterr().out


def test_show_lists_each_kept_file_with_its_size_and_kind(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out = _run(capsys)
    assert status == 0
    (metadata,) = folder.glob("metadata-*.json")
    (header,) = (folder / "gguf").iterdir()
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith(str(folder))}
    assert set(lines) == {str(metadata), str(header), str(folder / "devices" / "Fake.json")}
    assert "installed metadata" in lines[str(metadata)]
    assert "a GGUF file's header" in lines[str(header)]
    assert f"{header.stat().st_size / 1024:.1f} KiB" in lines[str(header)]


@pytest.mark.skipif(sys.platform == "win32", reason="FIFOs are POSIX's")
def test_verify_names_what_would_not_be_used(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(capsys, "verify")[0] == 0
    (metadata,) = folder.glob("metadata-*.json")
    metadata.unlink()
    os.mkfifo(metadata)  # reported, not waited on
    (header,) = (folder / "gguf").iterdir()
    header.write_text("[" * 1000 + "]" * 1000)
    status, out = _run(capsys, "verify")
    assert status == 1
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith(str(folder))}
    assert "not a regular file" in lines[str(metadata)]
    assert "does not hold what tensorplug writes" in lines[str(header)]
    assert lines[str(folder / "devices" / "Fake.json")].endswith("ok")
    assert "2 kept file(s) would not be used" in out


def test_verify_tells_a_stale_header_from_a_damaged_one(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A header kept for an older state of its model is a harmless miss, not a problem."""
    (tmp_path / "tiny.gguf").unlink()
    status, out = _run(capsys, "verify")
    assert status == 0
    (header,) = (folder / "gguf").iterdir()
    assert "stale: its model" in next(ln for ln in out.splitlines() if str(header) in ln)


def test_clear_removes_kept_files_only_and_never_follows_a_link(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = tmp_path / "precious.json"
    outside.write_text("mine")
    (folder / "devices" / "Linked.json").symlink_to(outside)
    (folder / "notes.txt").write_text("not tensorplug's")
    status, out = _run(capsys, "clear")
    assert status == 0 and "removed 4 kept file(s)" in out
    assert outside.read_text() == "mine"
    assert sorted(p.name for p in folder.rglob("*") if not p.is_dir()) == ["notes.txt"]
    assert "nothing is kept" in _run(capsys)[1]


def test_nothing_kept_is_said_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TENSORPLUG_CACHE", "0")
    monkeypatch.setenv("TENSORPLUG_DEVICE_CACHE", "0")
    assert _run(capsys, "clear") == (0, "removed 0 kept file(s) from none (caches are off)\n")
    status, out = _run(capsys, "show")
    assert status == 0 and "nothing is kept" in out
