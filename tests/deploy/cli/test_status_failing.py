"""`lambda-platform status` shows a failing part as failing, with its error and restarts, and exits 1.

A real Redis, a real master dataset (a Delta table), the real API, and a generation published by
hand: the platform is serving (exit 0) until a part fails. The speed layer's failure is written by
its own writer (``SpeedHealth``), as its runner writes it; a restarting child is a real process
the real supervisor restarts, which records it beside the logs.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from deploy.cli.status import platform_status
from deploy.settings import Settings
from deploy.supervision.supervisor import Child, Supervisor, read_children
from serving.store.generation_meta import GenerationMeta
from serving.store.heartbeat import SpeedHealth
from serving.store.ingest_status import IngestStatusRecord
from serving.store.keys import Keys
from tests.support import cli, wait_for
from tests.support.master import master_with_versions

#: A child that says what is wrong the way the command line does, then exits 1.
_CRASHER = "import sys; print('starting'); print('error: RuntimeError: scheduler cannot read its schedule', flush=True); sys.exit(1)"


def _published(settings: Settings, redis_url: str) -> redis.Redis:
    """Master versions 0..3, generation 3 served, the speed layer caught up and beating."""
    master_with_versions(settings, 4)
    keys, client = Keys("wordcount"), redis.Redis.from_url(redis_url)
    client.set(keys.current, 3)
    client.hset(keys.meta(3), mapping=GenerationMeta(run_id="r1", computed_at=time.time()).to_hash())
    SpeedHealth(client, keys.speed).record_success(processed=3, batch_id=2, heartbeat_at=time.time(), state="running")
    return client


def _status(folder: Path, settings: Settings, redis_url: str) -> tuple[int, dict[str, Any]]:
    done = cli(folder, "status", "--json", LAMBDA_DATA_DIR=str(settings.data_dir), LAMBDA_REDIS_URL=redis_url,
               LAMBDA_HTTP_PORT=str(settings.http_port), LAMBDA_PIPELINE="wordcount")
    return done.returncode, json.loads(done.stdout)


def test_a_failing_speed_layer_is_shown_failing_with_its_error(
    api: Callable[..., Any], make_settings: Callable[..., Settings], redis_url: str,
) -> None:
    with api() as server:
        settings = make_settings(http_port=server.port)
        client = _published(settings, redis_url)
        assert platform_status(settings).serving
        health = SpeedHealth(client, Keys("wordcount").speed)
        for _ in range(3):
            health.record_failure(ValueError("poison event at version 3"))
        health.beat(query="q1", state="running", ui_url="")  # restarted: alive between failures
        status = platform_status(settings)
    speed = {p.name: p for p in status.parts}["speed layer"]
    assert speed.state == "failing" and not status.serving and "speed layer" in status.failing
    assert speed.detail.startswith("failing: ValueError: poison event at version 3 (failed 3 times since its last "
                                   "success)"), speed.detail
    assert speed.facts["failures"] == 3 and speed.facts["last_error"] == "ValueError: poison event at version 3"
    assert "speed layer failing" in str(status.table().title)
    client.close()


@pytest.mark.slow  # over 4 s: the full tier (the quick tier has a 3-minute budget)
def test_a_restarting_child_is_failing_and_status_exits_1(
    api: Callable[..., Any], make_settings: Callable[..., Settings], redis_url: str, tmp_path: Path,
) -> None:
    with api() as server:
        settings = make_settings(http_port=server.port)
        client = _published(settings, redis_url)
        code, report = _status(tmp_path, settings, redis_url)
        assert code == 0 and report["serving"], report

        logs = settings.data_dir.resolve() / "logs"
        crasher = Child("scheduler", [sys.executable, "-c", _CRASHER], dict(os.environ), logs / "scheduler.log")
        supervisor = Supervisor([crasher])
        supervisor.start()
        try:
            def restarted_twice() -> bool:
                supervisor.watch_once()
                return crasher.failures >= 2
            wait_for(restarted_twice, "the crashing child to be restarted", 60, poll=0.05)
            recorded = read_children(logs)
            assert recorded is not None and recorded["scheduler"].failing(), recorded
            code, report = _status(tmp_path, settings, redis_url)
        finally:
            supervisor.stop(grace=5)
        assert code == 1 and not report["serving"] and report["failing"] == ["scheduler"], report
        scheduler = next(p for p in report["parts"] if p["part"] == "scheduler")
        assert scheduler["state"] == "failing", scheduler
        assert "restarting: exit 1" in scheduler["detail"], scheduler
        assert scheduler["last_error"] == "error: RuntimeError: scheduler cannot read its schedule", scheduler
        assert scheduler["restarts"] >= 1

        # Its supervisor stopped: nothing is restarting any more, and the record is gone with it.
        assert read_children(logs) is None
        assert platform_status(settings).serving
    client.close()


def test_a_kafka_ingest_waiting_for_its_topic_is_shown_down_saying_why(
    make_settings: Callable[..., Settings], redis_url: str,
) -> None:
    settings = make_settings(kafka_bootstrap_servers="127.0.0.1:9", kafka_topics="orders")
    client = _published(settings, redis_url)
    waiting = "waiting: a topic of orders at 127.0.0.1:9 does not exist yet"
    IngestStatusRecord(client, Keys("wordcount").kafka).write(source="orders at 127.0.0.1:9", state=waiting, read=0,
                                                              appended=0, dead=0, batches=0, lags=[])
    [kafka] = [part for part in platform_status(settings).parts if part.name == "kafka ingest"]
    assert not kafka.up and kafka.detail.endswith(f"lag 0 records ({waiting})"), kafka.detail
