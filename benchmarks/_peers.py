"""The peers a user would otherwise build, for benchmarks only: the payments views written to Redis the
plain way, to set the platform's speed and batch figures beside (issue 30 item 5).

Both aggregate with plain Spark SQL, the same measures as the platform's payments views (count, sum,
min and max of ``amount``, distinct ``merchant``; per user, and per user and 1-hour window), and
write from Spark's Python workers with ``DataFrame.foreachPartition``: one redis-py pipeline per
partition (no transaction), sent every ``CHUNK`` rows. That is the pattern the Spark docs' and most
users' ``foreachBatch``/batch writers use for more than a few thousand rows; the alternative, collecting
to the driver, would leave one of the two cores idle. The client is ``serving.store.connection
.redis_client`` (the platform's options, hiredis packing), into the same Redis as the platform (the
embedded one: AOF with ``appendfsync always``), under keys of their own (``peer:...``).

* Speed peer (``stream_peer``): a Structured Streaming query over the same input the speed layer
  reads (``speed_layer.input.master_changes``: the master's commits after the served generation,
  the same per-micro-batch caps), ``foreachBatch`` as in the Spark docs (the micro-batch persisted,
  one SQL aggregation per view, unpersisted), increments per view row: HINCRBY count, HINCRBYFLOAT sum,
  ZADD LT / ZADD GT for min / max (one sorted set per view and measure, member = the row's key),
  PFADD of the merchants (one HyperLogLog per row). At-least-once: a replayed micro-batch adds
  twice; no merge with a batch generation, no undo, nothing hidden until a commit, readers see
  a micro-batch half-written.
* Batch peer (``batch_peer``): the hand-written SQL of ``_batch_variants.HAND_SQL`` over the
  snapshot's files, each row written with one HSET of its measures (distinct merchants as an exact
  JSON list) to ``peer:batch:{view}:{key}``: no generations, no flip, rows overwritten in place
  (readers see old and new rows mixed while it runs; rows gone from the data are never deleted).
"""

from __future__ import annotations

import functools
import json
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHUNK = 1000  # rows per pipeline round trip
PREFIX = "peer"


def _ship_by_value() -> None:
    """Spark's Python workers cannot import this module (benchmarks/ is not on their path): pickle its
    functions by value, as a user's own job file shipped with the closure would be."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])

_MEASURES = """
    count(*)              AS count,
    sum(amount)           AS sum_amount,
    min(amount)           AS min_amount,
    max(amount)           AS max_amount,
    collect_set(merchant) AS merchants"""

# One row key per view row: the user, and for the hourly view the window's start (epoch seconds).
STREAM_SQL = {
    "spend_by_user": f"""
        SELECT user_id AS key, {_MEASURES}
        FROM peer_batch
        WHERE _kind = 'event' AND user_id IS NOT NULL
        GROUP BY user_id""",
    "spend_by_user_hourly": f"""
        SELECT concat(user_id, '|', CAST(unix_seconds(date_trunc('HOUR', event_time)) AS STRING)) AS key, {_MEASURES}
        FROM peer_batch
        WHERE _kind = 'event' AND user_id IS NOT NULL AND event_time IS NOT NULL
        GROUP BY user_id, date_trunc('HOUR', event_time)""",
}


# --------------------------------------------------------------------------- the writes (Python workers)


def _chunked(rows: Iterable[Any], send: Any, pipe: Any) -> int:
    n = 0
    for row in rows:
        send(pipe, row)
        n += 1
        if n % CHUNK == 0:
            pipe.execute()
    pipe.execute()
    return n


def _increments(url: str, view: str, rows: Iterator[Any]) -> None:
    """One partition of a micro-batch's view rows as increments (HINCRBY, HINCRBYFLOAT, ZADD LT/GT, PFADD)."""
    from serving.store.connection import redis_client

    lows, highs = f"{PREFIX}:{view}:min", f"{PREFIX}:{view}:max"

    def send(pipe: Any, row: Any) -> None:
        key = row["key"]  # by name: a Row is a tuple, and row.count would be tuple.count
        pipe.hincrby(f"{PREFIX}:{view}:row:{key}", "count", row["count"])
        pipe.hincrbyfloat(f"{PREFIX}:{view}:row:{key}", "sum", row["sum_amount"])
        pipe.zadd(lows, {key: row["min_amount"]}, lt=True)
        pipe.zadd(highs, {key: row["max_amount"]}, gt=True)
        pipe.pfadd(f"{PREFIX}:{view}:merchant:{key}", *row["merchants"])

    client = redis_client(url)
    try:
        _chunked(rows, send, client.pipeline(transaction=False))
    finally:
        client.close()


