"""Event values follow one rule on every ingest path: HTTP (one event, an array,
NDJSON) and file ingest (JSON Lines, CSV), all through ``shared_logic.events``.

* ``event_time`` text: ISO 8601, or epoch seconds, always seconds. ``"1709283600000"`` (13 digits)
  was read as milliseconds and landed in the same hour as ``"1709283600"``; read as seconds it is the
  year 56135, outside the range: refused (422 naming the field and the range). A JSON number is not
  a time (it was refused without saying how to send one); ``+``-signed or exponent text is refused.
* An integer beyond 64 bits (``12345678901234567890``) for a float field was stored as a rounded
  float, though the README promises integers within 64 bits: refused now, for float fields as for
  int fields; written with a decimal point or an exponent it is a float, and stored as one.
* A JSON object giving a key twice was accepted, the last value winning: refused now, naming the
  key, whichever way the key is spelled (``"us\\u0065r_id"`` is ``user_id``).

Nothing of a refused request or file is written; accepted values are read back from the master
dataset (the Delta table) and compared with values computed here from what was sent.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest
from deltalake import DeltaTable

from batch_layer.master.dataset import MasterDataset
from deploy.settings import Settings
from shared_logic import EventValidationError, load_pipeline
from tests.support import web

KEY = "event-values-ingest-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
JSON, NDJSON = {"Content-Type": "application/json"}, {"Content-Type": "application/x-ndjson"}
RANGE = "0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999Z"
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@pytest.fixture
def http(api: Callable[..., Any], make_settings: Callable[..., Settings]) -> Iterator[tuple[httpx.Client, Settings]]:
    settings = make_settings(pipeline="payments")
    with api(pipeline="payments", api_keys={KEY: ["ingest"]}) as server, \
            web.client(base_url=server.base_url, headers=AUTH, timeout=30) as client:
        yield client, settings


def master_rows(settings: Settings) -> list[dict[str, Any]]:
    if not (settings.master_path / "_delta_log").exists():
        return []
    return [r for r in DeltaTable(str(settings.master_path)).to_pyarrow_table().to_pylist() if r["_kind"] == "event"]


def line(**fields: Any) -> str:
    return json.dumps({"user_id": "u", "merchant": "m", "amount": 1.5, **fields})


def post_every_way(client: httpx.Client, bad: str) -> list[httpx.Response]:
    """The event ``bad`` (JSON text) alone, and after a valid one in an array and in NDJSON."""
    return [client.post("/v1/events", content=bad.encode(), headers=JSON),
            client.post("/v1/events", content=f"[{line()},{bad}]".encode(), headers=JSON),
            client.post("/v1/events", content=f"{line()}\n{bad}".encode(), headers=NDJSON)]


def refused_everywhere(responses: list[httpx.Response], *words: str) -> None:
    for response in responses:
        assert response.status_code == 422, response.text
        detail = response.json()["detail"]
        assert all(w in detail for w in words), detail


def seconds(text: str) -> datetime:
    """The oracle's reading of epoch seconds: exact, from the decimal digits."""
    whole, _, fraction = text.partition(".")
    return EPOCH + timedelta(seconds=int(whole), microseconds=int((fraction + "000000")[:6]) * (-1 if whole.startswith("-") else 1))


REFUSED_TIMES = {
    '"1709283600000"': ["event_time", RANGE, "never milliseconds"],
    '"-62135596801"': ["event_time", RANGE],
    '"+1709283600"': ["event_time", "epoch seconds", "ISO 8601"],
    '"1e9"': ["event_time", "epoch seconds"],
    '"1709283600.1234567"': ["event_time", "epoch seconds"],
    "1709283600": ["event_time", "JSON number is not a time"],
    "1709283600000": ["event_time", "JSON number is not a time"],
}
ACCEPTED_TIMES = ["1709283600", "1709283600.25", "-1.5", "0", "253402300799.999999", "-62135596800"]


@pytest.mark.parametrize("sent", list(REFUSED_TIMES))
def test_an_event_time_is_iso_or_epoch_seconds_never_milliseconds(http: tuple[httpx.Client, Settings], sent: str) -> None:
    client, settings = http
    text = line()[:-1] + f', "event_time": {sent}}}'
    refused_everywhere(post_every_way(client, text), *REFUSED_TIMES[sent])
    assert master_rows(settings) == []


