"""API keys and scopes over HTTP, against a real uvicorn server.

The app under test is wired the way ``serving.api.app`` wires it (and built here, so these tests do
not depend on that wiring): the real views and health routers, plus an ingest and a batch-run
endpoint standing in for theirs, each router included with ``require(scope)``:
views and reading batch runs need ``read`` (only off loopback), ingest ``ingest``, starting a batch
run ``admin``; /healthz,
/readyz, /metrics, /docs and /openapi.json stay open. Nothing is published in Redis, so a read
that gets past auth answers 503 "no batch generation"; auth answers 401 or 403 before that.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, Depends, FastAPI

import serving.api.auth
from deploy.settings import Settings, load_settings
from serving.api.app import install_error_handlers
from serving.api.auth import is_loopback, require
from serving.api.clock import SystemClock
from serving.api.freshness import MasterClock
from serving.api.metrics import install_metrics
from serving.api.routes import health, views
from serving.store.reader import ServingStore
from shared_logic.registry import load_pipeline
from tests.support import web
from tests.support.servers import ApiServer

KEYS = {
    "read-key-6f1c2a9e": ["read"],
    "ingest-key-b7d04c31": ["ingest"],
    "admin-key-0e93f5d8": ["admin"],
    "all-key-5a2e77c4": ["read", "ingest", "admin"],
}
READ, INGEST, ADMIN, ALL = KEYS
BAD = "not-a-key-9c41e0aa"
KEY_URL = "/v1/views/word_counts/keys/hello"
OPEN_URLS = ("/healthz", "/readyz", "/metrics", "/docs", "/openapi.json")


def build_app(settings: Settings, redis_url: str) -> FastAPI:
    """``create_app``'s app, with the routers included behind their scopes."""
    pipeline = load_pipeline(settings.pipeline)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.store = ServingStore(redis_url, pipeline.name)
        try:
            yield
        finally:
            await app.state.store.close()

    app = FastAPI(lifespan=lifespan)
    app.state.pipeline, app.state.settings = pipeline, settings
    app.state.master_clock = MasterClock(settings.master_path)
    app.state.clock = SystemClock()
    install_error_handlers(app)
    install_metrics(app)

    ingest = APIRouter(prefix="/v1/events", tags=["ingest"])

    @ingest.post("")
    async def post_events() -> dict[str, int]:
        return {"accepted": 1}

    batch = APIRouter(prefix="/v1/batch", tags=["batch"])

    @batch.post("/runs", dependencies=[Depends(require("admin"))])
    async def post_run() -> dict[str, str]:
        return {"run_id": "r1"}

    @batch.get("/runs", dependencies=[Depends(require("read"))])
    async def list_runs() -> list[str]:
        return []

    app.include_router(views.router, dependencies=[Depends(require("read"))])
    app.include_router(ingest, dependencies=[Depends(require("ingest"))])
    app.include_router(batch)  # each route names its scope, as serving.api.app does
    app.include_router(health.router)
    return app


@pytest.fixture
def serve(tmp_path: Path, redis_url: str) -> Callable[..., Any]:
    """``with serve(api_keys=..., http_host=...) as client:`` an httpx client of a running server."""

    @contextmanager
    def start(**overrides: Any) -> Iterator[httpx.Client]:
        settings = load_settings(data_dir=tmp_path / "data", redis_url=redis_url, **overrides)
        with ApiServer(build_app(settings, redis_url)) as server, \
                web.client(base_url=server.base_url, timeout=10) as client:
            yield client

    return start


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def assert_unauthorized(response: httpx.Response, *words: str) -> str:
    assert response.status_code == 401, response.text
    assert response.headers.get("www-authenticate") == "Bearer", response.headers
    detail = response.json()["detail"]
    for word in words:
        assert word.lower() in detail.lower(), detail
    return detail


def assert_forbidden(response: httpx.Response, scope: str) -> str:
    assert response.status_code == 403, response.text
    detail = response.json()["detail"]
    assert f"'{scope}'" in detail, detail
    return detail


