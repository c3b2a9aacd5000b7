"""The speed layer: a Structured Streaming query applying the shared views to each micro-batch.

For every micro-batch (a run of master versions, in log order) it:

1. finds the barriers in it and its highest version;
2. takes the live segment bases: the served generation, and every barrier at or above it
   (barriers seen now are registered first);
3. cuts the micro-batch's events into version intervals between consecutive bases. A row at
   version v belongs to *every* live segment based below v, so the interval above the k-th
   base goes to the lowest k segments: the segment of the generation served now keeps
   growing until the next generation replaces it, and the next one starts at its barrier;
4. runs the shared ``transform`` (checked: ``shared_logic.poison.view_rows``) and each
   ``View.aggregate`` on each interval, and writes the increments with ``segments.write_increments``
   (atomic, guarded, exactly once). A micro-batch whose query fails on a poison event is computed
   again without the poison events (``shared_logic.poison``: the batch layer leaves out the same
   ones, and keeps them as dead letters); the speed layer counts them in its heartbeat and log. A small
   micro-batch (``speed_driver_rows``) is read and written by the driver instead, which saves the
   source's read tasks and the write job: about half of a small micro-batch's time, so answers are
   fresher (the same versions, read by the same function as the source's, aggregated by the same
   Spark plan; which way a micro-batch goes is fixed on its first attempt, with its plan);
5. records the version processed in each live segment and in the heartbeat: the commit point
   that makes the whole micro-batch visible to readers at once (``segments``). A micro-batch that
   ends inside a version (Delta's own source, of the delta-spark engine, splits a commit of several
   files) is not committed: the next one writes on under its tag and commits both at once.

Where a query starts is ``speed_layer.identity``'s policy; how a micro-batch is written (its
bases, its way, its tag) is its plan (``speed_layer.plan``), decided on its first attempt.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from batch_layer.faults import fault_point
from batch_layer.master.arrow_frames import spark_frame
from batch_layer.master.dataset import MasterDataset
from batch_layer.master.delta_log import inserted_rows
from batch_layer.master.event_ids import EventIdIndex
from batch_layer.master.object_store import table_uri
from serving.store.connection import redis_client, store_keys
from serving.store.session import PipelineStore
from shared_logic.events import KIND_COLUMN
from shared_logic.pipeline import Pipeline
from shared_logic.poison import data_error, isolate, view_rows, without
from speed_layer import identity
from speed_layer.dedup import Horizon
from speed_layer.input import Summary, ends_inside_version, logged_summary, master_changes
from speed_layer.plan import Plan, Planner
from speed_layer.segments import (
    DEPTH,
    WriteSpec,
    Written,
    encode,
    measure_spec,
    session_spec,
    widths,
    write_increments,
    write_increments_from_driver,
)
from speed_layer.source import VERSION_COLUMN, source_schema

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from speed_layer.config import SpeedConfig

log = logging.getLogger(__name__)


class SpeedLayer:
    """The continuous speed-layer query of one pipeline."""

    def __init__(self, spark: SparkSession, settings: SpeedConfig, pipeline: Pipeline, *, redis_url: str) -> None:
        self.spark, self.settings, self.pipeline, self.redis_url = spark, settings, pipeline, redis_url
        keys = store_keys(pipeline.name, redis_url)
        self.master = MasterDataset.open(settings, pipeline)
        self.checkpoint = settings.speed_checkpoint_path
        self.store = PipelineStore(redis_client(redis_url), keys)
        self.query_id = ""
        self.epoch = ""
        self.partitions = settings.speed_write_partitions
        self.chunk = settings.speed_chunk_rows
        self.driver_rows = settings.speed_driver_rows
        self._planner: Planner | None = None
        self._small: SparkSession | None = None
        self._index_wait: str | None = None  # what a micro-batch waits for, while it waits for the event-id index
        field = pipeline.event_id_field
        self._horizon = None if field is None else Horizon(
            EventIdIndex(settings.event_ids_uri, self.master, field), pipeline.event_id_horizon, self._unsettled)

    @property
    def waiting(self) -> str | None:
        """Why a segment this query would write is not its to write (another logic holds it), if one is not."""
        return self._planner.waiting if self._planner is not None else None

    def start(self) -> StreamingQuery:
        """Start (or resume from the checkpoint) the streaming query."""
        starting = self._identity()
        self.master.ensure()
        stream = master_changes(self.spark, self.master, self.settings, starting=starting)
        _quiet_trigger_warnings(self.spark)
        query = (
            stream.writeStream.foreachBatch(self._process)
            .option("checkpointLocation", str(self.checkpoint))
            .trigger(processingTime=f"{self.settings.speed_trigger_seconds} seconds")
            .queryName(f"speed_{self.pipeline.name}")
            .start()
        )
        log.info("speed layer for %s running (query %s, checkpoint %s)", self.pipeline.name, self.query_id, self.checkpoint)
        return query

    def waiting_reason(self) -> str | None:
        """Why the query cannot start now (None: it can): a fresh start needs a served generation."""
        return identity.waiting_reason(self.store, self.checkpoint)

    def _identity(self) -> int:
        """Resume the checkpoint's query or start a new one (``speed_layer.identity``); returns the version the
        query reads after when Spark has no offsets for it. Raises NothingServedError when a new query has no
        served generation to start after."""
        query = identity.query_identity(self.store, self.pipeline, self.settings)
        self.query_id, self.epoch, self.partitions, self.chunk = query.query, query.epoch, query.partitions, query.chunk
        self._planner = Planner(self.store, self.query_id, self.pipeline.logic, self.checkpoint, self.driver_rows)
        return query.starting

    def epoch_lost(self) -> bool:
        """True when Redis lost its data since the query started (its epoch marker changed or is gone)."""
        return self.store.read_epoch() != self.epoch

    def heartbeat(self, state: str | None = None) -> None:
        """Say the speed layer is alive (also when no new versions arrive), what it is doing (``state``, else
        what it waits for, else running), and where its Spark UI is ('' if off)."""
        state = state or self._index_wait or self.waiting or "running"
        self.store.health.beat(query=self.query_id, state=state, ui_url=self.spark.sparkContext.uiWebUrl or "")

    def _process(self, batch: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        summary = self._summary(batch, batch_id)
        if summary.last is None:
            return
        if summary.barriers:
            self.store.segments.register(summary.barriers)
        inside = ends_inside_version(self.checkpoint, batch_id)
        assert self._planner is not None, "the query's identity comes first (start)"
        plan = self._planner.plan(batch_id, summary, ends_inside=inside is not None)
        bases, on_driver = plan.bases, plan.driver
        written, poisoned, duplicates = Written(0, 0.0), 0, 0
        if bases:
            source = self._read_on_driver(batch, *on_driver) if on_driver else batch
            events = source.where(F.col(KIND_COLUMN) == "event").drop(KIND_COLUMN)
            if self._horizon is not None:  # duplicates first, as the batch layer does: poison is looked for in the rest
                events, duplicates = self._horizon.screen(events, summary.first, summary.last, base=min(bases),
                                                          wait=self._wait)
                self._index_wait = None
            written, poisoned = self._apply_screened(events, plan, batch_id)
        fault_point("speed-after-write")  # increments applied, offsets not yet committed: a replay follows
        if inside is not None:
            # Committing now would show part of a version as all of it: the micro-batch that completes the version
            # goes on under this tag (``speed_layer.plan``) and commits both.
            log.info("micro-batch %d ends inside version %d (the source split its commit): %d view rows in, to be "
                     "committed with the rest of the version", batch_id, inside, written.rows)
            self.heartbeat()
            return
        self._mark_processed(bases, summary.last, batch_id, time.monotonic() - started, written.seconds, poisoned,
                             duplicates)
        log.info("micro-batch %d: through version %d, %d view rows into segments %s%s (%.2fs, of which %.2fs "
                 "writing to Redis)", batch_id, summary.last, written.rows, bases,
                 " from the driver" if on_driver else "", time.monotonic() - started, written.seconds)

    def _unsettled(self) -> bool:
        """Whether a batch run may still seed the event-id index: no generation of this logic is served."""
        served = self.store.served_generation()
        return served is None or self.store.generation_logic(served) != self.pipeline.logic

    def _wait(self, reason: str) -> None:
        """Wait a second for what ``reason`` says, heartbeating it (until the next micro-batch's end)."""
        self._index_wait = reason
        self.heartbeat()
        time.sleep(1.0)

    def _read_on_driver(self, batch: DataFrame, first: int, end: int) -> DataFrame:
        """The micro-batch's rows read by the driver: versions first..end (both included, as the source's
        partitions read them) with the source's own function (``delta_log.inserted_rows``), in the
        stream's schema, as a local DataFrame."""
        schema = source_schema(self.master.schema)  # what the source reads (speed_layer.input)
        table = pa.Table.from_batches(list(inserted_rows(table_uri(self.master.path), first, end, schema,
                                                      version_column=VERSION_COLUMN)), schema=schema)
        # One partition known as one: the views' aggregations then need no shuffle (one stage, not two).
        return spark_frame(self._small_session(), table, batch.schema).coalesce(1)

    def _small_session(self) -> SparkSession:
        """A session of the same Spark application for micro-batches read on the driver: one shuffle
        partition and no adaptive re-planning, which a few thousand rows gain nothing from (the job
        measured about a third faster). Its own SQL settings leave the application's other jobs alone."""
        if self._small is None:
            self._small = self.spark.newSession()
            for same in _SAME_IN_SMALL_SESSION:  # a new session has the builder's, not the runtime's
                if (value := self.spark.conf.get(same)) is not None:
                    self._small.conf.set(same, value)
            self._small.conf.set("spark.sql.shuffle.partitions", "1")
            self._small.conf.set("spark.sql.adaptive.enabled", "false")
        return self._small

    def _summary(self, batch: DataFrame, batch_id: int) -> Summary:
        """What the micro-batch holds: its highest version (None: it has no rows), its barrier versions,
        ascending, and (from a logged offset only) the versions it reads and the rows they add.

        Told by the source's end offset, as Spark logged it before running the micro-batch (the same on
        every replay: ``speed_layer.source.summarize``, from the commits' statistics); when the offset
        does not tell (the delta-spark source, statistics that cannot), found from the rows by a Spark job.
        """
        logged = logged_summary(self.checkpoint, batch_id)
        if logged is not None:
            return logged
        # No persist(): materializing a cache costs more than reading the versions twice.
        found = batch.agg(
            F.max(VERSION_COLUMN),
            F.collect_list(F.when(F.col(KIND_COLUMN) == "barrier", F.col(VERSION_COLUMN))),
        ).first()
        assert found is not None, "an aggregate without grouping has exactly one row"
        return Summary(found[0], sorted(found[1]))

    def _apply_screened(self, events: DataFrame, plan: Plan, batch_id: int) -> tuple[Written, int]:
        """``_apply``, and when its query fails on poison events, ``_apply`` without them; also the poison
        events left out (every copy). The failed query wrote nothing (it fails before its write stage), and
        the search is deterministic, so a replay leaves out the same events and cuts the same chunks."""
        failure = None
        try:
            return self._apply(events, plan, batch_id), 0
        except Exception as e:  # Spark raises many classes: data_error tells poison from the rest
            failure = data_error(e)
            if failure is None:
                raise
        assert failure is not None
        poison = isolate(self.pipeline, events, ignore=(VERSION_COLUMN,), failure=failure)
        left_out = sum(p.copies for p in poison)
        log.warning("micro-batch %d: %d poison event(s) left out of the views (%s: %s)", batch_id, left_out,
                    failure.condition, "; ".join(p.reason[:120] for p in poison[:5]) or failure.message[:200])
        return self._apply(without(events, poison, ignore=(VERSION_COLUMN,)), plan, batch_id), left_out

    def _apply(self, events: DataFrame, plan: Plan, batch_id: int) -> Written:
        """Every view's increments for every interval, written in one Spark job (or from the driver), tagged
        ``plan.tag``: readers leave them out until ``_mark_processed`` commits the micro-batch."""
        bases = plan.bases
        encoded: list[DataFrame] = []
        width = widths(self.pipeline.views)
        for depth, low in enumerate(bases, start=1):
            high = bases[depth] if depth < len(bases) else None
            interval = F.col(VERSION_COLUMN) > low
            if high is not None:
                interval = interval & (F.col(VERSION_COLUMN) <= high)
            rows = view_rows(self.pipeline, events.where(interval).drop(VERSION_COLUMN))
            encoded.extend(encode(view.aggregate(rows).withColumn(DEPTH, F.lit(depth)), view, width)
                           for view in self.pipeline.views)
        spec = WriteSpec(
            self.redis_url, self.pipeline.name, self.query_id, self.epoch, batch_id, plan.tag, tuple(bases),
            {v.name: measure_spec(v) for v in self.pipeline.views if v.sessions is None}, self.chunk,
            continues=plan.continues,
            sessions={v.name: session_spec(v) for v in self.pipeline.views if v.sessions is not None},
        )
        increments = functools.reduce(DataFrame.unionByName, encoded)
        if plan.driver is not None:
            return write_increments_from_driver(increments, spec, self.store.client)
        return write_increments(increments, spec, self.partitions)

    def _mark_processed(self, bases: list[int], last: int, batch_id: int, seconds: float, writing: float,
                        poisoned: int = 0, duplicates: int = 0) -> None:
        """The commit point of the micro-batch: its increments become visible, in every segment at once
        (``serving.store.segment_commits``); then the heartbeat says so, with how long the micro-batch took,
        how much of it its slowest writer spent writing to Redis, and the poison events and duplicates it left out."""
        if not bases:  # nothing of it is in any answer: the speed layer has not processed it for readers
            self.heartbeat()
            return
        self.store.commit_processed(bases, last)
        self.store.health.record_success(  # a success: no longer failing, if it was
            processed=last, batch_id=batch_id, heartbeat_at=time.time(), query=self.query_id,
            last_batch_seconds=round(seconds, 3), last_write_seconds=round(writing, 3), last_batch_poisoned=poisoned,
            last_batch_duplicates=duplicates,
            state=self.waiting or "running",
        )
        self.store.health.count_duplicates(duplicates)


#: Runtime SQL settings the driver path's session takes from the application's session: how keys of
#: timestamps render and how casts fail must be the same on both paths (and as in the batch layer).
_SAME_IN_SMALL_SESSION = ("spark.sql.session.timeZone", "spark.sql.ansi.enabled")

#: Spark's trigger logs a warning for every micro-batch longer than its interval; at the speed layer's
#: 0.1 s that is every micro-batch, and the speed layer logs each one's time itself (Spark 4.0, 4.1 names).
_TRIGGER_LOGGERS = ("org.apache.spark.sql.execution.streaming.ProcessingTimeExecutor",
                    "org.apache.spark.sql.execution.streaming.runtime.ProcessingTimeExecutor")


def _quiet_trigger_warnings(spark: SparkSession) -> None:
    """Raise the trigger's logger to ERROR in the driver's log4j (its 'falling behind' read like a fault)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None, "a classic (py4j) SparkSession"
    for name in _TRIGGER_LOGGERS:
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, jvm.org.apache.logging.log4j.Level.ERROR)
