"""A Structured Streaming source over the master dataset's Delta log (PySpark Python data source).

Offsets are master versions: ``{"version": v}`` means "everything through version v". A
micro-batch reads the versions after its start offset through the change data feed (delta-rs
``load_cdf``), so each row carries ``_version``, the commit that added it, and rows arrive
grouped by version in log order. Compaction commits (``dataChange = false``) carry no change
data and are skipped, so OPTIMIZE never double counts. The read per micro-batch is capped in
versions and, from the commits' row statistics, in rows: the speed layer's backpressure.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

from batch_layer.master.delta_log import Commit, DeltaLogError, inserted_rows, newest_version, read_commit

VERSION_COLUMN = "_version"
SOURCE_NAME = "lambda_master"
#: Key of an end offset holding what the micro-batch holds (``summarize``).
SUMMARY = "summary"
_HEAD_CHECK_SECONDS = 10.0


def source_schema(master_schema: pa.Schema) -> pa.Schema:
    """Rows of the stream: the master dataset's columns, then ``_version``."""
    return master_schema.append(pa.field(VERSION_COLUMN, pa.int64(), nullable=False))


@dataclass(frozen=True)
class _VersionRange(InputPartition):
    """Versions ``first..last`` (both inclusive) read by one task."""

    first: int
    last: int


class MasterChangesSource(DataSource):
    """``spark.readStream.format("lambda_master")``. Options: ``path``, ``schema_json`` (Arrow schema of
    the master dataset, as JSON list of [name, type]), ``kind_column`` (the column telling events from
    barriers; default ``shared_logic.events.KIND_COLUMN``), ``starting_version`` (first version read is
    the one after it), ``max_versions_per_trigger``, ``max_rows_per_trigger``, ``partitions``.

    Spark runs this class in Python processes of its own, started anew with each query (its schema, its
    planning of micro-batches): this module imports no more than they need. (``shared_logic`` would cost
    each about 0.7 s of a restart on 2 busy cores, measured; hence ``kind_column`` as an option.)"""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return from_arrow_schema(source_schema(_master_schema(self.options)))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return MasterChangesReader(dict(self.options))


def master_schema_option(schema: pa.Schema) -> str:
    """Encode a master schema for the ``schema_json`` option (options are strings)."""
    return json.dumps([[f.name, str(f.type)] for f in schema])


_TYPES = {"string": pa.string(), "int64": pa.int64(), "double": pa.float64(), "bool": pa.bool_(),
          "timestamp[us, tz=UTC]": pa.timestamp("us", tz="UTC")}


def _master_schema(options: Mapping[str, str]) -> pa.Schema:
    return pa.schema([(name, _TYPES[kind]) for name, kind in json.loads(options["schema_json"])])


