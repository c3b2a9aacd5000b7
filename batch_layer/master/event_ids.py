"""The event-id index: where each id occurs in the master dataset, for the duplicates rule.

A Delta table beside the master (``event_ids_uri``) holding the rule's occurrences
(``shared_logic.dedup``): one row per (id, version) with the version's clock and the candidate's
content key, plus one marker row (null id) for each version without any, so the clock of every
version indexed is in the table. The batch layer extends it from the master's change data feed
through each barrier before recomputing (:meth:`EventIdIndex.extend`), in commits of about
``FEED_CHUNK_ROWS`` master rows, each recording how far it reaches (application transaction
``lambda-event-ids``) and, in its metadata, that version's clock and the seed; the speed layer reads
it to remember the horizon before its micro-batches. Only batch runs write it (they hold the run lock).

When the master's log no longer holds the versions the index needs (the id field was declared on a
trimmed master, or the index was lost), the index is *seeded*: the snapshot at the barrier is taken
as one version, the barrier's, so of each id's rows one counts (Spark writes it, distributed). The seed's
version is recorded (0: built from the first commit): both layers read occurrences at or below it from
the index alone, so they decide alike. The README's "Duplicates" says what a seed means.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake.exceptions import TableNotFoundError

from batch_layer.errors import EventIdIndexError, StorageError
from batch_layer.master.arrow_frames import spark_frame
from batch_layer.master.delta_log import inserted_rows, newest_version, open_table, read_commit
from batch_layer.master.delta_rs import DeltaRsEngine
from batch_layer.master.object_store import Location, join, list_files, spark_uri
from shared_logic.dedup import CLOCK, ID, KEY, KEY_FORMAT, VERSION, candidates, with_key
from shared_logic.events import KIND_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from batch_layer.master.dataset import MasterDataset

log = logging.getLogger(__name__)

SCHEMA = pa.schema([pa.field(ID, pa.string()), pa.field(VERSION, pa.int64(), nullable=False),
                    pa.field(CLOCK, pa.int64(), nullable=False), pa.field(KEY, pa.string())])
THROUGH_APP = "lambda-event-ids"
#: Master rows read from the change data feed per index commit (bounds the driver's memory; one commit adding
#: more is read whole), and versions (commits without row statistics count no rows).
FEED_CHUNK_ROWS, FEED_CHUNK_VERSIONS = 500_000, 10_000
_CLOCK_META, _SEED_META = "lambda.event_ids.clock", "lambda.event_ids.seed"
_CHANGE_VERSION = "_commit_version"


class EventIdConfig(Protocol):
    """Where a pipeline's event-id index lives."""

    @property
    def event_ids_uri(self) -> str: ...


@dataclass(frozen=True)
class IndexState:
    """How far the index reaches: versions ``0..through``, seeded at ``seed`` (0: from the first commit),
    and ``clock``, the clock of version ``through`` (epoch microseconds)."""

    through: int
    seed: int
    clock: int


def clock_of(timestamp: float | None, previous: int) -> int:
    """A version's clock (epoch microseconds): the running maximum of commit timestamps."""
    own = int(round((timestamp or 0.0) * 1000)) * 1000
    return max(own, previous)


