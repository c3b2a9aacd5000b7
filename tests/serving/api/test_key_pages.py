"""Listing a view's keys (``GET /v1/views/{view}/keys``) against a pandas oracle, over real HTTP and Redis.

A batch generation is published from real ingested events (``run_batch``), a realtime segment is
written on top of it by the speed layer's own write code (``write_increments``, committed with
``PipelineStore.commit_processed``), and the composite-key test pipeline (``tests.support.flights_pipeline``) is
paged with a small limit. Halfway through, more events are ingested and a new generation is
published (a flip). Checked against pandas over the events (never the code's own output):

* every route that existed when paging began is listed exactly once, in bytewise key order, and
  nothing else than routes of the final events; each page's values equal the oracle at the
  version the page names (before the flip: batch + realtime; after it: the new generation);
* ``prefix=`` and key column filters (``origin=``, ``dest=``, both, contradicting) list exactly
  pandas' rows with pandas' values; the windowed view over a ``from``/``to`` range lists one row per
  key, its hours in the range combined, equal to pandas' groups of the range's events;
* the CSV and NDJSON exports equal the concatenated pages;
* a bad cursor, a cursor made for other filters, a filter on a non-key column and a bad limit
  answer 422 naming the fix.
"""

from __future__ import annotations

import csv
import io
import json
import random
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from batch_layer.recompute.job import run_batch
from deploy.settings import Settings
from shared_logic.registry import load_pipeline
from tests.support import ingest_file, web
from tests.support.flights import AIRPORTS, ALL, HOURLY, PIPELINE, START, flights, oracle, write_realtime
from tests.support.key_pages import as_oracle, check_values, every_page, page, rows_of


@pytest.mark.slow  # over 10 s: the end-to-end tier
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

    with api(pipeline=PIPELINE, **overrides) as server, web.client(base_url=server.base_url, timeout=30) as client:
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

        # The windowed view over a range of hours: one row per key, its hours combined (the range's
        # events by pandas, as one group per key), in key order, each row naming the hours it covers.
        hours = {"from": (START + timedelta(minutes=90)).isoformat(), "to": (START + timedelta(hours=4)).isoformat()}
        inside = final[(pd.to_datetime(final["event_time"]) >= START + timedelta(hours=1))
                       & (pd.to_datetime(final["event_time"]) < START + timedelta(hours=4))]
        listed = rows_of(every_page(client, HOURLY, hours, 5))
        first_hour = int((START + timedelta(hours=1)).timestamp())
        check_values(as_oracle(listed), {(k, first_hour): v for (k, _), v in oracle(inside.to_dict("records")).items()})
        assert [e["key"].encode() for e in listed] == sorted(e["key"].encode() for e in listed)
        assert {e["window"]["end"][:19] for e in listed} == {(START + timedelta(hours=4)).isoformat()[:19]}
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
    with api(pipeline=PIPELINE) as server, web.client(base_url=server.base_url, timeout=30) as client:
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
