"""HTTP ingest (``POST /v1/events``) over a real uvicorn server, into a real Delta master dataset.

Every test reads the master dataset back with delta-rs (``DeltaTable(...).load_cdf()``, which
gives each row the version of the commit that added it) and checks it holds exactly the
accepted events, each once, at the version the answer named; and that a rejected request left
the table at the same version. Idempotency is checked across a server restart (a second server
on the same data dir) and with concurrent retries; group commit with 50 concurrent requests.
A fault injected into the real Delta appender checks a commit that lands but reports an error
is not committed twice.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

import httpx
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from batch_layer.master.dataset import MasterDataset
from batch_layer.master.engines import get_engine
from deploy.settings import Settings
from serving.api.errors import UnavailableError
from serving.api.idempotency import IdempotencyKey
from serving.api.ingestor import Ingestor
from serving.api.request_body import parse_events
from shared_logic.registry import load_pipeline
from tests.support import web

PIPELINE = "payments"
NDJSON = {"Content-Type": "application/x-ndjson"}
#: Ingest needs an API key with scope 'ingest' (serving.api.auth); every server here has this one.
KEY = "test-ingest-key-0001"
AUTH = {"Authorization": f"Bearer {KEY}"}


def payment(i: int, **extra: Any) -> dict[str, Any]:
    return {"user_id": f"user-{i}", "merchant": f"m{i % 3}", "amount": i + 0.25, **extra}


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(pipeline=PIPELINE)


@pytest.fixture
def serve(api: Callable[..., Any]) -> Callable[..., Any]:
    """``with serve(**overrides) as (server, http):`` a server of PIPELINE and a client with the key."""

    @contextmanager
    def start(**overrides: Any) -> Iterator[tuple[Any, httpx.Client]]:
        with api(pipeline=PIPELINE, api_keys={KEY: ["ingest"]}, **overrides) as server, \
                web.client(base_url=server.base_url, headers=AUTH, timeout=30,
                             limits=httpx.Limits(max_connections=64)) as http:
            yield server, http

    return start


@pytest.fixture
def http(serve: Callable[..., Any]) -> Iterator[httpx.Client]:
    with serve() as (_, client):
        yield client


def master_rows(settings: Settings) -> list[dict[str, Any]]:
    """Every event row of the master dataset with ``_commit_version``, the commit that added it."""
    if not (settings.master_path / "_delta_log").exists():
        return []
    table = DeltaTable(str(settings.master_path))
    reader = pa.RecordBatchReader.from_stream(table.load_cdf(starting_version=0))
    rows = reader.read_all().to_pylist()
    return [r for r in rows if r["_kind"] == "event" and r["_change_type"] == "insert"]


def master_version(settings: Settings) -> int | None:
    if not (settings.master_path / "_delta_log").exists():
        return None
    return DeltaTable(str(settings.master_path)).version()


def by_user(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(row["user_id"], []).append(row)
    return out


def assert_holds_once(settings: Settings, expected: dict[str, tuple[dict[str, Any], int]]) -> None:
    """The master dataset's events are exactly ``expected`` (user_id -> (event, version)), each once."""
    rows = by_user(master_rows(settings))
    assert sorted(rows) == sorted(expected)
    for user, (event, version) in expected.items():
        [row] = rows[user]  # exactly once
        assert (row["merchant"], row["amount"]) == (event["merchant"], event["amount"])
        assert row["_commit_version"] == version
        if "event_time" in event:
            assert row["event_time"] == datetime.fromisoformat(event["event_time"].replace("Z", "+00:00"))


# --------------------------------------------------------------------------------------------
# accepted


