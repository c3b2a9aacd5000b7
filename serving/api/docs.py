"""The OpenAPI page (``/docs``), served with no network: Swagger UI's files come from an installed package.

FastAPI's own ``/docs`` loads Swagger UI from a CDN, so on a machine without Internet access the
page stays blank. Here the page is FastAPI's ``get_swagger_ui_html`` pointed at the files the
``swagger-ui-py`` package installs (Swagger UI 5, which reads OpenAPI 3.1), served under
``/docs/assets/``. ReDoc is not offered: it would need a CDN or another bundle for the same page.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse

from serving.api.errors import NotFoundError

DOCS_URL = "/docs"
ASSETS_URL = f"{DOCS_URL}/assets"
#: The files the page needs, and the only ones served (by name: no path from the request reaches the disk).
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "favicon-32x32.png": "image/png",
}


def swagger_ui_dir() -> Path:
    """The folder of Swagger UI's files in the installed ``swagger-ui-py`` package."""
    return Path(str(files("swagger_ui") / "static"))


def install_docs(app: FastAPI) -> None:
    """Serve ``/docs`` and its assets from ``swagger_ui_dir()``; the app must be built with ``docs_url=None``."""
    folder = swagger_ui_dir()
    missing = [name for name in ASSETS if not (folder / name).is_file()]
    if missing:
        raise RuntimeError(f"Swagger UI files {missing} are missing from {folder}: reinstall swagger-ui-py")

    async def docs(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - API docs",
            swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_URL}/favicon-32x32.png",
            swagger_ui_parameters={"persistAuthorization": True},
        )

    async def asset(name: str) -> FileResponse:
        media_type = ASSETS.get(name)
        if media_type is None:
            raise NotFoundError(f"no docs asset {name!r}; the page uses {', '.join(sorted(ASSETS))}")
        return FileResponse(folder / name, media_type=media_type, headers={"Cache-Control": "public, max-age=86400"})

    app.add_api_route(DOCS_URL, docs, methods=["GET"], include_in_schema=False, name="docs")
    app.add_api_route(f"{ASSETS_URL}/{{name}}", asset, methods=["GET"], include_in_schema=False, name="docs_asset")
