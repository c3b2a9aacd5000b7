"""Which panes a query addresses: one window, a range, or all time; relative times resolved once per request.

A windowed view's rows are *panes* (``shared_logic.views``): a tumbling view's pane is its window, a
sliding view's is its slide. Every windowed read names panes, and an answer combines them with each
measure's monoid, exactly:

* ``window_start=T``: the window whose first pane holds ``T`` (a tumbling view: the window holding ``T``).
* ``window_end=T``: the window ending at the first pane boundary at or after ``T``: its last pane holds
  the instant just before ``T``. ``window_end=now`` is "the window ending now", its last pane the
  current one (partly in the future: it holds what has arrived).
* ``from=A&to=B``: every pane overlapping ``[A, B)``, whole; ``to`` left out is now (``from`` left out
  is a 422: a range has its start).
* ``last=D``: ``from=now-D&to=now``.

A session view has no panes: ``from``/``to`` and ``last`` name a range by the same rule (the one ``_range``),
its sessions overlapping it are the answer; no time at all is all time.

Relative times (``-1h``, ``now``, ``last``) are resolved against one reading of the request's clock
(``serving.api.clock``), which the answer echoes as ``now``, so every relative time of one request means
the same instant. A query combines at most ``max_panes`` panes (``LAMBDA_MAX_RANGE_PANES`` for key reads and
listings, ``LAMBDA_MAX_TOP_PANES`` for a top-N over several panes: each bounds the work of one atomic read);
beyond, a 422 names the setting. Times are exact (whole seconds and microseconds, no floats).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from serving.api.clock import Clock
from serving.api.errors import BadQueryError
from serving.api.times import RelativeTime, at, epoch_seconds
from shared_logic.event_values import TIME_MAX, TIME_MIN, TIME_RANGE
from shared_logic.views import SlidingWindow, View

#: Epoch seconds a pane addressed by a query must lie in: its start at or after TIME_MIN and its end
#: (exclusive, itself an answer's time) at or before TIME_MAX, rounded down to a second.
_FIRST, _LAST = epoch_seconds(TIME_MIN), epoch_seconds(TIME_MAX)
_MICROSECOND = timedelta(microseconds=1)

#: A time parameter as read (``serving.api.times``): absolute, or relative to the request's clock.
AskedTime = datetime | RelativeTime | None


@dataclass(frozen=True)
class TimeParams:
    """A request's time parameters, as sent."""

    window_start: AskedTime = None
    window_end: AskedTime = None
    start: AskedTime = None
    end: AskedTime = None
    last: timedelta | None = None

    @property
    def given(self) -> list[str]:
        named = {"window_start": self.window_start, "window_end": self.window_end, "from": self.start,
                 "to": self.end, "last": self.last}
        return [name for name, value in named.items() if value is not None]

    @property
    def relative(self) -> bool:
        """Whether resolving them reads the clock (``to`` left out of a range is now, too)."""
        times = (self.window_start, self.window_end, self.start, self.end)
        return self.last is not None or (self.start is not None and self.end is None) or \
            any(isinstance(t, RelativeTime) for t in times)


@dataclass(frozen=True)
class Span:
    """What a query addresses: pane starts (epoch seconds, oldest first; [] for all time) and how it was asked."""

    panes: list[int]
    pane_seconds: int = 0
    #: The one window asked for (``window_start`` / ``window_end``): its start and end, epoch seconds.
    window: tuple[int, int] | None = None
    #: The range asked for (``from``/``to``, ``last``), resolved.
    range: tuple[datetime, datetime] | None = None
    #: The clock reading relative times were resolved against (None: the request had none).
    now: datetime | None = None

    @property
    def covered(self) -> tuple[datetime, datetime] | None:
        """From the first pane's start to the last one's end (None for all time)."""
        return (at(self.panes[0]), at(self.panes[-1] + self.pane_seconds)) if self.panes else None


