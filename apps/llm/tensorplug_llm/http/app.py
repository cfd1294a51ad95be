"""The FastAPI app: the routers, the error handlers and the middleware, in the order a
request meets them: the response headers' case (:mod:`.header_case`), the transport's
limits (the HTTP version, the body's read deadline), CORS (a preflight is answered
before any key is asked for), then the key, the body limit and the counters, then the
model woken if it sleeps, then the route (Vertex AI's ``/predict`` sends each of its
instances through all of it again)."""

from __future__ import annotations

from fastapi import Depends, FastAPI
from fastapi.routing import APIRoute

from ..api import LLM
from .anthropic_routes import router as anthropic
from .body_check import check_body
from .config import ServerConfig
from .cors import Cors
from .cors_proxy import router as cors_proxy
from .errors import install_error_handlers
from .guard import PUBLIC_ROUTES, Guard
from .header_case import CanonicalHeaderCase
from .infill import router as infill
from .lora_routes import router as lora
from .native_routes import health
from .native_routes import router as native
from .openai_routes import both, v1_only
from .responses_routes import router as responses
from .service import Service
from .sleep import IdleSleep, SleepGuard
from .tools_routes import router as tools
from .transport import Transport
from .vertex import add_predict_route
from .web_page import add_web_page

__all__ = ["create_app"]


def create_app(
    llm: LLM, config: ServerConfig | None = None, sleep: IdleSleep | None = None
) -> FastAPI:
    """The FastAPI app serving ``llm`` under ``config``'s limits; ``sleep``: its model
    sleeps when idle (:mod:`.sleep`; its watcher is the caller's to start)."""
    cfg = config or ServerConfig()
    app = FastAPI(
        title="tensorplug", docs_url=None, redoc_url=None, openapi_url=None,
        dependencies=[Depends(check_body)],
    )  # fmt: skip
    svc = Service(llm, cfg, sleep)
    app.state.service = svc
    app.state.llm = llm
    app.state.metrics = svc.metrics
    app.state.tools = cfg.tools  # /tools: 403 without (--tools, MCP servers)
    app.state.cors_proxy = cfg.cors_proxy  # /cors-proxy: 403 without --ui-mcp-proxy
    install_error_handlers(app)
    routes: set[str] = set()  # the paths metrics name (any other is counted as "other")
    posts: list[str] = []  # the POST routes, which Vertex AI's /predict dispatches to
    for router, prefix in (
        (native, ""), (infill, ""), (both, ""), (both, "/v1"), (v1_only, "/v1"),
        (anthropic, "/v1"), (responses, ""), (responses, "/v1"), (tools, ""), (cors_proxy, ""),
        (lora, ""),
    ):  # fmt: skip
        app.include_router(router, prefix=prefix)
        routes |= {
            prefix + path
            for r in router.routes
            if isinstance(path := getattr(r, "path", None), str)
        }
        posts += [
            prefix + r.path
            for r in router.routes
            if isinstance(r, APIRoute) and "POST" in (r.methods or ())
        ]
    if cfg.web_page:
        add_web_page(app)
    if cfg.vertex is not None:
        add_predict_route(app, cfg.vertex, posts, health)
    if sleep is not None:  # innermost: a request the key refuses wakes nothing
        app.add_middleware(SleepGuard, sleep=sleep)
    public = set(PUBLIC_ROUTES)
    if cfg.vertex is not None and cfg.vertex.health is not None:
        public.add(cfg.vertex.health)  # a health check, as /health
    app.add_middleware(
        Guard, api_keys=cfg.api_keys, metrics=svc.metrics, max_body_bytes=cfg.max_body_bytes,
        routes=routes, public=public,
    )  # fmt: skip
    app.add_middleware(Cors, origins=cfg.cors_origins)
    app.add_middleware(Transport, body_timeout=cfg.body_timeout)
    app.add_middleware(CanonicalHeaderCase)  # outermost: every response, errors too
    return app