class EventIdIndex:
    """A pipeline's event-id index (see the module's docstring)."""

    def __init__(self, path: Location, master: MasterDataset, id_field: str) -> None:
        # One index per id field and content-key format: another id field (a new logic) never reads this one's.
        self.path, self.master, self.id_field = join(path, f"{id_field}.v{KEY_FORMAT}"), master, id_field
        self._engine = DeltaRsEngine()

    def state(self) -> IndexState | None:
        """The index's reach, or None when there is none yet."""
        try:
            table = open_table(self.path)
        except TableNotFoundError:
            return None
        through = table.transaction_version(THROUGH_APP)
        commit = read_commit(self.path, table.version())
        if through is None or commit is None:
            return None
        clock, seed = commit.info.get(_CLOCK_META), commit.info.get(_SEED_META)
        if clock is None or seed is None:
            raise StorageError(f"the event-id index at {self.path} has no clock or seed in its newest commit: delete "
                               "the folder and the next batch run builds it again")
        return IndexState(through, int(seed), int(clock))

    def extend(self, spark: SparkSession, through: int, *, may_seed: bool) -> IndexState:
        """Make the index reach master version ``through`` (a barrier): from the change data feed after what
        it holds, or, when the log no longer holds that, by seeding it at ``through``. Idempotent; a run
        killed midway leaves whole commits, and the next one goes on from the last.

        ``may_seed`` False (answers of this logic are served, decided by the index as it is): a seed would
        change decisions already served, so EventIdIndexError names the remedies instead."""
        state = self.state()
        if state is None:
            state = IndexState(0, 0, 0)  # version 0 creates the master: no rows
        while state.through < through:
            clocks = self._chunk(state.through + 1, through, state.clock)
            if clocks is None:
                if not may_seed:
                    raise EventIdIndexError(
                        f"the event-id index at {self.path} reaches master version {state.through}, and the master's "
                        f"log no longer holds version {state.through + 1}: restore the index folder from a backup, or "
                        "bump the pipeline's logic_version to recompute every view with a new index (seeded)")
                return self._seed(spark, through)
            last = max(clocks)
            rows = self._occurrences(spark, state.through + 1, last, clocks)
            state = IndexState(last, state.seed, clocks[last])
            self._engine.ensure_table(self.path, SCHEMA, name="event_ids", change_feed=False)
            self._engine.append(self.path, rows, app_id=THROUGH_APP, app_version=last, metadata=self._meta(state))
            log.info("event-id index at %s reaches master version %d (%d rows added)", self.path, last, rows.num_rows)
        return state

    def read(self, spark: SparkSession, through: int) -> DataFrame:
        """The occurrences at versions up to ``through`` (ids only), for Spark."""
        from pyspark.sql import functions as F

        version = newest_version(self.path)
        if version is None:
            raise StorageError(f"no event-id index at {self.path}: extend it first")
        rows = self._engine.snapshot(spark, self.path, version, SCHEMA)
        return rows.where(F.col(ID).isNotNull() & (F.col(VERSION) <= through))

    def rows(self, *, first: int = 0, last: int, since_clock: int | None = None) -> pa.Table:
        """Occurrences (ids only) at versions ``first..last``, with a clock of ``since_clock`` or more."""
        condition = pc.field(ID).is_valid() & (pc.field(VERSION) >= first) & (pc.field(VERSION) <= last)
        if since_clock is not None:
            condition &= pc.field(CLOCK) >= since_clock
        return self._dataset().to_table(filter=condition)

    def clock_at(self, version: int) -> int:
        """The clock of ``version`` (at most the index's reach), 0 before the first version indexed. Every version
        indexed has a row (an occurrence or a marker), so one version's rows tell; below a seed none has."""
        found = self._dataset().to_table(columns=[CLOCK], filter=pc.field(VERSION) == version)
        if not found.num_rows:
            found = self._dataset().to_table(columns=[CLOCK], filter=pc.field(VERSION) <= version)
        return int(pc.max(found[CLOCK]).as_py() or 0) if found.num_rows else 0

    def _dataset(self) -> ds.Dataset:
        return open_table(self.path).to_pyarrow_dataset()

    @staticmethod
    def _meta(state: IndexState) -> dict[str, str]:
        return {_CLOCK_META: str(state.clock), _SEED_META: str(state.seed)}

    def _chunk(self, first: int, last: int, previous: int) -> dict[int, int] | None:
        """The clocks of versions ``first..`` up to ``last``, as many as add about ``FEED_CHUNK_ROWS`` rows (one
        version at least); None when the log no longer holds one of them."""
        clocks: dict[int, int] = {}
        rows = 0
        for version in range(first, last + 1):
            commit = read_commit(self.master.path, version)
            if commit is None:
                return None
            previous = clocks[version] = clock_of(commit.timestamp, previous)
            rows += commit.rows_added
            if rows >= FEED_CHUNK_ROWS or len(clocks) >= FEED_CHUNK_VERSIONS:
                break
        return clocks

    def _occurrences(self, spark: SparkSession, first: int, last: int, clocks: dict[int, int]) -> pa.Table:
        """Index rows for versions ``first..last``: their occurrences, and a marker for each version without one."""
        from pyspark.sql import functions as F

        schema = self.master.schema.append(pa.field(_CHANGE_VERSION, pa.int64()))
        table = pa.Table.from_batches(
            list(inserted_rows(self.master.path, first, last, schema, version_column=_CHANGE_VERSION)), schema=schema)
        found = _empty()
        if table.num_rows:
            events = spark_frame(spark, table).where(F.col(KIND_COLUMN) == "event").drop(KIND_COLUMN)
            found = _arrow(candidates(with_key(events, _fields(self.master)), self.id_field, _CHANGE_VERSION))
        seen = set(found[VERSION].to_pylist())
        markers = [v for v in clocks if v not in seen]
        return pa.concat_tables([
            found.append_column(CLOCK, pa.array([clocks[v] for v in found[VERSION].to_pylist()], pa.int64()))
            .select(SCHEMA.names).cast(SCHEMA),
            pa.table({ID: pa.nulls(len(markers), pa.string()), VERSION: pa.array(markers, pa.int64()),
                      CLOCK: pa.array([clocks[v] for v in markers], pa.int64()),
                      KEY: pa.nulls(len(markers), pa.string())}, schema=SCHEMA),
        ])

    def _seed(self, spark: SparkSession, at: int) -> IndexState:
        """The index made anew from the snapshot at ``at``, its events taken as version ``at`` (Spark writes the
        files; one delta-rs commit replaces the table's content with them)."""
        from pyspark.sql import functions as F

        commit = read_commit(self.master.path, at)
        if commit is None:
            raise StorageError(f"cannot seed the event-id index at master version {at}: its commit is not in the log")
        state = IndexState(at, at, clock_of(commit.timestamp, 0))
        log.warning("the master's log no longer holds what the event-id index at %s needs: seeding it at version %d "
                    "(the snapshot's events taken as one version)", self.path, at)
        events = self.master.snapshot(spark, at).withColumn(_CHANGE_VERSION, F.lit(at).cast("long"))
        found = candidates(with_key(events, _fields(self.master)), self.id_field, _CHANGE_VERSION)
        marker = spark.createDataFrame([(None, at, None)], f"{ID} string, {VERSION} long, {KEY} string")
        rows = (found.select(ID, VERSION, KEY).unionByName(marker)
                .select(F.col(ID), F.col(VERSION), F.lit(state.clock).cast("long").alias(CLOCK), F.col(KEY)))
        staging = join(self.path, f"seed-{at:020d}-{uuid.uuid4().hex[:8]}")
        rows.write.parquet(spark_uri(staging))
        files = [uri for uri, _ in list_files(staging, ".parquet")]
        self._engine.ensure_table(self.path, SCHEMA, name="event_ids", change_feed=False)
        self._engine.commit_files(self.path, files, SCHEMA, app_id=THROUGH_APP, app_version=at, metadata=self._meta(state))
        return state


def _fields(master: MasterDataset) -> list[str]:
    """The event fields a content key covers: the master's columns but ``_kind``."""
    return [n for n in master.schema.names if n != KIND_COLUMN]


def _arrow(frame: DataFrame) -> pa.Table:
    found = frame.toArrow()
    return found.select([ID, VERSION, KEY]).cast(pa.schema([SCHEMA.field(ID), SCHEMA.field(VERSION), SCHEMA.field(KEY)]))


def _empty() -> pa.Table:
    return pa.table({ID: pa.array([], pa.string()), VERSION: pa.array([], pa.int64()), KEY: pa.array([], pa.string())})
