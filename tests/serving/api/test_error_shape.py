"""Every answer the API gives is the documented one, against the real app over HTTP.

* FastAPI's own validation errors (``top?n=0``, a malformed time, a bad ``limit``) answered
  ``{"detail": [...]}``; now ``{"error", "detail"}`` like every other error, the detail naming the
  parameter and the problem; a malformed JSON body is a 400.
* The OpenAPI document lacked 401, 403 and 400: every protected operation now declares 401 and
  403, every operation with a body 400, and every error response's schema is ``ErrorBody``.
* ``{"force": "yes"}`` to ``POST /v1/batch/runs`` was taken as true; booleans are strict now and
  unknown fields are refused, and nothing is queued by a refused request.
* ``OPTIONS /v1/batch/runs`` answered 405 listing only POST; now ``OPTIONS`` on every documented
  path answers 204 with ``Allow`` naming all its methods, and a method no route takes is a 405
  with the same ``Allow``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.support import web

ADMIN = "shape-admin-key-0001"
ERROR_BODY = {"$ref": "#/components/schemas/ErrorBody"}


@pytest.fixture
def client(api: Callable[..., Any]) -> Iterator[httpx.Client]:
    with api(pipeline="payments", api_keys={ADMIN: ["admin"]}) as server, \
            web.client(base_url=server.base_url, timeout=10) as http:
        yield http


def shaped(response: httpx.Response, status: int, *words: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "detail"} and isinstance(body["detail"], str), body
    for word in words:
        assert word in body["detail"], body
    return body["detail"]


@pytest.mark.parametrize(("url", "params", "words"), [
    ("/v1/views/spend_by_user/top", {"n": "0"}, ["query parameter 'n'", "greater than or equal to 1"]),
    ("/v1/views/spend_by_user/top", {"n": "many"}, ["query parameter 'n'", "integer", "'many'"]),
    ("/v1/views/spend_by_user/top", {"n": "1001"}, ["query parameter 'n'", "1000"]),
    ("/v1/views/spend_by_user_hourly/top", {"window_start": "soon"}, ["query parameter 'window_start'", "'soon'"]),
    ("/v1/views/spend_by_user/keys/alice", {"explain": "perhaps"}, ["query parameter 'explain'", "boolean"]),
    ("/v1/batch/runs", {"limit": "0"}, ["query parameter 'limit'"]),
])
def test_fastapi_validation_errors_answer_error_and_detail(client: httpx.Client, url: str, params: dict[str, str],
                                                           words: list[str]) -> None:
    detail = shaped(client.get(url, params=params), 422, *words)
    assert "[{" not in detail


def test_batch_run_body_is_strict_and_refusals_queue_nothing(client: httpx.Client) -> None:
    admin = {"Authorization": f"Bearer {ADMIN}"}
    for body in ({"force": "yes"}, {"force": "true"}, {"force": 1}, {"force": None}, {"forse": True}, [True]):
        shaped(client.post("/v1/batch/runs", json=body, headers=admin), 422, "body")
    shaped(client.post("/v1/batch/runs", content=b'{"force": tru', headers={**admin, "Content-Type": "application/json"}),
           400, "malformed JSON")
    listed = client.get("/v1/batch/runs").json()
    assert listed["runs"] == [] and listed["active"] is None, listed
    started = client.post("/v1/batch/runs", json={"force": True}, headers=admin)
    assert started.status_code == 202 and started.json()["force"] is True, started.text


def test_openapi_declares_every_error_with_the_error_model(client: httpx.Client) -> None:
    schema = client.get("/openapi.json").json()
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    operations = [(path, method, op) for path, ops in schema["paths"].items() for method, op in ops.items()]
    assert len(operations) == 15
    for path, method, op in operations:
        responses = op["responses"]
        for status, response in responses.items():
            if status.startswith(("4", "5")):
                assert response["content"]["application/json"]["schema"] == ERROR_BODY, (path, method, status)
        if "security" in op:
            assert {"401", "403"} <= responses.keys(), (path, method)
        if "requestBody" in op:
            assert {"400", "422"} <= responses.keys(), (path, method)
        if op.get("parameters"):
            assert "422" in responses, (path, method)
    protected = {(p, m) for p, m, op in operations if "security" in op}
    assert protected == {("/v1/views", "get"), ("/v1/views/{view}/keys", "get"), ("/v1/views/{view}/keys/{key}", "get"),
                         ("/v1/views/{view}/top", "get"), ("/v1/views/{view}/sessions/keys/{key}", "get"),
                         ("/v1/views/{view}/sessions/summary/{key}", "get"), ("/v1/views/{view}/sessions/top", "get"),
                         ("/v1/events", "post"), ("/v1/batch/runs", "post"), ("/v1/batch/runs", "get"),
                         ("/v1/batch/runs/{run_id}", "get"), ("/v1/pipelines", "get"), ("/v1/dead-letters", "get")}


def test_options_and_405_name_every_method_of_each_path(client: httpx.Client) -> None:
    schema = client.get("/openapi.json").json()
    for template, operations in schema["paths"].items():
        path = re.sub(r"\{[^}]+\}", "x", template)
        declared = {m.upper() for m in operations}
        options = client.options(path)
        assert options.status_code == 204, (path, options.text)
        assert set(options.headers["allow"].split(", ")) == declared | {"OPTIONS"}, (path, options.headers)
        for method in {"GET", "POST", "PUT", "PATCH", "DELETE"} - declared:
            refused = client.request(method, path)
            shaped(refused, 405, method, path)
            assert refused.headers["allow"] == options.headers["allow"], (method, path)
    assert client.options("/v1/batch/runs").headers["allow"] == "GET, POST, OPTIONS"
    shaped(client.options("/no/such/route"), 404)


def test_unexpected_failures_answer_500_in_the_error_shape(client: httpx.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """An injected fault (the only fake here): a bug still answers ``{"error", "detail"}``, without its message."""
    import serving.api.routes.views as views

    def broken(*_: Any, **__: Any) -> Any:
        raise ZeroDivisionError("a secret detail")

    monkeypatch.setattr(views.queries, "top_answer", broken)
    detail = shaped(client.get("/v1/views/spend_by_user/top"), 500, "/v1/views/spend_by_user/top", "server log")
    assert "secret" not in detail
