"""The server's settings: limits, keys, CORS, which of llama-server's optional routes
are on, and the defaults a request that leaves a field out gets (``-n``, ``--temp``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensorplug.errors import RunError

if TYPE_CHECKING:
    from ..server_tools import ToolBox
    from .vertex import VertexRoutes

__all__ = ["ServerConfig"]


class ServerConfig:
    """``api_key``: one key or several (llama-server's ``--api-key a,b`` and
    ``--api-key-file``), None for an open server. ``max_queue``: requests admitted
    beyond the generator's ``n_parallel`` slots (waiting for one); ``request_timeout``:
    seconds a request may run; ``retry_after``: the seconds a 503 tells a client to
    wait; ``max_body_bytes``: the largest request body read (a 413 past it: a prompt of
    tens of megabytes holds even a tiny model's server for minutes, and about a gigabyte,
    while it is parsed and tokenized).

    ``cors_origins``: the origins a browser page may call from (None: every origin,
    reflected back with credentials allowed, as llama-server's default); ``metrics``:
    serve ``/metrics`` (llama-server's ``--metrics``); ``slots``: serve ``/slots``
    (``--no-slots`` turns it off); ``props_writable``: accept ``POST /props``
    (``--props``); ``slot_save_path``: the folder of ``/slots/{id}?action=save``;
    ``defaults``: request fields' values where a request leaves them out
    (``n_predict``, ``temperature``...); ``body_timeout``: seconds a client may take to
    send each piece of a request body (a 408 after); ``aliases`` and ``tags``: the
    model's names and labels listed by ``/v1/models`` (llama-server's ``--alias a,b``
    and ``--tags``); ``web_page``: serve the chat page at ``/`` (``--no-ui``: a 404);
    ``vertex``: Vertex AI's prediction routes (``AIP_MODE=PREDICTION``), None for none;
    ``verbose``: every completion and chat response carries ``__verbose`` (llama-server's
    ``--verbose``; a request asks for it alone with ``"verbose": true``);
    ``enable_thinking``: the chat template's ``enable_thinking`` (``--reasoning off``:
    false); ``jinja``: False as llama-server's ``--no-jinja``, which refuses a chat
    request's tools (its built-in templates render none); ``tools``: the tools
    ``/tools`` lists and runs (``--tools``, MCP servers), None for none (a 403 there):
    whoever can call the server can then run commands and write files with its rights;
    ``cors_proxy``: serve ``/cors-proxy`` (``--ui-mcp-proxy``), whose callers make
    requests from the server's network."""

    def __init__(
        self,
        api_key: str | Sequence[str] | None = None,
        max_queue: int = 64,
        request_timeout: float = 600.0,
        retry_after: int = 1,
        max_body_bytes: int = 16 * 2**20,
        *,
        cors_origins: Sequence[str] | None = None,
        metrics: bool = False,
        slots: bool = True,
        props_writable: bool = False,
        slot_save_path: Path | None = None,
        defaults: Mapping[str, Any] | None = None,
        body_timeout: float = 30.0,
        aliases: Sequence[str] = (),
        tags: Sequence[str] = (),
        web_page: bool = True,
        vertex: VertexRoutes | None = None,
        verbose: bool = False,
        enable_thinking: bool = True,
        jinja: bool = True,
        tools: ToolBox | None = None,
        cors_proxy: bool = False,
    ) -> None:
        if max_queue < 0 or request_timeout <= 0 or max_body_bytes < 1 or body_timeout <= 0:
            raise RunError(
                "max_queue must be >= 0, request_timeout and body_timeout > 0 and "
                "max_body_bytes >= 1"
            )
        keys = [api_key] if isinstance(api_key, str) else list(api_key or ())
        if any(not k for k in keys):
            raise RunError("an API key is empty: give a non-empty key (or none for an open server)")
        self.api_keys: tuple[str, ...] = tuple(keys)
        self.max_queue = max_queue
        self.request_timeout = request_timeout
        self.retry_after = retry_after
        self.max_body_bytes = max_body_bytes
        self.cors_origins = tuple(cors_origins) if cors_origins is not None else None
        self.metrics = metrics
        self.slots = slots
        self.props_writable = props_writable
        self.slot_save_path = slot_save_path
        self.defaults: dict[str, Any] = dict(defaults or {})
        self.body_timeout = body_timeout
        self.aliases = tuple(aliases)
        self.tags = tuple(tags)
        self.web_page = web_page
        self.vertex = vertex
        self.verbose = verbose
        self.enable_thinking = enable_thinking
        self.jinja = jinja
        self.tools = tools
        self.cors_proxy = cors_proxy

    @property
    def api_key(self) -> str | None:
        """The first key (None for an open server)."""
        return self.api_keys[0] if self.api_keys else None
