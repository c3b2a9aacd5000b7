"""Views: what is served, and the measures of a key."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated

from fastapi import APIRouter, Path, Query

from serving import queries
from serving.deps import PipelineDep, StoreDep
from serving.errors import NotFoundError
from serving.models import ERROR_RESPONSES, KeyAnswer, MeasureInfo, ViewInfo, ViewList
from shared_logic.errors import UnknownNameError
from shared_logic.pipeline import Pipeline
from shared_logic.views import View

router = APIRouter(prefix="/v1/views", tags=["views"])


def _view(pipeline: Pipeline, name: str) -> View:
    try:
        return pipeline.view(name)
    except UnknownNameError as e:
        raise NotFoundError(str(e)) from e


@router.get("", response_model=ViewList, summary="List views and their freshness")
async def list_views(pipeline: PipelineDep, store: StoreDep) -> ViewList:
    """Every view of the pipeline: keys, measures, window, and the served batch generation."""
    served = await store.generation()
    views = []
    for view in pipeline.views:
        views.append(
            ViewInfo(
                name=view.name,
                description=view.description,
                keys=list(view.keys),
                measures=[MeasureInfo(name=m.name, kind=m.kind, column=m.column) for m in view.measures],
                derived=[d.name for d in view.derived],
                window_seconds=view.window.seconds if view.window else None,
                generation=served.generation if served else None,
                version=served.generation if served else None,
                computed_at=datetime.fromtimestamp(served.computed_at, tz=timezone.utc)
                if served and served.computed_at
                else None,
                rows=(served.rows or {}).get(view.name) if served else None,
            )
        )
    return ViewList(pipeline=pipeline.name, views=views)


@router.get(
    "/{view}/keys/{key}",
    response_model=KeyAnswer,
    response_model_exclude_none=True,
    responses=ERROR_RESPONSES,
    summary="Measures of one key",
)
async def get_key(
    pipeline: PipelineDep,
    store: StoreDep,
    view: Annotated[str, Path(description="View name, as listed by GET /v1/views.")],
    key: Annotated[str, Path(description="Key value; several key columns are joined with '|'.")],
    window_start: Annotated[
        datetime | None, Query(description="Windowed views: a time inside the window wanted (ISO 8601 or epoch s).")
    ] = None,
    start: Annotated[datetime | None, Query(alias="from", description="Windowed views: range start (inclusive).")] = None,
    end: Annotated[datetime | None, Query(alias="to", description="Windowed views: range end (exclusive).")] = None,
) -> KeyAnswer:
    """The measures of ``key``, exact as of the version in the answer.

    All-time views need no parameters. Windowed views take ``window_start`` (one window) or
    ``from``/``to`` (the windows in the range, combined, plus each window's own values).
    """
    return await queries.key_answer(store, _view(pipeline, view), key, window_start=window_start, start=start, end=end)
