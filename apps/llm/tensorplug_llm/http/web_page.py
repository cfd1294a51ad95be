"""The chat page at ``/``, as llama-server serves its web UI there: one HTML page and
its scripts, styles and vendored libraries under ``/web/``, all static files of this
package (no build step). The page and its files are public, as llama-server's are:
they hold no data; the page asks for the API key itself and sends it with each call."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

__all__ = ["ASSETS", "WEB", "add_web_page"]

#: where the page's files are served; the key guard leaves the paths under it public
ASSETS = "/web/"

#: the page's files, package data of this package
WEB = Path(__file__).with_name("web")


def add_web_page(app: FastAPI) -> None:
    """Serve the page at ``/`` (GET and HEAD) and its files under :data:`ASSETS`."""
    index = WEB / "index.html"

    async def page() -> FileResponse:
        # no-cache: a browser revalidates, so a new version of the page is seen at once
        return FileResponse(index, media_type="text/html", headers={"Cache-Control": "no-cache"})

    app.add_api_route("/", page, methods=["GET", "HEAD"], include_in_schema=False)
    app.mount(ASSETS.rstrip("/"), StaticFiles(directory=WEB), name="web")
