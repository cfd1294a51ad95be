"""llama-server's command-line flags on ``tensorplug serve``: the ones that map onto
what tensorplug has, with the same meaning, and a refusal naming each common one it
does not (a flag silently ignored would leave a user believing it took effect).

Kept apart from :mod:`serve_cli` (which runs the server) so the table of what is and
is not supported reads in one place."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorplug.cli import count_argument
from tensorplug.errors import RunError

from .rope import RopeOverrides

if TYPE_CHECKING:
    from .server_tools import McpServerConfig

__all__ = [
    "add_llama_server_flags",
    "api_keys",
    "chat_template",
    "cors_origins",
    "names",
    "prompt_cache_cells",
    "request_defaults",
    "rope_overrides",
    "slot_context",
    "tools_settings",
]

#: llama-server flags tensorplug does not have, with why (each refused by name)
UNSUPPORTED = {
    ("--mmproj", "-mm", "--mmproj-url"): "multimodal projectors are not supported (text only)",
    ("-mu", "--model-url"): (
        "downloading from a URL is not supported: give -hf USER/MODEL[:QUANT] (the Hugging "
        "Face Hub) or the .gguf's path"
    ),
    ("-md", "--model-draft", "--spec-type", "--draft-max", "--draft-min"): (
        "speculative decoding is not supported"
    ),
    ("--reranking", "--rerank"): "reranking is not supported",
    ("--numa", "--override-tensor", "-ot"): ("this loading option is not supported"),
    ("--grammar", "--grammar-file", "-j", "--json-schema"): (
        "a server-wide grammar is not supported: send grammar or json_schema per request"
    ),
    ("--no-webui", "--path", "--api-prefix", "--ssl-key-file", "--ssl-cert-file"): (
        "this HTTP option is not supported"
    ),
}

POOLINGS = ("none", "mean", "cls", "last")


class _Refuse(argparse.Action):
    """A flag refused as a usage error naming it, its optional value swallowed."""

    def __init__(self, option_strings: Sequence[str], dest: str, reason: str, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS, **kw)
        self.reason = reason

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        parser.error(f"{option_string}: {self.reason}")


def _tokens(text: str) -> int:
    """A number of tokens, 0 included (``--cache-reuse``: 0 is off)."""
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of tokens (an integer >= 0)")
    return n


#: ``--rope-scaling``'s words -> llama.cpp's ``llama_rope_scaling_type``
_SCALINGS = {"none": 0, "linear": 1, "yarn": 2}
#: the RoPE/YaRN flags' destinations -> :class:`RopeOverrides`' fields
_ROPE_FIELDS = {
    "rope_scaling": "scaling_type", "rope_freq_base": "freq_base",
    "rope_freq_scale": "freq_scale", "yarn_orig_ctx": "orig_ctx",
    "yarn_ext_factor": "ext_factor", "yarn_attn_factor": "attn_factor",
    "yarn_beta_fast": "beta_fast", "yarn_beta_slow": "beta_slow",
}  # fmt: skip


def _number(what: str, minimum: float | None = None) -> Any:
    """An argparse ``type`` for a finite number (``>= minimum`` when given)."""

    def number(text: str) -> float:
        try:
            x = float(text)
        except ValueError:
            x = math.nan
        if not math.isfinite(x) or (minimum is not None and x < minimum):
            at_least = f" >= {minimum:g}" if minimum is not None else ""
            raise argparse.ArgumentTypeError(f"{text!r} is not {what} (a finite number{at_least})")
        return x

    return number


def _rope_scale(text: str) -> float:
    """``--rope-scale N``: the context stretched N times, i.e. ``--rope-freq-scale 1/N``
    (in float32, as llama.cpp's ``1.0f / stof(N)``)."""
    n = _number("a context scaling factor", 0)(text)
    if n == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a context scaling factor (> 0)")
    return float(np.float32(1) / np.float32(n))


def _orig_ctx(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if not 0 <= n < 2**32:
        raise argparse.ArgumentTypeError(f"{text!r} is not a context length (an integer >= 0)")
    return n


def _add_rope_flags(p: argparse.ArgumentParser) -> None:
    """llama-server's RoPE/YaRN flags, with its defaults (each: the model file's)."""
    g = p.add_argument_group("RoPE and YaRN (llama-server's; left out: the model file's)")
    g.add_argument(
        "--rope-scaling",
        choices=sorted(_SCALINGS),
        help="RoPE frequency scaling method (a file that names none: linear)",
    )
    g.add_argument(
        "--rope-scale",
        dest="rope_freq_scale",
        type=_rope_scale,
        metavar="N",
        help="expand the context by a factor of N (--rope-freq-scale 1/N)",
    )
    g.add_argument(
        "--rope-freq-base",
        type=_number("a base frequency", 0),
        metavar="N",
        help="RoPE base frequency (0: the file's)",
    )
    g.add_argument(
        "--rope-freq-scale",
        type=_number("a frequency scale", 0),
        metavar="N",
        help="RoPE frequency scale: expands the context by 1/N (0: the file's)",
    )
    g.add_argument(
        "--yarn-orig-ctx",
        type=_orig_ctx,
        metavar="N",
        help="YaRN: the model's original context (0: the file's)",
    )
    for flag, what in (
        ("--yarn-ext-factor", "extrapolation mix (negative: 1 for YaRN)"),
        ("--yarn-attn-factor", "magnitude while the mix is 0 (negative: 1)"),
        ("--yarn-beta-slow", "high correction dim (negative: the file's)"),
        ("--yarn-beta-fast", "low correction dim (negative: the file's)"),
    ):
        g.add_argument(flag, type=_number("a number"), metavar="N", help=f"YaRN: {what}")


def rope_overrides(args: argparse.Namespace) -> RopeOverrides | None:
    """The RoPE/YaRN flags given, as llama.cpp's context takes them; None when none is."""
    given: dict[str, Any] = {}
    for dest, name in _ROPE_FIELDS.items():
        value = getattr(args, dest, None)
        if value is not None:
            given[name] = _SCALINGS[value] if dest == "rope_scaling" else value
    return RopeOverrides(**given) if given else None


def add_llama_server_flags(p: argparse.ArgumentParser) -> None:
    """The flags ``serve`` takes besides ``run``'s model options (which already give
    ``-c``, ``-b``, ``-t``, ``-ngl``, ``-sm``, ``-ts``, ``--device``)."""
    _add_rope_flags(p)
    p.add_argument(
        "-m",
        "--model",
        dest="model_flag",
        metavar="FNAME",
        help="the GGUF model file (as the positional MODEL.gguf)",
    )
    p.add_argument(
        "-ub",
        "--ubatch-size",
        type=count_argument("a batch size"),
        metavar="N",
        help="prompt tokens evaluated in one step (llama-server's physical batch; "
        "overrides -b, which is the same chunk here)",
    )
    p.add_argument(
        "--max-prefill-tokens",
        type=count_argument("a number of prompt tokens"),
        metavar="N",
        help="prompt tokens a step may carry beside the running requests' next tokens "
        "(chunked prefill: a smaller N keeps their token gaps short while a long prompt "
        "is evaluated, and delays its first token); default: all that -b leaves",
    )
    p.add_argument(
        "-fa",
        "--flash-attn",
        nargs="?",
        const="on",
        default="auto",
        choices=["on", "off", "auto"],
        help="on, or auto (the default, as llama-server's, which llama.cpp resolves to on "
        "for a CPU): attention rounds as ggml's flash attention kernel, llama-server's "
        "numbers; off: as llama.cpp's graph without flash attention",
    )
    p.add_argument(
        "--jinja",
        action="store_true",
        default=True,
        help="render the model's chat template with Jinja (the default, as llama-server's)",
    )
    p.add_argument(
        "--no-jinja",
        dest="jinja",
        action="store_false",
        help="as llama-server without Jinja: chats are written by the built-in template "
        "llama.cpp detects in the model's (where tensorplug has it; else the model's is "
        "used, with a warning), and tools are refused",
    )
    p.add_argument(
        "-bs",
        "--backend-sampling",
        "--backend_sampling",
        action="store_true",
        help="accepted for llama-server's command lines: tensorplug samples on the host, "
        "with the same results",
    )
    p.add_argument(
        "--offline",
        action="store_true",
        help="accepted for llama-server's command lines: the server never downloads",
    )
    p.add_argument(
        "--chat-template-file",
        metavar="FILE",
        help="a Jinja chat template file to use instead of the model file's",
    )
    p.add_argument(
        "--pooling",
        choices=POOLINGS,
        help="how embeddings are pooled (default: the file's pooling_type, else "
        "mean); 'none' gives a row per token on /embeddings",
    )
    p.add_argument(
        "--metrics",
        action="store_true",
        help="serve Prometheus metrics at /metrics (llamacpp:* names)",
    )
    p.add_argument(
        "--slots",
        dest="slots",
        action="store_true",
        default=True,
        help="serve the slots' state at /slots (the default)",
    )
    p.add_argument("--no-slots", dest="slots", action="store_false", help="do not serve /slots")
    p.add_argument("--props", action="store_true", help="accept POST /props")
    p.add_argument(
        "-rea",
        "--reasoning",
        choices=["on", "off", "auto"],
        default="auto",
        help="the chat template's enable_thinking: off makes it false (auto, on: true, as "
        "llama-server gives it)",
    )
    p.add_argument(
        "--tags",
        metavar="TAG[,TAG...]",
        help="labels listed with the model by /v1/models (informational, as llama-server's)",
    )
    p.add_argument(
        "--no-ui",
        dest="ui",
        action="store_false",
        help="do not serve the chat page at / (a 404 there)",
    )
    p.add_argument(
        "-kvu",
        "--kv-unified",
        action="store_true",
        default=None,
        help="every slot may use the whole context of -c tokens (the default without -np); "
        "without it, -np N gives each slot -c / N of them, as llama-server's",
    )
    p.add_argument(
        "-no-kvu",
        "--no-kv-unified",
        dest="kv_unified",
        action="store_false",
        help="with -np N: each slot gets -c / N tokens of context (the default); without "
        "-np the 4 slots share the context either way, as llama-server's",
    )
    p.add_argument(
        "--api-key-file",
        metavar="FILE",
        help="a file of API keys, one a line (with or without --api-key)",
    )
    p.add_argument(
        "--cors-origins",
        metavar="ORIGIN[,ORIGIN...]",
        help="origins a browser page may call from: https://app.example or a bare "
        "host, any port (localhost: also 127.0.0.1 and [::1], as llama-server's); "
        "default: every origin, as llama-server's",
    )
    p.add_argument(
        "-n",
        "--n-predict",
        type=int,
        metavar="N",
        help="tokens a request generates at most where it does not say "
        "(default -1: until the end of the reply or the context)",
    )
    p.add_argument(
        "--temp",
        "--temperature",
        dest="temp",
        type=float,
        metavar="T",
        help="temperature where a request does not say (0.8)",
    )
    p.add_argument("--top-k", type=int, metavar="N", help="top-k where a request does not say (40)")
    p.add_argument(
        "--top-p", type=float, metavar="P", help="top-p where a request does not say (0.95)"
    )
    p.add_argument(
        "--min-p", type=float, metavar="P", help="min-p where a request does not say (0.05)"
    )
    p.add_argument(
        "-cram",
        "--cache-ram",
        type=int,
        default=8192,
        metavar="MiB",
        help="the prompt cache: prompts slots let go of stay in the KV cache's spare cells, "
        "found again by later requests; at most this many MiB of cells beyond the slots' "
        "(8192, as llama-server's; -1: no bound but the cache's size; 0: off)",
    )
    p.add_argument(
        "--context-shift",
        action="store_true",
        help="a request whose slot's context is full drops half of its tokens after its "
        "n_keep first (/completion's n_keep; -1: its prompt) and goes on generating (off: "
        "it ends with finish_reason length, as llama-server's default)",
    )
    p.add_argument(
        "--cache-reuse",
        type=_tokens,
        default=0,
        metavar="N",
        help="past the prefix a prompt shares with its slot, move runs of at least N cached "
        "tokens the prompt has next to their new positions, their K rows re-roped, rather "
        "than evaluate them again (llama-server's KV shifting; /completion's "
        "n_cache_reuse overrides it; default 0: off)",
    )
    p.add_argument(
        "--slot-save-path",
        metavar="FOLDER",
        help="the folder of POST /slots/ID?action=save|restore's files (made if missing; "
        "without it, slot actions are 501, as llama-server's)",
    )
    p.add_argument(
        "-hf",
        "-hfr",
        "--hf-repo",
        metavar="USER/MODEL[:QUANT]",
        help="serve a GGUF file of this Hugging Face repository, downloaded into the Hub's "
        "cache (HF_HUB_OFFLINE=1: from the cache alone): the file of QUANT (any case; "
        "default Q4_K_M, else the repository's first GGUF file), every shard of a split one",
    )
    p.add_argument(
        "-hff",
        "--hf-file",
        metavar="FILE",
        help="with -hf: this file of the repository instead of a quantization's",
    )
    p.add_argument(
        "-hft",
        "--hf-token",
        metavar="TOKEN",
        help="with -hf: the Hub token (default: HF_TOKEN, or huggingface-cli login's)",
    )
    p.add_argument(
        "--sleep-idle-seconds",
        type=_number("a number of seconds", -1),
        default=-1,
        metavar="N",
        help="after N seconds with no request for the model, give its memory back (weights, "
        "KV cache); the next request loads it again (-1, the default: never, as "
        "llama-server's)",
    )
    p.add_argument(
        "--cache-idle-slots",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with the prompt cache: a request that starts moves every other idle slot's "
        "tokens into it and clears the slot (on, as llama-server's)",
    )
    _add_tools_flags(p)
    for flags, reason in UNSUPPORTED.items():
        p.add_argument(*flags, action=_Refuse, reason=reason, dest="unsupported")


def _add_tools_flags(p: argparse.ArgumentParser) -> None:
    """llama-server's server tools and MCP servers: /tools, off by default."""
    g = p.add_argument_group(
        "server tools (llama-server's /tools): they run commands and write files with the "
        "server's rights for any client that can reach it; do not enable on an untrusted "
        "network, and give --api-key"
    )
    g.add_argument(
        "--tools",
        metavar="TOOL1,TOOL2,...",
        help="serve these built-in tools at /tools ('all': every one; read_file, "
        "file_glob_search, grep_search, exec_shell_command, write_file, edit_file, "
        "get_info); --cors-origins then defaults to localhost",
    )
    g.add_argument(
        "--tools-runtime",
        metavar="OPTION",
        help="where the tools run (default: this machine): docker:IMAGE or podman:IMAGE (a "
        "container started for them, removed when the server stops), docker-container:ID "
        "or podman-container:ID (a running container), ssh:TARGET (a host over ssh, "
        "key-based, its host key already trusted)",
    )
    g.add_argument(
        "--mcp-servers-config",
        metavar="PATH",
        help='a JSON file of MCP servers ({"mcpServers": {NAME: {"command", "args", "env", '
        '"cwd", "timeout_ms"}}}, as Cursor\'s): their tools are served at /tools as '
        "NAME_TOOL; --cors-origins then defaults to localhost",
    )
    g.add_argument(
        "--mcp-servers-json",
        metavar="JSON",
        help="the same MCP servers' JSON, given inline",
    )
    g.add_argument(
        "--ui-mcp-proxy",
        "--webui-mcp-proxy",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="serve /cors-proxy?url=..., through which a page reaches HTTP services (MCP "
        "servers) its origin may not call: its callers make requests from this server's "
        "network; --cors-origins then defaults to localhost (off)",
    )
    g.add_argument(
        "-ag",
        "--agent",
        action="store_true",
        help="every built-in tool (--tools all) and --ui-mcp-proxy",
    )


def cors_origins(text: str | None, tools_on: bool) -> list[str] | None:
    """``--cors-origins``' origins (None: every one). Where the server runs tools
    (``--tools``, MCP servers) and none are given, only ``localhost``, as llama-server's:
    a page anywhere could otherwise have a browser run commands on this machine."""
    if text is not None:
        return [o.strip() for o in text.split(",") if o.strip()]
    if tools_on:
        print("warning: server tools, MCP servers or the CORS proxy are enabled: "
              "--cors-origins defaults to localhost (give --cors-origins to change it)",
              file=sys.stderr)  # fmt: skip
        return ["localhost"]
    return None


def tools_settings(args: argparse.Namespace) -> tuple[list[str], list[McpServerConfig]]:
    """``--tools``' names and the MCP servers of ``--mcp-servers-config`` and
    ``--mcp-servers-json``, checked before anything loads (a RunError naming what is
    wrong: the server does not start on half its configuration)."""
    from .server_tools import BUILTIN_TOOLS, McpConfigError, load_configs

    names = [n.strip() for n in (args.tools or "").split(",") if n.strip()]
    if getattr(args, "agent", False) and not names:
        names = ["all"]
    known = [t.name for t in BUILTIN_TOOLS]
    for name in names:
        if name != "all" and name not in known:
            raise RunError(f'--tools: unknown tool "{name}". available tools: {", ".join(known)}')
    try:
        configs = load_configs(args.mcp_servers_config, args.mcp_servers_json)
    except McpConfigError as e:
        raise RunError(str(e)) from None
    return names, configs


def slot_context(n_ctx: int, n_parallel: int, unified: bool, n_ctx_train: int) -> int:
    """The tokens one slot's request may hold, as llama-server computes it: the whole
    context when the cache is unified, else its share ``n_ctx / n_parallel``; at most the
    model's training context (``n_ctx_train``, where the file gives one). llama.cpp also
    rounds the share up to a multiple of 256 and grows the cache to match; tensorplug's
    cache keeps the size asked for, so the share is ``n_ctx // n_parallel``."""
    n = n_ctx if unified else n_ctx // n_parallel
    if n < 1:
        raise RunError(
            f"a context of {n_ctx} tokens split over {n_parallel} slots leaves none per slot: "
            "give a larger -c, fewer slots (-np) or --kv-unified"
        )
    return min(n, n_ctx_train) if n_ctx_train > 0 else n


def prompt_cache_cells(mib: int, bytes_per_cell: int) -> int | None:
    """``--cache-ram``'s MiB as KV cells (None: no bound; 0: no prompt cache)."""
    if mib < -1:
        raise RunError(f"--cache-ram {mib}: give MiB, -1 (no bound) or 0 (off)")
    if mib == -1:
        return None
    return mib * 2**20 // max(bytes_per_cell, 1)


def request_defaults(args: argparse.Namespace) -> dict[str, Any]:
    """What a request gets for a field it leaves out, from ``-n``, ``--temp``... and
    ``--seed`` when it was given (llama-server's ``--seed``: sampling's)."""
    given = {
        "n_predict": args.n_predict,
        "temperature": args.temp,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "min_p": args.min_p,
        "seed": args.request_seed,
    }
    return {k: v for k, v in given.items() if v is not None}


def names(text: str | None) -> list[str]:
    """``--alias a,b`` and ``--tags x,y``: the names given, sorted and each once (the
    order llama-server keeps them in, whose first alias is the model's id)."""
    return sorted({n.strip() for n in (text or "").split(",") if n.strip()})


def api_keys(args: argparse.Namespace) -> list[str]:
    """``--api-key`` (several with commas, as llama-server's) and ``--api-key-file``'s
    lines."""
    keys = [k.strip() for k in (args.api_key or "").split(",") if k.strip()]
    if args.api_key_file:
        try:
            text = Path(args.api_key_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise RunError(f"cannot read --api-key-file {args.api_key_file}: {e}") from None
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if not lines:
            raise RunError(f"--api-key-file {args.api_key_file} holds no key (one a line)")
        keys += lines
    return keys


def chat_template(args: argparse.Namespace) -> str | None:
    """The template ``--chat-template`` (one of llama.cpp's built-in names, Jinja text,
    or a file, as tensorplug's earlier option) or ``--chat-template-file`` gives, None for
    the file's."""
    from .builtin_templates import BUILTIN_TEMPLATES, UnsupportedTemplateName, builtin_template

    value, file = args.chat_template, args.chat_template_file
    if value is not None and file is not None:
        raise RunError("give --chat-template or --chat-template-file, not both")
    if value is not None:
        try:
            named = builtin_template(value)
        except UnsupportedTemplateName as e:
            raise RunError(f"--chat-template {value}: {e}") from None
        if named is not None:
            return named
    if value is not None and ("{%" in value or "{{" in value):
        return str(value)
    path = file or value
    if path is None:
        return None
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        if file is None:
            raise RunError(
                f"--chat-template {value}: neither a built-in template's name "
                f"({', '.join(BUILTIN_TEMPLATES)}), Jinja text nor a readable file ({e}); "
                "or give --chat-template-file FILE"
            ) from None
        raise RunError(f"cannot read the chat template {path}: {e}") from None