def resolve(view: View, asked: TimeParams, clock: Clock, max_panes: int, setting: str) -> Span:
    """The panes of ``view`` a request addresses (see the module doc); 422 naming the parameter and the fix.
    ``setting``: the name of the bound ``max_panes`` comes from, for the message. A session view has no panes:
    its span is the range asked (``from``/``to``, ``last``, resolved by the same rule) or, with none, all time."""
    now = clock.now() if asked.relative else None
    if view.sessions is not None:
        _exclusive(view, asked)
        return Span([], range=_range(asked, now), now=now) if asked.given else Span([])
    if view.window is None:
        if asked.given:
            raise BadQueryError(f"view {view.name!r} has no window; drop {', '.join(asked.given)}")
        return Span([])
    _exclusive(view, asked)
    if asked.window_start is not None or asked.window_end is not None:
        return _window(view, asked, now, max_panes, setting)
    start, end = _range(asked, now)
    pane = view.window.pane_seconds
    first = _pane_of(view, "last" if asked.last else "from", start)
    count = -(-(end - at(first)) // timedelta(seconds=pane))
    if count > max_panes:
        raise BadQueryError(f"{'last' if asked.last else 'from/to'}: the range spans {count} panes of {pane} s; at "
                            f"most {max_panes} per query ({setting}): ask for a shorter range (from/to, last) "
                            "or one window (window_start or window_end)")
    if first + count * pane > _LAST:
        raise _outside(view, "to", end - _MICROSECOND, pane)
    return Span([first + i * pane for i in range(count)], pane, range=(start, end), now=now)


def _range(asked: TimeParams, now: datetime | None) -> tuple[datetime, datetime]:
    """The range ``last`` or ``from``/``to`` name (``to`` left out: now), resolved at ``now``; every kind of view
    reads a range by this rule. 422 naming the parameter."""
    if asked.last is not None:
        assert now is not None
        return _resolved("last", now - asked.last if now - TIME_MIN > asked.last else None), now
    start = _resolved("from", _absolute(asked.start, now))
    end = _resolved("to", now if asked.end is None else _absolute(asked.end, now))
    if end <= start:
        raise BadQueryError(f"'to' ({end.isoformat()}) must be after 'from' ({start.isoformat()}); swap them, "
                            "or give last=<duration> (e.g. last=1h)")
    return start, end


def describe(view: View) -> str:
    """How a view's windows are laid out, for messages."""
    window = view.window
    if view.sessions is not None:
        return f"sessions of events at most {int(view.sessions.gap.total_seconds())} s apart"
    if isinstance(window, SlidingWindow):
        return f"{window.seconds} s windows every {window.pane_seconds} s, stored as {window.pane_seconds} s panes"
    return f"{window.seconds} s tumbling windows" if window else "all time"


def _exclusive(view: View, asked: TimeParams) -> None:
    """One way of naming the time at once; a range has its start (``to`` alone is refused for every kind)."""
    given, sessions = asked.given, view.sessions is not None
    forms = "from/to or last" if sessions else "window_start, window_end, from/to or last"
    one = [g for g in given if g in ("window_start", "window_end")]
    if sessions and one:
        raise BadQueryError(f"{one[0]}: view {view.name!r} is a session view ({describe(view)}), it has no windows: "
                            f"give {forms}, or nothing for all time")
    if len(one) > 1 or (one and len(given) > 1):
        raise BadQueryError(f"give one of {forms}, not {' and '.join(given)}")
    if "last" in given and len(given) > 1:
        raise BadQueryError(f"last: give last=<duration> or from/to, not {' and '.join(given)}")
    if given == ["to"]:
        raise BadQueryError("to: a range needs its start: give from=<time> with it (to left out is now), or "
                            "last=<duration> (e.g. last=1h)")
    if not given and not sessions:
        raise BadQueryError(
            f"view {view.name!r} is windowed ({describe(view)}): give window_start=<time> or window_end=<time> "
            "(one window; window_end=now: the window ending now), from=<time>&to=<time> (a range; to defaults to "
            "now) or last=<duration> (e.g. last=15m); times are ISO 8601, epoch seconds or relative (-1h, now)")


def _absolute(t: AskedTime, now: datetime | None) -> datetime | None:
    """``t`` resolved against the request's clock reading (None: out of what a datetime holds)."""
    if isinstance(t, RelativeTime):
        assert now is not None
        try:
            return t.resolve(now)
        except OverflowError:
            return None
    return t


def _resolved(param: str, t: datetime | None) -> datetime:
    if t is None:
        raise BadQueryError(f"{param}: reaches before the supported time range {TIME_RANGE}; ask for less")
    return t


def _window(view: View, asked: TimeParams, now: datetime | None, max_panes: int, setting: str) -> Span:
    window = view.window
    assert window is not None
    pane, panes = window.pane_seconds, window.panes
    if panes > max_panes:
        raise BadQueryError(f"view {view.name!r}: a window covers {panes} panes, more than the {max_panes} a query "
                            f"may combine; raise {setting}")
    if asked.window_start is not None:
        param, t = "window_start", _resolved("window_start", _absolute(asked.window_start, now))
        first = window.start_of(epoch_seconds(t))
    else:
        param, t = "window_end", _resolved("window_end", _absolute(asked.window_end, now))
        first = -(-(t - at(0)) // timedelta(seconds=pane)) * pane - window.seconds
    if first < _FIRST or first + window.seconds > _LAST:
        raise _outside(view, param, t, window.seconds, end=param == "window_end")
    return Span([first + i * pane for i in range(panes)], pane, window=(first, first + window.seconds), now=now)


def _pane_of(view: View, param: str, t: datetime) -> int:
    """Start (epoch seconds) of the pane of ``view`` holding ``t``, which must lie in the supported range."""
    pane = view.window.pane_seconds  # type: ignore[union-attr]
    start = view.window.start_of(epoch_seconds(t))  # type: ignore[union-attr]
    if start < _FIRST or start + pane > _LAST:
        raise _outside(view, param, t, pane)
    return start


def _outside(view: View, param: str, t: datetime, seconds: int, *, end: bool = False) -> BadQueryError:
    """``t`` names a window (or pane) of ``seconds`` reaching outside the supported range: say which times do not."""
    pane = view.window.pane_seconds  # type: ignore[union-attr]
    earliest = -(-_FIRST // pane) * pane  # the first pane start in range
    latest = (_LAST - seconds) // pane * pane  # the last start whose window ends in range
    if end:  # window_end names a window by its end: from just after the first end in range to the last end
        low, high = at(earliest + seconds) - timedelta(seconds=pane) + _MICROSECOND, at(latest + seconds)
    else:
        low, high = at(earliest), at(latest + pane) - _MICROSECOND
    return BadQueryError(
        f"{param}: the {seconds} s window of view {view.name!r} ({describe(view)}) at {t.isoformat()} reaches outside "
        f"the supported time range {TIME_RANGE}; for this view give a time from {low.isoformat()} to "
        f"{high.isoformat()}"
    )
