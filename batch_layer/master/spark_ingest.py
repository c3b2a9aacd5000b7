"""Bulk ingest of a JSON Lines or Parquet file by Spark: read and validated on the executors, one Delta commit.

Parquet: each row group is a task; the executors read it with pyarrow and validate it with the same
code as the delta-rs way (``file_formats``), so types and row numbers are the same on both engines.
JSON Lines is described below. CSV is not split (a quoted value may span lines): the caller reads it.

The semantics are those of ``MasterDataset.ingest_file`` (the delta-rs way), because the same
code validates: every non-blank line goes through the pipeline's ``EventSchema.validate_json_lines``
(strict JSON, unknown fields are errors) in the Python workers. On any bad line nothing is
committed and EventValidationError lists every problem with its file line number and field; a
file that is not UTF-8 is refused (IngestError naming the first bad line). A missing event time
becomes the ingest time: one timestamp for the whole file.

Line numbers: Spark reads the file in splits, each task numbers the lines of its split, and the
driver turns those into file line numbers from the line count of every split, ordered by the
split's start offset (``input_file_block_start``).

Dead letters (``MasterDataset.ingest_file(..., dead_letters=...)``) do not come this way: Spark's bulk
path is all or nothing only, so with dead letters the file is validated in the driver's Python by
``file_sorting`` (the code of the delta-rs way) and its valid records appended through the engine in
one commit; the ``ingest --dead-letters`` command then starts no Spark at all (delta-rs commits).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import functions as F

from batch_layer.errors import IngestError, StorageError
from batch_layer.master.file_formats import parquet_row_groups, validated_row_group
from shared_logic.errors import EventProblem, EventValidationError
from shared_logic.events import KIND_COLUMN, EventSchema

if TYPE_CHECKING:
    from pydantic import BaseModel
    from pyspark.sql import DataFrame, Row, SparkSession

#: Columns the validation adds to the master layout; ``_kind`` tells what a row is: 'event',
#: 'problem' (a bad line), 'encoding' (a line that is not UTF-8) or 'lines' (a split's line count).
_NOTES = pa.schema([("_block", pa.int64()), ("_line", pa.int64()), ("_field", pa.string()), ("_message", pa.string())])


_LAST_COMMIT = "spark.databricks.delta.lastCommitVersionInSession"


@dataclass(frozen=True)
class SparkIngest:
    """What a bulk ingest committed: ``events`` rows at master ``version``."""

    events: int
    version: int


def ingest_events_file(spark: SparkSession, uri: str, file: Path, file_format: str, schema: EventSchema, *,
                       metadata: Mapping[str, str]) -> SparkIngest | None:
    """Append an event file of ``file_format`` by Spark (None: a format Spark does not ingest here)."""
    if file_format == "jsonl":
        return ingest_json_lines(spark, uri, file, schema, metadata=metadata)
    if file_format == "parquet":
        return ingest_parquet(spark, uri, file, schema, metadata=metadata)
    return None  # CSV: records may span lines, so splits cannot be cut by line; read by the caller, streaming


def ingest_json_lines(spark: SparkSession, uri: str, file: Path, schema: EventSchema, *,
                      metadata: Mapping[str, str]) -> SparkIngest:
    """Append ``file`` to the Delta table at ``uri`` in one commit, or nothing (see the module docstring)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    session = spark.newSession()  # its own SQL conf: the commit version read below is ours
    master = schema.arrow_schema()
    output = pa.schema([*master, *_NOTES])
    validate = functools.partial(_validate, model=schema.model, event_time_field=schema.event_time_field,
                                 source=str(file), now=datetime.now(timezone.utc), output=output)
    lines = session.read.format("text").load(str(file.resolve())).select(
        F.col("value").cast("binary").alias("raw"), F.input_file_block_start().alias("block"))
    validated = lines.mapInArrow(validate, from_arrow_schema(output))
    return _commit(session, validated, master, uri, file, metadata, functools.partial(_raise_problems, file))


def ingest_parquet(spark: SparkSession, uri: str, file: Path, schema: EventSchema, *,
                   metadata: Mapping[str, str]) -> SparkIngest:
    """Append a Parquet file in one commit, or nothing: its row groups are read and validated in parallel
    by the same code as ``file_formats.validated_chunks`` (pyarrow on the executors, so every type it
    reads, row numbers exact); problems are EventValidationError located ``row N``."""
    from pyspark.sql.pandas.types import from_arrow_schema

    session = spark.newSession()
    master = schema.arrow_schema()
    output = pa.schema([*master, *_NOTES])
    groups = parquet_row_groups(file, schema)  # the schema checked on the driver, from the footer
    validate = functools.partial(_validate_row_groups, file=str(file.resolve()), model=schema.model,
                                 event_time_field=schema.event_time_field, now=datetime.now(timezone.utc),
                                 output=output)
    frame = session.createDataFrame(groups, "_block long, _line long")
    validated = frame.repartition(max(1, len(groups)), "_block").mapInArrow(validate, from_arrow_schema(output))
    return _commit(session, validated, master, uri, file, metadata, functools.partial(_raise_row_problems, file))


