"""The FastAPI application: ``create_app(settings)`` builds it; ``serve`` runs it under uvicorn."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from batch_layer.errors import SchemaChangeError
from batch_layer.master.dataset import MasterDataset
from batch_layer.master.dead_letters import DeadLetters
from serving.api.auth import require
from serving.api.clock import Clock, SystemClock
from serving.api.console import install_console
from serving.api.docs import install_docs
from serving.api.errors import BadQueryError, ConfigurationError, ServingError, UnavailableError
from serving.api.freshness import MasterClock
from serving.api.metrics import install_metrics
from serving.api.models import error_responses
from serving.api.openapi import document_server
from serving.api.pipelines import mount_pipelines
from serving.api.routes import batch, dead_letters, events, health, sessions, views
from serving.store.errors import StoreUnavailableError
from serving.store.reader import ServingStore
from serving.store.runs import RunRegistry
from serving.store.session_reads import SessionReads, TopTooLargeError
from shared_logic.errors import SharedLogicError, UnknownNameError
from shared_logic.event_values import ECHO_LIMIT, clip, echo
from shared_logic.registry import load_pipeline

if TYPE_CHECKING:
    from serving.api.config import ApiConfig

log = logging.getLogger(__name__)

DESCRIPTION = """
Exact merged views of a Lambda-architecture platform.

Every answer is computed from monoid parts of the served batch generation (and, with a speed
layer running, its realtime segment), read from Redis in one atomic step. `version` in an
answer is the master-dataset version it is exact for. When the platform cannot answer
correctly it says so: 503 with the reason.

**Auth.** API keys from `LAMBDA_API_KEYS`, sent as `Authorization: Bearer <key>`, each with
scopes. `read`: the views (`GET /v1/views...`) and the batch runs (`GET /v1/batch/runs`,
`GET /v1/batch/runs/{run_id}`) and the dead letters (`GET /v1/dead-letters`); reads need no key while the server binds to a loopback address
(127.0.0.1, ::1, localhost). `ingest`: `POST /v1/events`. `admin`: `POST /v1/batch/runs`.
`/healthz`, `/readyz`, `/metrics`, `/docs`, `/openapi.json` and the web console's page
(`/console`) are open. No key, or an unknown
one: 401; a key without the scope: 403.

**Times** in `window_start`, `from` and `to` are ISO 8601 (`2024-03-01T09:00:00Z`; no offset
means UTC) or epoch seconds (`1709283600`, at most 6 decimals; always seconds, never
milliseconds; no exponent, `nan` or `inf`). Event and query times lie from
0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999Z (in UTC); a window a query addresses must
lie in that range too. Out of range or malformed: 422 naming the parameter.

**Errors** are JSON `{"error": <class>, "detail": <what is wrong and what to do>}`, for every
status, including malformed parameters (422, naming each parameter) and malformed JSON bodies
(400). A detail quotes at most 100 characters of a value sent (cut ones end with "…"). A key, a
`prefix` or a key column filter is at most 2048 characters, a cursor at most 16384, a time at most
64 (422 above); the server reads URLs up to 65535 bytes. `OPTIONS` on any route answers 204 with `Allow`; a method a route does not take, 405 with
`Allow`.

**Several pipelines.** A deployment may run several pipelines (`GET /v1/pipelines` lists them).
The routes below answer for the default one; every one of them is also at
`/v1/pipelines/{pipeline}/...` for each pipeline (`/v1/pipelines/payments/views`), with the same
parameters and answers. An unknown pipeline: 404 naming the known ones.

