"""Readiness, metrics and the console tell the truth about a failing speed layer.

The API runs over HTTP (real uvicorn, real Redis); the master dataset is a real Delta table with a
few versions and the served generation is set by hand (its record by ``GenerationMeta``), so the lag
is known exactly. The speed layer's beats, failures and successes are written by its own writer
(``SpeedHealth``), as the speed layer's job and runner write them; nothing is mocked.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import redis

from deploy.settings import Settings
from serving.store.generation_meta import GenerationMeta
from serving.store.heartbeat import SpeedHealth, short_error
from serving.store.keys import Keys
from tests.support import web
from tests.support.master import master_with_versions
from tests.support.metrics import scrape, value


@contextmanager
def platform(make_settings: Callable[..., Settings], redis_url: str, *, versions: int, generation: int,
             pipeline: str = "wordcount") -> Iterator[SpeedHealth]:
    """A master with ``versions`` versions and ``generation`` served; yields the speed layer's writer."""
    settings = make_settings(pipeline=pipeline)
    if versions:
        master_with_versions(settings, versions)
    keys, client = Keys(pipeline), redis.Redis.from_url(redis_url)
    client.set(keys.current, generation)
    meta = GenerationMeta(run_id="r1", computed_at=time.time(), events=versions)
    client.hset(keys.meta(generation), mapping=meta.to_hash())
    try:
        yield SpeedHealth(client, keys.speed)
    finally:
        client.close()


def beat(health: SpeedHealth, *, processed: int | None = None, batch_id: int | None = None) -> None:
    """A heartbeat of the speed layer now, as its job writes it: with ``batch_id``, micro-batch ``batch_id``
    committed through version ``processed`` (a success); else a beat, having started from the served
    generation ``processed`` if given."""
    if batch_id is not None:
        assert processed is not None
        health.record_success(processed=processed, batch_id=batch_id, heartbeat_at=time.time(), query="q1",
                              state="running")
        return
    if processed is not None:
        health.rebuilt_from(processed)
    health.beat(query="q1", state="running", ui_url="")


def ready(client: httpx.Client, **params: str) -> tuple[int, str]:
    response = client.get("/readyz", params=params)
    body = response.json()
    return response.status_code, body["detail"]


def test_a_failing_speed_layer_is_not_ready_with_its_error_and_count(
    api: Callable[..., Any], make_settings: Callable[..., Settings], redis_url: str,
) -> None:
    with platform(make_settings, redis_url, versions=4, generation=3) as health, \
            api() as server, web.client(base_url=server.base_url, timeout=10) as http:
        beat(health, processed=3, batch_id=5)
        status, detail = ready(http)
        assert status == 200 and "speed layer up" in detail, detail

        health.record_failure(ValueError("poison event at version 3"))
        status, detail = ready(http)
        assert status == 503, detail
        assert "speed layer failing: ValueError: poison event at version 3 (failed once since its last success)" \
            in detail, detail
        beat(health)  # restarted: its heartbeat is fresh again, it is still failing
        health.record_failure(ValueError("poison event at version 3"))
        health.record_failure(ValueError("poison event at version 3"))
        status, detail = ready(http)
        assert status == 503 and "failed 3 times since its last success" in detail, detail

        # A load balancer's probe asks only whether answers can be served: they can (exact, older).
        status, detail = ready(http, serving_only="true")
        assert status == 200 and "serving generation 3" in detail, detail

        health.record_success(processed=3, batch_id=6)  # a micro-batch committed
        status, detail = ready(http)
        assert status == 200 and "speed layer up" in detail, detail


def test_readiness_waits_for_the_first_micro_batch_while_answers_lag(
    api: Callable[..., Any], make_settings: Callable[..., Settings], redis_url: str,
) -> None:
    with platform(make_settings, redis_url, versions=6, generation=3) as health, \
            api() as server, web.client(base_url=server.base_url, timeout=10) as http:
        status, detail = ready(http)  # versions 4 and 5 are in no answer, and no speed layer ran
        assert status == 503, detail
        assert "speed layer has not applied a micro-batch yet (speed layer never ran)" in detail, detail
        assert "lag the master by 2 versions" in detail, detail

        beat(health, processed=3)  # started from the generation, nothing applied yet
        status, detail = ready(http)
        assert status == 503 and "has not applied a micro-batch yet (speed layer up" in detail, detail

        beat(health, processed=5, batch_id=0)
        status, detail = ready(http)
        assert status == 200 and "lag 0 versions" in detail, detail