class MasterChangesReader(DataSourceStreamReader):
    """Plans micro-batches over Delta versions and reads them with delta-rs on the executors."""

    def __init__(self, options: dict[str, str]) -> None:
        self.path = options["path"]
        self.schema = source_schema(_master_schema(options))
        self.kind_column = options.get("kind_column") or _kind_column()
        self.starting_version = int(options.get("starting_version", "0"))
        self.max_versions = int(options.get("max_versions_per_trigger", "1000"))
        max_rows = options.get("max_rows_per_trigger")
        self.max_rows = int(max_rows) if max_rows else None
        self.partitions_per_batch = int(options.get("partitions", "2"))
        self._newest: int | None = None  # the newest version the last latestOffset saw, if it walked to it
        self._capped = False
        self._head_check = 0.0  # when an idle trigger next asks the table's head (time.monotonic())

    def initialOffset(self) -> dict:
        return {"version": self.starting_version}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def _latest(self) -> int:
        latest = newest_version(self.path)
        if latest is None:
            raise DeltaLogError(f"no master dataset at {self.path}: the speed layer reads an existing table")
        return latest

    def reportLatestOffset(self) -> dict:
        if self._newest is not None and not self._capped:
            return {"version": self._newest}  # the last look walked to the head of the log: no second look
        return {"version": self._latest()}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """The end offset of the next micro-batch: ``start`` itself when nothing was committed after it.

        The versions after ``start`` are walked commit file by commit file (an idle trigger costs one
        look for a file that is not there yet) up to the caps; the end offset carries their
        ``summary`` (:func:`summarize`), which Spark writes to the checkpoint's offsets log with it.
        """
        first = start["version"] + 1
        if read_commit(self.path, first) is None and (time.monotonic() < self._head_check or self._latest() < first):
            # Nothing new. Every _HEAD_CHECK_SECONDS the table's head is asked too, so that a log cleaned up
            # past the next version (the speed layer fell behind its retention) fails below, not waits forever.
            if time.monotonic() >= self._head_check:
                self._head_check = time.monotonic() + _HEAD_CHECK_SECONDS
            self._newest, self._capped = start["version"], False
            return start
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        commits: list[Commit] = []
        total, self._capped = 0, False
        for version in range(first, start["version"] + self.max_versions + 1):
            commit = read_commit(self.path, version)
            if commit is None:
                break
            total += commit.rows_added
            if max_rows is not None and total > max_rows and commits:
                self._capped = True
                break
            commits.append(commit)
        else:
            self._capped = True
        if not commits:  # the log has newer versions but not this one: cleaned up past its retention
            raise DeltaLogError(f"commit {first} of {self.path} is not in its Delta log: the speed layer cannot read "
                                "it (log retention shorter than the speed layer's delay); start it fresh")
        self._newest = commits[-1].version
        return {"version": commits[-1].version, SUMMARY: summarize(commits, self.kind_column)}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        first, last = start["version"] + 1, end["version"]
        if last < first:
            return []
        count = min(self.partitions_per_batch, last - first + 1)
        step = -(-(last - first + 1) // count)
        return [_VersionRange(v, min(v + step - 1, last)) for v in range(first, last + 1, step)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _VersionRange)
        yield from inserted_rows(self.path, partition.first, partition.last, self.schema, version_column=VERSION_COLUMN)

    def commit(self, end: dict) -> None:
        """Nothing to release: the Delta log is immutable and read on demand."""


def _kind_column() -> str:
    """``shared_logic.events.KIND_COLUMN``, for a caller that did not name the column (imported here only then)."""
    from shared_logic.events import KIND_COLUMN

    return KIND_COLUMN


def summarize(commits: Sequence[Commit], kind_column: str | None = None) -> dict | None:
    """What a micro-batch over ``commits`` holds, known from their statistics (of ``kind_column``, which tells
    events from barriers) without reading a row:
    ``{"last": the highest version adding rows (None: no rows), "barriers": versions adding barrier rows,
    "first": the first version it reads, "rows": the rows it adds}``.

    None when the statistics cannot tell for certain (then the micro-batch's rows are asked): a commit
    with change data files or data-changing removes, an added file without ``numRecords``, or one whose
    ``_kind`` statistics do not say that all its rows are events or all barriers (min = max).
    """
    kind_column = kind_column or _kind_column()
    last, barriers, total = None, [], 0
    for commit in commits:
        kinds = set()
        for action in commit.actions:
            if "cdc" in action or (isinstance(action.get("remove"), Mapping) and action["remove"].get("dataChange", True)):
                return None
            add = action.get("add")
            if not isinstance(add, Mapping) or not add.get("dataChange", True):
                continue
            stats = json.loads(add["stats"]) if add.get("stats") else {}
            rows = stats.get("numRecords")
            if not isinstance(rows, int):
                return None
            if rows == 0:
                continue
            total += rows
            low, high = stats.get("minValues", {}).get(kind_column), stats.get("maxValues", {}).get(kind_column)
            if low != high or low not in ("event", "barrier"):
                return None
            kinds.add(low)
        if kinds:
            last = commit.version
        if "barrier" in kinds:
            barriers.append(commit.version)
    return {"last": last, "barriers": barriers, "first": commits[0].version if commits else None, "rows": total}
