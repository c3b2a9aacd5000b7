"""Times in query parameters (``window_start``, ``from``, ``to``): the two forms read, and their range.

A time is given either as

* **ISO 8601** with a date and a time, e.g. ``2024-03-01T09:00:00Z``, ``2024-03-01T10:00:00+01:00``
  (no offset: UTC), or
* **epoch seconds**: a decimal number of seconds since 1970-01-01T00:00:00Z, optionally negative,
  with at most 6 decimals, e.g. ``1709283600`` or ``1709283600.25``. It is always seconds, however
  large (``253402300740`` is 9999-12-31T23:59:00Z, never milliseconds); exponents (``1e9``),
  ``nan`` and ``inf`` are refused.

Either way the time must lie in ``TIME_RANGE`` once in UTC. Anything else is a 422 that names the
parameter, what was sent and the two forms. Parsing is exact (no float rounding): a time one
microsecond before a window boundary is in the earlier window. Event times follow the same rule
(``shared_logic.event_values``), so a time is read alike in an event and in a query.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any

from pydantic import BeforeValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

from shared_logic.event_values import EPOCH, TIME_FORMS, echo, time_from_text

_EPOCH_PATTERN = r"^-?[0-9]+(\.[0-9]{1,6})?$"
#: Longest time text a query takes (every time in the range is far shorter; 422 above).
MAX_TIME_CHARS = 64
#: What the OpenAPI document says about a time parameter (the description adds the range).
SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "format": "date-time", "maxLength": MAX_TIME_CHARS},
        {"type": "string", "pattern": _EPOCH_PATTERN, "maxLength": MAX_TIME_CHARS},
    ],
    "examples": ["2024-03-01T09:00:00Z", "1709283600"],
}


def parse_time(value: Any) -> datetime | None:
    """A query parameter's time as an aware UTC datetime (see the module doc); raises PydanticCustomError.
    The rule is the events' own (``shared_logic.event_values.time_from_text``), around surrounding spaces."""
    if value is None or isinstance(value, datetime):
        return value
    text = str(value)
    if len(text) > MAX_TIME_CHARS:
        raise PydanticCustomError("time", "{shown} is longer than {limit} characters: give {forms}",
                                  {"shown": echo(text), "limit": MAX_TIME_CHARS, "forms": TIME_FORMS})
    return time_from_text(text.strip())


def epoch_seconds(t: datetime) -> int:
    """Whole epoch seconds of ``t``, rounded down (exact: no float)."""
    return (t - EPOCH) // timedelta(seconds=1)


def at(seconds: int) -> datetime:
    """The UTC datetime of whole epoch ``seconds``."""
    return EPOCH + timedelta(seconds=seconds)


#: A time query parameter: ``Annotated[QueryTime, Query(...)]`` reads either form, checks the range.
QueryTime = Annotated[
    datetime | None,
    BeforeValidator(parse_time),
    WithJsonSchema(SCHEMA),
]
