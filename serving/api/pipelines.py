"""Several pipelines behind one API: ``GET /v1/pipelines`` and ``/v1/pipelines/{pipeline}/...``.

Each pipeline of a deployment has an application of its own (what ``create_app`` builds for one
pipeline: its store, run registry, ingest queue, master clock and metrics), so pipelines share
nothing but the process. The deployment's application is the default (first) pipeline's, whose
un-prefixed routes answer as they always did. ``PipelineRoutes`` sends
``/v1/pipelines/{name}/REST`` to pipeline ``name``'s application as ``/v1/REST`` (and
``.../metrics`` as ``/metrics``): every per-pipeline route exists under the prefix with the same
validation, auth, answers and errors. A name the deployment does not run reaches the default
application unchanged, where a catch-all route answers 404 naming the pipelines it runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI, Request
from starlette.types import ASGIApp, Receive, Scope, Send

from serving.api.auth import require
from serving.api.errors import NotFoundError
from serving.api.models import PipelineInfo, PipelineList, error_responses
from shared_logic.errors import UnknownNameError

PREFIX = "/v1/pipelines"
#: Where ``PipelineRoutes`` records the prefix a request came through (for links in answers).
_SCOPE_KEY = "lambda.pipeline_prefix"

router = APIRouter(tags=["pipelines"], dependencies=[Depends(require("read"))],
                   responses=error_responses(401, 403))


def public_path(request: Request, path: str) -> str:
    """``path`` (a ``/v1/...`` route path) as the client addresses it: under the pipeline prefix the
    request came through, if any (a ``Location`` header must lead back to the same pipeline)."""
    prefix = request.scope.get(_SCOPE_KEY)
    return f"{prefix}{path.removeprefix('/v1')}" if prefix else path


class PipelineRoutes:
    """ASGI middleware of the default pipeline's app: ``/v1/pipelines/{name}/...`` to ``name``'s app."""

    def __init__(self, app: ASGIApp, *, default: str, others: Mapping[str, ASGIApp]) -> None:
        self.app, self.default, self.others = app, default, others

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith(PREFIX + "/"):
            await self.app(scope, receive, send)
            return
        name, _, rest = path[len(PREFIX) + 1:].partition("/")
        target = self.app if name == self.default else self.others.get(name)
        if target is None or not rest:  # unknown pipeline, or the bare prefix: the catch-all route answers
            await self.app(scope, receive, send)
            return
        prefix = f"{PREFIX}/{name}"
        inner = "/metrics" if rest == "metrics" else f"/v1/{rest}"
        raw: bytes = scope.get("raw_path") or path.encode()
        raw_prefix = prefix.encode() + b"/"
        raw_inner = (b"/v1/" + raw[len(raw_prefix):]) if raw.startswith(raw_prefix) else inner.encode()
        await target({**scope, "path": inner, "raw_path": raw_inner, _SCOPE_KEY: prefix}, receive, send)


@router.get("/v1/pipelines", response_model=PipelineList, summary="The pipelines this deployment runs",
            responses=error_responses(503))
async def list_pipelines(request: Request) -> PipelineList:
    """Every pipeline: its views, its logic, its served generation, and where its routes are. The
    un-prefixed routes (`/v1/views`, `/v1/events`, `/v1/batch/runs`) answer for the default one;
    every one of them is also at `/v1/pipelines/{pipeline}/...` (`/v1/pipelines/payments/views`)."""
    apps: Mapping[str, FastAPI] = request.app.state.pipeline_apps
    infos = []
    for name, app in apps.items():
        served = await app.state.store.generation()
        infos.append(PipelineInfo(
            name=name, default=app is request.app, url=f"{PREFIX}/{name}",
            views=[view.name for view in app.state.pipeline.views], logic=app.state.pipeline.logic,
            generation=served.generation if served else None, version=served.version if served else None,
        ))
    return PipelineList(pipelines=infos)


@router.api_route(PREFIX + "/{pipeline}{rest:path}", methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"],
                  include_in_schema=False)
async def unknown_pipeline(request: Request, pipeline: str) -> None:
    """Reached by a name the deployment does not run, or a pipeline's bare prefix (``PipelineRoutes``
    takes every other path)."""
    if pipeline in request.app.state.pipeline_apps:
        raise NotFoundError(f"{request.url.path} is no route: pipeline {pipeline}'s routes are "
                            f"{PREFIX}/{pipeline}/views, .../events and .../batch/runs")
    raise UnknownNameError("pipeline", pipeline, list(request.app.state.pipeline_apps), owner="this deployment")


def mount_pipelines(app: FastAPI, default: str, others: Mapping[str, FastAPI]) -> None:
    """Give ``app`` (the default pipeline's) the pipelines routes and the other pipelines' apps.

    Call it before the app starts; its lifespan then starts and stops the others' too."""
    app.state.pipeline_apps = {default: app, **others}
    app.include_router(router)
    app.add_middleware(PipelineRoutes, default=default, others=others)
    own = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            for other in others.values():
                await stack.enter_async_context(other.router.lifespan_context(other))
            async with own(app):
                yield

    app.router.lifespan_context = lifespan
