"""Views: what is served and how fresh, the measures of a key, the top keys."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import Response

from serving.api import key_pages, queries, windows
from serving.api.auth import require
from serving.api.deps import PipelineDep, StoreDep
from serving.api.errors import BadQueryError, NotFoundError
from serving.api.key_export import CSV, NDJSON, export, export_format
from serving.api.lean_route import LeanRoute
from serving.api.models import KeyAnswer, KeyPage, MeasureInfo, TopAnswer, ViewInfo, ViewList, error_responses
from serving.api.times import QueryDuration, QueryTime
from shared_logic.errors import UnknownNameError
from shared_logic.event_values import clip
from shared_logic.pipeline import Pipeline
from shared_logic.sessions import MICROS
from shared_logic.views import SlidingWindow, View

#: Every route reads (scope ``read``, see ``serving.api.auth``). The routes are lean
#: (``serving.api.lean_route``): documented and validated as FastAPI derives them from the declarations
#: below, without FastAPI's per-request dependency solving. They are complete as declared (their scope
#: and its error answers included), so ``create_app`` puts them on the app's own router.
router = APIRouter(
    prefix="/v1/views", tags=["views"], route_class=LeanRoute,
    dependencies=[Depends(require("read"))], responses=error_responses(401, 403),
)

ViewName = Annotated[str, Path(description="View name, as listed by GET /v1/views.")]
_TIME = ("ISO 8601 (`2024-03-01T09:00:00Z`; no offset means UTC), epoch seconds (`1709283600`, at most 6 decimals; "
         "never milliseconds) or relative to now (`now`, `-1h`, `now-15m`, `-1h30m`; units s, m, h, d, w: resolved "
         "once per request, echoed as `now`), from 0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999Z; the panes it "
         "addresses must lie in that range too.")
WindowStart = Annotated[QueryTime, Query(description="Windowed views: the window whose first pane holds this time "
                                                     f"(a tumbling view: the window holding it). {_TIME}")]
WindowEnd = Annotated[QueryTime, Query(description="Windowed views: the window ending at the first pane boundary at "
                                                   "or after this time (its last pane holds the instant before it); "
                                                   f"`window_end=now`: the window ending now. {_TIME}")]
RangeStart = Annotated[QueryTime, Query(alias="from", description="Windowed views: range start (inclusive): every "
                                                                  f"pane overlapping from/to, whole. {_TIME}")]
RangeEnd = Annotated[QueryTime, Query(alias="to", description=f"Windowed views: range end (exclusive); left out: now. {_TIME}")]
Last = Annotated[QueryDuration, Query(description="Windowed views: the range from now minus this duration to now "
                                                  "(`15m`, `1h`, `1h30m`; units s, m, h, d, w).")]
def span_of(request: Request, view: View, asked: windows.TimeParams, *, top: bool = False) -> windows.Span:
    """The panes (a session view: the range) of ``view`` the request addresses, its relative times resolved against
    one clock reading (``serving.api.windows.resolve``, for every kind of view)."""
    settings = request.app.state.settings
    bound, name = ((settings.max_top_panes, "LAMBDA_MAX_TOP_PANES") if top
                   else (settings.max_range_panes, "LAMBDA_MAX_RANGE_PANES"))
    return windows.resolve(view, asked, request.app.state.clock, bound, name)


def view_of(pipeline: Pipeline, name: str) -> View:
    try:
        return pipeline.view(name)
    except UnknownNameError as e:
        raise NotFoundError(str(UnknownNameError(e.kind, clip(e.name), e.known, owner=e.owner))) from e


def _pane_view(pipeline: Pipeline, name: str) -> View:
    """A view whose rows are measures (all time or panes); a session view is a 422 naming its routes."""
    chosen = view_of(pipeline, name)
    if chosen.sessions is not None:
        raise BadQueryError(f"view {chosen.name!r} is a session view: ask GET /v1/views/{chosen.name}/sessions/keys/"
                            f"{{key}}, .../sessions/summary/{{key}} or .../sessions/top")
    return chosen


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
            slide_seconds=view.window.pane_seconds if isinstance(view.window, SlidingWindow) else None,
            session_gap_seconds=view.sessions.gap_micros // MICROS if view.sessions else None,
            max_sessions=view.sessions.max_sessions if view.sessions else None,
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


_EXPORTS: dict[int | str, dict] = {200: {
    "description": "A page of rows (JSON); with `Accept: text/csv` or `Accept: application/x-ndjson`, every row "
                   "matching the filters as a stream.",
    "content": {
        CSV: {"schema": {"type": "string"},
              "example": "word,count\r\nalpha,2\r\nbeta,1\r\n"},
        NDJSON: {"schema": {"type": "string"}, "example": '{"key":"alpha","columns":null,"window":null,"value":{"count":2}}\n'},
    },
}}


@router.get(
    "/{view}/keys", response_model=KeyPage, responses={**_EXPORTS, **error_responses(404, 409, 422, 503)},
    summary="List keys with their merged values (paged by cursor; or export as CSV / NDJSON)",
)
async def list_keys(
    request: Request,
    pipeline: PipelineDep,
    store: StoreDep,
    view: ViewName,
    limit: Annotated[int, Query(ge=1, le=key_pages.MAX_LIMIT, description="Rows per page.")] = key_pages.DEFAULT_LIMIT,
    cursor: Annotated[str | None, Query(max_length=key_pages.MAX_CURSOR_CHARS, pattern=key_pages.CURSOR_PATTERN,
                                        description="`next_cursor` of the previous page, as is (made for the same "
                                                    "filters); leave out for the first page.")] = None,
    prefix: Annotated[str, Query(max_length=queries.MAX_KEY_CHARS,
                                 description="Only keys starting with this (the key as the key route takes it: "
                                             "several key columns joined with '|', '|' and '\\' escaped with '\\').")] = "",
    window_start: WindowStart = None,
    window_end: WindowEnd = None,
    start: RangeStart = None,
    end: RangeEnd = None,
    last: Last = None,
) -> KeyPage | Response:
    """The view's keys with their merged values (batch + realtime, the key route's values), ordered by key
    (the encoded key, bytewise as UTF-8, i.e. by code point). Windowed views need `window_start` or
    `window_end` (one window: a sliding view's is several panes), or `from`/`to` or `last` (the panes a
    range overlaps, whole; relative times as on the key route), and list ONE row per key holding a value
    in any of them: its panes' batch and realtime parts combined with each measure's monoid (distinct
    counts united), exactly what the key route answers for the same parameters; `window` on a row is the
    span its panes cover. The page echoes `window`, `range`, `covered` and `now` as the key route does.

    **Filters**: `prefix=`, and one query parameter per key column of the view, its value
    (`origin=JFK`; a filter on the first key column narrows the read in Redis, on later ones rows are
    examined here). Any other query parameter is a 422 naming the view's key columns.

    **Paging**: keyset pagination by an opaque cursor: a page lists the rows strictly after the
    position its cursor names, so every row that exists when paging begins is listed exactly once,
    even when a new batch generation is published (a flip) or micro-batches commit between pages (a
    view's rows only grow with its version, which never goes back); rows that appear meanwhile are
    listed if they sort after the cursor. Every value of one page is exact as of its `version`
    (read at one generation and realtime version). A page may hold fewer than `limit` rows (a
    selective filter on a later key column: at most 20000 rows are examined per page) and still
    have a `next_cursor`; `next_cursor` is null after the last page. A cursor made for other
    filters, or not made by this route, is a 422; one made before the view was recomputed under
    other logic (a changed pipeline: its rows are another set) is a 409: start over. A key column
    filter, like `prefix`, is at most 2048 characters. Paging works past keys of up to about 9,000
    UTF-8 bytes (a cursor is at most 16384 characters); the export streams every row whatever its key.

    **Export**: with `Accept: text/csv` (header row: the key columns, `window_start` for windowed
    views, the measures) or `Accept: application/x-ndjson` (one row object per line), every row
    matching the filters is streamed, from `cursor` if given (`limit` does not apply), paged inside
    with the same guarantee; each page is at one version, the whole is not one snapshot.
    """
    chosen = _pane_view(pipeline, view)
    asked = windows.TimeParams(window_start, window_end, start, end, last)
    span = span_of(request, chosen, asked)
    listing = key_pages.Listing(chosen, span.panes, prefix, key_pages.column_filters(chosen, request.query_params.multi_items()),
                                relative=repr(asked) if asked.relative else "")
    media = export_format(request.headers.get("accept"))
    if media is not None:
        return await export(store, listing, cursor, media)
    answer = await key_pages.page_answer(store, listing, cursor, limit)
    for name, echoed in queries.spans(span).items():
        setattr(answer, name, echoed)
    return answer


@router.get(
    "/{view}/keys/{key:path}", response_model=KeyAnswer, response_model_exclude_none=True,
    responses=error_responses(404, 422, 503),
    summary="Measures of one key (batch + realtime, exact)",
)
async def get_key(
    request: Request,
    pipeline: PipelineDep,
    store: StoreDep,
    view: ViewName,
    key: Annotated[str, Path(max_length=queries.MAX_KEY_CHARS,
                             description="Key value, URL-encoded ('/' allowed); several key columns are joined with '|'.")],
    window_start: WindowStart = None,
    window_end: WindowEnd = None,
    start: RangeStart = None,
    end: RangeEnd = None,
    last: Last = None,
    explain: Annotated[bool, Query(description="Add the batch part, the realtime part and their versions.")] = False,
) -> KeyAnswer:
    """The measures of ``key``: the served batch generation combined with its realtime segment, exact
    as of ``version``. All-time views need no parameters; windowed views take ``window_start`` or
    ``window_end`` (one window: a sliding view's combines its panes), ``from``/``to`` or ``last`` (the panes
    in the range, combined), and answer each pane's own values too (``windows``).

    A query combines at most `LAMBDA_MAX_RANGE_PANES` panes (default 2000; a top-N over several panes:
    `LAMBDA_MAX_TOP_PANES`, default 288, and n x panes at most `LAMBDA_MAX_TOP_CELLS`, default 28800); more panes,
    `to` before `from`, two ways of naming the time at once or a time that cannot be read is a 422 naming the
    parameter and the fix.
    """
    chosen = _pane_view(pipeline, view)
    span = span_of(request, chosen, windows.TimeParams(window_start, window_end, start, end, last))
    return await queries.key_answer(store, chosen, key, span, explain=explain)


@router.get("/{view}/top", response_model=TopAnswer, response_model_exclude_none=True,
            responses=error_responses(404, 422, 503),
            summary="Top keys by a measure (exact; one window or any range of panes)")
async def get_top(
    request: Request,
    pipeline: PipelineDep,
    store: StoreDep,
    view: ViewName,
    n: Annotated[int, Query(ge=1, le=1000, description="How many keys.")] = 10,
    measure: Annotated[str | None, Query(description="Measure to rank by (default: the view's first scalar measure); "
                                                     "one the view does not have, or an empty one, is a 422 naming them.")] = None,
    window_start: WindowStart = None,
    window_end: WindowEnd = None,
    start: RangeStart = None,
    end: RangeEnd = None,
    last: Last = None,
) -> TopAnswer:
    """The ``n`` keys with the highest merged value of ``measure``, exact: over all time, one window
    (``window_start`` / ``window_end``; a sliding view's combines its panes), or a range (``from``/``to``,
    ``last``: the panes it overlaps, combined). Over several panes a key's value is the monoid combine of
    its batch and realtime parts in every pane, ranked by a threshold merge of the panes' rankings; count,
    sum, min and max rank so (an average is derived, not a monoid: rank by its sum or count; a distinct
    count is never ranked; either is a 422 saying so).

    A query combines at most `LAMBDA_MAX_RANGE_PANES` panes (default 2000; a top-N over several panes:
    `LAMBDA_MAX_TOP_PANES`, default 288, and n x panes at most `LAMBDA_MAX_TOP_CELLS`, default 28800); more panes,
    `to` before `from`, two ways of naming the time at once or a time that cannot be read is a 422 naming the
    parameter and the fix.
    """
    chosen = _pane_view(pipeline, view)
    span = span_of(request, chosen, windows.TimeParams(window_start, window_end, start, end, last), top=True)
    cells = request.app.state.settings.max_top_cells
    if len(span.panes) > 1 and n * len(span.panes) > cells:
        raise BadQueryError(f"n={n} over {len(span.panes)} panes is {n * len(span.panes)} key-panes to rank, more than "
                            f"LAMBDA_MAX_TOP_CELLS={cells}: ask a smaller n or a shorter range (from/to, last)")
    return await queries.top_answer(store, chosen, measure, n, span)
