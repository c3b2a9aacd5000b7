"""What the OpenAPI document says beyond what FastAPI derives from the routes: this server's own facts.

* The ``view`` path parameter lists the served pipeline's views (``enum``), and ``measure`` the
  scalar measures top-N can rank by, so the document names what exists instead of "a string".
* The top-N answer links to the answer of each key it lists (an OpenAPI link from ``top/0/key``).
* On a server whose reads are open (bound to a loopback address, see ``serving.api.auth``) the
  read operations (GET) declare their security optional (``[{"APIKey": []}, {}]``): a key is
  accepted but not needed, which is what the server does. Writes always need their key.

The ingest route documents the pipeline's event model itself (``serving.api.routes.events``).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from serving.api.auth import is_loopback
from shared_logic.pipeline import Pipeline


def document_server(app: FastAPI, pipeline: Pipeline, http_host: str) -> None:
    """Wrap ``app.openapi`` so the document states the facts above (computed once, then cached)."""
    generate = app.openapi
    reads_open = is_loopback(http_host)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = generate()
        views = [view.name for view in pipeline.views]
        measures = sorted({m.name for view in pipeline.views for m in view.scalar_measures})
        for path, operations in schema.get("paths", {}).items():
            for method, operation in operations.items():
                for parameter in operation.get("parameters", []):
                    if path.startswith("/v1/views/") and parameter["name"] == "view":
                        parameter["schema"]["enum"] = views
                    elif path.endswith("/top") and parameter["name"] == "measure":
                        parameter["schema"] = {"anyOf": [{"type": "string", "enum": measures}, {"type": "null"}],
                                               "title": "Measure"}
                if reads_open and method == "get" and operation.get("security"):
                    operation["security"] = [*operation["security"], {}]
        _link_top_to_keys(schema.get("paths", {}))
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _link_top_to_keys(paths: dict[str, Any]) -> None:
    top = paths.get("/v1/views/{view}/top", {}).get("get")
    key = paths.get("/v1/views/{view}/keys/{key}", {}).get("get")
    if top is None or key is None:
        return
    top["responses"]["200"]["links"] = {
        "TopKey": {
            "operationId": key["operationId"],
            "description": "The measures of the first key listed, in the same view (all time; for a windowed "
                           "view add the window_start the ranking was asked for).",
            "parameters": {"view": "$request.path.view", "key": "$response.body#/top/0/key"},
        }
    }