def calls(client: httpx.Client) -> dict[str, Callable[..., httpx.Response]]:
    return {
        "read": lambda **kw: client.get(KEY_URL, **kw),
        "read list": lambda **kw: client.get("/v1/views", **kw),
        "ingest": lambda **kw: client.post("/v1/events", **kw),
        "admin": lambda **kw: client.post("/v1/batch/runs", **kw),
        "runs list": lambda **kw: client.get("/v1/batch/runs", **kw),
    }


# --------------------------------------------------------------------------- loopback


def test_loopback_reads_are_open_and_writes_need_their_scope(serve: Callable[..., Any]) -> None:
    with serve(api_keys=KEYS) as client:
        c = calls(client)
        # reads: open on loopback, with or without a key
        response = c["read"]()
        assert response.status_code == 503 and "no batch generation" in response.text, response.text
        assert c["read list"]().status_code == 200
        assert c["runs list"]().status_code == 200
        assert c["read"](headers=bearer(INGEST)).status_code == 503

        for name, scope, key in (("ingest", "ingest", INGEST), ("admin", "admin", ADMIN)):
            assert_unauthorized(c[name](), "no api key was sent", "Bearer", f"'{scope}'")
            assert_unauthorized(c[name](headers=bearer(BAD)), "unknown API key")
            assert_unauthorized(c[name](headers={"Authorization": f"Basic {key}"}), "Bearer <key>")
            assert_unauthorized(c[name](headers={"Authorization": "Bearer"}))
            for other in (READ, INGEST, ADMIN):
                if other != key:
                    detail = assert_forbidden(c[name](headers=bearer(other)), scope)
                    assert "lacks" in detail
            assert c[name](headers=bearer(key)).status_code == 200
            assert c[name](headers=bearer(ALL)).status_code == 200
            assert c[name](headers={"authorization": f"bearer {key}"}).status_code == 200  # scheme is case-blind


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1"])
def test_loopback_hosts_leave_reads_open(host: str, serve: Callable[..., Any]) -> None:
    with serve(api_keys=KEYS, http_host=host) as client:
        assert client.get(KEY_URL).status_code == 503
        assert_unauthorized(client.post("/v1/events"))


# --------------------------------------------------------------------------- non-loopback


def test_non_loopback_reads_need_the_read_scope(serve: Callable[..., Any]) -> None:
    with serve(api_keys=KEYS, http_host="0.0.0.0") as client:
        c = calls(client)
        for name in ("read", "read list", "runs list"):
            assert_unauthorized(c[name](), "no api key was sent", "'read'")
            assert_unauthorized(c[name](headers=bearer(BAD)), "unknown API key")
            assert_forbidden(c[name](headers=bearer(INGEST)), "read")
            assert_forbidden(c[name](headers=bearer(ADMIN)), "read")
        response = c["read"](headers=bearer(READ))
        assert response.status_code == 503 and "no batch generation" in response.text, response.text
        assert c["read"](headers=bearer(ALL)).status_code == 503
        assert c["read list"](headers=bearer(READ)).status_code == 200
        assert c["runs list"](headers=bearer(READ)).status_code == 200
        # writes are unchanged
        assert_forbidden(c["ingest"](headers=bearer(READ)), "ingest")
        assert c["ingest"](headers=bearer(INGEST)).status_code == 200
        assert_forbidden(c["admin"](headers=bearer(INGEST)), "admin")
        assert c["admin"](headers=bearer(ADMIN)).status_code == 200


@pytest.mark.parametrize("host", ["0.0.0.0", "127.0.0.1"])
def test_probes_metrics_and_docs_stay_open(host: str, serve: Callable[..., Any]) -> None:
    with serve(api_keys=KEYS, http_host=host) as client:
        for url in OPEN_URLS:
            response = client.get(url)
            assert response.status_code in (200, 503), (url, response.text)  # /readyz: 503, nothing published
            assert response.status_code != 503 or url == "/readyz"


# --------------------------------------------------------------------------- no keys configured