def test_one_event_an_array_and_ndjson_are_each_committed_once(http: httpx.Client, settings: Settings) -> None:
    before = datetime.now(timezone.utc)
    one = payment(0, event_time="2024-03-01T09:30:00Z")
    r = http.post("/v1/events", json=one)
    assert r.status_code == 202, r.text
    assert r.headers["content-type"] == "application/json"
    first = r.json()
    assert set(first) == {"accepted", "version"} and first["accepted"] == 1

    array = [payment(1), payment(2, event_time="2024-03-01T10:00:00+02:00"), payment(3)]
    r = http.post("/v1/events", json=array)
    assert r.status_code == 202, r.text
    second = r.json()
    assert second["accepted"] == 3 and second["version"] > first["version"]

    ndjson = [payment(4), payment(5), payment(6)]
    lines = "\n".join(json.dumps(e) for e in ndjson[:2]) + "\n\n  \r\n" + json.dumps(ndjson[2]) + "\r\n"
    r = http.post("/v1/events", content=lines.encode(), headers=NDJSON)
    assert r.status_code == 202, r.text
    third = r.json()
    assert third["accepted"] == 3 and third["version"] > second["version"]

    # JSON Lines' media type and an explicit UTF-8 charset are read too
    r = http.post("/v1/events", content=json.dumps(payment(7)).encode(),
                  headers={"Content-Type": "application/jsonl"})
    assert r.status_code == 202, r.text
    r = http.post("/v1/events", content=json.dumps([payment(8)]).encode(),
                  headers={"Content-Type": "Application/JSON; charset=UTF-8"})
    assert r.status_code == 202, r.text

    expected = {one["user_id"]: (one, first["version"])}
    expected |= {e["user_id"]: (e, second["version"]) for e in array}
    expected |= {e["user_id"]: (e, third["version"]) for e in ndjson}
    rows = master_rows(settings)
    expected |= {r["user_id"]: (payment(int(r["user_id"][5:])), r["_commit_version"])
                 for r in rows if r["user_id"] in ("user-7", "user-8")}
    assert_holds_once(settings, expected)
    # a missing event_time is the ingest time, fixed in the master dataset
    stamped = next(r for r in rows if r["user_id"] == "user-1")["event_time"]
    assert before - timedelta(seconds=1) <= stamped <= datetime.now(timezone.utc) + timedelta(seconds=1)


