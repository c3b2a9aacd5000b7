"""Session views end to end: the batch and speed layers store each user's sessions, the API answers them exactly
across the batch/speed boundary (the promise, for sessions).

A batch run publishes the first events (a barrier). The speed layer then applies late events that extend a
session the batch closed and bridge two batch sessions into one, while its first micro-batch fails right after
its write reached Redis (an injected fault where a kill -9 leaves it: the query is restarted, the micro-batch
replayed under the same id, and only the guard keeps it from counting twice). A second batch run recomputes
between, and more late events bridge sessions across that barrier too, their micro-batch failing half applied
(between two views' chunks): its replay skips the chunks applied, merging no session part twice. After each stage every user's sessions,
sessions in a range, summary and the top-N by session count and by longest session equal a gap sessionization
written here in pandas over every event of the master dataset at the version answered (read with delta-rs).
The bounded view (two sessions a user) folds older ones: answers touching them say they are not exact, a
top-N over them is refused with a 422 naming the range, and one after them is exact. A second test asks the
same on a Redis Cluster with the speed layer writing from Spark's tasks in small chunks.
"""

from __future__ import annotations

import random
from datetime import datetime
from typing import Any

import httpx
import pandas as pd
import pytest
import redis

from batch_layer.faults import injected
from batch_layer.recompute.job import run_batch
from serving.api.app import create_app
from shared_logic import load_pipeline
from tests import oracle
from tests.support import ingest_file, web, window_oracle
from tests.support.servers import ApiServer
from tests.support.speed import running_speed_layer, wait_caught_up
from tests.support.visits_pipeline import GAP, KEEP

pytestmark = [pytest.mark.slow, pytest.mark.uses_jvm_subprocess]

PIPELINE = "tests.support.visits_pipeline"
T0 = 1_709_280_000  # 2024-03-01T08:00:00Z
USERS = [f"u{i}" for i in range(8)]


def _event(user: str, t: int, seconds: int = 10) -> dict[str, Any]:
    return {"user": user, "page": f"/p{t % 7}", "seconds": seconds, "event_time": str(T0 + t)}


def _noise(rng: random.Random, n: int) -> list[dict[str, Any]]:
    return [_event(rng.choice(USERS[3:]), rng.randrange(20_000), rng.randint(-5, 300)) for _ in range(n)]


def events_at(settings: Any, version: int) -> pd.DataFrame:
    """Every event of the master dataset at ``version`` (delta-rs), its time ``t`` in seconds after T0."""
    events = pd.DataFrame(oracle.read_events(settings.master_path, version))
    events["t"] = [int(t.timestamp()) - T0 for t in events["event_time"]]
    return events


def sessionize(events: pd.DataFrame) -> pd.DataFrame:
    """Every user's sessions from scratch (``tests.support.window_oracle``): count, sum, min and max of seconds."""
    return window_oracle.sessionize(events, "user", GAP, "seconds")


def _seconds(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp())


def _got(body: dict[str, Any]) -> list[tuple]:
    return [(_seconds(s["session_start"]), _seconds(s["session_end"]), s["value"]["count"], s["value"]["sum_seconds"],
             s["value"]["min_seconds"], s["value"]["max_seconds"]) for s in body["sessions"]]


def _want(sessions: pd.DataFrame) -> list[tuple]:
    return [(T0 + r.start, T0 + r.end, r.count, r.sum, r.min, r.max) for r in sessions.itertuples()]


def _top(sessions: pd.DataFrame, by: str, n: int) -> list[tuple[str, float]]:
    return window_oracle.session_top(sessions, "user", by, n)


