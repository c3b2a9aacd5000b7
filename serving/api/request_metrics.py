"""Per-request HTTP metrics: a pure ASGI middleware counting and timing each request by route template,
method and status (``lambda_http_requests_total``, ``lambda_http_request_duration_seconds``), installed by
``serving.api.metrics.install_metrics``. A request costs two dict look-ups, an increment and an observe."""

from __future__ import annotations

import re
import time
from typing import Any

from prometheus_client import Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_CONVERTER = re.compile(r"\{([^}:]+):[^}]*\}")
UNMATCHED = "unmatched"


def route_template(path: str) -> str:
    """A route's path without converters: ``/v1/views/{view}/keys/{key:path}`` -> ``.../{key}``."""
    return _CONVERTER.sub(r"{\1}", path)


class RequestMetrics:
    """Pure ASGI middleware: counts and times each HTTP request by route template, method, status.

    The router stores the matched route in ``scope["route"]`` (the scope dict is shared down the
    stack), so the template is known once the app returns; labelled children are cached per
    (method, route, status) so a request costs two dict look-ups, an increment and an observe.
    """

    def __init__(self, app: ASGIApp, requests: Counter, latency: Histogram) -> None:
        self.app, self._requests, self._latency = app, requests, latency
        self._children: dict[tuple[str, str | None, int], tuple[Any, Any]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what ServerErrorMiddleware answers when the app raises before responding

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            elapsed = time.perf_counter() - started
            route = scope.get("route")
            key = (scope["method"], getattr(route, "path", None), status)
            children = self._children.get(key)
            if children is None:
                children = self._child(key)
            children[0].inc()
            children[1].observe(elapsed)

    def _child(self, key: tuple[str, str | None, int]) -> tuple[Any, Any]:
        method, path, status = key
        labels = (
            method if method in _METHODS else "OTHER",
            UNMATCHED if path is None else route_template(path),
            str(status),
        )
        children = (self._requests.labels(*labels), self._latency.labels(*labels))
        self._children[key] = children
        return children
