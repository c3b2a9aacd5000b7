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

**Storage and reads (as built).**

* *Parts.* A key's *part* is its session list (sorted by start, each session's measures in the view's
  order) and the ``Folded`` summary past the bound, encoded as one JSON text (``shared_logic.session_parts.encode_part``). The batch
  layer's gold row of a key is its part over the snapshot (``View.aggregate``: Spark's ``applyInArrow``
  grouped by key calling ``session_parts.part_of_events``, which calls ``sessions_of``; event times reach it as integer
  microseconds, ``F.unix_micros``, never as pandas timestamps, whose nanoseconds end in 2262 and which
  would read Spark's session time zone), loaded into the generation's rows
  hash as the row's value. The speed layer computes each micro-batch's parts the same way and its writer
  merges them into the key's realtime row with ``merge_parts`` (Python, in the Spark task), which the
  existing guarded, undo-logged chunk call stores (``serving.store.segments``): exactly once, visible at the
  micro-batch's commit, Lua never decoding a session. *Changed from the first design* (one list appended
  per micro-batch): appends would need an undo protocol of their own (trim a list back on a replay or
  before a commit) beside the one rows already have, and would grow with the micro-batches until a flip;
  a merged realtime row reuses the row protocol unchanged and stays within ``max_sessions``. Both are the
  one ``merge``, so below the bound the answer is the same (past it, see *Bound*).
* *Reads* take a key's batch row and committed realtime row in one atomic Lua call (as every read) and
  merge them here (``merge_parts``): a key's sessions overlapping a range (whole sessions, not cut at the
  range), a key's summary (``summary``: sessions, total and mean duration, longest), and top-N keys by
  session count or longest session in a range, which reads every key's rows of the view (a session count
  is not a per-pane monoid: a late event can bridge two sessions, lowering it, so no threshold merge
  applies; ``serving.store.session_reads`` states the cost and its bound).
