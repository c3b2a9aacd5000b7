"""Prometheus metrics of the serving API, at ``GET /metrics``.

``install_metrics(app)`` gives ``app`` its own ``CollectorRegistry`` (``app.state.metrics_registry``,
so several apps in one process never clash) holding:

* per request, by route template (``/v1/views/{view}/keys/{key}``, never the raw path), method and
  status: ``lambda_http_requests_total`` and the ``lambda_http_request_duration_seconds`` histogram,
  recorded by a pure ASGI middleware (two dict look-ups and two increments per request);
* ``lambda_events_ingested_total``: ``EVENTS_INGESTED``, which the ingest route increments;
* what other processes leave in Redis, read when Prometheus scrapes (``PlatformCollector``): the
  speed layer's heartbeat hash ``lp:{p}:speed`` (processed version, micro-batch id and duration,
  heartbeat age, duplicates left out), how far answers lag the master dataset (versions and seconds, from the master's
  Delta log via ``app.state.master_clock``), the served batch generation and its ``computed_at``,
  and batch runs by outcome (counts, newest duration and time) through the app's
  ``serving.store.runs.RunRegistry``. Missing data means missing samples, never a failed scrape;
  ``lambda_metrics_redis_up`` says whether Redis answered.
* whether a part is failing (``lambda_part_failing{part="speed"}``: it failed since its last success),
  how many times since (``lambda_part_failures``), when last (``lambda_part_last_failure_timestamp_seconds``)
  and, while failing, its last error as a label (``lambda_part_last_error_info{error="..."} 1``: one
  line, no credentials; the web console shows it).
* the Kafka ingest's status hash ``lp:{p}:kafka`` (``serving.store.ingest_status``), when one ran:
  ``lambda_kafka_ingest_records_total{outcome="read|appended|dead_lettered"}``,
  ``lambda_kafka_ingest_lag_records{topic,partition}`` and ``lambda_kafka_ingest_up``.
* ``lambda_dead_letters_total{source=...}``: the pipeline's dead letters by source, from its dead-letter
  table (``DeadLetters.counts``: the log's new commits per scrape, new files' ``source`` column only).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector
from redis.exceptions import RedisError

from serving.api.request_metrics import RequestMetrics
from serving.store.errors import StoreUnavailableError
from serving.store.generation_meta import COMPUTED_AT
from serving.store.heartbeat import SpeedHeartbeat
from serving.store.ingest_status import IngestStatus
from serving.store.runs import BatchRun, RunRegistry

log = logging.getLogger(__name__)

#: Events accepted by ingest, process-wide; registered in every app's registry. The ingest route
#: calls ``EVENTS_INGESTED.inc(n)`` once the events are committed to the master dataset.
EVENTS_INGESTED = Counter(
    "lambda_events_ingested", "Events accepted by HTTP ingest and committed to the master dataset.", registry=None
)

#: Request latency buckets (seconds): key reads take about a millisecond.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Longest a scrape waits for Redis before answering with what it has.
SCRAPE_TIMEOUT = 2.0
#: Most batch-run records read per scrape (``serving.store.runs`` keeps the newest 1000).
MAX_RUNS = 1000

# --------------------------------------------------------------------------- numbers

def _text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _number(value: Any) -> float | None:
    """A finite float from a number or numeric string (Redis replies); None otherwise."""
    try:
        number = float(_text(value))
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


# --------------------------------------------------------------------------- platform collector

@dataclass
class Snapshot:
    """What one scrape read; ``PlatformCollector.collect`` turns it into samples."""

    redis_up: bool | None = None
    speed: dict[str, str] = field(default_factory=dict)
    generation: int | None = None
    computed_at: float | None = None
    latest_version: int | None = None
    lag_versions: int | None = None
    lag_seconds: float | None = None
    runs: list[BatchRun] = field(default_factory=list)
    dead_letters: dict[str, int] | None = None
    kafka: IngestStatus | None = None
    taken_at: float = field(default_factory=time.time)


class PlatformCollector(Collector):
    """Metrics of the speed and batch layers, read from Redis and the master's Delta log per scrape.

    ``refresh(app)`` (async, called by ``GET /metrics``) reads; ``collect()`` reports what the last
    refresh read, so the registry's synchronous collection never blocks the event loop on Redis.
    """

    def __init__(self, pipeline: str) -> None:
        self.pipeline = pipeline
        self.snapshot = Snapshot()

    async def refresh(self, app: FastAPI) -> Snapshot:
        snapshot = Snapshot()
        store = getattr(app.state, "store", None)
        if store is not None:
            try:
                runs = getattr(app.state, "batch_runs", None)
                await asyncio.wait_for(self._read_redis(store, runs, snapshot), SCRAPE_TIMEOUT)
            except (RedisError, OSError, asyncio.TimeoutError, StoreUnavailableError) as e:
                log.debug("metrics scrape: Redis did not answer: %s", e)
                snapshot.redis_up = False
        clock = getattr(app.state, "master_clock", None)
        if clock is not None:
            await self._read_lag(clock, snapshot)
        letters = getattr(app.state, "dead_letters", None)
        if letters is not None:
            try:  # DeadLetters.counts reads only what is new since the last scrape
                snapshot.dead_letters = await asyncio.wait_for(asyncio.to_thread(letters.counts), SCRAPE_TIMEOUT)
            except Exception as e:
                log.debug("metrics scrape: dead letters unreadable: %s", e)
        self.snapshot = snapshot
        return snapshot

    async def _read_redis(self, store: Any, registry: RunRegistry | None, snapshot: Snapshot) -> None:
        client, keys = store.client, store.keys
        pipe = client.pipeline(transaction=False)
        pipe.hgetall(keys.speed)
        pipe.get(keys.current)
        pipe.hgetall(keys.kafka)
        speed, current, kafka = await pipe.execute()
        snapshot.redis_up = True
        snapshot.speed = {_text(k): _text(v) for k, v in speed.items()}
        snapshot.kafka = IngestStatus.from_hash(kafka)
        if current is not None:
            snapshot.generation = int(current)
            snapshot.computed_at = _number(await client.hget(keys.meta(snapshot.generation), COMPUTED_AT))
        if registry is not None:  # settles runs left 'running' by a dead scheduler, as every reader does
            _, snapshot.runs = await asyncio.to_thread(registry.recent, MAX_RUNS)

    async def _read_lag(self, clock: Any, snapshot: Snapshot) -> None:
        """Lag behind the master dataset, as ``GET /v1/views`` reports it (``MasterClock.freshness``)."""
        processed = SpeedHeartbeat.from_hash(snapshot.speed).processed
        try:
            fresh = await asyncio.wait_for(
                clock.freshness(processed, snapshot.generation),
                SCRAPE_TIMEOUT,
            )
        except Exception as e:
            log.debug("metrics scrape: master dataset unreadable: %s", e)
            return
        snapshot.latest_version = fresh.latest_version
        snapshot.lag_versions, snapshot.lag_seconds = fresh.lag_versions, fresh.lag_seconds

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        s, p = self.snapshot, [self.pipeline]

        def gauge(name: str, doc: str, value: float | None) -> Iterator[Metric]:
            if value is not None:
                family = GaugeMetricFamily(name, doc, labels=["pipeline"])
                family.add_metric(p, value)
                yield family

        if s.redis_up is not None:
            yield from gauge("lambda_metrics_redis_up", "1 if Redis answered the last scrape, else 0.", float(s.redis_up))
        yield from gauge("lambda_master_latest_version", "Newest version of the master dataset (Delta log).",
                         s.latest_version)
        yield from gauge("lambda_speed_lag_versions", "Master versions the answers are behind: newest master version "
                         "minus the newest version covered by the speed layer or the served batch generation.",
                         s.lag_versions)
        yield from gauge("lambda_speed_lag_seconds", "Age of the oldest master version the answers do not cover yet "
                         "(0: up to date).", s.lag_seconds)

        speed = s.speed
        yield from gauge("lambda_speed_processed_version", "Last master version the speed layer fully applied.",
                         _number(speed.get("processed")))
        yield from gauge("lambda_speed_batch_id", "Id of the speed layer's last applied micro-batch.",
                         _number(speed.get("batch_id")))
        yield from gauge("lambda_speed_last_batch_seconds", "Duration of the speed layer's last micro-batch.",
                         _number(speed.get("last_batch_seconds")))
        yield from gauge("lambda_speed_last_write_seconds",
                         "Of the speed layer's last micro-batch, the seconds its slowest writer spent writing to Redis "
                         "(reading, merging and storing rows; the rest is computing the increments and committing).",
                         _number(speed.get("last_write_seconds")))
        yield from gauge("lambda_speed_last_batch_duplicates", "Of the speed layer's last micro-batch, the events left "
                         "out as duplicates of an id seen within the horizon (a pipeline declaring an event id).",
                         _number(speed.get("last_batch_duplicates")))
        dropped = _number(speed.get("duplicates_dropped"))
        if dropped is not None:
            counter = CounterMetricFamily("lambda_speed_duplicates_dropped", "Events the speed layer left out as "
                                          "duplicates (a replayed micro-batch counts again).", labels=["pipeline"])
            counter.add_metric(p, dropped)
            yield counter
        heartbeat = _number(speed.get("heartbeat_at"))
        yield from gauge("lambda_speed_heartbeat_timestamp_seconds", "When the speed layer last reported (epoch s).",
                         heartbeat)
        yield from gauge("lambda_speed_heartbeat_age_seconds", "Seconds since the speed layer last reported.",
                         None if heartbeat is None else max(0.0, s.taken_at - heartbeat))
        if speed:
            yield from self._part_health("speed", SpeedHeartbeat.from_hash(speed))

        yield from gauge("lambda_batch_served_generation", "Master version of the served batch generation.",
                         s.generation)
        yield from gauge("lambda_batch_served_computed_at_timestamp_seconds",
                         "When the served batch generation was computed (epoch s).", s.computed_at)
        yield from gauge("lambda_batch_served_age_seconds", "Seconds since the served batch generation was computed.",
                         None if s.computed_at is None else max(0.0, s.taken_at - s.computed_at))

        if s.runs:
            yield from self._runs(s.runs)
        if s.kafka is not None:
            yield from self._kafka(s.kafka, s.taken_at)
        if s.dead_letters is not None:
            letters = CounterMetricFamily("lambda_dead_letters", "Records refused and kept as dead letters, by source.",
                                          labels=["pipeline", "source"])
            for source, count in sorted(s.dead_letters.items()):
                letters.add_metric([self.pipeline, source], count)
            yield letters

    def _part_health(self, part: str, health: SpeedHeartbeat) -> Iterator[Metric]:
        """A part's failing state, failures since its last success, last failure time and (while failing) error."""
        labels = [self.pipeline, part]
        for name, doc, value in (
            ("lambda_part_failing", "1 while the part is failing (it failed since its last success), else 0.",
             float(health.failing)),
            ("lambda_part_failures", "Failures of the part since its last success (each one is followed by a restart).",
             float(health.failures)),
            ("lambda_part_last_failure_timestamp_seconds", "When the part last failed (epoch s).", health.failed_at),
        ):
            if value is not None:
                family = GaugeMetricFamily(name, doc, labels=["pipeline", "part"])
                family.add_metric(labels, value)
                yield family
        if health.failing:
            info = GaugeMetricFamily("lambda_part_last_error_info", "The failing part's last error (label error).",
                                     labels=["pipeline", "part", "error"])
            info.add_metric([*labels, health.last_error or "no error recorded"], 1.0)
            yield info

    def _kafka(self, status: IngestStatus, now: float) -> Iterator[Metric]:
        """The Kafka ingest's counts (since its process started: a restart starts them again), lag and liveness."""
        records = CounterMetricFamily("lambda_kafka_ingest_records", "Kafka records the ingest read, appended to the "
                                      "master and kept as dead letters, since its process started.",
                                      labels=["pipeline", "outcome"])
        for outcome, count in (("read", status.read), ("appended", status.appended), ("dead_lettered", status.dead)):
            records.add_metric([self.pipeline, outcome], count)
        yield records
        lag = GaugeMetricFamily("lambda_kafka_ingest_lag_records", "Per partition: Kafka's newest offset minus the "
                                "offset the ingest has read through, at its last trigger.",
                                labels=["pipeline", "topic", "partition"])
        for part in status.lags:
            lag.add_metric([self.pipeline, part.topic, str(part.partition)], part.lag)
        yield lag
        up = GaugeMetricFamily("lambda_kafka_ingest_up", "1 while the Kafka ingest runs and reports, else 0.",
                               labels=["pipeline"])
        up.add_metric([self.pipeline], float(status.alive(now) and status.state == "running"))
        yield up

    def _runs(self, runs: list[BatchRun]) -> Iterator[Metric]:
        by = ["pipeline", "outcome"]
        count = GaugeMetricFamily("lambda_batch_runs", "Batch runs in the run registry, by outcome.", labels=by)
        duration = GaugeMetricFamily("lambda_batch_last_run_duration_seconds",
                                     "Duration of the newest recorded batch run of each outcome.", labels=by)
        when = GaugeMetricFamily("lambda_batch_last_run_timestamp_seconds",
                                 "When the newest recorded batch run of each outcome finished (or started).", labels=by)
        by_outcome: dict[str, list[BatchRun]] = {}
        for run in runs:
            by_outcome.setdefault(run.status, []).append(run)
        for outcome, group in sorted(by_outcome.items()):
            labels = [self.pipeline, outcome]
            count.add_metric(labels, len(group))
            newest = max(group, key=_when)
            if newest.duration is not None:
                duration.add_metric(labels, newest.duration)
            when.add_metric(labels, _when(newest))
        yield count
        if duration.samples:
            yield duration
        if when.samples:
            yield when


