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

import json
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

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
              "redis.exceptions.SlotNotCoveredError", "serving.store.errors.ReplicationError",
              "speed_layer.dedup.EventIdsUnreadableError")
#: A micro-batch that waited its while for the batch run bringing the event-id index to its base: no failure, the
#: query starts again and waits on (its heartbeat says for what).
_WAITING = "speed_layer.dedup.IndexBehindError"
#: How long the speed layer keeps trying to (re)start while Redis does not answer, before it gives up.
_REDIS_AWAY_SECONDS = 120.0


# --- start-up stages in the log: where a (re)start's seconds go, up to fresh answers ----------------------------
def _process_age() -> float:
    """Seconds since this process started (from /proc; elsewhere: since this module was loaded)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])  # field 22, starttime (fields after the name)
        with open("/proc/uptime", "rb") as f:
            return max(0.0, float(f.read().split()[0]) - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


_PROCESS_STARTED = time.time() - _process_age()


def _since_start(at: float | None = None) -> float:
    """Seconds from this process's start to ``at`` (epoch s; default now)."""
    return (time.time() if at is None else at) - _PROCESS_STARTED


def _tell_start(name: str, progresses: Sequence[Mapping[str, Any]], query_started: float, told: set[str]) -> bool:
    """Log, once each, the query's first micro-batch and the trigger that caught up with the master (its micro-batch
    reached the newest version there was, or there was nothing new: answers are fresh from then on), with the seconds
    since the query and the process started. True once caught up, or 10 minutes on (nothing more to tell)."""
    for progress in progresses:
        durations = progress.get("durationMs") or {}
        source = (progress.get("sources") or [{}])[0]
        first, end, head = (_version(source.get(k)) for k in ("startOffset", "endOffset", "latestOffset"))
        try:
            done = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp() + \
                durations.get("triggerExecution", 0) / 1000
        except (KeyError, AttributeError, ValueError):
            done = time.time()
        since = f"{done - query_started:.1f}s after the query started, {_since_start(done):.1f}s after the process started"
        ran = "addBatch" in durations  # a micro-batch ran (the rows it read may count 0: the driver reads small ones)
        if ran and "first" not in told:
            told.add("first")
            spent = sorted(((ms / 1000, part) for part, ms in durations.items() if part != "triggerExecution"),
                           reverse=True)
            log.info("speed layer of %s: first micro-batch (%s, versions after %s through %s) done %s (Spark's trigger "
                     "%.1fs: %s)", name, progress.get("batchId"), first, end, since,
                     durations.get("triggerExecution", 0) / 1000,
                     ", ".join(f"{part} {seconds:.1f}s" for seconds, part in spent if seconds >= 0.05) or "-")
        if not ran or (end is not None and head is not None and end >= head):  # a replay's progress has no head
            log.info("speed layer of %s: caught up with the master%s %s", name,
                     f" (micro-batch {progress.get('batchId')}, through version {end})" if ran else " (nothing new)",
                     since)
            return True
    return time.time() - query_started > 600


def _version(offset: object) -> int | None:
    """The master version an offset in the query's progress names (either engine's source), if it names one."""
    if isinstance(offset, str):
        try:
            offset = json.loads(offset)
        except ValueError:
            return None
    version = offset.get("version", offset.get("reservoirVersion")) if isinstance(offset, dict) else None
    return version if isinstance(version, int) else None
# --- end of start-up stages ---


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
    log.info("speed layer of %s: Spark session ready, %.1fs after the process started", pipeline.name, _since_start())
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
            began = time.time()
            layer = SpeedLayer(spark, settings, pipeline, redis_url=redis_url)
            if not _wait_until_ready(layer, stop):
                return
            ready = time.time()
            query = layer.start()
            log.info("speed layer of %s: query started, %.1fs after the process started (%.1fs to open the master "
                     "dataset and be ready to start, %.1fs for the query's identity, input and start)",
                     pipeline.name, _since_start(), ready - began, time.time() - ready)
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
        lost = succeeded = caught_up = False
        query_started = time.time()
        told: set[str] = set()
        while not stop.is_set() and query.isActive:
            if not caught_up and query.lastProgress is not None:
                caught_up = _tell_start(pipeline.name, query.recentProgress, query_started, told)
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
        if error is not None and _WAITING in str(error):
            log.info("the speed layer's query waits for the event-id index; starting it again in 2 s")
            try:
                layer.heartbeat("waiting for the event-id index (a batch run brings it to the speed layer's base)")
            except (RedisError, RedisClusterException) as e:
                log.warning("speed layer heartbeat not written: %s", e)
            stop.wait(2.0)
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
