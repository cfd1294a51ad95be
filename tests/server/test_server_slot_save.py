"""llama-server's slot actions (``--slot-save-path``): a slot's tokens and K/V rows saved
to a file, restored into a slot (of this server or a new one) so the prompt is not
evaluated again and the reply is the one it would have been; a slot erased; and a file
that does not belong to this model, or is not a slot file at all, refused with a 400."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tensorplug_llm.api import LLM
from tensorplug_llm.engine import Engine
from tensorplug_llm.generation import EngineGenerator
from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.runner import ModelRunner
from tensorplug_llm.server import ServerConfig, create_app
from tensorplug_llm.tiny import write_tiny_llama

PROMPT = "the of and to in is it that was for on are as with his they at be this from"


class _Server:
    """A server on the tiny model with a save folder, slots alone (no prompt cache)."""

    def __init__(self, model: Path, folder: Path, cache_type: str = "f16") -> None:
        self.llama = ModelRunner(model, placement=Placement.on(host_cpu(), 2), n_ctx=256,
                                 warmup=False, cache_type=cache_type)  # fmt: skip
        self.engine = Engine(self.llama, 2)
        self.llm = LLM(self.llama, EngineGenerator(self.engine), model_name="tiny.gguf")
        self.http = TestClient(create_app(self.llm, ServerConfig(slot_save_path=folder)))

    def complete(self, prompt: str, slot: int = 0) -> dict[str, Any]:
        r = self.http.post("/completion", json={"prompt": prompt, "n_predict": 6,
                                                "temperature": 0, "id_slot": slot})  # fmt: skip
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body

    def action(self, slot: int, action: str, **body: Any) -> Any:
        return self.http.post(f"/slots/{slot}?action={action}", json=body)

    def close(self) -> None:
        self.llm.close()
        self.llama.close()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("slots") / "tiny.gguf", "q8_0", 0)


@pytest.fixture
def server(model: Path, tmp_path: Path) -> Iterator[_Server]:
    s = _Server(model, tmp_path)
    yield s
    s.close()


def test_a_saved_slot_restores_into_a_new_server_and_its_prompt_is_not_evaluated_again(
    server: _Server, model: Path, tmp_path: Path
) -> None:
    first = server.complete(PROMPT)
    n_held = first["timings"]["prompt_n"] + 6 - 1  # the last token is never evaluated
    saved = server.action(0, "save", filename="conversation.bin").json()
    assert (saved["id_slot"], saved["filename"], saved["n_saved"]) == (0, "conversation.bin",
                                                                       n_held)  # fmt: skip
    assert saved["n_written"] == (tmp_path / "conversation.bin").stat().st_size
    assert saved["timings"]["save_ms"] >= 0
    again = _Server(model, tmp_path)  # a restart
    try:
        restored = again.action(1, "restore", filename="conversation.bin").json()
        assert (restored["id_slot"], restored["n_restored"]) == (1, n_held)
        assert restored["n_read"] == saved["n_written"]
        second = again.complete(PROMPT, slot=1)
        # only the last prompt token is evaluated; the reply is the first server's
        assert second["timings"]["prompt_n"] == 1
        assert second["timings"]["cache_n"] == first["timings"]["prompt_n"] - 1
        assert second["content"] == first["content"]
    finally:
        again.close()


def test_erase_empties_a_slot(server: _Server) -> None:
    held = server.complete(PROMPT)["timings"]["prompt_n"] + 5
    assert server.action(0, "erase").json() == {"id_slot": 0, "n_erased": held}
    assert server.action(0, "erase").json() == {"id_slot": 0, "n_erased": 0}
    r = server.action(0, "save", filename="empty.bin")
    assert r.status_code == 400 and "nothing to save" in r.json()["error"]["message"]


@pytest.mark.parametrize("name", ["../x.bin", "a/b.bin", ".hidden", "", "a\x00b"])
def test_a_filename_with_a_folder_part_is_refused(server: _Server, name: str) -> None:
    r = server.action(0, "save", filename=name)
    assert r.status_code == 400 and r.json()["error"]["param"] == "filename"


def test_bad_slot_ids_actions_and_missing_files_are_400(server: _Server) -> None:
    server.complete(PROMPT)
    wrong_slot = server.action(7, "save", filename="x.bin").json()["error"]
    assert "Invalid slot ID" in wrong_slot["message"]
    assert server.action(0, "load", filename="x.bin").json()["error"]["param"] == "action"
    r = server.action(0, "restore", filename="absent.bin")
    assert r.status_code == 400 and "no file" in r.json()["error"]["message"]


def _written(path: Path, **members: Any) -> None:
    with path.open("wb") as f:
        np.savez(f, **members)


def test_a_file_that_is_not_this_models_slot_is_refused_and_leaves_the_slot_empty(
    server: _Server, model: Path, tmp_path: Path
) -> None:
    server.complete(PROMPT)
    server.action(0, "save", filename="good.bin")
    with np.load(tmp_path / "good.bin") as npz:
        good = {k: npz[k] for k in npz.files}
    cases = {
        "pickle.bin": None,  # a pickle, not an npz: never unpickled
        "other-model.bin": {**good, "model": np.array("llama;other.gguf;1")},
        "bad-token.bin": {**good, "tokens": good["tokens"] + 10_000},
        "bad-shape.bin": {**good, "k": good["k"][:, :1]},
        "too-long.bin": {**good, "tokens": np.zeros(300, np.int32)},
    }
    (tmp_path / "pickle.bin").write_bytes(pickle.dumps({"k": 1}))
    for name, members in cases.items():
        if members is not None:
            _written(tmp_path / name, **members)
        server.complete(PROMPT, slot=1)
        r = server.action(1, "restore", filename=name)
        assert r.status_code == 400, name
        assert r.json()["error"]["message"].startswith("Unable to restore slot"), name
        assert server.action(1, "erase").json()["n_erased"] == 0, name  # left empty
    # a file of the same model with an F32 cache is another model's state
    f32 = _Server(model, tmp_path, cache_type="f32")
    try:
        r = f32.action(0, "restore", filename="good.bin")
        assert r.status_code == 400 and "another model" in r.json()["error"]["message"]
    finally:
        f32.close()


def test_without_a_save_folder_slot_actions_are_501(model: Path, tmp_path: Path) -> None:
    s = _Server(model, tmp_path)
    try:
        off = TestClient(create_app(s.llm, ServerConfig()))
        r = off.post("/slots/0?action=save", json={"filename": "x.bin"})
        assert r.status_code == 501 and "--slot-save-path" in r.json()["error"]["message"]
    finally:
        s.close()


def test_a_failed_save_keeps_the_file_that_was_there(server: _Server, tmp_path: Path) -> None:
    server.complete(PROMPT)
    server.action(0, "save", filename="kept.bin")
    before = (tmp_path / "kept.bin").read_bytes()
    server.action(0, "erase")
    assert server.action(0, "save", filename="kept.bin").status_code == 400
    assert (tmp_path / "kept.bin").read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".slot-")]
