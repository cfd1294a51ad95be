"""``tensorplug serve MODEL.gguf``: llama-server's HTTP API (OpenAI's and its own routes).

The model options are ``run``'s (``--device``, ``-ngl``, ``-sm``, ``-ts``, ``-c``, ``-b``,
``-t``, ``--cache-type``...: :func:`run_cli.add_arguments`), so a model placed for
``run`` is placed the same way here; llama-server's own flags (``-m``, ``-np``, ``-a``,
``--api-key-file``, ``--metrics``, ``-n``, ``--temp``...) are :mod:`serve_flags`'. It
binds 127.0.0.1 unless told otherwise: a model server on every interface without
``--api-key`` is a machine anyone nearby can use.

The addresses are bound before the model loads (and held until the server takes them),
so a port in use fails at once, not after a minute of loading.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import ipaddress
import os
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensorplug.cli import count_argument
from tensorplug.errors import RunError, TensorplugError

from .chat import CHATML_TEMPLATE
from .serve_flags import (
    add_llama_server_flags,
    api_keys,
    chat_template,
    cors_origins,
    names,
    prompt_cache_cells,
    request_defaults,
    rope_overrides,
    slot_context,
    tools_settings,
)
from .terminal import printable

if TYPE_CHECKING:
    from .server_tools import McpServerConfig, ToolBox

__all__ = ["TINY_CHAT_TEMPLATE", "add_arguments", "main"]

#: The chat template given to ``--tiny``'s random model (ChatML, as SmolLM2's).
TINY_CHAT_TEMPLATE = CHATML_TEMPLATE


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0..65535; 0 picks a free one)")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .run_cli import add_arguments as run_arguments

    run_arguments(p, "serve")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on, several with commas (127.0.0.1,::1) (127.0.0.1)",
    )
    p.add_argument("--port", type=_port, default=8080, help="port to listen on (8080)")
    p.add_argument(
        "-np",
        "--parallel",
        type=count_argument("a number of slots"),
        help="requests decoded together (slots, as llama-server's -np; default 4, which "
        "share the whole context); given, each slot has -c / N tokens of context unless "
        "--kv-unified; each slot keeps its last prompt's cells for prefix reuse",
    )
    p.add_argument(
        "--api-key",
        help="require this key ('Authorization: Bearer KEY' or 'x-api-key: KEY'), several "
        "with commas, on every route but /health, /models and the page at /",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=64,
        help="requests that may wait for a slot; past that: 503 with Retry-After (64)",
    )
    p.add_argument(
        "--max-connections",
        type=count_argument("a number of connections"),
        metavar="N",
        help="connections served at once; a request on one past it: 503 with Retry-After (256)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="seconds a request may run before it is cancelled (600)",
    )
    p.add_argument(
        "--max-request-size",
        type=count_argument("a size in MiB"),
        default=16,
        metavar="MB",
        help="largest request body read, in MiB; past it: 413 (16)",
    )
    p.add_argument(
        "-a",
        "--alias",
        metavar="NAME[,NAME...]",
        help="the model's names in the API, several with commas (as llama-server's: "
        "listed as aliases, the first in sorted order is its id; default: the GGUF "
        "file's name)",
    )
    p.add_argument(
        "--chat-template",
        metavar="JINJA",
        help="the chat template instead of the model file's: one of llama.cpp's built-in "
        "names (chatml, llama3, gemma, command-r, phi3, zephyr, mistral-v7), Jinja text, "
        "or a file",
    )
    p.add_argument(
        "--embeddings",
        action="store_true",
        help="accepted for llama-server's command lines: /v1/embeddings is always served, "
        "by the same loaded model (an embedding request is a sequence of the engine beside "
        "the generations); an encoder (BERT) file serves embeddings only",
    )
    p.add_argument(
        "--ray",
        action="store_true",
        help="run --replicas servers as a Ray Serve deployment behind one route, each "
        "an engine on its node's devices (pip install 'ray[serve]')",
    )
    p.add_argument(
        "--replicas",
        type=count_argument("a number of replicas"),
        default=2,
        help="with --ray: replicas (2)",
    )
    p.add_argument(
        "--ray-address",
        help="with --ray: the cluster to join (default: start a local one)",
    )
    add_llama_server_flags(p)
    # run's --seed seeds the tiny model's weights; given here, it seeds requests too
    p.set_defaults(seed=None)


def main(args: argparse.Namespace) -> int:
    from tensorplug.gguf import GGUFError

    try:
        return _serve(args)
    except (TensorplugError, GGUFError, OSError) as e:
        print(f"tensorplug serve: error: {printable(str(e))}", file=sys.stderr)
        return 1


def _resolve(args: argparse.Namespace) -> None:
    """llama-server's spellings onto run's options, checked before anything loads."""
    if args.model_flag is not None:
        if args.model is not None and args.model != args.model_flag:
            raise RunError(f"two models given ({args.model} and -m {args.model_flag}): give one")
        args.model = args.model_flag
    if args.hf_repo is not None and args.model is not None:
        raise RunError(f"two models given ({args.model} and -hf {args.hf_repo}): give one")
    if args.hf_file is not None and args.hf_repo is None:
        raise RunError("--hf-file names a file of the repository -hf USER/MODEL gives: add -hf")
    if args.model is not None and not Path(args.model).is_file():
        raise RunError(f"{args.model}: no such model file (a .gguf path)")
    args.request_seed = args.seed if args.seed is not None and args.seed >= 0 else None
    if args.seed is None:
        args.seed = 0  # the tiny model's weights
    if args.ubatch_size is not None:
        args.batch_size = args.ubatch_size
    args.rope = rope_overrides(args)
    if os.environ.get("AIP_MODE") == "PREDICTION" and os.environ.get("AIP_HTTP_PORT"):
        try:  # Vertex AI's port wins over --port, as llama-server's does
            args.port = _port(os.environ["AIP_HTTP_PORT"])
        except argparse.ArgumentTypeError as e:
            raise RunError(f"AIP_HTTP_PORT: {e}") from None
    if args.parallel is None:  # llama-server's "auto": 4 slots sharing one context
        args.parallel, args.kv_unified = 4, True
    args.kv_unified = bool(args.kv_unified)
    args.aliases, args.tags = names(args.alias), names(args.tags)
    args.alias = args.aliases[0] if args.aliases else None


def _serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn  # noqa: F401  (checked here, used by _Listening)

        from .http.sleep import IdleSleep
        from .http.vertex import VertexRoutes
        from .http.warm import warm_up_app
        from .server import ServerConfig, create_app
    except ImportError as e:
        raise RunError(
            f"serving needs FastAPI and uvicorn ({e.name} is missing): "
            "pip install 'tensorplug-llm[serve]'"
        ) from None
    from .api import LLM
    from .builtin_templates import legacy_template
    from .engine import Engine
    from .generation import EngineGenerator
    from .run_cli import freeze_long_lived, installed_model, load_model

    if args.max_queue < 0 or args.timeout <= 0:
        raise RunError("--max-queue must be >= 0 and --timeout > 0")
    _resolve(args)
    keys = api_keys(args)
    template = chat_template(args)
    tool_names, mcp_configs = tools_settings(args)
    if args.ray:
        from .ray_serve import serve_with_ray

        if tool_names or mcp_configs or args.ui_mcp_proxy:
            raise RunError(
                "--tools, MCP servers and --ui-mcp-proxy are not supported with --ray (the "
                "Ray Serve replicas serve no /tools, no /cors-proxy)"
            )
        if template is not None and not (args.chat_template and Path(args.chat_template).is_file()):
            raise RunError("with --ray, give the chat template as a file every node can read")
        return serve_with_ray(args)
    cors_proxy = bool(args.ui_mcp_proxy or args.agent)
    cors = cors_origins(args.cors_origins, bool(tool_names or mcp_configs or cors_proxy))
    prompt_cache_cells(args.cache_ram, 1)  # a bad --cache-ram fails before the model loads
    save_folder = _save_folder(args.slot_save_path)
    sockets = bind(args.host, args.port)  # before the model loads: a busy port fails now
    try:
        with (
            tempfile.TemporaryDirectory(prefix="tensorplug-serve-") as tmp,
            _Listening(sockets, max_connections=args.max_connections) as listening,
            _tools(tool_names, mcp_configs, args.tools_runtime or "", listening) as tools,
        ):
            if args.hf_repo is not None:
                args.model = _from_hub(args)
            if args.model is None and not args.tiny:
                installed = installed_model()
                args.model = str(installed) if installed is not None else None
            if args.model is None:
                from .tiny import write_tiny_llama

                args.model = str(
                    write_tiny_llama(
                        Path(tmp) / "tiny-llama.gguf", args.weights, args.seed,
                        metadata={"tokenizer.chat_template": TINY_CHAT_TEMPLATE},
                    )
                )  # fmt: skip
                print("no MODEL: serving a tiny random-weight model (its text is gibberish)",
                      file=sys.stderr)  # fmt: skip
            llama = load_model(args, encoder_ok=True, batch_invariant=True)
            if template is None and not args.jinja:
                template, said = legacy_template(llama.file.get("tokenizer.chat_template"))
                print(said if template is not None else f"warning: {said}", file=sys.stderr)
            cache_cells = prompt_cache_cells(args.cache_ram, llama.cache.bytes_per_cell)
            n_ctx_seq = slot_context(
                llama.n_ctx, args.parallel, args.kv_unified, llama.config.n_ctx_train
            )
            config = ServerConfig(
                keys, args.max_queue, args.timeout,
                max_body_bytes=args.max_request_size * 2**20,
                cors_origins=cors, metrics=args.metrics, tools=tools, cors_proxy=cors_proxy,
                slots=args.slots, props_writable=args.props, defaults=request_defaults(args),
                slot_save_path=save_folder,
                aliases=args.aliases, tags=args.tags, web_page=args.ui,
                vertex=VertexRoutes.from_environment(),
                verbose=bool(getattr(args, "verbose", False)),  # -v: as llama-server's
                enable_thinking=args.reasoning != "off", jinja=args.jinja,
            )  # fmt: skip

            def serving(sleeps: bool) -> tuple[Engine, LLM, Any, IdleSleep | None]:
                """A fresh engine on the model, its API and their app (``sleeps``: its
                model sleeps after ``--sleep-idle-seconds``, and the sleep comes back)."""
                engine = Engine(
                    llama, args.parallel, max_prefill_tokens=args.max_prefill_tokens,
                    n_ctx_seq=n_ctx_seq, prompt_cache=cache_cells,
                    cache_idle_slots=args.cache_idle_slots, context_shift=args.context_shift,
                    cache_reuse=args.cache_reuse,
                )  # fmt: skip
                llm = LLM(
                    llama,
                    EngineGenerator(engine),
                    model_name=args.alias or Path(args.model).name,
                    chat_template=template,
                    pooling=args.pooling,
                )
                sleep = (
                    IdleSleep(args.sleep_idle_seconds, engine.unload, engine.reload, llm.stats)
                    if sleeps and args.sleep_idle_seconds > 0
                    else None
                )
                return engine, llm, create_app(llm, config, sleep), sleep

            engine, llm, app, _ = serving(False)
            engine.warm_up()  # the step shapes, built before serving
            refused: list[str] = []
            try:
                if not llama.config.arch.encoder:  # the first requests' one-time work, done
                    refused = warm_up_app(app, keys[0] if keys else None)
            finally:
                llm.close()
            if getattr(args, "verbose", False):
                for line in refused:  # served all the same: a client's would be too
                    print(f"warm-up: {line}", file=sys.stderr)
            engine, llm, app, sleep = serving(True)  # afresh: no count or cache of the warm-up
            if getattr(args, "own_process", False):
                freeze_long_lived()  # the warm-up's graphs and plans, never walked again
            try:
                listening.ready(app)
                if sleep is not None:
                    sleep.start()
                    listening.on_stop.append(sleep.stop)
                if tools is not None:
                    print("warning: /tools is on (server tools, MCP servers): any client "
                          "that can reach the server can run commands and write files with "
                          "its rights; do not expose it to untrusted networks",
                          file=sys.stderr)  # fmt: skip
                if cors_proxy:
                    print("warning: /cors-proxy is on: any client that can reach the server "
                          "can make HTTP requests from its network; do not expose it to "
                          "untrusted networks", file=sys.stderr)  # fmt: skip
                hosts = [h for h in args.host.split(",") if not _loopback(h)]
                if hosts and not keys:
                    print(f"warning: listening on {','.join(hosts)} without --api-key: anyone who "
                          "can reach it can use the model", file=sys.stderr)  # fmt: skip
                where = ", ".join(_url(s) for s in sockets)
                share = "shared" if args.kv_unified else "per slot"
                print(f"serving {llm.model_name} on {where} (-np {args.parallel}, context "
                      f"{n_ctx_seq} {share})", file=sys.stderr)  # fmt: skip
                listening.wait()
            finally:
                listening.stop()  # no request left on the model before it goes
                llm.close()
                llama.close()
    finally:
        for sock in sockets:
            sock.close()
    return 0


def _save_folder(text: str | None) -> Path | None:
    """``--slot-save-path``'s folder, made if missing (None without the flag)."""
    if text is None:
        return None
    folder = Path(text).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunError(f"--slot-save-path {text}: cannot make the folder: {e.strerror}") from None
    if not folder.is_dir():
        raise RunError(f"--slot-save-path {text}: not a folder")
    return folder


