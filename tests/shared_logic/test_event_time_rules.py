"""One rule for a time written as text, in every entry point of ``EventSchema`` and in query times.

Before, an event's ``"1709283600000"`` was read by pydantic's guess (more than 2e10: milliseconds),
so 13 digits landed in the same window as the 10-digit seconds; a query's ``window_start`` read the
same text as seconds (the year 56135, refused). Now every entry point, and the query parameters,
read text by ``shared_logic.event_values``: ISO 8601 with date and time, or epoch seconds (always
seconds, at most 6 decimals), inside the supported range. The oracle is the text itself: epoch
seconds computed exactly from the digits, ISO text by ``datetime.fromisoformat``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError
from pydantic_core import PydanticCustomError

from serving.api.times import parse_time
from shared_logic import EventValidationError, load_pipeline
from shared_logic.event_values import _COMMON_ISO, parse_time_text

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
SCHEMA = load_pipeline("payments").schema


def event(time: Any) -> dict[str, Any]:
    return {"user_id": "u", "merchant": "m", "amount": 1.5, "event_time": time}


def as_json(time: str) -> str:
    return '{"user_id": "u", "merchant": "m", "amount": 1.5, "event_time": "' + time + '"}'


#: Every way an event's text reaches the schema: HTTP and JSON files, JSON arrays, CSV cells (text
#: coerced), Python dicts (``validate``).
ENTRY_POINTS: dict[str, Callable[[str], Any]] = {
    "json lines": lambda t: SCHEMA.validate_json_lines([(1, as_json(t))], source="s"),
    "json array": lambda t: SCHEMA.validate_json_array(f"[{as_json(t)}]", source="s"),
    "csv record": lambda t: SCHEMA.validate_records([("line 2", {**event(t), "amount": "1.5"})], source="s", strict=False),
    "python": lambda t: SCHEMA.validate([event(t)]),
}


def oracle(text: str) -> datetime:
    if text[:4].isdigit() and text[4:5] == "-":
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
        return parsed.astimezone(timezone.utc) if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)
    negative = text.startswith("-")
    whole, _, fraction = text.lstrip("-").partition(".")
    micros = int(whole) * 10**6 + int((fraction + "000000")[:6])
    return EPOCH + timedelta(microseconds=-micros if negative else micros)


ACCEPTED = ["1709283600", "1709283600.25", "-1.000001", "0", "20000000000", "253402300799.999999",
            "-62135596800", "2024-03-01T09:00:00Z", "2024-03-01T10:00:00.5+01:00", "2024-03-01T09:00:00"]
REFUSED = ["1709283600000", "253402300800", "-62135596801", "+1709283600", "1e9", "1709283600.", ".5",
           "1709283600.1234567", "nan", "2024-03-01", "yesterday", "", "2024-02-30T00:00:00Z", " 1709283600"]


@pytest.mark.parametrize("text", ACCEPTED)
def test_every_entry_point_reads_a_time_alike(text: str) -> None:
    want = oracle(text)
    for name, validate in ENTRY_POINTS.items():
        assert validate(text).column("event_time").to_pylist() == [want], (name, text)
    assert parse_time(text) == want


@pytest.mark.parametrize("text", REFUSED)
def test_every_entry_point_refuses_a_time_alike(text: str) -> None:
    messages = set()
    for name, validate in ENTRY_POINTS.items():
        with pytest.raises(EventValidationError) as info:
            validate(text)
        (problem,) = info.value.problems
        assert problem.field == "event_time", (name, problem)
        messages.add(problem.message)
    assert len(messages) == 1, messages  # the same words everywhere
    if text == text.strip():  # queries strip spaces around a time
        with pytest.raises(PydanticCustomError) as query:
            parse_time(text)
        assert str(query.value) == messages.pop()


def test_thirteen_digits_are_not_milliseconds() -> None:
    with pytest.raises(EventValidationError) as info:
        SCHEMA.validate_json_lines([(1, as_json("1709283600000"))], source="s")
    message = info.value.problems[0].message
    assert "0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999Z" in message and "never milliseconds" in message


def test_numbers_are_epoch_seconds_from_python_and_refused_from_json() -> None:
    assert SCHEMA.validate([event(1709283600)]).column("event_time").to_pylist() == [oracle("1709283600")]
    assert SCHEMA.validate([event(1709283600.25)]).column("event_time").to_pylist() == [oracle("1709283600.25")]
    with pytest.raises(EventValidationError):
        SCHEMA.validate([event(1709283600000)])
    with pytest.raises(EventValidationError) as info:
        SCHEMA.validate_json_lines([(1, as_json("x").replace('"x"', "1709283600"))], source="s")
    assert "a JSON number is not a time" in info.value.problems[0].message


@settings(max_examples=400, deadline=None, database=None)
@given(text=st.from_regex(_COMMON_ISO, fullmatch=True))
def test_the_fast_path_for_usual_iso_text_reads_what_pydantic_reads(text: str) -> None:
    """Usual ISO text is read by Python's own parser (fast); it must answer what pydantic's strict parser,
    which read every event time before, answers: the same time, or a refusal."""
    try:
        want: datetime | None = TypeAdapter(datetime).validate_strings(text, strict=True)
    except ValidationError:
        want = None
    try:
        got: datetime | None = parse_time_text(text)
    except PydanticCustomError:
        got = None
    assert got == want and (got is None or got.utcoffset() == want.utcoffset()), (text, got, want)  # type: ignore[union-attr]
