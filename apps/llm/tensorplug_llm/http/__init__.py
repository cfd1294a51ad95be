"""llama-server's HTTP API over one :class:`~tensorplug_llm.api.LLM`: OpenAI's routes
(:mod:`openai_routes`), llama-server's own (:mod:`native_routes`), CORS (:mod:`cors`),
keys and limits (:mod:`guard`), errors in OpenAI's shape (:mod:`errors`), metrics
(:mod:`metrics`), the server tools and MCP servers at ``/tools`` (:mod:`tools_routes`,
off unless given).

What a team deploying it expects, besides the routes: bad requests are 4xx, never 500;
a bounded queue (503 with ``Retry-After`` past it); a client that disconnects cancels
its request; every request has a deadline; ``/metrics`` in Prometheus text."""

from __future__ import annotations

from .app import create_app
from .config import ServerConfig

__all__ = ["ServerConfig", "create_app"]
