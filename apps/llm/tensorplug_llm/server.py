"""The HTTP server: :func:`create_app` and :class:`ServerConfig`, built in
:mod:`tensorplug_llm.http` (one module per job: routes by API family, errors, CORS,
keys, metrics)."""

from __future__ import annotations

from .http import ServerConfig, create_app

__all__ = ["ServerConfig", "create_app"]
