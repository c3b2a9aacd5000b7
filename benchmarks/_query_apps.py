"""The two servers of the query benchmark besides the platform itself: B, a bare FastAPI endpoint doing
one Redis read, and A's app with what-if changes made in memory only (product files untouched)."""

from __future__ import annotations

import json
import os
from contextlib import asynccontextmanager
from typing import Any

from _harness import HOST
from _query_data import PIPELINE, VIEW


def bare_app(redis_url: str | None = None, pipeline: str = PIPELINE, view: str = VIEW):
    """A bare FastAPI app: ``GET /bare/{key}`` = one HGET of the key's row in the served generation.

    The generation pointer is read once at startup (the bare endpoint does one Redis read per
    request). The Redis client has the options ``serving.store.reader.ServingStore`` uses.
    """
    from fastapi import FastAPI, HTTPException

    from serving.store.connection import async_redis_client
    from serving.store.generation_meta import measures_field
    from serving.store.keys import Keys

    url = redis_url or os.environ["BENCH_REDIS_URL"]
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        client, keys = async_redis_client(url), Keys(pipeline)
        generation = await client.get(keys.current)
        if generation is None:
            raise RuntimeError("no generation is published")
        layout = await client.hget(keys.meta(int(generation)), measures_field(view))
        state["client"], state["rows"] = client, keys.rows(int(generation), view)
        state["count"] = json.loads(layout).index("count")
        try:
            yield
        finally:
            await client.aclose()

    app = FastAPI(title="bare", lifespan=lifespan)

    @app.get("/bare/{key}")
    async def bare(key: str) -> dict[str, Any]:
        row = await state["client"].hget(state["rows"], key)
        if row is None:
            raise HTTPException(404, f"key {key!r} not found")
        return {"key": key, "count": int(json.loads(row)[state["count"]])}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def serve_bare(port: int, redis_url: str) -> None:
    import uvicorn

    # the same call as deploy.cli's _serve
    uvicorn.run(bare_app(redis_url), host=HOST, port=port, log_level="info", access_log=False)


def serve_what_if() -> None:
    """A's server as ``deploy.cli serve`` runs it (settings from the environment), with ``what_if``
    applied to the app in memory: async dependencies, and A's answer on a plain Starlette route."""
    import uvicorn

    from deploy.settings import load_settings
    from serving.api.app import create_app

    settings = load_settings()
    app = create_app(settings, redis_url=settings.redis_url)  # type: ignore[arg-type]
    what_if(app)
    uvicorn.run(app, host=settings.http_host, port=settings.http_port, log_level="info", access_log=False)


def what_if(app: Any) -> int:
    """In memory only: make A's sync dependencies (serving.api.deps.get_store / get_pipeline) async on
    ``app``'s routes, and add a plain Starlette route doing A's answer, at ``/fast/{view}/keys/{key}``."""
    from fastapi import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from serving.api import deps, queries

    async def get_store(request: Request) -> Any:
        return request.app.state.store

    async def get_pipeline(request: Request) -> Any:
        return request.app.state.pipeline

    swap = {deps.get_store: get_store, deps.get_pipeline: get_pipeline}
    swapped = 0

    def walk(dependant: Any) -> None:
        nonlocal swapped
        if dependant.call in swap:
            dependant.call = swap[dependant.call]
            swapped += 1
        for sub in dependant.dependencies:
            walk(sub)

    def routes(items: list[Any]) -> None:
        for route in items:
            if getattr(route, "dependant", None) is not None:
                walk(route.dependant)
            for built in ("effective_candidates", "effective_low_priority_routes"):  # FastAPI's included routers
                if callable(getattr(route, built, None)):
                    routes(getattr(route, built)())

    routes(app.routes)

    async def fast(request: Any) -> Response:
        state, params = request.app.state, request.path_params
        view = state.pipeline.view(params["view"])
        answer = await queries.key_answer(state.store, view, params["key"])
        return Response(answer.model_dump_json(exclude_none=True), media_type="application/json")

    app.router.routes.insert(0, Route("/fast/{view}/keys/{key:path}", fast, methods=["GET"]))
    return swapped

