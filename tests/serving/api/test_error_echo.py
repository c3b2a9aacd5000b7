"""What an error echoes is capped, long values are refused in the API's shape, and ``measure=`` is checked.

* A 10 KB unknown key, run id, view, pipeline or query parameter came back whole in the answer.
  Now a detail quotes at most 100 characters of a value sent (cut, "…", its length), and a key,
  ``prefix`` or key column filter over 2048 characters, a cursor over 16384, a time over 64 or a
  run id over 64 is a 422 naming the limit, which the OpenAPI document declares (``maxLength``).
* A URL longer than the 65535 bytes uvicorn's parser reads got uvicorn's plain-text 400 before
  the application saw it. The application cannot answer it; the server process can:
  ``serving.api.http_protocol.JsonErrorHttpProtocol`` (given to uvicorn as ``http=``) answers it
  as every other error, ``{"error": "BadRequestError", "detail": ...}``.
* ``GET /v1/views/{view}/top?measure=`` (empty) answered 200 with the first measure; an empty or
  unknown measure is now a 422 naming the measures a top-N ranks by.

Each check compares the answer with what was sent: status, the JSON shape, the detail's length,
and that the long value is not in it whole.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

import httpx
import pytest
import uvicorn

from batch_layer.recompute.job import run_batch
from deploy.settings import Settings
from serving.api.app import create_app
from serving.api.http_protocol import JsonErrorHttpProtocol
from serving.api.key_pages import MAX_CURSOR_CHARS
from serving.api.queries import MAX_KEY_CHARS
from serving.api.routes.batch import MAX_RUN_ID_CHARS
from shared_logic.registry import load_pipeline
from tests.support import free_port, ingest_file, key_url, web
from tests.support.servers import ApiServer

VIEW = "spend_by_user"
SCALAR = ["count", "sum_amount", "min_amount", "max_amount"]
#: Longest detail an answer about one long value may have (messages name the fix, lists of what exists).
DETAIL_MAX = 700


@pytest.fixture(scope="module")
def settings(spark: Any, module_settings: Callable[..., Settings], tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """Three payments published once for the module (its tests only read)."""
    settings = module_settings(pipeline="payments")
    events = [{"user_id": u, "merchant": "m", "amount": a, "event_time": datetime(2024, 3, 1, 9, tzinfo=timezone.utc).isoformat()}
              for u, a in (("alice", 2.0), ("bob", 3.5), ("carol", 1.0))]
    ingest_file(settings, events, tmp_path_factory.mktemp("events") / "payments.jsonl")
    run_batch(spark, settings, load_pipeline("payments"), redis_url=settings.redis_url)
    return settings


@pytest.fixture(scope="module")
def client(settings: Settings) -> Iterator[httpx.Client]:
    """An HTTP client of the module's one API server over ``settings``."""
    with ApiServer(create_app(settings, redis_url=settings.redis_url or "")) as server, \
            web.client(base_url=server.base_url, timeout=30) as http:
        yield http


def refused(response: httpx.Response, status: int, long_value: str, *words: str) -> str:
    assert response.status_code == status, (response.status_code, response.text[:400])
    assert response.headers["content-type"] == "application/json", response.headers
    body = response.json()
    assert set(body) == {"error", "detail"}, body
    detail = body["detail"]
    assert len(detail) <= DETAIL_MAX and long_value not in detail, (len(detail), detail[:400])
    for word in words:
        assert word in detail, detail
    return detail


LONG = "k" * 10_000


@pytest.mark.parametrize(("method", "path", "params", "status", "words"), [
    ("GET", key_url(VIEW, LONG), {}, 422, ["path parameter 'key'", str(MAX_KEY_CHARS), "…"]),
    ("GET", key_url(VIEW, "k" * MAX_KEY_CHARS), {}, 404, ["not found", f"… ({MAX_KEY_CHARS} characters)"]),
    ("GET", f"/v1/batch/runs/{LONG}", {}, 422, ["path parameter 'run_id'", str(MAX_RUN_ID_CHARS)]),
    ("GET", f"/v1/views/{LONG}/top", {}, 404, ["unknown view", "…", "'spend_by_user'"]),
    ("GET", f"/v1/views/{LONG}/keys/alice", {}, 404, ["unknown view", "…"]),
    ("GET", f"/v1/pipelines/{LONG}/views", {}, 404, ["pipeline", "…", "'payments'"]),
    ("GET", f"/v1/views/{VIEW}/keys", {LONG: "1"}, 422, ["unknown query parameter", "… (10000 characters)"]),
    ("GET", f"/v1/views/{VIEW}/keys", {"user_id": LONG}, 422, ["'user_id'", str(MAX_KEY_CHARS)]),
    ("GET", f"/v1/views/{VIEW}/keys", {"prefix": LONG}, 422, ["'prefix'", str(MAX_KEY_CHARS)]),
    ("GET", f"/v1/views/{VIEW}/keys", {"cursor": "c" * (MAX_CURSOR_CHARS + 1)}, 422, ["'cursor'", str(MAX_CURSOR_CHARS)]),
    ("GET", "/v1/views/spend_by_user_hourly/top", {"window_start": " " * 60 + "1709283600"}, 422, ["'window_start'", "64"]),
    ("GET", f"/v1/views/{VIEW}/top", {"measure": LONG}, 422, ["measure", "…", *SCALAR]),
    ("DELETE", key_url(VIEW, "k" * MAX_KEY_CHARS), {}, 405, ["DELETE", "GET"]),
], ids=["key over the limit", "unknown long key", "run id over the limit", "unknown view (top)", "unknown view (key)",
        "unknown pipeline", "unknown parameter", "key column filter", "prefix", "cursor", "time", "unknown measure",
        "405"])