def _when(run: BatchRun) -> float:
    """When a run finished, else started, else was asked for (epoch seconds)."""
    return next(t for t in (run.finished_at, run.started_at, run.requested_at) if t is not None)


# --------------------------------------------------------------------------- install

def install_metrics(app: FastAPI) -> None:
    """Add request metrics and ``GET /metrics`` (Prometheus text; OpenMetrics on request) to ``app``."""
    registry = CollectorRegistry()
    labels = ("method", "route", "status")
    requests = Counter("lambda_http_requests", "HTTP requests answered, by route template, method and status.",
                       labels, registry=registry)
    latency = Histogram("lambda_http_request_duration_seconds",
                        "Time to answer HTTP requests, by route template, method and status.",
                        labels, buckets=LATENCY_BUCKETS, registry=registry)
    registry.register(EVENTS_INGESTED)
    pipeline = getattr(getattr(app.state, "pipeline", None), "name", None) or "unknown"
    platform = PlatformCollector(pipeline)
    registry.register(platform)
    app.state.metrics_registry = registry
    app.add_middleware(RequestMetrics, requests=requests, latency=latency)

    async def metrics(request: Request) -> Response:
        await platform.refresh(request.app)
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(content=encoder(registry), media_type=content_type)

    app.add_api_route("/metrics", metrics, methods=["GET"], include_in_schema=False, name="metrics")