def _overwrite(url: str, view: str, rows: Iterator[Any]) -> None:
    """One partition of a view's gold rows, one HSET each (exact distinct merchants as a JSON list)."""
    from serving.store.connection import redis_client

    def send(pipe: Any, row: Any) -> None:
        pipe.hset(f"{PREFIX}:batch:{view}:{row['key']}", mapping={
            "count": row["count"], "sum": row["sum_amount"], "min": row["min_amount"], "max": row["max_amount"],
            "merchants": json.dumps(sorted(row["merchants"]))})

    client = redis_client(url)
    try:
        _chunked(rows, send, client.pipeline(transaction=False))
    finally:
        client.close()


# --------------------------------------------------------------------------- speed peer


@dataclass
class PeerRun:
    """A streaming peer's catch-up: ``seconds`` from the query's start to the end of its last micro-batch's
    writes, ``first_seconds`` to the end of its first, which held ``first_rows`` of the ``rows``."""

    seconds: float
    first_seconds: float
    first_rows: int
    rows: int
    batches: list[tuple[int, int, float]] = field(default_factory=list)  # (id, input rows, seconds in foreachBatch)

    @property
    def sustained(self) -> float | None:
        later = self.rows - self.first_rows
        return later / (self.seconds - self.first_seconds) if later and self.seconds > self.first_seconds else None


