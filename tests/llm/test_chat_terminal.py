"""``tensorplug chat`` on a pseudo-terminal (pexpect), as a person uses it: Ctrl-C in a
reply and at the prompt, the up arrow, /save and /load.

Each test starts the real command in a child process on a pty, so readline, the SIGINT
a terminal sends and the prompt are the real ones. Waits are pexpect's ``expect`` with
generous timeouts (a loaded 2-core machine loads the model slowly), never sleeps.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from terminal_signals import sigint_as_a_terminal_sends_it

from tensorplug_llm.chat import CHATML_TEMPLATE
from tensorplug_llm.chat_input import HISTORY_LENGTH
from tensorplug_llm.tiny import write_tiny_llama

pexpect = pytest.importorskip("pexpect", reason="the pty tests need pexpect (see the README)")
if not hasattr(pexpect, "spawn"):  # Windows has no pty
    pytest.skip("pexpect.spawn needs a POSIX pty", allow_module_level=True)

#: Seconds to wait for the model to load (numba's cache may be cold) and for a reply.
LOAD = 300
REPLY = 120


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny chat model whose replies with --ignore-eos -n -1 run until its 1024-token
    context is full: long enough to interrupt, short enough to finish."""
    path = tmp_path_factory.mktemp("pty") / "tiny-chat.gguf"
    meta = {"tokenizer.chat_template": CHATML_TEMPLATE}
    return write_tiny_llama(path, "f32", 3, n_ctx=1024, metadata=meta)


def _spawn(model: Path, state: Path, *options: str) -> Any:
    env = {**os.environ, "XDG_STATE_HOME": str(state), "TERM": "xterm", "COLUMNS": "200"}
    env.pop("INPUTRC", None)
    args = ["-m", "tensorplug", "chat", str(model), "--device", "CPU", *options]
    child = pexpect.spawn(sys.executable, args, env=env, encoding="utf-8", timeout=REPLY,
                          dimensions=(50, 200),
                          preexec_fn=sigint_as_a_terminal_sends_it)  # fmt: skip
    child.expect("Ctrl-D leaves", timeout=LOAD)
    child.expect_exact("> ")
    return child


def _ended(child: Any) -> tuple[int | None, str]:
    child.expect(pexpect.EOF, timeout=REPLY)
    child.close()
    return child.exitstatus, child.before or ""


def test_ctrl_c_stops_a_reply_keeps_it_and_twice_at_the_prompt_leaves(
    model: Path, tmp_path: Path
) -> None:
    saved = tmp_path / "conv.json"
    child = _spawn(model, tmp_path, "-n", "-1", "--ignore-eos")
    child.sendline("hello the world")
    child.expect_exact("hello the world\r\n")  # the echo; then the reply streams
    child.expect(r"\S{8}")  # some of the reply
    child.sendintr()
    child.expect(r"reply stopped after (\d+) tokens; kept as the assistant's turn")
    stopped_after = int(child.match.group(1))
    child.expect(r"prompt (\d+) tokens, (\d+) evaluated")
    child.expect_exact("> ")
    # the next turn works, reusing the cache, and this time runs to the end of the context
    child.sendline("the end")
    child.expect(r"context is full \(1024 tokens\)")
    child.expect(r"prompt (\d+) tokens, (\d+) evaluated")
    prompt, evaluated = int(child.match.group(1)), int(child.match.group(2))
    assert 0 < evaluated < prompt
    child.expect_exact("> ")
    child.sendline(f"/save {saved}")
    child.expect_exact("(saved 4 messages")
    child.expect_exact("> ")
    child.sendintr()  # once at the prompt: a hint, the chat goes on
    child.expect_exact("Ctrl-C again or Ctrl-D leaves the chat")
    child.expect_exact("> ")
    child.sendintr()  # twice: it ends, normally
    status, rest = _ended(child)
    assert status == 0, rest
    assert "Traceback" not in rest and "interrupted" not in rest
    messages = json.loads(saved.read_text())
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[0]["content"] == "hello the world" and messages[2]["content"] == "the end"
    assert 0 < stopped_after < 1000 and messages[1]["content"]  # the partial reply, kept


def test_save_load_round_trip_and_the_up_arrow_recalls_the_last_session(
    model: Path, tmp_path: Path
) -> None:
    pytest.importorskip("readline", reason="history recall needs readline")
    first, second, recalled = (tmp_path / n for n in ("first.json", "second.json", "up.json"))
    history = tmp_path / "tensorplug" / "chat_history"  # XDG_STATE_HOME/tensorplug/
    history.parent.mkdir()
    history.write_text("".join(f"old line {i}\n" for i in range(HISTORY_LENGTH + 500)))
    child = _spawn(model, tmp_path, "-n", "4", "-c", "128")
    for line in ("/system be brief", "hello there"):
        child.sendline(line)
        child.expect_exact("> ")
    child.sendline(f"/save {first}")
    child.expect_exact("(saved 3 messages")
    child.sendline("/clear")
    child.expect_exact("(conversation cleared)")
    child.sendline("/load /no/such/file.json")
    child.expect(r"error: cannot read /no/such/file.json: .* \(the conversation is unchanged\)")
    child.sendline(f"/load {first}")
    child.expect_exact("(loaded 3 messages")
    child.sendline(f"/save {second}")
    child.expect_exact("(saved 3 messages")
    child.sendline("the " * 200)  # more than the context: refused, the conversation stays
    child.expect(r"error: the message takes \d+ tokens, more than the context \(128\)")
    child.expect_exact("(the message was not sent)")
    child.sendline("the last words")
    child.expect(r"evaluated\)")
    child.expect_exact("> ")
    child.sendeof()
    status, rest = _ended(child)
    assert status == 0, rest
    assert json.loads(second.read_text()) == json.loads(first.read_text())
    assert json.loads(first.read_text())[1] == {"role": "user", "content": "hello there"}
    kept = history.read_text().splitlines()  # bounded: the oldest lines went
    assert len(kept) == HISTORY_LENGTH and kept[-1] == "the last words"
    # a new session: the up arrow brings back the last message of the one before
    child = _spawn(model, tmp_path, "-n", "4")
    child.send("\x1b[A")
    child.expect_exact("the last words")
    child.send("\r")
    child.expect(r"evaluated\)")
    child.sendline(f"/save {recalled}")
    child.expect_exact("(saved 2 messages")
    child.sendeof()
    status, rest = _ended(child)
    assert status == 0, rest
    assert json.loads(recalled.read_text())[0] == {"role": "user", "content": "the last words"}


def test_a_ctrl_c_while_the_history_is_saved_does_not_cut_it_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leaving with Ctrl-C pressed once more: the history is written whole and no
    KeyboardInterrupt escapes the reader (it surfaced as a traceback from its close)."""
    from tensorplug_llm import chat_input

    written: list[str] = []

    class Readline:  # the history calls of readline, the last one interrupted
        def set_history_length(self, n: int) -> None:
            pass

        def read_history_file(self, path: str) -> None:
            pass

        def write_history_file(self, path: str) -> None:
            signal.raise_signal(signal.SIGINT)
            written.append(path)

    reader = chat_input.PromptReader()
    reader.interactive, reader.readline = True, Readline()  # type: ignore[assignment]
    monkeypatch.setattr(chat_input, "history_path", lambda: tmp_path / "history")
    monkeypatch.setattr(reader, "_read", lambda: None)  # the user leaves at once
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # `pytest &` ignores it
    try:
        assert list(reader) == []
    finally:
        signal.signal(signal.SIGINT, before)
    assert written == [str(tmp_path / "history")]