def test_non_ascii_events_in_an_array_are_validated_from_their_own_bytes(http: httpx.Client, settings: Settings) -> None:
    events = [payment(1, merchant="café ☕"), {"merchant": "Zürich", "user_id": "ü-2", "amount": 2}]
    body = json.dumps(events, ensure_ascii=False, indent=2).encode()
    r = http.post("/v1/events", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 202, r.text
    rows = by_user(master_rows(settings))
    assert rows["user-1"][0]["merchant"] == "café ☕"
    assert rows["ü-2"][0]["amount"] == 2.0  # an int is a valid number for a float field (JSON has one number type)


# --------------------------------------------------------------------------------------------
# rejected: nothing written


BAD_EVENTS: list[tuple[str, Any, int, list[str]]] = [
    ("string for a number", [payment(1), payment(2, amount="12")], 422, ["index 1", "'amount'", "valid number"]),
    ("string for a string field", [payment(1, user_id=5)], 422, ["index 0", "'user_id'", "valid string"]),
    ("bool for a number", payment(1, amount=True), 422, ["the event", "'amount'"]),
    ("missing field", [payment(1), payment(2), {"user_id": "x", "amount": 1.0}], 422,
     ["index 2", "'merchant'", "Field required"]),
    ("unknown field", [payment(1, colour="red")], 422, ["index 0", "'colour'", "Extra inputs"]),
    ("bad time", [payment(1, event_time="yesterday")], 422, ["index 0", "'event_time'"]),
    ("not an object", [payment(1), 7], 422, ["index 1", "(event)"]),
    ("empty array", [], 422, ["empty array"]),
    ("top-level number", 12, 422, ["neither an event"]),
]


@pytest.mark.parametrize(("case", "body", "status", "words"), BAD_EVENTS, ids=[c[0] for c in BAD_EVENTS])
def test_invalid_events_are_rejected_naming_index_and_field(
    http: httpx.Client, settings: Settings, case: str, body: Any, status: int, words: list[str]
) -> None:
    seed = http.post("/v1/events", json=payment(100))
    assert seed.status_code == 202
    version = master_version(settings)
    r = http.post("/v1/events", json=body)
    assert r.status_code == status, r.text
    answer = r.json()
    assert set(answer) == {"error", "detail"}
    for word in words:
        assert word in answer["detail"], answer
    assert master_version(settings) == version
    assert [row["user_id"] for row in master_rows(settings)] == ["user-100"]


def test_every_problem_is_listed_and_nothing_of_the_request_is_written(http: httpx.Client, settings: Settings) -> None:
    body = [payment(0), payment(1, amount="1"), payment(2), {"user_id": 3, "merchant": "m", "amount": 1, "x": 1}]
    r = http.post("/v1/events", json=body)
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert "3 problem(s)" in detail and "nothing was written" in detail
    assert "index 1, field 'amount'" in detail
    assert "index 3, field 'user_id'" in detail and "index 3, field 'x'" in detail
    assert master_version(settings) is None  # not even the table was created


def test_ndjson_problems_are_located_by_line(http: httpx.Client, settings: Settings) -> None:
    lines = [json.dumps(payment(1)), "", json.dumps(payment(3, amount="3")), "{not json", json.dumps(payment(5))]
    r = http.post("/v1/events", content="\n".join(lines).encode(), headers=NDJSON)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert "line 3, field 'amount'" in detail
    assert "line 4" in detail and "Invalid JSON" in detail
    r = http.post("/v1/events", content=b"\n \n", headers=NDJSON)
    assert r.status_code == 422 and "no events" in r.json()["detail"]
    assert master_rows(settings) == []


@pytest.mark.parametrize(("body", "where"), [
    (b'[{"user_id": "a", "merchant": "m", "amount": 1}, {"user_id": ', "line 1 column"),
    (b'[{"user_id": "a", "merchant": "m", "amount": 1},]', "line 1 column"),
    (b'[{"user_id": "a", "merchant": "m", "amount": 1}] {}', "after the array"),
    (b'{"user_id": "a",\n "merchant": ', "line 2 column"),
    (b'{"user_id": "a", "merchant": "m", "amount": NaN}', "line 1 column"),
    (b"nonsense", "line 1 column"),
], ids=["truncated array", "trailing comma", "data after array", "truncated object", "NaN", "not JSON"])
def test_malformed_json_is_a_400_saying_where(http: httpx.Client, settings: Settings, body: bytes, where: str) -> None:
    r = http.post("/v1/events", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "BadRequestError"
    assert "malformed JSON" in r.json()["detail"] and where in r.json()["detail"]
    assert master_version(settings) is None


def test_empty_body_is_rejected(http: httpx.Client) -> None:
    r = http.post("/v1/events", content=b" ", headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and "empty" in r.json()["detail"]


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/xml", "application/json; charset=latin-1"])
def test_wrong_content_type_is_415(http: httpx.Client, settings: Settings, content_type: str | None) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    r = http.post("/v1/events", content=json.dumps(payment(1)).encode(), headers=headers)
    assert r.status_code == 415, r.text
    assert r.json()["error"] == "UnsupportedMediaTypeError"
    assert "application/x-ndjson" in r.json()["detail"] or "charset" in r.json()["detail"]
    assert master_version(settings) is None


def test_compressed_body_is_415(http: httpx.Client, settings: Settings) -> None:
    r = http.post("/v1/events", content=b"\x1f\x8b...", headers={"Content-Type": "application/json",
                                                               "Content-Encoding": "gzip"})
    assert r.status_code == 415 and "Content-Encoding" in r.json()["detail"]
    assert master_version(settings) is None


def test_oversized_body_is_413_by_declared_length_and_by_bytes_read(serve: Callable[..., Any], settings: Settings) -> None:
    limit = 1024
    events = [payment(i) for i in range(40)]  # ~2.5 kB
    body = json.dumps(events).encode()
    assert len(body) > limit
    with serve(max_body_bytes=limit) as (_, http):
        r = http.post("/v1/events", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 413, r.text
        assert r.json()["error"] == "PayloadTooLargeError" and str(limit) in r.json()["detail"]

        def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer encoding
            for i in range(0, len(body), 256):
                yield body[i:i + 256]

        r = http.post("/v1/events", content=chunks(), headers={"Content-Type": "application/json"})
        assert r.status_code == 413, r.text
        assert master_version(settings) is None

        small = json.dumps(events[:5]).encode()
        assert len(small) <= limit
        r = http.post("/v1/events", content=iter([small[:50], small[50:]]), headers={"Content-Type": "application/json"})
        assert r.status_code == 202 and r.json()["accepted"] == 5


# --------------------------------------------------------------------------------------------
# idempotency


def test_idempotency_key_retry_returns_the_first_answer_also_after_a_restart(
    serve: Callable[..., Any], settings: Settings
) -> None:
    events = [payment(1), payment(2)]
    key = {"Idempotency-Key": "order-42/attempt"}
    with serve() as (_, http):
        first = http.post("/v1/events", json=events, headers=key)
        assert first.status_code == 202
        assert "idempotent-replayed" not in first.headers
        version = master_version(settings)
        retry = http.post("/v1/events", json=events, headers=key)
        assert (retry.status_code, retry.content) == (first.status_code, first.content)
        assert retry.headers["idempotent-replayed"] == "true"
        assert master_version(settings) == version
        # other commits after it: the retry still answers with the first commit's version
        for i in range(3):
            assert http.post("/v1/events", json=payment(10 + i)).status_code == 202
        # the same key with other events is refused, writing nothing
        other = http.post("/v1/events", json=[payment(3)], headers=key)
        assert other.status_code == 422
        assert other.json()["error"] == "IdempotencyKeyReusedError"
        assert f"version {first.json()['version']}" in other.json()["detail"]
    after = master_version(settings)

    with serve() as (_, http):  # a new server on the same data dir: a restarted process's view
        retry = http.post("/v1/events", json=events, headers=key)
        assert (retry.status_code, retry.content) == (first.status_code, first.content)
        assert retry.headers["idempotent-replayed"] == "true"
        # the same events as NDJSON are another request body, not a retry
        ndjson = "\n".join(json.dumps(e) for e in events).encode()
        assert http.post("/v1/events", content=ndjson, headers={**key, **NDJSON}).status_code == 422
    assert master_version(settings) == after
    expected = {e["user_id"]: (e, first.json()["version"]) for e in events}
    rows = by_user(master_rows(settings))
    expected |= {f"user-{10 + i}": (payment(10 + i), rows[f"user-{10 + i}"][0]["_commit_version"]) for i in range(3)}
    assert_holds_once(settings, expected)


def test_a_retry_after_upkeep_trimmed_its_commit_writes_nothing_and_says_so(
    serve: Callable[..., Any], settings: Settings
) -> None:
    """Upkeep's log trim (``LAMBDA_MASTER_LOG_KEEP_VERSIONS``) bounds how long a first answer can be
    repeated; past it the key is still known (its transaction is in the checkpoint), so a retry is
    refused with 422 and never counted twice."""
    events = [payment(1), payment(2)]
    key = {"Idempotency-Key": "order-7"}
    with serve() as (_, http):
        first = http.post("/v1/events", json=events, headers=key)
        assert first.status_code == 202
        for i in range(3):
            assert http.post("/v1/events", json=payment(10 + i)).status_code == 202
        latest = master_version(settings)
        assert latest is not None
        DeltaTable(str(settings.master_path)).create_checkpoint()
        trimmed = MasterDataset(settings.master_path, load_pipeline(PIPELINE), get_engine("delta-rs")).trim_log(latest)
        assert trimmed.starts_at == latest and trimmed.deleted > 0
        retry = http.post("/v1/events", json=events, headers=key)
        assert retry.status_code == 422, retry.text
        assert "long ago" in retry.json()["detail"] and "nothing was written" in retry.json()["detail"]
        assert master_version(settings) == latest
        # the retry is refused before anything else: a new key with the same events is new events
        assert http.post("/v1/events", json=[payment(3)], headers={"Idempotency-Key": "order-8"}).status_code == 202
    # (the change feed from version 0 is gone with the trimmed commits: read the table as it is now)
    users = [u for u, kind in zip(*DeltaTable(str(settings.master_path)).to_pyarrow_table(
        columns=["user_id", "_kind"]).to_pydict().values()) if kind == "event"]
    assert sorted(users) == ["user-1", "user-10", "user-11", "user-12", "user-2", "user-3"]


def test_concurrent_retries_of_one_key_write_once(http: httpx.Client, settings: Settings) -> None:
    events = [payment(i) for i in range(5)]
    body = json.dumps(events).encode()
    barrier = threading.Barrier(12)

    def post(_: int) -> httpx.Response:
        barrier.wait()
        return http.post("/v1/events", content=body, headers={"Content-Type": "application/json",
                                                               "Idempotency-Key": "same"})

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(post, range(12)))
    assert {(r.status_code, r.content) for r in answers} == {(202, answers[0].content)}
    assert sum(r.headers.get("idempotent-replayed") == "true" for r in answers) == 11
    assert_holds_once(settings, {e["user_id"]: (e, answers[0].json()["version"]) for e in events})


def test_malformed_idempotency_key_is_400(http: httpx.Client, settings: Settings) -> None:
    r = http.post("/v1/events", json=payment(1), headers={"Idempotency-Key": "k" * 256})
    assert r.status_code == 400 and "Idempotency-Key" in r.json()["detail"]
    assert master_version(settings) is None


# --------------------------------------------------------------------------------------------
# group commit


def test_concurrent_requests_share_commits(serve: Callable[..., Any], settings: Settings) -> None:
    n = 50
    with serve(ingest_group_commit_ms=20) as (_, http):
        barrier = threading.Barrier(n)

        def post(i: int) -> httpx.Response:
            barrier.wait()
            if i % 10 == 9:  # bad requests among them fail alone
                return http.post("/v1/events", json=[payment(i, amount="x")])
            return http.post("/v1/events", json=payment(i))

        with ThreadPoolExecutor(n) as pool:
            answers = list(pool.map(post, range(n)))
    good = {i: r for i, r in enumerate(answers) if i % 10 != 9}
    assert all(r.status_code == 202 and r.json()["accepted"] == 1 for r in good.values()), [r.text for r in answers]
    assert all(answers[i].status_code == 422 for i in range(9, n, 10))
    versions = {r.json()["version"] for r in good.values()}
    assert len(versions) < len(good) / 2, versions  # shared commits
    assert_holds_once(settings, {f"user-{i}": (payment(i), r.json()["version"]) for i, r in good.items()})


# --------------------------------------------------------------------------------------------
# the committer, driven directly (fault injection into the real Delta appender)


def test_a_commit_that_lands_but_reports_an_error_is_not_written_twice(settings: Settings) -> None:
    pipeline = load_pipeline(PIPELINE)
    master = MasterDataset(settings.master_path, pipeline, get_engine("delta-rs"))
    ingestor = Ingestor(master, group_commit_ms=0)

    class LandsThenFails:
        """The real appender, whose first append commits and then raises (e.g. a post-commit hook failing)."""

        def __init__(self) -> None:
            self.real, self.failed = master.appender(), False

        def __getattr__(self, name: str) -> Any:
            return getattr(self.real, name)

        def append(self, *args: Any, **kwargs: Any) -> int:
            version = self.real.append(*args, **kwargs)
            if not self.failed:
                self.failed = True
                raise OSError("connection reset after the commit")
            return version

    ingestor._appender = LandsThenFails()  # type: ignore[assignment]

    async def run() -> list[Any]:
        tables = [parse_events(json.dumps(payment(i)).encode(), "json", pipeline.schema) for i in range(3)]
        try:
            return await asyncio.gather(*(ingestor.ingest(t) for t in tables))
        finally:
            await ingestor.close()

    receipts = asyncio.run(run())
    [version] = {r.version for r in receipts}  # one group commit, answered although append raised
    assert_holds_once(settings, {f"user-{i}": (payment(i), version) for i in range(3)})


def test_a_failed_commit_answers_503_and_the_committer_keeps_going(settings: Settings) -> None:
    pipeline = load_pipeline(PIPELINE)
    master = MasterDataset(settings.master_path, pipeline, get_engine("delta-rs"))
    ingestor = Ingestor(master, group_commit_ms=0)
    real = master.appender()

    class FailsOnce:
        def __init__(self) -> None:
            self.calls = 0

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def append(self, *args: Any, **kwargs: Any) -> int:
            self.calls += 1
            if self.calls == 1:
                raise OSError("disk full")
            return real.append(*args, **kwargs)

    ingestor._appender = FailsOnce()  # type: ignore[assignment]
    key = IdempotencyKey.of("k", "json", b"{}")

    async def run() -> tuple[Any, Any]:
        table = parse_events(json.dumps(payment(1)).encode(), "json", pipeline.schema)
        try:
            with pytest.raises(UnavailableError, match="disk full"):
                await ingestor.ingest(table, key)
            return await ingestor.ingest(table, key), await ingestor.ingest(table, key)
        finally:
            await ingestor.close()

    first, retry = asyncio.run(run())
    assert (first.accepted, first.replayed) == (1, False)
    assert (retry.accepted, retry.version, retry.replayed) == (1, first.version, True)
    assert_holds_once(settings, {"user-1": (payment(1), first.version)})


# --------------------------------------------------------------------------------------------
# documentation


def test_openapi_documents_the_route(http: httpx.Client) -> None:
    spec = http.get("/openapi.json").json()
    post = spec["paths"]["/v1/events"]["post"]
    assert post["summary"] and "Idempotency-Key" in post["description"]
    content = post["requestBody"]["content"]
    assert {"application/json", "application/x-ndjson"} <= set(content)
    assert {"one", "array"} <= set(content["application/json"]["examples"])
    event_ref = content["application/json"]["schema"]["oneOf"][0]["$ref"].rsplit("/", 1)[1]
    assert set(spec["components"]["schemas"][event_ref]["properties"]) == {"user_id", "merchant", "amount", "event_time"}
    example = content["application/json"]["examples"]["one"]["value"]
    assert set(example) == {"user_id", "merchant", "amount", "event_time"}
    assert {"202", "400", "413", "415", "422", "503"} <= set(post["responses"])
    assert any(p["name"] == "Idempotency-Key" and p["in"] == "header" for p in post["parameters"])
    # the documented examples are themselves accepted
    r = http.post("/v1/events", json=content["application/json"]["examples"]["array"]["value"])
    assert r.status_code == 202 and r.json()["accepted"] == 2
    r = http.post("/v1/events", content=content["application/x-ndjson"]["examples"]["lines"]["value"].encode(),
                  headers=NDJSON)
    assert r.status_code == 202 and r.json()["accepted"] == 2


def test_idempotency_key_hash_names_a_delta_transaction() -> None:
    a = IdempotencyKey.of("k", "json", b"[1]")
    assert a.app_id.startswith("ingest:") and len(a.app_id) == len("ingest:") + 64
    assert a == IdempotencyKey.of("k", "json", b"[1]")
    assert a.app_id == IdempotencyKey.of("k", "json", b"[2]").app_id != IdempotencyKey.of("K", "json", b"[1]").app_id
    assert a.body_sha256 != IdempotencyKey.of("k", "ndjson", b"[1]").body_sha256


