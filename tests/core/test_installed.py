"""What importlib.metadata says, kept between processes (tensorplug.installed): the same
answers as importlib.metadata's, asked again whenever a folder on sys.path changes,
and never trusted where the key cannot tell."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from plugin_dists import CORE, mirror_site_packages

from tensorplug import installed

GROUP = "tensorplug.test-installed"
OLD = time.time() - 3600  # a folder time well before now: settled
_stamps = iter(range(1, 1_000_000))


def _write_dist(site: Path, name: str, version: str, entry_points: dict[str, str]) -> None:
    """A distribution as pip leaves it, as far as importlib.metadata reads one; ``site``
    is given an old time of its own (a new one each call), as after an install."""
    for old in site.glob(f"{name.replace('-', '_')}-*.dist-info"):
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = "".join(f"{k} = {v}\n" for k, v in entry_points.items())
    (info / "entry_points.txt").write_text(f"[{GROUP}]\n{lines}")
    (info / "RECORD").write_text(f"{info.name}/METADATA,,\nlibthing.so.1,,\n")
    stamp = OLD + next(_stamps)
    os.utime(site, (stamp, stamp))


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on sys.path holding test distributions, and a kept file of this test's
    own; no folder is too new to be trusted."""
    folder = tmp_path / "site"
    folder.mkdir()
    _only_stable_beside(folder, monkeypatch)
    monkeypatch.setenv("TENSORPLUG_CACHE", str(tmp_path / "kept"))
    monkeypatch.setattr(installed, "SETTLE_NS", 0)
    installed.forget()
    yield folder
    installed.forget()


