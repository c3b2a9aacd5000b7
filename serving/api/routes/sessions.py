"""Session views over HTTP: a key's sessions in a range, its summary, the top keys by session count or longest
session. Each answer is merged from one atomic read by the one session merge (``serving.api.session_answers``)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Query, Request

from serving.api import queries, session_answers
from serving.api.auth import require
from serving.api.deps import PipelineDep
from serving.api.lean_route import LeanRoute
from serving.api.models import error_responses
from serving.api.routes.views import ViewName, span_of, view_of
from serving.api.session_models import SessionsAnswer, SessionSummary, SessionTopAnswer
from serving.api.times import QueryDuration, QueryTime
from serving.api.windows import Span, TimeParams
from serving.store.session_reads import SessionReads
from shared_logic.pipeline import Pipeline
from shared_logic.views import View

router = APIRouter(
    prefix="/v1/views", tags=["sessions"], route_class=LeanRoute,
    dependencies=[Depends(require("read"))], responses=error_responses(401, 403),
)

SessionKey = Annotated[str, Path(max_length=queries.MAX_KEY_CHARS,
                                 description="Key value, URL-encoded ('/' allowed); several key columns joined with '|'.")]
_TIME = ("ISO 8601 (`2024-03-01T09:00:00Z`), epoch seconds or relative to now (`now`, `-1h`, `now-15m`; resolved "
         "once per request, echoed as `now`).")
RangeStart = Annotated[QueryTime, Query(alias="from", description="Range start (inclusive): sessions overlapping "
                                                                  f"from/to count, whole; no range: all time. {_TIME}")]
RangeEnd = Annotated[QueryTime, Query(alias="to", description=f"Range end (exclusive); left out: now (given, it needs "
                                                              f"`from`). {_TIME}")]
Last = Annotated[QueryDuration, Query(description="The range from now minus this duration to now (`15m`, `1h`).")]


def _reads(request: Request) -> SessionReads:
    """The app's session reads over its store (made with the store, in the app's lifespan)."""
    reads: SessionReads = request.app.state.session_reads
    return reads


def _asked(request: Request, pipeline: Pipeline, name: str, start: RangeStart, end: RangeEnd,
           last: Last) -> tuple[View, Span]:
    """The session view named (a view of another kind: a 422 naming its routes, before its times are read) and the
    range asked, resolved as every route resolves one (``serving.api.windows.resolve``)."""
    chosen = view_of(pipeline, name)
    session_answers.session_window(chosen)
    return chosen, span_of(request, chosen, TimeParams(start=start, end=end, last=last))


@router.get("/{view}/sessions/keys/{key:path}", response_model=SessionsAnswer, response_model_exclude_none=True,
            responses=error_responses(404, 422, 503), summary="A key's sessions in a range (session views, exact)")
async def key_sessions(request: Request, pipeline: PipelineDep, view: ViewName, key: SessionKey,
                       start: RangeStart = None, end: RangeEnd = None, last: Last = None) -> SessionsAnswer:
    """The key's sessions (maximal runs of its events no more than the view's gap apart) that overlap the range,
    oldest first, each with its start, end, duration and the view's measures: the batch generation's sessions
    and the realtime segment's merged by the one session merge, exact at `version` (a late event that extends
    or bridges sessions across the batch/speed boundary is merged in). Sessions folded past the view's
    `max_sessions` are in `folded`; `exact` is false when they touch the range."""
    chosen, asked = _asked(request, pipeline, view, start, end, last)
    return await session_answers.key_sessions(_reads(request), chosen, key, asked)


@router.get("/{view}/sessions/summary/{key:path}", response_model=SessionSummary, response_model_exclude_none=True,
            responses=error_responses(404, 422, 503), summary="A key's session summary (count, total and mean duration)")
async def key_summary(request: Request, pipeline: PipelineDep, view: ViewName, key: SessionKey,
                      start: RangeStart = None, end: RangeEnd = None, last: Last = None) -> SessionSummary:
    """How many of the key's sessions overlap the range, their total, mean and longest duration (seconds), at
    `version`. Folded sessions count when their whole span lies in the range; `exact` says when they touch it
    otherwise."""
    chosen, asked = _asked(request, pipeline, view, start, end, last)
    return await session_answers.key_summary(_reads(request), chosen, key, asked)


@router.get("/{view}/sessions/top", response_model=SessionTopAnswer, response_model_exclude_none=True,
            responses=error_responses(404, 422, 503), summary="Top keys by session count or longest session (exact)")
async def top_keys(
    request: Request, pipeline: PipelineDep, view: ViewName,
    by: Annotated[Literal["count", "longest"], Query(description="Rank by how many sessions overlap the range "
                                                                 "(`count`) or by the longest of them (`longest`).")] = "count",
    n: Annotated[int, Query(ge=1, le=1000, description="How many keys.")] = 10,
    start: RangeStart = None, end: RangeEnd = None, last: Last = None,
) -> SessionTopAnswer:
    """The `n` keys ranked by session count or longest session in the range, exact at `version`.

    **How it stays exact, and its cost.** A session count is not a monoid of parts (a late event can bridge two
    sessions and lower it), so no ranking kept in Redis can be merged by a threshold: the read takes every key's
    batch and realtime parts of the view (one atomic call per store bucket, all at one version), merges each
    key's sessions and ranks them here: O(keys x sessions per key) per request. A view with more rows than
    `LAMBDA_MAX_SESSION_TOP_KEYS` (default 100000) in one bucket, or more than `LAMBDA_SESSION_TOP_BYTES` of session
    rows (default 32 MiB, each Redis call reading at most its share), is a 422 (ask for one key instead). A key whose
    sessions folded past `max_sessions` touch the range has its score known only within bounds: the ranking is
    answered when no such key can reach the top `n` (all time too), else it is a 422 naming the key, the range
    and the fix, never an inexact ranking."""
    chosen, asked = _asked(request, pipeline, view, start, end, last)
    return await session_answers.top_keys(_reads(request), chosen, by, n, asked)