**Integers stay integers:** counts, and sums, minima and maxima over an integer column, are
JSON integers.
"""


def _error(status: int, exc: Exception, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": type(exc).__name__, "detail": str(exc)}, headers=headers)


_PLACES = {"query": "query parameter", "path": "path parameter", "header": "header", "cookie": "cookie"}


def _problem(error: dict) -> str:
    """One FastAPI validation error as a person reads it: where (parameter or body field), what is wrong."""
    place, *rest = error.get("loc") or ("request",)
    name = ".".join(str(part) for part in rest)
    if place == "body":
        where = f"body field {name!r}" if name else "the body"
    else:
        where = f"{_PLACES.get(place, place)} {name!r}"
    message = error.get("msg", "is invalid")
    if place != "body" and error.get("type") not in ("missing", "time") and "input" in error:
        sent = error["input"]
        message += f" (got {echo(sent) if isinstance(sent, str) else clip(repr(sent))})"
    return f"{where}: {message}"


#: Methods a route may take (OPTIONS is answered for every route by ``AnswerOptions``).
_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def allowed_methods(app: ASGIApp, scope: Scope) -> list[str]:
    """The methods some route of ``app`` takes at ``scope``'s path, plus OPTIONS; [] when no route has
    the path. Asked of the routes themselves (each method in turn), so included routers count too."""
    routes = getattr(app, "routes", ())
    methods = [m for m in _METHODS if any(r.matches({**scope, "method": m})[0] == Match.FULL for r in routes)]
    return [*methods, "OPTIONS"] if methods else []


class AnswerOptions:
    """ASGI middleware: ``OPTIONS`` on a route's path answers 204 with ``Allow`` (every method of every
    route with that path), without auth; other requests pass through."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "OPTIONS":
            allowed = allowed_methods(scope["app"], scope)
            if allowed:
                await Response(status_code=204, headers={"Allow": ", ".join(allowed)})(scope, receive, send)
                return
        await self.app(scope, receive, send)