def test_long_values_are_refused_in_the_json_shape_and_echoed_cut(
        client: httpx.Client, method: str, path: str, params: dict[str, str], status: int, words: list[str]) -> None:
    refused(client.request(method, path, params=params), status, "k" * 200, *words)


@pytest.mark.parametrize("measure", ["", "nope", "distinct_merchant"])
def test_an_empty_or_unknown_measure_is_a_422_naming_the_measures(client: httpx.Client, measure: str) -> None:
    detail = refused(client.get(f"/v1/views/{VIEW}/top", params={"measure": measure}), 422, "k" * 200,
                     "measure", *SCALAR)
    assert detail.startswith(f"measure: {measure!r}"), detail
    top = client.get(f"/v1/views/{VIEW}/top", params={"measure": "max_amount"}).json()["top"]
    assert [(e["key"], e["value"]) for e in top] == [("bob", 3.5), ("alice", 2.0), ("carol", 1.0)]
    assert client.get(f"/v1/views/{VIEW}/top").json()["measure"] == "count"


def test_the_openapi_document_declares_the_limits(client: httpx.Client) -> None:
    paths = client.get("/openapi.json").json()["paths"]

    def schema(path: str, name: str) -> dict[str, Any]:
        return next(p for p in paths[path]["get"]["parameters"] if p["name"] == name)["schema"]

    assert schema("/v1/views/{view}/keys/{key}", "key")["maxLength"] == MAX_KEY_CHARS
    assert schema("/v1/views/{view}/keys", "prefix")["maxLength"] == MAX_KEY_CHARS
    cursor = [b for b in schema("/v1/views/{view}/keys", "cursor")["anyOf"] if b.get("type") == "string"]
    assert [b["maxLength"] for b in cursor] == [MAX_CURSOR_CHARS]
    assert schema("/v1/batch/runs/{run_id}", "run_id")["maxLength"] == MAX_RUN_ID_CHARS
    for name in ("window_start", "from", "to"):
        assert {b["maxLength"] for b in schema("/v1/views/{view}/keys", name)["anyOf"]} == {64}


@contextmanager
def json_error_server(settings: Settings) -> Iterator[int]:
    """The app under uvicorn with ``http=JsonErrorHttpProtocol`` (as ``serve`` should run it); yields its port."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings, redis_url=settings.redis_url or ""), host="127.0.0.1",
                                           port=port, log_level="error", http=JsonErrorHttpProtocol))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(10)


def raw_get(port: int, target: str) -> tuple[int, dict[str, str], bytes]:
    """A GET of ``target`` as sent (httpx refuses URLs over 64 KiB): status, headers, body."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


@pytest.mark.parametrize("target", [key_url(VIEW, "k" * 100_000), f"/v1/views/{VIEW}/keys?cursor={'c' * 100_000}",
                                    f"/v1/views/{VIEW}/keys?cursor={'c' * 65_530}"])
def test_a_url_longer_than_the_server_reads_gets_the_json_error(settings: Settings, target: str) -> None:
    import json

    with json_error_server(settings) as port:
        status, headers, body = raw_get(port, target)
        assert status == 400 and headers["content-type"] == "application/json", (status, headers, body[:200])
        answer = json.loads(body)
        assert answer["error"] == "BadRequestError" and "65535 bytes" in answer["detail"], answer
        assert int(headers["content-length"]) == len(body)
        status, headers, body = raw_get(port, key_url(VIEW, "alice"))  # everything else is uvicorn's, unchanged
        assert status == 200 and json.loads(body)["value"]["count"] == 1, body
