"""Running the speed layer as a process: start, stop gracefully on SIGTERM/Ctrl-C, rebuild on data
loss, wait while no generation is served, and say when it fails.

A failure (the query's, or the process's before it exits) is recorded in the speed hash before it is
raised or the query restarted (``serving.store.heartbeat.SpeedHealth``: the count since the last
success and the error in one line), so readiness, ``status``, the metrics and the console show the
speed layer failing within one restart. A restarted query's first completed trigger (a micro-batch,
or finding nothing new) is its success and clears the count; so does every committed micro-batch
(``speed_layer.job``).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from redis.exceptions import RedisClusterException, RedisError

from serving.store.connection import redis_client, store_keys
from serving.store.heartbeat import SpeedHealth
from speed_layer.errors import NothingServedError
from speed_layer.job import SpeedLayer

if TYPE_CHECKING:
    import redis
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


class _Health:
    """The speed hash's health fields (``SpeedHealth``), written best-effort: Redis may be what failed.

    Its client fails fast, so a failure is reported (and the process exits) within seconds, recorded or not.
    """

    def __init__(self, redis_url: str, pipeline: str) -> None:
        self._url, self._pipeline = redis_url, pipeline
        self._client: redis.Redis | None = None

    def _writer(self) -> SpeedHealth:
        if self._client is None:
            self._client = redis_client(self._url, fail_fast=True)
        return SpeedHealth(self._client, store_keys(self._pipeline, self._url).speed)

    def failed(self, error: BaseException) -> None:
        try:
            count = self._writer().record_failure(error)
        except Exception as e:  # never hide the failure being reported behind this one
            log.warning("the speed layer's failure is not recorded in Redis (%s)", e)
        else:
            log.info("speed layer failure recorded: %d since its last success", count)

    def succeeded(self) -> bool:
        """Record a success; True when it is recorded."""
        try:
            self._writer().record_success()
        except (RedisError, RedisClusterException, OSError) as e:
            log.warning("the speed layer's success is not recorded in Redis yet (%s)", e)
            return False
        return True

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


def run_speed_layer(
    spark: SparkSession, settings: SpeedConfig, pipeline: Pipeline, *, redis_url: str,
    stop: threading.Event | None = None,
) -> None:
    """Run until ``stop`` is set (the caller decides what sets it: ``lambda-platform speed run``, SIGTERM).

    When Redis lost its data (epoch changed), the query is restarted from the served generation
    with fresh segments; while no generation is served it waits for one, heartbeating with the
    reason (``state`` in the speed hash); after a transient failure (``_TRANSIENT``) it is restarted
    from its checkpoint, in this process. Any other failure of the query is raised. Every failure,
    transient or not, is recorded in the speed hash first (``_Health``); a stop is not a failure.
    """
    health = _Health(redis_url, pipeline.name)
    try:
        _run(spark, settings, pipeline, redis_url, stop or threading.Event(), health)
    except Exception as e:
        health.failed(e)
        raise
    finally:
        health.close()


def _run(spark: SparkSession, settings: SpeedConfig, pipeline: Pipeline, redis_url: str, stop: threading.Event,
         health: _Health) -> None:
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
        lost = succeeded = False
        while not stop.is_set() and query.isActive:
            if not succeeded and query.lastProgress is not None:  # a trigger completed: a micro-batch, or none due
                succeeded = health.succeeded()
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
            health.failed(error)
            log.warning("the speed layer's query failed (%s); restarting it in 2 s", str(error).splitlines()[0][:200])
            stop.wait(2.0)
            continue
        if error is not None:
            raise RuntimeError(f"the speed layer's query failed: {error}") from None
        return