def _only_stable_beside(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``sys.path``: ``folder``, and beside it only the interpreter's and the venv's
    folders, which nothing writes to during the run: the working directory (where
    coverage's subprocesses leave their data files) or a source folder could change
    between two questions of a test and give them two keys. The whole path comes back
    at the monkeypatch's undo, the tests' own prepends too."""
    prefixes = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}
    stable = [p for p in sys.path if isinstance(p, str) and p and _under(Path(p), prefixes)]
    monkeypatch.syspath_prepend(str(folder))  # first: its undo puts the whole path back
    sys.path[:] = [str(folder), *stable]


def test_the_whole_path_comes_back_after_a_test(tmp_path: Path) -> None:
    before = list(sys.path)
    with pytest.MonkeyPatch.context() as mp:
        _only_stable_beside(tmp_path / "site", mp)
        mp.syspath_prepend(str(tmp_path))  # as a test does
        mp.setattr(sys, "path", [*sys.path, str(tmp_path / "more")])  # and another
        assert str(Path.cwd()) not in sys.path[1:]
    assert sys.path == before


def _under(path: Path, prefixes: set[Path]) -> bool:
    resolved = path.resolve()
    return any(resolved.is_relative_to(prefix) for prefix in prefixes)


def _kept_file(tmp_path: Path) -> dict:
    (path,) = (tmp_path / "kept").glob("metadata-*.json")
    data: dict = json.loads(path.read_text())
    return data


def test_answers_are_importlib_metadatas(site: Path) -> None:
    _write_dist(site, "tp-thing", "1.0", {"thing": "tp_thing.mod:obj.attr [extra]"})
    (ep,) = installed.entry_points(GROUP)
    assert ep == installed.EntryPointInfo("thing", "tp_thing.mod:obj.attr [extra]", GROUP,
                                          "tp-thing")  # fmt: skip
    assert installed.version("tp-thing") == metadata.version("tp-thing") == "1.0"
    assert installed.version("tp-no-such-thing") is None
    assert installed.version("numpy") == metadata.version("numpy")
    assert installed.locate("tp-thing", "libthing.so.1") == str(site / "libthing.so.1")
    assert installed.locate("tp-thing", "libother.so") is None
    assert installed.locate("tp-no-such-thing", "libthing.so.1") is None
    assert installed.entry_points("tensorplug.no-such-group") == []


def test_an_install_upgrade_or_removal_is_seen(site: Path) -> None:
    _write_dist(site, "tp-thing", "1.0", {"thing": "tp_thing:one"})
    assert [e.value for e in installed.entry_points(GROUP)] == ["tp_thing:one"]
    assert installed.version("tp-thing") == "1.0"
    _write_dist(site, "tp-thing", "2.0", {"thing": "tp_thing:two", "more": "tp_thing:more"})
    assert sorted(e.value for e in installed.entry_points(GROUP)) == ["tp_thing:more",
                                                                     "tp_thing:two"]  # fmt: skip
    assert installed.version("tp-thing") == "2.0"
    _write_dist(site, "tp-other", "1.0", {})  # a new distribution: the folder changed
    for f in [*(site / "tp_thing-2.0.dist-info").iterdir()]:
        f.unlink()
    (site / "tp_thing-2.0.dist-info").rmdir()
    os.utime(site, (OLD + 99, OLD + 99))
    assert installed.entry_points(GROUP) == []
    assert installed.version("tp-thing") is None


def test_answers_are_kept_under_the_key_they_were_asked_under(
    site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_dist(site, "tp-thing", "1.0", {"thing": "tp_thing:one"})
    installed.entry_points(GROUP)
    installed.version("tp-thing")
    (answers,) = _kept_file(tmp_path)["entries"].values()
    assert answers == {f"entry_points:{GROUP}": [["thing", "tp_thing:one", "tp-thing"]],
                       "version:tp-thing": "1.0"}  # fmt: skip
    # another script's folder first on sys.path: a key of its own beside the first
    monkeypatch.syspath_prepend(str(tmp_path))
    installed.version("tp-thing")
    assert len(_kept_file(tmp_path)["entries"]) == 2
    for i in range(installed.MAX_KEYS + 2):  # the newest keys stay, the oldest go
        extra = tmp_path / f"script{i}"
        extra.mkdir()
        monkeypatch.syspath_prepend(str(extra))
        installed.version("tp-thing")
    entries = _kept_file(tmp_path)["entries"]
    assert len(entries) == installed.MAX_KEYS
    assert all(a == {"version:tp-thing": "1.0"} for a in entries.values())


def test_fresh_asks_again_and_keeps_what_changed(site: Path) -> None:
    """A change the key cannot see (a folder's time put back): asked ``fresh``, the
    new list is kept for the next caller."""
    _write_dist(site, "tp-thing", "1.0", {"thing": "tp_thing:one"})
    _write_dist(site, "tp-other", "1.0", {})
    stamp = site.stat().st_mtime_ns
    assert [e.value for e in installed.entry_points(GROUP)] == ["tp_thing:one"]
    entry_points = site / "tp_other-1.0.dist-info" / "entry_points.txt"
    entry_points.write_text(f"[{GROUP}]\nother = tp_other:one\n")  # a distribution kept none of
    os.utime(site, ns=(stamp, stamp))
    assert [e.value for e in installed.entry_points(GROUP)] == ["tp_thing:one"]  # unseen
    both = ["tp_thing:one", "tp_other:one"]
    assert sorted(e.value for e in installed.entry_points(GROUP, fresh=True)) == sorted(both)
    assert sorted(e.value for e in installed.entry_points(GROUP)) == sorted(both)


def test_an_entry_point_file_edited_in_place_is_seen(
    site: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The key cannot see it (the folders' times put back), the check against the
    distribution's entry_points.txt does."""
    _write_dist(site, "tp-thing", "1.0", {"thing": "tp_thing:one"})
    stamp = site.stat().st_mtime_ns
    assert [e.value for e in installed.entry_points(GROUP)] == ["tp_thing:one"]
    (site / "tp_thing-1.0.dist-info" / "entry_points.txt").write_text(f"[{GROUP}]\n")
    os.utime(site, ns=(stamp, stamp))
    assert installed.entry_points(GROUP) == []


def test_paths_and_bytes_on_sys_path_are_keyed_too(
    site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An application may append a Path or bytes to sys.path: the answers are still
    kept (a key that could not be written down dropped the file at every question)."""
    _write_dist(site, "tp-thing", "1.0", {})
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.setattr(sys, "path", [*sys.path, other, os.fsencode(other)])
    assert installed.version("tp-thing") == "1.0"
    assert installed.version("tp-thing") == "1.0"
    (answers,) = _kept_file(tmp_path)["entries"].values()
    assert answers == {"version:tp-thing": "1.0"}


def test_a_folder_changed_just_now_is_not_trusted(
    site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(installed, "SETTLE_NS", 60_000_000_000)
    _write_dist(site, "tp-thing", "1.0", {})
    os.utime(site)  # now: a change in the same clock tick could come unseen
    assert installed.version("tp-thing") == "1.0"
    assert not (tmp_path / "kept").exists()


DAMAGED = [b"", b"{not json", b'{"format": 1, "entries": [1]}',
           b'{"format": 1, "entries": {"k": 3}}', b'{"entries": {}}']  # fmt: skip


@pytest.mark.parametrize("bad", DAMAGED)
def test_a_damaged_file_is_a_miss_and_rewritten(site: Path, tmp_path: Path, bad: bytes) -> None:
    _write_dist(site, "tp-thing", "1.0", {"thing": "tp_thing:one"})
    installed.version("tp-thing")
    (path,) = (tmp_path / "kept").glob("metadata-*.json")
    path.write_bytes(bad)
    installed.forget()  # this process's memory of the file too
    path.write_bytes(bad)
    assert installed.version("tp-thing") == "1.0"
    assert [e.name for e in installed.entry_points(GROUP)] == ["thing"]
    assert len(_kept_file(tmp_path)["entries"]) == 1


def test_a_kept_answer_of_another_shape_is_asked_again(site: Path, tmp_path: Path) -> None:
    _write_dist(site, "tp-thing", "1.0", {"thing": "tp_thing:one"})
    installed.entry_points(GROUP)
    installed.version("tp-thing")
    (path,) = (tmp_path / "kept").glob("metadata-*.json")
    data = json.loads(path.read_text())
    (key,) = data["entries"]
    data["entries"][key] = {f"entry_points:{GROUP}": [["thing"]], "version:tp-thing": 3}
    installed.forget()
    path.write_text(json.dumps(data))
    assert [e.value for e in installed.entry_points(GROUP)] == ["tp_thing:one"]
    assert installed.version("tp-thing") == "1.0"


def test_off_or_unwritable_asks_every_time(
    site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_dist(site, "tp-thing", "1.0", {})
    monkeypatch.setenv("TENSORPLUG_CACHE", "0")
    assert installed.version("tp-thing") == "1.0"
    assert not (tmp_path / "kept").exists()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("TENSORPLUG_CACHE", str(blocker / "below"))
    assert installed.version("tp-thing") == "1.0"  # nothing raised, nothing kept
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TENSORPLUG_CACHE", "maybe")  # a folder's name, not a bad flag
    assert installed.version("tp-thing") == "1.0"
    assert [p.name[:9] for p in (tmp_path / "maybe").iterdir()] == ["metadata-"]


def test_the_entry_point_loads_what_it_names() -> None:
    ep = installed.EntryPointInfo("x", "tensorplug.installed:EntryPointInfo.load [extra]", GROUP)
    assert ep.load() is installed.EntryPointInfo.load
    assert installed.EntryPointInfo("x", "json", GROUP).load() is json
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        installed.EntryPointInfo("x", "json:nothing", GROUP).load()


def _python(code: str, site: Path, kept: Path, cwd: Path) -> dict:
    """``code`` in a fresh interpreter whose path is ``site``, the core and this
    interpreter's packages without tensorplug's plugins; ``result`` as JSON."""
    mirror = mirror_site_packages(kept.parent / "mirror")
    os.utime(mirror, (OLD, OLD))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORPLUG_")}
    env.update(PYTHONPATH=os.pathsep.join(map(str, (site, CORE, mirror))),
               TENSORPLUG_CACHE=str(kept))  # fmt: skip
    script = textwrap.dedent(code) + "\nimport json\nprint(json.dumps(result))\n"
    proc = subprocess.run([sys.executable, "-S", "-c", script], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out: dict = json.loads(proc.stdout.splitlines()[-1])
    return out


def test_a_second_process_answers_without_importlib_metadata(tmp_path: Path) -> None:
    site, cwd = tmp_path / "site", tmp_path / "cwd"
    cwd.mkdir()
    _write_dist(site, "tp-thing", "1.0", {"thing": "tp_thing:one"})
    os.utime(cwd, (OLD, OLD))
    ask = f"""
        from tensorplug import installed
        result = {{"eps": [e.value for e in installed.entry_points({GROUP!r})],
                   "version": installed.version("tp-thing")}}
    """
    first = _python(ask, site, tmp_path / "kept", cwd)
    blocked = "import sys\nsys.modules['importlib.metadata'] = None\n" + textwrap.dedent(ask)
    assert _python(blocked, site, tmp_path / "kept", cwd) == first == {
        "eps": ["tp_thing:one"], "version": "1.0"}  # fmt: skip


def test_the_registry_reads_again_when_a_kept_plugin_is_gone(tmp_path: Path) -> None:
    """A plugin removed in a way the key cannot see (its folders' times put back) is
    not reported as broken: the registry asks importlib.metadata again."""
    site, cwd = tmp_path / "site", tmp_path / "cwd"
    cwd.mkdir()
    site.mkdir()
    (site / "tp_gone.py").write_text(
        textwrap.dedent("""
        from tensorplug.registration import Registration
        registration = Registration(name="Gone", api_version=(1, 0), init="tp_gone:none",
                                    score=lambda: (0, "never runs"))
    """)
    )
    _write_dist(site, "tp-gone", "1.0", {})
    info = site / "tp_gone-1.0.dist-info"
    (info / "entry_points.txt").write_text("[tensorplug.backends]\ngone = tp_gone:registration\n")
    os.utime(site, (OLD, OLD))
    os.utime(cwd, (OLD, OLD))
    ask = """
        from tensorplug import registry
        result = sorted([r.entry_point, r.status.value] for r in registry.discover())
    """
    assert _python(ask, site, tmp_path / "kept", cwd) == [["gone", "unsupported"]]
    for f in info.iterdir():
        f.unlink()
    info.rmdir()
    (site / "tp_gone.py").unlink()
    os.utime(site, (OLD, OLD))  # as it was: the kept list still names the plugin
    assert _python(ask, site, tmp_path / "kept", cwd) == []
