"""The embedded storage engine: Delta tables written by delta-rs, snapshots read by Spark's parquet reader.

Tables live at a local path or an ``s3://`` URI (``batch_layer.master.object_store``); handles are
opened by ``delta_log.open_table`` with the location's storage options. On S3 a commit is a
conditional put of the commit file: a concurrent writer's commit of the same version is refused by
the server (412) and delta-rs retries at the next version, so concurrent appends lose nothing.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.schema import Field as DeltaField
from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction
from pyspark.sql.pandas.types import from_arrow_schema
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from batch_layer.errors import StorageError
from batch_layer.master.delta_log import open_table, read_commit
from batch_layer.master.object_store import (
    Location,
    file_size,
    filesystem,
    make_folder,
    relative,
    spark_uri,
    storage_options,
    table_uri,
)
from batch_layer.master.storage import CommitConflictError, CommittedTransaction, CompactionResult, TableState

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)
_T = TypeVar("_T")

# Commit races between appenders are retried inside delta-rs; this covers transient I/O faults.
_retry_io = retry(
    retry=retry_if_exception_type(OSError),
    stop=stop_after_attempt(4),
    wait=wait_exponential(multiplier=0.05, max=1),
    reraise=True,
)


class DeltaRsEngine:
    """Delta Lake through delta-rs (the ``deltalake`` package): no JVM jars needed."""

    def ensure_table(self, path: Location, schema: pa.Schema, *, name: str, change_feed: bool) -> None:
        if self.latest_version(path) is not None:
            return
        make_folder(path)
        config = {"delta.enableChangeDataFeed": "true"} if change_feed else {}
        uri = table_uri(path)
        try:
            DeltaTable.create(uri, schema, mode="ignore", name=name, configuration=config,
                              storage_options=storage_options(uri) or None)
        except DeltaError as e:
            if self.latest_version(path) is None:  # lost a creation race only if the table now exists
                raise StorageError(f"cannot create Delta table at {path}: {e}") from e

    def latest_version(self, path: Location) -> int | None:
        try:
            return open_table(path).version()
        except TableNotFoundError:
            return None

    def table_state(self, path: Location) -> TableState | None:
        try:
            table = open_table(path)
        except TableNotFoundError:
            return None
        schema = pa.schema(table.schema().to_arrow())  # the arro3 schema, through the Arrow C interface
        return TableState(table.version(), schema, len(table.file_uris()))

    @_retry_io
    def add_columns(self, path: Location, fields: Sequence[pa.Field], *, metadata: Mapping[str, str]) -> int:
        """One ``metaData`` commit (delta-rs ``alter.add_columns``, Delta's ADD COLUMNS): no data rewritten."""
        table = self._open(path)
        names = {f.name for f in fields}
        have = set(pa.schema(table.schema().to_arrow()).names)
        if names <= have:  # another writer added them since the caller looked: no second (empty) metaData commit,
            return table.version()  # which would fail that writer's appends in flight ("Metadata changed")
        added = [DeltaField.from_arrow(f.with_nullable(True)) for f in fields if f.name not in have]
        try:
            table.alter.add_columns(added, commit_properties=CommitProperties(custom_metadata=dict(metadata)))
        except DeltaError as e:
            # Another process evolving the same table at once: fine if the columns are there now.
            now = self.table_state(path)
            if now is None or not names <= set(now.schema.names):
                raise StorageError(f"cannot add the columns {sorted(names)} to the Delta table at {path}: {e}") from e
            return now.version
        return table.version()

    def append(self, path: Location, data: pa.RecordBatchReader | pa.Table, *, app_id: str | None = None,
               app_version: int | None = None, metadata: Mapping[str, str] | None = None,
               app_transactions: Sequence[tuple[str, int]] = ()) -> int:
        """One commit. An application transaction already recorded at that version or later commits nothing and
        raises CommitConflictError (checked on the handle that commits: a concurrent commit of it is refused too).
        A table is retried on a transient I/O fault (after checking its transactions again: the failed attempt
        may have landed); a stream is sent once (a retry would send what is left of it)."""
        pairs = list(app_transactions)
        if app_id is not None and app_version is not None:
            pairs.insert(0, (app_id, app_version))
        if isinstance(data, pa.RecordBatchReader):
            return self._append_once(path, data, pairs, metadata)
        return _retry_io(self._append_once)(path, data, pairs, metadata)

    def _append_once(self, path: Location, data: pa.RecordBatchReader | pa.Table, pairs: Sequence[tuple[str, int]],
                     metadata: Mapping[str, str] | None) -> int:
        table = self._open(path)
        recorded = [(a, v) for a, v in pairs if _at_least(table.transaction_version(a), v)]
        if recorded:
            raise CommitConflictError(f"append to {path} not committed: transaction {recorded[0][0]!r} version "
                                      f"{recorded[0][1]} is already recorded")
        return _append(table, data, pairs, metadata)

    def appender(self, path: Location) -> DeltaRsAppender:
        return DeltaRsAppender(path, self._open(path))

    def transaction_version(self, path: Location, app_id: str) -> int | None:
        return self._open(path).transaction_version(app_id)

    def snapshot(self, spark: SparkSession, path: Location, version: int, schema: pa.Schema) -> DataFrame:
        files = [spark_uri(uri) for uri in self._open(path, version).file_uris()]
        spark_schema = from_arrow_schema(schema)
        if not files:
            return spark.createDataFrame([], spark_schema)
        return spark.read.schema(spark_schema).parquet(*files)

    @_retry_io
    def commit_files(self, path: Location, files: Sequence[Location], schema: pa.Schema, *, app_id: str,
                     app_version: int, metadata: Mapping[str, str]) -> int | None:
        table = self._open(path)
        if (table.transaction_version(app_id) or -1) >= app_version:
            return None
        now_ms = int(time.time() * 1000)
        actions: list[AddAction | RemoveAction] = [
            AddAction(
                path=relative(file, path),
                size=file_size(file),
                partition_values={},
                modification_time=now_ms,
                data_change=True,
                stats=json.dumps({"numRecords": parquet_rows(file)}),
            )
            for file in files
        ]
        props = CommitProperties(custom_metadata=dict(metadata), app_transactions=[Transaction(app_id, app_version)])
        table.create_write_transaction(actions, mode="overwrite", schema=schema, commit_properties=props)
        return table.version()

    @staticmethod
    def _open(path: Location, version: int | None = None) -> DeltaTable:
        try:
            return open_table(path, version)
        except TableNotFoundError as e:
            raise StorageError(f"no Delta table at {path}") from e

    def compact(self, path: Location, *, target_size: int | None = None,
                metadata: Mapping[str, str] | None = None) -> CompactionResult:
        """OPTIMIZE (bin-packing compaction) in one commit that changes no data (``dataChange = false``).

        Concurrent appends are fine: compaction only rewrites files it read and conflicts with no
        append. Files of ``target_size`` (default ``delta.targetFileSize``, else 100 MB) or more
        are left alone; nothing to compact commits nothing (``version`` None).
        """
        table = self._open(path)
        props = CommitProperties(custom_metadata=dict(metadata or {}))
        try:
            metrics = table.optimize.compact(target_size=target_size, commit_properties=props)
        except DeltaError as e:
            raise StorageError(f"cannot compact the Delta table at {path}: {e}") from e
        removed, added = int(metrics.get("numFilesRemoved", 0)), int(metrics.get("numFilesAdded", 0))
        return CompactionResult(table.version() if removed else None, removed, added)


class DeltaRsAppender:
    """One DeltaTable handle kept between commits (see ``batch_layer.master.storage.Appender``).

    Opening a table replays its log since the last checkpoint (~20-50 ms here); a kept handle
    appends in ~10-15 ms. But a handle that commits again and again gets slower with every
    commit (measured with deltalake 1.6: ~10 ms per append after 100 commits, ~100 ms after
    1,000, on the same table at the same size a freshly opened handle appends in ~20 ms): so the
    handle is opened anew once the table has a newer checkpoint (every ``delta.checkpointInterval``
    commits, 100 by default), when there is only a commit or so to replay.
    """

    def __init__(self, path: Location, table: DeltaTable) -> None:
        self.path = path
        self._open(table)

    def _open(self, table: DeltaTable | None = None) -> None:
        self._table = table if table is not None else open_table(self.path)
        interval = self._table.metadata().configuration.get("delta.checkpointInterval")
        self._interval = int(interval) if interval else 100
        self._opened_at = self._table.version()

    def version(self) -> int:
        return self._table.version()

    def refresh(self) -> None:
        self._open()

    def transaction_version(self, app_id: str) -> int | None:
        return self._reading(lambda table: table.transaction_version(app_id))

    def _reading(self, read: Callable[[DeltaTable], _T]) -> _T:
        """``read`` of the handle's state, once more on a reopened handle when a log file it loaded from
        is gone: upkeep trimmed the log (``delta_log.trim_log``) under a handle opened before the
        checkpoint it kept, e.g. one idle while other writers committed past the retained versions.
        Reading is side-effect free, so the second try is safe; the reopened handle starts from that
        checkpoint."""
        try:
            return read(self._table)
        except DeltaError as e:
            if "not found" not in str(e).lower():
                raise
            log.info("the master dataset's log was trimmed under the ingest handle (%s): reopening it", e)
            self._open()
            return read(self._table)

    def append(self, data: pa.Table | pa.RecordBatchReader, *, app_transactions: Sequence[tuple[str, int]] = (),
               metadata: Mapping[str, str] | None = None) -> int:
        version = _append(self._table, data, list(app_transactions), metadata)
        if version // self._interval > self._opened_at // self._interval:
            self._open()  # a checkpoint was written at or before ``version``: start from it
        return version

    def find_transaction(self, app_id: str, *, from_version: int | None = None) -> CommittedTransaction | None:
        app_version = self.transaction_version(app_id)
        if app_version is None:
            return None
        start = max(0, app_version if from_version is None else from_version)
        for version in range(start, self._table.version() + 1):
            commit = read_commit(self.path, version)
            if commit is not None and commit.records_transaction(app_id):
                return CommittedTransaction(app_id, app_version, version, commit.info)
        return CommittedTransaction(app_id, app_version, None, {})


def _at_least(recorded: int | None, version: int) -> bool:
    return recorded is not None and recorded >= version


def _append(table: DeltaTable, data: pa.Table | pa.RecordBatchReader, txns: Sequence[tuple[str, int]],
            metadata: Mapping[str, str] | None) -> int:
    now_ms = int(time.time() * 1000)
    props = CommitProperties(
        custom_metadata=dict(metadata or {}),
        # last_updated lets delta.setTransactionRetentionDuration expire old ids from the table state
        app_transactions=[Transaction(app_id, version, now_ms) for app_id, version in txns] or None,
    )
    try:
        write_deltalake(table, data, mode="append", commit_properties=props)
    except CommitFailedError as e:
        if txns and "concurrent transaction" in str(e).lower():
            raise CommitConflictError(f"commit to {table.table_uri} lost to a concurrent transaction: {e}") from e
        raise
    # After the write the handle's state is exactly the version this commit landed at,
    # even when other processes commit concurrently (checked against the commit files).
    return table.version()


def parquet_rows(file: Location) -> int:
    """Rows of the parquet file at ``file`` (from its footer), local or on object storage."""
    fs, where = filesystem(file)
    return pq.read_metadata(where, filesystem=fs).num_rows
