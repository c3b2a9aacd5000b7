"""A sliding view end to end: the batch layer and the speed layer store panes, the API answers windows
and ranges exactly (the promise, for overlapping windows).

Events are ingested, a batch run publishes them (a barrier), more events follow (new ones and late ones
into old panes) and the speed layer applies them. Then, over HTTP, every sliding window of several songs
(by its start and by its end), the top-N over random ranges and windows, and the key listing of windows
and ranges (one row per song, its panes combined: distinct listeners united, one song's rows past the
exact-set size so HyperLogLogs are united too) are compared with a pandas oracle over every event of the
master dataset at the version answered (read with delta-rs by ``tests.oracle``). A fixed clock makes "the
window ending now" and ``last=`` reproducible. Last, a window's listing is paged across a flip: every song
of the window is listed once, in key order, each page equal to the oracle at the version it names.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from typing import Any

import httpx
import pandas as pd
import pytest

from batch_layer.recompute.job import run_batch
from serving.api.app import create_app
from serving.store.row_format import EXACT_DISTINCT_MAX
from shared_logic import load_pipeline
from tests import oracle
from tests.support import ingest_file, key_url, web, window_oracle
from tests.support.key_pages import every_page, rows_of
from tests.support.servers import ApiServer
from tests.support.speed import running_speed_layer, wait_caught_up
from tests.support.trending_pipeline import SIZE, SLIDE

pytestmark = [pytest.mark.slow, pytest.mark.uses_jvm_subprocess]

PIPELINE, VIEW, LISTENERS = "tests.support.trending_pipeline", "plays_trending", "listeners_trending"
T0 = 1_709_280_000  # 2024-03-01T08:00:00Z, a pane boundary
PANES = 12
SONGS = [f"song-{i}" for i in range(25)]
NOW = datetime.fromtimestamp(T0 + PANES * SLIDE - 100, tz=timezone.utc)  # in the last pane


class FixedClock:
    def now(self) -> datetime:
        return NOW


def _plays(rng: random.Random, n: int, panes: range) -> list[dict[str, Any]]:
    return [{"song": rng.choice(SONGS[:6]) if rng.random() < 0.5 else rng.choice(SONGS), "seconds": rng.randint(-5, 300),
             "listener": f"user-{rng.randrange(30)}", "event_time": str(T0 + rng.choice(panes) * SLIDE + rng.randrange(SLIDE))}
            for _ in range(n)]


def _fans(first: int, count: int, pane: int) -> list[dict[str, Any]]:
    """Plays of song-0 by ``count`` distinct fans from ``first`` on, in one pane: past EXACT_DISTINCT_MAX, a row
    keeps them as a HyperLogLog."""
    return [{"song": "song-0", "seconds": 30, "listener": f"fan-{first + i}", "event_time": str(T0 + pane * SLIDE + i % SLIDE)}
            for i in range(count)]


def _oracle_frame(settings: Any, version: int) -> pd.DataFrame:
    events = pd.DataFrame(oracle.read_events(settings.master_path, version))
    events["t"] = [int(t.timestamp() // 1) for t in events["event_time"]]
    return events


def _value(rows: pd.DataFrame) -> dict[str, Any]:
    return {"count": len(rows), "sum_seconds": int(rows.seconds.sum()), "min_seconds": int(rows.seconds.min()),
            "max_seconds": int(rows.seconds.max())}


def _top(events: pd.DataFrame, start: int, end: int, measure: str, n: int) -> list[tuple[str, int]]:
    how = {"count": "count", "sum_seconds": "sum", "min_seconds": "min", "max_seconds": "max"}[measure]
    return window_oracle.window_top(events, "song", "seconds", start, end, how, n)


def test_sliding_windows_and_ranges_are_exact_across_the_barrier(spark: Any, make_settings: Any, tmp_path: Any) -> None:
    settings = make_settings(pipeline=PIPELINE, speed_trigger_seconds=0.2)
    rng = random.Random(17)
    ingest_file(settings, _plays(rng, 300, range(PANES)) + _fans(0, 90, PANES - 2), tmp_path / "first.jsonl")
    run_batch(spark, settings, load_pipeline(PIPELINE), redis_url=settings.redis_url)
    with running_speed_layer(spark, settings) as speed:
        ingest_file(settings, _plays(rng, 120, range(PANES - 3, PANES)) + _fans(60, 80, PANES - 1), tmp_path / "new.jsonl")
        ingest_file(settings, _plays(rng, 60, range(0, 4)), tmp_path / "late.jsonl")  # late: into old panes
        version = wait_caught_up(settings, speed=speed)
    events = _oracle_frame(settings, version)
    app = create_app(settings, redis_url=settings.redis_url or "", clock=FixedClock())
    with ApiServer(app) as server, web.client(base_url=server.base_url, timeout=30) as http:
        for first in range(PANES - SIZE // SLIDE + 1):  # every whole window, by its start and by its end
            start, end = T0 + first * SLIDE, T0 + first * SLIDE + SIZE
            for song in SONGS[:8]:
                rows = events[(events.song == song) & (events.t >= start) & (events.t < end)]
                for params in ({"window_start": str(start + 7)}, {"window_end": str(end)}):
                    answer = http.get(key_url(VIEW, song), params=params)
                    if rows.empty:
                        assert answer.status_code == 404, (song, params, answer.text)
                        continue
                    body = answer.json()
                    assert body["version"] == version and body["value"] == _value(rows), (song, params, body)
                    assert len(body["windows"]) == rows.t.floordiv(SLIDE).nunique()
        now = http.get(f"/v1/views/{VIEW}/top", params={"window_end": "now", "n": 5}).json()
        end = T0 + PANES * SLIDE
        assert now["now"].startswith(NOW.isoformat()[:19]) and now["window"]["end"].startswith("2024-03-01T09:00")
        assert [(e["key"], e["value"]) for e in now["top"]] == _top(events, end - SIZE, end, "count", 5)
        for _ in range(12):  # random ranges of panes, every measure
            a = rng.randrange(PANES)
            b = rng.randint(a + 1, PANES)
            measure, n = rng.choice(["count", "sum_seconds", "min_seconds", "max_seconds"]), rng.choice([1, 3, 10, 40])
            params = {"from": str(T0 + a * SLIDE), "to": str(T0 + b * SLIDE), "measure": measure, "n": n}
            body = http.get(f"/v1/views/{VIEW}/top", params=params).json()
            assert [(e["key"], e["value"]) for e in body["top"]] == _top(events, T0 + a * SLIDE, T0 + b * SLIDE,
                                                                          measure, n), params
        last = http.get(f"/v1/views/{VIEW}/top", params={"last": "30m", "n": 3}).json()
        since = NOW - timedelta(minutes=30)
        first_pane = int(since.timestamp()) // SLIDE * SLIDE
        assert last["range"]["start"].startswith(since.isoformat()[:19])
        assert [(e["key"], e["value"]) for e in last["top"]] == _top(events, first_pane, end, "count", 3)

        listings = [({"window_end": "now"}, end - SIZE, end), ({"window_start": str(T0 + SLIDE + 9)}, T0 + SLIDE, T0 + SLIDE + SIZE),
                    ({"last": "30m"}, first_pane, end)]
        for _ in range(4):
            a = rng.randrange(PANES)
            b = rng.randint(a + 1, PANES)
            listings.append(({"from": str(T0 + a * SLIDE + 1), "to": str(T0 + b * SLIDE)}, T0 + a * SLIDE, T0 + b * SLIDE))
        for params, start, stop in listings:
            _check_listing(http, events, params, start, stop)
        _page_across_a_flip(spark, settings, http, rng, tmp_path, end)


def _listed(http: httpx.Client, view: str, params: dict[str, str], limit: int) -> list[dict[str, Any]]:
    rows = rows_of(every_page(http, view, params, limit))
    keys = [row["key"].encode() for row in rows]
    assert keys == sorted(set(keys)), (view, params, "each key once, in bytewise order")
    return rows


def _check_listing(http: httpx.Client, events: pd.DataFrame, params: dict[str, str], start: int, stop: int) -> None:
    """Both views' listing over the panes of [start, stop): a row per song, its panes combined, as pandas groups
    the events in them (distinct listeners exact where every part kept its set, else within HyperLogLog's error)."""
    inside = events[(events.t >= start) & (events.t < stop)]
    plays = _listed(http, VIEW, params, 4)
    assert {row["key"]: row["value"] for row in plays} == {song: _value(rows) for song, rows in inside.groupby("song")}, params
    assert all(row["window"]["start"].startswith(datetime.fromtimestamp(start, tz=timezone.utc).isoformat()[:19])
               for row in plays), params
    listeners = {row["key"]: row["value"] for row in _listed(http, LISTENERS, params, 3)}
    assert set(listeners) == set(inside.song), params
    for song, rows in inside.groupby("song"):
        got, want = listeners[song], {"count": len(rows), "distinct_listener": rows.listener.nunique()}
        assert got["count"] == want["count"], (song, params)
        # a pane's batch or realtime part keeps a HyperLogLog only when the pane has more distinct listeners
        sketched = rows.groupby(rows.t // SLIDE).listener.nunique().max() > EXACT_DISTINCT_MAX
        slack = max(1, 0.03 * want["distinct_listener"]) if sketched else 0
        assert abs(got["distinct_listener"] - want["distinct_listener"]) <= slack, (song, params, got, want, sketched)


def _page_across_a_flip(spark: Any, settings: Any, http: httpx.Client, rng: random.Random, tmp_path: Any, end: int) -> None:
    """The window ending now, paged 3 songs at a time; after two pages new plays (songs sorting first and last
    among them) are ingested and a batch run flips the generation, and paging goes on from the cursor."""
    bodies: list[dict[str, Any]] = []
    cursor = None
    while cursor is not None or not bodies:
        if len(bodies) == 2:
            fresh = [{**play, "song": song} for play, song in zip(_plays(rng, 6, range(PANES - 2, PANES)), ["a-new", "zz-new"] * 3)]
            ingest_file(settings, _plays(rng, 40, range(PANES - 4, PANES)) + fresh, tmp_path / "flip.jsonl")
            run_batch(spark, settings, load_pipeline(PIPELINE), redis_url=settings.redis_url)
        response = http.get(f"/v1/views/{VIEW}/keys", params={"window_end": "now", "limit": 3, **({"cursor": cursor} if cursor else {})})
        assert response.status_code == 200, response.text
        bodies.append(response.json())
        cursor = bodies[-1]["next_cursor"]
    assert len({body["generation"] for body in bodies}) == 2, "the flip fell between two pages"
    frames = {v: _oracle_frame(settings, v) for v in {body["version"] for body in bodies}}
    windows = {v: f[(f.t >= end - SIZE) & (f.t < end)] for v, f in frames.items()}
    first, last = windows[bodies[0]["version"]], windows[bodies[-1]["version"]]
    keys = [row["key"] for row in rows_of(bodies)]
    assert [k.encode() for k in keys] == sorted({k.encode() for k in keys}), "each song once, in key order"
    assert set(first.song) <= set(keys) <= set(last.song) and "zz-new" in keys and "a-new" not in keys
    for body in bodies:  # every page at one version, equal to pandas at it
        inside = windows[body["version"]]
        for row in body["keys"]:
            assert row["value"] == _value(inside[inside.song == row["key"]]), (body["version"], row)
