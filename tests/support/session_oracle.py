"""Gap sessionization written from scratch for tests, never the code's own (``shared_logic.sessions.sessions_of``):
events sorted by time, cut wherever two neighbours lie more than the gap apart (exactly the gap apart: one session,
as the README says). Each test sums up its runs' measures itself, in plain Python."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

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
