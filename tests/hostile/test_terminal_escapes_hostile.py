"""A model file that spells terminal escape sequences — in its tokens, in its chat
template's error messages, in its metadata — cannot make ``chat`` or ``run`` retitle the
window, recolour the terminal or write the clipboard (OSC 52): everything printed from a
model file has its control characters escaped, as ``run`` escapes generated text."""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest

from tensorplug_llm.chat import GEMMA_TEMPLATE, chat
from tensorplug_llm.runner import Generation
from tensorplug_llm.tiny import tiny_vocab, write_tiny_llama
from tensorplug_llm.tokenizer import TokenType, Vocab

OSC52 = "\x1b]52;c;ZWNobyBwd25lZA==\x07"  # "write this to the clipboard"
TITLE = "\x1b]0;owned\x07"


class _Model:
    """What ``chat`` uses of a model, generating a fixed reply whatever the prompt."""

    def __init__(self, vocab: Vocab, reply: list[int]) -> None:
        self.vocab, self.reply, self.n_ctx = vocab, reply, 256
        self.file = SimpleNamespace(get=lambda key: GEMMA_TEMPLATE, path=Path("evil.gguf"))
        self.config = SimpleNamespace(arch=SimpleNamespace(name="gemma3"))

    def reset(self) -> None:
        pass

    def generate(
        self,
        ids: Sequence[int],
        n: int,
        sampler: object,
        on_token: Callable[[int], None],
        **options: object,  # stop_at_eos, on_progress: what chat passes on
    ) -> Generation:
        for tok in self.reply:
            on_token(tok)
        return Generation(list(self.reply))


def test_chat_escapes_control_characters_in_the_reply() -> None:
    tokens, scores, types = tiny_vocab(320)
    tokens[300], types[300] = TITLE, TokenType.NORMAL  # a token whose text is an escape
    vocab = Vocab(tokens, scores, types)
    esc_byte = tokens.index("<0x1B>")  # ESC spelled with byte tokens, then the rest
    reply = [300, esc_byte, *vocab.encode("]52;c;ZWNo", add_bos=False), tokens.index("<0x07>")]
    out, log = io.StringIO(), io.StringIO()
    args = argparse.Namespace(system=None, n_predict=8, temp=0.0, top_k=40, top_p=0.95, seed=0)
    assert chat(_Model(vocab, reply), args, ["hi"], out, log) == 0  # type: ignore[arg-type]
    text = out.getvalue()
    assert "\x1b" not in text and "\x07" not in text
    assert text.startswith("\\x1b]0;owned\\x07\\x1b") and text.endswith("ZWNo\\x07\n")


def _cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tensorplug", *args], input=stdin,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_COLOR": "1"})  # fmt: skip


@pytest.mark.parametrize(
    "template",
    [
        "{{ raise_exception('" + OSC52 + "roles must alternate') }}",
        "{% if " + TITLE + " %}",  # a syntax error quoting the template's own text
    ],
)
def test_chat_template_errors_are_printed_escaped(tmp_path: Path, template: str) -> None:
    path = write_tiny_llama(
        tmp_path / "evil.gguf", arch="gemma3", metadata={"tokenizer.chat_template": template}
    )
    done = _cli("chat", str(path), "-n", "2", "-p", "hi")
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "chat template" in done.stderr
    assert "\x1b" not in done.stderr and "\x07" not in done.stderr
    assert "\\x1b" in done.stderr


def test_metadata_echoed_in_errors_is_escaped(tmp_path: Path) -> None:
    path = write_tiny_llama(
        tmp_path / "evil.gguf", metadata={"general.architecture": "\x1b[31mllama" + TITLE}
    )
    done = _cli("run", str(path), "-n", "1")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "general.architecture" in done.stderr
    assert "\x1b" not in done.stderr and "\x07" not in done.stderr
