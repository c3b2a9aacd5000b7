"""Kafka into the master dataset, exactly once: Spark's own Kafka source, one master commit per micro-batch.

The query reads one or more topics (names or a pattern) with Spark's Kafka source
(``spark-sql-kafka-0-10``, only committed records of transactional producers) and, for each
micro-batch, validates every record with the pipeline's event model (one JSON object per record,
strictly, as HTTP ingest does), appends the valid ones to the master dataset in one commit and
keeps the others as dead letters with their topic, partition and offset. A bad record never stops
the query. The master stays the platform's clock: the speed and batch layers read it as ever.

Exactly once: Spark writes a micro-batch's offset range to the query's checkpoint before running it,
and after a crash replays that range under the same batch id. The master commit carries the Delta
application transaction ``(kafka-ingest:<query id>, <batch id>)`` and so do the dead letters'; a
batch a table already records is not written there again. A kill at any point (before, between or
after the two commits, before the checkpoint records the batch done) therefore loses nothing and
keeps nothing twice. The query id is the checkpoint's: a new checkpoint is a new query, which reads
from its starting offsets.

Event time: the payload's event-time field when it has one, else the record's Kafka timestamp,
never the time of ingest.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from batch_layer.errors import IngestError
from batch_layer.faults import fault_point
from batch_layer.master.dataset import MasterDataset
from batch_layer.master.dead_letters import RAW_LIMIT, DeadLetter, DeadLetters
from batch_layer.master.storage import CommitConflictError
from shared_logic.errors import EventProblem

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger(__name__)

#: Spark's Kafka source for the installed Spark (Scala 2.13), resolved from Maven Central into the Ivy cache.
KAFKA_SOURCE_ARTIFACT = "org.apache.spark:spark-sql-kafka-0-10_2.13"
#: The columns of a Kafka record the ingest reads.
_RECORD_COLUMNS = ("value", "topic", "partition", "offset", "timestamp")
#: Largest record taken as an event (one flat JSON object); a larger one is a dead letter, and only its first
#: ``RAW_LIMIT`` bytes reach the driver. With ``max_offsets_per_trigger`` it bounds a micro-batch's memory
#: (at worst their product: see ``LAMBDA_KAFKA_MAX_OFFSETS_PER_TRIGGER``).
MAX_RECORD_BYTES = 64 * 1024


def _record_times(stamps: pa.ChunkedArray) -> list[datetime | None]:
    """Each Kafka record's timestamp, or None: when it has none (Kafka's -1 reaches Spark as
    1969-12-31T23:59:59.999), and when it is past year 9999 (a producer's microseconds sent as milliseconds),
    which Python cannot hold: converted, one such record would fail its micro-batch at every replay."""
    low = pa.scalar(datetime(1970, 1, 1, tzinfo=timezone.utc), stamps.type)
    high = pa.scalar(datetime.max.replace(tzinfo=timezone.utc), stamps.type)
    kept = pc.and_(pc.greater(stamps, low), pc.less_equal(stamps, high))
    times: list[datetime | None] = pc.if_else(kept, stamps, pa.scalar(None, stamps.type)).to_pylist()
    return times


def _too_big(size: int) -> str:
    return (f"the record is {size:,} bytes, over the {MAX_RECORD_BYTES:,}-byte limit of one event "
            f"(its first {RAW_LIMIT:,} bytes are kept)")


def kafka_package() -> str:
    """Maven coordinates of Spark's Kafka source at the installed pyspark's version."""
    import pyspark

    return f"{KAFKA_SOURCE_ARTIFACT}:{pyspark.__version__}"


@dataclass(frozen=True)
class KafkaSource:
    """What one ingest query reads: ``topics`` by name, or every topic matching ``pattern`` (a Java regex).

    ``options`` are Kafka client settings passed through as ``kafka.<name>`` (security protocol, SASL...);
    their values may be secrets: never log or show them.
    """

    bootstrap_servers: str
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = 20_000
    options: Mapping[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if bool(self.topics) == bool(self.pattern):
            raise IngestError("a Kafka source reads topics by name or by a pattern: give exactly one of them")

    @property
    def described(self) -> str:
        """Where it reads from, without any option value (safe to log)."""
        what = f"pattern {self.pattern!r}" if self.pattern else "topics " + ", ".join(self.topics)
        return f"{what} on {self.bootstrap_servers}"

    def reader_options(self) -> dict[str, str]:
        chosen = {"subscribePattern": self.pattern} if self.pattern else {"subscribe": ",".join(self.topics)}
        options = {f"kafka.{name}": value for name, value in self.options.items()}
        options.update({
            "kafka.bootstrap.servers": self.bootstrap_servers,
            "kafka.isolation.level": "read_committed",
            "startingOffsets": self.starting_offsets,
            # Offsets that vanished (retention, a recreated topic) are skipped with Spark's warning: an input
            # that lost data must not stop the platform. A topic recreated below the offsets read may lose
            # more: Spark goes on from its new position (README, "Offsets that vanished").
            "failOnDataLoss": "false",
            "includeHeaders": "false",
            **chosen,
        })
        if self.max_offsets_per_trigger:
            options["maxOffsetsPerTrigger"] = str(self.max_offsets_per_trigger)
        return options


@dataclass(frozen=True)
class BatchOutcome:
    """What one micro-batch did: records read, events appended (at ``version``), records dead-lettered;
    ``replayed`` when the master already held it (a replay after a crash: nothing appended again). A replay's
    letters, kept by the run that crashed, count 0 here as its events do."""

    batch_id: int
    read: int
    appended: int
    dead: int
    version: int | None
    replayed: bool


@dataclass
class IngestTotals:
    """Counts since this process started the query (thread-safe: updated by Spark's batch thread)."""

    read: int = 0
    appended: int = 0
    dead: int = 0
    batches: int = 0
    last: BatchOutcome | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, outcome: BatchOutcome) -> None:
        with self._lock:
            self.read += outcome.read
            self.appended += outcome.appended
            self.dead += outcome.dead
            self.batches += 1
            self.last = outcome


class MasterWriter:
    """The ``foreachBatch`` function: one master commit (and one dead-letter commit) per micro-batch."""

    def __init__(self, master: MasterDataset, dead_letters: DeadLetters, checkpoint: Path,
                 totals: IngestTotals | None = None) -> None:
        self.master, self.dead_letters, self.checkpoint = master, dead_letters, checkpoint
        self.totals = totals if totals is not None else IngestTotals()
        self._app_id: str | None = None

    @property
    def app_id(self) -> str:
        """``kafka-ingest:<query id>``: the query id Spark keeps in the checkpoint (``metadata``), written
        before the first batch runs, the same across restarts from that checkpoint."""
        if self._app_id is None:
            try:
                query_id = json.loads((self.checkpoint / "metadata").read_text())["id"]
            except (OSError, ValueError, KeyError) as e:
                raise IngestError(f"cannot read the Kafka ingest query's id from {self.checkpoint / 'metadata'}: {e}") from e
            self._app_id = f"kafka-ingest:{query_id}"
        return self._app_id

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        from pyspark.sql import functions as F

        size = F.length("value")  # an oversized record reaches the driver cut (it becomes a dead letter)
        value = F.when(size > MAX_RECORD_BYTES, F.substring("value", 1, RAW_LIMIT)).otherwise(F.col("value"))
        columns: list[Column | str] = [value.alias("value"), *_RECORD_COLUMNS[1:], size.alias("size")]
        outcome = self.write(frame.select(*columns).toArrow(), batch_id)
        self.totals.add(outcome)

    def write(self, records: pa.Table, batch_id: int) -> BatchOutcome:
        """Validate ``records`` (Kafka's columns) and commit them as batch ``batch_id`` (idempotent: a table
        that records this batch's transaction already refuses it, ``CommitConflictError``)."""
        replayed = False
        stamps = _record_times(records["timestamp"])
        rows = records.drop_columns(["timestamp"]).to_pydict()
        values = rows["value"]
        sizes = rows.get("size") or [0] * len(values)
        big = {i: size for i, size in enumerate(sizes) if size and size > MAX_RECORD_BYTES}
        sorted_ = self.master.pipeline.schema.sort_json_records(
            [(None if i in big else v, t) for i, (v, t) in enumerate(zip(values, stamps, strict=True))])
        refused = [(i, (EventProblem(f"record {i}", "(event)", _too_big(big[i])),) if i in big else problems)
                   for i, problems in sorted_.refused]
        version = None
        fault_point("kafka-before-master")
        if sorted_.events.num_rows:
            try:  # through delta-rs on either engine (app_transactions): JVM Delta's local commit can overwrite
                # a concurrent delta-rs commit (``delta_spark``), and HTTP ingest commits through delta-rs
                version = self.master.append(sorted_.events, app_transactions=[(self.app_id, batch_id)],
                                             metadata={"lambda.source": "kafka"})
            except CommitConflictError as e:  # a replay after a crash, or a retry whose first attempt landed
                recorded = self.master.engine.transaction_version(self.master.path, self.app_id)
                if recorded is None or recorded < batch_id:  # not there after all: fail the batch, it is read again
                    raise IngestError(f"micro-batch {batch_id} of {self.app_id} lost a commit race and is not in the "
                                      f"master (its last batch there: {recorded}): {e}") from e
                replayed = True
        fault_point("kafka-after-master")
        letters = [DeadLetter.of_problems(values[i], "kafka", problems, topic=rows["topic"][i],
                                          partition=rows["partition"][i], offset=rows["offset"][i],
                                          record_time=stamps[i])
                   for i, problems in refused]
        kept = self.dead_letters.append(letters, app_id=self.app_id, app_version=batch_id)  # None: a replay's
        fault_point("kafka-after-letters")
        outcome = BatchOutcome(batch_id, records.num_rows, 0 if replayed else sorted_.events.num_rows,
                               0 if kept is None else len(letters), version, replayed)
        log.info("kafka ingest of %s: micro-batch %d: %d records, %d events appended%s, %d dead letters%s",
                 self.master.pipeline.name, batch_id, outcome.read, outcome.appended,
                 f" at master version {version}" if version is not None else "", outcome.dead,
                 " (a replay: the master already held it)" if replayed else "")
        return outcome


def start_ingest(spark: SparkSession, master: MasterDataset, dead_letters: DeadLetters, source: KafkaSource, *,
                 checkpoint: Path, trigger_seconds: float, available_now: bool = False,
                 totals: IngestTotals | None = None) -> tuple[StreamingQuery, MasterWriter]:
    """Start the ingest query of ``master``'s pipeline from ``source``; its offsets live in ``checkpoint``.
    ``available_now``: read what the topics hold now (in micro-batches of at most ``max_offsets_per_trigger``
    records), then stop. ``totals``: counts to carry on (a query restarted in the same process)."""
    master.ensure()
    writer = MasterWriter(master, dead_letters, checkpoint, totals)
    reader = spark.readStream.format("kafka").options(**source.reader_options())
    stream = (reader.load().writeStream.foreachBatch(writer)
              .queryName(f"kafka-ingest-{master.pipeline.name}")
              .option("checkpointLocation", str(checkpoint)))
    trigger = {"availableNow": True} if available_now else {"processingTime": f"{trigger_seconds} seconds"}
    query = stream.trigger(**trigger).start()
    log.info("kafka ingest of %s started: %s, checkpoint %s", master.pipeline.name, source.described, checkpoint)
    return query, writer


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    committed: int
    newest: int

    @property
    def lag(self) -> int:
        return max(0, self.newest - self.committed)


def partition_lags(progress: Mapping[str, Any] | None) -> list[PartitionLag]:
    """Per-partition lag from a query progress: newest offset Kafka had minus the offset read through."""
    if not progress:
        return []
    source = (progress.get("sources") or [{}])[0]
    ended, newest = _offsets(source.get("endOffset")), _offsets(source.get("latestOffset"))
    return [PartitionLag(topic, partition, ended.get((topic, partition), 0), head)
            for (topic, partition), head in sorted(newest.items())]


def _offsets(offsets: object) -> dict[tuple[str, int], int]:
    if isinstance(offsets, str):
        try:
            offsets = json.loads(offsets)
        except ValueError:
            return {}
    if not isinstance(offsets, dict):
        return {}
    return {(topic, int(partition)): int(offset) for topic, partitions in offsets.items()
            if isinstance(partitions, dict) for partition, offset in partitions.items()}
