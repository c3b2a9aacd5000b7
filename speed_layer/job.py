"""The speed layer: a Structured Streaming query applying the shared views to each micro-batch.

For every micro-batch (a run of master versions, in log order) it:

1. finds the barriers in it and its highest version;
2. takes the live segment bases: the served generation, and every barrier at or above it
   (barriers seen now are registered first);
3. cuts the micro-batch's events into version intervals between consecutive bases. A row at
   version v belongs to *every* live segment based below v, so the interval above the k-th
   base goes to the lowest k segments: the segment of the generation served now keeps
   growing until the next generation replaces it, and the next one starts at its barrier;
4. runs the shared ``transform`` and each ``View.aggregate`` on each interval, and writes the
   increments with ``segments.write_increments`` (atomic, guarded, exactly once). A small
   micro-batch (``speed_driver_rows``) is read and written by the driver instead, which saves the
   source's read tasks and the write job: about half of a small micro-batch's time, so answers are
   fresher (the same versions, read by the same function as the source's, aggregated by the same
   Spark plan; which way a micro-batch goes is fixed on its first attempt, with its plan);
5. records the version processed in each live segment and in the heartbeat: the commit point
   that makes the whole micro-batch visible to readers at once (``segments``). A micro-batch that
   ends inside a version (Delta's own source, of the delta-spark engine, splits a commit of several
   files) is not committed: the next one writes on under its tag and commits both at once.

A fresh query (no checkpoint, or Redis lost its data) starts after the served generation. When
none is served it does not start: reading the master into no segment would only be thrown away.
It waits (``waiting_reason``; the runner heartbeats with the reason) until one is published.
"""

from __future__ import annotations

import functools
import json
import logging
import shutil
import time
import uuid
from typing import TYPE_CHECKING, NamedTuple

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from batch_layer.faults import fault_point
from batch_layer.master.dataset import MasterDataset
from batch_layer.master.object_store import table_uri
from serving.store.connection import redis_client, store_keys
from serving.store.generations import delete_prefix, ensure_epoch, read_epoch, served_generation
from serving.store.heartbeat import SpeedHealth
from serving.store.logic import claim_segment, generation_logic, mark_waiting
from serving.store.replies import text
from serving.store.segment_commits import commit_processed
from shared_logic.events import KIND_COLUMN
from shared_logic.pipeline import Pipeline
from speed_layer.errors import NothingServedError
from speed_layer.input import master_changes
from speed_layer.segments import (
    DEPTH,
    SEGMENT_LAYOUT,
    WriteSpec,
    Written,
    encode,
    measure_spec,
    write_increments,
    write_increments_from_driver,
)
from speed_layer.source import SUMMARY, VERSION_COLUMN, read_changes, source_schema

if TYPE_CHECKING:
    from pathlib import Path

    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from speed_layer.config import SpeedConfig

log = logging.getLogger(__name__)

_IDENTITY = "lambda_query.json"


class _Summary(NamedTuple):
    """What a micro-batch holds: its highest version adding rows (None: no rows), its barrier versions
    (ascending), and, when its end offset tells, the versions it reads (first..end) and the rows they add."""

    last: int | None
    barriers: list[int]
    first: int | None = None
    end: int | None = None
    rows: int | None = None


class _Plan(NamedTuple):
    """How a micro-batch is written (``SpeedLayer._plan``): the segment bases it writes, the versions (first,
    end) the driver reads when it reads and writes it (None: Spark's tasks do), and the tag its writes carry."""

    bases: list[int]
    driver: tuple[int, int] | None
    tag: int
    #: The tag is that of the micro-batch before, left uncommitted: its undo logs go on.
    continues: bool = False


