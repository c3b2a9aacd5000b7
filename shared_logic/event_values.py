"""What a value may be beyond its type: one rule per kind, for every ingest path and every query.

``shared_logic.events`` applies these rules to each event (HTTP ingest, file ingest, backfill and
Spark ingest all validate through it); ``serving.api.times`` reads query times with the same one.

* **Times.** A time is a datetime, or text in one of two forms: ISO 8601 with a date and a time
  (``2024-03-01T09:00:00Z``; no offset means UTC), or epoch seconds: a decimal number of seconds,
  optionally negative, at most 6 decimals (``1709283600``, ``1709283600.25``), always seconds however
  large (``1709283600000`` is the year 56135, refused by the range), never milliseconds; no ``+``,
  exponent, ``nan`` or ``inf``. Either way it must lie in ``TIME_MIN`` .. ``TIME_MAX`` once in UTC.
  Epoch seconds are read exactly (no float rounding).
* **Integers** are 64-bit signed (``INT_MIN`` .. ``INT_MAX``), in int fields and float fields alike:
  an integer beyond that range is refused, never rounded into a float.
* **JSON objects** name each key once (``repeated_key``): JSON parsers keep the last value of a
  repeated key without a word, so a repeated key is refused rather than guessed at.
* **Echo.** A message shows at most ``ECHO_LIMIT`` characters of a value a client sent (``echo``).
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic_core import PydanticCustomError

#: Earliest and latest time an event (or a query) may name, in UTC: the range of a timestamp.
TIME_MIN = datetime.min.replace(tzinfo=timezone.utc)
TIME_MAX = datetime.max.replace(tzinfo=timezone.utc)
#: The allowed range as people read it (in messages and documentation).
TIME_RANGE = "0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999Z"
#: Range of an integer in an event (an Arrow / Spark 64-bit signed integer column).
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
#: The two forms of a time written as text.
TIME_FORMS = ("ISO 8601 with date and time (2024-03-01T09:00:00Z; no offset means UTC) or epoch seconds "
              "(1709283600, at most 6 decimals; never milliseconds)")
#: Most characters of a value a client sent that a message echoes.
ECHO_LIMIT = 100

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
EPOCH_SECONDS = re.compile(r"-?[0-9]{1,30}(\.[0-9]{1,6})?")
_ISO_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
#: The usual spelling of an ISO time, which Python's parser reads exactly as pydantic's does (checked by
#: ``tests/shared_logic/test_event_time_rules.py``); anything else goes to pydantic's.
_COMMON_ISO = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?"
                         r"(Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])?")
_ISO = TypeAdapter(datetime)
_MICROSECOND = timedelta(microseconds=1)


def echo(value: str) -> str:
    """``value`` quoted as a message shows it: whole up to ``ECHO_LIMIT`` characters, else cut, marked with
    "…" and its length."""
    if len(value) <= ECHO_LIMIT:
        return repr(value)
    return f"{value[:ECHO_LIMIT]!r}… ({len(value)} characters)"


def clip(value: str) -> str:
    """``value`` cut to ``ECHO_LIMIT`` characters, marked with "…" (for a name a message quotes itself)."""
    return value if len(value) <= ECHO_LIMIT else value[:ECHO_LIMIT] + "…"


def as_utc(t: datetime) -> datetime | None:
    """``t`` in UTC (a naive ``t`` is taken as UTC), or None when that is outside ``TIME_MIN`` .. ``TIME_MAX``."""
    if t.tzinfo is None:
        return t.replace(tzinfo=timezone.utc)
    try:
        return t.astimezone(timezone.utc)
    except OverflowError:
        return None


def _micros(t: datetime) -> int:
    return (t - EPOCH) // _MICROSECOND


_FIRST_MICROS, _LAST_MICROS = _micros(TIME_MIN), _micros(TIME_MAX)


def _refuse(text: str, problem: str) -> PydanticCustomError:
    return PydanticCustomError("time", "{shown} {problem}", {"shown": echo(text), "problem": problem})


def time_from_text(text: str) -> datetime:
    """A time written as text (see the module doc) as an aware UTC datetime; PydanticCustomError naming
    what was sent and the forms, or the range, otherwise."""
    utc = as_utc(parse_time_text(text))
    if utc is None:
        raise _refuse(text, f"is outside the supported time range {TIME_RANGE} (in UTC, after applying its offset)")
    return utc


def parse_time_text(text: str) -> datetime:
    """``text`` read as a time by the rule of the module doc, with the offset it names (epoch seconds: UTC),
    not yet checked against the range once in UTC (``as_utc`` does that); PydanticCustomError otherwise."""
    if _COMMON_ISO.fullmatch(text):  # the usual spelling: Python's C parser reads it as pydantic's does
        try:
            return datetime.fromisoformat(text)
        except ValueError:
            pass  # e.g. February 30th: pydantic's parser says what is wrong, below
    if EPOCH_SECONDS.fullmatch(text):
        micros = int(Decimal(text) * 1_000_000)
        if not _FIRST_MICROS <= micros <= _LAST_MICROS:
            raise _refuse(text, f"is outside the supported time range {TIME_RANGE}: epoch seconds (never "
                                f"milliseconds) from {_FIRST_MICROS // 10**6} to {_LAST_MICROS // 10**6}")
        return EPOCH + timedelta(microseconds=micros)
    if not _ISO_DATE.match(text):
        raise _refuse(text, f"is not a time: give {TIME_FORMS}")
    try:  # strictly, as a JSON string: a date and a time (the numeric forms were taken above)
        return _ISO.validate_strings(text, strict=True)
    except ValidationError as e:
        reason = str(e.errors()[0].get("msg", "")).partition(", ")[2]
        raise _refuse(text, f"is not a valid time{f' ({reason})' if reason else ''}: give {TIME_FORMS}") from None


def time_from_number(value: int | float) -> datetime:
    """A number of epoch seconds (from Python, not JSON) as a time, by the rule of ``parse_time_text``."""
    return parse_time_text(str(value) if isinstance(value, int) else repr(value))


def read_time(value: Any, json_mode: bool) -> Any:
    """An event's time as sent, read by the rules above: text in either form; a number only from Python
    (a JSON number is refused: times are JSON strings); anything else is left to the model."""
    if isinstance(value, str):
        return parse_time_text(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if json_mode:
            raise PydanticCustomError("time_type", "a JSON number is not a time: send {forms} as a JSON string",
                                      {"forms": TIME_FORMS})
        return time_from_number(value)
    return value


def int_range_error(value: int, field_type: str) -> PydanticCustomError:
    """The refusal of an integer outside 64 bits (for a float field, with how to send a float instead)."""
    shown = str(value) if value.bit_length() <= 300 else f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    message = f"{shown} is outside the 64-bit integer range {INT_MIN} to {INT_MAX}"
    if field_type == "float":
        message += (": every integer an event carries must fit 64 bits, a float field's too; to send a float, "
                    "write it with a decimal point or an exponent")
        if value.bit_length() <= 1023:
            message += f" ({float(value)!r})"
    return PydanticCustomError("int_range", message)


def fit_int(value: Any, field_type: str) -> Any:
    """``value`` unchanged, or PydanticCustomError when it is an integer outside 64 bits; text (a CSV cell)
    is read as Python reads an integer, since a float field would take it as one."""
    number = value
    if isinstance(value, str):
        try:
            number = int(value)
        except ValueError:
            return value
    if type(number) is int and not INT_MIN <= number <= INT_MAX:
        raise int_range_error(number, field_type)
    return value


class _Repeat(str):
    """A key some JSON object gives twice (what the object reads as while looking for repeats)."""


def _first_repeat(pairs: list[tuple[str, Any]]) -> _Repeat | None:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            return _Repeat(key)
        seen.add(key)
    return None


def _read_repeats(text: str | bytes) -> Any:
    """``text`` parsed with every object replaced by the first key it repeats (None: none); None when ``text``
    is not JSON (its parser reports that)."""
    try:
        return json.loads(text, object_pairs_hook=_first_repeat)
    except (ValueError, RecursionError):
        return None


def repeated_key(text: str | bytes) -> str | None:
    """The first key the JSON object ``text`` gives twice, or None (none, or not an object)."""
    found = _read_repeats(text)
    return str(found) if isinstance(found, _Repeat) else None


def repeated_keys_of_array(text: str | bytes) -> list[tuple[int, str]]:
    """(index, key) of every object of the JSON array ``text`` that gives a key twice (its first such key)."""
    found = _read_repeats(text)
    if not isinstance(found, list):
        return []
    return [(i, str(e)) for i, e in enumerate(found) if isinstance(e, _Repeat)]


#: The end of a JSON object's key: its closing ``"``, then ``:`` (whitespace between).
_KEY_END = re.compile(r'"[ \t\n\r]*:')
_KEY_END_BYTES = re.compile(_KEY_END.pattern.encode())


def keys_at_most(text: str | bytes) -> int:
    """A bound on the keys of every JSON object in ``text``: never fewer (each key's closing quote is followed
    by ``:``), more when a string holds ``":`` itself. So when it equals the fields a valid flat event set,
    no key of it was given twice; otherwise ``repeated_key`` tells exactly."""
    if isinstance(text, bytes):
        return len(_KEY_END_BYTES.findall(text))
    return len(_KEY_END.findall(text))
