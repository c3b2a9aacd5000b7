"""Session windows: a key's sessions and their one merge. Pure: no Spark, no I/O.

A key's *session* is a maximal run of its events no more than ``gap`` apart in event time: it starts at
its first event, ends at its last (``duration = end - start``; one event: 0), and holds the view's
measures over its events. ``SessionWindow(gap)`` declares a view of them.

**Why sessions merge exactly (beside the monoid argument).** The sessions of a set of events are the
runs of the events sorted by time, cut wherever two neighbours lie more than ``gap`` apart. Describe a
part of the events by its sessions (start, end, measures). For two parts A and B, the sessions of A ∪ B
are found from the parts' sessions alone: sort all of them by start and sweep, coalescing a session into
the one before it when it starts no more than ``gap`` after that one's end, and combining their
measures with each measure's monoid (``merge``). Coalescing is exactly the cut rule: two sessions of
the union are one iff no gap wider than ``gap`` separates their events, and a session of a part never
holds such a gap, so only the boundaries between the parts' sessions can vanish, and they vanish iff
the next start is within ``gap`` of the furthest end seen. The result depends only on the union of the
events, never on how they were split, so ``merge`` is

* **associative and commutative**: merge(merge(a, b), c) = merge(a, merge(b, c)), merge(a, b) = merge(b, a);
* **with the empty part as identity**: merge(a, ()) = a;
* **a homomorphism**: merge(sessions(A), sessions(B)) = sessions(A ∪ B),

provided each measure's combine is (the monoid laws of ``shared_logic.measures``). That is what a
merged answer needs: the batch part (sessions over the snapshot at barrier V) merged with the realtime
part (sessions over what came after V) is the sessions of all events through the version answered,
whatever side of the barrier an event fell on. A late event may extend a session the batch closed, or
bridge two batch sessions into one: both are just coalescing. ``tests/shared_logic/test_session_laws.py``
checks the laws and the homomorphism (hypothesis) against a gap sessionization written there.

**Storage and reads (the design the layers follow; not built yet).**

* *Parts.* A view row is a key's session list (sorted by start, measures in the view's row layout),
  one for the batch part (the generation) and, in the realtime segment, one list per micro-batch
  appended under the existing exactly-once guard (no read-modify-write in Lua: the Lua write appends;
  merging stays in this module only). Both layers compute a part's sessions the same way: per key,
  events sorted by time, each event a one-event session, folded with ``merge`` (Spark's
  ``applyInPandas`` grouped by key calling ``sessions_of``), so neither layer has its own copy.
* *Reads* take the batch list and the realtime appends of a key in one atomic Lua call (as every read)
  and merge them here: a key's sessions overlapping a range (whole sessions, not cut at the range), a
  key's summary (``summary``: sessions, total and mean duration, longest), and top-N keys by session
  count or longest session in a range, which reads the candidates' lists (a session count is not a
  per-pane monoid: a late event can bridge two sessions, lowering it, so no threshold merge applies;
  the candidates are every key with a session in the range, bounded like a key listing's page).
* *Bound.* ``SessionWindow.max_sessions`` (default ``DEFAULT_MAX_SESSIONS``, 1000) is how many sessions
  a key's merged list keeps. Past it the oldest are folded (``fold``) into one summary kept beside the
  list: how many sessions, their total and longest duration, their first start and last end, their
  measures combined. Nothing is dropped: a summary, the total and mean duration and a top-N by session
  count include the folded sessions, and every answer names how many were folded (``folded``). What
  folding gives up is stated there too: a folded session no longer coalesces, so a late event within
  ``gap`` of one starts a kept session of its own (one more session than a full sessionization); a read
  says so by ``folded`` > 0, and a larger ``max_sessions`` (a logic change: recomputed) removes it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from shared_logic.errors import PipelineDefinitionError
from shared_logic.measures import Measure

#: Sessions a key keeps by default (``SessionWindow.max_sessions``); older ones are folded (module doc).
DEFAULT_MAX_SESSIONS = 1_000
#: Event times in sessions are integers in this unit (Spark timestamps are microseconds).
MICROS = 1_000_000
#: What a session view answers per session beside its measures: no key column or measure may take these names.
SESSION_FIELDS = ("session_start", "session_end", "duration")


@dataclass(frozen=True)
class SessionWindow:
    """Sessions of each key: maximal runs of its events no more than ``gap`` apart (event time, UTC).

    ``max_sessions``: how many sessions a key keeps; older ones are folded into one summary that answers
    carry (see the module doc), never dropped."""

    gap: timedelta
    time_column: str = "event_time"
    max_sessions: int = DEFAULT_MAX_SESSIONS

    def __post_init__(self) -> None:
        seconds = self.gap.total_seconds()
        if seconds < 1 or seconds != int(seconds):
            raise PipelineDefinitionError(f"SessionWindow gap must be a whole number of seconds >= 1, got {self.gap} "
                                          "(e.g. timedelta(minutes=30))")
        if type(self.max_sessions) is not int or self.max_sessions < 1:
            raise PipelineDefinitionError(f"SessionWindow max_sessions must be a whole number >= 1, got "
                                          f"{self.max_sessions!r}; leave it out for {DEFAULT_MAX_SESSIONS}")

    @property
    def gap_micros(self) -> int:
        return int(self.gap.total_seconds()) * MICROS


@dataclass(frozen=True)
class Session:
    """One session: first and last event time (microseconds since the epoch) and its measures' parts."""

    start: int
    end: int
    parts: Mapping[str, Any] = field(default_factory=dict)

    @property
    def duration(self) -> int:
        return self.end - self.start


