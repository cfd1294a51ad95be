"""llama-server's command line → ``tensorplug serve``'s, for llama.cpp's server test suite.

llama.cpp's suite (``tools/server/tests``) starts the binary named by
``LLAMA_SERVER_BIN_PATH`` with llama-server's flags; ``scripts/tensorplug-llama-server``
is that binary for ``tensorplug serve``: it runs this module, which maps the few flags
whose spelling is the only difference and hands everything else to ``tensorplug serve``
as it came, so a flag the server does not know is refused by the server itself (the
suite sees the same failure a user would).

``TENSORPLUG_SUITE_UNKNOWN_FLAGS=drop`` instead leaves out the flags ``tensorplug serve``
does not accept (naming them on stderr): a look at the routes and fields beneath a
command line it does not take yet, never the contract.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

__all__ = ["VALUES", "known_to", "main", "serve_argv"]

# fmt: off
#: llama-server's flags that llama.cpp's suite passes (``utils.py``'s ``ServerProcess``),
#: with how many values each takes: needed to drop one whole, value included.
VALUES: dict[str, int] = {
    **dict.fromkeys((
        "--port", "--temp", "--seed", "--host", "--model", "-m", "--model-url",
        "--model-draft", "--hf-repo", "-hf", "--hf-file", "-hff", "--models-dir",
        "--models-max", "--models-preset", "--cors-origins", "--batch-size", "-b",
        "--ubatch-size", "-ub", "--threads", "-t", "--n-gpu-layers", "-ngl", "--pooling",
        "--alias", "-a", "--tags", "--ctx-size", "-c", "--parallel", "-np", "-ctk", "-ctv",
        "--cache-type-k", "--cache-type-v", "-fa", "--flash-attn", "--n-predict", "-n",
        "--slot-save-path", "--grp-attn-n", "--grp-attn-w", "--lora", "--spec-type",
        "--api-key", "--api-key-file", "--spec-draft-n-max", "--spec-draft-n-min",
        "--spec-synth-len", "--spec-synth-rates", "--reasoning-format", "--reasoning",
        "--chat-template", "--chat-template-file", "--mmproj-url", "--media-path",
        "--sleep-idle-seconds", "--cache-ram", "--tools", "--tools-runtime",
        "--mcp-servers-config", "--mcp-servers-json", "--timeout",
    ), 1),
    **dict.fromkeys((
        "--offline", "--cont-batching", "--embedding", "--embeddings", "--reranking",
        "--metrics", "--kv-unified", "--swa-full", "--slots", "--no-slots", "--verbose",
        "--context-shift", "--no-ui", "--no-models-autoload", "--jinja", "--no-jinja",
        "--no-mmproj", "--no-cache-idle-slots", "--ui-mcp-proxy", "--backend_sampling",
    ), 0),
}
# fmt: on

#: ``--model FILE``: ``tensorplug serve`` takes the model file as its argument.
_MODEL_FLAGS = ("-m", "--model")


def serve_argv(argv: Sequence[str], known: Callable[[str], bool] | None = None) -> list[str]:
    """``tensorplug serve``'s arguments for llama-server's ``argv``.

    ``--model FILE`` (``-m``, ``--model=FILE``) becomes the positional ``FILE``; the rest
    is kept in order. With ``known`` (a flag → whether ``tensorplug serve`` accepts it),
    flags it refuses are left out with their values; flags missing from :data:`VALUES`
    are always kept, their arity being unknown."""
    out: list[str] = []
    model: str | None = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        flag, eq, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        n = 0 if eq else VALUES.get(flag, 0)
        values = [inline] if eq else list(argv[i + 1 : i + 1 + n])
        if len(values) < (1 if eq else n):
            raise ValueError(f"llama-server flag {flag} needs a value and the line ends")
        i += 1 + (0 if eq else n)
        if flag in _MODEL_FLAGS:
            model = values[0]
        elif known is not None and flag in VALUES and not known(flag):
            print(f"tensorplug-llama-server: dropped {' '.join([flag, *values])} "
                  "(tensorplug serve does not take it)", file=sys.stderr)  # fmt: skip
        else:
            out.append(arg)
            if not eq:
                out.extend(values)
    return ([model] if model is not None else []) + out


def known_to(parser: argparse.ArgumentParser) -> Callable[[str], bool]:
    """Whether ``parser`` takes a flag: parsed alone, it is not left over as unknown (a
    value it refuses still counts as taken; the server then says what is wrong)."""

    def known(flag: str) -> bool:
        try:
            _, rest = parser.parse_known_args([flag])
        except (SystemExit, argparse.ArgumentError):  # taken, but without its value
            return True
        return flag not in rest

    return known


def _serve_parser() -> argparse.ArgumentParser:
    from tensorplug_llm.serve_cli import add_arguments

    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    parser.error = _raise  # type: ignore[method-assign]  # argparse exits on error otherwise
    add_arguments(parser)
    return parser


def _raise(message: str) -> NoReturn:
    raise SystemExit(message)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``tensorplug serve`` with llama-server's ``argv``; its exit status."""
    from tensorplug.cli import main as tensorplug_main

    args = list(sys.argv[1:] if argv is None else argv)
    mode = os.environ.get("TENSORPLUG_SUITE_UNKNOWN_FLAGS", "pass")
    if mode not in ("pass", "drop"):
        print(f"tensorplug-llama-server: TENSORPLUG_SUITE_UNKNOWN_FLAGS={mode!r}: "
              "use 'pass' (the default) or 'drop'", file=sys.stderr)  # fmt: skip
        return 2
    try:
        mapped = serve_argv(args, known_to(_serve_parser()) if mode == "drop" else None)
    except ValueError as e:
        print(f"tensorplug-llama-server: {e}", file=sys.stderr)
        return 2
    print(f"tensorplug-llama-server: tensorplug serve {' '.join(mapped)}", file=sys.stderr)
    return tensorplug_main(["serve", *mapped])


if __name__ == "__main__":
    sys.exit(main())
