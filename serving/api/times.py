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
microsecond before a window boundary is in the earlier window.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Annotated, Any

from pydantic import BeforeValidator, TypeAdapter, ValidationError, WithJsonSchema
from pydantic_core import PydanticCustomError

from shared_logic.events import TIME_MAX, TIME_MIN, TIME_RANGE, as_utc

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_EPOCH_SECONDS = re.compile(r"-?[0-9]{1,30}(\.[0-9]{1,6})?")
_EPOCH_PATTERN = r"^-?[0-9]+(\.[0-9]{1,6})?$"
_ISO_START = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ]")
_ISO = TypeAdapter(datetime)

FORMS = ("ISO 8601 with date and time (2024-03-01T09:00:00Z; no offset means UTC) or epoch seconds "
         "(1709283600, at most 6 decimals; never milliseconds)")
#: What the OpenAPI document says about a time parameter (the description adds the range).
SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "format": "date-time"},
        {"type": "string", "pattern": _EPOCH_PATTERN},
    ],
    "examples": ["2024-03-01T09:00:00Z", "1709283600"],
}


def _refuse(text: str, problem: str) -> PydanticCustomError:
    shown = text if len(text) <= 64 else text[:61] + "..."
    return PydanticCustomError("time", "{shown} {problem}", {"shown": repr(shown), "problem": problem})


def parse_time(value: Any) -> datetime | None:
    """A query parameter's time as an aware UTC datetime (see the module doc); raises PydanticCustomError."""
    if value is None or isinstance(value, datetime):
        return value
    text = str(value).strip()
    if _EPOCH_SECONDS.fullmatch(text):
        seconds = Decimal(text)
        micros = int(seconds * 1_000_000)
        if not _micros(TIME_MIN) <= micros <= _micros(TIME_MAX):
            raise _refuse(text, f"is outside the supported time range {TIME_RANGE}: epoch seconds (never "
                                f"milliseconds) from {_micros(TIME_MIN) // 10**6} to {_micros(TIME_MAX) // 10**6}")
        return EPOCH + timedelta(microseconds=micros)
    if not _ISO_START.match(text):
        raise _refuse(text, f"is not a time: give {FORMS}")
    try:
        parsed = _ISO.validate_python(text)
    except ValidationError:
        raise _refuse(text, f"is not a valid time: give {FORMS}") from None
    utc = as_utc(parsed)
    if utc is None:
        raise _refuse(text, f"is outside the supported time range {TIME_RANGE} (in UTC, after applying its offset)")
    return utc


def _micros(t: datetime) -> int:
    return (t - EPOCH) // timedelta(microseconds=1)


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