* *Values.* Each event's part of a measure is the measure's own ``event_part`` (a measure without one is
  refused), merged by its own ``combine``. An integer column's sum stays an exact Python int however the
  events were split (a JSON int is exact) and answers ``OVERFLOW`` past 64 bits; a float column's sum is a
  float, whose last bits depend on the order of additions (as a measure view's do). Inputs that JSON would
  not give back exactly (timestamps, dates, decimals) are refused when the rows are aggregated
  (``session_parts.check_session_inputs``), with the fix named.
* *Bound.* ``SessionWindow.max_sessions`` (default ``DEFAULT_MAX_SESSIONS``, 1000) is how many sessions
  a key's part keeps. Past it the oldest are folded (``fold``) into one summary kept beside the list:
  how many sessions, their total and longest duration, their first start and last end, their measures
  combined. Nothing is dropped: a summary, the total and mean duration and a top-N by session count
  include the folded sessions, and every answer names how many were folded (``folded``). What folding
  gives up is stated there too: a folded session no longer coalesces, so a kept session that a full
  sessionization would have joined to folded ones stays apart (a late event within ``gap`` of a folded
  session starts a kept session of its own; after a merge a kept session may even be older than a folded
  one). Such a kept session may reach far past the folded span, so what is unsure is the *uncertain span*
  (``Part.uncertain``): the folded span widened by ``gap`` on both sides, and every kept session within it.
  Outside it the kept sessions are exactly the full sessionization's (proof at ``Part.uncertain``); an
  answer over a range that touches it says it is not exact, and a larger ``max_sessions`` (a logic change:
  recomputed) removes it. Once folding happens ``merge_parts`` is no longer associative (which sessions
  fold depends on the order parts were merged in), so the batch/speed split changes *which* sessions are
  folded, never what lies outside the uncertain span.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from shared_logic.errors import PipelineDefinitionError
from shared_logic.measures import Distinct, Measure

#: Sessions a key keeps by default (``SessionWindow.max_sessions``); older ones are folded (module doc).
DEFAULT_MAX_SESSIONS = 1_000
#: The most ``max_sessions`` may be: a key's row (about 50 bytes a session and measure) is read, merged and
#: written whole by every read of the key and every micro-batch that touches it, and a key read answers every
#: kept session of its range at once.
MAX_SESSIONS_LIMIT = 10_000
#: Event times in sessions are integers in this unit (Spark timestamps are microseconds).
MICROS = 1_000_000
#: What a session view answers per session beside its measures: no key column or measure may take these names.
SESSION_FIELDS = ("session_start", "session_end", "duration")
#: The column of a session view's gold rows and increments holding a key's part (``encode_part``).
SESSIONS_COLUMN = "sessions"


@dataclass(frozen=True)
class SessionWindow:
    """Sessions of each key: maximal runs of its events no more than ``gap`` apart (event time, UTC).

    ``max_sessions``: how many sessions a key keeps, 1 to ``MAX_SESSIONS_LIMIT`` (10,000: every cost of a key's
    row grows with it); older ones are folded into one summary that answers carry (see the module doc), never
    dropped."""

    gap: timedelta
    time_column: str = "event_time"
    max_sessions: int = DEFAULT_MAX_SESSIONS

    def __post_init__(self) -> None:
        seconds = self.gap.total_seconds()
        if seconds < 1 or seconds != int(seconds):
            raise PipelineDefinitionError(f"SessionWindow gap must be a whole number of seconds >= 1, got {self.gap} "
                                          "(e.g. timedelta(minutes=30))")
        if type(self.max_sessions) is not int or not 1 <= self.max_sessions <= MAX_SESSIONS_LIMIT:
            raise PipelineDefinitionError(f"SessionWindow max_sessions must be a whole number from 1 to "
                                          f"{MAX_SESSIONS_LIMIT:,}, got {self.max_sessions!r}; leave it out for "
                                          f"{DEFAULT_MAX_SESSIONS}")

    @property
    def gap_micros(self) -> int:
        """The gap in microseconds, the unit of session times."""
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


def combine_folded(measures: Sequence[Measure], a: Folded, b: Folded) -> Folded:
    """Two folded summaries as one (their sessions, durations and spans added up, measures combined)."""
    starts, ends = [x for x in (a.start, b.start) if x is not None], [x for x in (a.end, b.end) if x is not None]
    return Folded(a.sessions + b.sessions, a.total_duration + b.total_duration, max(a.longest, b.longest),
                  min(starts) if starts else None, max(ends) if ends else None, _combined(measures, a.parts, b.parts))


@dataclass(frozen=True)
class Part:
    """A key's sessions in one part of the events (batch, realtime, or merged): kept ones and the folded."""

    sessions: tuple[Session, ...] = ()
    folded: Folded = Folded()

    def uncertain(self, gap: int) -> tuple[int, int] | None:
        """The span (first, last microsecond, inclusive) outside which this merged part's kept sessions are
        exactly the sessions of all its events, whatever was folded; None when nothing is folded.

        Why: kept sessions come out of ``merge``, so any two lie more than ``gap`` apart, and each is a subset
        of one true session (folding only stops coalescing, it never joins). A true session with no folded
        event is therefore exactly one kept session. A true session with a folded event chains its events
        through folded ones (all within ``[folded.start, folded.end]``) and kept sessions, and two kept
        sessions are never neighbours in the chain, so each of its kept sessions lies within ``gap`` of the
        folded span. The span returned covers the folded span widened by ``gap`` both sides and every kept
        session that reaches into that: every true session with a folded event lies inside it."""
        f = self.folded
        if not f.sessions or f.start is None or f.end is None:
            return None
        lo, hi = f.start - gap, f.end + gap
        near = [s for s in self.sessions if s.start <= hi and s.end >= lo]
        return min([lo] + [s.start for s in near]), max([hi] + [s.end for s in near])

    def exact_in(self, gap: int, start: int, end: int) -> bool:
        """Whether sessions overlapping ``[start, end)`` (microseconds) are exactly the sessions of all the
        events there (``uncertain``: nothing folded, or the uncertain span apart from the range)."""
        span = self.uncertain(gap)
        return span is None or not (span[0] < end and span[1] >= start)


def merge_parts(window: SessionWindow, measures: Sequence[Measure], *parts: Part) -> Part:
    """The parts' sessions merged (``merge``), their folded summaries combined, and the oldest folded past
    ``window.max_sessions``: how the speed layer's writer and every read combine parts."""
    merged = merge(window.gap_micros, measures, *(p.sessions for p in parts))
    folded = Folded()
    for p in parts:
        folded = combine_folded(measures, folded, p.folded)
    folded, kept = fold(measures, folded, merged, window.max_sessions)
    return Part(kept, folded)


def check_session_measures(view: str, measures: Sequence[Measure]) -> None:
    """A session keeps each measure's part per session, made from each event by the measure's own
    ``event_part`` and merged by its own ``combine``: a measure without ``event_part`` is refused (a distinct
    measure's set would also grow with every session of the key)."""
    distinct = [m.name for m in measures if isinstance(m, Distinct)]
    if distinct:
        raise PipelineDefinitionError(f"view {view!r}: a session view keeps count, sum, min and max per session, not "
                                      f"distinct values {distinct}; use a windowed view for those")
    missing = [m.name for m in measures if not m.keeps_per_event()]
    if missing:
        raise PipelineDefinitionError(
            f"view {view!r}: measures {missing} have no per-event part, so a session view cannot keep them exactly; "
            "give the measure an event_part(value) method (its part over one row, merged by its combine), or use "
            "Count, Sum, Min or Max")
