"""A speed layer that fails says so in its heartbeat hash before it exits (its error in one line and the
count since its last success), and its next successful micro-batch clears it."""

from __future__ import annotations

import pytest
from pyspark.sql import DataFrame, SparkSession

from batch_layer.master.dataset import MasterDataset
from batch_layer.master.engines import get_engine
from batch_layer.recompute.job import run_batch
from serving.store.connection import redis_client
from serving.store.heartbeat import SpeedHeartbeat
from serving.store.keys import Keys
from shared_logic import load_pipeline
from speed_layer.job import SpeedLayer
from speed_layer.runner import run_speed_layer
from tests.support.speed import running_speed_layer, wait_caught_up


@pytest.mark.slow  # over 10 s: the end-to-end tier
def test_a_failing_speed_layer_records_its_error_and_a_micro_batch_clears_it(
    spark: SparkSession, make_settings, monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = make_settings(speed_trigger_seconds=0.2)
    pipeline = load_pipeline(settings.pipeline)
    master = MasterDataset(settings.master_path, pipeline, get_engine("delta-rs"))
    master.append(pipeline.schema.validate([{"text": "one two two"}]))
    run_batch(spark, settings, pipeline, redis_url=settings.redis_url)
    master.append(pipeline.schema.validate([{"text": "poison"}]))
    client = redis_client(settings.redis_url)

    def heartbeat() -> SpeedHeartbeat:
        return SpeedHeartbeat.from_hash(client.hgetall(Keys(pipeline.name).speed))

    def poisoned(self: SpeedLayer, batch: DataFrame, batch_id: int) -> None:  # the injected fault: a poison event
        raise ValueError(f"poison event in micro-batch {batch_id}")

    with monkeypatch.context() as patch:
        patch.setattr(SpeedLayer, "_process", poisoned)
        counted = 0
        for _ in (1, 2):  # the process fails, its supervisor starts it again, it fails again
            with pytest.raises(RuntimeError, match="poison event"):
                run_speed_layer(spark, settings, pipeline, redis_url=settings.redis_url)
            failed = heartbeat()
            # each failure counts; on a loaded machine a Python worker slow to connect back is one more (transient,
            # the query restarted in process), so the count grows by at least one per attempt
            assert failed.failing and failed.failures > counted, failed
            counted = failed.failures
            assert failed.last_error is not None and failed.last_error.startswith("ValueError: poison event"), failed
            assert "\n" not in failed.last_error and failed.state == "failed"

    with running_speed_layer(spark, settings):  # the fault gone: the replayed micro-batch succeeds
        assert wait_caught_up(settings) == master.latest_version()
    healed = heartbeat()
    assert not healed.failing and healed.applied, healed
    assert healed.last_error is not None and healed.last_error.startswith("ValueError: poison event")  # the record stays
    client.close()
