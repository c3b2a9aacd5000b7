"""The web console (``/console``): a page the API serves itself, reading the API like any client.

The console is four static files (``console_assets/``: HTML, CSS and plain JavaScript, ``sessions.js`` the
session views' cards; no framework, no build step, nothing from a CDN) that call the public ``/v1`` routes from the
browser: every number on it is an API answer, under the same auth. Reads need no key while the
API binds to a loopback address; otherwise the key is entered once on the page and kept in the
tab's ``sessionStorage`` (gone when the tab closes; never in a cookie, so no other page can make
the browser send it). The page renders API text with ``textContent`` only (keys are user data).

Pages (hash routes, so the server has one URL to serve): ``#/`` overview of every pipeline
(served generation and logic, freshness with a live lag chart, ingest rate, speed-layer state: its
heartbeat, or FAILING with its last error and failures since its last success, from the pipeline's
``/metrics``);
``#/pipelines/{p}/views/{v}`` a view (definition, top-N chart, a key's batch and realtime parts,
a windowed key over a range, the keys; a session view: its top keys, one key's sessions as a timeline and a
table); ``#/pipelines/{p}/runs`` batch runs (a timeline with stages, a button to start one); ``#/pipelines/{p}/dead-letters`` the newest dead letters (records
ingest refused and kept: where from, why, raw text, replayed or not).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, RedirectResponse

from serving.api.errors import NotFoundError

CONSOLE_URL = "/console"
ASSETS_DIR = Path(__file__).with_name("console_assets")
#: The files served under ``/console/`` (by name: no path from the request reaches the disk).
ASSETS = {"console.js": "text/javascript", "sessions.js": "text/javascript", "console.css": "text/css"}
#: The page may load only its own files and call only its own origin.
_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
           "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_HEADERS = {"Content-Security-Policy": _POLICY, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}


def install_console(app: FastAPI) -> None:
    """Serve ``/console`` (the page) and ``/console/{asset}``; none of them in the OpenAPI document."""
    missing = [name for name in ("index.html", *ASSETS) if not (ASSETS_DIR / name).is_file()]
    if missing:
        raise RuntimeError(f"console files {missing} are missing from {ASSETS_DIR}: reinstall the package")

    async def page() -> FileResponse:
        return FileResponse(ASSETS_DIR / "index.html", media_type="text/html", headers=_HEADERS)

    async def slash() -> RedirectResponse:
        return RedirectResponse(CONSOLE_URL, status_code=308)

    async def asset(name: str) -> FileResponse:
        media_type = ASSETS.get(name)
        if media_type is None:
            raise NotFoundError(f"no console file {name!r}; the console uses {', '.join(sorted(ASSETS))}")
        return FileResponse(ASSETS_DIR / name, media_type=media_type, headers=_HEADERS)

    app.add_api_route(CONSOLE_URL, page, methods=["GET"], include_in_schema=False, name="console")
    app.add_api_route(f"{CONSOLE_URL}/", slash, methods=["GET"], include_in_schema=False, name="console_slash")
    app.add_api_route(f"{CONSOLE_URL}/{{name}}", asset, methods=["GET"], include_in_schema=False, name="console_asset")
