"""Kept files are an optimisation, never an authority: the installed-metadata file
replaced by a FIFO, a link, something huge or deeply nested, or edited to name a
module or a library nothing installed declares, is a miss that asks again (with one
warning naming the file and how to clear it), never a hang, a crash or an import."""

from __future__ import annotations

import json
import logging
import os
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tensorplug import installed

GROUP = "tensorplug.test-kept-hostile"
OLD = time.time() - 3600


def _write_dist(site: Path, entry_points: dict[str, str]) -> None:
    info = site / "tp_thing-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tp-thing\nVersion: 1.0\n")
    lines = "".join(f"{k} = {v}\n" for k, v in entry_points.items())
    (info / "entry_points.txt").write_text(f"[{GROUP}]\n{lines}")
    (info / "RECORD").write_text(f"{info.name}/METADATA,,\ntp_thing/libtbb.so.12,,\n")
    os.utime(site, (OLD, OLD))


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    folder = tmp_path / "site"
    folder.mkdir()
    _write_dist(folder, {"thing": "tp_thing:one"})
    # a module that says when it is imported: no kept row may make anyone import it
    (folder / "tp_evil.py").write_text("import os\nos.environ['TP_EVIL_IMPORTED'] = '1'\n")
    os.utime(folder, (OLD, OLD))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("TENSORPLUG_CACHE", str(tmp_path / "kept"))
    monkeypatch.delenv("TP_EVIL_IMPORTED", raising=False)
    monkeypatch.setattr(installed, "SETTLE_NS", 0)
    monkeypatch.setattr("tensorplug.kept._warned", set())
    installed.forget()
    yield folder
    installed.forget()


def _kept_path(tmp_path: Path) -> Path:
    (path,) = (tmp_path / "kept").glob("metadata-*.json")
    return path


def _edit(tmp_path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Change the one key's answers in the kept file, as a hand or a tool would."""
    path = _kept_path(tmp_path)
    data = json.loads(path.read_text())
    (answers,) = data["entries"].values()
    change(answers)
    path.write_text(json.dumps(data))
    installed._memo.clear()  # this process's memory, not the file


def _replace(path: Path, make: Callable[[Path], None]) -> None:
    path.unlink()
    make(path)
    installed._memo.clear()


def _answers_in_time(ask: Callable[[], Any]) -> Any:
    """``ask()``'s answer; a call that blocks (on a FIFO) fails the test, not hangs it."""
    result: list[Any] = []
    worker = threading.Thread(target=lambda: result.append(ask()), daemon=True)
    worker.start()
    worker.join(60)  # far beyond a miss's milliseconds: only a call blocked for ever waits
    assert not worker.is_alive(), "reading the kept file blocked"
    return result[0]


def _clear_hint(caplog: pytest.LogCaptureFixture, path: Path) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and str(path) in r.getMessage()
            and "tensorplug cache clear" in r.getMessage()]  # fmt: skip


