"""The HTTP API against the oracle, over a real uvicorn server, after a real batch run.

Random events (fixed seeds) are ingested and recomputed with ``run_batch``; then every
(key, window) row the oracle (``tests.oracle``, plain Python over the master dataset's events at
the batch's barrier version) computes is asked for over HTTP and compared:

* all-time views: ``GET /v1/views/{view}/keys/{key}`` with no parameters;
* windowed views: ``window_start=`` as epoch seconds, ISO 8601 (Z, offset, naive) or any time
  inside the window, for every (key, window); and ``from``/``to`` ranges whose combined value
  must equal the oracle's combination of the windows overlapping ``[from, to)`` and whose
  ``windows`` list must equal the oracle's non-empty windows, oldest first.

Counts, minima and maxima must be equal; sums and averages within ``rel_tol=1e-9``; distinct
merchant counts (HyperLogLog) within ``max(1, 3%)`` of the exact count. Every answer carries the
barrier's master version as ``generation`` and ``version``. ``GET /v1/views`` must list both
views at that version with the oracle's row count. Error answers are checked for status and for
a detail that names what is wrong: unknown view or key (404), parameters that do not fit the
view (422), nothing published or Redis down (503). ``/openapi.json`` must document the key route.
Keys holding '/' or '?' reach the handler, and 'to' must follow 'from' even inside one window;
both are checked with nothing published, so they need no batch run.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.settings import Settings
from tests import oracle
from tests.support import ingest_file, key_url, web
from tests.support.published import Published, publish, value_problems

START = datetime(2024, 3, 1, 9, 0, tzinfo=timezone.utc)
NO_GENERATION = re.compile(r"no batch generation\b.*\bpublished", re.IGNORECASE)
#: Events at and around the Unix epoch: windows before 1970 have negative starts.
EDGE_PAYMENTS: list[dict[str, Any]] = [
    {"user_id": "alice", "merchant": "acme", "amount": 1.5, "event_time": "1969-12-31T23:59:59.999999Z"},
    {"user_id": "alice", "merchant": "globex", "amount": 2.25, "event_time": "1969-12-31T23:00:00Z"},
    {"user_id": "alice", "merchant": "acme", "amount": 4.0, "event_time": "1970-01-01T00:00:00Z"},
    {"user_id": "bob", "merchant": "hooli", "amount": 8.0, "event_time": "1969-12-31T21:30:00-02:00"},
]


def utc(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=timezone.utc)


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text)


def window_param(rng: random.Random, start: int, size: int, i: int) -> str:
    """A time inside the window starting at ``start``, spelled in one of several ways."""
    inside = start + rng.randrange(size * 1000) / 1000
    spellings = (
        str(start),
        utc(start).isoformat().replace("+00:00", "Z"),
        utc(inside).astimezone(timezone(timedelta(hours=2))).isoformat(),
        utc(inside).replace(tzinfo=None).isoformat(),
        f"{inside:.3f}",
    )
    return spellings[i % len(spellings)]


def check_every_row(client: httpx.Client, published: Published, seed: int) -> None:
    """Ask for every oracle row over HTTP (one request per key and window)."""
    rng = random.Random(seed)
    problems: list[str] = []
    for view, rows in published.views.items():
        size = oracle.VIEW_WINDOWS[view]
        for i, ((key, start), want) in enumerate(sorted(rows.items(), key=repr)):
            params = {} if start is None or size is None else {"window_start": window_param(rng, start, size, i)}
            response = client.get(key_url(view, key), params=params)
            where = f"{view} {key!r} {params}"
            if response.status_code != 200:
                problems.append(f"{where}: HTTP {response.status_code} {response.text}")
                continue
            body = response.json()
            if (body["view"], body["key"], body["generation"], body["version"]) != (
                view, key, published.generation, published.generation
            ):
                problems.append(f"{where}: header fields {body}")
            problems += value_problems(where, body["value"], want)
            if start is None or size is None:
                if {"window", "range", "windows"} & body.keys():
                    problems.append(f"{where}: all-time answer has window fields: {body}")
            elif "window" not in body or (parse_time(body["window"]["start"]), parse_time(body["window"]["end"])) != (
                utc(start), utc(start + size)
            ):
                problems.append(f"{where}: window {body.get('window')}, oracle [{utc(start)}, {utc(start + size)})")
    assert not problems, f"{len(problems)} answer(s) differ from the oracle:\n" + "\n".join(problems[:30])


def check_range(client: httpx.Client, published: Published, view: str, key: str, start: datetime, end: datetime) -> list[str]:
    """One from/to query against the oracle's combination of the windows overlapping [start, end)."""
    size = oracle.VIEW_WINDOWS[view]
    assert size is not None
    starts = oracle.windows_in_range(size, start, end)
    combined, windows = oracle.combine_range(published.groups[view], key, starts)
    params = {"from": start.isoformat(), "to": end.isoformat()}
    response = client.get(key_url(view, key), params=params)
    where = f"{view} {key!r} from {start} to {end}"
    if combined is None:
        return [] if response.status_code == 404 else [f"{where}: HTTP {response.status_code}, oracle has no row"]
    if response.status_code != 200:
        return [f"{where}: HTTP {response.status_code} {response.text}"]
    body = response.json()
    problems = value_problems(where, body["value"], combined)
    if (parse_time(body["range"]["start"]), parse_time(body["range"]["end"])) != (start, end):
        problems.append(f"{where}: range {body['range']}")
    got_starts = [(parse_time(w["start"]), parse_time(w["end"])) for w in body["windows"]]
    want_starts = [(utc(s), utc(s + size)) for s, _ in windows]
    if got_starts != want_starts:
        return [*problems, f"{where}: windows {got_starts} != oracle {want_starts}"]
    for w, (s, measures) in zip(body["windows"], windows):
        problems += value_problems(f"{where} window {utc(s)}", w["value"], measures)
    return problems