def stream_peer(spark: Any, master: Any, settings: Any, redis_url: str, *, starting: int, events: int,
                checkpoint: Path, timeout: float = 1800.0) -> PeerRun:
    """Run the foreachBatch peer from scratch over the master's versions after ``starting`` until it has
    processed ``events`` input rows (Spark's own count, from its progress reports); stop it and return
    its timing. The Redis keys it wrote are left for ``check_stream_peer`` and ``drop_peer_keys``."""
    from pyspark.sql.streaming import StreamingQueryListener

    from speed_layer.input import master_changes

    _ship_by_value()
    ends: dict[int, tuple[float, float]] = {}  # batch id -> (seconds since start at its end, its own seconds)
    rows: dict[int, int] = {}
    done = threading.Event()
    query_name = f"peer_{time.monotonic_ns()}"

    def process(batch: Any, batch_id: int) -> None:  # the user's foreachBatch
        began = time.perf_counter()
        batch.persist()
        batch.createOrReplaceTempView("peer_batch")
        for view, sql in STREAM_SQL.items():
            batch.sparkSession.sql(sql).foreachPartition(functools.partial(_increments, redis_url, view))
        batch.unpersist()
        ends[batch_id] = (time.perf_counter() - started, time.perf_counter() - began)

    class _Listener(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None: ...
        def onQueryIdle(self, event: Any) -> None: ...
        def onQueryTerminated(self, event: Any) -> None: ...

        def onQueryProgress(self, event: Any) -> None:
            progress = event.progress
            if progress.name == query_name and progress.numInputRows:
                rows[progress.batchId] = progress.numInputRows
                if sum(rows.values()) >= events:
                    done.set()

    listener = _Listener()
    spark.streams.addListener(listener)
    started = time.perf_counter()
    query = (master_changes(spark, master, settings, starting=starting)
             .writeStream.foreachBatch(process)
             .option("checkpointLocation", str(checkpoint))
             .trigger(processingTime="0 seconds")
             .queryName(query_name)
             .start())
    try:
        deadline = time.monotonic() + timeout
        while not done.wait(0.1):
            if not query.isActive:
                raise SystemExit(f"the foreachBatch peer stopped: {query.exception()}")
            if time.monotonic() > deadline:
                raise SystemExit(f"the foreachBatch peer did not catch up within {timeout:g} s")
    finally:
        query.stop()
        spark.streams.removeListener(listener)
    first = min(rows)
    last = max(rows)
    batches = [(b, rows.get(b, 0), ends[b][1]) for b in sorted(ends)]
    return PeerRun(ends[last][0], ends[first][0], rows[first], sum(rows.values()), batches)


def check_stream_peer(redis_url: str, events: int) -> str:
    """The peer's per-user counts summed (spend_by_user): ``events`` when every event was counted once."""
    from serving.store.connection import redis_client

    client = redis_client(redis_url)
    try:
        keys = list(client.scan_iter(match=f"{PREFIX}:spend_by_user:row:*", count=10_000))
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.hget(key, "count")
        total = sum(int(c) for c in pipe.execute() if c is not None)
    finally:
        client.close()
    return (f"OK ({total:,} events over {len(keys):,} users)" if total == events
            else f"MISMATCH: counts sum to {total:,}, {events:,} events streamed")


def drop_peer_keys(redis_url: str, pattern: str = f"{PREFIX}:*") -> int:
    """UNLINK every key ``pattern`` matches (untimed bookkeeping between runs); returns how many."""
    from serving.store.connection import redis_client

    client = redis_client(redis_url)
    dropped = 0
    try:
        batch: list[bytes] = []
        for key in client.scan_iter(match=pattern, count=10_000):
            batch.append(key)
            if len(batch) >= 10_000:
                dropped += client.unlink(*batch)
                batch = []
        if batch:
            dropped += client.unlink(*batch)
    finally:
        client.close()
    return dropped


# --------------------------------------------------------------------------- batch peer


def batch_peer(spark: Any, settings: Any, redis_url: str, steps: Any = None) -> dict[str, Any]:
    """The hand-written batch job to Redis: the snapshot's files, two SQL aggregates, one HSET per row."""
    from _batch_variants import HAND_SQL
    from deltalake import DeltaTable

    _ship_by_value()
    started = time.perf_counter()
    files = DeltaTable(str(settings.master_path)).file_uris()
    spark.read.parquet(*files).createOrReplaceTempView("bench_payments")
    if steps is not None:
        steps.add("1 file list + Spark plan", time.perf_counter() - started)
    for name, sql in HAND_SQL.items():
        began = time.perf_counter()
        window = "CAST(unix_seconds(window_start) AS STRING)"
        key = f"concat(user_id, '|', {window})" if "window_start" in sql else "user_id"
        rows = spark.sql(f"SELECT {key} AS key, `count`, sum_amount, min_amount, max_amount, "
                         f"distinct_merchant AS merchants FROM ({sql})")
        rows.foreachPartition(functools.partial(_overwrite, redis_url, name))
        if steps is not None:
            steps.add(f"3 {name}: SQL + HSET pipelines to Redis", time.perf_counter() - began)
    return {"files": len(files)}


def check_batch_peer(redis_url: str, gold_rows: dict[str, int]) -> list[str]:
    """One hash per gold row per view (keys ``peer:batch:{view}:*``)."""
    from serving.store.connection import redis_client

    client = redis_client(redis_url)
    problems = []
    try:
        for view, expected in gold_rows.items():
            found = sum(1 for _ in client.scan_iter(match=f"{PREFIX}:batch:{view}:*", count=10_000))
            if found != expected:
                problems.append(f"peer {view}: {found} hashes for {expected} gold rows")
    finally:
        client.close()
    return problems
