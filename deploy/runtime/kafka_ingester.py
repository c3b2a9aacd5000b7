"""Running the Kafka ingest as a process: one query per pipeline that reads topics, its status in Redis.

The exactly-once protocol is ``batch_layer.master.kafka_ingest``'s; this loop starts the query,
writes its status (``serving.store.ingest_status``) every second, and stops it on request. A stop
in the middle of a micro-batch is safe: the batch is replayed from the checkpoint on the next start
and the master keeps it once. A failure of the query is recorded in the status and raised; the
supervisor (``up``) restarts the process, which resumes from the checkpoint; a topic that does not
exist yet is waited for (the status says so), in this process.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from redis.exceptions import RedisClusterException, RedisError

from batch_layer.master.dataset import MasterDataset
from batch_layer.master.dead_letters import DeadLetters
from batch_layer.master.kafka_ingest import IngestTotals, KafkaSource, MasterWriter, partition_lags, start_ingest
from batch_layer.recompute.lock import RunLock
from deploy.errors import KafkaIngestBusyError
from serving.store.connection import redis_client, store_keys
from serving.store.ingest_status import IngestStatusRecord, PartitionLagRecord

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from deploy.settings import Settings
    from shared_logic.pipeline import Pipeline

log = logging.getLogger(__name__)

#: Seconds between two status writes.
_STATUS_EVERY = 1.0
#: Kafka's error for a topic the broker does not have (matched in the text: the JVM's errors reach us as text).
_MISSING_TOPIC = "UnknownTopicOrPartitionException"
#: Seconds before a query that found a topic missing starts again.
_RETRY_SECONDS = 5.0


def kafka_source(settings: Settings) -> KafkaSource | None:
    """What ``settings``' pipeline reads from Kafka (None: no broker configured, or no topic for it)."""
    topics, pattern = settings.kafka_topics_of(settings.pipeline)
    bootstrap = settings.kafka_bootstrap
    if bootstrap is None or not (topics or pattern):
        return None
    return KafkaSource(bootstrap_servers=bootstrap, topics=topics, pattern=pattern,
                       starting_offsets=settings.kafka_starting_offsets,
                       max_offsets_per_trigger=settings.kafka_max_offsets_per_trigger,
                       options=settings.kafka_client_options())


def run_kafka_ingest(spark: SparkSession, settings: Settings, pipeline: Pipeline, *, redis_url: str,
                     stop: threading.Event) -> None:
    """Ingest ``pipeline``'s topics until ``stop`` is set; a pipeline without topics waits for the stop."""
    source = kafka_source(settings)
    if source is None:
        log.info("kafka ingest: pipeline %s reads no Kafka topic (LAMBDA_KAFKA_TOPICS)", pipeline.name)
        stop.wait()
        return
    lock = RunLock(settings.data_dir.resolve() / "locks" / f"kafka-ingest-{settings.pipeline_slug}.lock")
    if not lock.acquire():  # one query per checkpoint: a second one would run batches the first runs too
        raise KafkaIngestBusyError(f"another Kafka ingest of pipeline {pipeline.name} runs on this data dir "
                                   f"(process {lock.holder() or '?'}, lock {lock.path}): stop it first; `up` runs one")
    try:
        _ingest(spark, settings, pipeline, source, redis_url, stop)
    finally:
        lock.release()


def _ingest(spark: SparkSession, settings: Settings, pipeline: Pipeline, source: KafkaSource, redis_url: str,
            stop: threading.Event) -> None:
    client = redis_client(redis_url, fail_fast=True)
    status = IngestStatusRecord(client, store_keys(pipeline.name, redis_url).kafka)
    master, dead = MasterDataset.open(settings, pipeline), DeadLetters.open(settings, pipeline.name)
    checkpoint = settings.kafka_checkpoint_path
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    totals = IngestTotals()
    try:
        while not stop.is_set():
            query, writer = start_ingest(spark, master, dead, source, checkpoint=checkpoint,
                                         trigger_seconds=settings.kafka_trigger_seconds, totals=totals)
            error = _watch(query, writer, status, source, stop)
            if error is None:
                return
            if _MISSING_TOPIC in error:  # a topic not created yet: wait for it, in this process
                reason = f"waiting: a topic of {source.described} does not exist yet"
                log.warning("kafka ingest of %s %s; trying again in %g s", pipeline.name, reason, _RETRY_SECONDS)
                _report(status, source, query, writer, reason)
                stop.wait(_RETRY_SECONDS)
                continue
            _best_effort(functools.partial(status.failed, error))
            raise RuntimeError(f"the Kafka ingest of {pipeline.name} failed: {error}") from None
    finally:
        client.close()


def _watch(query: StreamingQuery, writer: MasterWriter, status: IngestStatusRecord, source: KafkaSource,
           stop: threading.Event) -> str | None:
    """Report until ``stop`` (then stop the query: None) or the query fails (its error's text)."""
    while not stop.is_set() and query.isActive:
        _report(status, source, query, writer, "running")
        stop.wait(_STATUS_EVERY)
    if stop.is_set():
        query.stop()  # safe at any point: a batch cut short is replayed, and kept once (see the module docstring)
        _report(status, source, query, writer, "stopped")
        return None
    error = query.exception()
    return None if error is None else str(error)


def _report(status: IngestStatusRecord, source: KafkaSource, query: StreamingQuery, writer: MasterWriter,
            state: str) -> None:
    totals = writer.totals
    lags = [PartitionLagRecord(p.topic, p.partition, p.lag) for p in partition_lags(query.lastProgress)]
    _best_effort(lambda: status.write(source=source.described, state=state, read=totals.read,
                                      appended=totals.appended, dead=totals.dead, batches=totals.batches, lags=lags))


def _best_effort(write: Callable[[], None]) -> None:
    """Run a status write; Redis away for a moment must not stop the ingest (the master is its clock)."""
    try:
        write()
    except (RedisError, RedisClusterException, OSError) as e:
        log.warning("kafka ingest status not written: %s", e)
