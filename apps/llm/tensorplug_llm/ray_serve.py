"""``tensorplug serve --ray``: replicas of the server as a Ray Serve deployment.

Beyond one machine, the unit that scales is a whole server: one model, one engine, one
KV cache, on one node's devices. Ray Serve runs ``--replicas`` of them (each a Ray actor,
placed by Ray wherever the cluster has room) behind one HTTP route, and balances
requests over them; each replica is exactly the app :func:`server.create_app` builds, so
the API, errors, limits and metrics are the same as a single server's (``/metrics`` is a
replica's own, as each engine's counters are).

A replica is given the command's options (plain values: cheap to ship to another node)
and loads the model there, with that node's devices, as ``tensorplug serve`` would. The
model path must therefore exist on every node that runs a replica. Ray Serve is an extra
of Ray (``pip install "ray[serve]"``); only this module needs it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tensorplug.errors import RunError

__all__ = ["ServeReplica", "deployment", "replica_options", "serve_with_ray"]


class ServeReplica:
    """One replica: the model loaded as ``options`` (``tensorplug serve``'s, by their
    argparse names) say, on this node, behind the app the single server uses."""

    def __init__(self, options: dict[str, Any]) -> None:
        from .api import LLM
        from .builtin_templates import legacy_template
        from .engine import Engine
        from .generation import EngineGenerator
        from .run_cli import load_model
        from .serve_flags import slot_context

        self.args = args = argparse.Namespace(**options)
        self.llama = load_model(args, encoder_ok=True, batch_invariant=True)
        prefill = getattr(args, "max_prefill_tokens", None)
        unified = getattr(args, "kv_unified", True)
        n_ctx_seq = slot_context(
            self.llama.n_ctx, args.parallel, unified, self.llama.config.n_ctx_train
        )
        engine = Engine(self.llama, args.parallel, max_prefill_tokens=prefill, n_ctx_seq=n_ctx_seq)
        template = Path(args.chat_template).read_text() if args.chat_template else None
        if template is None and not getattr(args, "jinja", True):  # as serve's --no-jinja
            template, _ = legacy_template(self.llama.file.get("tokenizer.chat_template"))
        self.llm = LLM(
            self.llama,
            EngineGenerator(engine),
            model_name=args.alias or Path(args.model).name,
            chat_template=template,
        )

    def __serve_build_asgi_app__(self) -> Any:
        from .server import ServerConfig, create_app

        a = self.args
        config = ServerConfig(
            a.api_key, a.max_queue, a.timeout, max_body_bytes=a.max_request_size * 2**20,
            jinja=getattr(a, "jinja", True),
        )  # fmt: skip
        return create_app(self.llm, config)


def deployment(options: dict[str, Any], replicas: int) -> Any:
    """The Ray Serve application: ``replicas`` of :class:`ServeReplica` behind one
    route. A replica takes at most ``-np + --max-queue`` requests at once, the server's
    own admission limit, so Ray's router sends the rest to another replica."""
    try:
        from ray import serve
    except ImportError:
        raise RunError('--ray needs Ray Serve: pip install "ray[serve]"') from None
    ingress = serve.ingress()(ServeReplica)
    app = serve.deployment(
        name="tensorplug",
        num_replicas=replicas,
        max_ongoing_requests=options["parallel"] + options["max_queue"],
        ray_actor_options={"num_cpus": 0},
    )(ingress)
    return app.bind(options)


def replica_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options a replica needs: the plain values of ``args``, with the model's path
    made absolute (a Ray worker runs in a folder of its own)."""
    plain = (str, int, float, bool, type(None), list)
    options = {k: v for k, v in vars(args).items() if isinstance(v, plain)}
    options["model"] = str(Path(args.model).resolve())
    return options


def serve_with_ray(args: argparse.Namespace) -> int:
    """Run the deployment on the Ray cluster ``--ray-address`` names (default: a local
    one), HTTP on ``--host``/``--port``, until interrupted."""
    try:
        import ray
        from ray import serve
    except ImportError:
        raise RunError('--ray needs Ray Serve: pip install "ray[serve]"') from None
    if args.model is None:
        raise RunError("--ray needs MODEL.gguf: a path every node of the cluster can read")
    ray.init(address=args.ray_address, include_dashboard=False)
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        app = deployment(replica_options(args), args.replicas)
        serve.run(app, name="tensorplug", route_prefix="/", blocking=True)
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0
