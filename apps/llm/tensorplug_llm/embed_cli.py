"""``tensorplug embed MODEL [TEXT ...]``: the embeddings of texts, like llama.cpp's
``llama-embedding``.

The texts are the TEXT arguments, ``-p``'s prompt, ``-f``'s file or, with none of these,
stdin; each is split at ``--embd-separator`` (a newline), so every line is a text, as
llama-embedding splits its prompt (``-p`` and ``-f`` also read escapes such as ``\\n``, as
it does). A text is tokenized as llama.cpp does for embeddings (the special tokens the
file asks for, control tokens written in the text parsed) and evaluated as a sequence of
its own; its final hidden states are pooled as ``--pooling`` says, by default as the
file's ``pooling_type`` says: a file without one (a decoder) gives ``none``, one row per
token, as llama.cpp does. Each row is then scaled by ``--embd-normalize`` (euclidean).

Output, on stdout, is llama-embedding's: the plain listing (the first values of each
vector, and the cosine similarity matrix of several texts), ``json`` (OpenAI's list of
embedding objects), ``json+`` (with the matrix), ``array`` or ``raw`` (a line per vector).
``--embd-out FILE.npy`` saves the vectors as one float32 array, ``(n_texts, n_embd)``, or
``(n_tokens, n_embd)`` for pooling ``none``, every text's token rows one after the
other; ``FILE.npz`` saves that array as ``embeddings`` with the token ids as ``tokens``
and ``offsets`` (text ``i``'s tokens, and with pooling ``none`` its rows, are
``offsets[i]:offsets[i + 1]``), which is what separates several texts' token rows.
What the run is about goes to stderr, as with ``tensorplug run``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import numpy as np

from tensorplug.cli import count_argument
from tensorplug.errors import RunError

from .run_cli import CACHE_TYPE_NAMES, cache_type_name
from .terminal import printable

if TYPE_CHECKING:
    from .tokenizer.vocab import Vocab

__all__ = ["FORMATS", "add_arguments", "cosine_similarity", "format_embeddings", "main"]

#: ``--embd-output-format``'s values: llama-embedding's, with ``text`` naming its default
FORMATS = ("text", "json", "json+", "array", "raw")


def _int_at_least(low: int, what: str) -> Callable[[str], int]:
    """An argparse ``type``: an integer of at least ``low``, else a usage error naming ``what``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return value

    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .model import POOLING_TYPES
    from .run_cli import layer_count

    p.add_argument(
        "model", metavar="MODEL.gguf", help="a GGUF file: an encoder (BERT) or a decoder"
    )
    p.add_argument(
        "text",
        nargs="*",
        metavar="TEXT",
        help="texts to embed, each split at --embd-separator; without TEXT, -p or -f: stdin, "
        "a text per line",
    )
    p.add_argument(
        "-p", "--prompt", help="the texts, split at --embd-separator (llama-embedding's -p)"
    )
    p.add_argument("-f", "--file", metavar="FNAME", help="read the texts from a file, a line each")
    p.add_argument(
        "--no-escape",
        action="store_true",
        help="take -p and -f as written (by default \\n, \\t, \\\\, \\xHH... are read as "
        "llama.cpp reads them)",
    )
    p.add_argument(
        "--pooling",
        choices=POOLING_TYPES[:4],
        help="how a text's token rows become its vector (default: the file's pooling_type; "
        "none, a row per token, for a file without one)",
    )
    p.add_argument(
        "--embd-normalize",
        type=_int_at_least(-1, "a normalization (-1, 0, 1, 2 or a larger p)"),
        default=2,
        metavar="N",
        help="-1 none, 0 max absolute value to int16's range, 1 taxicab, 2 euclidean "
        "(default), N > 2 the p-norm",
    )
    p.add_argument(
        "--embd-output-format",
        choices=FORMATS,
        help="stdout: text (default: the first values, and the cosine similarity matrix of "
        "several texts), json (OpenAI's), json+ (json and the matrix), array ([[...],...]) "
        "or raw (a line of values per vector); with --embd-out nothing unless given",
    )
    p.add_argument(
        "--embd-separator",
        default="\n",
        metavar="STRING",
        help="what separates the texts (default: a newline), e.g. '<#sep#>'",
    )
    p.add_argument(
        "--tokens",
        action="store_true",
        help="list each text's token ids and pieces (on stderr when stdout carries json, "
        "array or raw output)",
    )
    p.add_argument(
        "--embd-out",
        metavar="FILE",
        help="save the vectors: FILE.npy one float32 array, (n_texts, n_embd) or with "
        "pooling none (n_tokens, n_embd); FILE.npz that array as 'embeddings' with the "
        "'tokens' and the 'offsets' where each text's tokens start",
    )
    p.add_argument(
        "-c",
        "--ctx-size",
        type=_int_at_least(0, "a context length (an integer >= 0)"),
        default=0,
        help="context length, the most tokens a text may have (default 0: the longest text's)",
    )
    p.add_argument(
        "-b", "--batch-size", type=count_argument("a batch size"), default=256,
        help="prompt chunk of a decoder (256); an encoder sees each text whole",
    )  # fmt: skip
    p.add_argument(
        "-t",
        "--threads",
        type=count_argument("a thread count"),
        metavar="N",
        help="threads of the CPU backend's kernels (default: one per core)",
    )
    p.add_argument(
        "-ngl",
        "--n-gpu-layers",
        type=layer_count,
        metavar="N",
        help="put the last N blocks on the best GPU (or --device), the rest on the CPU; "
        "-1: all of them (default)",
    )
    p.add_argument(
        "--device",
        metavar="NAME[,NAME...]",
        help="put every block on this device, or spread the blocks over several",
    )
    p.add_argument(
        "--cache-type",
        type=cache_type_name,
        default="f16",
        metavar="TYPE",
        help=f"the KV cache's type ({CACHE_TYPE_NAMES}; default f16)",
    )
    p.add_argument(
        "--no-mmap",
        action="store_true",
        help="copy CPU weights into memory instead of using the mapped file",
    )


