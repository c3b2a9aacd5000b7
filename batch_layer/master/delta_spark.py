"""The JVM storage engine: Delta Lake inside Spark (delta-spark), for clusters.

Every Spark-side Delta operation goes through JVM Delta: the batch snapshot (``versionAsOf``),
gold generations (one ``overwrite`` per generation with ``txnAppId``/``txnVersion``, so a
repeat of a generation commits nothing), bulk ingest of a file (read, validated and appended
by Spark in one commit), appends made by a process running Spark (the batch run's barrier),
compaction (OPTIMIZE) and the speed layer's input (Delta's own streaming source with
the change data feed, ``_commit_version`` on each row).

Operations that need no Spark job stay on delta-rs, and so does every write of a process that
runs no Spark (this engine never starts a JVM by itself): reading the latest version and the
recorded application transactions (a read of the Delta log), adding columns when the event model
gains a field (one metadata commit, ``schema_evolution``), and the low-latency HTTP ingest
(``appender``: group commits of several requests, each with its own application transaction,
which a Spark write cannot record). Both engines write the same Delta tables.

Commit versions of JVM writes are read from ``spark.databricks.delta.lastCommitVersionInSession``
of a fresh session per write (``SparkSession.newSession``: its own SQL conf, the same context),
so concurrent writers, in this process or others, cannot be mistaken for ours.

On a local folder JVM Delta commits through Hadoop's rename, which checks that the commit file
does not exist and then renames (``HDFSLogStore``): a delta-rs commit of the same version landing
between the two would be overwritten. delta-rs itself commits with an atomic no-replace rename.

On object storage (``s3://``) JVM Delta's LogStore is ``S3SingleDriverLogStore``: a JVM-local lock,
a HEAD, then a plain PUT of the commit file, safe only among the writers of one driver. The master
dataset has many writers (HTTP ingest in every API process, batch runs, compaction), so there every
commit to a table this engine appends to, ingests into or compacts goes through delta-rs, whose
commits are conditional puts (refused, not overwritten, when another writer got the version first);
JVM Delta reads the master (snapshots, the change feed) and writes only the gold tables, which have
one writer at a time (single-flight batch runs). See ``is_object_store`` checks below.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql import functions as F

from batch_layer.errors import StorageError
from batch_layer.master.arrow_frames import spark_frame
from batch_layer.master.delta_log import open_table
from batch_layer.master.delta_rs import DeltaRsEngine
from batch_layer.master.object_store import Location, is_object_store, spark_uri
from batch_layer.master.spark_ingest import committed_version
from batch_layer.master.storage import CommitConflictError, CompactionResult, GenerationCommit, TableState

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from batch_layer.master.delta_rs import DeltaRsAppender
    from batch_layer.master.spark_ingest import SparkIngest
    from shared_logic.events import EventSchema

#: The delta-spark jar for pyspark 4.2 / Scala 2.13. ``delta.configure_spark_with_delta_pip`` would
#: ask for the pip package's version (4.4.1), which Maven Central does not have for Spark 4.2: the
#: newest ``delta-spark_4.2_2.13`` there is 4.4.0. The Python API of the 4.4.1 package drives it.
DELTA_PACKAGE = "io.delta:delta-spark_4.2_2.13:4.4.0"
SPARK_MAJOR_MINOR = "4.2"

#: Transitive dependencies of the Delta jar that pyspark's own jars already provide (newer):
#: left out of the resolution, so the classpath holds one copy of each (and less is downloaded).
_PROVIDED_BY_SPARK = (
    "org.apache.hadoop:hadoop-client-api", "org.apache.hadoop:hadoop-client-runtime",
    "com.fasterxml.jackson.core:*", "org.apache.parquet:*", "org.apache.logging.log4j:*", "org.slf4j:*",
    "org.xerial.snappy:*", "com.github.luben:*", "org.roaringbitmap:*", "io.airlift:*",
    "org.locationtech.jts:*", "com.google.code.findbugs:*", "commons-pool:*",
)



def delta_spark_conf(ivy_dir: Path, *, snapshot_partitions: int) -> dict[str, str]:
    """The Spark configuration that loads JVM Delta: its jars from Maven Central, resolved once into
    ``ivy_dir`` (an Ivy cache shared by every process, the tests and CI), and its SQL extension and
    catalog. ``snapshot_partitions``: partitions Delta uses to rebuild a table's state (50 by
    default, far too many for local mode)."""
    import pyspark

    if ".".join(pyspark.__version__.split(".")[:2]) != SPARK_MAJOR_MINOR:
        raise StorageError(
            f"the delta-spark engine is pinned to {DELTA_PACKAGE} for pyspark {SPARK_MAJOR_MINOR}.x, "
            f"found pyspark {pyspark.__version__}: install pyspark {SPARK_MAJOR_MINOR} or update DELTA_PACKAGE"
        )
    return {
        "spark.jars.packages": DELTA_PACKAGE,
        "spark.jars.excludes": ",".join(_PROVIDED_BY_SPARK),
        "spark.jars.ivy": str(Path(ivy_dir).expanduser().resolve()),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.databricks.delta.snapshotPartitions": str(snapshot_partitions),
    }


def running_spark() -> SparkSession | None:
    """The SparkSession of this process, or None when it runs no Spark (never starts one)."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    if SparkContext._active_spark_context is None:
        return None
    return SparkSession.active()


