"""``tensorplug chat``: chat templates rendered with Jinja, turns, replies, errors."""

from __future__ import annotations

import argparse
import io
import json
import re
from pathlib import Path

import pytest

from tensorplug.cli import main
from tensorplug.errors import RunError
from tensorplug_llm.chat import (
    CHATML_TEMPLATE,
    GEMMA_TEMPLATE,
    ReplyInterrupted,
    _ReplyStop,
    chat,
    load_messages,
    prompt_ids,
    render,
)
from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.runner import ModelRunner
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
    m = ModelRunner(gemma, placement=Placement.on(host_cpu(), 2), warmup=False)
    try:
        assert m.vocab is not None
        out, log = io.StringIO(), io.StringIO()
        assert chat(m, _args(), ["hello the world\n", "\n", "the end\n"], out, log) == 0
        assert log.getvalue().count("tokens/s, prompt") == 2  # the empty line is no turn
        # the first reply is the greedy continuation of the rendered first turn
        ids = prompt_ids(m.vocab, GEMMA_TEMPLATE, [{"role": "user", "content": "hello the world"}],
                         m.vocab.tokens[m.vocab.bos or 0], "")  # fmt: skip
        assert ids.count(m.vocab.bos or 0) == 1  # the template's BOS and the file's: one kept
        m.reset()
        want = m.generate(ids, 5).tokens
        first_reply = m.vocab.decode([t for t in want if t not in m.vocab.eog])
        assert out.getvalue().startswith(first_reply + "\n")
        assert len(out.getvalue()) > len(first_reply) + 1  # and a second reply followed
    finally:
        m.close()


def test_a_file_without_a_template_is_named_a_base_model_and_gets_chatml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    llama = write_tiny_llama(tmp_path / "tiny.gguf", "f32", 1)
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\n"))
    assert main(["chat", str(llama), "--device", "CPU", "-n", "4"]) == 0
    err = capsys.readouterr().err
    warning = [line for line in err.splitlines() if "has no chat template" in line]
    assert len(warning) == 1 and "looks like a base model" in warning[0]
    assert "chat template: ChatML (llama.cpp's fallback)" in err
    assert "tokens/s, prompt" in err  # and the message was answered


