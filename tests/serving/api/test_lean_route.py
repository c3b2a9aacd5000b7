"""The views routes on ``LeanRoute`` answer exactly as FastAPI's own handler does.

The oracle is FastAPI itself: a twin of the app whose views routes are declared again, argument
for argument, on plain ``APIRoute``s and included with ``include_router`` as before
(``fastapi_twin``), served side by side with the real app over HTTP, on the same Redis and settings. Every request of a corpus (good and bad: unknown
views and keys, malformed and out-of-range times, parameters that do not fit the view, missing
and wrong keys, nothing published) must get the same status, the same bytes and the same headers
from both, and ``/openapi.json`` must be the same document. Then, as a regression for the cost:
a good key read must not go through FastAPI's per-request dependency solving
(``fastapi.routing.solve_dependencies``), which a bad one still does (its 422 is FastAPI's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import fastapi.routing
import httpx
import pytest
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.routing import APIRoute

from batch_layer.recompute.job import run_batch
from deploy.settings import Settings
from serving.api.app import create_app
from serving.api.lean_route import LeanRoute, LeanRouteError
from shared_logic.registry import load_pipeline
from tests.support import ingest_file, key_url, web
from tests.support.servers import ApiServer

READER, INGESTER = "lean-reader-key-0001", "lean-ingest-key-0001"
KEYS = {READER: ["read"], INGESTER: ["ingest"]}
HOURLY, ALL_TIME = "spend_by_user_hourly", "spend_by_user"
#: Headers an answer's meaning depends on (``date`` and ``server`` differ by the second and are left out).
HEADERS = ("content-type", "content-length", "www-authenticate", "retry-after", "allow", "location")

EVENTS: list[dict[str, Any]] = [
    {"user_id": "alice", "merchant": "acme", "amount": 1.5, "event_time": "2024-03-01T09:15:00Z"},
    {"user_id": "alice", "merchant": "globex", "amount": 2.25, "event_time": "2024-03-01T09:59:59.999999Z"},
    {"user_id": "alice", "merchant": "acme", "amount": 1e-7, "event_time": "2024-03-01T11:00:00Z"},
    {"user_id": "bob", "merchant": "hooli", "amount": 8.0, "event_time": "2024-03-01T09:30:00+02:00"},
    {"user_id": "a/b?c d", "merchant": "acme", "amount": 3e16, "event_time": "1969-12-31T23:59:59Z"},
    {"user_id": "zoë ✓", "merchant": "initech", "amount": 0.1, "event_time": "2024-03-01T09:00:00Z"},
]

#: (path, query) pairs asked of both apps; answers that need a published generation say so themselves.
CORPUS: list[tuple[str, Any]] = [
    ("/v1/views", {}),
    *((key_url(ALL_TIME, user), {}) for user in ("alice", "bob", "a/b?c d", "zoë ✓", "nobody", "")),
    (key_url(ALL_TIME, "alice"), {"explain": "true"}),
    (key_url(ALL_TIME, "alice"), {"explain": "1"}),
    (key_url(ALL_TIME, "alice"), {"explain": "perhaps"}),
    (key_url(ALL_TIME, "alice"), {"explain": ""}),
    (key_url(ALL_TIME, "alice"), {"window_start": "1709283600"}),
    (key_url(ALL_TIME, "alice"), {"unknown": "ignored"}),
    (key_url("no_such_view", "alice"), {}),
    (key_url("no_such_view", "alice"), {"window_start": "soon"}),
    (key_url(HOURLY, "alice"), {}),
    (key_url(HOURLY, "alice"), {"window_start": "1709283600"}),
    (key_url(HOURLY, "alice"), {"window_start": "2024-03-01T09:30:00Z", "explain": "yes"}),
    (key_url(HOURLY, "alice"), {"window_start": "2024-03-01T10:30:00+01:00"}),
    (key_url(HOURLY, "alice"), {"window_start": "2024-03-01T09:30:00"}),
    (key_url(HOURLY, "alice"), [("window_start", "soon"), ("window_start", "1709283600")]),
    (key_url(HOURLY, "alice"), [("window_start", "1709283600"), ("window_start", "soon")]),
    (key_url(HOURLY, "alice"), {"window_start": "2024-03-01T12:00:00Z"}),
    (key_url(HOURLY, "alice"), {"from": "2024-03-01T09:00:00Z", "to": "2024-03-01T12:00:00Z"}),
    (key_url(HOURLY, "alice"), {"from": "2024-03-01T09:00:00Z", "to": "2024-03-01T12:00:00Z", "explain": "true"}),
    (key_url(HOURLY, "alice"), {"from": "2024-03-01T09:00:00Z"}),
    (key_url(HOURLY, "alice"), {"from": "2024-03-01T12:00:00Z", "to": "2024-03-01T09:00:00Z"}),
    (key_url(HOURLY, "alice"), {"from": "1709283600", "to": "1709283600.000001"}),
    (key_url(HOURLY, "alice"), {"from": "2000-01-01T00:00:00Z", "to": "2024-03-01T12:00:00Z"}),
    (key_url(HOURLY, "alice"), {"window_start": "1709283600", "from": "1709283600", "to": "1709290800"}),
    (key_url(HOURLY, "alice"), {"window_start": "9999-12-31T23:59:00Z"}),
    (key_url(HOURLY, "alice"), {"window_start": "1e20", "from": "nan", "to": "", "explain": "maybe"}),
    (key_url(HOURLY, "a/b?c d"), {"window_start": "-1"}),
    (key_url(HOURLY, "zoë ✓"), {"window_start": "2024-03-01T09:00:00Z"}),
    (f"/v1/views/{ALL_TIME}/top", {}),
    (f"/v1/views/{ALL_TIME}/top", {"n": "2", "measure": "sum_amount"}),
    (f"/v1/views/{ALL_TIME}/top", {"n": "0"}),
    (f"/v1/views/{ALL_TIME}/top", {"n": "many", "measure": "nope"}),
    (f"/v1/views/{ALL_TIME}/top", {"measure": "nope"}),
    (f"/v1/views/{ALL_TIME}/top", {"measure": "distinct_merchant"}),
    (f"/v1/views/{HOURLY}/top", {"window_start": "2024-03-01T09:00:00Z", "n": "1000"}),
    (f"/v1/views/{HOURLY}/top", {}),
    ("/v1/views/no_such_view/top", {}),
]


def fastapi_twin(app: FastAPI) -> FastAPI:
    """``app`` with its lean routes served as FastAPI alone serves them: declared again, argument for
    argument, on plain ``APIRoute``s of a router that ``include_router`` puts where they were."""
    routes = app.router.routes
    lean = [r for r in routes if isinstance(r, LeanRoute)]
    assert lean, "the app has no lean routes"
    plain = APIRouter()
    for route in lean:
        plain.add_api_route(
            route.path, route.endpoint, response_model=route.response_model, status_code=route.status_code,
            tags=route.tags, dependencies=route.dependencies, summary=route.summary, description=route.description,
            response_description=route.response_description, responses=route.responses,
            deprecated=route.deprecated, methods=route.methods, operation_id=route.operation_id,
            response_model_include=route.response_model_include, response_model_exclude=route.response_model_exclude,
            response_model_by_alias=route.response_model_by_alias,
            response_model_exclude_unset=route.response_model_exclude_unset,
            response_model_exclude_defaults=route.response_model_exclude_defaults,
            response_model_exclude_none=route.response_model_exclude_none, include_in_schema=route.include_in_schema,
            name=route.name, openapi_extra=route.openapi_extra, route_class_override=APIRoute,
        )
    at = routes.index(lean[0])
    routes[:] = [r for r in routes if not isinstance(r, LeanRoute)]
    app.include_router(plain)
    routes.insert(at, routes.pop())
    assert not any(isinstance(r, LeanRoute) for r in app.router.routes)
    return app


@contextmanager
def twins(settings: Settings) -> Iterator[tuple[httpx.Client, httpx.Client]]:
    """HTTP clients of the real app and of its FastAPI twin, both serving ``settings``."""
    apps = [create_app(settings, redis_url=settings.redis_url or ""),
            fastapi_twin(create_app(settings, redis_url=settings.redis_url or ""))]
    with ExitStack() as stack:
        servers = [stack.enter_context(ApiServer(app)) for app in apps]
        yield tuple(stack.enter_context(web.client(base_url=s.base_url, timeout=10)) for s in servers)  # type: ignore[misc]


def same_answers(lean: httpx.Client, plain: httpx.Client, headers: dict[str, str] | None = None) -> list[int]:
    """Ask both apps every request of the corpus; they must answer alike. Returns the statuses."""
    statuses = []
    for path, params in CORPUS:
        a, b = lean.get(path, params=params, headers=headers), plain.get(path, params=params, headers=headers)
        where = f"GET {a.request.url.raw_path.decode()}"
        assert (a.status_code, a.content) == (b.status_code, b.content), where
        assert {h: a.headers.get(h) for h in HEADERS} == {h: b.headers.get(h) for h in HEADERS}, where
        statuses.append(a.status_code)
    return statuses


@pytest.mark.slow  # over 4 s: the full tier (the quick tier has a 3-minute budget)
def test_answers_errors_and_openapi_are_fastapis_own(
    spark: Any, make_settings: Callable[..., Settings], redis_url: str, tmp_path: Path
) -> None:
    settings = make_settings(pipeline="payments")
    with twins(settings) as (lean, plain):
        assert lean.get("/openapi.json").json() == plain.get("/openapi.json").json()
        before = same_answers(lean, plain)  # nothing published: 503 where a read is needed, else 404 / 422
        assert {503, 404, 422} <= set(before) and 200 in before, before
        ingest_file(settings, EVENTS, tmp_path / "payments.jsonl")
        run_batch(spark, settings, load_pipeline("payments"), redis_url=redis_url)
        after = same_answers(lean, plain)
        assert {200, 404, 422} <= set(after) and after.count(200) >= 15, after


@pytest.mark.parametrize(("headers", "expected"), [
    (None, {401}),
    ({"Authorization": "Bearer wrong"}, {401}),
    ({"Authorization": READER}, {401}),
    ({"Authorization": "Basic abc"}, {401}),
    ({"Authorization": f"Bearer {INGESTER}"}, {403}),
    ({"Authorization": f"Bearer {READER}"}, {200, 404, 422, 503}),
])
def test_auth_refusals_are_fastapis_own(headers: dict[str, str] | None, expected: set[int],
                                        make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(pipeline="payments", api_keys=KEYS, http_host="0.0.0.0")
    with twins(settings) as (lean, plain):
        assert set(same_answers(lean, plain, headers)) == expected


def test_good_reads_skip_fastapis_dependency_solving(api: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    solved: list[str] = []
    solve = fastapi.routing.solve_dependencies

    async def counting(*args: Any, **kwargs: Any) -> Any:
        solved.append(kwargs["request"].url.path)
        return await solve(*args, **kwargs)

    monkeypatch.setattr(fastapi.routing, "solve_dependencies", counting)
    with api(pipeline="payments") as server, web.client(base_url=server.base_url, timeout=10) as client:
        assert client.get(key_url(ALL_TIME, "alice")).status_code == 503  # nothing published: the read ran
        assert client.get(key_url(HOURLY, "alice"), params={"window_start": "2024-03-01T09:00:00Z"}).status_code == 503
        assert solved == []
        assert client.get(key_url(HOURLY, "alice"), params={"window_start": "soon"}).status_code == 422
        assert solved == [key_url(HOURLY, "alice")]


def test_included_lean_routes_await_the_inclusions_dependencies(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    solved: list[object] = []

    async def audit(request: Request) -> None:
        seen.append(request.url.path)

    async def counting(*args: Any, **kwargs: Any) -> Any:
        solved.append(kwargs)
        return await solve(*args, **kwargs)

    solve = fastapi.routing.solve_dependencies
    monkeypatch.setattr(fastapi.routing, "solve_dependencies", counting)
    router = APIRouter(route_class=LeanRoute)

    @router.get("/names/{name}", response_model=dict[str, str])
    async def echo(name: str, shout: bool = False) -> dict[str, str]:
        return {"name": name.upper() if shout else name}

    app = FastAPI()
    app.include_router(router, prefix="/v1", dependencies=[Depends(audit)])
    with ApiServer(app) as server, web.client(base_url=server.base_url, timeout=10) as client:
        assert client.get("/v1/names/ada", params={"shout": "on"}).json() == {"name": "ADA"}
        assert (seen, solved) == (["/v1/names/ada"], [])
        assert client.get("/v1/names/ada", params={"shout": "loudly"}).status_code == 422  # FastAPI's own
        assert (len(seen), len(solved)) == (2, 1)  # the fallback solved once and awaited audit again


def test_routes_that_need_more_of_fastapi_are_refused_when_built() -> None:
    router = APIRouter(route_class=LeanRoute)

    def sync_endpoint() -> dict[str, str]:
        return {}

    async def with_header(x_thing: str = fastapi.Header("")) -> dict[str, str]:
        return {}

    async def many(ids: list[int] = fastapi.Query([])) -> dict[str, str]:
        return {}

    for endpoint, problem in ((sync_endpoint, "not an async function"), (with_header, "header"),
                              (many, "sequence")):
        with pytest.raises(LeanRouteError, match=problem):
            router.add_api_route("/x", endpoint, response_model=dict[str, str])
