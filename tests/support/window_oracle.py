"""Oracles for the windows beyond tumbling, written from their definitions (README.md's window and session sections),
never from the platform's code: a sliding window's (or range's) values are those of the events whose time lies in
it, grouped by key; a key's sessions are the runs of its events no more than the gap apart (exactly the gap apart:
one session). In pandas over frames of events, and ``gap_runs`` in plain Python over any events (each test then
sums up its runs' measures itself).

Inputs are frames of events as the master dataset stores them (``tests.oracle.read_events``), one row an event (or
a word of one), with its key column and its time ``t`` as an integer in whatever unit the caller keeps throughout
(seconds, microseconds). Moved here from the serving tests of each window kind so the end-to-end tests use the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import pandas as pd

E = TypeVar("E")


def gap_runs(gap: int, events: Iterable[E], time: Callable[[E], int]) -> list[list[E]]:
    """``events`` in time order (a stable sort by ``time``), as maximal runs of neighbours at most ``gap`` apart."""
    runs: list[list[E]] = []
    for event in sorted(events, key=time):
        if runs and time(event) - time(runs[-1][-1]) <= gap:
            runs[-1].append(event)
        else:
            runs.append([event])
    return runs


def window_top(events: pd.DataFrame, key: str, value: str, start: int, end: int, how: str,
               n: int) -> list[tuple[str, int]]:
    """The ``n`` keys with the highest ``how`` (``count``, ``sum``, ``min``, ``max``) of ``value`` over the events in
    ``[start, end)``, highest first, ties by key."""
    inside = events[(events.t >= start) & (events.t < end)]
    values = inside.groupby(key)[value].agg(how)
    return sorted(((k, int(v)) for k, v in values.items()), key=lambda kv: (-kv[1], kv[0]))[:n]


def sessionize(events: pd.DataFrame, key: str, gap: int, value: str | None = None) -> pd.DataFrame:
    """Every key's sessions from scratch: events sorted by key and time, a new session where the key changes or two
    neighbours lie more than ``gap`` apart (two exactly ``gap`` apart are one session). Per session its key,
    ``start``, ``end`` and ``count``, and for a ``value`` column its ``sum``, ``min`` and ``max``; by key, oldest first."""
    events = events.sort_values([key, "t"], kind="stable").reset_index(drop=True)
    new = (events[key] != events[key].shift()) | (events.t - events.t.shift() > gap)
    events["session"] = new.cumsum()
    measures: dict[str, Any] = {key: (key, "first"), "start": ("t", "min"), "end": ("t", "max"), "count": ("t", "size")}
    if value is not None:
        measures.update(sum=(value, "sum"), min=(value, "min"), max=(value, "max"))
    return events.groupby("session").agg(**measures).reset_index(drop=True)


def session_top(sessions: pd.DataFrame, key: str, by: str, n: int,
                per_second: int = 1) -> list[tuple[str, float]]:
    """The ``n`` keys with the most sessions (``count``) or the longest one (``longest``, in seconds: ``t``'s units
    per second given), highest first, ties by key."""
    if by == "count":
        values = sessions.groupby(key).size().astype(float)
    else:
        values = (sessions.end - sessions.start).groupby(sessions[key]).max().astype(float) / per_second
    return sorted(((k, float(v)) for k, v in values.items()), key=lambda kv: (-kv[1], kv[0]))[:n]
