"""Event validation: every problem located by line (or index) and field; nothing returned on error."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from shared_logic import EventValidationError, load_pipeline


def test_json_lines_problems_name_line_and_field() -> None:
    schema = load_pipeline("payments").schema
    lines = [
        (1, '{"user_id": "a", "merchant": "m", "amount": 1.5}'),
        (2, '{"user_id": "a", "merchant": "m", "amount": "1.5"}'),
        (3, '{"user_id": "a", "merchant": "m"}'),
        (4, '{"user_id": "a", "merchant": "m", "amount": 2, "extra": true}'),
        (5, "{not json"),
        (6, '{"user_id": "a", "merchant": "m", "amount": 1, "event_time": "yesterday"}'),
    ]
    with pytest.raises(EventValidationError) as info:
        schema.validate_json_lines(lines, source="f.jsonl")
    found = {(p.location, p.field) for p in info.value.problems}
    assert found == {
        ("line 2", "amount"),
        ("line 3", "amount"),
        ("line 4", "extra"),
        ("line 5", "(event)"),
        ("line 6", "event_time"),
    }
    assert "f.jsonl" in str(info.value) and "nothing was written" in str(info.value)


def test_valid_events_become_master_rows_with_ingest_time_filled() -> None:
    schema = load_pipeline("wordcount").schema
    stamp = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)
    table = schema.validate(
        [{"text": "a b"}, {"text": "c", "event_time": "2026-01-01T00:00:00+02:00"}], now=lambda: stamp
    )
    rows = table.to_pylist()
    assert [r["_kind"] for r in rows] == ["event", "event"]
    assert rows[0]["event_time"] == stamp
    assert rows[1]["event_time"] == datetime(2025, 12, 31, 22, 0, tzinfo=timezone.utc)


def test_non_finite_amounts_are_rejected() -> None:
    schema = load_pipeline("payments").schema
    with pytest.raises(EventValidationError) as info:
        schema.validate([{"user_id": "a", "merchant": "m", "amount": float("nan")}])
    assert info.value.problems[0].field == "amount"
