"""Session parts merge as the README's argument says: associative, commutative, the empty part an identity, and
the merge of any split's sessions equal to the sessions of all the events (``shared_logic.sessions``).

The oracle is a gap sessionization over plain events (sorted by time, a new session wherever two neighbours lie
more than ``gap`` apart: ``tests.support.window_oracle.gap_runs``, which the console's page test shares; its measures a
plain-Python count, integer sum, min, max and set of values), never the module's own ``sessions_of``. Events come
in random order and are split at random into parts, as a barrier and micro-batches split them: late events that
extend a session of another part or bridge two of its sessions are among them by construction (small times, small
gaps).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared_logic.errors import PipelineDefinitionError
from shared_logic.measures import Count, Distinct, Max, Min, Sum
from shared_logic.session_parts import decode_part, encode_part, part_of_events
from shared_logic.sessions import (
    DEFAULT_MAX_SESSIONS,
    MICROS,
    Folded,
    Part,
    Session,
    SessionWindow,
    fold,
    merge,
    merge_parts,
    overlapping,
    sessions_of,
    summary,
)
from tests.support.window_oracle import gap_runs

MEASURES = (Count(), Sum("v"), Min("v"), Max("v"), Distinct("who"))
LAWS = settings(max_examples=200, deadline=None, database=None)

#: An event: (time in microseconds, value, who).
events_st = st.lists(st.tuples(st.integers(0, 60), st.integers(-5, 5), st.sampled_from("abcd")), max_size=30)
gaps = st.integers(0, 8)


def one(event: tuple[int, int, str]) -> tuple[int, dict[str, Any]]:
    t, v, who = event
    return t, {"count": 1, "sum_v": v, "min_v": v, "max_v": v, "distinct_who": {who}}


def part(gap: int, events: list[tuple[int, int, str]]) -> tuple[Session, ...]:
    return sessions_of(gap, MEASURES, map(one, events))


def oracle(gap: int, events: list[tuple[int, int, str]]) -> list[tuple[int, int, dict[str, Any]]]:
    """Gap sessionization of plain events (``tests.support.window_oracle.gap_runs``): (start, end, measures) per session,
    by start."""
    runs = gap_runs(gap, sorted(events), lambda e: e[0])
    return [(run[0][0], run[-1][0], {"count": len(run), "sum_v": sum(v for _, v, _ in run), "min_v": min(v for _, v, _ in run),
                                     "max_v": max(v for _, v, _ in run), "distinct_who": {w for _, _, w in run}})
            for run in runs]


def plain(sessions: tuple[Session, ...]) -> list[tuple[int, int, dict[str, Any]]]:
    return [(s.start, s.end, dict(s.parts)) for s in sessions]


@LAWS
@given(gaps, events_st, st.lists(st.integers(0, 3), max_size=30))
def test_the_merge_of_any_split_is_the_sessions_of_all_events(gap: int, events: list, sides: list[int]) -> None:
    parts: list[list] = [[], [], [], []]
    for i, event in enumerate(events):
        parts[sides[i] if i < len(sides) else 0].append(event)
    assert plain(merge(gap, MEASURES, *(part(gap, p) for p in parts))) == oracle(gap, events)


@LAWS
@given(gaps, events_st, events_st, events_st)
def test_merge_is_associative_and_commutative_with_the_empty_part_as_identity(gap: int, a: list, b: list, c: list) -> None:
    x, y, z = part(gap, a), part(gap, b), part(gap, c)
    assert merge(gap, MEASURES, merge(gap, MEASURES, x, y), z) == merge(gap, MEASURES, x, merge(gap, MEASURES, y, z))
    assert merge(gap, MEASURES, x, y) == merge(gap, MEASURES, y, x)
    assert merge(gap, MEASURES, x, ()) == merge(gap, MEASURES, (), x) == x


def test_late_events_extend_and_bridge_sessions_across_the_barrier() -> None:
    gap = 10
    batch = part(gap, [(0, 1, "a"), (5, 1, "a"), (40, 2, "b"), (70, 3, "c")])  # sessions [0,5] [40,40] [70,70]
    late = part(gap, [(14, 1, "d"), (50, 1, "a"), (60, 1, "a")])  # extends [0,5]; bridges [40] and [70]
    assert [(s.start, s.end, s.parts["count"], s.parts["distinct_who"]) for s in merge(gap, MEASURES, batch, late)] == \
        [(0, 14, 3, {"a", "d"}), (40, 70, 4, {"a", "b", "c"})]


@LAWS
@given(gaps, events_st, st.integers(1, 5))
def test_folding_keeps_the_newest_and_counts_every_session(gap: int, events: list, keep: int) -> None:
    sessions = part(gap, events)
    folded, kept = fold(MEASURES, Folded(), sessions, keep)
    assert kept == sessions[-keep:] if sessions else kept == ()
    whole = summary(sessions)
    assert summary(kept, folded) == {**whole, "folded": max(0, len(sessions) - keep)}
    if folded.sessions:
        assert folded.parts["count"] == sum(s.parts["count"] for s in sessions[:len(sessions) - keep])


SCALAR = MEASURES[:4]  # what a stored session view keeps (no distinct sets)


def scalar_part(window: SessionWindow, events: list[tuple[int, int, str]]) -> Part:
    """A part as the layers make it (``part_of_events`` over each event's time and input values)."""
    return part_of_events(window, SCALAR, ((t, {"v": v}) for t, v, _ in events))


@LAWS
@given(st.integers(1, 8), events_st, st.lists(st.integers(0, 2), max_size=30), st.integers(1, 4))
def test_stored_parts_merge_exactly_below_the_bound_and_drop_no_event_past_it(gap: int, events: list, sides: list[int],
                                                                              keep: int) -> None:
    """Parts as the layers store them (encoded, decoded) and merge them (``merge_parts``): below the bound the
    oracle's sessions; with any bound, at most ``keep`` sessions kept and every event counted in a kept or folded
    session (nothing dropped)."""
    parts: list[list] = [[], [], []]
    for i, event in enumerate(events):
        parts[sides[i] if i < len(sides) else 0].append(event)
    for window in (SessionWindow(timedelta(seconds=gap)), SessionWindow(timedelta(seconds=gap), max_sessions=keep)):
        stored = [decode_part(SCALAR, encode_part(SCALAR, scalar_part(window, [(t * MICROS, v, w) for t, v, w in p])))
                  for p in parts]
        merged = merge_parts(window, SCALAR, *stored)
        assert len(merged.sessions) <= window.max_sessions
        assert sum(s.parts["count"] for s in merged.sessions) + (merged.folded.parts.get("count") or 0) == len(events)
        if window.max_sessions == DEFAULT_MAX_SESSIONS:
            want = [(a * MICROS, b * MICROS, {k: v for k, v in m.items() if k != "distinct_who"})
                    for a, b, m in oracle(gap, events)]
            assert plain(merged.sessions) == want and merged.folded.sessions == 0


def test_overlapping_takes_whole_sessions() -> None:
    sessions = (Session(0, 10), Session(20, 30), Session(40, 40))
    assert overlapping(sessions, 10, 21) == sessions[:2] and overlapping(sessions, 31, 40) == () and \
        overlapping(sessions, 31, 41) == sessions[2:]


@pytest.mark.parametrize("gap, keep, words", [
    (timedelta(0), 10, ["gap", "whole number of seconds"]),
    (timedelta(seconds=1.5), 10, ["gap", "1.5"]),
    (timedelta(minutes=30), 0, ["max_sessions", "1000"]),
    (timedelta(minutes=30), True, ["max_sessions"]),
    (timedelta(minutes=30), 10_001, ["max_sessions", "10,000", "1000"]),
])
def test_a_session_window_that_cannot_work_names_the_fix(gap: timedelta, keep: Any, words: list[str]) -> None:
    with pytest.raises(PipelineDefinitionError) as raised:
        SessionWindow(gap, max_sessions=keep)
    assert all(w in str(raised.value) for w in words), str(raised.value)
    assert SessionWindow(timedelta(minutes=30)).gap_micros == 1_800_000_000


def test_a_session_view_is_checked_and_window_is_taken_as_sessions() -> None:
    from shared_logic.views import View

    window = SessionWindow(timedelta(minutes=30))
    with pytest.raises(PipelineDefinitionError, match=r"\['duration'\].*rename"):
        View("visits", keys=("duration",), measures=(Count(),), window=window)  # type: ignore[arg-type]
    with pytest.raises(PipelineDefinitionError, match="distinct values"):
        View("visits", keys=("user",), measures=(Count(), Distinct("page")), sessions=window)
    view = View("visits", keys=("user",), measures=(Count(),), window=window)  # type: ignore[arg-type]
    assert view.sessions == window and view.window is None
    assert view == View("visits", keys=("user",), measures=(Count(),), sessions=window)


@settings(max_examples=500, deadline=None, database=None)
@given(st.integers(1, 5), st.integers(1, 3),
       st.lists(st.tuples(st.integers(0, 24), st.integers(-2, 2), st.integers(0, 3)), min_size=2, max_size=16),
       st.integers(0, 28), st.integers(1, 8))
def test_an_answer_called_exact_is_the_sessions_of_all_events(gap: int, keep: int, events: list, r0: int, rlen: int) -> None:
    """Folding past a small bound, as the layers do it: the batch part folded, each micro-batch's part folded and
    merged into the realtime row one at a time (stored encoded), the read merging the two. Wherever the merged
    part says a range is exact (``Part.exact_in``), its sessions overlapping the range are the oracle's, measures
    included; the kept ones are always within the bound."""
    window = SessionWindow(timedelta(seconds=gap), max_sessions=keep)

    def stored(part: Part) -> Part:
        return decode_part(SCALAR, encode_part(SCALAR, part))

    def side(n: int) -> list[tuple[int, int, str]]:
        return [(t * MICROS, v, "a") for t, v, s in events if s == n]

    batch = stored(scalar_part(window, side(0)))
    realtime = Part()
    for micro_batch in (1, 2, 3):
        if side(micro_batch):
            realtime = stored(merge_parts(window, SCALAR, realtime, scalar_part(window, side(micro_batch))))
    answer = merge_parts(window, SCALAR, batch, realtime)
    assert len(answer.sessions) <= keep
    start, end = r0 * MICROS, (r0 + rlen) * MICROS
    truth = [(a, b, {k: v for k, v in m.items() if k != "distinct_who"})
             for a, b, m in oracle(gap * MICROS, [(t * MICROS, v, "a") for t, v, _ in events])]
    if answer.exact_in(window.gap_micros, start, end):
        assert plain(overlapping(answer.sessions, start, end)) == [s for s in truth if s[0] < end and s[1] >= start]


def test_a_kept_session_that_belongs_with_a_folded_one_is_not_exact() -> None:
    """The review's case: gap 3 s, one session kept. Batch [0] [4] keeps [4] and folds [0]; a late event at 1 s
    makes the kept [1, 4] (count 2) where the truth is [0, 4] (count 3): a range over 4 s alone is not exact."""
    window = SessionWindow(timedelta(seconds=3), max_sessions=1)
    batch = scalar_part(window, [(0, 1, "a"), (4 * MICROS, 1, "a")])
    answer = merge_parts(window, SCALAR, batch, scalar_part(window, [(MICROS, 1, "a")]))
    assert [(s.start, s.end) for s in answer.sessions] == [(MICROS, 4 * MICROS)] and answer.folded.sessions == 1
    assert not answer.exact_in(window.gap_micros, 4 * MICROS, 5 * MICROS)
    assert answer.uncertain(window.gap_micros) == (-3 * MICROS, 4 * MICROS)
    assert answer.exact_in(window.gap_micros, 8 * MICROS, 9 * MICROS)
