"""``tensorplug serve MODEL.gguf``: an OpenAI-compatible HTTP server (llama-server's job).

The model options are ``run``'s (``--device``, ``-ngl``, ``-sm``, ``-ts``, ``-c``, ``-b``,
``-t``, ``--cache-type``...: :func:`run_cli.add_arguments`), so a model placed for
``run`` is placed the same way here; ``run``'s prompt and sampling options are not
offered (each request brings its own). It binds 127.0.0.1 unless told otherwise: a model server
on every interface without ``--api-key`` is a machine anyone nearby can use.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys
import tempfile
from pathlib import Path

from tensorplug.cli import count_argument
from tensorplug.errors import RunError, TensorplugError

from .terminal import printable

__all__ = ["TINY_CHAT_TEMPLATE", "add_arguments", "main"]

#: The chat template given to ``--tiny``'s random model (ChatML, as SmolLM2's).
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


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
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    p.add_argument("--port", type=_port, default=8080, help="port to listen on (8080)")
    p.add_argument(
        "-np",
        "--parallel",
        type=count_argument("a number of slots"),
        default=4,
        help="requests decoded together (slots, as llama-server's -np; 4); each slot keeps "
        "its last prompt's cells for prefix reuse",
    )
    p.add_argument(
        "--api-key",
        help="require 'Authorization: Bearer KEY' on every route but /health",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=64,
        help="requests that may wait for a slot; past that: 503 with Retry-After (64)",
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
        "--alias",
        help="the model's name in the API (default: the GGUF file's name)",
    )
    p.add_argument(
        "--chat-template",
        metavar="FILE",
        help="a Jinja chat template to use instead of the model file's",
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


def main(args: argparse.Namespace) -> int:
    try:
        return _serve(args)
    except TensorplugError as e:
        print(f"tensorplug serve: error: {printable(str(e))}", file=sys.stderr)
        return 1


def _serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from .server import ServerConfig, create_app
    except ImportError as e:
        raise RunError(
            f"serving needs FastAPI and uvicorn ({e.name} is missing): "
            "pip install 'tensorplug-llm[serve]'"
        ) from None
    from .api import LLM
    from .engine import Engine
    from .generation import EngineGenerator
    from .run_cli import installed_model, load_model

    if args.max_queue < 0 or args.timeout <= 0:
        raise RunError("--max-queue must be >= 0 and --timeout > 0")
    if args.ray:
        from .ray_serve import serve_with_ray

        return serve_with_ray(args)
    template = _read(args.chat_template) if args.chat_template else None
    with tempfile.TemporaryDirectory(prefix="tensorplug-serve-") as tmp:
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
        engine = Engine(llama, args.parallel)
        engine.warm_up()  # the first requests' step shapes, built before serving
        llm = LLM(
            llama,
            EngineGenerator(engine),
            model_name=args.alias or Path(args.model).name,
            chat_template=template,
        )
        try:
            config = ServerConfig(
                args.api_key, args.max_queue, args.timeout,
                max_body_bytes=args.max_request_size * 2**20,
            )  # fmt: skip
            app = create_app(llm, config)
            if not _loopback(args.host) and args.api_key is None:
                print(f"warning: listening on {args.host} without --api-key: anyone who can "
                      "reach it can use the model", file=sys.stderr)  # fmt: skip
            print(f"serving {llm.model_name} on http://{args.host}:{args.port}/v1 "
                  f"(-np {args.parallel}, context {llama.n_ctx})", file=sys.stderr)  # fmt: skip
            uvicorn.run(app, host=args.host, port=args.port, log_level="warning", lifespan="off")
        finally:
            llm.close()
            llama.close()
    return 0


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise RunError(f"cannot read the chat template {path}: {e}") from None


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
