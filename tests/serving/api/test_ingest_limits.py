"""Ingest at the edges of what the master dataset can hold, over HTTP and from files.

* Times: an event time must lie in 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59.999999Z once in
  UTC. ``0001-01-01T00:00:07+13:33`` and ``9999-12-31T23:59:59-01:00`` parse, but fall outside once
  their offset is applied; they once raised OverflowError (a 500). Now: 422 naming the field and
  the range, located by index / line (HTTP JSON, NDJSON) and by line for a file, nothing written.
  The range's own ends are accepted and stored exactly (read back from the Delta table).
* Integers must fit a 64-bit column (once a 500 from Arrow).
* Nesting: arrays nested 1,000 deep once raised RecursionError (a 500). Now a body nested more than
  ``serving.api.request_body.MAX_NESTING`` levels is a 400 naming the limit; at the limit it is an ordinary
  invalid event (422). The batch-run body, read by FastAPI, is a 400 in the same error shape.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest
from deltalake import DeltaTable

from batch_layer.master.dataset import MasterDataset
from deploy.settings import Settings
from serving.api.request_body import MAX_NESTING
from shared_logic import EventValidationError, load_pipeline
from tests.support import web

KEY = "limits-ingest-key"
ADMIN = "limits-admin-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
RANGE = "0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999Z"
OUTSIDE = ["0001-01-01T00:00:07+13:33", "9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00.000001+00:01"]
JSON, NDJSON = {"Content-Type": "application/json"}, {"Content-Type": "application/x-ndjson"}


@pytest.fixture
def http(api: Callable[..., Any], make_settings: Callable[..., Settings]) -> Iterator[tuple[httpx.Client, Settings]]:
    """A server of the payments pipeline, a client holding an ingest key, and the server's settings."""
    settings = make_settings(pipeline="payments")  # the same data dir as the server's
    server = api(pipeline="payments", api_keys={KEY: ["ingest"], ADMIN: ["admin"]})
    with server, web.client(base_url=server.base_url, headers=AUTH, timeout=30) as client:
        yield client, settings


def payment(i: int, **extra: Any) -> dict[str, Any]:
    return {"user_id": f"user-{i}", "merchant": "m", "amount": 1.5, **extra}


def master_rows(settings: Settings) -> list[dict[str, Any]]:
    if not (settings.master_path / "_delta_log").exists():
        return []
    table = DeltaTable(str(settings.master_path))
    return [r for r in table.to_pyarrow_table().to_pylist() if r["_kind"] == "event"]


def assert_refused(response: httpx.Response, status: int, *words: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "detail"}, body
    for word in words:
        assert word in body["detail"], body
    return body["detail"]


@pytest.mark.parametrize("time", OUTSIDE)
def test_event_times_outside_the_range_are_422_naming_field_range_and_place(
    http: tuple[httpx.Client, Settings], time: str
) -> None:
    client, settings = http
    one = client.post("/v1/events", json=payment(1, event_time=time))
    assert_refused(one, 422, "the event, field 'event_time'", time, RANGE)
    many = client.post("/v1/events", json=[payment(1), payment(2, event_time=time)])
    assert_refused(many, 422, "index 1, field 'event_time'", RANGE)
    lines = "\n".join(json.dumps(e) for e in (payment(1), payment(2), payment(3, event_time=time)))
    assert_refused(client.post("/v1/events", content=lines.encode(), headers=NDJSON), 422,
                   "line 3, field 'event_time'", RANGE)
    assert master_rows(settings) == []


def test_the_ends_of_the_range_are_stored_exactly(http: tuple[httpx.Client, Settings]) -> None:
    client, settings = http
    times = {
        "first": ("0001-01-01T00:00:00Z", datetime(1, 1, 1, tzinfo=timezone.utc)),
        "last": ("9999-12-31T23:59:59.999999Z", datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone.utc)),
        "east": ("0001-01-01T13:33:07+13:33", datetime(1, 1, 1, 0, 0, 7, tzinfo=timezone.utc)),
        "west": ("9999-12-31T22:59:59-01:00", datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc)),
    }
    response = client.post("/v1/events", json=[payment(0, user_id=u, event_time=t) for u, (t, _) in times.items()])
    assert response.status_code == 202, response.text
    stored = {r["user_id"]: r["event_time"] for r in master_rows(settings)}
    assert stored == {u: want for u, (_, want) in times.items()}


