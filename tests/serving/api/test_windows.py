"""Which panes a query addresses, with relative times resolved against one (fake) clock per request.

The expected panes are written out by hand from the rule in ``serving.api.windows``'s docstring: a sliding
window of an hour every five minutes is twelve panes; ``window_end=now`` ends at the first pane boundary at
or after now; a range covers every pane it overlaps, whole. Bad input is a 422 naming the parameter and the fix.
A session view's range is read by the same rule (relative times, ``to`` left out, ``to`` alone refused, the same
words), without panes; no time at all is all time.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from serving.api.errors import BadQueryError
from serving.api.times import RelativeTime, parse_duration, parse_time
from serving.api.windows import Span, TimeParams, resolve
from shared_logic import Count, SlidingWindow, TumblingWindow, View
from shared_logic.sessions import SessionWindow

NOW = datetime(2024, 3, 1, 9, 7, 30, tzinfo=timezone.utc)  # 2.5 min into the 09:05 pane
HOUR_EVERY_5M = View("trend", keys=("k",), measures=(Count(),),
                     window=SlidingWindow(timedelta(hours=1), timedelta(minutes=5)))
MINUTELY = View("per_minute", keys=("k",), measures=(Count(),), window=TumblingWindow(timedelta(minutes=1)))
ALL_TIME = View("totals", keys=("k",), measures=(Count(),))
VISITS = View("visits", keys=("k",), measures=(Count(),), sessions=SessionWindow(timedelta(minutes=30)))


class FixedClock:
    def __init__(self, now: datetime) -> None:
        self.readings, self._now = 0, now

    def now(self) -> datetime:
        self.readings += 1
        return self._now


def _t(text: str) -> datetime | RelativeTime:
    value = parse_time(text)
    assert value is not None
    return value


def _epoch(t: datetime) -> int:
    return int(t.timestamp())


def _resolve(view: View, clock: FixedClock | None = None, max_panes: int = 2000, **params: object) -> Span:
    return resolve(view, TimeParams(**params), clock or FixedClock(NOW), max_panes, "LAMBDA_MAX_RANGE_PANES")  # type: ignore[arg-type]


def test_the_window_ending_now_is_twelve_panes_ending_with_the_current_one() -> None:
    clock = FixedClock(NOW)
    span = _resolve(HOUR_EVERY_5M, clock, window_end=_t("now"))
    end = datetime(2024, 3, 1, 9, 10, tzinfo=timezone.utc)  # the current pane's end
    assert span.window == (_epoch(end - timedelta(hours=1)), _epoch(end))
    assert span.panes == [_epoch(end - timedelta(hours=1)) + 300 * i for i in range(12)]
    assert span.now == NOW and clock.readings == 1


def test_a_sliding_window_by_its_start_and_by_its_end() -> None:
    by_start = _resolve(HOUR_EVERY_5M, window_start=_t("2024-03-01T08:03:00Z"))  # in the 08:00 pane
    assert by_start.window == (_epoch(datetime(2024, 3, 1, 8, tzinfo=timezone.utc)),
                               _epoch(datetime(2024, 3, 1, 9, tzinfo=timezone.utc)))
    by_end = _resolve(HOUR_EVERY_5M, window_end=_t("2024-03-01T09:00:00Z"))  # a boundary: the window ending there
    assert by_end.panes == by_start.panes and by_end.now is None
    assert _resolve(MINUTELY, window_end=_t("2024-03-01T09:00:00.000001Z")).panes == [
        _epoch(datetime(2024, 3, 1, 9, tzinfo=timezone.utc))]


def test_relative_ranges_resolve_against_one_clock_reading_and_cover_whole_panes() -> None:
    clock = FixedClock(NOW)
    span = _resolve(MINUTELY, clock, start=_t("-15m"), end=_t("now"))
    assert clock.readings == 1 and span.now == NOW and span.range == (NOW - timedelta(minutes=15), NOW)
    first = _epoch(datetime(2024, 3, 1, 8, 52, tzinfo=timezone.utc))  # 08:52:30's minute, whole
    assert span.panes == [first + 60 * i for i in range(16)]
    assert _resolve(MINUTELY, last=parse_duration("15m")).panes == span.panes
    assert _resolve(MINUTELY, start=_t("now-15m")).panes == span.panes  # `to` left out: now
    hour = _resolve(HOUR_EVERY_5M, last=parse_duration("1h"))  # 08:07:30 .. 09:07:30 overlaps 08:05 .. 09:10
    assert hour.panes == [_epoch(datetime(2024, 3, 1, 8, 5, tzinfo=timezone.utc)) + 300 * i for i in range(13)]


@pytest.mark.parametrize("view", [MINUTELY, VISITS])
def test_both_kinds_of_view_read_a_range_by_one_rule(view: View) -> None:
    clock = FixedClock(NOW)
    span = _resolve(view, clock, start=_t("-15m"), end=_t("now"))
    assert clock.readings == 1 and span.now == NOW and span.range == (NOW - timedelta(minutes=15), NOW)
    assert _resolve(view, last=parse_duration("15m")).range == span.range
    assert _resolve(view, start=_t("now-15m")).range == span.range  # `to` left out: now
    fixed = _resolve(view, start=_t("2024-03-01T08:00:00Z"), end=_t("2024-03-01T09:00:00Z"))
    assert fixed.now is None and fixed.range == (datetime(2024, 3, 1, 8, tzinfo=timezone.utc),
                                                 datetime(2024, 3, 1, 9, tzinfo=timezone.utc))


def test_a_session_view_has_no_panes_and_no_time_is_all_time() -> None:
    clock = FixedClock(NOW)
    assert _resolve(VISITS, clock) == Span([]) and clock.readings == 0
    assert _resolve(VISITS, last=parse_duration("1h")).panes == []


#: Refusals of a range that read alike for a windowed view and a session view.
RANGE_REFUSALS = [
    ({"start": "2024-03-01T10:00:00Z", "end": "2024-03-01T09:00:00Z"}, ["'to'", "after 'from'", "swap"]),
    ({"end": "2024-03-01T09:00:00Z"}, ["to:", "from=<time>", "last=<duration>"]),  # `to` without `from`
    ({"end": "now"}, ["to:", "from=<time>"]),
    ({"start": "2024-03-01T08:00:00Z", "last": "1h"}, ["from and last"]),
    ({"last": "3650000d"}, ["last:", "supported time range"]),
]


@pytest.mark.parametrize(("params", "words"), RANGE_REFUSALS)
def test_bad_ranges_are_refused_alike_for_windowed_and_session_views(params: dict[str, str], words: list[str]) -> None:
    parsed = {name: parse_duration(v) if name == "last" else _t(v) for name, v in params.items()}
    details = set()
    for view in (MINUTELY, VISITS):
        with pytest.raises(BadQueryError) as e:
            _resolve(view, **parsed)
        details.add(str(e.value))
        for word in words:
            assert word in str(e.value), (view.name, word, str(e.value))
    assert len(details) == 1, details


@pytest.mark.parametrize(("view", "params", "words"), [
    (MINUTELY, {"start": "2024-03-01T10:00:00Z", "end": "2024-03-01T09:00:00Z"}, ["'to'", "after 'from'", "swap"]),
    (MINUTELY, {"start": "-3d"}, ["from/to", "4321 panes", "LAMBDA_MAX_RANGE_PANES"]),
    (MINUTELY, {"window_start": "now", "last": "1h"}, ["window_start and last"]),
    (MINUTELY, {}, ["window_start", "window_end", "last=<duration>"]),
    (MINUTELY, {"end": "now"}, ["from=<time>"]),
    (ALL_TIME, {"last": "1h"}, ["no window", "drop last"]),
    (HOUR_EVERY_5M, {"window_end": "0001-01-01T00:30:00Z"}, ["window_end", "supported time range"]),
    (VISITS, {"window_end": "now"}, ["window_end", "session view", "from/to or last"]),
])
def test_bad_ranges_are_422_naming_the_parameter_and_the_fix(view: View, params: dict[str, str],
                                                             words: list[str]) -> None:
    parsed = {name: parse_duration(v) if name == "last" else _t(v) for name, v in params.items()}
    with pytest.raises(BadQueryError) as e:
        _resolve(view, **parsed)
    for word in words:
        assert word in str(e.value), (word, str(e.value))


def test_a_sliding_window_of_more_panes_than_allowed_names_the_setting() -> None:
    with pytest.raises(BadQueryError, match="raise LAMBDA_MAX_RANGE_PANES"):
        _resolve(HOUR_EVERY_5M, max_panes=6, window_end=_t("now"))


@pytest.mark.parametrize("text", ["-1x", "now+1h", "nowish", "-h", "now-"])
def test_unreadable_relative_times_say_the_forms(text: str) -> None:
    with pytest.raises(ValueError, match="relative to now"):
        parse_time(text)