def main(args: argparse.Namespace) -> int:
    from tensorplug.errors import TensorplugError
    from tensorplug.gguf import GGUFError

    try:
        return _embed(args, sys.stdout, sys.stderr)
    except BrokenPipeError:
        raise  # the reader went away (`embed | head`): the CLI stops quietly
    except (GGUFError, TensorplugError, OSError) as e:
        print(f"tensorplug embed: error: {printable(str(e))}", file=sys.stderr)
        return 1


def _embed(args: argparse.Namespace, out: TextIO, log: TextIO) -> int:
    from tensorplug.gguf import GGUFFile

    from .model import LlamaConfig
    from .pooling import NORMALIZE_NAMES, normalize
    from .run_cli import load_model
    from .tokenizer.vocab import Vocab

    texts = read_texts(args)
    if args.embd_out is not None:
        _check_writable(args.embd_out)
    try:
        f = GGUFFile(args.model)
    except OSError as e:
        raise RunError(f"cannot read {args.model}: {e.strerror or e}") from None
    vocab = Vocab.from_gguf(f)
    ids = [vocab.encode(text, parse_special=True) for text in texts]
    if empty := [i for i, t in enumerate(ids) if not t]:
        raise RunError(
            f"text {empty[0]} gives no tokens (it is empty, and the model adds no BOS): "
            "give it some text, or drop the empty line"
        )
    longest = max(range(len(ids)), key=lambda i: len(ids[i]))
    if args.ctx_size == 0:
        args.ctx_size = len(ids[longest])
    elif len(ids[longest]) > args.ctx_size:
        raise RunError(
            f"text {longest} has {len(ids[longest])} tokens, more than the context holds "
            f"(-c {args.ctx_size}): raise -c, or leave it at 0 to fit the longest text"
        )
    file_pooling = LlamaConfig.from_gguf(f).pooling
    kind = args.pooling or file_pooling
    if args.pooling is None and kind == "none":
        print(
            "pooling: none, the file's (it has no pooling_type): a vector per token; "
            "--pooling mean gives one per text",
            file=log,
        )
    fmt = args.embd_output_format or (None if args.embd_out else "text")
    token_out = out if fmt in ("text", None) else log
    if args.tokens:
        _list_tokens(vocab, texts, ids, token_out)
    args.model = f.path  # loaded once more by load_model, which places it as -ngl says
    model = load_model(args, encoder_ok=True)
    try:
        vectors = [model.embed(t, kind) for t in ids]
    finally:
        model.close()
    emb = normalize(
        np.concatenate(vectors) if kind == "none" else np.stack(vectors), args.embd_normalize
    )
    if args.embd_out is not None:
        _save(args.embd_out, emb, ids)
        how = NORMALIZE_NAMES.get(args.embd_normalize, f"{args.embd_normalize}-norm")
        print(
            f"wrote {args.embd_out}: {emb.shape[0]} x {emb.shape[1]} float32 (pooling {kind}, "
            f"normalized: {how})",
            file=log,
        )
    if fmt is not None:
        out.write(format_embeddings(emb, texts, fmt, kind, args.embd_normalize))
    return 0


