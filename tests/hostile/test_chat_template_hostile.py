"""A chat template is code from an untrusted model file: it cannot run for ever, allocate
gigabytes, escape the sandbox or end ``chat`` in a traceback. Every failure is one
ChatTemplateError that names the template and the fix."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tensorplug.errors import RunError
from tensorplug_llm.chat import render
from tensorplug_llm.template import Limits
from tensorplug_llm.tiny import write_tiny_llama

MESSAGES = [{"role": "user", "content": "hi"}]

#: Run in a child process with 2 GiB of address space and a time limit: before rendering
#: was bounded these hung or allocated gigabytes.
CHILD = """
import sys
from tensorplug.errors import RunError
from tensorplug_llm.chat import render
try:
    out = render(sys.argv[1], [{"role": "user", "content": "hi"}])
except RunError as e:
    print(type(e).__name__, e)
    sys.exit(3)
print("rendered", len(out))
"""


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        pytest.param(
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            "it ran for more than 5 s",
            marks=pytest.mark.slow,
        ),
        ("{% macro f(n) %}{{ f(n) }}{{ f(n) }}{% endmacro %}{{ f(1) }}", "recursed too deeply"),
        ("{{ 10 ** 100000000 }}", "bits, more than the 14000"),
        (
            "{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}"
            "{% endfor %}{{ ns.x }}",
            "bits, more than the 14000",
        ),
        ("{{ 'a' * 10**10 }}", "repeating a value 10000000000 times"),
        ("{{ messages * 10**9 }}", "repeating a value 1000000000 times"),
        ("{{ 'x'|center(3000000000) }}", "center(3000000000)"),
        ("{{ '%3000000000d' % 1 }}", "%-formatting"),
        ("{{ '%.3000000000f' % 1.5 }}", "%-formatting"),
        ("{{ '%s'|format('x'|center(2000000)) * 4 }}", "repeating a value 4 times"),
        ("{{ '{:>3000000000}'.format(1) }}", "a format() field"),
        ("{{ '{0:>4000000}{0:>4000000}'.format(1) }}", "str.format"),
        ("{{ 'x'.ljust(3000000000) }}", "str.ljust"),
        ("{{ (1).to_bytes(3000000000, 'big') }}", "int.to_bytes"),
        ("{{ ('x' * 4000000)|replace('', 'yy') }}", "replace"),
        ("{{ ('a' * 4000000).replace('a', 'bbbbbbbb') }}", "replace"),
        ("{{ ('\t' * 4000000).expandtabs(100) }}", "expandtabs"),
        ("{{ ('x' * 4000000).join(['a', 'b', 'c']) }}", "str.join"),
        ("{{ (['a'] * 4000)|join('x' * 4000) }}", "join"),
        ("{{ ('x\n' * 100000)|indent(1000) }}", "indent"),
        (
            "{% set ns = namespace(s='x' * 1000000) %}{% for i in range(30) %}"
            "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
            "~ (joining strings)",
        ),
        (
            "{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = [ns.l, ns.l] %}"
            "{% endfor %}{{ ns.l|tojson }}",
            "more than the 4194304",
        ),
        (
            "{% macro m() %}{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}"
            "{% endmacro %}{{ m()|length }}",
            "it wrote more than 4194304 characters",
        ),
        (
            "{% for i in range(100000) %}{% for j in range(100000) %}" + "x" * 1000 + "{% endfor %}"
            "{% endfor %}",
            "it wrote more than 4194304 characters",
        ),
        ("{{ lipsum(10**9) }}", "'lipsum' is undefined"),
    ],
)
def test_templates_that_exhaust_cpu_or_memory_are_refused(template: str, reason: str) -> None:
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", CHILD, template], capture_output=True,
                              text=True, timeout=120, preexec_fn=_limit_memory)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"rendering {template[:60]!r} did not end within 120 s")
    assert done.returncode == 3, done.stdout + done.stderr[-1500:]
    assert done.stdout.startswith("ChatTemplateError the model's chat template failed")
    assert reason in done.stdout and "--chat-template FILE" in done.stdout
    assert time.monotonic() - start < 60


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        ("{{ 1/0 }}", "ZeroDivisionError: division by zero"),
        ("{{ range(10**9) }}", "OverflowError: Range too big"),
        ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "recursed too deeply"),
        ("{% include 'other.j2' %}", "it uses include (line 1)"),
        ("{% import 'macros.j2' as m %}", "it uses import"),
        ("{% from 'macros.j2' import m %}", "it uses fromimport"),
        ("{% extends 'base.j2' %}", "it uses extends"),
        ("{{ 'a' + 1 }}", "TypeError: can only concatenate str"),
        ("{{ '%d' % 'x' }}", "TypeError: %d format: a real number is required"),
        ("{{ 10 ** 5000 }}", "bits, more than the 14000"),
        ("{{ ('9' * 400)|float|int }}", "OverflowError"),
        ("{{ messages[5].content }}", "UndefinedError"),
        ("{{ 'abc'.translate({97: 'x' * 100}) }}", "SecurityError"),
    ],
)
def test_template_errors_are_one_error_naming_the_template(template: str, reason: str) -> None:
    with pytest.raises(RunError) as e:
        render(template, MESSAGES)
    assert type(e.value).__name__ == "ChatTemplateError"
    assert str(e.value).startswith("the model's chat template failed: ")
    assert reason in str(e.value) and "--chat-template FILE" in str(e.value)


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ raise_exception.__globals__ }}",
        "{{ cycler.__init__.__globals__.os }}",
        "{{ namespace.__init__.__globals__ }}",
        "{{ _tp_tick.__self__ }}",
        "{{ _tp_concat.__globals__ }}",
        "{{ ''.format.__globals__ }}",
        "{{ '{0.__class__.__mro__}'.format('') }}",
        "{{ messages.append(1) }}",
        "{{ (messages|first).update({'role': 'system'}) }}",
    ],
)
def test_templates_stay_sandboxed(template: str) -> None:
    """Refused, or rendered as nothing (an unsafe attribute is undefined)."""
    try:
        assert render(template, MESSAGES).strip() == ""
    except RunError as e:
        assert type(e).__name__ == "ChatTemplateError"


def test_the_bookkeeping_cannot_be_undone_by_the_template() -> None:
    """The output limit holds though the template ticks a negative count. The time limit
    is out of reach here: on a busy machine it fired first and hid what is checked."""
    text = "{% for i in range(100000) %}{{ _tp_tick(-10**9) }}{{ 'x' * 100 }}{% endfor %}"
    with pytest.raises(RunError, match="it wrote more than 4194304 characters"):
        render(text, MESSAGES, limits=Limits(seconds=3600))


def test_real_templates_still_render() -> None:
    """ChatML (SmolLM2, Qwen) and a Llama 3 style template with tojson and namespace."""
    chatml = (
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
        "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    assert render(chatml, MESSAGES) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    llama3 = (
        "{{ bos_token }}{% set ns = namespace(n=0) %}{% for m in messages %}"
        "{% set ns.n = ns.n + 1 %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
        "{{ m['content'] | trim }}<|eot_id|>{% endfor %}{{ {'n': ns.n, 'l': [1, 2]}|tojson }}"
        "{{ '%05d|%s' % (7, 'x') }}{{ '{:>4}'.format('ab') }}{{ 'a b'.split()|join(',') }}"
    )
    assert render(llama3, [{"role": "user", "content": " hello "}], bos="<s>") == (
        '<s><|start_header_id|>user<|end_header_id|>\n\nhello<|eot_id|>{"l": [1, 2], "n": 1}'
        "00007|x  aba,b"
    )


def test_chat_reports_a_failing_template_in_one_line(tmp_path: Path) -> None:
    path = write_tiny_llama(
        tmp_path / "t.gguf", arch="gemma3", metadata={"tokenizer.chat_template": "{{ 1/0 }}"}
    )
    done = subprocess.run([sys.executable, "-m", "tensorplug", "chat", str(path), "-p", "hi"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ})  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "error: the model's chat template failed: ZeroDivisionError" in done.stderr
    good = tmp_path / "gemma.j2"
    good.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    done = subprocess.run([sys.executable, "-m", "tensorplug", "chat", str(path), "-p", "hi",
                           "-n", "2", "--chat-template", str(good)], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
