"""``tensorplug chat``: chat templates rendered with Jinja, turns, replies, errors."""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import pytest

from tensorplug.cli import main
from tensorplug.errors import RunError
from tensorplug_llm.chat import GEMMA_TEMPLATE, _ids, chat, render
from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.runner import Llama
from tensorplug_llm.tiny import write_tiny_llama

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_a_chatml_template_renders_as_transformers_would() -> None:
    text = render(CHATML, [{"role": "system", "content": "Be brief."},
                           {"role": "user", "content": "Hi"}])  # fmt: skip
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                    "<|im_start|>assistant\n")  # fmt: skip


def test_gemma_turns_put_the_system_prompt_in_the_first_user_turn() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi "},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"},
    ]
    assert render(GEMMA_TEMPLATE, messages, bos="<bos>") == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    )


def test_template_errors_are_run_errors() -> None:
    with pytest.raises(RunError, match="refused the conversation: roles must alternate"):
        render("{{ raise_exception('roles must alternate') }}", [])
    with pytest.raises(RunError, match="does not render"):
        render("{% for %}", [])


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("chat") / "tiny-gemma3.gguf"
    return write_tiny_llama(path, "f32", 4, arch="gemma3", n_layer=2)


def _args(**kw: object) -> argparse.Namespace:
    base = {"system": None, "n_predict": 5, "temp": 0.0, "top_k": 40, "top_p": 0.95, "seed": 0}
    return argparse.Namespace(**{**base, **kw})


def test_each_line_is_a_turn_answered_from_the_rendered_conversation(gemma: Path) -> None:
    m = Llama(gemma, placement=Placement.on(host_cpu(), 2), warmup=False)
    try:
        assert m.vocab is not None
        out, log = io.StringIO(), io.StringIO()
        assert chat(m, _args(), ["hello the world\n", "\n", "the end\n"], out, log) == 0
        assert log.getvalue().count("tokens/s, prompt") == 2  # the empty line is no turn
        # the first reply is the greedy continuation of the rendered first turn
        first = render(GEMMA_TEMPLATE, [{"role": "user", "content": "hello the world"}],
                       m.vocab.tokens[m.vocab.bos or 0])  # fmt: skip
        ids = _ids(m.vocab, first)
        assert ids.count(m.vocab.bos) == 1  # the template's BOS and the file's: one kept
        m.reset()
        want = m.generate(ids, 5).tokens
        first_reply = m.vocab.decode([t for t in want if t not in m.vocab.eog])
        assert out.getvalue().startswith(first_reply + "\n")
        assert len(out.getvalue()) > len(first_reply) + 1  # and a second reply followed
    finally:
        m.close()


def test_cli_refuses_what_chat_cannot_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    llama = write_tiny_llama(tmp_path / "tiny.gguf", "f32", 1)
    assert main(["chat", str(llama), "--device", "CPU"]) == 1
    assert "has no chat template" in capsys.readouterr().err
    assert main(["chat", str(llama), "--tokens", "1,2"]) == 1
    assert "--tokens and --logits-out are run's" in capsys.readouterr().err