# -- the texts ----------------------------------------------------------------------------------


def read_texts(args: argparse.Namespace) -> list[str]:
    """The texts to embed: TEXT arguments, ``-p``, ``-f`` or stdin, split at the separator."""
    sep = args.embd_separator
    if not sep:
        raise RunError("--embd-separator is empty: give the string between texts, e.g. '\\n'")
    given = [
        name
        for name, value in (("TEXT", args.text or None), ("-p", args.prompt), ("-f", args.file))
        if value is not None
    ]
    if len(given) > 1:
        raise RunError(f"give the texts one way: {' and '.join(given)} were both given")
    if args.text:
        return [part for text in args.text for part in _utf8(os.fsencode(text), "TEXT").split(sep)]
    if args.prompt is not None:
        raw = _utf8(os.fsencode(args.prompt), "-p")
    elif args.file is not None:
        try:
            data = Path(args.file).read_bytes()
        except OSError as e:
            raise RunError(f"-f {args.file}: cannot read it ({e.strerror or e})") from None
        raw = _chomp(_utf8(data, f"-f {args.file}"))
    else:
        if sys.stdin is None or sys.stdin.isatty():
            raise RunError(
                "no text to embed: give TEXT arguments, -p TEXT or -f FILE, or pipe lines to stdin"
            )
        buffer = getattr(sys.stdin, "buffer", None)
        raw = _chomp(sys.stdin.read() if buffer is None else _utf8(buffer.read(), "stdin"))
        if not raw:
            raise RunError("stdin is empty: pipe a text per line, or give TEXT arguments")
        return raw.split(sep)
    return (raw if args.no_escape else unescape(raw)).split(sep)


def _chomp(text: str) -> str:
    """A file's last line ends with a newline; it does not start an empty text (llama.cpp
    drops it too)."""
    return text[:-1] if text.endswith("\n") else text


def _utf8(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RunError(
            f"{what} is not UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}); "
            "tokenizers read UTF-8 text"
        ) from None


_ESCAPE = re.compile(rb"\\(x[0-9A-Fa-f]{2}|.)", re.DOTALL)
_ESCAPES = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"'": b"'", b'"': b'"', b"\\": b"\\"}


def unescape(text: str) -> str:
    """``text`` with llama.cpp's escapes read (``string_process_escapes``): ``\\n``, ``\\r``,
    ``\\t``, ``\\'``, ``\\"``, ``\\\\`` and ``\\xHH`` (a byte); any other backslash stays."""

    def one(m: re.Match[bytes]) -> bytes:
        e = m.group(1)
        return bytes([int(e[1:], 16)]) if len(e) == 3 else _ESCAPES.get(e, b"\\" + e)

    return _utf8(_ESCAPE.sub(one, text.encode("utf-8")), "the text with its \\x escapes read")


def _list_tokens(vocab: Vocab, texts: Sequence[str], ids: Sequence[list[int]], out: TextIO) -> None:
    """llama-embedding's ``--verbose-prompt`` listing: each text, then ``id -> 'piece'``."""
    for i, (text, tokens) in enumerate(zip(texts, ids, strict=True)):
        print(f"prompt {i}: '{printable(text)}' ({len(tokens)} tokens)", file=out)
        for tid in tokens:
            piece = vocab.piece(tid, special=True).decode("utf-8", errors="backslashreplace")
            print(f"{tid:6d} -> '{printable(piece)}'", file=out)
        print(file=out)


# -- the output ---------------------------------------------------------------------------------


