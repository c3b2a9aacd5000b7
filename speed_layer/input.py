"""The speed layer's input: the master dataset's changes as a streaming DataFrame.

Rows: the master dataset's columns, then ``_version``, the Delta commit that added the row. Only
inserted rows; compactions (``dataChange = false``) add nothing; a fresh query reads the versions
after ``starting`` (a resumed one continues from its checkpoint's offsets). Per micro-batch the
read is capped (backpressure) by ``speed_max_versions_per_trigger`` and ``speed_max_rows_per_trigger``.

Which source reads them follows the storage engine:

- delta-spark: Delta's own streaming source over the change data feed (``readChangeFeed``,
  ``_commit_version`` becomes ``_version``); the caps become ``maxFilesPerTrigger`` (one file per
  commit for the platform's appends: about one version per file) and ``maxBytesPerTrigger`` (the
  row cap times the table's bytes per row). Delta admits a commit's files one by one, so a commit of
  several files (a bulk ingest by Spark) can end a micro-batch inside it: that micro-batch is shown
  with the one completing the version (``speed_layer.job``). Chosen for this engine because it needs
  nothing on the executors beyond the Delta jars, plans micro-batches from JVM Delta's cached log
  state, and measured at par with the Python source (benchmarks/speed_layer_bench.py throughput;
  see the figures in benchmarks/README.md).
- delta-rs: the Python streaming source (``speed_layer.source``): offsets are versions, delta-rs
  reads the change data feed on the executors, the caps are exact in versions and in rows.

A checkpoint belongs to the source that wrote it: after changing the engine, start the speed
layer fresh (delete its checkpoint; it rebuilds its segments from the served generation).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from batch_layer.master.object_store import table_uri
from batch_layer.master.storage import SparkStorage
from shared_logic.events import KIND_COLUMN
from speed_layer.source import SOURCE_NAME, VERSION_COLUMN, MasterChangesSource, master_schema_option

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from batch_layer.master.dataset import MasterDataset
    from speed_layer.config import SpeedConfig


def master_changes(spark: SparkSession, master: MasterDataset, settings: SpeedConfig, *, starting: int) -> DataFrame:
    """The rows committed to ``master`` after version ``starting``, streaming, with ``_version``."""
    if isinstance(master.engine, SparkStorage):
        return master.engine.change_stream(
            spark, master.path, master.schema, after=starting, version_column=VERSION_COLUMN,
            max_files=settings.speed_max_versions_per_trigger, max_rows=settings.speed_max_rows_per_trigger,
        )
    spark.dataSource.register(MasterChangesSource)
    return (
        spark.readStream.format(SOURCE_NAME)
        .option("path", table_uri(master.path))
        .option("schema_json", master_schema_option(master.schema))
        .option("kind_column", KIND_COLUMN)
        .option("starting_version", str(starting))
        .option("max_versions_per_trigger", str(settings.speed_max_versions_per_trigger))
        .option("max_rows_per_trigger", str(settings.speed_max_rows_per_trigger or ""))
        .load()
    )