def check_ranges(client: httpx.Client, published: Published, view: str, keys: list[str], seed: int) -> None:
    """A random from/to range per key, placed over the key's windows (some aligned, some not)."""
    rng = random.Random(seed)
    size = oracle.VIEW_WINDOWS[view]
    assert size is not None
    by_key: dict[str, list[int]] = {}
    for key, start in published.views[view]:
        if start is not None:
            by_key.setdefault(key, []).append(start)
    problems: list[str] = []
    spans = 0
    for i, key in enumerate(keys):
        anchor = rng.choice(sorted(by_key[key]))
        begin = anchor - rng.randrange(3) * size
        length = rng.randint(1, 40) * size
        if i % 3 == 2:  # unaligned ends: the windows holding them are part of the range
            begin += rng.randrange(1, size)
            length += rng.randrange(1, size)
        start, end = utc(begin), utc(begin + length)
        problems += check_range(client, published, view, key, start, end)
        spans += len(oracle.combine_range(published.groups[view], key, oracle.windows_in_range(size, start, end))[1])
    assert not problems, f"{len(problems)} range answer(s) differ from the oracle:\n" + "\n".join(problems[:30])
    assert spans > len(keys), "the ranges should span several non-empty windows"


def check_view_list(client: httpx.Client, published: Published) -> None:
    response = client.get("/v1/views")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["pipeline"] == published.settings.pipeline
    listed = {v["name"]: v for v in body["views"]}
    assert set(listed) == set(oracle.PIPELINE_VIEWS[published.settings.pipeline])
    for name, info in listed.items():
        assert info["generation"] == info["version"] == published.generation, info
        assert info["rows"] == len(published.views[name]), info
        assert info["window_seconds"] == oracle.VIEW_WINDOWS[name], info
        assert info["keys"] == [oracle.PIPELINE_KEY[published.settings.pipeline]]
        assert info["computed_at"] is not None


@pytest.mark.slow  # over 10 s: the end-to-end tier
def test_wordcount_views_over_http_match_oracle(spark: Any, make_settings: Callable[..., Settings], redis_url: str,
                                                api: Callable[..., Any], tmp_path: Path) -> None:
    settings = make_settings(pipeline="wordcount")
    events = oracle.wordcount_events(random.Random(424242), 320, START, seconds=3600)
    published = publish(spark, settings, events, tmp_path, redis_url)
    with api(pipeline="wordcount") as server, web.client(base_url=server.base_url, timeout=10) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["status"] == "ready", ready.text
        check_view_list(client, published)
        check_every_row(client, published, seed=1)
        words = sorted({key for key, _ in published.views["word_counts_per_minute"]})
        check_ranges(client, published, "word_counts_per_minute", random.Random(2).sample(words, 15), seed=3)
        # One range of 1999 windows (the limit is 2000) from the first timed minute.
        first = min(s for _, s in published.views["word_counts_per_minute"] if s is not None)
        assert not check_range(client, published, "word_counts_per_minute", "the", utc(first), utc(first + 1999 * 60))


