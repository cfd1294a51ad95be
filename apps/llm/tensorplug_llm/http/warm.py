"""A server's first requests, answered before it listens.

The engine's warm-up builds every step shape, but a server's first request still paid
for everything else done once per process: the tokenizer's and the chat template's
first use (their regular expressions compiled, a Jinja template compiled), the
sampler's first draw, the first computation of each prepared step plan, the modules
the streaming response imports, FastAPI's first call of a route. Together that made
the first request's first token several times later than the next one's (~110 ms
against ~28 ms for SmolLM2-135M on two cores). :func:`warm_up_app` sends a server's
own app a few one-token requests of the kinds clients send first (a streamed chat, a
streamed completion, llama.cpp's ``/completion``) through ASGI, in this process,
before anything listens; the caller then serves from a fresh engine and app, so no
count or cached token of theirs is left behind.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import MutableMapping
from typing import Any

__all__ = ["WARM_REQUESTS", "warm_up_app"]

#: The requests sent, as (path, JSON body): one token each, sampled as a client's
#: defaults sample it (not greedy: the sampler's chain is what is warmed).
WARM_REQUESTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("/v1/chat/completions",
     {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 1, "stream": True}),
    ("/v1/completions", {"prompt": "Hello", "max_tokens": 1, "stream": True}),
    ("/completion", {"prompt": "Hello", "n_predict": 1}),
)  # fmt: skip


def warm_up_app(app: Any, api_key: str | None = None) -> list[str]:
    """Send ``app`` (an ASGI application) each of :data:`WARM_REQUESTS`, with
    ``api_key`` as a bearer token where the server wants one, and read each answer to
    its end. Best effort: a request the server refuses (a chat template whose own
    preamble outgrows a small context, a key it lacks) warms what it reached, and the
    server serves all the same, as it would answer that request to a client. Returns
    what each refused request was answered, one line each."""
    refused = []
    for path, body in WARM_REQUESTS:
        status, text = asyncio.run(_request(app, path, json.dumps(body).encode(), api_key))
        if status != 200:
            refused.append(f"POST {path} was answered {status}: {text:.300}")
    return refused


async def _request(app: Any, path: str, body: bytes, api_key: str | None) -> tuple[int, str]:
    """POST ``body`` to ``path`` of ``app``: the status and the text of the answer."""
    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]  # fmt: skip
    if api_key is not None:
        headers.append((b"authorization", b"Bearer " + api_key.encode()))
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
        "query_string": b"", "headers": headers, "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 0),
    }  # fmt: skip
    sent = False
    done = asyncio.Event()
    status, chunks = 0, []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()  # the client stays until the whole answer came
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
        elif message["type"] == "http.response.body":
            chunks.append(bytes(message.get("body", b"")))
            if not message.get("more_body", False):
                done.set()

    await app(scope, receive, send)
    return status, b"".join(chunks).decode("utf-8", "replace")