class SpeedLayer:
    """The continuous speed-layer query of one pipeline."""

    def __init__(self, spark: SparkSession, settings: SpeedConfig, pipeline: Pipeline, *, redis_url: str) -> None:
        self.spark, self.settings, self.pipeline, self.redis_url = spark, settings, pipeline, redis_url
        self.keys = store_keys(pipeline.name, redis_url)
        self.master = MasterDataset.open(settings, pipeline)
        self.checkpoint = settings.speed_checkpoint_path
        self.client = redis_client(redis_url)
        self.query_id = ""
        self.epoch = ""
        #: Why a segment this query would write is not its to write (another logic holds it), if one is not.
        self.waiting: str | None = None
        self.partitions = settings.speed_write_partitions
        self.chunk = settings.speed_chunk_rows
        self.driver_rows = settings.speed_driver_rows
        self._small: SparkSession | None = None

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

    def _saved_identity(self, epoch: str) -> dict | None:
        """The checkpoint's identity if the query can resume it (made under this Redis epoch)."""
        identity = self.checkpoint / _IDENTITY
        if not identity.exists():
            return None
        saved = json.loads(identity.read_text())
        return saved if saved["epoch"] == epoch else None

    def waiting_reason(self) -> str | None:
        """Why the query cannot start now (None: it can): a fresh start needs a served generation."""
        epoch = ensure_epoch(self.client, self.keys)
        if self._saved_identity(epoch) is not None or served_generation(self.client, self.keys) is not None:
            return None
        return ("waiting for a batch generation to be published (none is served: no batch run yet, or Redis lost "
                "its data); the speed layer starts after it")

    def _identity(self) -> int:
        """Resume the query's identity from its checkpoint, or start fresh; returns the starting version.

        A fresh start (no checkpoint, or Redis lost its data since the checkpoint was made) drops
        every realtime segment and starts after the served generation, rebuilding segments from it;
        with no generation served it raises NothingServedError (the runner waits for one). A checkpoint
        of other logic (the pipeline's code changed) starts a new query after the served generation too,
        but keeps the segments: they hold the old logic's counts, which answers go on using until a
        generation of the new logic is served, and the new query cannot claim them (``_plan``). A checkpoint
        of an older segment layout (``SEGMENT_LAYOUT``) starts fresh and drops every segment, of any logic.
        """
        identity = self.checkpoint / _IDENTITY
        epoch = ensure_epoch(self.client, self.keys)
        saved = self._saved_identity(epoch)
        relaid = False
        if saved is not None and saved.get("layout") != SEGMENT_LAYOUT:
            # Segments of an older layout read as absent under this code (key reads) while top-N still ranks their
            # sorted sets: drop them all, whichever logic holds them, and rebuild, as after a loss of Redis.
            log.warning("the realtime segments were written in layout %s, this code writes layout %d: dropping them; "
                        "this logic's are rebuilt from the served generation", saved.get("layout", 1), SEGMENT_LAYOUT)
            shutil.rmtree(self.checkpoint)
            saved, relaid = None, True
        if saved is not None and saved.get("logic", "") == self.pipeline.logic:
            self.query_id, self.epoch = saved["query"], epoch
            # Replays must cut the same chunks: keep the layout the query started with.
            self.partitions, self.chunk = saved["partitions"], saved["chunk"]
            if (self.partitions, self.chunk) != (self.settings.speed_write_partitions, self.settings.speed_chunk_rows):
                log.warning("keeping write partitions %d and chunk rows %d of the existing checkpoint; "
                            "new values apply after a fresh start", self.partitions, self.chunk)
            # Spark resumes from the checkpoint's offsets; where the query stopped before its first micro-batch
            # (an idle master) it has none, and starts where the query was started: after that generation, not
            # at version 0 (a master's log trimmed below it would stop the query there for good).
            return self._started_after(saved)
        served = served_generation(self.client, self.keys)
        if served is None:
            raise NothingServedError(f"no batch generation of {self.pipeline.name!r} is served to start after")
        if saved is not None:
            # Other logic made the checkpoint: a new query, which writes only segments it claims itself
            # (serving.store.logic), so the old logic's segments keep their counts and readers keep them apart.
            log.warning("the pipeline's logic changed (checkpoint %s, code %s): starting a new query after generation "
                        "%d; its answers stay as they are until a batch run under the new logic is served",
                        saved.get("logic") or "unrecorded", self.pipeline.logic, served)
            shutil.rmtree(self.checkpoint)
        else:
            if identity.exists():
                log.warning("Redis lost its data since the last run (epoch changed): rebuilding the realtime segments")
                shutil.rmtree(self.checkpoint)
            if relaid or generation_logic(self.client, self.keys, served) == self.pipeline.logic:
                self._drop_segments(served)  # rebuilt from the served generation on
            else:  # not ours to rebuild: they stay, as after a change of logic (a checkpoint lost in between)
                log.warning("generation %d was computed under other logic than this code's %s: its segments are kept "
                            "and answers stay as they are until a batch run under this logic is served", served,
                            self.pipeline.logic)
        for bucket in self.keys.every_prefix():
            for prefix in bucket.query_position_prefixes:
                delete_prefix(self.client, prefix)
        self.query_id, self.epoch = uuid.uuid4().hex[:12], epoch
        self.checkpoint.mkdir(parents=True, exist_ok=True)
        identity.write_text(json.dumps({"query": self.query_id, "epoch": epoch, "partitions": self.partitions,
                                        "chunk": self.chunk, "logic": self.pipeline.logic,
                                        "layout": SEGMENT_LAYOUT, "starting": served}))
        self.client.hset(self.keys.speed, mapping={"query": self.query_id, "state": "running", "started_after": served})
        return served

    def _started_after(self, saved: dict) -> int:
        """The generation the checkpoint's query started after: in its identity, or (identities written before
        it was kept there) in the speed hash, if that is still this query's; else -1 (version 0 on)."""
        if "starting" in saved:
            return int(saved["starting"])
        query, started = self.client.hmget(self.keys.speed, "query", "started_after")
        return int(started) if query is not None and text(query) == saved["query"] and started is not None else -1

    def _drop_segments(self, served: int) -> None:
        """Forget every realtime segment (a fresh start rebuilds them from ``served`` on)."""
        # Metadata first: readers read nothing of a segment without its processed version (serving.store.read_scripts),
        # so while the rest goes answers are the generation's alone, never a processed version over half-deleted data.
        self.client.delete(self.keys.segments)
        for bucket in self.keys.every_prefix():
            for key in self.client.scan_iter(match=bucket.segment_metas):
                self.client.unlink(key)
        fault_point("speed-dropping-segments")  # metadata gone, data not yet
        for bucket in self.keys.every_prefix():
            for prefix in bucket.query_state_prefixes:
                delete_prefix(self.client, prefix)
        self.client.sadd(self.keys.segments, served)
        self.client.hset(self.keys.speed, "processed", served)

    def epoch_lost(self) -> bool:
        """True when Redis lost its data since the query started (its epoch marker changed or is gone)."""
        return read_epoch(self.client, self.keys) != self.epoch

    def heartbeat(self, state: str | None = None) -> None:
        """Say the speed layer is alive (also when no new versions arrive), what it is doing (``state``, else
        what it waits for, else running), and where its Spark UI is ('' if off)."""
        state = state or self.waiting or "running"
        self.client.hset(self.keys.speed, mapping={"heartbeat_at": time.time(), "query": self.query_id, "state": state,
                                                  "ui_url": self.spark.sparkContext.uiWebUrl or ""})

    def _process(self, batch: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        summary = self._summary(batch, batch_id)
        if summary.last is None:
            return
        if summary.barriers:
            self.client.sadd(self.keys.segments, *summary.barriers)
        plan = self._plan(batch_id, summary)
        bases, on_driver = plan.bases, plan.driver
        written = Written(0, 0.0)
        if bases:
            source = self._read_on_driver(batch, *on_driver) if on_driver else batch
            events = source.where(F.col(KIND_COLUMN) == "event").drop(KIND_COLUMN)
            written = self._apply(events, plan, batch_id)
        fault_point("speed-after-write")  # increments applied, offsets not yet committed: a replay follows
        inside = _ends_inside_version(self.checkpoint, batch_id)
        if inside is not None:
            # Committing now would show part of a version as all of it: the micro-batch that completes the version
            # goes on under this tag (``_plan``) and commits both.
            log.info("micro-batch %d ends inside version %d (the source split its commit): %d view rows in, to be "
                     "committed with the rest of the version", batch_id, inside, written.rows)
            self.heartbeat()
            return
        self._mark_processed(bases, summary.last, batch_id, time.monotonic() - started, written.seconds)
        log.info("micro-batch %d: through version %d, %d view rows into segments %s%s (%.2fs, of which %.2fs "
                 "writing to Redis)", batch_id, summary.last, written.rows, bases,
                 " from the driver" if on_driver else "", time.monotonic() - started, written.seconds)

    def _read_on_driver(self, batch: DataFrame, first: int, end: int) -> DataFrame:
        """The micro-batch's rows read by the driver: versions first..end (both included, as the source's
        partitions read them) with the source's own function (``speed_layer.source.read_changes``), in the
        stream's schema, as a local DataFrame."""
        schema = source_schema(self.master.schema)  # what the source reads (speed_layer.input)
        table = pa.Table.from_batches(list(read_changes(table_uri(self.master.path), first, end, schema)), schema=schema)
        # One partition known as one: the views' aggregations then need no shuffle (one stage, not two).
        return self._small_session().createDataFrame(table, schema=batch.schema).coalesce(1)

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

    def _summary(self, batch: DataFrame, batch_id: int) -> _Summary:
        """What the micro-batch holds: its highest version (None: it has no rows), its barrier versions,
        ascending, and (from a logged offset only) the versions it reads and the rows they add.

        Told by the source's end offset, as Spark logged it before running the micro-batch (the same on
        every replay: ``speed_layer.source.summarize``, from the commits' statistics); when the offset
        does not tell (the delta-spark source, statistics that cannot), found from the rows by a Spark job.
        """
        logged = _logged_summary(self.checkpoint, batch_id)
        if logged is not None:
            return logged
        # No persist(): materializing a cache costs more than reading the versions twice.
        found = batch.agg(
            F.max(VERSION_COLUMN),
            F.collect_list(F.when(F.col(KIND_COLUMN) == "barrier", F.col(VERSION_COLUMN))),
        ).first()
        assert found is not None, "an aggregate without grouping has exactly one row"
        return _Summary(found[0], sorted(found[1]))

    def _plan(self, batch_id: int, summary: _Summary) -> _Plan:
        """How this micro-batch is written: decided on its first attempt, reused by replays.

        Its bases and its way (driver or tasks) decide how increments are cut into chunks and what the
        chunks are named; a replay (after a flip, or with other settings) must cut the same chunks for the
        guard to skip exactly what was applied. Segments that died meanwhile are skipped by the write itself.
        Its tag is its highest version, or, when the micro-batch before ended inside a version and so was not
        committed, that one's tag: the undo logs then go on holding the rows as they were before it, and the
        commit of this micro-batch shows both at once.
        """
        assert summary.last is not None, "a micro-batch without rows is not planned"
        key = self.keys.plan(self.query_id)
        stored = self.client.get(key)
        before: dict | None = None
        if stored is not None:
            planned_id, planned = text(stored).split(":", 1)
            plan = json.loads(planned)
            if isinstance(plan, list):  # a plan stored before the driver path: tasks
                plan = {"bases": plan, "driver": None}
            if int(planned_id) == batch_id:
                if "tag" not in plan:  # planned by code before tags were: kept now, for a micro-batch continuing it
                    plan = {**plan, "tag": summary.last, "continues": False}
                    self.client.set(key, f"{batch_id}:{json.dumps(plan)}")
                return _Plan(plan["bases"], tuple(plan["driver"]) if plan["driver"] else None, plan["tag"],
                             plan["continues"])
            # A plan without a tag is of a micro-batch the code before committed, whatever its end.
            if "tag" in plan and int(planned_id) < batch_id and \
                    _ends_inside_version(self.checkpoint, int(planned_id)) is not None:
                before = plan
        bases = self._claimed(self._live_bases(summary.barriers))
        small = summary.rows is not None and summary.rows <= self.driver_rows
        versions = (summary.first, summary.end) if small and summary.first is not None and summary.end is not None \
            else None
        tag = before["tag"] if before is not None else summary.last
        record = {"bases": bases, "driver": versions, "tag": tag, "continues": before is not None}
        self.client.set(key, f"{batch_id}:{json.dumps(record)}")
        return _Plan(bases, versions, tag, before is not None)

    def _claimed(self, bases: list[int]) -> list[int]:
        """The bases whose segments this query may write: claimed for its logic and by it (``serving.store.logic``).
        The versions a refused segment would get are in the next generation of this logic."""
        mine, self.waiting = [], None
        for base in bases:
            held = claim_segment(self.client, self.keys, base, self.pipeline.logic, self.query_id)
            if held is None:
                mine.append(base)
            elif self.waiting is None:
                self.waiting = (f"waiting for a batch generation of logic {self.pipeline.logic}: segment {base} holds "
                                f"{held.replace(':', ' ', 1)}, so its answers stay as they are")
        # The served segment (the lowest base) not ours: say which logic waits, so a scheduler of that logic
        # recomputes now (deploy.scheduler), also when the served generation is of its logic (a rollback).
        mark_waiting(self.client, self.keys, self.pipeline.logic if bases and bases[0] not in mine else None)
        if self.waiting and not mine:
            log.info("speed layer %s", self.waiting)
        return mine

    def _live_bases(self, barriers: list[int]) -> list[int]:
        served = served_generation(self.client, self.keys)
        known = {int(b) for b in self.client.smembers(self.keys.segments)} | set(barriers)
        if served is not None:
            known.add(served)
        return sorted(b for b in known if served is None or b >= served)

    def _apply(self, events: DataFrame, plan: _Plan, batch_id: int) -> Written:
        """Every view's increments for every interval, written in one Spark job (or from the driver), tagged
        ``plan.tag``: readers leave them out until ``_mark_processed`` commits the micro-batch."""
        bases = plan.bases
        encoded: list[DataFrame] = []
        width = (max(len(v.scalar_measures) for v in self.pipeline.views),
                 max(len(v.distinct_measures) for v in self.pipeline.views))
        for depth, low in enumerate(bases, start=1):
            high = bases[depth] if depth < len(bases) else None
            interval = F.col(VERSION_COLUMN) > low
            if high is not None:
                interval = interval & (F.col(VERSION_COLUMN) <= high)
            rows = self.pipeline.transform(events.where(interval).drop(VERSION_COLUMN))
            encoded.extend(encode(view.aggregate(rows).withColumn(DEPTH, F.lit(depth)), view, width)
                           for view in self.pipeline.views)
        spec = WriteSpec(
            self.redis_url, self.pipeline.name, self.query_id, self.epoch, batch_id, plan.tag, tuple(bases),
            {view.name: measure_spec(view) for view in self.pipeline.views}, self.chunk, continues=plan.continues,
        )
        increments = functools.reduce(DataFrame.unionByName, encoded)
        if plan.driver is not None:
            return write_increments_from_driver(increments, spec, self.client)
        return write_increments(increments, spec, self.partitions)

    def _mark_processed(self, bases: list[int], last: int, batch_id: int, seconds: float, writing: float) -> None:
        """The commit point of the micro-batch: its increments become visible, in every segment at once
        (``serving.store.segment_commits``); then the heartbeat says so, with how long the micro-batch took
        and how much of it its slowest writer spent writing to Redis."""
        if not bases:  # nothing of it is in any answer: the speed layer has not processed it for readers
            self.heartbeat()
            return
        commit_processed(self.client, self.keys, bases, last)
        SpeedHealth(self.client, self.keys.speed).record_success(  # a success: no longer failing, if it was
            processed=last, batch_id=batch_id, heartbeat_at=time.time(), query=self.query_id,
            last_batch_seconds=round(seconds, 3), last_write_seconds=round(writing, 3),
            state=self.waiting or "running",
        )


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


def _logged_offset(checkpoint: Path, batch_id: int) -> dict | None:
    """Micro-batch ``batch_id``'s end offset in the checkpoint's offsets log, or None.

    The log's file ``offsets/<batch id>`` is written by Spark before the micro-batch runs: a line
    ``v1``, a line of metadata, then the end offset of each source (here one, the master's).
    """
    try:
        lines = (checkpoint / "offsets" / str(batch_id)).read_text(encoding="utf-8").split("\n")
        offset = json.loads(lines[2]) if len(lines) > 2 and lines[0] == "v1" else None
    except (OSError, ValueError):
        return None
    return offset if isinstance(offset, dict) else None


def _ends_inside_version(checkpoint: Path, batch_id: int) -> int | None:
    """The version micro-batch ``batch_id`` stops inside, or None (it ends where a version does).

    Delta's own streaming source (the delta-spark engine) admits a commit's files one by one against
    its limits, so a commit of several files (a bulk ingest by Spark) can be split across micro-batches;
    its end offset then names the version and the index of the last file read. At a version's end it
    names the next version at index -1 (Delta's ``isLast``); the Python source reads whole versions."""
    offset = _logged_offset(checkpoint, batch_id)
    if offset is None or not isinstance(offset.get("reservoirVersion"), int) or not isinstance(offset.get("index"), int):
        return None
    return offset["reservoirVersion"] if offset["index"] >= 0 else None


def _logged_summary(checkpoint: Path, batch_id: int) -> _Summary | None:
    """The summary in micro-batch ``batch_id``'s end offset (``speed_layer.source.summarize``), or None."""
    offset = _logged_offset(checkpoint, batch_id)
    if offset is None or not isinstance(summary := offset.get(SUMMARY), dict):
        return None
    last, barriers = summary.get("last"), summary.get("barriers")
    if not (last is None or isinstance(last, int)) or not isinstance(barriers, list):
        return None
    first, rows, end = summary.get("first"), summary.get("rows"), offset.get("version")
    if not all(isinstance(n, int) for n in (first, rows, end)):  # an offset logged before they were kept
        first = rows = end = None
    return _Summary(last, sorted(int(b) for b in barriers), first, end, rows)