@pytest.mark.parametrize("keys", [None, {}])
def test_without_configured_keys_writes_are_refused_with_how_to_configure(keys: Any, serve: Callable[..., Any]) -> None:
    with serve(api_keys=keys) as client:
        c = calls(client)
        assert c["read"]().status_code == 503  # loopback: reads open
        for name in ("ingest", "admin"):
            for headers in ({}, bearer(BAD)):
                assert_unauthorized(c[name](headers=headers), "no API keys are configured", "LAMBDA_API_KEYS")


def test_without_configured_keys_non_loopback_reads_are_refused(serve: Callable[..., Any]) -> None:
    with serve(http_host="0.0.0.0") as client:
        assert_unauthorized(client.get(KEY_URL), "no API keys are configured", "LAMBDA_API_KEYS", "'read'")
        assert client.get("/healthz").status_code == 200


# --------------------------------------------------------------------------- secrecy


def test_keys_never_appear_in_logs_or_answers(serve: Callable[..., Any], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    bodies: list[str] = []
    with serve(api_keys=KEYS, http_host="0.0.0.0") as client:
        for call in calls(client).values():
            for key in (*KEYS, BAD, BAD + "x" * 40):
                for headers in (bearer(key), {"Authorization": f"Basic {key}"}, {"Authorization": key}):
                    response = call(headers=headers)
                    bodies.append(f"{response.headers} {response.text}")
        bodies.append(client.get("/metrics").text)
    # what the server process logs (this process also holds the test's HTTP client: its logs are not the server's)
    server = [r for r in caplog.records if not r.name.startswith(("httpx", "httpcore", "hpack"))]
    assert any("refused" in r.getMessage() for r in server), "refusals are logged (without keys)"
    logged = "\n".join(f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in server)
    for key in (*KEYS, BAD):
        assert key not in logged
        assert all(key not in body for body in bodies), key


def test_keys_are_compared_in_constant_time_against_every_key(serve: Callable[..., Any],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[bytes, bytes]] = []
    real = serving.api.auth.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(serving.api.auth.hmac, "compare_digest", spy)
    with serve(api_keys=KEYS) as client:
        assert client.post("/v1/events", headers=bearer(READ)).status_code == 403  # matches the first key
        assert len(compared) == len(KEYS)  # no early exit on a match
        compared.clear()
        assert client.post("/v1/events", headers=bearer(BAD)).status_code == 401
        assert len(compared) == len(KEYS)
        assert {b for _, b in compared} == {k.encode() for k in KEYS}


# --------------------------------------------------------------------------- OpenAPI


def test_openapi_documents_the_bearer_scheme(serve: Callable[..., Any]) -> None:
    with serve(api_keys=KEYS, http_host="0.0.0.0") as client:
        schema = client.get("/openapi.json").json()
    schemes = schema["components"]["securitySchemes"]
    assert len(schemes) == 1
    (name, scheme), = schemes.items()
    assert scheme["type"] == "http" and scheme["scheme"] == "bearer", scheme
    assert "LAMBDA_API_KEYS" in scheme["description"]
    for path, method in (("/v1/views/{view}/keys/{key}", "get"), ("/v1/views", "get"), ("/v1/events", "post"),
                         ("/v1/batch/runs", "post")):
        assert schema["paths"][path][method]["security"] == [{name: []}], path
    for path in ("/healthz", "/readyz"):
        assert "security" not in schema["paths"][path]["get"], path
    assert "/metrics" not in schema["paths"]


# --------------------------------------------------------------------------- units


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost", "LOCALHOST", "localhost.",
                                  "::ffff:127.0.0.1", "api.localhost"])
def test_loopback_addresses(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "192.168.1.2", "8.8.8.8", "example.com",
                                  "my-host", "128.0.0.1", "::ffff:10.0.0.1"])
def test_non_loopback_addresses(host: str) -> None:
    assert not is_loopback(host)


def test_unknown_scope_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="read, ingest, admin"):
        require("write")