def check(http: httpx.Client, settings: Any, version: int, rng: random.Random, *, bridged: list[tuple[str, int, int]]) -> None:
    """Every answer of the visits view equals the pandas sessionization at ``version``; ``bridged``: sessions (user,
    start, end) the oracle must hold, so the late events did extend and bridge what the test means them to."""
    events = events_at(settings, version)
    sessions = sessionize(events)
    for user, start, end in bridged:
        assert ((sessions.user == user) & (sessions.start == start) & (sessions.end == end)).any(), (user, start, end)
    for user in USERS:
        mine = sessions[sessions.user == user]
        body = http.get(f"/v1/views/visits/sessions/keys/{user}").json()
        assert body["version"] == version and body["exact"] and _got(body) == _want(mine), (user, body)
        summary = http.get(f"/v1/views/visits/sessions/summary/{user}").json()
        durations = mine.end - mine.start
        assert (summary["sessions"], summary["total_duration"], summary["longest"]) == \
            (len(mine), float(durations.sum()), float(durations.max())), (user, summary)
        assert summary["mean_duration"] == pytest.approx(durations.mean())
        pages = http.get(f"/v1/views/pages_seen/keys/{user}").json()  # an all-time view written beside the sessions
        assert pages["value"] == {"count": int((events.user == user).sum()),
                                  "distinct_page": events[events.user == user].page.nunique()}, (user, pages)
    for _ in range(4):  # random ranges: sessions overlapping them, whole
        a = rng.randrange(0, 15_000)
        b = a + rng.randint(1, 8_000)
        inside = sessions[(sessions.start < b) & (sessions.end >= a)]
        params = {"from": str(T0 + a), "to": str(T0 + b)}
        for user in USERS[:4]:
            body = http.get(f"/v1/views/visits/sessions/keys/{user}", params=params).json()
            assert _got(body) == _want(inside[inside.user == user]), (user, params, body)
        for by in ("count", "longest"):
            top = http.get("/v1/views/visits/sessions/top", params={**params, "by": by, "n": 3}).json()
            assert [(e["key"], e["value"]) for e in top["top"]] == _top(inside, by, 3), (by, params, top)
    for by in ("count", "longest"):
        top = http.get("/v1/views/visits/sessions/top", params={"by": by, "n": 10}).json()
        assert top["version"] == version and [(e["key"], e["value"]) for e in top["top"]] == _top(sessions, by, 10)


def test_sessions_are_exact_across_the_barrier_a_recompute_and_a_replayed_micro_batch(
        spark: Any, make_settings: Any, tmp_path: Any) -> None:
    settings = make_settings(pipeline=PIPELINE, speed_trigger_seconds=0.2)
    rng = random.Random(5)
    first = [_event("u0", t) for t in (0, 600, 1200, 4500, 4900)]  # u0: [0, 1200] and [4500, 4900]
    first += [_event("u1", t) for t in (0, 300)] + [_event("u1", t) for t in (6000, 9000)]
    first += [_event("bounded", t) for t in (0, 10_000, 20_000, 30_000, 40_000)]  # five sessions: three folded
    ingest_file(settings, first + _noise(rng, 60), tmp_path / "first.jsonl")
    run_batch(spark, settings, load_pipeline(PIPELINE), redis_url=settings.redis_url)
    replayed: list[bool] = []

    def fail_once() -> None:
        if not replayed:
            replayed.append(True)
            raise redis.exceptions.ConnectionError("Error 111 connecting to Redis (injected after the write)")

    app = create_app(settings, redis_url=settings.redis_url or "")
    with ApiServer(app) as server, web.client(base_url=server.base_url, timeout=30) as http:
        with running_speed_layer(spark, settings) as speed:
            with injected("speed-after-write", fail_once):
                late = [_event("u0", 2900), _event("u1", 2000)]  # bridges u0's two sessions; extends u1's first
                late += [_event("u2", t) for t in (100, 1000)] + [_event("bounded", 50_000)]
                ingest_file(settings, late + _noise(rng, 30), tmp_path / "late.jsonl")
                version = wait_caught_up(settings, speed=speed)
            assert replayed, "the fault was not injected"
            check(http, settings, version, rng, bridged=[("u0", 0, 4900), ("u1", 0, 2000)])
            run_batch(spark, settings, load_pipeline(PIPELINE), redis_url=settings.redis_url)  # a recompute between
            later = [_event("u1", 7500), _event("u0", 6500), _event("u2", 2700)]  # bridges u1's; extends u0's, u2's
            halfway: list[bool] = []

            def fail_halfway() -> None:  # one view's chunk applied, the next not: the micro-batch fails half applied
                if not halfway:
                    halfway.append(True)
                    raise redis.exceptions.ConnectionError("Error 111 connecting to Redis (injected between chunks)")

            with injected("speed-between-chunks", fail_halfway):
                ingest_file(settings, later + _noise(rng, 20), tmp_path / "later.jsonl")
                version = wait_caught_up(settings, speed=speed)
            assert halfway, "the fault was not injected"
        check(http, settings, version, rng, bridged=[("u0", 0, 6500), ("u1", 6000, 9000), ("u2", 100, 2700)])
        _check_bounded(http, sessionize(events_at(settings, version)))


