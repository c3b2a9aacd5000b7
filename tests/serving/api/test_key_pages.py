"""Listing a view's keys (``GET /v1/views/{view}/keys``) against a pandas oracle, over real HTTP and Redis.

A batch generation is published from real ingested events (``run_batch``), a realtime segment is
written on top of it by the speed layer's own write code (``write_increments``, committed with
``commit_processed``), and the composite-key test pipeline (``tests.support.flights_pipeline``) is
paged with a small limit. Halfway through, more events are ingested and a new generation is
published (a flip). Checked against pandas over the events (never the code's own output):

* every route that existed when paging began is listed exactly once, in bytewise key order, and
  nothing else than routes of the final events; each page's values equal the oracle at the
  version the page names (before the flip: batch + realtime; after it: the new generation);
* ``prefix=`` and key column filters (``origin=``, ``dest=``, both, contradicting) and the
  windowed view over a ``from``/``to`` range list exactly pandas' rows with pandas' values;
* the CSV and NDJSON exports equal the concatenated pages;
* a bad cursor, a cursor made for other filters, a filter on a non-key column and a bad limit
  answer 422 naming the fix.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import random
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from batch_layer.recompute.job import run_batch
from deploy.settings import Settings
from serving.store.connection import redis_client, store_keys
from serving.store.generations import read_epoch
from serving.store.segment_commits import commit_processed
from shared_logic.registry import load_pipeline
from speed_layer.segments import DEPTH, WriteSpec, encode, measure_spec, write_increments
from tests.support import ingest_file

PIPELINE = "tests.support.flights_pipeline"
START = datetime(2024, 3, 1, 9, 0, tzinfo=timezone.utc)
AIRPORTS = ["JFK", "LAX", "SFO", "ORD", "JAX", "X|Y", "B\\S", "Ünï"]
ALL, HOURLY = "flights_by_route", "flights_by_route_hourly"


def flights(rng: random.Random, n: int, airports: list[str]) -> list[dict[str, Any]]:
    return [{"origin": rng.choice(airports), "dest": rng.choice(airports), "delay": rng.randint(-5, 90),
             "event_time": (START + timedelta(seconds=rng.randrange(6 * 3600))).isoformat()} for _ in range(n)]


def encoded(*values: str) -> str:
    return "|".join(v.replace("\\", "\\\\").replace("|", "\\|") for v in values)


def oracle(events: list[dict[str, Any]], hourly: bool = False) -> dict[tuple[str, int | None], dict[str, int]]:
    """(encoded key, window start or None) -> the measures, by pandas."""
    frame = pd.DataFrame(events)
    frame["key"] = [encoded(o, d) for o, d in zip(frame["origin"], frame["dest"])]
    frame["ws"] = (pd.to_datetime(frame["event_time"]).astype("int64") // 10**9 // 3600 * 3600) if hourly else -1
    grouped = frame.groupby(["key", "ws"])["delay"].agg(["size", "sum", "max"])
    return {(k, None if ws == -1 else int(ws)): {"count": int(c), "sum_delay": int(s), "max_delay": int(m)}
            for (k, ws), (c, s, m) in grouped.iterrows()}


def write_realtime(spark: Any, settings: Settings, base: int, events: list[dict[str, Any]], last: int,
                   batch_id: int = 0) -> None:
    """The speed layer's write of ``events`` into the segment based at ``base`` as micro-batch ``batch_id``,
    committed at version ``last``."""
    pipeline = load_pipeline(settings.pipeline)
    client = redis_client(settings.redis_url)
    keys = store_keys(pipeline.name, settings.redis_url)
    frame = spark.createDataFrame(
        [(e["origin"], e["dest"], e["delay"], datetime.fromisoformat(e["event_time"])) for e in events],
        "origin string, dest string, delay long, event_time timestamp")
    rows = pipeline.transform(frame)
    parts = [encode(view.aggregate(rows).withColumn(DEPTH, F.lit(1)), view, (3, 0)) for view in pipeline.views]
    spec = WriteSpec(settings.redis_url, pipeline.name, "test-speed", read_epoch(client, keys) or "", batch_id, last, (base,),
                     {view.name: measure_spec(view) for view in pipeline.views}, 500)
    write_increments(functools.reduce(DataFrame.unionByName, parts), spec, partitions=2)
    commit_processed(client, keys, [base], last)
    client.close()


def page(client: httpx.Client, view: str, params: dict[str, Any], **headers: str) -> httpx.Response:
    return client.get(f"/v1/views/{view}/keys", params=params, headers=headers)


def every_page(client: httpx.Client, view: str, params: dict[str, Any], limit: int) -> list[dict[str, Any]]:
    bodies, cursor = [], None
    while True:
        response = page(client, view, {**params, "limit": limit, **({"cursor": cursor} if cursor else {})})
        assert response.status_code == 200, response.text
        body = response.json()
        assert len(body["keys"]) <= limit
        bodies.append(body)
        cursor = body["next_cursor"]
        if cursor is None:
            return bodies


def rows_of(bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [entry for body in bodies for entry in body["keys"]]


def as_oracle(entries: list[dict[str, Any]]) -> dict[tuple[str, int | None], dict[str, Any]]:
    def start(entry: dict[str, Any]) -> int | None:
        window = entry["window"]
        return None if window is None else int(datetime.fromisoformat(window["start"]).timestamp())

    return {(e["key"], start(e)): e["value"] for e in entries}


def check_values(got: dict[tuple[str, int | None], dict[str, Any]], want: dict[tuple[str, int | None], dict[str, int]]) -> None:
    assert set(got) == set(want), f"rows {sorted(set(got) ^ set(want))[:10]} differ"
    for row, value in want.items():
        assert got[row] == value and all(type(v) is int for v in got[row].values()), (row, got[row], value)


@pytest.mark.parametrize("store", ["redis", "redis-cluster"])
def test_paging_lists_every_key_once_across_a_flip_and_filters_match_pandas(
        store: str, spark: Any, make_settings: Callable[..., Settings], api: Callable[..., Any], tmp_path: Path,
        request: pytest.FixtureRequest) -> None:
    """On one Redis, and on a Redis Cluster of 3 masters (16 buckets: every page merges them)."""
    overrides = {"redis_url": request.getfixturevalue("cluster_url")} if store == "redis-cluster" else {}
    settings = make_settings(pipeline=PIPELINE, **overrides)
    rng = random.Random(7)
    first, realtime = flights(rng, 150, AIRPORTS[:5]), flights(rng, 40, AIRPORTS)
    later = flights(rng, 60, AIRPORTS + ["AAA", "ZZZ", "JFK2"])
    ingest_file(settings, first, tmp_path / "e1.jsonl")
    generation = run_batch(spark, settings, load_pipeline(PIPELINE), redis_url=settings.redis_url).generation
    processed = ingest_file(settings, realtime, tmp_path / "e2.jsonl").version
    write_realtime(spark, settings, generation, realtime, processed)
    before, after = oracle(first + realtime), oracle(first + realtime + later)
    assert set(oracle(realtime)) - set(oracle(first)), "the realtime events should bring routes the batch lacks"

    with api(pipeline=PIPELINE, **overrides) as server, httpx.Client(base_url=server.base_url, timeout=30) as client:
        bodies, cursor = [], None
        for _ in range(5):
            response = page(client, ALL, {"limit": 3, **({"cursor": cursor} if cursor else {})})
            assert response.status_code == 200, response.text
            bodies.append(response.json())
            cursor = bodies[-1]["next_cursor"]
        assert all(b["version"] == processed and b["generation"] == generation for b in bodies)
        ingest_file(settings, later, tmp_path / "e3.jsonl")  # a flip between two pages
        flipped = run_batch(spark, settings, load_pipeline(PIPELINE), redis_url=settings.redis_url).generation
        assert flipped > processed
        while cursor is not None:
            response = page(client, ALL, {"limit": 3, "cursor": cursor})
            assert response.status_code == 200, response.text
            bodies.append(response.json())
            cursor = bodies[-1]["next_cursor"]

        keys = [e["key"] for e in rows_of(bodies)]
        assert len(keys) == len(set(keys)), "a key was listed twice"
        assert keys == sorted(keys, key=str.encode), "keys are not in bytewise order"
        assert {k for k, _ in before} <= set(keys) <= {k for k, _ in after}
        for body in bodies:  # each page at one version, with the oracle's values at that version
            want = before if body["version"] == processed else after
            assert body["version"] in (processed, flipped), body["version"]
            for entry in body["keys"]:
                assert entry["value"] == want[(entry["key"], None)], entry
                assert entry["columns"] == dict(zip(("origin", "dest"), _split(entry["key"])))
        assert any(b["version"] == flipped for b in bodies)

        # Filters against pandas, at the final state (one generation, no realtime part).
        final = pd.DataFrame(first + realtime + later)
        for params, mask in (
            ({"prefix": "J"}, final["origin"].str.startswith("J")),
            ({"origin": "JFK"}, final["origin"] == "JFK"),
            ({"dest": "X|Y"}, final["dest"] == "X|Y"),
            ({"origin": "B\\S", "dest": "LAX"}, (final["origin"] == "B\\S") & (final["dest"] == "LAX")),
            ({"origin": "JFK", "prefix": "LAX"}, final["origin"] == "nothing"),
            ({"prefix": "X\\|"}, final["origin"] == "X|Y"),
        ):
            want = oracle(final[mask].to_dict("records")) if mask.any() else {}
            check_values(as_oracle(rows_of(every_page(client, ALL, params, 4))), want)

        # The windowed view, over a range of hours.
        hours = {"from": START.isoformat(), "to": (START + timedelta(hours=6)).isoformat()}
        listed = rows_of(every_page(client, HOURLY, hours, 5))
        check_values(as_oracle(listed), oracle(first + realtime + later, hourly=True))
        order = [(e["window"]["start"], e["key"].encode()) for e in listed]
        assert order == sorted(order)
        one = rows_of(every_page(client, HOURLY, {"window_start": (START + timedelta(minutes=70)).isoformat(),
                                                  "origin": "JFK"}, 2))
        check_values(as_oracle(one), {row: v for row, v in oracle(final[final["origin"] == "JFK"].to_dict("records"),
                                                                     hourly=True).items()
                                      if row[1] == int((START + timedelta(hours=1)).timestamp())})

        # Exports equal paging.
        for view, params in ((ALL, {}), (ALL, {"dest": "SFO"}), (HOURLY, hours)):
            paged = rows_of(every_page(client, view, params, 7))
            ndjson = page(client, view, params, accept="application/x-ndjson")
            assert ndjson.status_code == 200 and ndjson.headers["content-type"].startswith("application/x-ndjson")
            assert [json.loads(line) for line in ndjson.text.splitlines()] == paged
            exported = page(client, view, params, accept="text/csv")
            assert exported.status_code == 200 and exported.headers["content-type"].startswith("text/csv")
            table = list(csv.DictReader(io.StringIO(exported.text)))
            assert len(table) == len(paged)
            for line, entry in zip(table, paged):
                assert (line["origin"], line["dest"]) == _split(entry["key"])
                assert {m: int(line[m]) for m in ("count", "sum_delay", "max_delay")} == entry["value"]
                if view == HOURLY:
                    assert datetime.fromisoformat(line["window_start"]) == datetime.fromisoformat(entry["window"]["start"])


def _split(key: str) -> tuple[str, str]:
    from serving.store.keys import decode_key

    origin, dest = decode_key(key, 2)
    return origin, dest


def test_bad_cursor_filter_and_limit_answer_422(spark: Any, make_settings: Callable[..., Settings],
                                               api: Callable[..., Any], tmp_path: Path) -> None:
    settings = make_settings(pipeline=PIPELINE)
    ingest_file(settings, flights(random.Random(3), 30, AIRPORTS[:4]), tmp_path / "e.jsonl")
    run_batch(spark, settings, load_pipeline(PIPELINE), redis_url=settings.redis_url)
    with api(pipeline=PIPELINE) as server, httpx.Client(base_url=server.base_url, timeout=30) as client:
        def refused(view: str, params: dict[str, Any], *words: str) -> None:
            response = page(client, view, params)
            assert response.status_code == 422, response.text
            detail = response.json()["detail"]
            assert all(w in detail for w in words), detail

        cursor = page(client, ALL, {"limit": 1, "origin": "JFK"}).json()["next_cursor"]
        assert cursor
        refused(ALL, {"cursor": cursor, "origin": "LAX"}, "cursor", "other filters")
        refused(ALL, {"cursor": cursor}, "other filters")
        refused(HOURLY, {"cursor": cursor, "origin": "JFK", "window_start": START.isoformat()}, "other filters")
        refused(ALL, {"cursor": "not-a-cursor"}, "cursor")
        refused(ALL, {"cursor": cursor[:-3]}, "cursor")
        refused(ALL, {"delay": "5"}, "'delay'", "origin", "dest")
        refused(ALL, {"origin": ["JFK", "LAX"]}, "twice")
        refused(ALL, {"limit": 0}, "limit")
        refused(ALL, {"limit": 1001}, "limit")
        refused(HOURLY, {}, "window_start")
        refused(ALL, {"window_start": START.isoformat()}, "window")
        assert page(client, ALL, {"cursor": cursor, "origin": "JFK"}).status_code == 200
        assert page(client, "no_such_view", {}).status_code == 404