def _from_hub(args: argparse.Namespace) -> str:
    """``-hf``'s file, downloaded (or found in the Hub's cache), its name printed."""
    from .hub import HubError, download_quant

    print(f"fetching {args.hf_repo}{' ' + args.hf_file if args.hf_file else ''} from the "
          "Hugging Face Hub", file=sys.stderr)  # fmt: skip
    try:
        path = download_quant(args.hf_repo, args.hf_file, args.hf_token)
    except HubError as e:
        raise RunError(f"-hf {args.hf_repo}: {e}") from None
    print(f"model: {path}", file=sys.stderr)
    return path


@contextlib.contextmanager
def _tools(
    names: list[str], mcp_configs: list[McpServerConfig], runtime: str, listening: _Listening
) -> Iterator[ToolBox | None]:
    """The ToolBox of ``--tools``, ``--tools-runtime`` and the MCP servers (None without
    any), started before the model loads (as llama-server's: a bad runtime or
    configuration stops the server now) and closed after the HTTP server stopped: its
    container removed, its MCP servers ended. A stop signal makes every tool call in
    flight return at once, so the HTTP server does not wait for a slow one."""
    if not names and not mcp_configs:
        if runtime:
            print("warning: --tools-runtime without --tools or MCP servers: no tool to run",
                  file=sys.stderr)  # fmt: skip
        yield None
        return
    from .server_tools import ToolBox, ToolRuntimeError

    try:
        box = ToolBox.start(names, mcp_configs, runtime)
    except (ValueError, ToolRuntimeError) as e:
        raise RunError(f"tools setup failed: {e}") from None
    listening.on_stop.append(box.shutdown)
    try:
        yield box
    finally:
        box.close()