def _combined(measures: Sequence[Measure], a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    return {m.name: m.combine(a.get(m.name), b.get(m.name)) for m in measures}


def merge(gap: int, measures: Sequence[Measure], *parts: Iterable[Session]) -> tuple[Session, ...]:
    """The sessions of the union of the events ``parts`` describe (each part a key's sessions, in any order):
    sorted by start, a session coalesced into the one before when it starts at most ``gap`` (microseconds)
    after that one's end, measures combined with each measure's monoid. The one merge of session parts."""
    ordered = sorted((s for part in parts for s in part), key=lambda s: (s.start, s.end))
    merged: list[Session] = []
    for session in ordered:
        if merged and session.start - merged[-1].end <= gap:
            last = merged[-1]
            merged[-1] = Session(last.start, max(last.end, session.end), _combined(measures, last.parts, session.parts))
        else:
            merged.append(Session(session.start, session.end, _combined(measures, {}, session.parts)))
    return tuple(merged)


def sessions_of(gap: int, measures: Sequence[Measure], events: Iterable[tuple[int, Mapping[str, Any]]]) -> tuple[Session, ...]:
    """A part's sessions from its events, each ``(time, parts of that one event)``: every event a one-event
    session, merged. How both layers make a part."""
    return merge(gap, measures, [Session(t, t, parts) for t, parts in events])


def overlapping(sessions: Iterable[Session], start: int, end: int) -> tuple[Session, ...]:
    """The sessions that overlap ``[start, end)`` (microseconds), whole."""
    return tuple(s for s in sessions if s.start < end and s.end >= start)


@dataclass(frozen=True)
class Folded:
    """Sessions folded past a key's bound: how many, their total and longest duration, their span, measures."""

    sessions: int = 0
    total_duration: int = 0
    longest: int = 0
    start: int | None = None
    end: int | None = None
    parts: Mapping[str, Any] = field(default_factory=dict)


def fold(measures: Sequence[Measure], folded: Folded, sessions: Sequence[Session], keep: int) -> tuple[Folded, tuple[Session, ...]]:
    """Keep the newest ``keep`` of ``sessions`` (sorted by start) and fold the older ones into ``folded``."""
    older, kept = sessions[:max(0, len(sessions) - keep)], tuple(sessions[max(0, len(sessions) - keep):])
    for s in older:
        folded = Folded(folded.sessions + 1, folded.total_duration + s.duration, max(folded.longest, s.duration),
                        s.start if folded.start is None else min(folded.start, s.start),
                        s.end if folded.end is None else max(folded.end, s.end), _combined(measures, folded.parts, s.parts))
    return folded, kept


def summary(sessions: Sequence[Session], folded: Folded = Folded()) -> dict[str, Any]:
    """A key's summary: how many sessions, their total, mean and longest duration (microseconds), folded ones
    included (derived at read time from the parts, as an average is)."""
    count = len(sessions) + folded.sessions
    total = sum(s.duration for s in sessions) + folded.total_duration
    longest = max([s.duration for s in sessions] + [folded.longest])
    return {"sessions": count, "total_duration": total, "mean_duration": total / count if count else None,
            "longest": longest if count else None, "folded": folded.sessions}
