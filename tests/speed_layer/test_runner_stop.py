"""Stopping the speed layer waits for the micro-batch in flight, not for the query to catch up; a
transient failure of its query restarts the query, not the process."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import redis
from pyspark.sql import DataFrame, SparkSession

from batch_layer.master.dataset import MasterDataset
from batch_layer.master.engines import get_engine
from batch_layer.recompute.job import run_batch
from shared_logic import load_pipeline
from speed_layer.runner import _stop_after_trigger
from tests.support.speed import running_speed_layer, wait_caught_up


@pytest.mark.slow  # over 2.5 s in a full run: the full tier (the quick tier has a 3-minute budget)
def test_a_query_behind_stops_after_the_micro_batch_in_flight(spark: SparkSession, tmp_path: Path) -> None:
    started: list[int] = []

    def slow(batch: DataFrame, batch_id: int) -> None:  # a query behind: batches back to back, trigger always active
        started.append(batch_id)
        time.sleep(0.4)

    query = (
        spark.readStream.format("rate").option("rowsPerSecond", 50).load()
        .writeStream.foreachBatch(slow).trigger(processingTime="0 seconds")
        .option("checkpointLocation", str(tmp_path / "checkpoint")).start()
    )
    try:
        deadline = time.monotonic() + 120
        while len(started) < 3 and time.monotonic() < deadline:
            threading.Event().wait(0.05)
        assert len(started) >= 3, "the query did not get going"
        at_stop = len(started)
        _stop_after_trigger(query, wait_seconds=20)
        assert not query.isActive
        # The batch in flight finishes; at most one more may begin before stop() lands (it is interrupted).
        assert len(started) - at_stop <= 2, f"{len(started) - at_stop} micro-batches ran after the stop was asked for"
    finally:
        if query.isActive:
            query.stop()


@pytest.mark.slow  # over 10 s: the end-to-end tier
def test_a_transient_query_failure_restarts_the_query_in_process(
    spark: SparkSession, make_settings, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis gone for longer than the client's retries: the query fails, and the runner restarts it (not the process)."""
    from speed_layer.job import SpeedLayer

    settings = make_settings(speed_trigger_seconds=0.2)
    pipeline = load_pipeline(settings.pipeline)
    master = MasterDataset(settings.master_path, pipeline, get_engine("delta-rs"))
    master.append(pipeline.schema.validate([{"text": "one two two"}]))
    run_batch(spark, settings, pipeline, redis_url=settings.redis_url)
    master.append(pipeline.schema.validate([{"text": "three three three"}]))
    process, failures = SpeedLayer._process, []

    def fails_once(self: SpeedLayer, batch: DataFrame, batch_id: int) -> None:  # the injected fault
        if not failures:
            failures.append(batch_id)
            raise redis.exceptions.ConnectionError("Error 111 connecting to Redis (injected)")
        process(self, batch, batch_id)

    monkeypatch.setattr(SpeedLayer, "_process", fails_once)
    with running_speed_layer(spark, settings) as thread:
        latest = wait_caught_up(settings)
        assert thread.is_alive(), "the runner gave up on a transient failure"
    assert failures, "the fault was not injected"
    assert latest == master.latest_version()
