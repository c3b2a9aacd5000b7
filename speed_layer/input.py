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

Spark logs each micro-batch's end offset, as these sources define it, in the checkpoint before
running it (the same on every replay); ``logged_summary`` and ``ends_inside_version`` read it there.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, NamedTuple

from batch_layer.master.object_store import table_uri
from batch_layer.master.storage import SparkStorage
from shared_logic.events import KIND_COLUMN
from speed_layer.source import SOURCE_NAME, SUMMARY, VERSION_COLUMN, MasterChangesSource, master_schema_option

if TYPE_CHECKING:
    from pathlib import Path

    from pyspark.sql import DataFrame, SparkSession

    from batch_layer.master.dataset import MasterDataset
    from speed_layer.config import SpeedConfig


def master_changes(spark: SparkSession, master: MasterDataset, settings: SpeedConfig, *, starting: int) -> DataFrame:
    """The rows committed to ``master`` after version ``starting``, streaming, with ``_version``."""
    # A pipeline declaring an event id reads whole versions (its duplicates rule decides a version whole): the
    # Python source's micro-batches never end inside one. Declaring one changes the logic: a new query, checkpoint.
    if isinstance(master.engine, SparkStorage) and master.pipeline.event_id_field is None:
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


class Summary(NamedTuple):
    """What a micro-batch holds: its highest version adding rows (None: no rows), its barrier versions
    (ascending), and, when its end offset tells, the versions it reads (first..end) and the rows they add."""

    last: int | None
    barriers: list[int]
    first: int | None = None
    end: int | None = None
    rows: int | None = None


def logged_summary(checkpoint: Path, batch_id: int) -> Summary | None:
    """The summary in micro-batch ``batch_id``'s end offset (the Python source's: ``speed_layer.source.summarize``),
    or None (the delta-spark source, statistics that cannot tell, no offset logged)."""
    offset = _logged_offset(checkpoint, batch_id)
    if offset is None or not isinstance(summary := offset.get(SUMMARY), dict):
        return None
    last, barriers = summary.get("last"), summary.get("barriers")
    first, rows, end = summary.get("first"), summary.get("rows"), offset.get("version")
    if not (last is None or isinstance(last, int)) or not isinstance(barriers, list) or \
            not all(isinstance(n, int) for n in (first, rows, end)):
        return None
    return Summary(last, sorted(int(b) for b in barriers), first, end, rows)


def ends_inside_version(checkpoint: Path, batch_id: int) -> int | None:
    """The version micro-batch ``batch_id`` stops inside, or None (it ends where a version does).

    Delta's own streaming source (the delta-spark engine) admits a commit's files one by one against
    its limits, so a commit of several files (a bulk ingest by Spark) can be split across micro-batches;
    its end offset then names the version and the index of the last file read. At a version's end it
    names the next version at index -1 (Delta's ``isLast``); the Python source reads whole versions."""
    offset = _logged_offset(checkpoint, batch_id)
    if offset is None or not isinstance(offset.get("reservoirVersion"), int) or not isinstance(offset.get("index"), int):
        return None
    return offset["reservoirVersion"] if offset["index"] >= 0 else None


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
