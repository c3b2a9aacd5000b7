"""A sliding view end to end: the batch layer and the speed layer store panes, the API answers windows
and ranges exactly (the promise, for overlapping windows).

Events are ingested, a batch run publishes them (a barrier), more events follow (new ones and late ones
into old panes) and the speed layer applies them. Then, over HTTP, every sliding window of several songs
(by its start and by its end) and the top-N over random ranges and windows are compared with a pandas
oracle over every event of the master dataset at the version answered (read with delta-rs by
``tests.oracle``). A fixed clock makes "the window ending now" and ``last=`` reproducible.
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
from shared_logic import load_pipeline
from tests import oracle
from tests.support import ingest_file, key_url
from tests.support.servers import ApiServer
from tests.support.speed import running_speed_layer, wait_caught_up
from tests.support.trending_pipeline import SIZE, SLIDE

pytestmark = [pytest.mark.slow, pytest.mark.uses_jvm_subprocess]

PIPELINE, VIEW = "tests.support.trending_pipeline", "plays_trending"
T0 = 1_709_280_000  # 2024-03-01T08:00:00Z, a pane boundary
PANES = 12
SONGS = [f"song-{i}" for i in range(25)]
NOW = datetime.fromtimestamp(T0 + PANES * SLIDE - 100, tz=timezone.utc)  # in the last pane


class FixedClock:
    def now(self) -> datetime:
        return NOW


def _plays(rng: random.Random, n: int, panes: range) -> list[dict[str, Any]]:
    return [{"song": rng.choice(SONGS[:6]) if rng.random() < 0.5 else rng.choice(SONGS), "seconds": rng.randint(-5, 300),
             "event_time": str(T0 + rng.choice(panes) * SLIDE + rng.randrange(SLIDE))} for _ in range(n)]


def _oracle_frame(settings: Any, version: int) -> pd.DataFrame:
    events = pd.DataFrame(oracle.read_events(settings.master_path, version))
    events["t"] = [int(t.timestamp() // 1) for t in events["event_time"]]
    return events


def _value(rows: pd.DataFrame) -> dict[str, Any]:
    return {"count": len(rows), "sum_seconds": int(rows.seconds.sum()), "min_seconds": int(rows.seconds.min()),
            "max_seconds": int(rows.seconds.max())}


def _top(events: pd.DataFrame, start: int, end: int, measure: str, n: int) -> list[tuple[str, int]]:
    inside = events[(events.t >= start) & (events.t < end)]
    how = {"count": "count", "sum_seconds": "sum", "min_seconds": "min", "max_seconds": "max"}[measure]
    values = inside.groupby("song")["seconds"].agg(how)
    return sorted(((k, int(v)) for k, v in values.items()), key=lambda kv: (-kv[1], kv[0]))[:n]


def test_sliding_windows_and_ranges_are_exact_across_the_barrier(spark: Any, make_settings: Any, tmp_path: Any) -> None:
    settings = make_settings(pipeline=PIPELINE, speed_trigger_seconds=0.2)
    rng = random.Random(17)
    ingest_file(settings, _plays(rng, 300, range(PANES)), tmp_path / "first.jsonl")
    run_batch(spark, settings, load_pipeline(PIPELINE), redis_url=settings.redis_url)
    with running_speed_layer(spark, settings) as speed:
        ingest_file(settings, _plays(rng, 120, range(PANES - 3, PANES)), tmp_path / "new.jsonl")
        ingest_file(settings, _plays(rng, 60, range(0, 4)), tmp_path / "late.jsonl")  # late: into old panes
        version = wait_caught_up(settings, speed=speed)
    events = _oracle_frame(settings, version)
    app = create_app(settings, redis_url=settings.redis_url or "", clock=FixedClock())
    with ApiServer(app) as server, httpx.Client(base_url=server.base_url, timeout=30) as http:
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
