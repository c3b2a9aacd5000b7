"""Running the speed layer as a process: start, stop gracefully on SIGTERM/Ctrl-C, rebuild on data
loss, wait while no generation is served."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from redis.exceptions import RedisClusterException, RedisError

from speed_layer.errors import NothingServedError
from speed_layer.job import SpeedLayer

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from shared_logic.pipeline import Pipeline
    from speed_layer.config import SpeedConfig

log = logging.getLogger(__name__)


#: Query failures worth a restart of the query alone (matched in the error's text: errors of Spark's
#: executors and of the JVM reach the driver as text only): Redis gone for a moment (the supervisor restarts
#: it), a Redis Cluster failing over (a commit no replica acknowledged is replayed, not counted: see
#: ``serving.store.segment_commits``), or a Python worker slower to start than Spark waits for (10 s, fixed)
#: on a busy machine.
_TRANSIENT = ("Python worker failed to connect back", "redis.exceptions.ConnectionError",
              "redis.exceptions.TimeoutError", "redis.exceptions.BusyLoadingError", "redis.exceptions.ClusterDownError",
              "redis.exceptions.TryAgainError", "redis.exceptions.RedisClusterException",
              "redis.exceptions.SlotNotCoveredError", "serving.store.errors.ReplicationError")
#: How long the speed layer keeps trying to (re)start while Redis does not answer, before it gives up.
_REDIS_AWAY_SECONDS = 120.0


def _stop_after_trigger(query: StreamingQuery, wait_seconds: float = 120.0) -> None:
    """Let the micro-batch in flight finish, then stop (a stopped-midway batch would be replayed anyway).

    Waits for that one micro-batch only: a query behind keeps its trigger active from batch to batch.
    """
    progress = query.lastProgress
    in_flight = (progress["batchId"] + 1) if progress else 0
    waited = 0.0
    while query.isActive and query.status.get("isTriggerActive") and waited < wait_seconds:
        progress = query.lastProgress
        if progress and progress["batchId"] >= in_flight:
            break
        threading.Event().wait(0.1)
        waited += 0.1
    query.stop()


def _epoch_lost(layer: SpeedLayer) -> bool:
    """Did Redis lose its data under the query? (Asked of Redis: an executor's error reaches us as text.)"""
    try:
        return layer.epoch_lost()
    except (RedisError, RedisClusterException):
        return False  # Redis is away: the transient path below restarts the query, which checks again


def _wait_until_ready(layer: SpeedLayer, stop: threading.Event) -> bool:
    """Heartbeat with the reason while the query cannot start; False when stopped meanwhile."""
    reason = layer.waiting_reason()
    if reason is not None:
        log.warning("speed layer of %s: %s", layer.pipeline.name, reason)
    while reason is not None and not stop.is_set():
        layer.heartbeat(state=reason)
        stop.wait(0.5)
        reason = layer.waiting_reason()
    return not stop.is_set()


def run_speed_layer(
    spark: SparkSession, settings: SpeedConfig, pipeline: Pipeline, *, redis_url: str,
    stop: threading.Event | None = None,
) -> None:
    """Run until ``stop`` is set (the caller decides what sets it: ``lambda-platform speed run``, SIGTERM).

    When Redis lost its data (epoch changed), the query is restarted from the served generation
    with fresh segments; while no generation is served it waits for one, heartbeating with the
    reason (``state`` in the speed hash); after a transient failure (``_TRANSIENT``) it is restarted
    from its checkpoint, in this process. Any other failure of the query is raised.
    """
    stop = stop or threading.Event()
    away_since: float | None = None
    while not stop.is_set():
        try:
            layer = SpeedLayer(spark, settings, pipeline, redis_url=redis_url)
            if not _wait_until_ready(layer, stop):
                return
            query = layer.start()
        except NothingServedError:
            continue  # the generation went away again since the wait (Redis lost its data)
        except (RedisError, RedisClusterException) as e:  # Redis restarting, a cluster electing a new master
            away_since = away_since or time.monotonic()
            if time.monotonic() - away_since > _REDIS_AWAY_SECONDS:
                raise
            log.warning("the speed layer cannot start: Redis does not answer (%s); trying again in 2 s", e)
            stop.wait(2.0)
            continue
        away_since = None
        lost = False
        while not stop.is_set() and query.isActive:
            try:
                layer.heartbeat()
            except (RedisError, RedisClusterException) as e:  # Redis away for a moment (a restart, a cluster failover): the query rides it out
                log.warning("speed layer heartbeat not written: %s", e)
            if _epoch_lost(layer):
                lost = True
                break
            stop.wait(0.5)
        if stop.is_set() or lost:
            log.info("stopping the speed layer after the micro-batch in flight")
            _stop_after_trigger(query)
            if lost:
                log.warning("Redis lost its data under the speed layer; restarting from the served generation")
                continue
            return
        error = query.exception()
        if error is not None and _epoch_lost(layer):  # the executors raised EpochChangedError; ask Redis
            log.warning("Redis lost its data under the speed layer; rebuilding segments from the served generation")
            continue
        if error is not None and any(transient in str(error) for transient in _TRANSIENT):
            # Restart the query in this process: a new process would pay for a JVM and a session again.
            log.warning("the speed layer's query failed (%s); restarting it in 2 s", str(error).splitlines()[0][:200])
            stop.wait(2.0)
            continue
        if error is not None:
            raise RuntimeError(f"the speed layer's query failed: {error}") from None
        return