def test_nothing_to_apply_is_ready_without_a_speed_layer(
    api: Callable[..., Any], make_settings: Callable[..., Settings], redis_url: str,
) -> None:
    """Answers cover the master's newest version: the speed layer has nothing to do, ready (as before)."""
    with platform(make_settings, redis_url, versions=4, generation=3), \
            api() as server, web.client(base_url=server.base_url, timeout=10) as http:
        status, detail = ready(http)
        assert status == 200 and "speed layer never ran" in detail, detail


def test_nothing_published_is_not_ready_and_says_how_to_publish(
    api: Callable[..., Any], make_settings: Callable[..., Settings],
) -> None:
    """A fresh platform (an empty master, nothing published): 503 naming the fix, while `up` keeps serving."""
    make_settings()
    with api() as server, web.client(base_url=server.base_url, timeout=10) as http:
        status, detail = ready(http)
        assert status == 503 and "no batch generation is published yet" in detail, detail
        assert "lambda-platform batch run" in detail, detail
        assert http.get("/healthz").status_code == 200


def test_readiness_covers_every_pipeline(api: Callable[..., Any], make_settings: Callable[..., Settings],
                                         redis_url: str) -> None:
    """One process runs every pipeline's speed layer: the failing one is named even when it is not the default."""
    with platform(make_settings, redis_url, versions=4, generation=3), \
            platform(make_settings, redis_url, versions=0, generation=7, pipeline="payments") as health, \
            api(pipelines=["wordcount", "payments"]) as server, web.client(base_url=server.base_url, timeout=10) as http:
        beat(health, processed=7, batch_id=1)
        assert ready(http)[0] == 200
        health.record_failure(RuntimeError("the speed layer's query failed: boom"))
        status, detail = ready(http)
        assert status == 503 and detail.startswith("pipeline payments: speed layer failing: "), detail
        assert "boom" in detail and "wordcount" not in detail, detail


def test_errors_are_one_line_without_credentials() -> None:
    spark_text = ("[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: An exception was raised by "
                  "the Python Proxy.\nTraceback (most recent call last):\n  File \"job.py\", line 3, in _process\n"
                  "ValueError: poison event in version 7\n\tat org.apache.spark.Foo.bar(Foo.scala:1)\n")
    assert short_error(RuntimeError(spark_text)) == "ValueError: poison event in version 7"
    secret = short_error(ConnectionError("Error 111 connecting to redis://admin:hunter2@10.0.0.1:6379; password=s3cret"))
    assert "hunter2" not in secret and "s3cret" not in secret and "redis://***@10.0.0.1:6379" in secret, secret
    assert len(short_error("x" * 5000)) <= 300


def test_metrics_show_the_failing_part(api: Callable[..., Any], make_settings: Callable[..., Settings],
                                       redis_url: str) -> None:
    p = {"pipeline": "wordcount", "part": "speed"}
    with platform(make_settings, redis_url, versions=4, generation=3) as health, \
            api() as server, web.client(base_url=server.base_url, timeout=10) as http:
        beat(health, processed=3, batch_id=5)
        found = scrape(http)
        assert value(found, "lambda_part_failing", **p) == 0 and value(found, "lambda_part_failures", **p) == 0

        before = time.time()
        for _ in range(2):
            health.record_failure(ValueError('poison "event"'))
        found = scrape(http)
        assert value(found, "lambda_part_failing", **p) == 1
        assert value(found, "lambda_part_failures", **p) == 2
        assert value(found, "lambda_part_last_failure_timestamp_seconds", **p) >= before
        assert value(found, "lambda_part_last_error_info", **p, error='ValueError: poison "event"') == 1

        health.record_success(processed=3, batch_id=6)
        found = scrape(http)
        assert value(found, "lambda_part_failing", **p) == 0
        assert not [k for k in found if k[0] == "lambda_part_last_error_info"]


@pytest.mark.slow
def test_console_shows_the_failing_speed_layer(browser: Any, api: Callable[..., Any],
                                               make_settings: Callable[..., Settings], redis_url: str) -> None:
    from tests.support.browser import load

    with platform(make_settings, redis_url, versions=4, generation=3) as health, api() as server:
        beat(health, processed=3, batch_id=5)
        for _ in range(3):
            health.record_failure(ValueError("poison event at version 3"))
        load(browser, f"{server.base_url}/console", "overview")
        card = "section[data-pipeline='wordcount']"
        state = browser.find_element("css selector", f"{card} [data-field='speed_state']")
        assert state.get_attribute("data-value") == "failing", state.text
        assert browser.find_element("css selector", f"{card} [data-field='speed_error']").text == \
            "ValueError: poison event at version 3"
        assert browser.find_element("css selector", f"{card} [data-field='speed_failures']").get_attribute(
            "data-value") == "3"