def install_error_handlers(app: FastAPI) -> None:
    """The one place exceptions become HTTP answers: every answer is ``{"error", "detail"}`` (ErrorBody)."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        malformed = [e for e in errors if e.get("type") == "json_invalid"]
        if malformed:
            error, position = malformed[0], (malformed[0].get("loc") or ("body", "?"))[-1]
            problem = (error.get("ctx") or {}).get("error") or error.get("msg")
            return JSONResponse(status_code=400, content={
                "error": "BadRequestError", "detail": f"malformed JSON body: {problem} at character {position}"})
        detail = "; ".join(_problem(e) for e in errors) or "the request does not fit this route"
        if errors and all((e.get("loc") or ("",))[0] == "header" for e in errors):
            return JSONResponse(status_code=400, content={"error": "BadRequestError", "detail": detail})
        return JSONResponse(status_code=422, content={"error": "RequestValidationError", "detail": detail})

    @app.exception_handler(ServingError)
    async def _serving(_: Request, exc: ServingError) -> JSONResponse:
        if exc.status >= 500:
            log.warning("answering %d: %s", exc.status, exc)
        return _error(exc.status, exc, exc.headers)

    @app.exception_handler(StoreUnavailableError)
    async def _store_unavailable(request: Request, exc: StoreUnavailableError) -> JSONResponse:
        return await _serving(request, UnavailableError.from_store(exc))

    @app.exception_handler(TopTooLargeError)
    async def _top_too_large(request: Request, exc: TopTooLargeError) -> JSONResponse:
        return await _serving(request, BadQueryError(str(exc)))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Auth refusals and unknown routes answer in the same shape as every other error.
        name = {400: "BadRequestError", 401: "Unauthorized", 403: "Forbidden", 404: "NotFoundError",
                405: "MethodNotAllowed"}.get(exc.status_code, "HTTPError")
        headers = dict(getattr(exc, "headers", None) or {})
        detail = str(exc.detail)
        if exc.status_code == 400 and detail == "There was an error parsing the body":  # FastAPI's own words
            detail = "the body could not be read as JSON (malformed, or nested too deeply): send a JSON object"
        if exc.status_code == 405:  # Allow: every method of the path, not only the first route's
            allowed = allowed_methods(request.app, request.scope)
            headers["Allow"] = ", ".join(allowed)
            detail = f"{request.method} is not a method of {clip(request.url.path)}; use one of {', '.join(allowed)}"
        return JSONResponse(status_code=exc.status_code, content={"error": name, "detail": detail},
                            headers=headers or None)

    @app.exception_handler(UnknownNameError)
    async def _unknown(_: Request, exc: UnknownNameError) -> JSONResponse:
        if len(exc.name) > ECHO_LIMIT:  # the name as sent, cut (the known names are the server's own)
            exc = UnknownNameError(exc.kind, clip(exc.name), exc.known, owner=exc.owner)
        return _error(404, exc)

    @app.exception_handler(SharedLogicError)
    async def _logic(_: Request, exc: SharedLogicError) -> JSONResponse:
        return _error(422, exc)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        # Starlette logs the exception with its traceback after this answer; the client gets the same shape.
        return JSONResponse(status_code=500, content={
            "error": "InternalServerError",
            "detail": f"{request.method} {clip(request.url.path)} failed unexpectedly ({type(exc).__name__}); "
                      "the server log has the details",
        })


def create_app(settings: ApiConfig, *, redis_url: str, clock: Clock | None = None) -> FastAPI:
    """The API of every pipeline of ``settings`` (the default one un-prefixed, each one under
    ``/v1/pipelines/{name}``, see ``serving.api.pipelines``), reading from the Redis at ``redis_url``.
    ``clock``: what relative times in queries are resolved against (default: the machine's)."""
    names = settings.pipeline_names
    clock = clock or SystemClock()
    apps = [_pipeline_app(settings.for_pipeline(name), redis_url=redis_url, clock=clock) for name in names]
    default, *others = apps
    by_name = {app.state.pipeline.name: app for app in others}
    if len({app.state.pipeline.name for app in apps}) != len(apps):
        raise ConfigurationError(f"two pipelines of {', '.join(names)} have the same name; each needs its own")
    mount_pipelines(default, default.state.pipeline.name, by_name)
    return default


def _pipeline_app(settings: ApiConfig, *, redis_url: str, clock: Clock) -> FastAPI:
    """The API of pipeline ``settings.pipeline`` alone."""
    pipeline = load_pipeline(settings.pipeline)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Refuse at start an event model the master dataset cannot follow (SchemaChangeError names the
        # fields); a new optional field's column is added by the first ingest (MasterDataset.ensure).
        try:
            await asyncio.to_thread(MasterDataset.open(settings, pipeline).check_schema)
        except SchemaChangeError:
            raise
        except Exception as e:  # an unreadable master is answered per request (ingest, freshness), as before
            log.warning("cannot read the master dataset's schema at start (%s)", e)
        app.state.store = ServingStore(redis_url, pipeline.name, {view.name: repr(view) for view in pipeline.views},
                                       top_budget=settings.top_call_budget)
        # The session routes' reads over that store (made once: registering their scripts hashes them).
        app.state.session_reads = SessionReads(app.state.store, settings.max_session_top_keys,
                                               settings.session_top_bytes)
        app.state.batch_runs = RunRegistry.from_url(redis_url, pipeline.name, fail_fast=True)
        try:
            yield
        finally:
            await app.state.store.close()
            app.state.batch_runs.close()

    app = FastAPI(
        title=f"Lambda platform: {pipeline.name}",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # served offline by serving.api.docs
        redoc_url=None,
        swagger_ui_oauth2_redirect_url=None,
    )
    app.state.pipeline = pipeline
    app.state.settings = settings
    app.state.master_clock = MasterClock(settings.master_uri)
    app.state.clock = clock
    # Settings name the dead-letter table (an ApiConfig of a test or embedding may not: the route says so).
    app.state.dead_letters = DeadLetters.open(settings, pipeline.name)
    install_error_handlers(app)
    install_metrics(app)
    app.add_middleware(AnswerOptions)
    protected = error_responses(401, 403)
    # The key read is the hot path: its routes go first on the app's own router, matched once per
    # request, not behind include_router's indirection (FastAPI >= 0.16x matches an included router's
    # routes twice per request); they carry their scope and its error answers themselves. (/metrics,
    # already there, is not in the OpenAPI document, so the document's order is unchanged.)
    app.router.routes[0:0] = views.router.routes
    app.include_router(events.router, dependencies=[Depends(require("ingest"))], responses=protected)
    app.include_router(batch.router, responses=protected)  # each route names its scope (read or admin)
    app.include_router(dead_letters.router, responses=protected)  # scope read
    app.include_router(sessions.router)  # scope read (on the router)
    app.include_router(health.router)
    install_docs(app)
    install_console(app)
    document_server(app, pipeline, settings.http_host)
    return app
