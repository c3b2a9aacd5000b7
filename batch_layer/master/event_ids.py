"""The event-id index: where each id occurs in the master dataset, for the duplicates rule.

A Delta table beside the master (``event_ids_uri``) holding the rule's occurrences
(``shared_logic.dedup``): one row per (id, version) with the version's clock and the candidate's
content key, plus one marker row (null id) for each version without any, so the clock of every
version indexed is in the table. The batch layer extends it from the master's change data feed
through each barrier before recomputing (:meth:`EventIdIndex.extend`), in one commit recording
how far it reaches (application transaction ``lambda-event-ids``); the speed layer reads it to
remember the horizon before its micro-batches. Only batch runs write it (they hold the run lock).

When the master's log no longer holds the versions the index needs (the id field was declared on a
trimmed master, or the index was lost), the index is *seeded*: the snapshot at the barrier is taken
as one version, the barrier's, so of each id's rows one counts. The seed's version is recorded
(``lambda-event-ids-seed``; 0 means built from the first commit): both layers read occurrences at or
below it from the index alone, so they decide alike. The README's "Duplicates" says what a seed means.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import write_deltalake
from deltalake.exceptions import TableNotFoundError
from deltalake.transaction import CommitProperties, Transaction

from batch_layer.errors import StorageError
from batch_layer.master.delta_log import inserted_rows, newest_version, open_table, read_commit
from batch_layer.master.delta_rs import DeltaRsEngine
from batch_layer.master.object_store import Location, table_uri
from shared_logic.dedup import CLOCK, ID, KEY, VERSION, candidates, with_key
from shared_logic.events import KIND_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from batch_layer.master.dataset import MasterDataset

log = logging.getLogger(__name__)

SCHEMA = pa.schema([pa.field(ID, pa.string()), pa.field(VERSION, pa.int64(), nullable=False),
                    pa.field(CLOCK, pa.int64(), nullable=False), pa.field(KEY, pa.string())])
THROUGH_APP, SEED_APP = "lambda-event-ids", "lambda-event-ids-seed"
_CLOCK_META = "lambda.event_ids.clock"
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
        self.path, self.master, self.id_field = table_uri(path), master, id_field

    def state(self) -> IndexState | None:
        """The index's reach, or None when there is none yet."""
        try:
            table = open_table(self.path)
        except TableNotFoundError:
            return None
        through, seed = table.transaction_version(THROUGH_APP), table.transaction_version(SEED_APP)
        if through is None or seed is None:
            return None
        commit = read_commit(self.path, table.version())
        clock = commit.info.get(_CLOCK_META) if commit is not None else None
        if clock is None:
            raise StorageError(f"the event-id index at {self.path} has no clock in its newest commit: delete it "
                               "and the next batch run builds it again")
        return IndexState(through, seed, int(clock))

    def extend(self, spark: SparkSession, through: int) -> IndexState:
        """Make the index reach master version ``through`` (a barrier): from the change data feed after what
        it holds, or, when the log no longer holds that, by seeding it at ``through``. Idempotent."""
        state = self.state()
        if state is not None and state.through >= through:
            return state
        first = state.through + 1 if state is not None else 1  # version 0 creates the table: no rows
        clocks = self._clocks(first, through, state.clock if state is not None else 0)
        if clocks is None:
            return self._seed(spark, through)
        rows = self._occurrences(spark, first, through, clocks)
        return self._commit(rows, IndexState(through, state.seed if state is not None else 0, clocks[through]),
                            mode="append")

    def read(self, spark: SparkSession, through: int) -> DataFrame:
        """The occurrences at versions up to ``through`` (ids only), for Spark."""
        from pyspark.sql import functions as F

        version = newest_version(self.path)
        if version is None:
            raise StorageError(f"no event-id index at {self.path}: extend it first")
        rows = DeltaRsEngine().snapshot(spark, self.path, version, SCHEMA)
        return rows.where(F.col(ID).isNotNull() & (F.col(VERSION) <= through))

    def rows(self, *, first: int = 0, last: int, since_clock: int | None = None) -> pa.Table:
        """Occurrences (ids only) at versions ``first..last``, with a clock of ``since_clock`` or more."""
        condition = pc.field(ID).is_valid() & (pc.field(VERSION) >= first) & (pc.field(VERSION) <= last)
        if since_clock is not None:
            condition &= pc.field(CLOCK) >= since_clock
        return self._dataset().to_table(filter=condition)

    def clock_at(self, version: int) -> int:
        """The clock of ``version`` (at most the index's reach), 0 before the first version indexed."""
        found = self._dataset().to_table(columns=[CLOCK], filter=pc.field(VERSION) <= version)
        return int(pc.max(found[CLOCK]).as_py() or 0) if found.num_rows else 0

    def _dataset(self) -> ds.Dataset:
        return open_table(self.path).to_pyarrow_dataset()

    def _clocks(self, first: int, last: int, previous: int) -> dict[int, int] | None:
        """The clock of each version ``first..last``, or None when the log no longer holds one of them."""
        clocks: dict[int, int] = {}
        for version in range(first, last + 1):
            commit = read_commit(self.master.path, version)
            if commit is None:
                return None
            previous = clocks[version] = clock_of(commit.timestamp, previous)
        return clocks

    def _occurrences(self, spark: SparkSession, first: int, last: int, clocks: dict[int, int]) -> pa.Table:
        """Index rows for versions ``first..last``: their occurrences, and a marker for each version without one."""
        schema = self.master.schema.append(pa.field(_CHANGE_VERSION, pa.int64()))
        table = pa.Table.from_batches(
            list(inserted_rows(self.master.path, first, last, schema, version_column=_CHANGE_VERSION)), schema=schema)
        found = self._candidates(spark, table, _CHANGE_VERSION) if table.num_rows else _empty()
        seen = set(found[VERSION].to_pylist())
        markers = [v for v in clocks if v not in seen]
        return pa.concat_tables([
            found.append_column(CLOCK, pa.array([clocks[v] for v in found[VERSION].to_pylist()], pa.int64()))
            .select(SCHEMA.names).cast(SCHEMA),
            pa.table({ID: pa.nulls(len(markers), pa.string()), VERSION: pa.array(markers, pa.int64()),
                      CLOCK: pa.array([clocks[v] for v in markers], pa.int64()),
                      KEY: pa.nulls(len(markers), pa.string())}, schema=SCHEMA),
        ])

    def _candidates(self, spark: SparkSession, table: pa.Table, version_column: str) -> pa.Table:
        from pyspark.sql import functions as F

        fields = [n for n in self.master.schema.names if n != KIND_COLUMN]
        events = spark.createDataFrame(table).where(F.col(KIND_COLUMN) == "event")
        return _arrow(candidates(with_key(events, fields), self.id_field, version_column))

    def _seed(self, spark: SparkSession, at: int) -> IndexState:
        from pyspark.sql import functions as F

        commit = read_commit(self.master.path, at)
        if commit is None:
            raise StorageError(f"cannot seed the event-id index at master version {at}: its commit is not in the log")
        clock = clock_of(commit.timestamp, 0)
        log.warning("the master's log no longer holds what the event-id index at %s needs: seeding it at version %d "
                    "(the snapshot's events taken as one version)", self.path, at)
        fields = [n for n in self.master.schema.names if n != KIND_COLUMN]
        events = self.master.snapshot(spark, at).withColumn("_seed_version", F.lit(at).cast("long"))
        found = _arrow(candidates(with_key(events, fields), self.id_field, "_seed_version"))
        marker = pa.table({ID: [None], VERSION: [at], CLOCK: [clock], KEY: [None]}, schema=SCHEMA)
        rows = pa.concat_tables([found.append_column(CLOCK, pa.array([clock] * found.num_rows, pa.int64()))
                                 .select(SCHEMA.names).cast(SCHEMA), marker])
        return self._commit(rows, IndexState(at, at, clock), mode="overwrite")

    def _commit(self, rows: pa.Table, state: IndexState, *, mode: Literal["append", "overwrite"]) -> IndexState:
        DeltaRsEngine().ensure_table(self.path, SCHEMA, name="event_ids", change_feed=False)
        props = CommitProperties(custom_metadata={_CLOCK_META: str(state.clock)},
                                 app_transactions=[Transaction(THROUGH_APP, state.through),
                                                   Transaction(SEED_APP, state.seed)])
        table = open_table(self.path)  # with the location's storage options
        if mode == "overwrite":
            write_deltalake(table, rows, mode="overwrite", commit_properties=props)
        else:
            write_deltalake(table, rows, mode="append", commit_properties=props)
        log.info("event-id index at %s reaches master version %d (%d rows added)", self.path, state.through, rows.num_rows)
        return state


def _arrow(frame: DataFrame) -> pa.Table:
    found = frame.toArrow()
    return found.select([ID, VERSION, KEY]).cast(pa.schema([SCHEMA.field(ID), SCHEMA.field(VERSION), SCHEMA.field(KEY)]))


def _empty() -> pa.Table:
    return pa.table({ID: pa.array([], pa.string()), VERSION: pa.array([], pa.int64()), KEY: pa.array([], pa.string())})