def test_file_ingest_locates_out_of_range_times_and_writes_nothing(make_settings: Callable[..., Settings],
                                                                    tmp_path: Path) -> None:
    settings = make_settings(pipeline="payments")
    file = tmp_path / "events.jsonl"
    events = [payment(1), payment(2, event_time=OUTSIDE[0]), payment(3), payment(4, event_time=OUTSIDE[1])]
    file.write_text("\n".join(json.dumps(e) for e in events) + "\n", encoding="utf-8")
    master = MasterDataset.open(settings, load_pipeline("payments"))
    with pytest.raises(EventValidationError) as info:
        master.ingest_file(file)
    assert [(p.location, p.field) for p in info.value.problems] == [("line 2", "event_time"), ("line 4", "event_time")]
    assert all(RANGE in p.message for p in info.value.problems)
    assert master_rows(settings) == []


def test_integers_outside_64_bits_are_422(api: Callable[..., Any]) -> None:
    order = {"shop": "s", "items": 1, "cents": 2**63, "event_time": "2024-03-01T09:00:00Z"}
    with api(pipeline="tests.support.int_pipeline", api_keys={KEY: ["ingest"]}) as server, \
            web.client(base_url=server.base_url, headers=AUTH, timeout=30) as client:
        assert_refused(client.post("/v1/events", json=[order]), 422, "index 0, field 'cents'", "64-bit")
        assert client.post("/v1/events", json=[{**order, "cents": 2**63 - 1}]).status_code == 202
        assert_refused(client.post("/v1/events", json={**order, "items": -(2**63) - 1}), 422, "'items'")


def nested(depth: int) -> bytes:
    """Arrays nested ``depth`` levels deep."""
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize(("body", "headers", "where"), [
    (nested(1000), JSON, "the body"),
    (nested(MAX_NESTING + 1), JSON, "the body"),
    (b'{"user_id": ' + nested(1000) + b', "merchant": "m", "amount": 1}', JSON, "the body"),
    (b"[" + json.dumps(payment(1)).encode() + b", {\"user_id\": " + nested(300) + b"}]", JSON, "the body"),
    (b"[" * 5000, JSON, "the body"),
    (json.dumps(payment(1)).encode() + b"\n" + nested(1000), NDJSON, "line 2"),
    (json.dumps(payment(1)).encode() + b'\n\n{"user_id": ' + nested(MAX_NESTING) + b"}", NDJSON, "line 3"),
], ids=["arrays 1000 deep", "one past the limit", "deep field", "deep element", "unclosed", "ndjson", "ndjson field"])
def test_deep_nesting_is_a_400_naming_the_limit(http: tuple[httpx.Client, Settings], body: bytes,
                                                 headers: dict[str, str], where: str) -> None:
    client, settings = http
    detail = assert_refused(client.post("/v1/events", content=body, headers=headers), 400,
                            where, f"more than {MAX_NESTING} levels")
    assert "nothing was written" in detail
    assert master_rows(settings) == []


def test_nesting_at_the_limit_is_an_ordinary_invalid_event(http: tuple[httpx.Client, Settings]) -> None:
    client, settings = http
    assert_refused(client.post("/v1/events", content=nested(MAX_NESTING), headers=JSON), 422, "index 0")
    field = b'{"user_id": ' + nested(MAX_NESTING - 1) + b', "merchant": "m", "amount": 1}'
    assert_refused(client.post("/v1/events", content=field, headers=JSON), 422, "field 'user_id'")
    assert master_rows(settings) == []


def test_a_deep_batch_run_body_is_a_400_in_the_error_shape(http: tuple[httpx.Client, Settings]) -> None:
    client, _ = http
    response = client.post("/v1/batch/runs", content=nested(100_000), headers={**JSON, "Authorization": f"Bearer {ADMIN}"})
    assert_refused(response, 400, "JSON")
    runs = client.get("/v1/batch/runs").json()  # reads are open on loopback
    assert runs["runs"] == [] and runs["active"] is None


def test_one_valid_array_is_read_by_elements_as_sent(http: tuple[httpx.Client, Settings]) -> None:
    """The array is validated whole now (no Python JSON scanner): elements keep their own types."""
    client, settings = http
    body = b'[ {"user_id": "a", "merchant": "caf\\u00e9", "amount": 2} ,\n {"user_id": "b", "merchant": "\xc3\xa9", "amount": 2.5} ]'
    response = client.post("/v1/events", content=body, headers=JSON)
    assert response.status_code == 202, response.text
    rows = sorted(master_rows(settings), key=lambda r: r["user_id"])
    assert [(r["merchant"], r["amount"]) for r in rows] == [("café", 2.0), ("é", 2.5)]