def test_sessions_on_a_redis_cluster_written_by_spark_tasks(spark: Any, make_settings: Any, cluster_url: str,
                                                          tmp_path: Any) -> None:
    """The same answers on a Redis Cluster (rows spread over buckets: a key read is one bucket, a top-N asks every
    bucket at one version), the speed layer writing from Spark's tasks (not the driver) in chunks of 3 rows."""
    settings = make_settings(pipeline=PIPELINE, redis_url=cluster_url, speed_trigger_seconds=0.2, speed_chunk_rows=3,
                             speed_driver_rows=0)
    rng = random.Random(11)
    first = [_event("u0", t) for t in (0, 600, 1200, 4500, 4900)] + [_event("u1", t) for t in (0, 300)]
    ingest_file(settings, first + _noise(rng, 40), tmp_path / "first.jsonl")
    run_batch(spark, settings, load_pipeline(PIPELINE), redis_url=settings.redis_url)
    app = create_app(settings, redis_url=settings.redis_url or "")
    with ApiServer(app) as server, web.client(base_url=server.base_url, timeout=30) as http:
        with running_speed_layer(spark, settings) as speed:
            late = [_event("u0", 2900), _event("u1", 2000), _event("u2", 100)]
            ingest_file(settings, late + _noise(rng, 30), tmp_path / "late.jsonl")
            version = wait_caught_up(settings, speed=speed)
        check(http, settings, version, rng, bridged=[("u0", 0, 4900), ("u1", 0, 2000)])


def _check_bounded(http: httpx.Client, sessions: pd.DataFrame) -> None:
    """The bounded view keeps KEEP sessions a user; answers touching the folded ones say so, never pass them off
    as exact; after them they are exact."""
    mine = sessions[sessions.user == "bounded"]
    body = http.get("/v1/views/visits_bounded/sessions/keys/bounded").json()
    assert not body["exact"] and len(body["sessions"]) == KEEP and body["folded"]["sessions"] == len(mine) - KEEP
    summary = http.get("/v1/views/visits_bounded/sessions/summary/bounded").json()
    assert (summary["sessions"], summary["folded"], summary["exact"]) == (len(mine), len(mine) - KEEP, False)
    after = {"from": str(T0 + 35_000), "to": str(T0 + 60_000)}
    later = http.get("/v1/views/visits_bounded/sessions/summary/bounded", params=after).json()
    assert later["exact"] and later["sessions"] == int(((mine.start < 60_000) & (mine.end >= 35_000)).sum())
    refused = http.get("/v1/views/visits_bounded/sessions/top")
    assert refused.status_code == 422 and "from/to" in refused.json()["detail"], refused.text
    top = http.get("/v1/views/visits_bounded/sessions/top", params=after).json()
    assert top["exact"] and [(e["key"], e["value"]) for e in top["top"]] == [("bounded", 2.0)]
    listed = {v["name"]: v for v in http.get("/v1/views").json()["views"]}
    assert (listed["visits_bounded"]["session_gap_seconds"], listed["visits_bounded"]["max_sessions"]) == (GAP, KEEP)
    assert http.get("/v1/views/visits/keys/u0").status_code == 422  # a session view's rows are not measures
    assert http.get("/v1/views/visits/sessions/keys/nobody").status_code == 404
    for path, params, named in (("top", {"by": "shortest"}, "by"), ("top", {"n": 0}, "n"),
                                ("keys/u0", {"from": str(T0 + 100), "to": str(T0)}, "to"),
                                ("keys/u0", {"last": "1h", "from": str(T0)}, "last"),
                                ("summary/u0", {"from": "yesterday-ish"}, "from")):
        refused = http.get(f"/v1/views/visits/sessions/{path}", params=params)
        assert refused.status_code == 422 and named in refused.json()["detail"], (path, params, refused.text)
    assert "not a session view" in http.get("/v1/views/pages_seen/sessions/top").json()["detail"]