class DeltaSparkEngine:
    """Delta Lake through delta-spark (JVM). ``spark``: the session to use; by default the one this
    process runs, if any (see the module docstring for what falls back to delta-rs without one)."""

    def __init__(self, spark: SparkSession | None = None) -> None:
        self._spark = spark
        self._rs = DeltaRsEngine()

    def session(self, operation: str) -> SparkSession:
        """The session for a JVM operation, or StorageError naming the operation."""
        spark = self._spark or running_spark()
        if spark is None:
            raise StorageError(f"the delta-spark engine needs a running SparkSession to {operation}; "
                               "build one first (deploy.runtime.spark.build_spark)")
        return spark

    # -- the StorageEngine protocol ------------------------------------------------------------

    def ensure_table(self, path: Location, schema: pa.Schema, *, name: str, change_feed: bool) -> None:
        if self.latest_version(path) is not None:
            return
        spark = self._spark or running_spark()
        if spark is None:
            self._rs.ensure_table(path, schema, name=name, change_feed=change_feed)
            return
        from delta.tables import DeltaTable
        from pyspark.sql.pandas.types import from_arrow_schema

        builder = DeltaTable.createIfNotExists(spark).location(_uri(path)).addColumns(from_arrow_schema(schema))
        if change_feed:
            builder = builder.property("delta.enableChangeDataFeed", "true")
        try:
            builder.execute()
        except Exception as e:  # py4j wraps the JVM's exception; losing a creation race is fine
            if self.latest_version(path) is None:
                raise StorageError(f"cannot create Delta table at {path}: {e}") from e

    def latest_version(self, path: Location) -> int | None:
        return self._rs.latest_version(path)

    def table_state(self, path: Location) -> TableState | None:
        return self._rs.table_state(path)

    def add_columns(self, path: Location, fields: Sequence[pa.Field], *, metadata: Mapping[str, str]) -> int:
        """Through delta-rs, in every process: a metadata-only commit needs no Spark job, processes without
        Spark (the API) evolve the table too, and on object storage the commit must be a conditional put
        (see the module docstring). The ``metaData`` action is Delta's ADD COLUMNS, which JVM Delta reads
        as its own ``ALTER TABLE ... ADD COLUMNS``."""
        return self._rs.add_columns(path, fields, metadata=metadata)

    def append(self, path: Location, data: pa.RecordBatchReader | pa.Table, *, app_id: str | None = None,
               app_version: int | None = None, metadata: Mapping[str, str] | None = None,
               app_transactions: Sequence[tuple[str, int]] = ()) -> int:
        """One commit; through JVM Delta when this process runs Spark, else through delta-rs.

        Several application transactions in one commit (``app_transactions``) need delta-rs: a Spark
        write records one. Through JVM Delta, a repeat of a recorded (app_id, app_version) commits
        nothing and raises CommitConflictError (Delta skips a ``txnVersion`` it has seen).
        """
        spark = self._spark or running_spark()
        if spark is None or app_transactions or is_object_store(path):  # see the module docstring
            return self._rs.append(path, data, app_id=app_id, app_version=app_version, metadata=metadata,
                                   app_transactions=app_transactions)
        table = data.read_all() if isinstance(data, pa.RecordBatchReader) else data
        session = spark.newSession()
        writer = spark_frame(session, table).coalesce(1).write.format("delta").mode("append")
        if app_id is not None and app_version is not None:
            writer = writer.option("txnAppId", app_id).option("txnVersion", str(app_version))
        if metadata:
            writer = writer.option("userMetadata", json.dumps(dict(metadata), sort_keys=True))
        writer.save(_uri(path))
        version = committed_version(session)
        if version is None:
            raise CommitConflictError(f"append to {path} not committed: transaction {app_id!r} version "
                                      f"{app_version} is already recorded")
        return version

    def appender(self, path: Location) -> DeltaRsAppender:
        """HTTP ingest's low-latency writer stays on delta-rs (see the module docstring)."""
        return self._rs.appender(path)

    def transaction_version(self, path: Location, app_id: str) -> int | None:
        return self._rs.transaction_version(path, app_id)

    def snapshot(self, spark: SparkSession, path: Location, version: int, schema: pa.Schema) -> DataFrame:
        rows = spark.read.format("delta").option("versionAsOf", version).load(_uri(path))
        return rows.select(*_columns(rows, schema))

    def commit_files(self, path: Location, files: Sequence[Location], schema: pa.Schema, *, app_id: str,
                     app_version: int, metadata: Mapping[str, str]) -> int | None:
        """Protocol completeness: this engine's gold generations use :meth:`write_generation`."""
        return self._rs.commit_files(path, files, schema, app_id=app_id, app_version=app_version, metadata=metadata)

    # -- Spark-side operations (batch_layer.master.storage.SparkStorage) ------------------------------

    def write_generation(self, rows: DataFrame, path: Location, *, app_id: str, app_version: int,
                         metadata: Mapping[str, str]) -> GenerationCommit | None:
        """Replace the table's content with ``rows`` in one commit recording (app_id, app_version);
        None, committing nothing, when that transaction (or a later one) is already recorded.

        Found again by a unique token in the commit's ``userMetadata`` (gold tables have one writer:
        the single-flight batch run, so it is among the newest commits).
        """
        token = json.dumps({**metadata, "lambda.write": uuid.uuid4().hex}, sort_keys=True)
        (rows.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
         .option("txnAppId", app_id).option("txnVersion", str(app_version)).option("userMetadata", token)
         .save(_uri(path)))
        from delta.tables import DeltaTable

        history = DeltaTable.forPath(rows.sparkSession, _uri(path)).history(20)
        found = history.where(F.col("userMetadata") == token).select("version", "operationMetrics").collect()
        if not found:
            if (self.transaction_version(path, app_id) or -1) >= app_version:
                return None
            raise StorageError(f"generation {app_version} of {path}: the commit was not found in the table's history")
        return GenerationCommit(int(found[0]["version"]), int(found[0]["operationMetrics"].get("numOutputRows", 0)))

    def read_version(self, spark: SparkSession, path: Location, version: int) -> DataFrame:
        """The table as of ``version`` (all its columns)."""
        return spark.read.format("delta").option("versionAsOf", version).load(_uri(path))

    def ingest_events_file(self, path: Location, file: Path, file_format: str, schema: EventSchema, *,
                           metadata: Mapping[str, str]) -> SparkIngest | None:
        """Read, validate and append an event file by Spark in one commit (None without Spark)."""
        spark = self._spark or running_spark()
        if spark is None or is_object_store(path):  # commits on object storage: delta-rs (module docstring)
            return None
        from batch_layer.master.spark_ingest import ingest_events_file

        return ingest_events_file(spark, _uri(path), file, file_format, schema, metadata=metadata)

    def compact(self, path: Location, *, target_size: int | None = None,
                metadata: Mapping[str, str] | None = None) -> CompactionResult:
        """OPTIMIZE (bin-packing) in one commit that changes no data (``dataChange = false``, so the
        change feed skips it); ``version`` None when there was nothing to compact. On object storage
        delta-rs compacts (its commit is a conditional put, see the module docstring)."""
        if is_object_store(path):
            return self._rs.compact(path, target_size=target_size, metadata=metadata)
        from delta.tables import DeltaTable

        session = self.session("compact a table").newSession()
        if target_size is not None:
            session.conf.set("spark.databricks.delta.optimize.maxFileSize", str(target_size))
        if metadata:
            session.conf.set("spark.databricks.delta.commitInfo.userMetadata", json.dumps(dict(metadata)))
        (row,) = DeltaTable.forPath(session, _uri(path)).optimize().executeCompaction().collect()
        removed, added = int(row["metrics"]["numFilesRemoved"]), int(row["metrics"]["numFilesAdded"])
        return CompactionResult(committed_version(session) if removed else None, removed, added)

    def change_stream(self, spark: SparkSession, path: Location, schema: pa.Schema, *, after: int,
                      version_column: str, max_files: int, max_rows: int | None) -> DataFrame:
        """Rows inserted after version ``after``, streaming, as ``schema``'s columns + ``version_column``.

        Delta's streaming source over the change data feed: compactions (``dataChange = false``)
        carry no changes. Backpressure: at most ``max_files`` files per micro-batch, and about
        ``max_rows`` rows (``maxBytesPerTrigger`` from the table's bytes per row; Delta admits at
        least one file). ``after`` applies to a fresh query only: a checkpoint has its own offsets.
        """
        reader = (spark.readStream.format("delta").option("readChangeFeed", "true")
                  .option("startingVersion", str(max(after, 0))).option("maxFilesPerTrigger", str(max_files)))
        if max_rows:
            reader = reader.option("maxBytesPerTrigger", f"{max(1, max_rows * _bytes_per_row(path))}b")
        changes = reader.load(_uri(path))
        inserted = (F.col("_change_type") == "insert") & (F.col("_commit_version") > after)
        return changes.where(inserted).select(*_columns(changes, schema), F.col("_commit_version").alias(version_column))


def _columns(rows: DataFrame, schema: pa.Schema) -> list[Column]:
    """``schema``'s columns of ``rows``; one a version before the column was added lacks reads as null
    (as Delta reads it from files written before)."""
    from pyspark.sql.pandas.types import from_arrow_type

    have = set(rows.columns)
    return [F.col(f.name) if f.name in have else F.lit(None).cast(from_arrow_type(f.type)).alias(f.name)
            for f in schema]


def _uri(path: Location) -> str:
    """The table as Spark names it (``s3a://`` on object storage, see ``object_store.spark_uri``)."""
    return spark_uri(path)


def _bytes_per_row(path: Location) -> int:
    """Average parquet bytes per row of the table's current files (64 when it has no row statistics)."""
    import pyarrow.compute as pc

    actions = pa.table(open_table(path).get_add_actions(flatten=True))
    if actions.num_rows == 0 or not {"num_records", "size_bytes"} <= set(actions.column_names):
        return 64
    rows = pc.sum(actions.column("num_records")).as_py() or 0
    size = pc.sum(actions.column("size_bytes")).as_py() or 0
    return max(1, size // rows) if rows else 64
