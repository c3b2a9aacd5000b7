"""GET /metrics: request metrics by route template, and what other processes left in Redis.

Requests go over HTTP to a real uvicorn server running ``create_app`` (which installs the
metrics); the speed layer's heartbeat hash, the served generation and the batch-run registry are
written into the real Redis by their own writers (``SpeedHealth``, ``GenerationMeta``, ``RunRegistry``;
the served generation's pointer by hand), and the master dataset is a real Delta table with a few
versions, so the lag the gauges report is known exactly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from fastapi import FastAPI
from prometheus_client import generate_latest

from deploy.settings import Settings
from serving.api.app import create_app
from serving.api.metrics import EVENTS_INGESTED
from serving.api.request_metrics import route_template
from serving.store.generation_meta import GenerationMeta
from serving.store.heartbeat import SpeedHealth
from serving.store.ingest_status import IngestStatusRecord, PartitionLagRecord
from serving.store.keys import Keys
from serving.store.runs import RunRegistry
from tests.support import free_port, web
from tests.support.master import master_with_versions
from tests.support.metrics import by_name, samples, scrape, value
from tests.support.servers import ApiServer

KEY_ROUTE = "/v1/views/{view}/keys/{key}"


# --------------------------------------------------------------------------- requests


def test_requests_are_counted_by_route_template_method_and_status(api: Callable[..., Any]) -> None:
    with api() as server, web.client(base_url=server.base_url, timeout=10) as client:
        statuses = [client.get(f"/v1/views/word_counts/keys/{word}").status_code for word in ("a", "b", "c/d")]
        assert len(set(statuses)) == 1
        for _ in range(2):
            assert client.get("/healthz").status_code == 200
        assert client.get("/no/such/path").status_code == 404
        assert client.post("/healthz").status_code == 405
        found = scrape(client)

    key = {"method": "GET", "route": KEY_ROUTE, "status": str(statuses[0])}
    assert value(found, "lambda_http_requests_total", **key) == 3
    assert value(found, "lambda_http_request_duration_seconds_count", **key) == 3
    assert value(found, "lambda_http_request_duration_seconds_sum", **key) > 0
    assert value(found, "lambda_http_request_duration_seconds_bucket", **key, le="+Inf") == 3
    assert value(found, "lambda_http_requests_total", method="GET", route="/healthz", status="200") == 2
    assert value(found, "lambda_http_requests_total", method="GET", route="unmatched", status="404") == 1
    assert value(found, "lambda_http_requests_total", method="POST", route="/healthz", status="405") == 1
    routes = {dict(labels)["route"] for labels in by_name(found, "lambda_http_requests_total")}
    assert not any("word_counts" in r or "/no/such" in r for r in routes), routes  # templates, never raw paths


def test_route_template_drops_converters() -> None:
    assert route_template("/v1/views/{view}/keys/{key:path}") == KEY_ROUTE
    assert route_template("/a/{n:int}/b") == "/a/{n}/b"


def test_each_app_has_its_own_registry_and_shares_events_ingested(make_settings: Callable[..., Settings],
                                                                  redis_url: str) -> None:
    settings = make_settings()
    apps: list[FastAPI] = [create_app(settings, redis_url=redis_url) for _ in range(2)]
    assert apps[0].state.metrics_registry is not apps[1].state.metrics_registry

    def ingested(app: FastAPI) -> float:
        return value(samples(generate_latest(app.state.metrics_registry).decode()), "lambda_events_ingested_total")

    before = [ingested(app) for app in apps]
    EVENTS_INGESTED.inc(3)
    assert [ingested(app) - b for app, b in zip(apps, before)] == [3, 3]


# --------------------------------------------------------------------------- speed layer


def test_speed_lag_gauge_reflects_the_speed_hash(api: Callable[..., Any], make_settings: Callable[..., Settings],
                                                 redis_url: str) -> None:
    settings = make_settings()
    master_with_versions(settings, 4)  # versions 0..3
    keys = Keys("wordcount")
    r = redis.Redis.from_url(redis_url)
    health = SpeedHealth(r, keys.speed)
    heartbeat = time.time() - 5  # a micro-batch committed 5 s ago, written as the speed layer writes it
    health.record_success(processed=1, batch_id=7, heartbeat_at=heartbeat, query="q", last_batch_seconds=0.25,
                          last_write_seconds=0.125)
    p = {"pipeline": "wordcount"}
    with api() as server, web.client(base_url=server.base_url, timeout=10) as client:
        found = scrape(client)
        assert value(found, "lambda_metrics_redis_up", **p) == 1
        assert value(found, "lambda_master_latest_version", **p) == 3
        assert value(found, "lambda_speed_processed_version", **p) == 1
        assert value(found, "lambda_speed_lag_versions", **p) == 2
        assert value(found, "lambda_speed_lag_seconds", **p) >= 0
        assert value(found, "lambda_speed_batch_id", **p) == 7
        assert value(found, "lambda_speed_last_batch_seconds", **p) == 0.25
        assert value(found, "lambda_speed_last_write_seconds", **p) == 0.125
        assert value(found, "lambda_speed_heartbeat_timestamp_seconds", **p) == pytest.approx(heartbeat)
        assert 4 <= value(found, "lambda_speed_heartbeat_age_seconds", **p) < 60
        assert value(found, "lambda_batch_served_generation", **p) is None  # nothing published

        health.record_success(processed=3)  # caught up
        found = scrape(client)
        assert value(found, "lambda_speed_lag_versions", **p) == 0
        assert value(found, "lambda_speed_lag_seconds", **p) == 0

        r.delete(keys.speed)  # speed layer never ran: no speed samples, lag from what is served (nothing)
        found = scrape(client)
        assert value(found, "lambda_speed_processed_version", **p) is None
        assert value(found, "lambda_speed_lag_versions", **p) is None
        assert value(found, "lambda_master_latest_version", **p) == 3
    r.close()


def test_kafka_ingest_counts_lag_and_liveness_come_from_its_status_hash(api: Callable[..., Any],
                                                                        make_settings: Callable[..., Settings],
                                                                        redis_url: str) -> None:
    make_settings()
    r = redis.Redis.from_url(redis_url)
    status = IngestStatusRecord(r, Keys("wordcount").kafka)
    p = {"pipeline": "wordcount"}
    with api() as server, web.client(base_url=server.base_url, timeout=10) as client:
        assert value(scrape(client), "lambda_kafka_ingest_up", **p) is None  # no ingest ever ran: no samples
        status.write(source="topics t on k:9092", state="running", read=12, appended=9, dead=3, batches=2,
                     lags=[PartitionLagRecord("t", 0, 5), PartitionLagRecord("t", 1, 0)])
        found = scrape(client)
        assert value(found, "lambda_kafka_ingest_up", **p) == 1
        assert [value(found, "lambda_kafka_ingest_records_total", outcome=o, **p)
                for o in ("read", "appended", "dead_lettered")] == [12, 9, 3]
        assert value(found, "lambda_kafka_ingest_lag_records", topic="t", partition="0", **p) == 5
        assert value(found, "lambda_kafka_ingest_lag_records", topic="t", partition="1", **p) == 0
        status.failed("KafkaException: broker gone")
        assert value(scrape(client), "lambda_kafka_ingest_up", **p) == 0
    r.close()


# --------------------------------------------------------------------------- batch layer


def test_batch_generation_and_run_registry(api: Callable[..., Any], make_settings: Callable[..., Settings],
                                           redis_url: str) -> None:
    settings = make_settings()
    master_with_versions(settings, 6)  # versions 0..5; generation 4 served
    keys = Keys("wordcount")
    r = redis.Redis.from_url(redis_url)
    now = time.time()
    r.set(keys.current, 4)
    r.hset(keys.meta(4), mapping=GenerationMeta(run_id="r2", computed_at=now - 30, events=10).to_hash())

    # Runs driven through the real registry: one succeeds, one fails, one is left 'running' by a
    # scheduler whose lease expires (it reads as failed), one waits in the queue.
    registry = RunRegistry.from_url(redis_url, "wordcount")
    started = time.time()
    for outcome in ("succeeded", "failed"):
        registry.enqueue()
        run, _ = registry.claim("owner", lease_seconds=30, queued=True)
        registry.finish(run.id, outcome)
    elapsed = time.time() - started
    registry.enqueue()
    registry.claim("dead-owner", lease_seconds=0.1, queued=True)
    time.sleep(0.3)
    registry.enqueue()
    registry.close()

    p = {"pipeline": "wordcount"}
    with api() as server, web.client(base_url=server.base_url, timeout=10) as client:
        found = scrape(client)
        assert value(found, "lambda_batch_served_generation", **p) == 4
        assert value(found, "lambda_batch_served_computed_at_timestamp_seconds", **p) == pytest.approx(now - 30)
        assert 29 <= value(found, "lambda_batch_served_age_seconds", **p) < 90
        assert value(found, "lambda_speed_lag_versions", **p) == 1  # 5 - generation 4, no speed layer
        assert {dict(labels)["outcome"]: v for labels, v in by_name(found, "lambda_batch_runs").items()} == {
            "succeeded": 1, "failed": 2, "queued": 1}
        assert 0 <= value(found, "lambda_batch_last_run_duration_seconds", **p, outcome="succeeded") <= elapsed
        assert started <= value(found, "lambda_batch_last_run_timestamp_seconds", **p, outcome="queued") <= time.time()
    r.close()


# --------------------------------------------------------------------------- Redis down


def test_scrape_answers_when_redis_is_unreachable(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings()
    app = create_app(settings, redis_url=f"redis://127.0.0.1:{free_port()}/0")
    with ApiServer(app) as server, web.client(base_url=server.base_url, timeout=30) as client:
        assert client.get("/healthz").status_code == 200
        started = time.monotonic()
        found = scrape(client)
        assert time.monotonic() - started < 10
    assert value(found, "lambda_metrics_redis_up", pipeline="wordcount") == 0
    assert value(found, "lambda_http_requests_total", method="GET", route="/healthz", status="200") == 1


def test_openmetrics_on_request(api: Callable[..., Any]) -> None:
    with api() as server:
        response = web.get(f"{server.base_url}/metrics", headers={"Accept": "application/openmetrics-text"},
                             timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.rstrip().endswith("# EOF")
