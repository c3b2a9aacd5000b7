"""The promise: once the speed layer has processed the master dataset through version N, every
answer equals the view computed from scratch over the master dataset at version N.

Events are ingested while the speed layer runs, a batch run is killed midway, a micro-batch is
replayed after its increments reached Redis, a speed-layer process dies half-way through a
micro-batch's writes, and Redis restarts under it. (Batch runs at random points and the master
compacted mid-stream, with readers throughout: tests/speed_layer/test_exactness_on_cluster.py, on the
bucketed store.) After each scenario every key of every
view (windowed ones included) and the top-N answers are compared over HTTP with the oracle
(tests/oracle.py: plain Python over the master dataset read with delta-rs).

These run on the default engine (delta-rs). The engines' parity is proven at their contract
(tests/batch_layer/master/test_engines.py: the same tables, the same speed-layer input with the same
``_version``); the delta-spark engine's own end-to-end exactness scenario is its real difference,
a commit split across micro-batches (tests/speed_layer/test_split_versions.py).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
from deltalake import DeltaTable

from batch_layer.faults import injected
from batch_layer.recompute.job import run_batch
from serving.store.keys import Keys
from tests import oracle
from tests.support import web
from tests.support.dying import Died, die
from tests.support.master import open_master
from tests.support.payments import ingest_some
from tests.support.servers import RedisServer
from tests.support.speed import (
    assert_exact,
    processed_version,
    running_speed_layer,
    wait_caught_up,
)

pytestmark = [pytest.mark.slow, pytest.mark.uses_jvm_subprocess]


def test_reads_between_two_write_chunks_are_exact_at_the_version_named(spark, make_settings, api) -> None:
    """A micro-batch cut in half (its Python worker, or the driver writing a small micro-batch, dies after
    its first write call) is invisible. Its replay, under settings that would now send it the other way,
    goes the way its first attempt went (its plan says so) and completes it: nothing counted twice.
    Both ways in turn on one master: cut in the tasks and replayed with driver settings, then the reverse.
    The task-side cut is a real SIGKILL of a speed-layer process's Python worker (a fault point reached in
    an executor); the driver-side cut fails the query in this process at the same point, leaving Redis as
    the kill would (the kill -9 of a whole speed-layer process: the chaos test's ``speed`` fault)."""
    driver_rows = {"tasks": 0, "driver": 10_000}
    master, rng = None, random.Random(31)
    for cut_by, replay_by in (("tasks", "driver"), ("driver", "tasks")):
        settings = make_settings(pipeline="payments", speed_trigger_seconds=0.2, speed_chunk_rows=2,
                                 speed_driver_rows=driver_rows[replay_by])
        if master is None:
            master = open_master(settings)
            ingest_some(master, rng, 60)
            run_batch(spark, settings, master.pipeline, redis_url=settings.redis_url)
            with running_speed_layer(spark, settings):
                ingest_some(master, rng, 30)
                wait_caught_up(settings)
        _cut_and_replay(spark, settings, api, master, rng, cut_by, driver_rows[cut_by])


def _cut_and_replay(spark, settings, api, master, rng: random.Random, cut_by: str, cut_driver_rows: int) -> None:
    committed = DeltaTable(str(settings.master_path)).version()
    assert processed_version(settings) == committed
    ingest_some(master, rng, 40)
    if cut_by == "tasks":
        cut = _speed_process(settings, {"LAMBDA_FAULT_POINTS": "speed-between-chunks",
                                        "LAMBDA_SPEED_CHUNK_ROWS": "2", "LAMBDA_SPEED_DRIVER_ROWS": str(cut_driver_rows)})
        assert cut.wait(300) != 0, "the speed layer survived a write partition dying midway"
    else:
        _cut_in_the_driver(spark, settings.model_copy(update={"speed_driver_rows": cut_driver_rows}))

    client = redis.Redis.from_url(settings.redis_url)
    speed = client.hgetall(Keys("payments").speed)
    guard = {field.decode(): int(b) for field, b in
             client.hgetall(Keys("payments").guard(speed[b"query"].decode())).items()}
    assert int(speed[b"processed"]) == committed
    assert max(guard.values()) > int(speed[b"batch_id"]), "no micro-batch was left half applied"
    # Its chunks (view:part:n) were written the way asked: by the driver, or by the tasks' partitions.
    parts = {field.rsplit(":", 2)[1] for field, b in guard.items() if b > int(speed[b"batch_id"])}
    assert (parts == {"driver"}) == (cut_by == "driver"), parts
    latest = DeltaTable(str(settings.master_path)).version()
    with api(pipeline="payments") as server:
        assert assert_exact(server.base_url, settings, committed, named=True) > 30
        later = oracle.views("payments", oracle.read_events(settings.master_path, latest))
        before = oracle.views("payments", oracle.read_events(settings.master_path, committed))
        for view, rows in later.items():
            for key, window_start in rows.keys() - before[view].keys():  # rows only the half-applied batch has
                params = {} if window_start is None else {"window_start": window_start}
                assert web.get(f"{server.base_url}/v1/views/{view}/keys/{quote(key, safe='')}",
                                 params=params).status_code == 404, (view, key, window_start)
    with running_speed_layer(spark, settings):  # the replay completes it: exact, nothing twice
        assert wait_caught_up(settings) == latest
        with api(pipeline="payments") as server:
            assert assert_exact(server.base_url, settings, latest, named=True) > 30


def _cut_in_the_driver(spark, settings) -> None:
    """The speed layer, in this process, fails for good between a micro-batch's first and second write calls."""
    def driver_dies() -> None:
        raise ValueError("injected: the driver died between two write calls")  # not transient: not restarted

    with injected("speed-between-chunks", driver_dies), pytest.raises(RuntimeError, match="query failed"), \
            running_speed_layer(spark, settings) as speed:
        speed.join(300)
        assert not speed.is_alive(), "the speed layer survived its driver dying midway"


def _speed_process(settings, env_extra: dict[str, str] | None = None) -> subprocess.Popen:
    env = {**os.environ, "LAMBDA_DATA_DIR": str(settings.data_dir), "LAMBDA_REDIS_URL": settings.redis_url,
           "LAMBDA_PIPELINE": settings.pipeline, "LAMBDA_SPARK_MASTER": "local[2]",
           "LAMBDA_SPEED_TRIGGER_SECONDS": "0.2", "LAMBDA_SPARK_SHUFFLE_PARTITIONS": "2",
           "LAMBDA_STORAGE_ENGINE": settings.storage_engine, **(env_extra or {})}
    return subprocess.Popen([sys.executable, "-m", "deploy.cli", "speed", "run"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_a_replayed_micro_batch_and_a_killed_batch_run_stay_exact(spark, make_settings, api) -> None:
    """The speed layer fails right after a micro-batch's increments reached Redis, before Spark committed its
    offsets (where a kill -9 leaves it): the runner restarts the query, which replays that micro-batch under
    the same id, and only the guard keeps it from counting twice. Then, while events keep coming, a batch run
    dies after its barrier and gold, before its flip. Every answer is exact at the version named.
    (A kill -9 of the speed layer's process mid-stream, of the scheduler during a run, of `up`'s whole tree:
    the bounded chaos test, tests/chaos/test_chaos.py.)"""
    settings = make_settings(pipeline="payments", speed_trigger_seconds=0.2)
    master, rng = open_master(settings), random.Random(23)
    ingest_some(master, rng, 60)
    run_batch(spark, settings, master.pipeline, redis_url=settings.redis_url)
    replayed: list[str] = []

    def fail_once() -> None:
        if not replayed:
            replayed.append("speed-after-write")
            raise redis.exceptions.ConnectionError("Error 111 connecting to Redis (injected after the write)")

    stop_ingest = threading.Event()

    def ingest() -> None:
        while not stop_ingest.is_set():
            ingest_some(master, rng, rng.randint(1, 10))
            time.sleep(0.05)

    with injected("speed-after-write", fail_once), running_speed_layer(spark, settings) as speed:
        ingest_some(master, rng, 10)
        wait_caught_up(settings, speed=speed)
        assert replayed, "the fault was not injected"
        feeder = threading.Thread(target=ingest, daemon=True)
        feeder.start()
        try:
            with injected("before-flip", die), pytest.raises(Died):
                run_batch(spark, settings, master.pipeline, redis_url=settings.redis_url)
            time.sleep(1)
        finally:
            stop_ingest.set()
            feeder.join(30)
        version = wait_caught_up(settings, speed=speed)
        with api(pipeline="payments") as server:
            assert assert_exact(server.base_url, settings, version) > 50


def test_redis_restart_under_the_speed_layer(spark, make_settings, api, tmp_path: Path) -> None:
    durable = RedisServer(tmp_path / "redis-aof")
    durable.start(appendonly=True)
    try:
        settings = make_settings(pipeline="payments", redis_url=durable.url, speed_trigger_seconds=0.2)
        master, rng = open_master(settings), random.Random(5)
        ingest_some(master, rng, 40)
        run_batch(spark, settings, master.pipeline, redis_url=settings.redis_url)
        with running_speed_layer(spark, settings):
            for step in range(10):
                ingest_some(master, rng, 5)
                if step == 4:
                    durable.stop()
                    time.sleep(1.0)
                    durable.start(appendonly=True)
                time.sleep(0.2)
            version = wait_caught_up(settings)
            with api(pipeline="payments", redis_url=durable.url) as server:
                assert assert_exact(server.base_url, settings, version) > 20
        assert processed_version(settings) == version
    finally:
        durable.stop()
