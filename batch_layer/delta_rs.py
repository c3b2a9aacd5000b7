"""The embedded storage engine: Delta tables written by delta-rs, snapshots read by Spark's parquet reader."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, CommitProperties, Transaction
from pyspark.sql.pandas.types import from_arrow_schema
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from batch_layer.errors import StorageError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# Commit races between appenders are retried inside delta-rs; this covers transient I/O faults.
_retry_io = retry(
    retry=retry_if_exception_type(OSError),
    stop=stop_after_attempt(4),
    wait=wait_exponential(multiplier=0.05, max=1),
    reraise=True,
)


class DeltaRsEngine:
    """Delta Lake through delta-rs (the ``deltalake`` package): no JVM jars needed."""

    def ensure_table(self, path: Path, schema: pa.Schema, *, name: str, change_feed: bool) -> None:
        if self.latest_version(path) is not None:
            return
        path.mkdir(parents=True, exist_ok=True)
        config = {"delta.enableChangeDataFeed": "true"} if change_feed else {}
        try:
            DeltaTable.create(str(path), schema, mode="ignore", name=name, configuration=config)
        except DeltaError as e:
            if self.latest_version(path) is None:  # lost a creation race only if the table now exists
                raise StorageError(f"cannot create Delta table at {path}: {e}") from e

    def latest_version(self, path: Path) -> int | None:
        try:
            return DeltaTable(str(path)).version()
        except TableNotFoundError:
            return None

    @_retry_io
    def append(self, path: Path, data: pa.RecordBatchReader, *, app_id: str | None = None,
               app_version: int | None = None, metadata: Mapping[str, str] | None = None) -> int:
        table = self._open(path)
        txns = [Transaction(app_id, app_version)] if app_id is not None and app_version is not None else None
        props = CommitProperties(custom_metadata=dict(metadata or {}), app_transactions=txns)
        write_deltalake(table, data, mode="append", commit_properties=props)
        # After the write the handle's state is exactly the version this commit landed at,
        # even when other processes commit concurrently (checked against the commit files).
        return table.version()

    def transaction_version(self, path: Path, app_id: str) -> int | None:
        return self._open(path).transaction_version(app_id)

    def snapshot(self, spark: SparkSession, path: Path, version: int, schema: pa.Schema) -> DataFrame:
        files = self._open(path, version).file_uris()
        spark_schema = from_arrow_schema(schema)
        if not files:
            return spark.createDataFrame([], spark_schema)
        return spark.read.schema(spark_schema).parquet(*files)

    @_retry_io
    def commit_files(self, path: Path, files: Sequence[Path], schema: pa.Schema, *, app_id: str,
                     app_version: int, metadata: Mapping[str, str]) -> int | None:
        table = self._open(path)
        if (table.transaction_version(app_id) or -1) >= app_version:
            return None
        now_ms = int(time.time() * 1000)
        actions = [
            AddAction(
                path=f.relative_to(path).as_posix(),
                size=f.stat().st_size,
                partition_values={},
                modification_time=now_ms,
                data_change=True,
                stats=json.dumps({"numRecords": pq.read_metadata(f).num_rows}),
            )
            for f in files
        ]
        props = CommitProperties(custom_metadata=dict(metadata), app_transactions=[Transaction(app_id, app_version)])
        table.create_write_transaction(actions, mode="overwrite", schema=schema, commit_properties=props)
        return table.version()

    @staticmethod
    def _open(path: Path, version: int | None = None) -> DeltaTable:
        try:
            return DeltaTable(str(path), version=version)
        except TableNotFoundError as e:
            raise StorageError(f"no Delta table at {path}") from e
