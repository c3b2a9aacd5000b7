"""Gold tables: one Delta table per view, one commit per generation.

Either way a generation is one Delta commit (mode overwrite) recording the application
transaction ``("lambda-batch", V)``: until it lands, every Delta reader sees the previous
generation as the table's content, so a run killed midway changes nothing; repeating the commit
for the same V is a no-op. Older generations stay reachable by time travel until vacuumed.

- delta-rs engine: Spark writes the view's rows as parquet files into a fresh folder inside the
  table; one delta-rs commit makes them the table's content.

A table is a location (a local path or an ``s3://`` URI, ``batch_layer.master.object_store``):
Spark writes to it through its Hadoop filesystem (S3A), everything else reads it through pyarrow.
- an engine whose Delta runs inside Spark (``SparkStorage``, delta-spark): Spark writes the
  generation itself (``txnAppId``/``txnVersion``), distributed, and reads it back by version.

Both engines record the same transaction, so either engine sees a generation the other wrote.

Retention: after each served flip, :func:`prune_generations` keeps the newest few generations of
each gold table (and the served one) readable by time travel; VACUUM deletes the files of older
ones and their commit files are trimmed from the log (``batch_layer.master.vacuum``, ``delta_log``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow.parquet as pq
from pyspark.sql.pandas.types import to_arrow_schema

from batch_layer.master.delta_log import LogTrim, newest_version, read_commit, trim_log
from batch_layer.master.delta_rs import parquet_rows
from batch_layer.master.object_store import Location, filesystem, join, list_files, spark_uri, table_uri
from batch_layer.master.storage import SparkStorage, StorageEngine
from batch_layer.master.vacuum import Vacuumed, vacuum_table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

APP_ID = "lambda-batch"


@dataclass(frozen=True)
class GoldGeneration:
    """One view's generation in its gold table: its row count, and how to read it."""

    table: str
    generation: int
    rows: int
    reader: Callable[[SparkSession], DataFrame] = field(repr=False, compare=False)

    def read(self, spark: SparkSession) -> DataFrame:
        return self.reader(spark)


def write_generation(rows: DataFrame, table: Location, engine: StorageEngine, *, generation: int) -> GoldGeneration:
    """Write ``rows`` as generation ``generation`` of the gold table at ``table`` (one Delta commit)."""
    table = table_uri(table)
    metadata = {"lambda.generation": str(generation)}
    if isinstance(engine, SparkStorage):
        commit = engine.write_generation(rows, table, app_id=APP_ID, app_version=generation, metadata=metadata)
        if commit is None:  # already committed (a repeat): the same rows, recomputed from the same snapshot
            return GoldGeneration(table, generation, rows.count(), lambda spark: rows)
        return GoldGeneration(table, generation, commit.rows,
                              lambda spark: engine.read_version(spark, table, commit.version))
    staging = join(table, f"gen-{generation:020d}-{uuid.uuid4().hex[:8]}")
    rows.write.parquet(spark_uri(staging))
    files = [uri for uri, _ in list_files(staging, ".parquet")]
    if files:
        fs, first = filesystem(files[0])
        schema = pq.read_schema(first, filesystem=fs)
    else:
        schema = to_arrow_schema(rows.schema, timezone="UTC")
    schema = schema.remove_metadata()
    engine.ensure_table(table, schema, name=table.rsplit("/", 1)[-1], change_feed=False)
    engine.commit_files(table, files, schema, app_id=APP_ID, app_version=generation, metadata=metadata)
    count = sum(parquet_rows(f) for f in files)
    paths = [spark_uri(f) for f in files]
    return GoldGeneration(table, generation, count, lambda spark: spark.read.parquet(*paths))


@dataclass(frozen=True)
class GoldPruned:
    """What :func:`prune_generations` did to one gold table: the oldest version kept, the VACUUM, the log trim."""

    keep_from: int
    vacuumed: Vacuumed
    trimmed: LogTrim


def prune_generations(table: Location, *, keep: int, served: int | None) -> GoldPruned | None:
    """Keep the newest ``keep`` generations of the gold table at ``table``, and generation ``served``,
    readable by time travel; delete the files and commit files only older ones need. None when the
    table has fewer generations than that (or none yet)."""
    if keep < 1:
        raise ValueError(f"keep={keep}: at least the newest generation must stay")
    table = table_uri(table)
    latest = newest_version(table)
    found: list[tuple[int, int]] = []  # (table version, generation), newest first
    version = -1 if latest is None else latest
    while version >= 0 and (len(found) < keep or (served is not None and all(g != served for _, g in found))):
        commit = read_commit(table, version)
        if commit is None:  # before the log's first kept commit
            break
        generation = commit.app_transactions.get(APP_ID)
        if generation is not None:
            found.append((version, generation))
        version -= 1
    if len(found) < keep:
        return None
    keep_from = min(v for v, g in found[:keep] + [(v, g) for v, g in found if g == served])
    vacuumed = vacuum_table(table, keep_from, floor_hours=0, what=f"gold table {table.rsplit('/', 1)[-1]}")
    return GoldPruned(keep_from, vacuumed, trim_log(table, keep_from))