def test_epoch_seconds_in_text_are_stored_exactly_as_seconds(http: tuple[httpx.Client, Settings]) -> None:
    client, settings = http
    texts = [line(user_id=f"t{i}", event_time=t) for i, t in enumerate(ACCEPTED_TIMES)]
    response = client.post("/v1/events", content=f"[{','.join(texts)}]".encode(), headers=JSON)
    assert response.status_code == 202, response.text
    stored = {r["user_id"]: r["event_time"] for r in master_rows(settings)}
    assert stored == {f"t{i}": seconds(t) for i, t in enumerate(ACCEPTED_TIMES)}
    assert stored["t0"] == datetime(2024, 3, 1, 9, 0, tzinfo=timezone.utc)


def test_integers_beyond_64_bits_are_refused_in_float_fields_too(http: tuple[httpx.Client, Settings]) -> None:
    client, settings = http
    for big in ("12345678901234567890", "9223372036854775808", "-9223372036854775809", "1" + "0" * 400):
        text = line()[:-1].replace('"amount": 1.5', f'"amount": {big}') + "}"
        refused_everywhere(post_every_way(client, text), "'amount'", "64-bit", "decimal point")
    assert master_rows(settings) == []
    fits = ["9223372036854775807", "-9223372036854775808", "1.2345678901234567e19", "12345678901234567890.0"]
    texts = [line(user_id=f"f{i}").replace('"amount": 1.5', f'"amount": {n}') for i, n in enumerate(fits)]
    assert client.post("/v1/events", content="\n".join(texts).encode(), headers=NDJSON).status_code == 202
    stored = {r["user_id"]: r["amount"] for r in master_rows(settings)}
    assert stored == {f"f{i}": float(n) for i, n in enumerate(fits)}


@pytest.mark.parametrize(("text", "key"), [
    ('{"user_id": "a", "merchant": "m", "amount": 1, "amount": 2}', "amount"),
    ('{"user_id": "a", "user_id": "b", "merchant": "m", "amount": 1}', "user_id"),
    ('{"user_id": "a", "merchant": "m", "amount": 1, "us\\u0065r_id": "b"}', "user_id"),
    ('{"user_id": "a\\"", "merchant": "m", "amount": 1, "merchant" : "n"}', "merchant"),
    ('{"user_id":"a","merchant":"m","amount":1,"event_time":"2024-03-01T09:00:00Z","event_time":"1709283600"}',
     "event_time"),
    ('{"user_id": "a", "merchant": "m", "amount": "x", "amount": 1}', "amount"),
])
def test_a_key_given_twice_is_refused_naming_it(http: tuple[httpx.Client, Settings], text: str, key: str) -> None:
    client, settings = http
    refused_everywhere(post_every_way(client, text), f"field '{key}'", "more than once")
    array = client.post("/v1/events", content=f"[{line()},{text}]".encode(), headers=JSON).json()["detail"]
    ndjson = client.post("/v1/events", content=f"{line()}\n{text}".encode(), headers=NDJSON).json()["detail"]
    assert f"index 1, field '{key}'" in array and f"line 2, field '{key}'" in ndjson, (array, ndjson)
    assert master_rows(settings) == []


def test_file_ingest_follows_the_same_rules(make_settings: Callable[..., Settings], tmp_path: Path) -> None:
    settings = make_settings(pipeline="payments")
    master = MasterDataset.open(settings, load_pipeline("payments"))
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_text("\n".join([
        line(event_time="1709283600000"),
        line().replace('"amount": 1.5', '"amount": 12345678901234567890'),
        '{"user_id": "a", "merchant": "m", "amount": 1, "amount": 2}',
        line(event_time="1709283600"),
    ]) + "\n", encoding="utf-8")
    csv_file = tmp_path / "bad.csv"
    csv_file.write_text("user_id,merchant,amount,event_time\n"
                        "a,m,1.5,1709283600000\n"
                        "b,m,12345678901234567890,1709283600\n"
                        "c,m,2,+1709283600\n", encoding="utf-8")
    expected = {jsonl: [("line 1", "event_time"), ("line 2", "amount"), ("line 3", "amount")],
                csv_file: [("line 2", "event_time"), ("line 3", "amount"), ("line 4", "event_time")]}
    for file, problems in expected.items():
        with pytest.raises(EventValidationError) as info:
            master.ingest_file(file)
        assert [(p.location, p.field) for p in info.value.problems] == problems, info.value
    assert master_rows(settings) == []

    good = tmp_path / "good.csv"
    good.write_text("user_id,merchant,amount,event_time\na,m,9223372036854775807,1709283600.5\n", encoding="utf-8")
    master.ingest_file(good)
    assert [(r["amount"], r["event_time"]) for r in master_rows(settings)] == [
        (float(2**63 - 1), datetime(2024, 3, 1, 9, 0, 0, 500000, tzinfo=timezone.utc))]
