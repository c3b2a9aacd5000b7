"""Stopping the speed layer waits for the micro-batch in flight, not for the query to catch up."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from speed_layer.runner import _stop_after_trigger


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