@pytest.mark.slow  # over 4 s: the full tier (the quick tier has a 3-minute budget)
def test_payments_views_over_http_match_oracle(spark: Any, make_settings: Callable[..., Settings], redis_url: str,
                                               api: Callable[..., Any], tmp_path: Path) -> None:
    settings = make_settings(pipeline="payments")
    events = oracle.payments_events(random.Random(31337), 500, START, seconds=30 * 3600) + EDGE_PAYMENTS
    published = publish(spark, settings, events, tmp_path, redis_url)
    assert ("alice", -3600) in published.views["spend_by_user_hourly"]
    with api(pipeline="payments") as server, web.client(base_url=server.base_url, timeout=10) as client:
        assert client.get("/readyz").status_code == 200
        check_view_list(client, published)
        check_every_row(client, published, seed=4)
        users = sorted({key for key, _ in published.views["spend_by_user"]})
        check_ranges(client, published, "spend_by_user_hourly", users, seed=5)
        # Alice's hours across the Unix epoch (negative window starts), combined like the oracle.
        assert not check_range(client, published, "spend_by_user_hourly", "alice", utc(-2 * 3600), utc(2 * 3600))


@pytest.mark.slow  # over 2.5 s in a full run: the full tier (the quick tier has a 3-minute budget)
def test_error_answers_name_what_is_wrong(spark: Any, make_settings: Callable[..., Settings], redis_url: str,
                                          api: Callable[..., Any], tmp_path: Path) -> None:
    settings = make_settings(pipeline="wordcount")
    events = [{"text": "alpha beta", "event_time": "2024-03-01T10:15:20Z"}, {"text": "alpha", "event_time": "2024-03-01T12:00:00Z"}]
    published = publish(spark, settings, events, tmp_path, redis_url)
    assert published.views["word_counts"] == {("alpha", None): {"count": 2}, ("beta", None): {"count": 1}}
    with api(pipeline="wordcount") as server, web.client(base_url=server.base_url, timeout=10) as client:
        def error(url: str, status: int, **params: str) -> str:
            response = client.get(url, params=params)
            assert response.status_code == status, f"{url} {params}: {response.status_code} {response.text}"
            body = response.json()
            assert isinstance(body.get("detail"), str) and body.get("error"), body
            return body["detail"]

        detail = error("/v1/views/no_such_view/keys/alpha", 404)
        assert "no_such_view" in detail and "word_counts" in detail and "word_counts_per_minute" in detail

        detail = error(key_url("word_counts", "gamma?"), 404)
        assert "'gamma?'" in detail and "word_counts" in detail
        detail = error(key_url("word_counts_per_minute", "gamma"), 404, window_start="2024-03-01T10:15:00Z")
        assert "'gamma'" in detail
        # A known key, but not in the windows asked for.
        detail = error(key_url("word_counts_per_minute", "beta"), 404, window_start="2024-03-01T12:00:00Z")
        assert "'beta'" in detail
        error(key_url("word_counts_per_minute", "beta"), 404, **{"from": "2024-03-01T10:16:00Z", "to": "2024-03-01T13:00:00Z"})

        detail = error(key_url("word_counts_per_minute", "alpha"), 422)
        assert "window_start" in detail
        detail = error(key_url("word_counts_per_minute", "alpha"), 422, **{"from": "2024-03-01T10:00:00Z"})
        assert "window_start" in detail
        error(key_url("word_counts_per_minute", "alpha"), 422, window_start="1709288100", **{"from": "1709288100", "to": "1709290000"})
        error(key_url("word_counts_per_minute", "alpha"), 422, **{"from": "2024-03-01T12:00:00Z", "to": "2024-03-01T10:00:00Z"})
        detail = error(key_url("word_counts_per_minute", "alpha"), 422, **{"from": "2024-03-01T00:00:00Z", "to": "2024-03-03T00:00:00Z"})
        assert "2000" in detail
        detail = error(key_url("word_counts", "alpha"), 422, window_start="2024-03-01T10:15:00Z")
        assert "window" in detail

        malformed = client.get(key_url("word_counts_per_minute", "alpha"), params={"window_start": "yesterday"})
        assert malformed.status_code == 422 and "window_start" in malformed.text

        # The same key is fine once asked properly.
        good = client.get(key_url("word_counts_per_minute", "alpha"), params={"window_start": "2024-03-01T10:15:59.999Z"})
        assert good.status_code == 200 and good.json()["value"] == {"count": 1}, good.text


