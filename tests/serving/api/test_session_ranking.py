"""Session top-N over keys with folded sessions (``serving.api.session_ranking``), against a gap
sessionization of the raw events worked out here: every key's score bounds hold its true score, and a
ranking that is answered (not refused) is the true top ``n``, all-time ranges included. Pure: no Redis."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.api.session_ranking import UncertainRankingError, rank, score_bounds
from shared_logic.measures import Count
from shared_logic.session_parts import part_of_events
from shared_logic.sessions import MICROS, Part, SessionWindow, merge_parts

MEASURES = (Count(),)
ALL_TIME = (-(2**62), 2**62)


def true_scores(gap: int, times: list[int], start: int, end: int) -> tuple[int, float]:
    """(session count, longest in seconds) of the true sessions of ``times`` (seconds) overlapping the range."""
    runs: list[list[int]] = []
    for t in sorted(times):
        if runs and t - runs[-1][-1] <= gap:
            runs[-1].append(t)
        else:
            runs.append([t])
    inside = [(r[0] * MICROS, r[-1] * MICROS) for r in runs if r[0] * MICROS < end and r[-1] * MICROS >= start]
    return len(inside), max((b - a for a, b in inside), default=0) / MICROS


def layered(window: SessionWindow, events: list[tuple[int, int]]) -> Part:
    """A key's merged part as the layers make it: the batch (side 0) folded, micro-batches merged one at a time."""
    def part(side: int) -> Part:
        return part_of_events(window, MEASURES, ((t * MICROS, {}) for t, s in events if s == side))
    realtime = Part()
    for side in (1, 2):
        realtime = merge_parts(window, MEASURES, realtime, part(side))
    return merge_parts(window, MEASURES, part(0), realtime)


keys_st = st.dictionaries(st.sampled_from("abcd"), st.lists(st.tuples(st.integers(0, 24), st.integers(0, 2)),
                                                             min_size=1, max_size=12), min_size=1)


@settings(max_examples=300, deadline=None, database=None)
@given(st.integers(1, 4), st.integers(1, 3), keys_st, st.one_of(st.none(), st.tuples(st.integers(0, 28), st.integers(1, 8))),
       st.sampled_from(["count", "longest"]), st.integers(1, 3))
def test_bounds_hold_the_truth_and_an_answered_ranking_is_the_true_top_n(gap: int, keep: int, keys: dict, asked: tuple | None,
                                                                         by: str, n: int) -> None:
    window = SessionWindow(timedelta(seconds=gap), max_sessions=keep)
    start, end = ALL_TIME if asked is None else (asked[0] * MICROS, (asked[0] + asked[1]) * MICROS)
    bounds, truth = {}, []
    for key, events in keys.items():
        found = bounds[key] = score_bounds(layered(window, events), window.gap_micros, by, start, end)  # type: ignore[arg-type]
        count, longest = true_scores(gap, [t for t, _ in events], start, end)
        true = float(count) if by == "count" else longest
        if found is None:
            assert count == 0
        else:
            assert (found[0] is None or found[0] <= true) and true <= found[1], (key, found, true)
            assert found[0] is None or count > 0
        if count:
            truth.append((key, true))
    want = sorted(truth, key=lambda kv: (-kv[1], kv[0]))[:n]
    try:
        got = rank("v", bounds.items(), by, n, "from/to")  # type: ignore[arg-type]
    except UncertainRankingError:
        return
    assert got == want


def test_an_all_time_ranking_answers_when_keys_with_folded_sessions_cannot_reach_it() -> None:
    window = SessionWindow(timedelta(seconds=2), max_sessions=2)
    busy = layered(window, [(t, 0) for t in range(0, 100, 10)] + [(t, 0) for t in range(200, 260, 2)])  # 10 + 1 sessions
    quiet = layered(window, [(0, 0), (20, 0), (40, 0), (2, 1)])  # [0] and [2] folded apart: truly one [0, 2]
    scores = {k: score_bounds(p, window.gap_micros, "longest", *ALL_TIME) for k, p in (("busy", busy), ("quiet", quiet))}
    assert scores["busy"] == (58.0, 80.0) and scores["quiet"] == (0.0, 2.0)  # bounds: 9 single events folded in 0..80
    busy = layered(window, [(t, 0) for t in range(0, 40, 10)] + [(t, 0) for t in range(200, 260, 2)])
    scores["busy"] = score_bounds(busy, window.gap_micros, "longest", *ALL_TIME)
    assert scores["busy"] == (58.0, 58.0)
    assert rank("v", scores.items(), "longest", 1, "all time") == [("busy", 58.0)]
    with pytest.raises(UncertainRankingError) as raised:
        rank("v", scores.items(), "longest", 2, "from/to/last (none given, so all time)")
    assert all(w in str(raised.value) for w in ("all time", "'quiet'", "max_sessions", "top 2")), str(raised.value)