def _validate_row_groups(batches: Iterator[pa.RecordBatch], *, file: str, model: type[BaseModel],
                         event_time_field: str | None, now: datetime, output: pa.Schema) -> Iterator[pa.RecordBatch]:
    """On an executor: the events of each row group named in ``batches`` (``_block``, ``_line``: its first row), or its problems."""
    schema = EventSchema(model, event_time_field)
    for batch in batches:
        for group, first in zip(batch.column("_block").to_pylist(), batch.column("_line").to_pylist()):
            for chunk in validated_row_group(Path(file), schema, group, first, chunk_rows=65_536, now=now):
                if isinstance(chunk, EventValidationError):
                    notes: list[tuple[str, int, int, str | None, str]] = [
                        ("problem", group, int(p.location.split()[1]), p.field, p.message) for p in chunk.problems]
                    yield _notes_batch(notes, output)
                elif chunk.num_rows:
                    for field in _NOTES:
                        chunk = chunk.append_column(field, pa.nulls(chunk.num_rows, field.type))
                    yield from chunk.cast(output).to_batches()


def _raise_row_problems(file: Path, notes: list[Row]) -> None:
    """Raise EventValidationError for the problems found, located by row number."""
    bad = sorted((n for n in notes if n[KIND_COLUMN] == "problem"), key=lambda n: n["_line"])  # stable
    if bad:
        raise EventValidationError([EventProblem(f"row {n['_line']}", n["_field"], n["_message"]) for n in bad], str(file))


def _commit(session: SparkSession, validated: DataFrame, master: pa.Schema, uri: str, file: Path,
            metadata: Mapping[str, str], raise_problems: Callable[[list[Row]], None]) -> SparkIngest:
    """Raise the problems ``validated`` notes, else append its events to ``uri`` in one commit."""
    from pyspark import StorageLevel

    validated = validated.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        notes = validated.where(F.col(KIND_COLUMN) != "event").select(KIND_COLUMN, *_NOTES.names).collect()
        raise_problems(notes)
        events = validated.where(F.col(KIND_COLUMN) == "event").select(*master.names)
        count = events.count()
        events.write.format("delta").mode("append").option("userMetadata", json.dumps(dict(metadata))).save(uri)
    finally:
        validated.unpersist()
    version = committed_version(session)
    if version is None:
        raise StorageError(f"ingest of {file} into {uri}: Delta reported no commit")
    return SparkIngest(count, version)


def _validate(batches: Iterator[pa.RecordBatch], *, model: type[BaseModel], event_time_field: str | None,
              source: str, now: datetime, output: pa.Schema) -> Iterator[pa.RecordBatch]:
    """On an executor: the events of each batch of lines, or its problems; then each split's line count."""
    schema = EventSchema(model, event_time_field)
    counts: dict[int, int] = {}
    for batch in batches:
        numbered: list[tuple[int, int, str]] = []
        notes: list[tuple[str, int, int, str | None, str]] = []
        for raw, block in zip(batch.column("raw").to_pylist(), batch.column("block").to_pylist()):
            line = counts.get(block, 0)
            counts[block] = line + 1
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                notes.append(("encoding", block, line, None, f"{e.reason} at byte {e.start}"))
                continue
            if text.strip():
                numbered.append((block, line, text))
        try:
            events = schema.validate_json_lines(((i, t) for i, (_, _, t) in enumerate(numbered)),
                                                source=source, now=lambda: now)
        except EventValidationError:
            events = None
            notes.extend(_problems(schema, numbered, source))
        if events is not None and events.num_rows and not notes:
            for field in _NOTES:
                events = events.append_column(field, pa.nulls(events.num_rows, field.type))
            yield from events.cast(output).to_batches()
        if notes:
            yield _notes_batch(notes, output)
    if counts:
        yield _notes_batch([("lines", block, count, None, "") for block, count in counts.items()], output)


def _problems(schema: EventSchema, numbered: Sequence[tuple[int, int, str]], source: str
              ) -> Iterator[tuple[str, int, int, str | None, str]]:
    """Every problem of a batch that failed, line by line (each bad line validated on its own)."""
    for block, line, text in numbered:
        try:
            schema.validate_json_lines([(0, text)], source=source)
        except EventValidationError as e:
            yield from (("problem", block, line, p.field, p.message) for p in e.problems)


def _notes_batch(notes: list[tuple[str, int, int, str | None, str]], output: pa.Schema) -> pa.RecordBatch:
    columns: dict[str, Any] = {f.name: pa.nulls(len(notes), f.type) for f in output}
    for i, name in enumerate((KIND_COLUMN, *_NOTES.names)):
        columns[name] = pa.array([n[i] for n in notes], output.field(name).type)
    return pa.RecordBatch.from_arrays([columns[f.name] for f in output], schema=output)


def _raise_problems(file: Path, notes: list[Row]) -> None:
    """Raise IngestError / EventValidationError for the problems found, located by file line number."""
    counts = {n["_block"]: n["_line"] for n in notes if n[KIND_COLUMN] == "lines"}
    first, total = {}, 0
    for block in sorted(counts):
        first[block], total = total, total + counts[block]

    def number(note: Row) -> int:
        return first[note["_block"]] + note["_line"] + 1

    encoding = sorted((number(n), n["_message"]) for n in notes if n[KIND_COLUMN] == "encoding")
    if encoding:
        line, reason = encoding[0]
        raise IngestError(f"cannot ingest {file}: not UTF-8 text ({reason} of line {line})")
    bad = sorted((n for n in notes if n[KIND_COLUMN] == "problem"), key=number)  # stable: a line's order kept
    if bad:
        raise EventValidationError([EventProblem(f"line {number(n)}", n["_field"], n["_message"]) for n in bad], str(file))


def committed_version(session: SparkSession) -> int | None:
    """The version of the last JVM Delta commit made through ``session`` (None: it committed nothing)."""
    value = session.conf.get(_LAST_COMMIT, None)
    return None if value in (None, "") else int(value)