class _Listening:
    """uvicorn on the bound sockets from the start, with :mod:`.http.transport`'s limits
    (``max_connections``, None for its default, and ``transport``: the timeouts of
    :func:`~.http.transport.uvicorn_settings`), on a thread of its own, answering
    every request 503 "Loading model" until :meth:`ready` (llama-server's loading
    state); the main thread keeps the signals: Ctrl-C or SIGTERM stops the server as
    uvicorn's own handlers do, a second Ctrl-C forces the stop (open connections are
    not waited for)."""

    def __init__(
        self, sockets: list[socket.socket], max_connections: int | None = None, **transport: Any
    ) -> None:
        import uvicorn

        from .http.loading import Switch
        from .http.transport import MAX_CONNECTIONS, ConnectionCap, Connections, uvicorn_settings

        self.switch = Switch()
        #: called when the server is told to stop (a signal, Ctrl-C), before it waits for
        #: the requests in flight
        self.on_stop: list[Callable[[], None]] = []
        connections = Connections(max_connections or MAX_CONNECTIONS)
        config = uvicorn.Config(
            ConnectionCap(self.switch, connections),
            log_level="warning",
            lifespan="off",
            **uvicorn_settings(connections, **transport),
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": sockets}, name="uvicorn", daemon=True
        )

    def __enter__(self) -> _Listening:
        self.thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self.stop(force=kind is KeyboardInterrupt)

    def ready(self, app: Any) -> None:
        self.switch.app = app

    def wait(self) -> None:
        """Until the server stops (Ctrl-C, SIGTERM)."""
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, self._exit) if main else None
        try:
            while self.thread.is_alive():
                if main:
                    # Python's Ctrl-C handler again, every tenth of a second: a driver that
                    # makes a context (PoCL, when a device is first used) puts its own in
                    # place, one that resets itself to the default at a first Ctrl-C, so
                    # that a second one killed the process
                    signal.signal(
                        signal.SIGINT,
                        signal.getsignal(signal.SIGINT) or signal.default_int_handler,
                    )
                self.thread.join(0.1)
        except KeyboardInterrupt:
            self._stopping()
            if main:  # a second Ctrl-C during the shutdown forces it rather than cutting it
                signal.signal(signal.SIGINT, self._force)
            self.thread.join()
            # then the command ends as every interrupted one does (tensorplug.cli: one
            # line, status 130, and no Python left to run a handler for a third press)
            raise
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)

    def stop(self, force: bool = False) -> None:
        self._stopping()
        self.server.force_exit = self.server.force_exit or force
        self.thread.join(5 if force else 30)

    def _stopping(self) -> None:
        self.server.should_exit = True
        for hook in self.on_stop:
            hook()

    def _exit(self, signum: int, frame: Any) -> None:
        self._stopping()

    def _force(self, signum: int, frame: Any) -> None:
        self._stopping()
        self.server.force_exit = True


def bind(hosts: str, port: int) -> list[socket.socket]:
    """Listening sockets on each of ``hosts`` (commas between them) at ``port``, or a
    RunError naming the address that cannot be had."""
    sockets: list[socket.socket] = []
    try:
        for host in [h.strip() for h in hosts.split(",") if h.strip()]:
            sockets.append(_bind_one(host, port))
    except BaseException:
        for s in sockets:
            s.close()
        raise
    if not sockets:
        raise RunError("--host names no address")
    return sockets


def _bind_one(host: str, port: int) -> socket.socket:
    name = host.strip("[]")
    try:
        infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise RunError(f"--host {host}: not an address this machine knows ({e.strerror})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        hint = " (another server holds it: stop it, or pick another --port)"
        raise RunError(
            f"cannot listen on {host}:{port}: {e.strerror}"
            + (hint if e.errno == errno.EADDRINUSE else "")
        ) from None
    return sock


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
