"""Versions never go backwards, also when Redis loses all its data; and the speed layer does not
read the master into nothing while no generation is served.

A batch run whose barrier the speed layer has already passed (answers name versions above it)
loses Redis (FLUSHALL, injected between its barrier and its flip): its flip must be refused,
since serving it would answer at an older version. Meanwhile a reader checks every answer
against the oracle at the version it names, and that versions only grow.
"""

from __future__ import annotations

import random
from datetime import datetime, timezone

import pytest
import redis
from deltalake import DeltaTable

from batch_layer.errors import PublishError
from batch_layer.faults import injected
from batch_layer.master.dataset import MasterDataset
from batch_layer.master.engines import get_engine
from batch_layer.recompute.job import run_batch
from serving.store.keys import Keys
from shared_logic import load_pipeline
from tests import oracle
from tests.support import wait_for, web
from tests.support.speed import VersionedReader, assert_exact, running_speed_layer, wait_caught_up

pytestmark = pytest.mark.slow

START = datetime(2026, 3, 1, 8, 0, tzinfo=timezone.utc)
KEYS = Keys("payments")
READ_ITEMS = [("spend_by_user", user, None) for user in oracle.PAYMENT_USERS]


def _ingest(master: MasterDataset, rng: random.Random, n: int) -> None:
    master.append(master.pipeline.schema.validate(oracle.payments_events(rng, n, START, seconds=3600)))


def _state(client: redis.Redis) -> str:
    return (client.hget(KEYS.speed, "state") or b"").decode()


def _started_after(client: redis.Redis) -> int:
    """The version the speed layer's fresh query started after (it reads only versions above it)."""
    return int(client.hget(KEYS.speed, "started_after"))


def test_after_redis_loses_its_data_versions_never_go_back(spark, make_settings, api) -> None:
    settings = make_settings(pipeline="payments", speed_trigger_seconds=0.2)
    master = MasterDataset(settings.master_path, load_pipeline("payments"), get_engine("delta-rs"))
    rng, client = random.Random(7), redis.Redis.from_url(settings.redis_url)
    _ingest(master, rng, 40)
    with running_speed_layer(spark, settings), api(pipeline="payments") as server:
        # Nothing served yet: the speed layer waits, says why, and reads nothing.
        wait_for(lambda: _state(client).startswith("waiting for a batch generation"), "the speed layer to wait")
        assert spark.streams.active == [] and client.hget(KEYS.speed, "processed") is None
        first = run_batch(spark, settings, master.pipeline, redis_url=settings.redis_url)
        _ingest(master, rng, 20)
        wait_caught_up(settings)
        assert _started_after(client) == first.generation, "the speed layer did not start after the generation"

        with VersionedReader(server.base_url, settings, READ_ITEMS) as reader:

            def lose_redis_after_the_barrier_was_served_past() -> None:
                barrier = DeltaTable(str(settings.master_path)).version()
                _ingest(master, rng, 10)
                wait_caught_up(settings)
                wait_for(lambda: any(body["version"] > barrier for *_, body in reader.answers),
                          "an answer above the barrier")
                client.flushall()

            with injected("after-barrier", lose_redis_after_the_barrier_was_served_past), \
                    pytest.raises(PublishError, match="lost its data"):
                run_batch(spark, settings, master.pipeline, redis_url=settings.redis_url)
            assert client.get(KEYS.current) is None
            wait_for(lambda: _state(client).startswith("waiting for a batch generation"),
                      "the speed layer to wait after the loss")
            assert spark.streams.active == []
            answer = web.get(f"{server.base_url}/v1/views/spend_by_user/keys/alice")
            assert answer.status_code == 503 and "no batch generation" in answer.text, answer.text

            second = run_batch(spark, settings, master.pipeline, redis_url=settings.redis_url)
            assert second.flipped and second.generation > first.generation
            _ingest(master, rng, 15)
            version = wait_caught_up(settings)
            assert _started_after(client) == second.generation, "the speed layer did not start after the generation"
            wait_for(lambda: any(body["version"] == version for *_, body in reader.answers), "an answer at the end")
        assert assert_exact(server.base_url, settings, version) > 10
    assert reader.check() > 10