def test_an_extra_kept_entry_point_is_never_imported(
    site: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert [e.name for e in installed.entry_points(GROUP)] == ["thing"]
    row = ["evil", "tp_evil:anything", "tp-thing"]
    _edit(tmp_path, lambda answers: answers[f"entry_points:{GROUP}"].append(row))
    found = installed.entry_points(GROUP)
    assert [(e.name, e.value) for e in found] == [("thing", "tp_thing:one")]
    assert "TP_EVIL_IMPORTED" not in os.environ
    assert len(_clear_hint(caplog, _kept_path(tmp_path))) == 1


@pytest.mark.parametrize("distribution", ["tp-no-such", "tp-thing"])
def test_a_kept_entry_point_of_another_or_no_distribution_is_asked_again(
    site: Path, tmp_path: Path, distribution: str
) -> None:
    installed.entry_points(GROUP)
    rows = [["thing", "tp_evil:one", distribution]]
    _edit(tmp_path, lambda answers: answers.update({f"entry_points:{GROUP}": rows}))
    assert [e.value for e in installed.entry_points(GROUP)] == ["tp_thing:one"]


def test_a_kept_library_path_must_be_the_distributions_own(site: Path, tmp_path: Path) -> None:
    """A kept path handed to ctypes.CDLL would load any library: it is used only where
    the distribution's RECORD lists it."""
    real = str(site / "tp_thing" / "libtbb.so.12")
    assert installed.locate("tp-thing", "libtbb.so.12") == real
    question = "file:tp-thing:libtbb.so.12"
    _edit(tmp_path, lambda answers: answers.update({question: str(tmp_path / "evil.so")}))
    assert installed.locate("tp-thing", "libtbb.so.12") == real
    _edit(tmp_path, lambda answers: answers.update({question: None}))
    assert installed.locate("tp-thing", "libtbb.so.12") == real


def test_a_kept_version_must_be_the_installed_one(site: Path, tmp_path: Path) -> None:
    assert installed.version("tp-thing") == "1.0"
    assert installed.version("tp-no-such") is None
    _edit(tmp_path, lambda a: a.update({"version:tp-thing": "9.9", "version:tp-no-such": "1"}))
    assert installed.version("tp-thing") == "1.0"
    assert installed.version("tp-no-such") is None


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _link_to_dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _huge(path: Path) -> None:
    path.write_bytes(b'{"format": 1, "entries": {}}' + b" " * (installed.MAX_BYTES + 1))


def _nested(path: Path) -> None:
    path.write_bytes(b'{"format": 1, "entries": {"k": {"q": ' + b"[" * 1000 + b"]" * 1000 + b"}}}")


def _garbage(path: Path) -> None:
    path.write_bytes(os.urandom(4096))


@pytest.mark.skipif(sys.platform == "win32", reason="FIFOs and links to devices are POSIX's")
@pytest.mark.parametrize("make", [_fifo, _link_to_dev_zero, _huge, _nested, _garbage])
def test_a_kept_file_that_is_no_json_file_is_a_miss_with_one_warning(
    site: Path, tmp_path: Path, make: Callable[[Path], None], caplog: pytest.LogCaptureFixture
) -> None:
    installed.entry_points(GROUP)
    path = _kept_path(tmp_path)
    _replace(path, make)
    assert [e.value for e in _answers_in_time(lambda: installed.entry_points(GROUP))] == [
        "tp_thing:one"]  # fmt: skip
    assert _answers_in_time(lambda: installed.version("tp-thing")) == "1.0"
    assert len(_clear_hint(caplog, path)) == 1  # one warning, whatever the questions


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes")
def test_the_cache_folder_is_made_user_only(site: Path, tmp_path: Path) -> None:
    installed.version("tp-thing")
    assert stat.S_IMODE((tmp_path / "kept").stat().st_mode) == 0o700
    assert stat.S_IMODE(_kept_path(tmp_path).stat().st_mode) == 0o600


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes")
def test_a_cache_folder_others_can_write_is_ignored(
    site: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As ssh ignores a ~/.ssh others can write: anyone could have put the file there."""
    installed.entry_points(GROUP)
    path = _kept_path(tmp_path)
    row = ["evil", "tp_evil:anything", "tp-thing"]
    _edit(tmp_path, lambda answers: answers[f"entry_points:{GROUP}"].insert(0, row))
    os.chmod(tmp_path / "kept", 0o777)
    before = path.read_bytes()
    assert [e.name for e in installed.entry_points(GROUP)] == ["thing"]
    assert installed.version("tp-thing") == "1.0"
    assert path.read_bytes() == before  # nor written there
    warned = [m for m in _clear_hint(caplog, path) if "can be written by others" in m]
    assert len(warned) == 1 and "chmod 700" in warned[0]


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0,
                    reason="giving a folder to another user needs root")  # fmt: skip
def test_a_cache_folder_of_another_user_is_ignored(
    site: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    installed.entry_points(GROUP)
    path = _kept_path(tmp_path)
    row = ["evil", "tp_evil:anything", "tp-thing"]
    _edit(tmp_path, lambda answers: answers[f"entry_points:{GROUP}"].insert(0, row))
    os.chown(tmp_path / "kept", 12345, 12345)
    assert [e.name for e in installed.entry_points(GROUP)] == ["thing"]
    warned = [m for m in _clear_hint(caplog, path) if "belongs to another user" in m]
    assert len(warned) == 1