def test_chat_help_shows_what_chat_does(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["chat", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "the first message" in text and "(256;" in text
    for run_only in ("--tokens", "--logits-out", "--context-shift", "--keep"):
        assert run_only not in text
    with pytest.raises(SystemExit) as exit_info:
        main(["chat", "x.gguf", "--tokens", "1,2"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --tokens" in capsys.readouterr().err


@pytest.fixture(scope="module")
def chatml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("chatml") / "tiny-chatml.gguf"
    return write_tiny_llama(
        path, "f32", 2, n_ctx=512, metadata={"tokenizer.chat_template": CHATML_TEMPLATE}
    )


def _evaluated(log: str) -> list[tuple[int, int]]:
    """(prompt tokens, evaluated) of each turn's summary line."""
    return [
        (int(m[1]), int(m[2])) for m in re.finditer(r"prompt (\d+) tokens, (\d+) evaluated", log)
    ]


def test_a_turn_evaluates_only_what_the_cache_lacks_and_answers_as_from_scratch(
    chatml: Path, tmp_path: Path
) -> None:
    m = ModelRunner(chatml, placement=Placement.on(host_cpu(), 2), warmup=False)
    try:
        assert m.vocab is not None
        saved = tmp_path / "conv.json"
        lines = ["hello the world", "the end of it", f"/save {saved}"]
        out, log = io.StringIO(), io.StringIO()
        before = m.timings.prompt_tokens
        assert chat(m, _args(n_predict=6), lines, out, log) == 0
        turns = _evaluated(log.getvalue())
        assert len(turns) == 2
        (n1, e1), (n2, e2) = turns
        assert e1 == n1  # the first turn reads everything
        # the second reads at most what came after the first prompt: the cache is reused (the
        # reply too, where its text tokenizes as it was sampled: gibberish bytes may not)
        assert 0 < e2 <= n2 - n1
        # the runner counted the same (each turn's prompt, plus the reply tokens evaluated)
        assert m.timings.prompt_tokens - before == e1 + e2
        messages = json.loads(saved.read_text())
        assert [x["role"] for x in messages] == ["user", "assistant", "user", "assistant"]
        # the second reply is what evaluating the whole conversation from scratch gives
        m.reset()
        ids = _ids_of(m, messages[:3])
        assert len(ids) == n2
        want = [t for t in m.generate(ids, 6).tokens if t not in m.vocab.eog]
        assert messages[3]["content"] == m.vocab.decode(want)
    finally:
        m.close()


def test_a_reply_stopped_by_ctrl_c_counts_only_the_prompt_as_evaluated(
    chatml: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The summary's "evaluated" is the prompt's share: the reply's tokens, fed back
    through the model before the Ctrl-C, are the reply's count, not the prompt's."""
    checks: list[None] = []

    def ctrl_c_after_a_few_tokens(self: object) -> None:  # what the first Ctrl-C does
        checks.append(None)
        if len(checks) > 12:
            raise ReplyInterrupted

    monkeypatch.setattr(_ReplyStop, "check", ctrl_c_after_a_few_tokens)
    m = ModelRunner(chatml, placement=Placement.on(host_cpu(), 2), warmup=False)
    try:
        out, log = io.StringIO(), io.StringIO()
        chat(m, _args(n_predict=40, ignore_eos=True), ["hello the world"], out, log)
        stopped = re.search(r"reply stopped after (\d+) tokens", log.getvalue())
        assert stopped is not None and int(stopped[1]) >= 5, log.getvalue()
        [(prompt, evaluated)] = _evaluated(log.getvalue())
        assert evaluated == prompt  # the first turn reads its whole prompt, and only it
        assert m.n_past > prompt  # while the cache holds the reply's tokens too
    finally:
        m.close()


def _ids_of(m: ModelRunner, messages: list[dict[str, str]]) -> list[int]:
    assert m.vocab is not None
    return prompt_ids(m.vocab, CHATML_TEMPLATE, messages, "<s>", "</s>")


def test_commands_change_the_conversation_and_bad_files_lose_nothing(
    chatml: Path, tmp_path: Path
) -> None:
    m = ModelRunner(chatml, placement=Placement.on(host_cpu(), 2), warmup=False)
    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    bad = tmp_path / "bad.json"
    bad.write_text('[{"role": "wizard", "content": "x"}]')
    lines = [
        "/system be brief",
        "hello",
        f"/save {a}",
        "/clear",
        f"/save {b}",
        f"/load {a}",
        f"/load {bad}",
        f"/load {tmp_path / 'missing.json'}",
        f"/save {c}",
        "/nonsense",
        "/exit",
        "never read",
    ]
    try:
        out, log = io.StringIO(), io.StringIO()
        assert chat(m, _args(n_predict=3), lines, out, log) == 0
    finally:
        m.close()
    first = json.loads(a.read_text())
    assert [x["role"] for x in first] == ["system", "user", "assistant"]
    assert first[0]["content"] == "be brief" and first[1]["content"] == "hello"
    assert json.loads(b.read_text()) == [{"role": "system", "content": "be brief"}]
    assert json.loads(c.read_text()) == first  # /load round-trips; bad files changed nothing
    errors = [line for line in log.getvalue().splitlines() if line.startswith("error:")]
    assert len(errors) == 2
    assert "message 0 is not" in errors[0] and "unchanged" in errors[0]
    assert "cannot read" in errors[1] and "No such file" in errors[1]
    assert "unknown command /nonsense" in log.getvalue()
    assert len(_evaluated(log.getvalue())) == 1  # /exit left before "never read"


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{", "is not JSON"),
        ('{"role": "user"}', "holds a JSON dict"),
        ('[{"role": "user", "content": 3}]', "message 0 is not"),
        ('[{"role": "user", "content": "x", "extra": 1}]', "message 0 is not"),
    ],
)
def test_load_messages_names_what_is_wrong(tmp_path: Path, content: str, problem: str) -> None:
    path = tmp_path / "m.json"
    path.write_text(content)
    with pytest.raises(RunError, match=problem):
        load_messages(str(path))


def test_tiny_chats_with_the_tiny_random_model(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\n"))
    args = ["chat", "--tiny", "--weights", "f32", "--device", "CPU", "-n", "3"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "chatting with a tiny random-weight llama" in err
    assert "looks like a base model" in err and "tokens/s, prompt" in err
