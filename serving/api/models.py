"""Response bodies of the HTTP API (they are what the OpenAPI page documents)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from shared_logic.measures import OVERFLOW

_WINDOW = "The one window asked for (window_start or window_end), resolved."
_RANGE = "The range asked for (from/to, or last), resolved: relative times at `now`."
_COVERED = ("The panes the answer combines, from the first one's start to the last one's end (windowed views): "
            "every pane the window or range overlaps, whole.")
_NOW = ("The clock reading this request's relative times (-1h, now, last=15m, to left out) were resolved against; "
        "absent when it had none.")


class WindowSpan(BaseModel):
    start: datetime = Field(description="Window start (inclusive), UTC.")
    end: datetime = Field(description="Window end (exclusive), UTC.")


class WindowValue(WindowSpan):
    value: dict[str, Any] = Field(description="Measures of the key in this window.")


class Explanation(BaseModel):
    """How an answer was put together."""

    batch: dict[str, Any] = Field(description="The batch generation's part (monoid measures).")
    realtime: dict[str, Any] = Field(description="The realtime segment's part (versions after the generation).")
    generation: int
    generation_version: int = Field(description="Master version the batch part covers (through it).")
    speed_processed_version: int | None = Field(
        None, description="Last master version the speed layer applied to this generation's segment."
    )
    computed_at: datetime | None = None


class KeyAnswer(BaseModel):
    """The measures of one key of a view, exact as of ``version``."""

    view: str
    key: str
    value: dict[str, Any] = Field(
        description="Monoid measures (count, sum_*, min_*, max_*, distinct_*) and derived values (avg_*). A sum "
                    f"beyond what a double holds (and its average) is the string {OVERFLOW!r}, never a number or null."
    )
    window: WindowSpan | None = Field(default=None, description=_WINDOW)
    range: WindowSpan | None = Field(default=None, description=_RANGE)
    covered: WindowSpan | None = Field(default=None, description=_COVERED)
    now: datetime | None = Field(default=None, description=_NOW)
    windows: list[WindowValue] | None = Field(
        default=None, description="Each pane's own values, oldest first (a range, or a sliding window: its panes; a "
                                  "tumbling view's pane is its window); panes without the key are left out.")
    generation: int = Field(description="The batch generation answered from (its master version).")
    version: int = Field(description="Master dataset version the answer is exact for.")
    computed_at: datetime | None = Field(default=None, description="When the batch generation was computed.")
    logic: str | None = Field(
        default=None, description="Fingerprint of the pipeline logic the answer was computed under (batch and "
                                  "realtime parts alike: never two); null for a generation published before it was recorded.")
    explain: Explanation | None = Field(default=None, description="With ?explain=true: the parts the answer combines.")


class TopEntry(BaseModel):
    key: str
    value: float | int


class TopAnswer(BaseModel):
    """The top keys of a view by one measure of the merged (batch + realtime) values, exact."""

    view: str
    measure: str
    n: int
    window: WindowSpan | None = Field(default=None, description=_WINDOW)
    range: WindowSpan | None = Field(default=None, description=_RANGE)
    covered: WindowSpan | None = Field(default=None, description=_COVERED)
    now: datetime | None = Field(default=None, description=_NOW)
    top: list[TopEntry] = Field(description=f"Highest first; ties broken by key. Keys whose value is {OVERFLOW!r} "
                                            "(a sum beyond what a double holds) are not ranked.")
    generation: int
    version: int = Field(description="Master dataset version the ranking is exact for.")
    logic: str | None = Field(
        default=None, description="Fingerprint of the pipeline logic the answer was computed under (batch and "
                                  "realtime parts alike: never two); null for a generation published before it was recorded.")


class KeyEntry(BaseModel):
    """One row of a key listing: a key and its merged value (windowed views: over the panes asked, combined)."""

    key: str = Field(description="The key as the key route takes it (several key columns joined with '|').")
    columns: dict[str, str] | None = Field(default=None, description="Views with several key columns: each one's value.")
    window: WindowSpan | None = Field(default=None, description="Windowed views: the panes this row combines, from the "
                                                                "first one's start to the last one's end.")
    value: dict[str, Any] = Field(description="The merged measures, as the key route answers them for these panes "
                                              f"(an overflowed sum: {OVERFLOW!r}).")


class KeyPage(BaseModel):
    """A page of a view's keys with their merged values, in key order; every value of the page is exact as
    of ``version`` (one atomic state of the store)."""

    view: str
    keys: list[KeyEntry]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null after the last page.")
    generation: int = Field(description="The batch generation this page was read from.")
    version: int = Field(description="Master dataset version every value of this page is exact for.")
    window: WindowSpan | None = Field(default=None, description=_WINDOW)
    range: WindowSpan | None = Field(default=None, description=_RANGE)
    covered: WindowSpan | None = Field(default=None, description=_COVERED)
    now: datetime | None = Field(default=None, description=_NOW)


class MeasureInfo(BaseModel):
    name: str
    kind: str
    column: str | None = None


class ViewInfo(BaseModel):
    name: str
    description: str
    keys: list[str]
    measures: list[MeasureInfo]
    derived: list[str]
    window_seconds: int | None = Field(default=None, description="Window size (tumbling or sliding); null for all-time "
                                                                 "views.")
    slide_seconds: int | None = Field(default=None, description="Sliding views: how often a window starts, the size "
                                                                "of the panes stored; null otherwise.")
    session_gap_seconds: int | None = Field(default=None, description="Session views: the most event time between "
                                                                      "two events of one session; null otherwise.")
    max_sessions: int | None = Field(default=None, description="Session views: sessions a key keeps before the oldest "
                                                               "are folded into one summary; null otherwise.")
    generation: int | None = Field(default=None, description="Served batch generation; null when none is published.")
    version: int | None = Field(default=None, description="Master version answers are exact for (batch + speed).")
    computed_at: datetime | None = None
    rows: int | None = Field(default=None, description="Rows (keys x windows) in the served generation.")
    pending: bool = Field(
        default=False, description="The view is in the pipeline's code but not in the served generation (added "
                                   "since): its routes answer 503 until a batch run under this code is served.")


class ViewList(BaseModel):
    pipeline: str
    views: list[ViewInfo]
    latest_version: int | None = Field(default=None, description="Newest version of the master dataset.")
    processed_version: int | None = Field(default=None, description="Last master version the speed layer applied.")
    lag_versions: int | None = Field(default=None, description="Versions committed but not yet in any answer.")
    lag_seconds: float | None = Field(default=None, description="Age of the oldest commit not yet in any answer.")
    logic: str = Field(description="Fingerprint of the pipeline logic this API runs (shared_logic.logic).")
    served_logic: str | None = Field(
        default=None, description="Logic of the served generation (what answers are computed under); '' when "
                                  "published before logic was recorded, null when nothing is served.")
    pending_logic: str | None = Field(
        default=None, description="This API's logic when it differs from the served one: answers keep the served "
                                  "logic until a batch run under the new one is served (the scheduler starts it).")


class Health(BaseModel):
    status: str
    detail: str | None = None


class ErrorBody(BaseModel):
    """Every error answer: what went wrong, said so a person can act on it."""

    error: str = Field(description="Error class, e.g. NotFoundError, UnavailableError.")
    detail: str = Field(description="What is wrong and what to do about it.")


#: What each error status means, as the OpenAPI document says it (the body is always an ErrorBody).
ERROR_MEANINGS: dict[int, str] = {
    400: "The request cannot be read: malformed JSON, JSON nested too deeply, or a malformed header.",
    401: "No API key, an unknown key, or no keys configured (`WWW-Authenticate: Bearer`); see the Auth section.",
    403: "The API key lacks the scope this route needs (the detail names it).",
    404: "Unknown view, key or batch run.",
    409: "A conflict with the state of the platform: a batch run already queued or running (`Location` names "
         "it), or a cursor of a view since recomputed under other logic.",
    422: "A parameter or body that does not fit: the detail names each parameter or field and what is wrong.",
    503: "Cannot answer correctly now (Redis unreachable, nothing published): the detail says why.",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route or router: the given error statuses, each with the ErrorBody model."""
    return {status: {"model": ErrorBody, "description": ERROR_MEANINGS[status]} for status in statuses}


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = error_responses(404, 422, 503)


class PipelineInfo(BaseModel):
    """One pipeline of the deployment."""

    name: str
    default: bool = Field(description="The un-prefixed routes (/v1/views, /v1/events, ...) answer for it.")
    url: str = Field(description="Prefix of its routes: every /v1/... route is also at URL/... for it.")
    views: list[str]
    logic: str = Field(description="Fingerprint of the pipeline's logic as this API runs it.")
    generation: int | None = Field(default=None, description="Served batch generation; null when none is published.")
    version: int | None = Field(default=None, description="Master version the served generation covers.")


class PipelineList(BaseModel):
    pipelines: list[PipelineInfo]
