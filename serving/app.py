"""The FastAPI application: ``create_app(settings)`` builds it; ``serve`` runs it under uvicorn."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import Depends, FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from fastapi.responses import JSONResponse

from batch_layer.runs import RunRegistry
from serving.auth import require
from serving.errors import ServingError
from serving.freshness import MasterClock
from serving.metrics import install_metrics
from serving.routes import batch, events, health, views
from serving.store import ServingStore
from shared_logic.errors import SharedLogicError, UnknownNameError
from shared_logic.registry import load_pipeline

if TYPE_CHECKING:
    from deploy.settings import Settings

log = logging.getLogger(__name__)

DESCRIPTION = """
Exact merged views of a Lambda-architecture platform.

Every answer is computed from monoid parts of the served batch generation (and, with a speed
layer running, its realtime segment), read from Redis in one atomic step. `version` in an
answer is the master-dataset version it is exact for. When the platform cannot answer
correctly it says so: 503 with the reason.
"""


def _error(status: int, exc: Exception, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": type(exc).__name__, "detail": str(exc)}, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """The one place exceptions become HTTP answers."""

    @app.exception_handler(ServingError)
    async def _serving(_: Request, exc: ServingError) -> JSONResponse:
        if exc.status >= 500:
            log.warning("answering %d: %s", exc.status, exc)
        return _error(exc.status, exc, exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Auth refusals and unknown routes answer in the same shape as every other error.
        name = {401: "Unauthorized", 403: "Forbidden", 404: "NotFoundError"}.get(exc.status_code, "HTTPError")
        return JSONResponse(status_code=exc.status_code, content={"error": name, "detail": str(exc.detail)},
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(UnknownNameError)
    async def _unknown(_: Request, exc: UnknownNameError) -> JSONResponse:
        return _error(404, exc)

    @app.exception_handler(SharedLogicError)
    async def _logic(_: Request, exc: SharedLogicError) -> JSONResponse:
        return _error(422, exc)


def create_app(settings: Settings, *, redis_url: str) -> FastAPI:
    """The API for ``settings.pipeline``, reading from the Redis at ``redis_url``."""
    pipeline = load_pipeline(settings.pipeline)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.store = ServingStore(redis_url, pipeline.name)
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
    )
    app.state.pipeline = pipeline
    app.state.settings = settings
    app.state.master_clock = MasterClock(settings.master_path)
    install_error_handlers(app)
    install_metrics(app)
    app.include_router(views.router, dependencies=[Depends(require("read"))])
    app.include_router(events.router, dependencies=[Depends(require("ingest"))])
    app.include_router(batch.router, dependencies=[Depends(require("admin"))])
    app.include_router(health.router)
    return app
