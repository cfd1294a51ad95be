"""uvicorn serving an app in a thread of the test process, on a free port of 127.0.0.1."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

__all__ = ["UvicornThread"]


class UvicornThread:
    """Starts at once, waits until it listens; :meth:`stop` shuts it down."""

    def __init__(self, app: Any, **settings: Any) -> None:
        """``settings``: more of ``uvicorn.Config``'s (``http="h11"``: serve's protocol)."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error",
                                **settings)  # fmt: skip
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