def test_nothing_published_answers_503(make_settings: Callable[..., Settings], api: Callable[..., Any], tmp_path: Path) -> None:
    settings = make_settings(pipeline="payments")
    ingest_file(settings, oracle.payments_events(random.Random(5), 20, START), tmp_path / "p.jsonl")  # ingested, no batch run
    with api(pipeline="payments") as server, web.client(base_url=server.base_url, timeout=10) as client:
        assert client.get("/healthz").status_code == 200
        ready = client.get("/readyz")
        assert ready.status_code == 503 and NO_GENERATION.search(ready.json()["detail"]), ready.text
        for url, params in ((key_url("spend_by_user", "alice"), {}),
                            (key_url("spend_by_user_hourly", "alice"), {"window_start": "2024-03-01T10:00:00Z"})):
            response = client.get(url, params=params)
            assert response.status_code == 503 and NO_GENERATION.search(response.json()["detail"]), response.text
        listed = client.get("/v1/views")
        assert listed.status_code == 200
        assert [v["generation"] for v in listed.json()["views"]] == [None, None]


@pytest.mark.slow  # over 2.5 s in a full run: the full tier (the quick tier has a 3-minute budget)
def test_redis_down_answers_503_naming_redis(spark: Any, make_settings: Callable[..., Settings], redis_url: str,
                                             redis_server: Any, api: Callable[..., Any], tmp_path: Path) -> None:
    settings = make_settings(pipeline="payments")
    events = [{"user_id": "alice", "merchant": "acme", "amount": 3.5, "event_time": "2024-03-01T10:15:00Z"}]
    publish(spark, settings, events, tmp_path, redis_url)
    with api(pipeline="payments") as server, web.client(base_url=server.base_url, timeout=30) as client:
        assert client.get(key_url("spend_by_user", "alice")).status_code == 200
        redis_server.stop()  # the redis_url fixture restarts it for the next test
        for url, params in ((key_url("spend_by_user", "alice"), {}),
                            (key_url("spend_by_user_hourly", "alice"), {"window_start": "2024-03-01T10:00:00Z"})):
            response = client.get(url, params=params)
            assert response.status_code == 503, response.text
            assert "redis" in response.json()["detail"].lower(), response.text
        ready = client.get("/readyz")
        assert ready.status_code == 503 and "redis" in ready.json()["detail"].lower(), ready.text


def test_openapi_documents_the_key_route(api: Callable[..., Any]) -> None:
    with api(pipeline="payments") as server:
        response = web.get(f"{server.base_url}/openapi.json", timeout=10)
    assert response.status_code == 200
    route = response.json()["paths"]["/v1/views/{view}/keys/{key}"]["get"]
    parameters = {p["name"]: p for p in route["parameters"]}
    assert {"view", "key", "window_start", "from", "to"} <= parameters.keys()
    assert parameters["view"]["in"] == parameters["key"]["in"] == "path"
    assert all(parameters[p]["in"] == "query" for p in ("window_start", "from", "to"))
    assert {"200", "404", "422", "503"} <= route["responses"].keys()
    assert all(parameters[p].get("description") for p in parameters)


# ---------------------------------------------------------------------------------------------
# Routing and range validation. Nothing is published, so a request that reaches the key handler with valid parameters answers
# 503 "no batch generation ... published"; a routing or validation answer comes before that.
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "word",
    ["plain", "q?x#y", "and/or"],
)
def test_any_key_reaches_the_key_handler(word: str, api: Callable[..., Any]) -> None:
    with api(pipeline="wordcount") as server:
        response = web.get(server.base_url + key_url("word_counts", word), timeout=10)
    assert response.status_code == 503, response.text
    assert NO_GENERATION.search(response.json()["detail"]), response.text


@pytest.mark.parametrize(
    ("start", "end"),
    [
        ("2024-03-01T10:01:30Z", "2024-03-01T10:00:10Z"),  # 'to' before 'from', in different windows
        ("2024-03-01T10:00:50Z", "2024-03-01T10:00:10Z"),  # 'to' before 'from' inside one window
        ("2024-03-01T10:00:30Z", "2024-03-01T10:00:30Z"),  # the empty range
    ],
)
def test_range_end_must_follow_range_start(start: str, end: str, api: Callable[..., Any]) -> None:
    with api(pipeline="wordcount") as server:
        response = web.get(server.base_url + key_url("word_counts_per_minute", "w"),
                             params={"from": start, "to": end}, timeout=10)
    assert response.status_code == 422, response.text
    assert "'to'" in response.json()["detail"], response.text
