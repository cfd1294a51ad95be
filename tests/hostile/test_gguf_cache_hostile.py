"""A kept GGUF header (tensorplug.gguf_index) is checked against the file before use:
edited to swap two same-shaped tensors, change a value, or hold values of other types
or nesting, it is a miss (the file is parsed again), never a crash or another weight."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensorplug import gguf_index
from tensorplug.gguf import GGUFFile
from tensorplug_llm.tiny import write_tiny_llama


@pytest.fixture
def model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tiny model, its header kept in a folder of this test's own."""
    monkeypatch.setenv("TENSORPLUG_CACHE", str(tmp_path / "kept"))
    monkeypatch.setattr("tensorplug.kept._warned", set())
    path = write_tiny_llama(tmp_path / "tiny.gguf", "f32", 0)
    GGUFFile(path)
    assert gguf_index.load(path, os.stat(path)) is not None
    return path


def _edit(tmp_path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    (entry,) = (tmp_path / "kept" / "gguf").iterdir()
    data = json.loads(entry.read_text())
    change(data)
    entry.write_text(json.dumps(data))


def _as_parsed(path: Path, monkeypatch: pytest.MonkeyPatch) -> GGUFFile:
    with monkeypatch.context() as m:
        m.setenv("TENSORPLUG_CACHE", "0")
        return GGUFFile(path)


def test_two_same_shaped_tensors_swapped_in_the_kept_header_are_caught(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    truth = _as_parsed(model, monkeypatch)
    by_shape: dict[Any, list[str]] = {}
    for info in truth.tensors.values():
        by_shape.setdefault((info.type_id, info.shape), []).append(info.name)
    a, b = next(names for names in by_shape.values() if len(names) >= 2)[:2]

    def swap(data: dict[str, Any]) -> None:
        rows = {row[0]: row for row in data["tensors"]}
        rows[a][4], rows[b][4] = rows[b][4], rows[a][4]

    _edit(tmp_path, swap)
    opened = GGUFFile(model)
    assert opened.tensors[a].offset == truth.tensors[a].offset
    assert opened.tensors[b].offset == truth.tensors[b].offset
    assert np.array_equal(opened.read_tensor(a), truth.read_tensor(a))


def test_a_changed_kept_value_is_caught(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    truth = _as_parsed(model, monkeypatch).get("llama.block_count")
    _edit(tmp_path, lambda d: d["fields"]["llama.block_count"].update(value=truth + 7))
    assert GGUFFile(model).get("llama.block_count") == truth


def _numeric_array(data: dict[str, Any]) -> str:
    return next(k for k, f in data["fields"].items() if f.get("dtype"))


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: d.update(alignment=0),
        lambda d: d.update(data_offset=-8),
        lambda d: d["fields"][_numeric_array(d)].update(dtype="O"),
        lambda d: d["fields"][_numeric_array(d)].update(dtype="<U9"),
        lambda d: d["fields"][_numeric_array(d)].update(length=10**12),
        lambda d: d["fields"]["general.architecture"].update(value=json.loads("[" * 50 + "]" * 50)),
    ],
    ids=["alignment 0", "negative offset", "dtype O", "dtype <U9", "huge length", "deep value"],
)
def test_kept_values_out_of_shape_are_a_miss_not_a_crash(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    damage: Callable[[dict[str, Any]], None], caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    truth = _as_parsed(model, monkeypatch)
    _edit(tmp_path, damage)
    opened = GGUFFile(model)
    assert opened.alignment == truth.alignment and opened.data_offset == truth.data_offset
    keys = truth.keys()
    assert opened.keys() == keys and [opened.get(k) for k in keys] == [truth.get(k) for k in keys]
    assert opened.tensors == truth.tensors


def test_a_kept_header_nested_1000_deep_is_a_miss(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    (entry,) = (tmp_path / "kept" / "gguf").iterdir()
    text = entry.read_text()
    entry.write_text(text[:-1] + ', "deep": ' + "[" * 1000 + "]" * 1000 + "}")
    assert GGUFFile(model).architecture == "llama"
    warned = [r.getMessage() for r in caplog.records if str(entry) in r.getMessage()]
    assert len(warned) == 1 and "tensorplug cache clear" in warned[0]


def test_a_header_changed_under_the_same_identity_is_caught(model: Path) -> None:
    """What the file's identity cannot see (its times put back on a file system without
    change times): the header's hash does."""
    index = gguf_index.load(model, os.stat(model))
    assert index is not None
    data = np.fromfile(model, np.uint8)
    assert gguf_index.matches(index, data)
    at = bytes(data).index(b"llama", gguf_index.HEAD_BYTES)
    data[at] = ord("L")
    assert not gguf_index.matches(index, data)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX's")
def test_keeping_a_header_beside_a_fifo_neither_blocks_nor_keeps_it(
    model: Path, tmp_path: Path
) -> None:
    """Writing an entry prunes the others: a FIFO among them is removed, not read."""
    fifo = tmp_path / "kept" / "gguf" / "0123456789abcdef01234567.json"
    os.mkfifo(fifo)
    other = write_tiny_llama(tmp_path / "other.gguf", "f32", 1)
    done: list[GGUFFile] = []
    worker = threading.Thread(target=lambda: done.append(GGUFFile(other)), daemon=True)
    worker.start()
    worker.join(60)  # milliseconds unless blocked for ever on the FIFO
    assert not worker.is_alive(), "keeping a header blocked on a FIFO beside it"
    assert not os.path.lexists(fifo) and len(list(fifo.parent.iterdir())) == 2
