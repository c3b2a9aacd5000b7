"""Answers of session views: a key's sessions in a range, its summary, the top keys. Merged here, in Python, by
the one session merge (``shared_logic.sessions.merge_parts``) from the parts one atomic read took
(``serving.store.session_reads``), so every answer is exact at the version it names unless it says otherwise
(``exact``: false when the uncertain span of sessions folded past ``max_sessions`` touches the range,
``shared_logic.sessions.Part.uncertain``)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any, Literal

from serving.api.errors import BadQueryError, NotFoundError
from serving.api.models import WindowSpan
from serving.api.session_models import (
    FoldedOut,
    SessionOut,
    SessionsAnswer,
    SessionSummary,
    SessionTopAnswer,
    SessionTopEntry,
)
from serving.api.session_ranking import rank, score_bounds
from serving.api.windows import Span
from serving.store.reads import Generation
from serving.store.session_reads import SessionReads
from shared_logic.event_values import EPOCH, TIME_MAX, TIME_MIN
from shared_logic.session_parts import answer_values, decode_part
from shared_logic.sessions import MICROS, Folded, Part, Session, SessionWindow, merge_parts, overlapping, summary
from shared_logic.views import View


def _bounds(asked: Span) -> tuple[int, int]:
    """The range a session read asks (``serving.api.windows.resolve``) as epoch micros ``[start, end)``; all time:
    every supported time, the last microsecond included."""
    if asked.range is None:
        return _micros(TIME_MIN), _micros(TIME_MAX) + 1
    return _micros(asked.range[0]), _micros(asked.range[1])


def _micros(t: datetime) -> int:
    return (t - EPOCH) // timedelta(microseconds=1)


def _time(micros: int) -> datetime:
    return EPOCH + timedelta(microseconds=micros)


def session_window(view: View) -> SessionWindow:
    """``view``'s SessionWindow; a 422 naming the routes to ask for a view that is not a session view."""
    if view.sessions is None:
        raise BadQueryError(f"view {view.name!r} is not a session view; ask GET /v1/views/{view.name}/keys/... instead")
    return view.sessions


def merged(view: View, rows: tuple[bytes, bytes]) -> Part:
    """A key's batch and realtime parts as one (the one merge)."""
    window = session_window(view)
    return merge_parts(window, view.measures, *(decode_part(view.measures, row) for row in rows))


def _touched(view: View, part: Part, asked: Span) -> bool:
    """Whether the part's uncertain span (``Part.uncertain``: folded sessions, the gap around them and the kept
    sessions within it) touches the range, so sessions there are not known exactly."""
    return not part.exact_in(session_window(view).gap_micros, *_bounds(asked))


def _session(view: View, s: Session) -> SessionOut:
    return SessionOut(session_start=_time(s.start), session_end=_time(s.end), duration=s.duration / MICROS,
                      value=answer_values(view.measures, s.parts))


def _common(view: View, served: Generation, asked: Span, exact: bool) -> dict[str, Any]:
    span = WindowSpan(start=asked.range[0], end=asked.range[1]) if asked.range else None
    return {"view": view.name, "range": span, "now": asked.now, "exact": exact, "generation": served.generation,
            "version": served.version}


async def key_sessions(reads: SessionReads, view: View, key: str, asked: Span) -> SessionsAnswer:
    """``key``'s sessions overlapping the range, with the folded summary; 404 for a key without events."""
    part, served = await _key_part(reads, view, key)
    f = part.folded
    folded = None if not f.sessions else FoldedOut(
        sessions=f.sessions, first_start=_time(f.start) if f.start is not None else None,
        last_end=_time(f.end) if f.end is not None else None, total_duration=f.total_duration / MICROS,
        longest=f.longest / MICROS, value=answer_values(view.measures, f.parts))
    return SessionsAnswer(**_common(view, served, asked, not _touched(view, part, asked)), key=key,
                          sessions=[_session(view, s) for s in overlapping(part.sessions, *_bounds(asked))], folded=folded)


async def key_summary(reads: SessionReads, view: View, key: str, asked: Span) -> SessionSummary:
    """``key``'s sessions overlapping the range summed up; folded ones count when their span lies in the range."""
    part, served = await _key_part(reads, view, key)
    f, (start, end) = part.folded, _bounds(asked)
    whole = bool(f.sessions) and f.start is not None and f.end is not None and f.start >= start and f.end < end
    figures = summary(overlapping(part.sessions, start, end), f if whole else Folded())
    mean, longest = figures["mean_duration"], figures["longest"]
    return SessionSummary(**_common(view, served, asked, not _touched(view, part, asked)), key=key,
                          sessions=figures["sessions"], total_duration=figures["total_duration"] / MICROS,
                          mean_duration=None if mean is None else mean / MICROS,
                          longest=None if longest is None else longest / MICROS, folded=f.sessions)


async def _key_part(reads: SessionReads, view: View, key: str) -> tuple[Part, Generation]:
    session_window(view)
    found = await reads.key(view.name, key)
    if key not in found.rows:
        raise NotFoundError(f"key {key!r} has no events in view {view.name!r} at version {found.generation.version}")
    return await asyncio.to_thread(merged, view, found.rows[key]), found.generation  # up to MAX_SESSIONS_LIMIT


async def top_keys(reads: SessionReads, view: View, by: Literal["count", "longest"], n: int, asked: Span) -> SessionTopAnswer:
    """The ``n`` keys with the most sessions (``count``) or the longest session (``longest``) overlapping the range,
    from every key's parts at one version (``serving.store.session_reads``: the cost), ranked exactly or refused
    (``serving.api.session_ranking``: a key whose folded sessions could change the top ``n`` is a 422 naming it)."""
    gap = session_window(view).gap_micros
    start, end = _bounds(asked)
    where = "from/to" if asked.range and asked.now is None else "from/to/last" if asked.range else \
        "from/to/last (none given, so all time)"

    def ranked() -> list[tuple[str, float]]:  # CPU work on every key's parts: off the event loop
        bounds = ((key, score_bounds(merged(view, rows), gap, by, start, end)) for key, rows in found.rows.items())
        return rank(view.name, bounds, by, n, where)

    async with reads.tops:  # the rows read and their merge held by at most TOPS_AT_ONCE top-Ns
        found = await reads.every_key(view.name)
        top = await asyncio.to_thread(ranked)
    return SessionTopAnswer(**_common(view, found.generation, asked, True), by=by, n=n,
                            top=[SessionTopEntry(key=k, value=v) for k, v in top])
