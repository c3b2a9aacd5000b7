"""A session view's rows as Spark computes them (``View.aggregate``: the grouped Arrow step both layers run)
equal a gap sessionization worked out here over the raw events: times from year 1 to 9999, an integer sum
with nulls kept exact, the same whatever Spark's session time zone; and an input a session cannot keep is
refused before any row is read."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from shared_logic.errors import PipelineDefinitionError
from shared_logic.event_values import EPOCH
from shared_logic.measures import Count, Max, Min, Sum
from shared_logic.session_parts import decode_part
from shared_logic.sessions import SessionWindow
from shared_logic.views import View

UTC = timezone.utc
GAP = timedelta(seconds=30)
VIEW = View("visits", keys=("user",), measures=(Count(), Sum("n"), Min("n"), Max("page")),
            sessions=SessionWindow(GAP, max_sessions=1000))
SCHEMA = "user string, event_time timestamp, n bigint, page string"
EVENTS = [
    ("ann", datetime(1, 1, 1, tzinfo=UTC), 2**53, "a"),
    ("ann", datetime(1, 1, 1, 0, 0, 20, tzinfo=UTC), 1, "c"),
    ("ann", datetime(1, 1, 1, 0, 0, 40, tzinfo=UTC), 1, None),
    ("ann", datetime(2024, 3, 1, 9, tzinfo=UTC), None, "b"),
    ("bob", datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), 7, "z"),
    ("bob", datetime(9999, 12, 31, 23, 59, 0, tzinfo=UTC), None, "y"),
]


def micros(t: datetime) -> int:
    return (t - EPOCH) // timedelta(microseconds=1)


def oracle() -> dict[str, list[tuple[int, int, dict[str, Any]]]]:
    """Per user: sessions (start, end, measures) of the raw events, by start; a new one past the gap."""
    by_user: dict[str, list[list[tuple]]] = {}
    for event in sorted(EVENTS, key=lambda e: (e[0], e[1])):
        runs = by_user.setdefault(event[0], [])
        if runs and event[1] - runs[-1][-1][1] <= GAP:
            runs[-1].append(event)
        else:
            runs.append([event])
    return {user: [(micros(run[0][1]), micros(run[-1][1]), {
        "count": len(run), "sum_n": sum(e[2] for e in run if e[2] is not None),
        "min_n": min((e[2] for e in run if e[2] is not None), default=None),
        "max_page": max((e[3] for e in run if e[3] is not None), default=None)}) for run in runs]
        for user, runs in by_user.items()}


def sessions(spark: Any) -> dict[str, list[tuple[int, int, dict[str, Any]]]]:
    rows = VIEW.aggregate(spark.createDataFrame(EVENTS, SCHEMA)).collect()
    return {row["user"]: [(s.start, s.end, {k: VIEW.measure(k).combine(v, None) for k, v in s.parts.items()})
                          for s in decode_part(VIEW.measures, row["sessions"]).sessions] for row in rows}


@pytest.mark.parametrize("zone", ["UTC", "America/New_York"])
def test_session_rows_are_the_sessions_of_the_raw_events_in_any_spark_time_zone(spark: Any, zone: str) -> None:
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", zone)
    try:
        got = sessions(spark)
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)
    assert got == oracle()
    assert got["ann"][0][2]["sum_n"] == 2**53 + 2 and isinstance(got["ann"][0][2]["sum_n"], int)


def test_an_input_a_session_cannot_keep_is_refused_before_any_row_is_read(spark: Any) -> None:
    view = View("visits", keys=("user",), measures=(Count(), Max("event_time")), sessions=SessionWindow(GAP))
    with pytest.raises(PipelineDefinitionError, match=r"'visits'.*max_event_time.*timestamp.*unix_micros"):
        view.aggregate(spark.createDataFrame(EVENTS, SCHEMA))
