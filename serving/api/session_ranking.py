"""Top keys of a session view by session count or longest session in a range: exact, or refused.

A key whose sessions folded past ``max_sessions`` touch the range has a score known only within bounds
(``score_bounds``): outside the part's uncertain span (``shared_logic.sessions.Part.uncertain``) the kept
sessions are exact, and inside it every true session is made of kept and folded sessions there. A ranking
is still exact when no such key can reach the top ``n`` (its best possible score ranks below the ``n``-th
exact one, ties broken by key as in the answer): then its value is not shown and cannot change who is
shown. Otherwise ``rank`` refuses (``UncertainRankingError``, a 422) naming the key, its bounds and the fix.
So an all-time top-N answers whenever keys with folded sessions cannot reach it, instead of never.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from serving.api.errors import BadQueryError
from shared_logic.sessions import MICROS, Part, overlapping

By = Literal["count", "longest"]


class UncertainRankingError(BadQueryError):
    """A key's folded sessions leave its score uncertain enough to change the top ``n`` (the message names it)."""


def score_bounds(part: Part, gap: int, by: By, start: int, end: int) -> tuple[float | None, float] | None:
    """The lowest and highest ``by`` the key's true sessions overlapping ``[start, end)`` (microseconds) can have
    (seconds for ``longest``): equal when known exactly; a lowest of None when the key may have no session
    there; None when it surely has none."""
    inside = overlapping(part.sessions, start, end)
    span = None if part.exact_in(gap, start, end) else part.uncertain(gap)
    if span is None:
        exact = float(len(inside)) if by == "count" else max((s.duration for s in inside), default=0) / MICROS
        return (exact, exact) if inside else None
    f, (lo, hi) = part.folded, span
    near = [s for s in part.sessions if s.start <= hi and s.end >= lo]  # may belong with folded sessions
    sure = [s for s in inside if s not in near]  # exactly true sessions
    assert f.start is not None and f.end is not None  # a span means something is folded
    # a near session in the range, or a folded session's first or last event there: some true session near
    # the folded ones overlaps the range
    near_inside = len(inside) > len(sure) or start <= f.start < end or start <= f.end < end
    present = bool(sure) or near_inside
    if by == "count":  # each true session near the folded ones holds a near or a folded session
        low = len(sure) + near_inside
        return (float(low) if present else None), float(len(sure) + len(near) + f.sessions)
    known = [s.duration for s in inside] + ([f.longest] if start <= f.start and f.end < end else [])
    core = max([f.end] + [s.end for s in near]) - min([f.start] + [s.start for s in near])
    return (max(known, default=0) / MICROS if present else None), max([core] + [s.duration for s in sure]) / MICROS


def rank(view: str, scores: Iterable[tuple[str, tuple[float | None, float] | None]], by: By, n: int,
         where: str) -> list[tuple[str, float]]:
    """The top ``n`` (key, score) by score, ties by key, from each key's ``score_bounds`` (None: no session in the
    range, not ranked). ``UncertainRankingError`` when a key with uncertain bounds could be among them; ``where``
    names the range in its message."""
    exact: list[tuple[str, float]] = []
    unsure: list[tuple[str, float | None, float]] = []
    for key, bounds in scores:
        if bounds is not None and bounds[0] == bounds[1]:
            exact.append((key, bounds[1]))
        elif bounds is not None:
            unsure.append((key, *bounds))
    top = sorted(exact, key=lambda kv: (-kv[1], kv[0]))[:n]
    for key, low, high in sorted(unsure, key=lambda k: (-k[2], k[0])):
        if len(top) < n or (-high, key) < (-top[-1][1], top[-1][0]):
            known = f"{low:g}..{high:g}" if low is not None else f"at most {high:g} (maybe no session)"
            raise UncertainRankingError(
                f"{where}: key {key!r} of view {view!r} has sessions folded past max_sessions there, so its {by} is "
                f"only known to be {known}, which may place it among the top {n}: ask for a range that leaves its "
                f"folded sessions out (GET /v1/views/{view}/sessions/keys/{key} shows their span), a smaller n, or "
                "raise the view's max_sessions (a logic change, recomputed)")
    return top
