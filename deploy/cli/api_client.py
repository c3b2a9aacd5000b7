"""A small client of the platform's HTTP API, for the command line (``query``, ``top``, ``keys``).

It sends the key the other commands use (``deploy.data_dir.with_api_keys``: LAMBDA_API_KEYS' first
key with the ``read`` scope, else the data dir's local key) and turns every failure into an
:class:`~deploy.errors.ApiError` carrying the API's own ``detail``, so a user sees what the API said.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import quote

import httpx

from deploy.data_dir import with_api_keys
from deploy.errors import ApiError
from deploy.settings import Settings

Params = Mapping[str, str | int | bool | None]


class ApiClient:
    """GET requests against one API, answers as parsed JSON."""

    def __init__(self, base_url: str, api_key: str | None, *, routes: str = "/v1", timeout: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url, self.routes = base_url, routes
        self._http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout)

    @classmethod
    def from_settings(cls, settings: Settings, scope: str = "read") -> ApiClient:
        """A client of the API ``settings`` address, with the first configured key that has ``scope``."""
        settings, _ = with_api_keys(settings, create=False)
        key = next((k for k, scopes in (settings.api_keys or {}).items() if scope in scopes), None)
        return cls(settings.api_url, key, routes=settings.api_routes)

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.close()

    def get(self, path: str, params: Params | None = None) -> dict[str, Any]:
        """The JSON answer of ``GET path``; an error answer or no answer raises ApiError naming it."""
        query = {k: _param(v) for k, v in (params or {}).items() if v is not None}
        try:
            response = self._http.get(path, params=query)
        except httpx.HTTPError as e:
            raise ApiError(f"the API at {self.base_url} is not reachable ({type(e).__name__}: {e}); "
                           "is the platform running (`lambda-platform up` or `serve`)?") from e
        return _answer(response)

    def lines(self, path: str, params: Params | None = None, *, accept: str) -> Iterator[str]:
        """The lines of a streamed answer (``accept``: text/csv or application/x-ndjson), as they arrive."""
        query = {k: _param(v) for k, v in (params or {}).items() if v is not None}
        try:
            with self._http.stream("GET", path, params=query, headers={"Accept": accept}, timeout=None) as response:
                if response.status_code >= 400:
                    response.read()
                    _answer(response)
                yield from response.iter_lines()
        except httpx.HTTPError as e:
            raise ApiError(f"reading {path} from {self.base_url} failed ({type(e).__name__}: {e})") from e

    def view_path(self, view: str, *rest: str) -> str:
        """``/v1/views/{view}/...`` (under the pipeline's prefix) with each part URL-encoded ('/' and '|'
        in keys included)."""
        return "/".join([f"{self.routes}/views", *(quote(part, safe="") for part in (view, *rest))])


def _param(value: str | int | bool) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _answer(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code >= 400:
        detail = body.get("detail") if isinstance(body, dict) else None
        raise ApiError(f"{response.request.method} {response.request.url.path} answered {response.status_code}: "
                       f"{detail or response.text[:300]}", status=response.status_code)
    if not isinstance(body, dict):
        raise ApiError(f"{response.request.url} answered {response.status_code} without a JSON object")
    return body
