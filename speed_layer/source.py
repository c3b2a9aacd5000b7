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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

from batch_layer.master.delta_log import DeltaLogError, change_feed, newest_version, read_commit

VERSION_COLUMN = "_version"
SOURCE_NAME = "lambda_master"


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
    the master dataset, as JSON list of [name, type]), ``starting_version`` (first version read is the
    one after it), ``max_versions_per_trigger``, ``max_rows_per_trigger``, ``partitions``."""

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
        self.starting_version = int(options.get("starting_version", "0"))
        self.max_versions = int(options.get("max_versions_per_trigger", "1000"))
        max_rows = options.get("max_rows_per_trigger")
        self.max_rows = int(max_rows) if max_rows else None
        self.partitions_per_batch = int(options.get("partitions", "2"))

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
        return {"version": self._latest()}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        first, latest = start["version"] + 1, self._latest()
        end = min(latest, start["version"] + self.max_versions)
        if isinstance(limit, ReadMaxRows) and end >= first:
            end = self._cap_rows(first, end, limit.max_rows)
        return {"version": max(end, start["version"])}

    def _cap_rows(self, first: int, end: int, max_rows: int) -> int:
        """The last version such that versions first..it hold at most ``max_rows`` rows (at least one version)."""
        total = 0
        for version in range(first, end + 1):
            total += _rows_in_commit(self.path, version)
            if total > max_rows and version > first:
                return version - 1
        return end

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        first, last = start["version"] + 1, end["version"]
        if last < first:
            return []
        count = min(self.partitions_per_batch, last - first + 1)
        step = -(-(last - first + 1) // count)
        return [_VersionRange(v, min(v + step - 1, last)) for v in range(first, last + 1, step)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _VersionRange)
        yield from read_changes(self.path, partition.first, partition.last, self.schema)

    def commit(self, end: dict) -> None:
        """Nothing to release: the Delta log is immutable and read on demand."""


def read_changes(path: str, first: int, last: int, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Inserted rows of versions ``first..last`` with ``_version``, cast to ``schema``."""
    for batch in change_feed(path, first, last):
        # delta-rs yields string_view / uint64 columns: cast to the declared types before any compute.
        inserted = pc.equal(batch.column("_change_type").cast(pa.string()), "insert")
        columns = []
        for field in schema:
            source = "_commit_version" if field.name == VERSION_COLUMN else field.name
            columns.append(batch.column(source).cast(field.type))
        rows = pa.RecordBatch.from_arrays(columns, schema=schema).filter(inserted)
        if rows.num_rows:
            yield rows


def _rows_in_commit(path: str, version: int) -> int:
    """Rows a commit adds with data change, from its add actions' statistics (0 for compactions)."""
    commit = read_commit(path, version)
    if commit is None:
        raise DeltaLogError(f"commit {version} of {path} is not in its Delta log: cannot size the micro-batch")
    return commit.rows_added
