"""``/docs`` works without the network: every file the page needs comes from the server.

FastAPI's default page loaded Swagger UI's script and stylesheet from a CDN, so offline it stayed
blank. The page is fetched from a running server; every ``src``/``href`` it references must be
a path on that server (no scheme, no host) and answer 200 with the right content type and a body
that is really Swagger UI 5 (which renders OpenAPI 3.1, the version the document declares).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urljoin, urlsplit

from tests.support import web

CONTENT_TYPES = {".js": "text/javascript", ".css": "text/css", ".png": "image/png"}


def test_docs_and_every_asset_it_references_come_from_the_server(api: Callable[..., Any]) -> None:
    with api(pipeline="payments") as server, web.client(base_url=server.base_url, timeout=10) as client:
        page = client.get("/docs")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html"), page.text
        references = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", page.text)
        urls = re.findall(r"""url:\s*['"]([^'"]+)['"]""", page.text)  # the OpenAPI document SwaggerUIBundle loads
        assert len(references) >= 3 and urls == ["/openapi.json"], (references, urls)
        assert "cdn" not in page.text.lower() and not any("//" in r for r in references + urls), page.text
        for reference in references:
            asset = client.get(urljoin(f"{server.base_url}/docs", reference))
            suffix = urlsplit(reference).path.rsplit(".", 1)[-1]
            assert asset.status_code == 200, (reference, asset.status_code)
            assert asset.headers["content-type"].startswith(CONTENT_TYPES[f".{suffix}"]), (reference, asset.headers)
            assert len(asset.content) > 1000, reference
        bundle = client.get("/docs/assets/swagger-ui-bundle.js").text
        assert re.search(r'"5\.\d+\.\d+"', bundle), "Swagger UI 5 (OpenAPI 3.1) is bundled"
        document = client.get(urls[0])
        assert document.status_code == 200 and document.json()["openapi"].startswith("3.1")
        assert client.get("/docs/assets/..%2F..%2Fetc%2Fpasswd").status_code == 404
        assert client.get("/docs/assets/swagger-editor-bundle.js").status_code == 404  # only the page's files
        assert client.get("/redoc").status_code == 404  # not offered: it would need a CDN too