def _check_writable(name: str) -> None:
    """Said before loading: ``--embd-out`` names a .npy or .npz file in a folder that exists."""
    path = Path(name)
    if path.suffix.lower() not in (".npy", ".npz"):
        raise RunError(
            f"--embd-out {name}: name a .npy file (the vectors) or a .npz file (the vectors, "
            "tokens and offsets), e.g. embeddings.npy"
        )
    if path.is_dir():
        raise RunError(f"--embd-out {name}: is a directory; name a file in it")
    if not path.parent.is_dir():
        raise RunError(f"--embd-out {name}: there is no folder {path.parent}; create it first")


def _save(name: str, emb: np.ndarray, ids: Sequence[list[int]]) -> None:
    if Path(name).suffix.lower() == ".npy":
        np.save(name, emb)
        return
    lengths = np.array([0, *(len(t) for t in ids)], dtype=np.int64)
    tokens = np.array([tid for t in ids for tid in t], dtype=np.int32)
    np.savez(name, embeddings=emb, tokens=tokens, offsets=np.cumsum(lengths))


def cosine_similarity(emb: np.ndarray) -> np.ndarray:
    """Every pair of rows' cosine similarity (llama.cpp's ``common_embd_similarity_cos``,
    summed in double): 1 for two zero rows, 0 for one."""
    x = emb.astype(np.float64)
    dots = x @ x.T
    norms = np.sqrt(np.diag(dots))
    zero = norms == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        sim = dots / np.outer(norms, norms)
    sim[zero[:, None] | zero[None, :]] = 0.0
    sim[zero[:, None] & zero[None, :]] = 1.0
    return sim.astype(np.float32)


def format_embeddings(emb: np.ndarray, texts: Sequence[str], fmt: str, kind: str, p: int) -> str:
    """``emb`` as llama-embedding prints it in format ``fmt`` (:data:`FORMATS`); ``kind``
    is the pooling (``none``: a row per token), ``p`` the normalization (0: whole numbers)."""
    spec = ".0f" if p == 0 else ".7f"
    if fmt == "raw":
        return "".join(" ".join(format(v, spec) for v in row) + "\n" for row in emb)
    rows = ["[" + ",".join(format(v, spec) for v in row) + "]" for row in emb]
    if fmt == "array":
        return "[" + ",".join(rows) + "]\n"
    if fmt in ("json", "json+"):
        items = (
            f'    {{\n      "object": "embedding",\n      "index": {j},\n'
            f'      "embedding": {row}\n    }}'
            for j, row in enumerate(rows)
        )
        text = '{\n  "object": "list",\n  "data": [\n' + ",\n".join(items) + "\n  ]"
        if fmt == "json+" and len(texts) > 1:
            sim = cosine_similarity(emb)
            lines = ("    [" + ", ".join(f"{s:6.2f}" for s in r) + " ]" for r in sim)
            text += ',\n  "cosineSimilarity": [\n' + ",\n".join(lines) + "\n  ]"
        return text + "\n}\n"
    return _listing(emb, [printable(t) for t in texts], kind, "6.0f" if p == 0 else "9.6f")


def _listing(emb: np.ndarray, texts: Sequence[str], kind: str, spec: str) -> str:
    """llama-embedding's default output: the first values of each vector (all of them for
    a single text; the first and last three of each token row), then the cosine
    similarity matrix of several texts."""
    n_embd = emb.shape[1]
    lines = []
    for j, row in enumerate(emb):
        if kind == "none":
            shown = "".join(f"{v:{spec}} " for v in row[:3]) + " ... "
            shown += "".join(f"{v:{spec}} " for v in row[max(n_embd - 3, 0) :])
        else:
            shown = "".join(f"{v:{spec}} " for v in row[: 16 if len(texts) > 1 else n_embd])
        lines.append(f"embedding {j}: {shown}")
    if kind != "none" and len(texts) > 1:
        sim = cosine_similarity(emb)
        lines += ["", "cosine similarity matrix:", "", "".join(f"{t[:6]:>6} " for t in texts)]
        lines += [
            "".join(f"{s:6.2f} " for s in r) + t[:10] for r, t in zip(sim, texts, strict=True)
        ]
    return "\n".join(lines) + "\n"
