"""Response bodies of the session routes (``serving.api.routes.sessions``), as the OpenAPI page documents them."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from serving.api.models import WindowSpan

_EXACT = ("True when the answer is the sessions of every event through `version`. False when the range touches "
          "what sessions folded past the view's `max_sessions` make uncertain: their span widened by the gap both "
          "sides, and any kept session reaching into that (a kept session there may belong with folded ones, which "
          "no longer coalesce); `folded` says how many.")
_FOLDED = "The key's oldest sessions folded into one summary past the view's max_sessions (never dropped)."


class SessionOut(BaseModel):
    """One session: first and last event time, its duration, the view's measures over its events."""

    session_start: datetime = Field(description="Time of its first event (UTC).")
    session_end: datetime = Field(description="Time of its last event (UTC).")
    duration: float = Field(description="session_end - session_start, in seconds (0 for one event).")
    value: dict[str, Any] = Field(description="The view's measures over the session's events.")


class FoldedOut(BaseModel):
    """Sessions folded past the bound: how many, their span, total and longest duration, measures."""

    sessions: int
    first_start: datetime | None = None
    last_end: datetime | None = None
    total_duration: float = Field(description="Seconds.")
    longest: float = Field(description="Seconds.")
    value: dict[str, Any]


class _SessionAnswer(BaseModel):
    view: str
    range: WindowSpan | None = Field(default=None, description="The range asked for (from/to or last); absent: all time.")
    now: datetime | None = Field(default=None, description="The clock reading relative times were resolved against.")
    exact: bool = Field(description=_EXACT)
    generation: int = Field(description="The batch generation answered from (its master version).")
    version: int = Field(description="Master dataset version the answer is exact for.")


class SessionsAnswer(_SessionAnswer):
    """A key's sessions that overlap the range (whole, not cut at it), oldest first."""

    key: str
    sessions: list[SessionOut]
    folded: FoldedOut | None = Field(default=None, description=_FOLDED)


class SessionSummary(_SessionAnswer):
    """A key's sessions in the range summed up (folded ones included when they all lie in it)."""

    key: str
    sessions: int = Field(description="How many sessions overlap the range.")
    total_duration: float = Field(description="Seconds, over those sessions.")
    mean_duration: float | None = Field(description="Seconds; null without sessions.")
    longest: float | None = Field(description="Seconds; null without sessions.")
    folded: int = Field(description="How many of the key's sessions are folded (see `exact`).")


class SessionTopEntry(BaseModel):
    key: str
    value: float = Field(description="Session count, or the longest session's duration in seconds.")


class SessionTopAnswer(_SessionAnswer):
    """The keys with the most sessions, or the longest session, overlapping the range: exact (a key whose folded
    sessions could change it makes it a 422 instead)."""

    by: Literal["count", "longest"]
    n: int
    top: list[SessionTopEntry] = Field(description="Highest first; ties broken by key.")
