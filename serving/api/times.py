"""Times in query parameters (``window_start``, ``window_end``, ``from``, ``to``) and durations (``last``).

A time is given either as

* **ISO 8601** with a date and a time, e.g. ``2024-03-01T09:00:00Z``, ``2024-03-01T10:00:00+01:00``
  (no offset: UTC), or
* **epoch seconds**: a decimal number of seconds since 1970-01-01T00:00:00Z, optionally negative,
  with at most 6 decimals, e.g. ``1709283600`` or ``1709283600.25``. It is always seconds, however
  large (``253402300740`` is 9999-12-31T23:59:00Z, never milliseconds); exponents (``1e9``),
  ``nan`` and ``inf`` are refused.

* **relative to now**: ``now``, or ``now`` minus a duration: ``-1h``, ``now-15m``, ``-1h30m`` (units
  ``s``, ``m``, ``h``, ``d``, ``w``). Read here as a ``RelativeTime``; a request resolves all of its
  relative times against one reading of its clock (``serving.api.windows``) and echoes that reading.

Either way the time must lie in ``TIME_RANGE`` once in UTC. Anything else is a 422 that names the
parameter, what was sent and the forms. A *duration* (``last=15m``) is a relative time's tail
without the sign: one or more ``<whole number><unit>``. Parsing is exact (no float rounding): a time one
microsecond before a window boundary is in the earlier window. Event times follow the same rule
(``shared_logic.event_values``), so a time is read alike in an event and in a query.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Annotated, Any

from pydantic import PlainValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

from shared_logic.event_values import EPOCH, TIME_FORMS, echo, time_from_text

_EPOCH_PATTERN = r"^-?[0-9]+(\.[0-9]{1,6})?$"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
_DURATION_TEXT = r"(?:[0-9]{1,9}[smhdw])+"
_DURATION = re.compile(_DURATION_TEXT)
_RELATIVE = re.compile(rf"now|(?:now)?-({_DURATION_TEXT})")
_PART = re.compile(r"([0-9]+)([smhdw])")
#: Longest time text a query takes (every time in the range is far shorter; 422 above).
MAX_TIME_CHARS = 64
#: The forms a query time takes, as messages name them.
QUERY_TIME_FORMS = TIME_FORMS + ", or relative to now (now, -1h, now-15m, -1h30m; units s, m, h, d, w)"
#: What the OpenAPI document says about a time parameter (the description adds the range).
SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "format": "date-time", "maxLength": MAX_TIME_CHARS},
        {"type": "string", "pattern": _EPOCH_PATTERN, "maxLength": MAX_TIME_CHARS},
        {"type": "string", "pattern": f"^{_RELATIVE.pattern}$", "maxLength": MAX_TIME_CHARS},
    ],
    "examples": ["2024-03-01T09:00:00Z", "1709283600", "-1h"],
}
DURATION_SCHEMA: dict[str, Any] = {"type": "string", "pattern": f"^{_DURATION_TEXT}$", "maxLength": MAX_TIME_CHARS,
                                   "examples": ["15m", "1h", "1h30m"]}


class RelativeTime(str):
    """A time relative to the request's clock, its text as sent: ``now`` minus ``ago`` (``serving.api.windows``
    resolves it). A ``str``, so that FastAPI takes it for the scalar query parameter it is."""

    ago: timedelta

    def __new__(cls, text: str, ago: timedelta) -> RelativeTime:
        made = super().__new__(cls, text)
        made.ago = ago
        return made

    def resolve(self, now: datetime) -> datetime:
        """The time at clock reading ``now``; OverflowError outside what a datetime holds."""
        return now - self.ago


def _duration(text: str) -> timedelta:
    """A duration's text (already matched by ``_DURATION``) as a timedelta; OverflowError when huge."""
    return timedelta(seconds=sum(int(n) * _UNITS[unit] for n, unit in _PART.findall(text)))


def parse_duration(value: Any) -> timedelta | None:
    """A query parameter's duration (``15m``, ``1h30m``), at least a second; raises PydanticCustomError."""
    if value is None or isinstance(value, timedelta):
        return value
    text = str(value).strip()
    if len(text) <= MAX_TIME_CHARS and _DURATION.fullmatch(text):
        try:
            duration = _duration(text)
        except OverflowError:
            duration = timedelta(0)
        if timedelta(seconds=1) <= duration <= timedelta(days=3_650_000):
            return duration
    raise PydanticCustomError("duration", "{shown} is not a duration: give a whole number and a unit, one or more "
                              "times (15m, 1h, 1h30m, 7d; units s, m, h, d, w), at least 1s", {"shown": echo(text)})


def parse_time(value: Any) -> datetime | RelativeTime | None:
    """A query parameter's time as an aware UTC datetime, or a ``RelativeTime`` (see the module doc); raises
    PydanticCustomError. Absolute times follow the events' own rule (``shared_logic.event_values.time_from_text``),
    around surrounding spaces."""
    if value is None or isinstance(value, (datetime, RelativeTime)):
        return value
    text = str(value)
    if len(text) > MAX_TIME_CHARS:
        raise PydanticCustomError("time", "{shown} is longer than {limit} characters: give {forms}",
                                  {"shown": echo(text), "limit": MAX_TIME_CHARS, "forms": QUERY_TIME_FORMS})
    text = text.strip()
    relative = _RELATIVE.fullmatch(text)
    if relative:
        try:
            return RelativeTime(text, _duration(relative.group(1) or ""))
        except OverflowError:
            pass  # refused below, as out of range
    if relative or text.startswith("now"):
        raise PydanticCustomError("time", "{shown} is not a time relative to now: give {forms}",
                                  {"shown": echo(text), "forms": QUERY_TIME_FORMS})
    try:
        return time_from_text(text)
    except PydanticCustomError as e:
        if not re.fullmatch(r"-[0-9]*[a-zA-Z].*", text):
            raise
        raise PydanticCustomError("time", "{shown} is not a time relative to now (units s, m, h, d, w): give {forms}",
                                  {"shown": echo(text), "forms": QUERY_TIME_FORMS}) from e


def epoch_seconds(t: datetime) -> int:
    """Whole epoch seconds of ``t``, rounded down (exact: no float)."""
    return (t - EPOCH) // timedelta(seconds=1)


def at(seconds: int) -> datetime:
    """The UTC datetime of whole epoch ``seconds``."""
    return EPOCH + timedelta(seconds=seconds)


#: A time query parameter: ``Annotated[QueryTime, Query(...)]`` reads any form, checks an absolute one's range.
QueryTime = Annotated[
    datetime | RelativeTime | None,
    PlainValidator(parse_time),
    WithJsonSchema(SCHEMA),
]
#: A duration query parameter (``last=15m``).
QueryDuration = Annotated[
    timedelta | None,
    PlainValidator(parse_duration),
    WithJsonSchema(DURATION_SCHEMA),
]
