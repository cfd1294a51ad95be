"""The subcommands this application adds to ``tensorplug`` (entry-point group
``tensorplug.commands``, declared in ``apps/llm/pyproject.toml``).

The ``tensorplug`` command reads these every time it starts, whatever subcommand runs,
so this module imports nothing but :class:`~tensorplug.commands.CommandSpec`; each
command's module (the runner, the tokenizers, Jinja) is imported only when it runs.
"""

from __future__ import annotations

from tensorplug.commands import CommandSpec

__all__ = ["chat", "demo", "embed", "run", "serve", "tokenize"]

run = CommandSpec(
    "run",
    "run a GGUF model: prompt in, text out (--help lists the architectures)",
    "tensorplug_llm.run_cli",
)
chat = CommandSpec(
    "chat", "chat with a GGUF model through its chat template", "tensorplug_llm.chat"
)
serve = CommandSpec(
    "serve",
    "serve a GGUF model over an OpenAI-compatible HTTP API (llama-server)",
    "tensorplug_llm.serve_cli",
)
tokenize = CommandSpec(
    "tokenize", "show the tokens of a text (llama-tokenize)", "tensorplug_llm.tokenizer.cli"
)
demo = CommandSpec(
    "demo",
    "a llama-style block against numpy, then a tiny model over every device",
    "tensorplug_llm.demo",
)
embed = CommandSpec(
    "embed",
    "the embeddings of texts from a GGUF model (llama-embedding)",
    "tensorplug_llm.embed_cli",
)
