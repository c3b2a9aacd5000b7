"""Views: what is served and how fresh, the measures of a key, the top keys."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request

from serving.api import queries
from serving.api.auth import require
from serving.api.deps import PipelineDep, StoreDep
from serving.api.errors import NotFoundError
from serving.api.lean_route import LeanRoute
from serving.api.models import KeyAnswer, MeasureInfo, TopAnswer, ViewInfo, ViewList, error_responses
from serving.api.times import QueryTime
from shared_logic.errors import UnknownNameError
from shared_logic.pipeline import Pipeline
from shared_logic.views import View

#: Every route reads (scope ``read``, see ``serving.api.auth``). The routes are lean
#: (``serving.api.lean_route``): documented and validated as FastAPI derives them from the declarations
#: below, without FastAPI's per-request dependency solving. They are complete as declared (their scope
#: and its error answers included), so ``create_app`` puts them on the app's own router.
router = APIRouter(
    prefix="/v1/views", tags=["views"], route_class=LeanRoute,
    dependencies=[Depends(require("read"))], responses=error_responses(401, 403),
)

ViewName = Annotated[str, Path(description="View name, as listed by GET /v1/views.")]
_TIME = ("ISO 8601 (`2024-03-01T09:00:00Z`; no offset means UTC) or epoch seconds (`1709283600`, at most 6 "
         "decimals; never milliseconds), from 0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999Z; the windows it "
         "addresses must lie in that range too.")
WindowStart = Annotated[QueryTime, Query(description=f"Windowed views: a time inside the window wanted. {_TIME}")]


def _view(pipeline: Pipeline, name: str) -> View:
    try:
        return pipeline.view(name)
    except UnknownNameError as e:
        raise NotFoundError(str(e)) from e


@router.get("", response_model=ViewList, summary="List views and their freshness", responses=error_responses(503))
async def list_views(request: Request, pipeline: PipelineDep, store: StoreDep) -> ViewList:
    """Every view: keys, measures, window; the served generation; how far behind the master dataset it is."""
    served = await store.generation()
    speed = await store.speed_status()
    fresh = await request.app.state.master_clock.freshness(speed.processed, served.generation if served else None)
    views = [
        ViewInfo(
            name=view.name,
            description=view.description,
            keys=list(view.keys),
            measures=[MeasureInfo(name=m.name, kind=m.kind, column=m.column) for m in view.measures],
            derived=[d.name for d in view.derived],
            window_seconds=view.window.seconds if view.window else None,
            generation=served.generation if served else None,
            version=served.version if served else None,
            computed_at=datetime.fromtimestamp(served.computed_at, tz=timezone.utc)
            if served and served.computed_at else None,
            rows=served.rows.get(view.name) if served else None,
            pending=served is not None and view.name not in served.rows,
        )
        for view in pipeline.views
    ]
    return ViewList(
        pipeline=pipeline.name, views=views, latest_version=fresh.latest_version,
        processed_version=fresh.processed_version, lag_versions=fresh.lag_versions, lag_seconds=fresh.lag_seconds,
        logic=pipeline.logic, served_logic=served.logic if served else None,
        pending_logic=pipeline.logic if served is not None and served.logic != pipeline.logic else None,
    )


@router.get(
    "/{view}/keys/{key:path}", response_model=KeyAnswer, response_model_exclude_none=True,
    responses=error_responses(404, 422, 503),
    summary="Measures of one key (batch + realtime, exact)",
)
async def get_key(
    pipeline: PipelineDep,
    store: StoreDep,
    view: ViewName,
    key: Annotated[str, Path(description="Key value, URL-encoded ('/' allowed); several key columns are joined with '|'.")],
    window_start: WindowStart = None,
    start: Annotated[QueryTime, Query(alias="from", description=f"Windowed views: range start (inclusive). {_TIME}")] = None,
    end: Annotated[QueryTime, Query(alias="to", description=f"Windowed views: range end (exclusive). {_TIME}")] = None,
    explain: Annotated[bool, Query(description="Add the batch part, the realtime part and their versions.")] = False,
) -> KeyAnswer:
    """The measures of ``key``: the served batch generation combined with its realtime segment, exact
    as of ``version``. All-time views need no parameters; windowed views take ``window_start`` (one
    window) or ``from``/``to`` (the windows in the range, combined, plus each window's own values).
    """
    return await queries.key_answer(
        store, _view(pipeline, view), key, window_start=window_start, start=start, end=end, explain=explain
    )


@router.get("/{view}/top", response_model=TopAnswer, response_model_exclude_none=True,
            responses=error_responses(404, 422, 503),
            summary="Top keys by a measure (exact)")
async def get_top(
    pipeline: PipelineDep,
    store: StoreDep,
    view: ViewName,
    n: Annotated[int, Query(ge=1, le=1000, description="How many keys.")] = 10,
    measure: Annotated[str | None, Query(description="Measure to rank by (default: the view's first).")] = None,
    window_start: WindowStart = None,
) -> TopAnswer:
    """The ``n`` keys with the highest merged value of ``measure`` (windowed views: in one window)."""
    return await queries.top_answer(store, _view(pipeline, view), measure, n, window_start)
